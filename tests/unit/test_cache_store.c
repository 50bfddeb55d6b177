/* test_cache_store.c: the kernel store's entry operations: round trip, miss, replace,
 * touch, list, prefix search, evict, LRU eviction under a cap, persistent statistics. */
#include "test_cache_util.h"

#include <time.h>

#include "fm_test.h"

static char g_dir[512];

/* Opens a store at a fresh file name in g_dir. */
static fm_store *open_new(const char *name, uint64_t cap) {
  char path[600];
  fm_diag d = {{0}};
  fm_store *s = NULL;
  snprintf(path, sizeof path, "%s/%s", g_dir, name);
  int err = fm_store_open(path, cap, &s, &d);
  if (err != FM_OK) fprintf(stderr, "  open %s: %s: %s\n", path, fm_strerror(err), d.text);
  CHECK_EQ_INT(err, FM_OK);
  CHECK_EQ_INT(d.text[0], 0); /* nothing to report on a clean open */
  return s;
}

static void put_seed(fm_store *s, unsigned seed, size_t cubin_len, int64_t last_used) {
  fm_entry e;
  tc_entry(&e, seed, 0, cubin_len);
  e.last_used = last_used;
  e.created = last_used;
  CHECK_EQ_INT(fm_store_put(s, &e), FM_OK);
  fm_entry_free(&e);
}

static int present(fm_store *s, unsigned seed) {
  fm_key k = tc_key(seed);
  fm_entry got;
  int err = fm_store_get(s, &k, TC_DEVICE, 0, &got);
  fm_entry_free(&got);
  return err == FM_OK;
}

static void test_round_trip(void) {
  fm_store *s = open_new("round.db", 0);
  fm_entry e, got;
  tc_entry(&e, 1, 0, 5000);
  e.created = 1000;
  e.last_used = 2000;
  e.hits = 5;
  CHECK_EQ_INT(fm_store_put(s, &e), FM_OK);
  CHECK_EQ_INT(fm_store_get(s, &e.key, TC_DEVICE, 0, &got), FM_OK);
  CHECK(tc_same_content(&e, &got));
  CHECK_EQ_INT(got.created, 1000);
  CHECK_EQ_INT(got.last_used, 2000);
  CHECK_EQ_INT(got.hits, 5);
  CHECK_EQ_INT(got.state, FM_STATE_TUNED);
  fm_entry_free(&got);
  CHECK(got.cubin == NULL && got.cubin_len == 0);

  /* No source, no timings, empty canonical; created/last_used 0 mean now. */
  fm_entry bare;
  tc_entry(&bare, 2, 0, 10);
  free(bare.source);
  bare.source = NULL;
  free(bare.timings);
  bare.timings = NULL;
  bare.timings_len = 0;
  bare.canonical_len = 0;
  bare.state = FM_STATE_UNTUNED;
  snprintf(bare.device, sizeof bare.device, "NVIDIA H100 80GB HBM3/sm_90a/132sm");
  int64_t before = (int64_t)time(NULL);
  CHECK_EQ_INT(fm_store_put(s, &bare), FM_OK);
  CHECK_EQ_INT(fm_store_get(s, &bare.key, bare.device, 0, &got), FM_OK);
  bare.canonical_len = 0;
  CHECK(tc_same_content(&bare, &got));
  CHECK(got.source == NULL && got.timings == NULL && got.timings_len == 0);
  CHECK(got.canonical_len == 0);
  CHECK(got.created >= before && got.created <= (int64_t)time(NULL));
  CHECK(got.last_used >= before);
  CHECK_EQ_INT(got.state, FM_STATE_UNTUNED);
  fm_entry_free(&got);

  uint64_t n = 0, bytes = 0;
  CHECK_EQ_INT(fm_store_usage(s, &n, &bytes), FM_OK);
  CHECK_EQ_INT(n, 2);
  CHECK_EQ_INT(bytes, 5010);
  fm_entry_free(&e);
  fm_entry_free(&bare);
  fm_store_close(s);
}

