/* fm_entry_check.c: an outside entry against what this daemon would have built. */
#include "fm_entry_check.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <msgpack.h>

#include "fm_fragment.h"
#include "fm_meta.h"
#include "fm_msg.h"
#include "fm_remote_tier.h"

int fm_entry_expected_key(const fm_devinfo *dev, const char *label, const uint8_t *canonical, size_t canonical_len,
                          fm_key *key, fm_diag *d) {
  char arch[16], mine[192];
  fm_device_id id;
  fm_diag why = {{0}};
  fm_remote_label_arch(label, arch, sizeof arch);
  /* The label must be exactly one this daemon writes: same GPU, same SM count, same arch. */
  if (fm_device_for_arch(dev, arch, &id, &why) != FM_OK)
    return fm_diag_set(d, FM_EINVAL, "entry is for %.64s, which this daemon cannot target", label);
  fm_device_label(&id, mine, sizeof mine);
  if (strcmp(mine, label) != 0) return fm_diag_set(d, FM_EINVAL, "entry is for device %.64s, not %.64s", label, mine);
  int err = fm_device_key(dev, &id, canonical, canonical_len, key);
  return err ? fm_diag_set(d, err, "cannot compute the key: %s", fm_strerror(err)) : FM_OK;
}

/* canonical must be the packed canonical form of a valid fragment; *n_inputs, *n_outputs. */
static int check_canonical(const fm_entry *e, uint32_t *n_inputs, uint32_t *n_outputs, fm_diag *d) {
  msgpack_zone zone;
  msgpack_object obj;
  fm_fragment *f = malloc(sizeof *f);
  uint8_t *again = NULL;
  size_t again_len = 0;
  fm_diag why = {{0}};
  int err;
  if (!f || !msgpack_zone_init(&zone, 4096)) {
    free(f);
    return fm_diag_set(d, FM_ENOMEM, "out of memory");
  }
  if ((err = fm_msg_unpack(e->canonical, e->canonical_len, &fm_msg_request_limits, &zone, &obj, &why)) ||
      (err = fm_fragment_decode(&obj, f, &why))) {
    err = fm_diag_set(d, FM_EINVAL, "entry's fragment is not valid: %s", why.text);
  } else if ((err = fm_fragment_canonical_bytes(f, &again, &again_len))) {
    err = fm_diag_set(d, err, "cannot canonicalize the entry's fragment: %s", fm_strerror(err));
  } else if (again_len != e->canonical_len || memcmp(again, e->canonical, again_len) != 0) {
    err = fm_diag_set(d, FM_EINVAL, "entry's fragment is not in canonical form");
  } else {
    *n_inputs = f->n_inputs;
    *n_outputs = f->n_outputs;
  }
  free(again);
  free(f);
  msgpack_zone_destroy(&zone);
  return err;
}

static int check_meta(const fm_entry *e, uint32_t n_inputs, uint32_t n_outputs, fm_diag *d) {
  msgpack_zone zone;
  msgpack_object obj;
  fm_kernel_meta m;
  fm_diag why = {{0}};
  int err;
  if (!msgpack_zone_init(&zone, 4096)) return fm_diag_set(d, FM_ENOMEM, "out of memory");
  if ((err = fm_msg_unpack(e->meta, e->meta_len, &fm_msg_reply_limits, &zone, &obj, &why)) ||
      (err = fm_meta_unpack(&obj, &m, &why)))
    err = fm_diag_set(d, FM_EINVAL, "entry's launch metadata is not valid: %s", why.text);
  else if (strcmp(m.kind, e->kind) != 0)
    err = fm_diag_set(d, FM_EINVAL, "entry of kind %.16s has metadata of kind %.16s", e->kind, m.kind);
  else if (m.n_inputs != n_inputs || m.n_outputs != n_outputs)
    err = fm_diag_set(d, FM_EINVAL, "entry's metadata has %u inputs and %u outputs, its fragment %u and %u", m.n_inputs,
                      m.n_outputs, n_inputs, n_outputs);
  msgpack_zone_destroy(&zone);
  return err;
}

/* Timings are spliced into `show` replies as they are: one map, or nothing. */
static int check_timings(const fm_entry *e, fm_diag *d) {
  msgpack_zone zone;
  msgpack_object obj;
  fm_diag why = {{0}};
  if (e->timings_len == 0) return FM_OK;
  if (!msgpack_zone_init(&zone, 4096)) return fm_diag_set(d, FM_ENOMEM, "out of memory");
  int err = fm_msg_unpack(e->timings, e->timings_len, &fm_msg_reply_limits, &zone, &obj, &why);
  msgpack_zone_destroy(&zone);
  return err ? fm_diag_set(d, FM_EINVAL, "entry's timings are not valid: %s", why.text) : FM_OK;
}

int fm_entry_check_content(const fm_entry *e, fm_diag *d) {
  uint32_t n_inputs = 0, n_outputs = 0;
  int err;
  if (!fm_kstate_valid(e->state)) return fm_diag_set(d, FM_EINVAL, "entry has unknown state %d", (int)e->state);
  if ((err = check_canonical(e, &n_inputs, &n_outputs, d))) return err;
  if ((err = check_meta(e, n_inputs, n_outputs, d))) return err;
  return check_timings(e, d);
}
