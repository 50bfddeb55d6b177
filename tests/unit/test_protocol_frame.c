/* test_protocol_frame.c: the incremental frame reader. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fm_error.h"
#include "fm_frame.h"
#include "fm_test.h"

/* Appends one frame (header + payload of n bytes filled with `fill`) to buf at *off. */
static void put_frame(uint8_t *buf, size_t *off, size_t n, uint8_t fill) {
  fm_frame_header(buf + *off, (uint32_t)n);
  memset(buf + *off + FM_FRAME_HEADER_BYTES, fill, n);
  *off += FM_FRAME_HEADER_BYTES + n;
}

static void test_header_big_endian(void) {
  uint8_t h[4];
  fm_frame_header(h, 0x01020304u);
  CHECK(h[0] == 1 && h[1] == 2 && h[2] == 3 && h[3] == 4);
  fm_frame_header(h, 0);
  CHECK(h[0] == 0 && h[1] == 0 && h[2] == 0 && h[3] == 0);
}

static void test_byte_by_byte(void) {
  uint8_t stream[64];
  size_t n = 0;
  put_frame(stream, &n, 5, 'a');
  put_frame(stream, &n, 0, 0);
  put_frame(stream, &n, 3, 'b');
  fm_frame_reader r;
  fm_frame_reader_init(&r, 1024);
  const uint8_t *p;
  size_t len;
  int frames = 0;
  size_t sizes[3];
  for (size_t i = 0; i < n; i++) {
    CHECK_EQ_INT(fm_frame_reader_feed(&r, stream + i, 1), FM_OK);
    while (fm_frame_reader_next(&r, &p, &len) == 1) {
      if (frames < 3) sizes[frames] = len;
      if (frames == 0) CHECK(len == 5 && memcmp(p, "aaaaa", 5) == 0);
      if (frames == 2) CHECK(len == 3 && memcmp(p, "bbb", 3) == 0);
      frames++;
    }
    /* After byte 6 of the first frame (header + 2 payload bytes) 6 bytes are pending. */
    if (i == 5) CHECK_EQ_INT(fm_frame_reader_pending(&r), 6);
  }
  CHECK_EQ_INT(frames, 3);
  CHECK(sizes[0] == 5 && sizes[1] == 0 && sizes[2] == 3);
  CHECK_EQ_INT(fm_frame_reader_pending(&r), 0);
  fm_frame_reader_free(&r);
}

static void test_many_frames_one_feed(void) {
  size_t cap = 100 * (FM_FRAME_HEADER_BYTES + 10);
  uint8_t *stream = malloc(cap);
  size_t n = 0;
  for (int i = 0; i < 100; i++) put_frame(stream, &n, 10, (uint8_t)i);
  /* plus half of a 101st frame */
  uint8_t tail[FM_FRAME_HEADER_BYTES + 2];
  fm_frame_header(tail, 7);
  tail[4] = tail[5] = 0xee;
  fm_frame_reader r;
  fm_frame_reader_init(&r, 16);
  CHECK_EQ_INT(fm_frame_reader_feed(&r, stream, n), FM_OK);
  CHECK_EQ_INT(fm_frame_reader_feed(&r, tail, sizeof tail), FM_OK);
  const uint8_t *p;
  size_t len;
  int i = 0;
  while (fm_frame_reader_next(&r, &p, &len) == 1) {
    CHECK(len == 10 && p[0] == (uint8_t)i && p[9] == (uint8_t)i);
    i++;
  }
  CHECK_EQ_INT(i, 100);
  CHECK_EQ_INT(fm_frame_reader_pending(&r), sizeof tail);
  /* the rest arrives: the partial frame completes */
  uint8_t rest[5] = {1, 2, 3, 4, 5};
  CHECK_EQ_INT(fm_frame_reader_feed(&r, rest, sizeof rest), FM_OK);
  CHECK_EQ_INT(fm_frame_reader_next(&r, &p, &len), 1);
  CHECK(len == 7 && p[0] == 0xee && p[2] == 1 && p[6] == 5);
  CHECK_EQ_INT(fm_frame_reader_next(&r, &p, &len), 0);
  CHECK_EQ_INT(fm_frame_reader_pending(&r), 0);
  fm_frame_reader_free(&r);
  free(stream);
}

