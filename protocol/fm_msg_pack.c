/* fm_msg_pack.c: packing helpers shared by every message writer. The packer's write callback
 * reports errors through its own sticky state (an sbuffer fails on ENOMEM), so these return
 * nothing: callers check the buffer once at the end. */
#include "fm_msg.h"

#include <string.h>

void fm_pack_strn(msgpack_packer *pk, const char *s, size_t n) {
  msgpack_pack_str(pk, n);
  if (n) msgpack_pack_str_body(pk, s, n);
}

void fm_pack_cstr(msgpack_packer *pk, const char *s) {
  if (!s) s = "";
  fm_pack_strn(pk, s, strlen(s));
}

void fm_pack_bin(msgpack_packer *pk, const void *p, size_t n) {
  msgpack_pack_bin(pk, n);
  if (n) msgpack_pack_bin_body(pk, p, n);
}

void fm_pack_kv_cstr(msgpack_packer *pk, const char *key, const char *val) {
  fm_pack_cstr(pk, key);
  fm_pack_cstr(pk, val);
}

void fm_pack_kv_u64(msgpack_packer *pk, const char *key, uint64_t v) {
  fm_pack_cstr(pk, key);
  msgpack_pack_uint64(pk, v);
}

void fm_pack_kv_i64(msgpack_packer *pk, const char *key, int64_t v) {
  fm_pack_cstr(pk, key);
  msgpack_pack_int64(pk, v);
}

void fm_pack_kv_f64(msgpack_packer *pk, const char *key, double v) {
  fm_pack_cstr(pk, key);
  msgpack_pack_double(pk, v);
}

void fm_pack_kv_bool(msgpack_packer *pk, const char *key, bool v) {
  fm_pack_cstr(pk, key);
  if (v)
    msgpack_pack_true(pk);
  else
    msgpack_pack_false(pk);
}

void fm_pack_error_reply(msgpack_packer *pk, uint64_t id, int err, const char *detail) {
  msgpack_pack_map(pk, 5);
  fm_pack_kv_bool(pk, "ok", false);
  fm_pack_kv_u64(pk, "id", id);
  fm_pack_kv_cstr(pk, "code", fm_err_slug(err));
  fm_pack_kv_cstr(pk, "message", fm_strerror(err));
  fm_pack_kv_cstr(pk, "detail", detail ? detail : "");
}
