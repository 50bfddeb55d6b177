/* fm_msg_check.c: a validating walk over raw msgpack bytes, done before msgpack-c sees them.
 *
 * msgpack-c allocates an array's element storage as soon as it reads the header, so a
 * hostile count must be refused here, from the bytes alone: every declared length is
 * checked against the bytes that remain, and every element count too (each element needs
 * at least one byte), before the walk descends. Recursion depth is bounded by max_depth. */
#include "fm_msg.h"

#include <inttypes.h>

const fm_msg_limits fm_msg_request_limits = {
    .max_depth = 8, .max_objects = 65536, .max_str = 4096, .max_bin = 1u << 20};
/* Generated CUDA source travels in `show` replies and CUBINs in compile replies. */
const fm_msg_limits fm_msg_reply_limits = {
    .max_depth = 16, .max_objects = 1u << 20, .max_str = 16u << 20, .max_bin = 256u << 20};

/* msgpack-c's parser nests at most MSGPACK_EMBED_STACK_SIZE (32) containers; deeper input is
 * refused here whatever the limits say, so that what we accept it can always unpack (and the
 * recursion below stays shallow). */
#define HARD_MAX_DEPTH 32u

typedef struct walker {
  const uint8_t *buf;
  size_t len, pos;
  uint64_t objects;
  const fm_msg_limits *lim;
  fm_diag *d;
} walker;

static int truncated(walker *w, size_t at, const char *what) {
  return fm_diag_set(w->d, FM_EMALFORMED, "offset %zu: truncated %s (%zu bytes in the buffer)", at, what, w->len);
}

/* Reads an n-byte big-endian unsigned integer at pos+1 (after the type byte). */
static int read_be(walker *w, size_t n, uint64_t *v, const char *what) {
  if (w->len - w->pos - 1 < n) return truncated(w, w->pos, what);
  uint64_t x = 0;
  for (size_t i = 0; i < n; i++) x = (x << 8) | w->buf[w->pos + 1 + i];
  *v = x;
  return FM_OK;
}

/* Skips a type byte, an n-byte length field (hdr bytes in all, extra payload prefix bytes
 * such as an ext's type) and `size` payload bytes, after checking them against the buffer
 * and the limit. */
static int skip_sized(walker *w, size_t hdr, uint64_t size, uint64_t limit, const char *what, const char *limit_name) {
  size_t at = w->pos;
  if (size > limit)
    return fm_diag_set(w->d, FM_ELIMIT, "offset %zu: %s of %" PRIu64 " bytes exceeds %s (%" PRIu64 ")", at, what, size,
                       limit_name, limit);
  if (w->len - w->pos < hdr || w->len - w->pos - hdr < size) return truncated(w, at, what);
  w->pos += hdr + (size_t)size;
  return FM_OK;
}

static int walk(walker *w, uint32_t depth);

/* A container of `count` elements (a map counts 2 per entry) whose header is hdr bytes. */
static int walk_container(walker *w, size_t hdr, uint64_t count, int is_map, uint32_t depth) {
  size_t at = w->pos;
  const char *what = is_map ? "map" : "array";
  uint64_t elems = is_map ? 2 * count : count; /* count < 2^32, no overflow */
  uint32_t max_depth = w->lim->max_depth < HARD_MAX_DEPTH ? w->lim->max_depth : HARD_MAX_DEPTH;
  if (depth + 1 > max_depth)
    return fm_diag_set(w->d, FM_ELIMIT, "offset %zu: %s nested %u deep exceeds the limit %u", at, what, depth + 1,
                       max_depth);
  if (w->len - w->pos - hdr < elems)
    return fm_diag_set(w->d, FM_EMALFORMED, "offset %zu: %s declares %" PRIu64 " elements but only %zu bytes follow",
                       at, what, elems, w->len - w->pos - hdr);
  if (w->objects + elems > w->lim->max_objects)
    return fm_diag_set(w->d, FM_ELIMIT, "offset %zu: %s of %" PRIu64 " elements exceeds the limit of %u objects", at,
                       what, elems, w->lim->max_objects);
  w->pos += hdr;
  for (uint64_t i = 0; i < elems; i++) {
    int rc = walk(w, depth + 1);
    if (rc) return rc;
  }
  return FM_OK;
}

