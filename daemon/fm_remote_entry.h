/* fm_remote_entry.h: one kernel-store entry as a portable, self-checking value: what the
 * remote tier (fm_remote.h) keeps in Redis and what `fusectl export` writes. The format is
 * documented in docs/REMOTE.md:
 *
 *   value := "FMR1" map tag
 *   map   := msgpack map {key, device, arch, kind, state, codegen, nvrtc, vocab, canonical,
 *                         meta, cubin, source, timings, created, sum, signed}
 *   tag   := 32 bytes: HMAC-SHA256(secret, "FMR1" map) when signed, else SHA-256("FMR1" map)
 *   sum   := SHA-256 of canonical, meta and cubin (each preceded by its length, u64 LE)
 *
 * Decoding checks the framing, the sum and the tag; verification (fm_remote_entry_verify) then
 * checks that the entry is the one this daemon would have built itself. Pure functions, any
 * thread. */
#ifndef FM_REMOTE_ENTRY_H
#define FM_REMOTE_ENTRY_H

#include <stddef.h>
#include <stdint.h>

#include "fm_error.h"
#include "fm_fingerprint.h"
#include "fm_store.h"

#define FM_REMOTE_FORMAT     "v1" /* the <format> part of Redis keys; bump with the magic */
#define FM_REMOTE_MAGIC      "FMR1"
#define FM_REMOTE_TAG_LEN    32
#define FM_REMOTE_SECRET_MAX 4096

/* Who built an entry: compared with the reader's own on verification. */
typedef struct fm_remote_build {
  char arch[16];
  uint32_t codegen_version;
  uint32_t nvrtc_major, nvrtc_minor;
  uint32_t vocab_version;
} fm_remote_build;

/* The cluster secret (may be empty: then values are unsigned). */
typedef struct fm_remote_secret {
  uint8_t bytes[FM_REMOTE_SECRET_MAX];
  size_t len;
} fm_remote_secret;

/* Reads the secret from path: its bytes, without a trailing newline. FM_EINVAL if it is empty
 * or larger than FM_REMOTE_SECRET_MAX, FM_EIO if unreadable, with the reason in d. */
int fm_remote_secret_load(const char *path, fm_remote_secret *s, fm_diag *d);

/* Encodes e (its blobs must be present) built by b into a malloc'd value. FM_ENOMEM. */
int fm_remote_entry_encode(const fm_entry *e, const fm_remote_build *b, const fm_remote_secret *secret, uint8_t **out,
                           size_t *out_len);

/* Decodes a value into *e (malloc'd blobs: fm_entry_free) and *b. Checks the magic, the
 * msgpack, the sum (FM_ECORRUPT) and the tag: with a non-empty secret the value must be
 * signed with it (FM_EDENIED otherwise); without one an unsigned value's tag must be its
 * SHA-256 (FM_ECORRUPT) and a signed value's tag cannot be checked (its sum still is). */
int fm_remote_entry_decode(const uint8_t *val, size_t len, const fm_remote_secret *secret, fm_entry *e,
                           fm_remote_build *b, fm_diag *d);

/* Checks a decoded entry against what the reader would build: key, device label, arch,
 * codegen/NVRTC/vocabulary versions equal, and (canonical != NULL) the canonical fragment
 * equal. FM_EINVAL with the first difference in d. */
int fm_remote_entry_verify(const fm_entry *e, const fm_remote_build *b, const fm_key *key, const char *label,
                           const fm_remote_build *mine, const uint8_t *canonical, size_t canonical_len, fm_diag *d);

/* The Redis key: fusemld:<format>:<device label, [A-Za-z0-9._-] kept, others '_'>:<hex key>. */
void fm_remote_entry_rkey(const char *label, const fm_key *key, char *out, size_t cap);

#endif
