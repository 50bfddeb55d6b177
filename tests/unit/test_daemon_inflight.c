/* test_daemon_inflight.c: the in-flight table: join order, colliding buckets, finish. */
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
  fm_key a = key_of(7, 1), b = key_of(7, 2);   /* same bucket */
  struct fm_conn *c1 = (struct fm_conn *)0x1000, *c2 = (struct fm_conn *)0x2000;
  int job_a, job_b;
  fm_flight *fa = NULL, *fb = NULL;
  CHECK(fm_inflight_find(t, &a) == NULL);
  CHECK_EQ_INT(fm_inflight_start(t, &a, &job_a, &fa), FM_OK);
  CHECK_EQ_INT(fm_inflight_start(t, &b, &job_b, &fb), FM_OK);
  CHECK_EQ_INT(fm_inflight_count(t), 2);
  CHECK(fm_inflight_find(t, &a) == fa && fa->job == &job_a);
  CHECK(fm_inflight_find(t, &b) == fb && fb->job == &job_b);
  CHECK_EQ_INT(fm_inflight_join(fa, c1, 10, 0), FM_OK);
  CHECK_EQ_INT(fm_inflight_join(fa, c2, 11, 1), FM_OK);
  CHECK_EQ_INT(fm_inflight_join(fa, c1, 12, 1), FM_OK);
  CHECK_EQ_INT(fa->n_waiters, 3);
  fm_waiter *w = fm_inflight_finish(t, fa);
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
  CHECK_EQ_INT(fm_inflight_join(fb, c2, 13, 0), FM_OK);
  fm_inflight_free(t);
}

int main(void) {
  RUN(test_join_and_finish);
  return FM_TEST_DONE();
}