static void test_miss(void) {
  fm_store *s = open_new("miss.db", 0);
  put_seed(s, 1, 100, 0);
  fm_key k = tc_key(2), k1 = tc_key(1);
  fm_entry got;
  memset(&got, 0x5a, sizeof got);
  CHECK_EQ_INT(fm_store_get(s, &k, TC_DEVICE, 1, &got), FM_ENOT_FOUND);
  CHECK(got.cubin == NULL && got.canonical == NULL && got.source == NULL);
  /* The device is part of the key: the same fingerprint on another device is a miss. */
  CHECK_EQ_INT(fm_store_get(s, &k1, "none/sm_80", 0, &got), FM_ENOT_FOUND);
  CHECK_EQ_INT(fm_store_get(s, &k1, TC_DEVICE, 0, &got), FM_OK);
  fm_entry_free(&got);
  fm_store_close(s);
}

static void test_replace(void) {
  fm_store *s = open_new("replace.db", 0);
  fm_entry v0, v1, got;
  tc_entry(&v0, 3, 0, 800);
  tc_entry(&v1, 3, 1, 300);
  v1.state = FM_STATE_BAD;
  CHECK_EQ_INT(fm_store_put(s, &v0), FM_OK);
  CHECK_EQ_INT(fm_store_put(s, &v1), FM_OK);
  CHECK_EQ_INT(fm_store_get(s, &v0.key, TC_DEVICE, 0, &got), FM_OK);
  CHECK(tc_same_content(&v1, &got));
  CHECK(!tc_same_content(&v0, &got));
  CHECK_EQ_INT(got.state, FM_STATE_BAD);
  fm_entry_free(&got);
  uint64_t n = 0, bytes = 0;
  CHECK_EQ_INT(fm_store_usage(s, &n, &bytes), FM_OK);
  CHECK_EQ_INT(n, 1);
  CHECK_EQ_INT(bytes, 300);
  fm_entry_free(&v0);
  fm_entry_free(&v1);
  fm_store_close(s);
}

static void test_touch(void) {
  fm_store *s = open_new("touch.db", 0);
  put_seed(s, 4, 100, 1000);
  fm_key k = tc_key(4);
  fm_entry got;
  int64_t before = (int64_t)time(NULL);
  CHECK_EQ_INT(fm_store_get(s, &k, TC_DEVICE, 1, &got), FM_OK);
  CHECK_EQ_INT(got.hits, 1);
  CHECK(got.last_used >= before);
  fm_entry_free(&got);
  CHECK_EQ_INT(fm_store_get(s, &k, TC_DEVICE, 1, &got), FM_OK);
  CHECK_EQ_INT(got.hits, 2);
  fm_entry_free(&got);
  /* Without touch, nothing moves; and what the touches wrote is what is stored. */
  CHECK_EQ_INT(fm_store_get(s, &k, TC_DEVICE, 0, &got), FM_OK);
  CHECK_EQ_INT(got.hits, 2);
  CHECK(got.last_used >= before && got.last_used <= (int64_t)time(NULL));
  CHECK_EQ_INT(got.created, 1000);
  fm_entry_free(&got);
  CHECK_EQ_INT(fm_store_get(s, &k, TC_DEVICE, 0, &got), FM_OK);
  CHECK_EQ_INT(got.hits, 2);
  fm_entry_free(&got);
  fm_store_close(s);
}

typedef struct {
  int n, stop_after;
  int64_t last_used[16];
  int blobs_null;
  size_t cubin_len[16];
} list_ctx;

static int collect(const fm_entry *e, void *p) {
  list_ctx *c = p;
  if (c->n < 16) {
    c->last_used[c->n] = e->last_used;
    c->cubin_len[c->n] = e->cubin_len;
  }
  if (e->cubin || e->canonical || e->meta || e->source || e->timings) c->blobs_null = 0;
  c->n++;
  return c->stop_after && c->n >= c->stop_after;
}

static void test_list(void) {
  fm_store *s = open_new("list.db", 0);
  for (unsigned i = 1; i <= 5; i++) put_seed(s, 10 + i, 100 * i, 100 * (int64_t)i);
  list_ctx c = {.blobs_null = 1};
  CHECK_EQ_INT(fm_store_list(s, 0, collect, &c), FM_OK);
  CHECK_EQ_INT(c.n, 5);
  for (int i = 0; i < 5; i++) {
    CHECK_EQ_INT(c.last_used[i], 100 * (5 - i)); /* most recently used first */
    CHECK_EQ_INT(c.cubin_len[i], 100 * (5 - i));
  }
  CHECK(c.blobs_null);

  list_ctx lim = {.blobs_null = 1};
  CHECK_EQ_INT(fm_store_list(s, 2, collect, &lim), FM_OK);
  CHECK_EQ_INT(lim.n, 2);
  CHECK_EQ_INT(lim.last_used[1], 400);

  list_ctx stop = {.stop_after = 3, .blobs_null = 1};
  CHECK_EQ_INT(fm_store_list(s, 0, collect, &stop), FM_OK);
  CHECK_EQ_INT(stop.n, 3);
  CHECK_EQ_INT(fm_store_list(s, 0, NULL, NULL), FM_EINVAL);
  fm_store_close(s);
}

