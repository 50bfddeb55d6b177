/* fm_inflight.c: a chained hash table of flights keyed by the (already uniform) SHA-256 key. */
#include "fm_inflight.h"

#include <stdlib.h>
#include <string.h>

#define FM_INFLIGHT_BUCKETS 256u   /* power of two; flights are few (bounded by clients) */

struct fm_inflight {
  fm_flight *buckets[FM_INFLIGHT_BUCKETS];
  size_t count;
};

static fm_flight **bucket_of(fm_inflight *t, const fm_key *key) {
  /* The key is a hash already: its first byte spreads uniformly. */
  return &t->buckets[key->bytes[0] & (FM_INFLIGHT_BUCKETS - 1)];
}

int fm_inflight_new(fm_inflight **out) {
  *out = calloc(1, sizeof **out);
  return *out ? FM_OK : FM_ENOMEM;
}

static void free_waiters(fm_waiter *w) {
  while (w) {
    fm_waiter *next = w->next;
    free(w);
    w = next;
  }
}

void fm_inflight_free(fm_inflight *t) {
  if (!t) return;
  for (size_t i = 0; i < FM_INFLIGHT_BUCKETS; i++) {
    fm_flight *f = t->buckets[i];
    while (f) {
      fm_flight *next = f->next;
      free_waiters(f->waiters);
      free(f);
      f = next;
    }
  }
  free(t);
}

fm_flight *fm_inflight_find(fm_inflight *t, const fm_key *key) {
  for (fm_flight *f = *bucket_of(t, key); f; f = f->next)
    if (memcmp(f->key.bytes, key->bytes, FM_KEY_BYTES) == 0) return f;
  return NULL;
}

int fm_inflight_start(fm_inflight *t, const fm_key *key, void *job, fm_flight **out) {
  fm_flight *f = calloc(1, sizeof *f);
  if (!f) return FM_ENOMEM;
  f->key = *key;
  f->tail = &f->waiters;
  f->job = job;
  fm_flight **b = bucket_of(t, key);
  f->next = *b;
  *b = f;
  t->count++;
  *out = f;
  return FM_OK;
}

int fm_inflight_join(fm_flight *f, struct fm_conn *conn, uint64_t id, int joined) {
  fm_waiter *w = calloc(1, sizeof *w);
  if (!w) return FM_ENOMEM;
  w->conn = conn;
  w->id = id;
  w->joined = joined;
  *f->tail = w;
  f->tail = &w->next;
  f->n_waiters++;
  return FM_OK;
}

fm_waiter *fm_inflight_finish(fm_inflight *t, fm_flight *f) {
  for (fm_flight **pp = bucket_of(t, &f->key); *pp; pp = &(*pp)->next) {
    if (*pp == f) {
      *pp = f->next;
      t->count--;
      break;
    }
  }
  fm_waiter *w = f->waiters;
  free(f);
  return w;
}

size_t fm_inflight_count(const fm_inflight *t) {
  return t->count;
}
