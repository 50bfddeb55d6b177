/* fm_fingerprint.h: the cache key. SHA-256 (OpenSSL libcrypto) over typed, delimited
 * fields, so no two different field lists can produce the same byte stream:
 *
 *   stream  := "fusemld-key" u8(FM_KEY_FORMAT) field*
 *   field   := u8(tag) u8(type) u64be(len) bytes[len]
 *   type    := 's' (UTF-8 string) | 'u' (u64be, len 8) | 'b' (raw bytes)
 *
 * Fields, in this order (tag: meaning):
 *   1 b canonical fragment bytes (fm_fragment_canonical_bytes)
 *   2 s GPU name ("none" in compile-only mode)     3 u cc major   4 u cc minor
 *   5 u SM count                                   6 s target arch ("sm_90a")
 *   7 u codegen version                            8 u NVRTC major  9 u NVRTC minor
 *  10 s NVRTC options (space separated, in the order passed)
 *  11 u protocol vocabulary version
 *  12 u cuBLASLt version (cublasLtGetVersion(): the algorithms a stored plan names are its)
 * A later field is appended with a new tag; FM_KEY_FORMAT bumps when the layout changes
 * (format 2 appended field 12). */
#ifndef FM_FINGERPRINT_H
#define FM_FINGERPRINT_H

#include <stddef.h>
#include <stdint.h>

#define FM_KEY_FORMAT 2
#define FM_KEY_BYTES  32
#define FM_KEY_HEX    (2 * FM_KEY_BYTES + 1)

typedef struct fm_key {
  uint8_t bytes[FM_KEY_BYTES];
} fm_key;

/* What the kernel will run on. In compile-only mode: name "none", cc/sm 0, arch from config. */
typedef struct fm_device_id {
  char name[128];
  uint32_t cc_major, cc_minor;
  uint32_t sm_count;
  char arch[16]; /* NVRTC target, e.g. "sm_90a" */
} fm_device_id;

typedef struct fm_key_inputs {
  const uint8_t *canonical;
  size_t canonical_len;
  const fm_device_id *device;
  uint32_t codegen_version;
  uint32_t nvrtc_major, nvrtc_minor;
  const char *nvrtc_options;
  uint32_t vocab_version;
  uint64_t cublaslt_version;
} fm_key_inputs;

/* FM_OK or FM_ENOMEM/FM_EINVAL. */
int fm_fingerprint(const fm_key_inputs *in, fm_key *out);

/* Lowercase hex, NUL-terminated. */
void fm_key_to_hex(const fm_key *k, char out[FM_KEY_HEX]);
/* Parses exactly 64 hex digits (either case); FM_EINVAL otherwise. */
int fm_key_from_hex(const char *s, size_t len, fm_key *out);

/* A stable device label for the store and for display: "NVIDIA H100 80GB HBM3/sm_90a/132sm"
 * or "none/sm_90a". */
void fm_device_label(const fm_device_id *dev, char *out, size_t cap);

/* SHA-256 of a buffer (also used for blob checksums). */
void fm_sha256(const void *data, size_t len, uint8_t out[32]);

#endif
