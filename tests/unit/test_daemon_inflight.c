/* test_daemon_inflight.c: the in-flight table: join order, colliding buckets, finish, the
 * per-connection counts and the sweep for abandoned flights. */
#include <stdlib.h>
#include <string.h>

#include "fm_inflight.h"
#include "fm_test.h"

static fm_key key_of(uint8_t first, uint8_t last) {
  fm_key k;
  memset(&k, 0x5a, sizeof k);
  k.bytes[0] = first;
  k.bytes[FM_KEY_BYTES - 1] = last;
  return k;
}

static void test_join_and_finish(void) {
  fm_inflight *t = NULL;
  CHECK_EQ_INT(fm_inflight_new(&t), FM_OK);
  fm_key a = key_of(7, 1), b = key_of(7, 2); /* same bucket */
  struct fm_conn *c1 = (struct fm_conn *)0x1000, *c2 = (struct fm_conn *)0x2000;
  int job_a, job_b;
  fm_flight *fa = NULL, *fb = NULL;
  CHECK(fm_inflight_find(t, &a) == NULL);
  CHECK_EQ_INT(fm_inflight_start(t, &a, &job_a, &fa), FM_OK);
  CHECK_EQ_INT(fm_inflight_start(t, &b, &job_b, &fb), FM_OK);
  CHECK_EQ_INT(fm_inflight_count(t), 2);
  CHECK(fm_inflight_find(t, &a) == fa && fa->job == &job_a);
  CHECK(fm_inflight_find(t, &b) == fb && fb->job == &job_b);
  CHECK_EQ_INT(fm_inflight_join(t, fa, c1, 10, 0), FM_OK);
  CHECK_EQ_INT(fm_inflight_join(t, fa, c2, 11, 1), FM_OK);
  CHECK_EQ_INT(fm_inflight_join(t, fa, c1, 12, 1), FM_OK);
  CHECK_EQ_INT(fa->n_waiters, 3);
  CHECK_EQ_INT(fm_inflight_waiting(t, c1), 2);
  CHECK_EQ_INT(fm_inflight_waiting(t, c2), 1);
  fm_waiter *w = fm_inflight_finish(t, fa);
  CHECK_EQ_INT(fm_inflight_waiting(t, c1), 0);
  CHECK_EQ_INT(fm_inflight_waiting(t, c2), 0);
  CHECK_EQ_INT(fm_inflight_count(t), 1);
  CHECK(fm_inflight_find(t, &a) == NULL);
  CHECK(fm_inflight_find(t, &b) == fb);
  /* Answered in arrival order; only the first started the job. */
  uint64_t ids[3] = {0};
  int joined[3] = {0}, n = 0;
  while (w) {
    fm_waiter *next = w->next;
    if (n < 3) {
      ids[n] = w->id;
      joined[n] = w->joined;
    }
    n++;
    free(w);
    w = next;
  }
  CHECK_EQ_INT(n, 3);
  CHECK(ids[0] == 10 && ids[1] == 11 && ids[2] == 12);
  CHECK(!joined[0] && joined[1] && joined[2]);
  /* A flight left in the table (shutdown past the deadline) is freed with it. */
  CHECK_EQ_INT(fm_inflight_join(t, fb, c2, 13, 0), FM_OK);
  fm_inflight_free(t);
}

/* The sweep: c1 and c3 hung up, c2 did not. */
static const struct fm_conn *open_conn;
static int is_open(const struct fm_conn *c) { return c == open_conn; }
static void abandon(fm_flight *f, void *ctx) {
  fm_inflight *t = ctx;
  fm_waiter *w = fm_inflight_finish(t, f);
  while (w) {
    fm_waiter *next = w->next;
    free(w);
    w = next;
  }
}
static void cancel_stub(void *job) { (void)job; }

static void test_sweep_finds_abandoned_flights(void) {
  fm_inflight *t = NULL;
  CHECK_EQ_INT(fm_inflight_new(&t), FM_OK);
  struct fm_conn *c1 = (struct fm_conn *)0x1000, *c2 = (struct fm_conn *)0x2000, *c3 = (struct fm_conn *)0x3000;
  open_conn = c2;
  fm_key k[4];
  fm_flight *f[4];
  int job;
  for (int i = 0; i < 4; i++) {
    k[i] = key_of(9, (uint8_t)i); /* one bucket: abandon unlinks from the chain being walked */
    CHECK_EQ_INT(fm_inflight_start(t, &k[i], &job, &f[i]), FM_OK);
    f[i]->cancel = cancel_stub;
  }
  CHECK_EQ_INT(fm_inflight_join(t, f[0], c1, 1, 0), FM_OK); /* abandoned */
  CHECK_EQ_INT(fm_inflight_join(t, f[1], c1, 2, 0), FM_OK); /* c2 still waits */
  CHECK_EQ_INT(fm_inflight_join(t, f[1], c2, 3, 1), FM_OK);
  CHECK_EQ_INT(fm_inflight_join(t, f[2], c3, 4, 0), FM_OK); /* abandoned */
  CHECK_EQ_INT(fm_inflight_join(t, f[2], c1, 5, 1), FM_OK);
  CHECK_EQ_INT(fm_inflight_join(t, f[3], c3, 6, 0), FM_OK); /* abandoned, not cancellable */
  f[3]->cancel = NULL;
  fm_inflight_sweep(t, is_open, abandon, t);
  CHECK_EQ_INT(fm_inflight_count(t), 2);
  CHECK(fm_inflight_find(t, &k[0]) == NULL && fm_inflight_find(t, &k[2]) == NULL);
  CHECK(fm_inflight_find(t, &k[1]) == f[1] && fm_inflight_find(t, &k[3]) == f[3]);
  CHECK_EQ_INT(fm_inflight_waiting(t, c1), 1);
  CHECK_EQ_INT(fm_inflight_waiting(t, c2), 1);
  CHECK_EQ_INT(fm_inflight_waiting(t, c3), 1);
  fm_inflight_free(t);
}

int main(void) {
  RUN(test_join_and_finish);
  RUN(test_sweep_finds_abandoned_flights);
  return FM_TEST_DONE();
}
