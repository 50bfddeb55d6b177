/* fm_msg.h: safe msgpack decoding and the small packing helpers every message uses.
 *
 * msgpack-c trusts its input: a 5-byte array header makes it reserve ~0.5 GB and a count
 * larger than the bytes that follow is accepted. fm_msg_check walks the raw bytes first
 * and refuses anything whose declared counts exceed the bytes remaining or the limits,
 * so fm_msg_unpack only ever hands well-formed, bounded input to msgpack_unpack. */
#ifndef FM_MSG_H
#define FM_MSG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <msgpack.h>

#include "fm_error.h"

typedef struct fm_msg_limits {
  uint32_t max_depth;   /* nesting of arrays/maps; the top-level map is depth 1 */
  uint32_t max_objects; /* total objects (every scalar, key, value, container) */
  uint32_t max_str;     /* bytes of one str */
  uint32_t max_bin;     /* bytes of one bin */
} fm_msg_limits;

/* Limits for requests (tight) and replies (bins large enough for a CUBIN). */
extern const fm_msg_limits fm_msg_request_limits;
extern const fm_msg_limits fm_msg_reply_limits;

/* Checks that buf holds exactly one msgpack object within the limits. FM_EMALFORMED
 * (truncated, trailing bytes, reserved type byte 0xc1, count beyond the remaining bytes),
 * FM_ELIMIT (depth/objects/str/bin), with the offset in d. */
int fm_msg_check(const uint8_t *buf, size_t len, const fm_msg_limits *lim, fm_diag *d);

/* fm_msg_check, then msgpack_unpack into zone; the top-level object must be a map
 * (FM_ESCHEMA otherwise). obj points into zone. */
int fm_msg_unpack(const uint8_t *buf, size_t len, const fm_msg_limits *lim, msgpack_zone *zone, msgpack_object *obj,
                  fm_diag *d);

/* Map lookup by string key; NULL if map is not a map or has no such key. */
const msgpack_object *fm_msg_get(const msgpack_object *map, const char *key);
/* Typed getters: FM_OK, FM_ENOT_FOUND (absent), or FM_ESCHEMA (wrong type) with d naming key.
 * Strings are returned as pointer + length into the object (not NUL-terminated). */
int fm_msg_get_str(const msgpack_object *map, const char *key, const char **s, size_t *len, fm_diag *d);
int fm_msg_get_u64(const msgpack_object *map, const char *key, uint64_t *v, fm_diag *d);
int fm_msg_get_i64(const msgpack_object *map, const char *key, int64_t *v, fm_diag *d);
int fm_msg_get_f64(const msgpack_object *map, const char *key, double *v, fm_diag *d); /* int or float */
int fm_msg_get_bool(const msgpack_object *map, const char *key, bool *v, fm_diag *d);
int fm_msg_get_bin(const msgpack_object *map, const char *key, const uint8_t **p, size_t *len, fm_diag *d);
/* Copies a str field into a NUL-terminated buffer; FM_ELIMIT if it does not fit. */
int fm_msg_copy_str(const msgpack_object *map, const char *key, char *out, size_t cap, fm_diag *d);
/* True if o is a str equal to s. */
bool fm_msg_str_eq(const msgpack_object *o, const char *s);

/* Packing helpers (keys and string values from C strings). */
void fm_pack_cstr(msgpack_packer *pk, const char *s);
void fm_pack_strn(msgpack_packer *pk, const char *s, size_t n);
void fm_pack_bin(msgpack_packer *pk, const void *p, size_t n);
void fm_pack_kv_cstr(msgpack_packer *pk, const char *key, const char *val);
void fm_pack_kv_u64(msgpack_packer *pk, const char *key, uint64_t v);
void fm_pack_kv_i64(msgpack_packer *pk, const char *key, int64_t v);
void fm_pack_kv_f64(msgpack_packer *pk, const char *key, double v);
void fm_pack_kv_bool(msgpack_packer *pk, const char *key, bool v);

/* A complete error reply: {ok:false, id, code:<slug>, message:<fm_strerror>, detail}.
 * id is the request id (0 if unknown). */
void fm_pack_error_reply(msgpack_packer *pk, uint64_t id, int err, const char *detail);

#endif
