/* fm_reply.c: reply buffers with a sticky error, and the common reply pieces. */
#include "fm_reply.h"

#include <stdlib.h>
#include <string.h>

#include "fm_msg.h"

/* The packer's write callback: remembers the first failure instead of losing bytes silently
 * (msgpack-c's packers ignore the callback's return value). */
static int reply_write(void *data, const char *buf, size_t len) {
  fm_reply *r = data;
  if (r->err) return -1;
  if (msgpack_sbuffer_write(&r->sb, buf, len) != 0) {
    r->err = FM_ENOMEM;
    return -1;
  }
  return 0;
}

void fm_reply_init(fm_reply *r) {
  msgpack_sbuffer_init(&r->sb);
  msgpack_packer_init(&r->pk, r, reply_write);
  r->err = FM_OK;
}

void fm_reply_begin(fm_reply *r, uint64_t id, uint32_t n_fields) {
  fm_reply_init(r);
  msgpack_pack_map(&r->pk, n_fields + 2);
  fm_pack_kv_bool(&r->pk, "ok", true);
  fm_pack_kv_u64(&r->pk, "id", id);
}

void fm_reply_append(fm_reply *r, const void *bytes, size_t len) {
  if (len) reply_write(r, bytes, len);
}

void fm_reply_raw(fm_reply *r, const uint8_t *bytes, size_t len) {
  if (bytes && len && fm_msg_check(bytes, len, &fm_msg_reply_limits, NULL) == FM_OK)
    fm_reply_append(r, bytes, len);
  else
    msgpack_pack_nil(&r->pk);
}

void fm_reply_discard(fm_reply *r) { msgpack_sbuffer_destroy(&r->sb); }

int fm_reply_send(fm_reply *r, fm_conn *c, uint64_t id) {
  int err;
  if (r->err) {
    fm_reply_discard(r);
    return fm_reply_error(c, id, FM_ENOMEM, "the reply could not be built");
  }
  err = fm_conn_send(c, &r->sb);
  fm_reply_discard(r);
  return err;
}

int fm_reply_error(fm_conn *c, uint64_t id, int err, const char *detail) {
  fm_reply r;
  fm_reply_init(&r);
  fm_pack_error_reply(&r.pk, id, err, detail ? detail : "");
  int rc = r.err ? FM_ENOMEM : fm_conn_send(c, &r.sb);
  fm_reply_discard(&r);
  return rc;
}

void fm_reply_pack_device(msgpack_packer *pk, const fm_device_id *dev) {
  msgpack_pack_map(pk, 4);
  fm_pack_kv_cstr(pk, "name", dev->name);
  fm_pack_cstr(pk, "cc");
  msgpack_pack_array(pk, 2);
  msgpack_pack_uint32(pk, dev->cc_major);
  msgpack_pack_uint32(pk, dev->cc_minor);
  fm_pack_kv_u64(pk, "sm_count", dev->sm_count);
  fm_pack_kv_cstr(pk, "arch", dev->arch);
}

void fm_reply_pack_key(msgpack_packer *pk, const fm_key *key) {
  char hex[FM_KEY_HEX];
  fm_key_to_hex(key, hex);
  fm_pack_strn(pk, hex, FM_KEY_BYTES * 2);
}
