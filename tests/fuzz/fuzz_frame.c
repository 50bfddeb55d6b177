/* fuzz_frame.c: libFuzzer harness for the daemon's request path, minus NVRTC:
 * bytes -> frame reader -> fm_msg_unpack -> fm_fragment_decode (validates) -> canonicalize
 * -> canonical bytes -> fm_codegen_default + fm_codegen_generate (the default and two more).
 *
 * The input is used twice: as a byte stream fed to the frame reader in two pieces (split at
 * a point the first byte chooses, so partial headers are exercised), and as one frame payload
 * by itself, so the unframed fragment vectors in protocol/vectors/ are useful seeds. A payload
 * with a "fragment" map (a compile request) decodes that; otherwise the top-level map is taken
 * as the fragment. Properties checked beyond "no crash": canonical form is a fixed point
 * (canonicalizing the decoded canonical bytes gives the same bytes) and generated source is
 * non-empty. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fm_codegen.h"
#include "fm_fragment.h"
#include "fm_frame.h"
#include "fm_msg.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_MAX_FRAME      (64u << 10) /* smaller than the daemon's cap: keeps runs fast */
#define FUZZ_MAX_CANDIDATES 64

static void check(int cond, const char *what) {
  if (cond) return;
  fprintf(stderr, "fuzz_frame: property violated: %s\n", what);
  abort();
}

/* Decodes, canonicalizes and packs one fragment object; *bytes is malloc'd. */
static int canon_bytes(const msgpack_object *obj, fm_fragment *raw, fm_fragment *canon, uint8_t **bytes, size_t *len) {
  fm_diag d;
  int err = fm_fragment_decode(obj, raw, &d);
  if (err) return err;
  if ((err = fm_fragment_canonicalize(raw, canon))) return err;
  return fm_fragment_canonical_bytes(canon, bytes, len);
}

static void run_codegen(const fm_fragment *canon) {
  fm_candidate cands[FUZZ_MAX_CANDIDATES];
  fm_diag d;
  fm_candidate def;
  if (fm_codegen_default(canon, &def, &d)) return; /* unsupported: the client runs it unfused */
  size_t n = fm_codegen_candidates(canon, cands, FUZZ_MAX_CANDIDATES);
  if (n > FUZZ_MAX_CANDIDATES) n = FUZZ_MAX_CANDIDATES;
  /* The default, then at most two more: every candidate would make each input slow. */
  for (size_t i = 0; i <= n && i < 3; i++) {
    const fm_candidate *c = i == 0 ? &def : &cands[i - 1];
    char *src = NULL;
    fm_kernel_meta meta;
    /* a direct cuBLASLt plan (grid rule "none") is the one candidate with nothing to compile */
    if (fm_codegen_generate(canon, c, 132, &src, &meta, &d) == 0)
      check((src && src[0]) || (!src && strcmp(meta.grid_rule, "none") == 0), "empty source");
    free(src);
  }
}

static void one_payload(const uint8_t *p, size_t len) {
  msgpack_zone zone, zone2;
  msgpack_object msg, again;
  fm_diag d;
  fm_fragment *raw = malloc(sizeof *raw), *canon = malloc(sizeof *canon);
  uint8_t *bytes = NULL, *bytes2 = NULL;
  size_t n = 0, n2 = 0;
  if (!raw || !canon || !msgpack_zone_init(&zone, 4096)) goto out_nozone;
  if (fm_msg_unpack(p, len, &fm_msg_request_limits, &zone, &msg, &d)) goto out;
  const msgpack_object *frag = fm_msg_get(&msg, "fragment");
  if (!frag || frag->type != MSGPACK_OBJECT_MAP) frag = &msg;
  if (canon_bytes(frag, raw, canon, &bytes, &n)) goto out;
  /* The canonical bytes are themselves a valid fragment whose canonical form is the same. */
  if (!msgpack_zone_init(&zone2, 4096)) goto out;
  check(fm_msg_unpack(bytes, n, &fm_msg_request_limits, &zone2, &again, &d) == 0, "canonical bytes unpack");
  check(canon_bytes(&again, raw, canon, &bytes2, &n2) == 0, "canonical bytes decode");
  check(n == n2 && memcmp(bytes, bytes2, n) == 0, "canonical form is a fixed point");
  msgpack_zone_destroy(&zone2);
  run_codegen(canon);
out:
  msgpack_zone_destroy(&zone);
out_nozone:
  free(bytes);
  free(bytes2);
  free(raw);
  free(canon);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fm_frame_reader r;
  const uint8_t *payload;
  size_t len, split = size ? (size_t)data[0] % (size + 1) : 0;
  fm_frame_reader_init(&r, FUZZ_MAX_FRAME);
  int err = fm_frame_reader_feed(&r, data, split);
  while (!err && fm_frame_reader_next(&r, &payload, &len) == 1) one_payload(payload, len);
  if (!err) err = fm_frame_reader_feed(&r, data + split, size - split);
  while (!err && fm_frame_reader_next(&r, &payload, &len) == 1) one_payload(payload, len);
  fm_frame_reader_free(&r);
  one_payload(data, size);
  return 0;
}
