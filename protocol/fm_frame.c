/* fm_frame.c: length-prefixed frames over a byte stream.
 *
 * The reader keeps one buffer: [0, consumed) was handed out, [consumed, len) is pending.
 * Headers are checked before the bytes carrying them are copied in, so a peer announcing a
 * 4 GB frame costs us nothing but the 4 header bytes. */
#include "fm_frame.h"

#include <stdlib.h>
#include <string.h>

#include "fm_error.h"

#define FM_FRAME_MIN_CAP 4096u

void fm_frame_header(uint8_t out[FM_FRAME_HEADER_BYTES], uint32_t len) {
  out[0] = (uint8_t)(len >> 24);
  out[1] = (uint8_t)(len >> 16);
  out[2] = (uint8_t)(len >> 8);
  out[3] = (uint8_t)len;
}

static uint32_t be32(const uint8_t *p) {
  return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

void fm_frame_reader_init(fm_frame_reader *r, size_t max_frame) {
  memset(r, 0, sizeof *r);
  r->max_frame = max_frame;
}

void fm_frame_reader_free(fm_frame_reader *r) {
  free(r->buf);
  size_t max_frame = r->max_frame;
  memset(r, 0, sizeof *r);
  r->max_frame = max_frame;
}

/* Byte i of the virtual stream "pending buffer followed by data". */
static uint8_t stream_byte(const fm_frame_reader *r, const uint8_t *data, size_t i) {
  return i < r->len ? r->buf[i] : data[i - r->len];
}

/* Walks every frame header present in buffer + data, refusing an oversized one before
 * anything is copied. Re-walking the already checked frames is cheap: one step per frame. */
static int check_headers(const fm_frame_reader *r, const uint8_t *data, size_t n) {
  size_t total = r->len + n;
  size_t pos = r->consumed;
  while (total - pos >= FM_FRAME_HEADER_BYTES) {
    uint8_t h[FM_FRAME_HEADER_BYTES];
    for (size_t i = 0; i < FM_FRAME_HEADER_BYTES; i++) h[i] = stream_byte(r, data, pos + i);
    uint32_t flen = be32(h);
    if (flen > r->max_frame) return FM_ETOOBIG;
    pos += FM_FRAME_HEADER_BYTES + (size_t)flen;
    if (pos > total) break;
  }
  return FM_OK;
}

/* Moves the pending bytes to the front. Done when more than half the buffer is spent, so
 * each byte is moved O(1) times on average. */
static void compact(fm_frame_reader *r) {
  size_t pending = r->len - r->consumed;
  if (pending) memmove(r->buf, r->buf + r->consumed, pending);
  r->len = pending;
  r->consumed = 0;
}

int fm_frame_reader_feed(fm_frame_reader *r, const void *data, size_t n) {
  if (n == 0) return FM_OK;
  if (!data) return FM_EINVAL;
  int rc = check_headers(r, data, n);
  if (rc) return rc;

  if (r->consumed == r->len) {
    r->consumed = r->len = 0;
  } else if (r->consumed > r->len / 2 || r->len + n > r->cap) {
    compact(r);
  }
  size_t need = r->len + n;
  if (need > r->cap) {
    /* One pending frame never needs more than max_frame + 4, so growth stops there; only a
     * single feed carrying several whole frames at once may need more, and then exactly
     * what it carries (those frames' headers were all checked above). */
    size_t limit = r->max_frame + FM_FRAME_HEADER_BYTES;
    size_t cap = r->cap ? r->cap : FM_FRAME_MIN_CAP;
    while (cap < need && cap < limit) cap *= 2;
    if (cap > limit) cap = limit;
    if (cap < need) cap = need;
    uint8_t *nb = realloc(r->buf, cap);
    if (!nb) return FM_ENOMEM;
    r->buf = nb;
    r->cap = cap;
  }
  memcpy(r->buf + r->len, data, n);
  r->len += n;
  return FM_OK;
}

int fm_frame_reader_next(fm_frame_reader *r, const uint8_t **payload, size_t *len) {
  size_t avail = r->len - r->consumed;
  if (avail < FM_FRAME_HEADER_BYTES) return 0;
  uint32_t flen = be32(r->buf + r->consumed);
  if (avail - FM_FRAME_HEADER_BYTES < flen) return 0;
  *payload = r->buf + r->consumed + FM_FRAME_HEADER_BYTES;
  *len = flen;
  r->consumed += FM_FRAME_HEADER_BYTES + (size_t)flen;
  return 1;
}

size_t fm_frame_reader_pending(const fm_frame_reader *r) {
  size_t pos = r->consumed;
  while (r->len - pos >= FM_FRAME_HEADER_BYTES) {
    size_t flen = be32(r->buf + pos);
    if (r->len - pos - FM_FRAME_HEADER_BYTES < flen) break;
    pos += FM_FRAME_HEADER_BYTES + flen;
  }
  return r->len - pos;
}