static void put_key(fm_store *s, const char *hex, const char *device) {
  fm_entry e;
  tc_entry(&e, 20, 0, 64);
  CHECK_EQ_INT(fm_key_from_hex(hex, strlen(hex), &e.key), FM_OK);
  snprintf(e.device, sizeof e.device, "%s", device);
  CHECK_EQ_INT(fm_store_put(s, &e), FM_OK);
  fm_entry_free(&e);
}

static int find(fm_store *s, const char *prefix, char hex[FM_KEY_HEX]) {
  fm_entry got;
  int err = fm_store_find_prefix(s, prefix, &got);
  hex[0] = '\0';
  if (err == FM_OK) fm_key_to_hex(&got.key, hex);
  if (err == FM_OK) CHECK(got.cubin_len == 64 && got.cubin != NULL);
  fm_entry_free(&got);
  return err;
}

static void test_find_prefix(void) {
  fm_store *s = open_new("prefix.db", 0);
  const char *k1 = "abcd010000000000000000000000000000000000000000000000000000000001";
  const char *k2 = "abcd020000000000000000000000000000000000000000000000000000000002";
  const char *k3 = "ef00ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff";
  put_key(s, k1, TC_DEVICE);
  put_key(s, k2, TC_DEVICE);
  put_key(s, k3, TC_DEVICE);
  put_key(s, k3, "none/sm_80"); /* one key on two devices is still one match */
  char hex[FM_KEY_HEX];
  CHECK_EQ_INT(find(s, "abcd01", hex), FM_OK);
  CHECK(strcmp(hex, k1) == 0);
  CHECK_EQ_INT(find(s, "ABCD02", hex), FM_OK);
  CHECK(strcmp(hex, k2) == 0);
  CHECK_EQ_INT(find(s, "abcd0", hex), FM_EINVAL); /* ambiguous, odd length */
  CHECK_EQ_INT(find(s, "abcd", hex), FM_EINVAL);  /* ambiguous */
  fm_diag d;
  fm_store_last_error(s, &d);
  CHECK_STR_CONTAINS(d.text, "more than one");
  CHECK_EQ_INT(find(s, "ef00", hex), FM_OK);
  CHECK(strcmp(hex, k3) == 0);
  CHECK_EQ_INT(find(s, "ef0", hex), FM_EINVAL); /* too short */
  CHECK_EQ_INT(find(s, k3, hex), FM_OK);        /* all 64 digits */
  CHECK_EQ_INT(find(s, "1234", hex), FM_ENOT_FOUND);
  CHECK_EQ_INT(find(s, "abce", hex), FM_ENOT_FOUND);
  CHECK_EQ_INT(find(s, "abcz", hex), FM_EINVAL);
  CHECK_EQ_INT(find(s, "ab%'", hex), FM_EINVAL);
  CHECK_EQ_INT(find(s, "abcd' OR 1=1 --", hex), FM_EINVAL);
  fm_store_last_error(s, &d);
  CHECK_STR_CONTAINS(d.text, "not hexadecimal");
  CHECK_EQ_INT(find(s, "", hex), FM_EINVAL);
  CHECK_EQ_INT(fm_store_find_prefix(s, NULL, NULL), FM_EINVAL);
  fm_store_close(s);
}