static void test_oversize_refused_at_header(void) {
  fm_frame_reader r;
  fm_frame_reader_init(&r, 100);
  uint8_t h[4];
  fm_frame_header(h, 101);
  /* three header bytes are not enough to know */
  CHECK_EQ_INT(fm_frame_reader_feed(&r, h, 3), FM_OK);
  CHECK_EQ_INT(fm_frame_reader_feed(&r, h + 3, 1), FM_ETOOBIG);
  /* nothing of the refused frame was buffered beyond what we had */
  CHECK(r.cap <= 104);
  fm_frame_reader_free(&r);

  /* a 4 GB announcement costs nothing */
  fm_frame_reader_init(&r, FM_FRAME_MAX_REQUEST);
  uint8_t huge[8] = {0xff, 0xff, 0xff, 0xff, 1, 2, 3, 4};
  CHECK_EQ_INT(fm_frame_reader_feed(&r, huge, sizeof huge), FM_ETOOBIG);
  CHECK(r.len == 0 && r.buf == NULL);
  fm_frame_reader_free(&r);

  /* an oversize header behind a good frame in the same feed is refused too */
  uint8_t stream[32];
  size_t n = 0;
  put_frame(stream, &n, 4, 'x');
  fm_frame_header(stream + n, 1000);
  n += 4;
  fm_frame_reader_init(&r, 100);
  CHECK_EQ_INT(fm_frame_reader_feed(&r, stream, n), FM_ETOOBIG);
  fm_frame_reader_free(&r);

  /* exactly max_frame is fine */
  fm_frame_reader_init(&r, 8);
  n = 0;
  put_frame(stream, &n, 8, 'm');
  CHECK_EQ_INT(fm_frame_reader_feed(&r, stream, n), FM_OK);
  const uint8_t *p;
  size_t len;
  CHECK_EQ_INT(fm_frame_reader_next(&r, &p, &len), 1);
  CHECK_EQ_INT(len, 8);
  fm_frame_reader_free(&r);
}

/* The buffer grows geometrically but never past max_frame + 4 while frames are drained as
 * they complete, and compaction keeps it from creeping. */
static void test_growth_bounded(void) {
  const size_t max = 100000;
  fm_frame_reader r;
  fm_frame_reader_init(&r, max);
  uint8_t *frame = malloc(max + 4);
  size_t n = 0;
  put_frame(frame, &n, max, 'z');
  const uint8_t *p;
  size_t len;
  for (int round = 0; round < 5; round++) {
    for (size_t off = 0; off < n; off += 777) {
      size_t k = n - off < 777 ? n - off : 777;
      CHECK_EQ_INT(fm_frame_reader_feed(&r, frame + off, k), FM_OK);
      CHECK(r.cap <= max + 4);
      while (fm_frame_reader_next(&r, &p, &len) == 1) CHECK(len == max && p[max - 1] == 'z');
    }
  }
  CHECK(r.cap == max + 4);
  CHECK_EQ_INT(fm_frame_reader_pending(&r), 0);
  fm_frame_reader_free(&r);
  free(frame);
}

/* Small frames of varying size fed in chunks of varying size, long enough that compaction
 * runs many times: every frame comes out intact and in order, and the buffer stays small. */
static void test_compaction_keeps_data(void) {
  const size_t total = 200000;
  uint8_t *stream = malloc(total + 64);
  size_t n = 0;
  uint32_t frames = 0;
  while (n < total) {
    size_t plen = frames % 50; /* 0..49, empty frames included */
    fm_frame_header(stream + n, (uint32_t)plen);
    for (size_t i = 0; i < plen; i++) stream[n + 4 + i] = (uint8_t)(frames + i);
    n += 4 + plen;
    frames++;
  }
  fm_frame_reader r;
  fm_frame_reader_init(&r, 64);
  uint32_t got = 0;
  int bad = 0;
  size_t max_cap = 0;
  for (size_t off = 0, step = 1; off < n; off += step, step = step % 97 + 1) {
    if (step > n - off) step = n - off;
    CHECK_EQ_INT(fm_frame_reader_feed(&r, stream + off, step), FM_OK);
    const uint8_t *p;
    size_t len;
    while (fm_frame_reader_next(&r, &p, &len) == 1) {
      if (len != got % 50 || (len && (p[0] != (uint8_t)got || p[len - 1] != (uint8_t)(got + len - 1)))) bad++;
      got++;
    }
    if (r.cap > max_cap) max_cap = r.cap;
  }
  CHECK_EQ_INT(bad, 0);
  CHECK_EQ_INT(got, frames);
  CHECK_EQ_INT(fm_frame_reader_pending(&r), 0);
  /* one pending frame (<= 68 bytes) plus one chunk (<= 97) at most */
  CHECK(max_cap <= 68 + 97);
  fm_frame_reader_free(&r);
  free(stream);
}

int main(void) {
  RUN(test_header_big_endian);
  RUN(test_byte_by_byte);
  RUN(test_many_frames_one_feed);
  RUN(test_oversize_refused_at_header);
  RUN(test_growth_bounded);
  RUN(test_compaction_keeps_data);
  return FM_TEST_DONE();
}
