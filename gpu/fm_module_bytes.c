/* fm_module_bytes.c: load a served kernel from the raw reply fields (CUBIN bytes and the
 * msgpack launch metadata), for clients that speak the protocol themselves (the Python
 * backend through ctypes) and so never hold an fm_compiled. */
#include "fm_module.h"

#include <msgpack.h>
#include <string.h>

int fm_module_load_bytes(const uint8_t *cubin, size_t cubin_len, const uint8_t *meta, size_t meta_len, fm_module **out,
                         fm_diag *d) {
  msgpack_unpacked u;
  fm_compiled k;
  size_t off = 0;
  int err;

  if (out) *out = NULL;
  /* no CUBIN is fine for a plan without a kernel: fm_module_load checks it against the rule */
  if ((!cubin && cubin_len) || !meta || !meta_len || !out)
    return fm_diag_set(d, FM_EINVAL, "fm_module_load_bytes: bad argument");
  memset(&k, 0, sizeof k);
  msgpack_unpacked_init(&u);
  if (msgpack_unpack_next(&u, (const char *)meta, meta_len, &off) != MSGPACK_UNPACK_SUCCESS || off != meta_len) {
    err = fm_diag_set(d, FM_EMALFORMED, "meta: not exactly one msgpack object (%zu bytes)", meta_len);
    goto out;
  }
  err = fm_meta_unpack(&u.data, &k.meta, d);
  if (err) goto out;
  memcpy(k.kind, k.meta.kind, sizeof k.kind);
  /* cuModuleLoadData copies the image, so the caller's bytes are only borrowed. */
  k.cubin = (uint8_t *)(uintptr_t)cubin;
  k.cubin_len = cubin_len;
  err = fm_module_load(&k, out, d);
out:
  msgpack_unpacked_destroy(&u);
  return err;
}