static void test_evict(void) {
  fm_store *s = open_new("evict.db", 0);
  for (unsigned i = 0; i < 4; i++) put_seed(s, 30 + i, 10, 0);
  fm_entry other;
  tc_entry(&other, 30, 0, 10);
  snprintf(other.device, sizeof other.device, "none/sm_80");
  CHECK_EQ_INT(fm_store_put(s, &other), FM_OK);
  fm_entry_free(&other);

  fm_key k = tc_key(30);
  CHECK_EQ_INT(fm_store_evict(s, &k), FM_OK); /* both devices */
  CHECK(!present(s, 30));
  fm_entry got;
  CHECK_EQ_INT(fm_store_get(s, &k, "none/sm_80", 0, &got), FM_ENOT_FOUND);
  CHECK_EQ_INT(fm_store_evict(s, &k), FM_ENOT_FOUND);
  CHECK(present(s, 31));

  uint64_t n = 99;
  CHECK_EQ_INT(fm_store_evict_all(s, &n), FM_OK);
  CHECK_EQ_INT(n, 3);
  uint64_t entries = 9, bytes = 9;
  CHECK_EQ_INT(fm_store_usage(s, &entries, &bytes), FM_OK);
  CHECK_EQ_INT(entries, 0);
  CHECK_EQ_INT(bytes, 0);
  CHECK_EQ_INT(fm_store_evict_all(s, &n), FM_OK);
  CHECK_EQ_INT(n, 0);
  /* Manual eviction is not LRU eviction. */
  int64_t st[FM_STAT__COUNT];
  CHECK_EQ_INT(fm_store_stats(s, st), FM_OK);
  CHECK_EQ_INT(st[FM_STAT_EVICTIONS], 0);
  fm_store_close(s);
}

static void test_lru(void) {
  fm_store *s = open_new("lru.db", 3000);
  put_seed(s, 41, 1000, 10);
  put_seed(s, 42, 1000, 20);
  put_seed(s, 43, 1000, 30);
  uint64_t n = 0, bytes = 0;
  CHECK_EQ_INT(fm_store_usage(s, &n, &bytes), FM_OK);
  CHECK_EQ_INT(bytes, 3000); /* exactly at the cap: nothing evicted */

  /* Touching 41 makes 42 the least recently used. */
  fm_key k41 = tc_key(41);
  fm_entry got;
  CHECK_EQ_INT(fm_store_get(s, &k41, TC_DEVICE, 1, &got), FM_OK);
  fm_entry_free(&got);
  put_seed(s, 44, 1000, 0);
  CHECK(present(s, 41));
  CHECK(!present(s, 42));
  CHECK(present(s, 43) && present(s, 44));
  int64_t st[FM_STAT__COUNT];
  CHECK_EQ_INT(fm_store_stats(s, st), FM_OK);
  CHECK_EQ_INT(st[FM_STAT_EVICTIONS], 1);

  /* An entry larger than the cap alone pushes out everything else, and stays. */
  put_seed(s, 45, 5000, 0);
  CHECK_EQ_INT(fm_store_usage(s, &n, &bytes), FM_OK);
  CHECK_EQ_INT(n, 1);
  CHECK_EQ_INT(bytes, 5000);
  CHECK(present(s, 45));
  CHECK_EQ_INT(fm_store_stats(s, st), FM_OK);
  CHECK_EQ_INT(st[FM_STAT_EVICTIONS], 4);

  /* The next put evicts it (the new entry is never the victim). */
  put_seed(s, 46, 100, 0);
  CHECK(present(s, 46) && !present(s, 45));

  /* Equal last_used and created: insertion order decides. */
  put_seed(s, 47, 1000, 50);
  put_seed(s, 48, 1000, 50);
  put_seed(s, 49, 1000, 50); /* 3100 bytes: one must go, and 46 was used later */
  CHECK(!present(s, 47));
  CHECK(present(s, 46) && present(s, 48) && present(s, 49));
  CHECK_EQ_INT(fm_store_stats(s, st), FM_OK);
  CHECK_EQ_INT(st[FM_STAT_EVICTIONS], 6);
  fm_store_close(s);
}

