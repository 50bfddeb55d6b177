/* fm_msg.c: bounded unpacking and typed field access on msgpack maps. */
#include "fm_msg.h"

#include <string.h>

static const char *type_name(const msgpack_object *o) {
  switch (o->type) {
    case MSGPACK_OBJECT_NIL:
      return "nil";
    case MSGPACK_OBJECT_BOOLEAN:
      return "bool";
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
      return "unsigned integer";
    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
      return "negative integer";
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64:
      return "float";
    case MSGPACK_OBJECT_STR:
      return "str";
    case MSGPACK_OBJECT_ARRAY:
      return "array";
    case MSGPACK_OBJECT_MAP:
      return "map";
    case MSGPACK_OBJECT_BIN:
      return "bin";
    case MSGPACK_OBJECT_EXT:
      return "ext";
  }
  return "unknown";
}

int fm_msg_unpack(const uint8_t *buf, size_t len, const fm_msg_limits *lim, msgpack_zone *zone, msgpack_object *obj,
                  fm_diag *d) {
  if (!zone || !obj) return fm_diag_set(d, FM_EINVAL, "fm_msg_unpack: no zone or result");
  int rc = fm_msg_check(buf, len, lim, d);
  if (rc) return rc;
  size_t off = 0;
  msgpack_unpack_return ur = msgpack_unpack((const char *)buf, len, &off, zone, obj);
  if (ur == MSGPACK_UNPACK_NOMEM_ERROR)
    return fm_diag_set(d, FM_ENOMEM, "out of memory unpacking a %zu-byte message", len);
  /* fm_msg_check accepted it, so anything but a clean success is a disagreement between the
   * two parsers: refuse rather than guess. */
  if (ur != MSGPACK_UNPACK_SUCCESS || off != len)
    return fm_diag_set(d, FM_EMALFORMED, "msgpack unpack failed (%d) at offset %zu", (int)ur, off);
  if (obj->type != MSGPACK_OBJECT_MAP)
    return fm_diag_set(d, FM_ESCHEMA, "a message must be a map, got %s", type_name(obj));
  return FM_OK;
}

bool fm_msg_str_eq(const msgpack_object *o, const char *s) {
  if (!o || o->type != MSGPACK_OBJECT_STR) return false;
  size_t n = strlen(s);
  return o->via.str.size == n && (n == 0 || memcmp(o->via.str.ptr, s, n) == 0);
}

const msgpack_object *fm_msg_get(const msgpack_object *map, const char *key) {
  if (!map || map->type != MSGPACK_OBJECT_MAP) return NULL;
  for (uint32_t i = 0; i < map->via.map.size; i++) {
    const msgpack_object_kv *kv = &map->via.map.ptr[i];
    if (fm_msg_str_eq(&kv->key, key)) return &kv->val;
  }
  return NULL;
}

/* The common head of every typed getter: the field, or FM_ENOT_FOUND. */
static int get_field(const msgpack_object *map, const char *key, const msgpack_object **o, fm_diag *d) {
  *o = fm_msg_get(map, key);
  if (!*o) return fm_diag_set(d, FM_ENOT_FOUND, "missing field '%s'", key);
  return FM_OK;
}

static int wrong_type(const char *key, const msgpack_object *o, const char *want, fm_diag *d) {
  return fm_diag_set(d, FM_ESCHEMA, "field '%s': expected %s, got %s", key, want, type_name(o));
}

int fm_msg_get_str(const msgpack_object *map, const char *key, const char **s, size_t *len, fm_diag *d) {
  const msgpack_object *o;
  int rc = get_field(map, key, &o, d);
  if (rc) return rc;
  if (o->type != MSGPACK_OBJECT_STR) return wrong_type(key, o, "a str", d);
  *s = o->via.str.ptr;
  *len = o->via.str.size;
  return FM_OK;
}

int fm_msg_get_u64(const msgpack_object *map, const char *key, uint64_t *v, fm_diag *d) {
  const msgpack_object *o;
  int rc = get_field(map, key, &o, d);
  if (rc) return rc;
  if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER) return wrong_type(key, o, "an unsigned integer", d);
  *v = o->via.u64;
  return FM_OK;
}

int fm_msg_get_i64(const msgpack_object *map, const char *key, int64_t *v, fm_diag *d) {
  const msgpack_object *o;
  int rc = get_field(map, key, &o, d);
  if (rc) return rc;
  if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
    *v = o->via.i64;
    return FM_OK;
  }
  if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER) return wrong_type(key, o, "an integer", d);
  if (o->via.u64 > (uint64_t)INT64_MAX)
    return fm_diag_set(d, FM_ESCHEMA, "field '%s': %llu does not fit a signed 64-bit integer", key,
                       (unsigned long long)o->via.u64);
  *v = (int64_t)o->via.u64;
  return FM_OK;
}

int fm_msg_get_f64(const msgpack_object *map, const char *key, double *v, fm_diag *d) {
  const msgpack_object *o;
  int rc = get_field(map, key, &o, d);
  if (rc) return rc;
  switch (o->type) {
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64:
      *v = o->via.f64;
      return FM_OK;
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
      *v = (double)o->via.u64;
      return FM_OK;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
      *v = (double)o->via.i64;
      return FM_OK;
    default:
      return wrong_type(key, o, "a number", d);
  }
}

int fm_msg_get_bool(const msgpack_object *map, const char *key, bool *v, fm_diag *d) {
  const msgpack_object *o;
  int rc = get_field(map, key, &o, d);
  if (rc) return rc;
  if (o->type != MSGPACK_OBJECT_BOOLEAN) return wrong_type(key, o, "a bool", d);
  *v = o->via.boolean;
  return FM_OK;
}

int fm_msg_get_bin(const msgpack_object *map, const char *key, const uint8_t **p, size_t *len, fm_diag *d) {
  const msgpack_object *o;
  int rc = get_field(map, key, &o, d);
  if (rc) return rc;
  if (o->type != MSGPACK_OBJECT_BIN) return wrong_type(key, o, "a bin", d);
  *p = (const uint8_t *)o->via.bin.ptr;
  *len = o->via.bin.size;
  return FM_OK;
}

int fm_msg_copy_str(const msgpack_object *map, const char *key, char *out, size_t cap, fm_diag *d) {
  const char *s = NULL;
  size_t n = 0;
  int rc = fm_msg_get_str(map, key, &s, &n, d);
  if (rc) return rc;
  if (n >= cap)
    return fm_diag_set(d, FM_ELIMIT, "field '%s': %zu bytes, at most %zu allowed", key, n, cap ? cap - 1 : 0);
  /* A NUL inside would silently cut the C string short: what we use would differ from what
   * was sent. */
  if (n && memchr(s, '\0', n)) return fm_diag_set(d, FM_ESCHEMA, "field '%s': contains a NUL byte", key);
  if (n) memcpy(out, s, n);
  out[n] = '\0';
  return FM_OK;
}
