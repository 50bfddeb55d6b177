/* fm_frame.h: length-prefixed framing: a 4-byte big-endian payload length, then one
 * msgpack map of exactly that many bytes. A declared length above the reader's maximum
 * is refused as soon as the 4 header bytes arrive, before any buffering. */
#ifndef FM_FRAME_H
#define FM_FRAME_H

#include <stddef.h>
#include <stdint.h>

#define FM_FRAME_HEADER_BYTES 4
#define FM_FRAME_MAX_REQUEST  (1u << 20)   /* default cap on what the daemon accepts */
#define FM_FRAME_MAX_REPLY    (256u << 20) /* default cap on what a client accepts (CUBINs) */

/* Writes the header for a payload of len bytes. */
void fm_frame_header(uint8_t out[FM_FRAME_HEADER_BYTES], uint32_t len);

/* Incremental reader for a byte stream (a socket). */
typedef struct fm_frame_reader {
  uint8_t *buf;
  size_t len, cap; /* bytes buffered / allocated */
  size_t consumed; /* bytes of buf already handed out as frames */
  size_t max_frame;
} fm_frame_reader;

void fm_frame_reader_init(fm_frame_reader *r, size_t max_frame);
void fm_frame_reader_free(fm_frame_reader *r);
/* Appends bytes. FM_ETOOBIG as soon as a header declares more than max_frame (the stream
 * is then unusable: close it), FM_ENOMEM. */
int fm_frame_reader_feed(fm_frame_reader *r, const void *data, size_t n);
/* 1 and (*payload, *len) if a complete frame is buffered (valid until the next call of any
 * reader function), 0 if more bytes are needed. */
int fm_frame_reader_next(fm_frame_reader *r, const uint8_t **payload, size_t *len);
/* Bytes of an incomplete frame still buffered (so a hang-up mid-frame can be reported). */
size_t fm_frame_reader_pending(const fm_frame_reader *r);

#endif
