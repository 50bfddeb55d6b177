/* test_cache_util.h: helpers shared by the cache tests: temp directories and entries whose
 * every field is derived from a seed, so a test can rebuild what it expects to read back. */
#ifndef TEST_CACHE_UTIL_H
#define TEST_CACHE_UTIL_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* nftw, mkdtemp */
#endif
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fm_store.h"

#define TC_DEVICE "none/sm_90a"

/* A fresh directory under $TMPDIR (or /tmp); the path is written to dir. */
static void tc_mkdtemp(char *dir, size_t cap) {
  const char *base = getenv("TMPDIR");
  snprintf(dir, cap, "%s/fm-cache-XXXXXX", base && *base ? base : "/tmp");
  if (!mkdtemp(dir)) {
    perror("mkdtemp");
    abort();
  }
}

static int tc_rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb;
  (void)flag;
  (void)ftw;
  return remove(path);
}

static void tc_rmtree(const char *dir) { nftw(dir, tc_rm_one, 16, FTW_DEPTH | FTW_PHYS); }

/* A key derived from seed. */
static fm_key tc_key(unsigned seed) {
  fm_key k;
  char text[32];
  snprintf(text, sizeof text, "key-%u", seed);
  fm_sha256(text, strlen(text), k.bytes);
  return k;
}

static uint8_t *tc_bytes(unsigned seed, unsigned salt, size_t n) {
  uint8_t *p = malloc(n ? n : 1);
  uint32_t x = seed * 2654435761u + salt * 40503u + 1;
  for (size_t i = 0; i < n; i++) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    p[i] = (uint8_t)x;
  }
  return p;
}

/* An entry owning malloc'd blobs (release with fm_entry_free). version changes the blob
 * contents for the same key, to tell a replacement from the original. */
static void tc_entry(fm_entry *e, unsigned seed, unsigned version, size_t cubin_len) {
  memset(e, 0, sizeof *e);
  e->key = tc_key(seed);
  snprintf(e->device, sizeof e->device, "%s", TC_DEVICE);
  snprintf(e->kind, sizeof e->kind, "pointwise");
  e->canonical_len = 40 + seed % 17;
  e->canonical = tc_bytes(seed, 1 + 8 * version, e->canonical_len);
  e->cubin_len = cubin_len;
  e->cubin = tc_bytes(seed, 2 + 8 * version, cubin_len);
  e->meta_len = 24 + seed % 5;
  e->meta = tc_bytes(seed, 3 + 8 * version, e->meta_len);
  e->source = malloc(64);
  snprintf(e->source, 64, "extern \"C\" __global__ void k%u_v%u() {}", seed, version);
  e->timings_len = 9;
  e->timings = tc_bytes(seed, 4 + 8 * version, e->timings_len);
  e->state = FM_STATE_TUNED;
}

static int tc_blob_eq(const uint8_t *a, size_t an, const uint8_t *b, size_t bn) {
  return an == bn && (an == 0 || (a && b && memcmp(a, b, an) == 0));
}

/* Everything put stores, except the bookkeeping (created, last_used, hits). */
static int tc_same_content(const fm_entry *a, const fm_entry *b) {
  return memcmp(a->key.bytes, b->key.bytes, FM_KEY_BYTES) == 0 && strcmp(a->device, b->device) == 0 &&
         strcmp(a->kind, b->kind) == 0 && a->state == b->state &&
         tc_blob_eq(a->canonical, a->canonical_len, b->canonical, b->canonical_len) &&
         tc_blob_eq(a->cubin, a->cubin_len, b->cubin, b->cubin_len) &&
         tc_blob_eq(a->meta, a->meta_len, b->meta, b->meta_len) &&
         tc_blob_eq(a->timings, a->timings_len, b->timings, b->timings_len) &&
         ((!a->source && !b->source) || (a->source && b->source && strcmp(a->source, b->source) == 0));
}

#endif