/* One object at w->pos; depth is the nesting of the container holding it (0 at top). */
static int walk(walker *w, uint32_t depth) {
  if (w->pos >= w->len) return truncated(w, w->pos, "object");
  if (++w->objects > w->lim->max_objects)
    return fm_diag_set(w->d, FM_ELIMIT, "offset %zu: more than %u objects", w->pos, w->lim->max_objects);
  uint8_t t = w->buf[w->pos];
  uint64_t n = 0;
  int rc;

  if (t <= 0x7f || t >= 0xe0 || t == 0xc0 || t == 0xc2 || t == 0xc3) { /* fixint, nil, bool */
    w->pos++;
    return FM_OK;
  }
  if (t >= 0x80 && t <= 0x8f) return walk_container(w, 1, t & 0x0f, 1, depth);
  if (t >= 0x90 && t <= 0x9f) return walk_container(w, 1, t & 0x0f, 0, depth);
  if (t >= 0xa0 && t <= 0xbf) return skip_sized(w, 1, t & 0x1f, w->lim->max_str, "str", "max_str");

  switch (t) {
    case 0xc1:
      return fm_diag_set(w->d, FM_EMALFORMED, "offset %zu: type byte 0xc1 is never used in msgpack", w->pos);
    case 0xc4:
    case 0xc5:
    case 0xc6: { /* bin 8/16/32 */
      size_t lb = (size_t)1 << (t - 0xc4);
      if ((rc = read_be(w, lb, &n, "bin header"))) return rc;
      return skip_sized(w, 1 + lb, n, w->lim->max_bin, "bin", "max_bin");
    }
    case 0xc7:
    case 0xc8:
    case 0xc9: { /* ext 8/16/32: length, type byte, data */
      size_t lb = (size_t)1 << (t - 0xc7);
      if ((rc = read_be(w, lb, &n, "ext header"))) return rc;
      return skip_sized(w, 1 + lb + 1, n, w->lim->max_bin, "ext", "max_bin");
    }
    case 0xca:
      return skip_sized(w, 1, 4, 4, "float32", "its size");
    case 0xcb:
      return skip_sized(w, 1, 8, 8, "float64", "its size");
    case 0xcc:
    case 0xcd:
    case 0xce:
    case 0xcf: /* uint 8..64 */
      return skip_sized(w, 1, (uint64_t)1 << (t - 0xcc), 8, "uint", "its size");
    case 0xd0:
    case 0xd1:
    case 0xd2:
    case 0xd3: /* int 8..64 */
      return skip_sized(w, 1, (uint64_t)1 << (t - 0xd0), 8, "int", "its size");
    case 0xd4:
    case 0xd5:
    case 0xd6:
    case 0xd7:
    case 0xd8: /* fixext 1..16: type byte, data */
      return skip_sized(w, 2, (uint64_t)1 << (t - 0xd4), 16, "fixext", "its size");
    case 0xd9:
    case 0xda:
    case 0xdb: { /* str 8/16/32 */
      size_t lb = (size_t)1 << (t - 0xd9);
      if ((rc = read_be(w, lb, &n, "str header"))) return rc;
      return skip_sized(w, 1 + lb, n, w->lim->max_str, "str", "max_str");
    }
    case 0xdc:
    case 0xdd: { /* array 16/32 */
      size_t lb = t == 0xdc ? 2 : 4;
      if ((rc = read_be(w, lb, &n, "array header"))) return rc;
      return walk_container(w, 1 + lb, n, 0, depth);
    }
    case 0xde:
    case 0xdf: { /* map 16/32 */
      size_t lb = t == 0xde ? 2 : 4;
      if ((rc = read_be(w, lb, &n, "map header"))) return rc;
      return walk_container(w, 1 + lb, n, 1, depth);
    }
  }
  /* Every byte value is covered above; this keeps the compiler and a future edit honest. */
  return fm_diag_set(w->d, FM_EMALFORMED, "offset %zu: unknown type byte 0x%02x", w->pos, t);
}

int fm_msg_check(const uint8_t *buf, size_t len, const fm_msg_limits *lim, fm_diag *d) {
  if (!lim) return fm_diag_set(d, FM_EINVAL, "fm_msg_check: no limits given");
  if (len == 0 || !buf) return fm_diag_set(d, FM_EMALFORMED, "empty message");
  walker w = {.buf = buf, .len = len, .pos = 0, .objects = 0, .lim = lim, .d = d};
  int rc = walk(&w, 0);
  if (rc) return rc;
  if (w.pos != len)
    return fm_diag_set(d, FM_EMALFORMED, "offset %zu: %zu trailing bytes after the message", w.pos, len - w.pos);
  return FM_OK;
}