static void test_stats_persist(void) {
  char path[600];
  snprintf(path, sizeof path, "%s/stats.db", g_dir);
  fm_store *s = NULL;
  fm_diag d;
  CHECK_EQ_INT(fm_store_open(path, 0, &s, &d), FM_OK);
  int64_t st[FM_STAT__COUNT];
  CHECK_EQ_INT(fm_store_stats(s, st), FM_OK);
  for (int i = 0; i < FM_STAT__COUNT; i++) CHECK_EQ_INT(st[i], 0);
  CHECK_EQ_INT(fm_store_stat_add(s, FM_STAT_HITS, 3), FM_OK);
  CHECK_EQ_INT(fm_store_stat_add(s, FM_STAT_MISSES, 2), FM_OK);
  CHECK_EQ_INT(fm_store_stat_add(s, FM_STAT_HITS, 4), FM_OK);
  CHECK_EQ_INT(fm_store_stat_add(s, FM_STAT_BAD_REQUESTS, 1), FM_OK);
  CHECK_EQ_INT(fm_store_stat_add(s, (fm_stat)0, 1), FM_EINVAL);
  CHECK_EQ_INT(fm_store_stat_add(s, FM_STAT__COUNT, 1), FM_EINVAL);
  fm_store_close(s);

  CHECK_EQ_INT(fm_store_open(path, 0, &s, &d), FM_OK);
  CHECK_EQ_INT(fm_store_stats(s, st), FM_OK);
  CHECK_EQ_INT(st[FM_STAT_HITS], 7);
  CHECK_EQ_INT(st[FM_STAT_MISSES], 2);
  CHECK_EQ_INT(st[FM_STAT_BAD_REQUESTS], 1);
  CHECK_EQ_INT(st[FM_STAT_COMPILES], 0);
  /* Zeroed: every counter 0, then counting starts again from there, and it lasts. */
  CHECK_EQ_INT(fm_store_stats_zero(s), FM_OK);
  CHECK_EQ_INT(fm_store_stat_add(s, FM_STAT_MISSES, 1), FM_OK);
  fm_store_close(s);
  CHECK_EQ_INT(fm_store_open(path, 0, &s, &d), FM_OK);
  CHECK_EQ_INT(fm_store_stats(s, st), FM_OK);
  CHECK_EQ_INT(st[FM_STAT_HITS], 0);
  CHECK_EQ_INT(st[FM_STAT_BAD_REQUESTS], 0);
  CHECK_EQ_INT(st[FM_STAT_MISSES], 1);
  fm_store_close(s);

  CHECK(strcmp(fm_stat_name(FM_STAT_HITS), "hits") == 0);
  CHECK(strcmp(fm_stat_name(FM_STAT_CORRUPT), "corrupt_entries") == 0);
  CHECK(strcmp(fm_stat_name(FM_STAT_BAD_REQUESTS), "bad_requests") == 0);
  CHECK(strcmp(fm_stat_name((fm_stat)99), "unknown") == 0);
  CHECK(strcmp(fm_kstate_name(FM_STATE_UNTUNED), "untuned") == 0);
  CHECK(strcmp(fm_kstate_name(FM_STATE_TUNED), "tuned") == 0);
  CHECK(strcmp(fm_kstate_name(FM_STATE_BAD), "bad") == 0);
}

static void test_bad_arguments(void) {
  fm_store *s = open_new("args.db", 0);
  fm_entry e;
  fm_diag d;
  tc_entry(&e, 50, 0, 10);
  e.device[0] = '\0';
  CHECK_EQ_INT(fm_store_put(s, &e), FM_EINVAL);
  fm_store_last_error(s, &d);
  CHECK_STR_CONTAINS(d.text, "device");
  snprintf(e.device, sizeof e.device, "%s", TC_DEVICE);
  e.state = (fm_kstate)7;
  CHECK_EQ_INT(fm_store_put(s, &e), FM_EINVAL);
  e.state = FM_STATE_TUNED;
  uint8_t *cubin = e.cubin;
  e.cubin = NULL;
  CHECK_EQ_INT(fm_store_put(s, &e), FM_EINVAL);
  e.cubin = cubin;
  CHECK_EQ_INT(fm_store_put(s, NULL), FM_EINVAL);
  CHECK_EQ_INT(fm_store_put(s, &e), FM_OK);
  uint64_t n = 0;
  CHECK_EQ_INT(fm_store_usage(s, &n, NULL), FM_OK);
  CHECK_EQ_INT(n, 1);
  fm_entry_free(&e);
  fm_store_close(s);

  fm_store *t = (fm_store *)&d;
  CHECK_EQ_INT(fm_store_open(NULL, 0, &t, &d), FM_EINVAL);
  CHECK(t == NULL);
  char path[600];
  snprintf(path, sizeof path, "%s/no/such/dir/k.db", g_dir);
  CHECK_EQ_INT(fm_store_open(path, 0, &t, &d), FM_ESTORE);
  CHECK_STR_CONTAINS(d.text, "directory does not exist");
  CHECK(t == NULL);
}

int main(void) {
  tc_mkdtemp(g_dir, sizeof g_dir);
  RUN(test_round_trip);
  RUN(test_miss);
  RUN(test_replace);
  RUN(test_touch);
  RUN(test_list);
  RUN(test_find_prefix);
  RUN(test_evict);
  RUN(test_lru);
  RUN(test_stats_persist);
  RUN(test_bad_arguments);
  tc_rmtree(g_dir);
  return FM_TEST_DONE();
}
