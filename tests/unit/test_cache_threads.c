/* test_cache_threads.c: one store shared by 4 threads doing puts, gets (with touch), lists
 * and statistics at once: every read is a whole, checksummed entry that some thread wrote,
 * counters add up exactly, and under a size cap the evictions keep the total within it. */
#include "test_cache_util.h"

#include <pthread.h>

#include "fm_test.h"

#define THREADS     4
#define ROUNDS      150
#define SHARED_SEED 9999u

typedef struct {
  fm_store *s;
  unsigned id;
  int capped;   /* entries may be evicted by other threads' puts */
  int failures; /* results no interleaving can explain */
} worker;

/* The shared key is written by every thread with its own version (= thread id), so a get
 * must return one thread's complete version, never a mix. */
static int matches_some_version(const fm_entry *got) {
  for (unsigned v = 0; v < THREADS; v++) {
    fm_entry want;
    tc_entry(&want, SHARED_SEED, v, 512 + v);
    int same = tc_same_content(&want, got);
    fm_entry_free(&want);
    if (same) return 1;
  }
  return 0;
}

static int count_entry(const fm_entry *e, void *p) {
  (void)e;
  (*(int *)p)++;
  return 0;
}

static void *work(void *p) {
  worker *w = p;
  for (unsigned i = 0; i < ROUNDS; i++) {
    unsigned seed = w->id * 1000 + i % 25;
    fm_entry e, got;
    tc_entry(&e, seed, i % 3, 700 + (i * 37) % 900);
    if (fm_store_put(w->s, &e) != FM_OK) w->failures++;
    int err = fm_store_get(w->s, &e.key, TC_DEVICE, 1, &got);
    /* Only this thread writes this key, so it reads back what it just put (or, capped,
     * finds it evicted by a neighbour's put). */
    if (err == FM_OK ? !tc_same_content(&e, &got) : !(w->capped && err == FM_ENOT_FOUND)) w->failures++;
    fm_entry_free(&got);
    fm_entry_free(&e);

    tc_entry(&e, SHARED_SEED, w->id, 512 + w->id);
    if (fm_store_put(w->s, &e) != FM_OK) w->failures++;
    err = fm_store_get(w->s, &e.key, TC_DEVICE, i % 2, &got);
    if (err == FM_OK ? !matches_some_version(&got) : !(w->capped && err == FM_ENOT_FOUND)) w->failures++;
    fm_entry_free(&got);
    fm_entry_free(&e);

    if (fm_store_stat_add(w->s, FM_STAT_REQUESTS, 1) != FM_OK) w->failures++;
    if (i % 25 == 0) {
      int n = 0;
      if (fm_store_list(w->s, 10, count_entry, &n) != FM_OK || n == 0 || n > 10) w->failures++;
    }
  }
  return NULL;
}

static void run_workers(fm_store *s, int capped) {
  pthread_t t[THREADS];
  worker w[THREADS];
  for (unsigned i = 0; i < THREADS; i++) {
    w[i] = (worker){s, i, capped, 0};
    CHECK_EQ_INT(pthread_create(&t[i], NULL, work, &w[i]), 0);
  }
  for (unsigned i = 0; i < THREADS; i++) {
    pthread_join(t[i], NULL);
    CHECK_EQ_INT(w[i].failures, 0);
  }
}

static char g_dir[512];

static void test_concurrent_uncapped(void) {
  char path[600];
  fm_diag d;
  fm_store *s = NULL;
  snprintf(path, sizeof path, "%s/threads.db", g_dir);
  CHECK_EQ_INT(fm_store_open(path, 0, &s, &d), FM_OK);
  if (!s) return;
  run_workers(s, 0);
  uint64_t n = 0;
  CHECK_EQ_INT(fm_store_usage(s, &n, NULL), FM_OK);
  CHECK_EQ_INT(n, THREADS * 25 + 1);
  int64_t st[FM_STAT__COUNT];
  CHECK_EQ_INT(fm_store_stats(s, st), FM_OK);
  CHECK_EQ_INT(st[FM_STAT_REQUESTS], THREADS * ROUNDS);
  CHECK_EQ_INT(st[FM_STAT_EVICTIONS], 0);
  CHECK_EQ_INT(st[FM_STAT_CORRUPT], 0);
  fm_store_close(s);
}

static void test_concurrent_capped(void) {
  char path[600];
  fm_diag d;
  fm_store *s = NULL;
  const uint64_t cap = 20 * 1000;
  snprintf(path, sizeof path, "%s/threads-capped.db", g_dir);
  CHECK_EQ_INT(fm_store_open(path, cap, &s, &d), FM_OK);
  if (!s) return;
  run_workers(s, 1);
  uint64_t n = 0, bytes = 0;
  CHECK_EQ_INT(fm_store_usage(s, &n, &bytes), FM_OK);
  CHECK(bytes <= cap);
  CHECK(n > 0);
  int64_t st[FM_STAT__COUNT];
  CHECK_EQ_INT(fm_store_stats(s, st), FM_OK);
  CHECK(st[FM_STAT_EVICTIONS] > 0);
  CHECK_EQ_INT(st[FM_STAT_CORRUPT], 0);
  fm_store_close(s);
}

int main(void) {
  tc_mkdtemp(g_dir, sizeof g_dir);
  RUN(test_concurrent_uncapped);
  RUN(test_concurrent_capped);
  tc_rmtree(g_dir);
  return FM_TEST_DONE();
}
