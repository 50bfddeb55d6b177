/* fm_inflight.c: a chained hash table of flights keyed by the (already uniform) SHA-256 key. */
#include "fm_inflight.h"

#include <stdlib.h>
#include <string.h>

#define FM_INFLIGHT_BUCKETS 256u /* power of two; flights are few (bounded by clients) */

/* A connection's count of waiting requests. */
typedef struct conn_count {
  struct conn_count *next;
  const struct fm_conn *conn;
  uint32_t n;
} conn_count;

struct fm_inflight {
  fm_flight *buckets[FM_INFLIGHT_BUCKETS];
  size_t count;
  conn_count *conns[FM_INFLIGHT_BUCKETS];
};

static conn_count **conn_bucket(const fm_inflight *t, const struct fm_conn *conn) {
  /* Heap pointers: the low bits are alignment, the next ones spread. */
  uintptr_t h = (uintptr_t)conn >> 4;
  return (conn_count **)&t->conns[(h ^ (h >> 8)) & (FM_INFLIGHT_BUCKETS - 1)];
}

static conn_count *find_conn(const fm_inflight *t, const struct fm_conn *conn) {
  for (conn_count *c = *conn_bucket(t, conn); c; c = c->next)
    if (c->conn == conn) return c;
  return NULL;
}

/* One fewer request waiting for conn; its entry goes with its last one. */
static void conn_release(fm_inflight *t, const struct fm_conn *conn) {
  for (conn_count **pp = conn_bucket(t, conn); *pp; pp = &(*pp)->next) {
    if ((*pp)->conn != conn) continue;
    conn_count *c = *pp;
    if (--c->n == 0) {
      *pp = c->next;
      free(c);
    }
    return;
  }
}

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
    conn_count *c = t->conns[i];
    while (c) {
      conn_count *next = c->next;
      free(c);
      c = next;
    }
  }
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

int fm_inflight_join(fm_inflight *t, fm_flight *f, struct fm_conn *conn, uint64_t id, int joined) {
  fm_waiter *w = calloc(1, sizeof *w);
  conn_count *c = find_conn(t, conn);
  if (w && !c && (c = calloc(1, sizeof *c))) {
    conn_count **b = conn_bucket(t, conn);
    c->conn = conn;
    c->next = *b;
    *b = c;
  }
  if (!w || !c) {
    free(w);
    return FM_ENOMEM;
  }
  c->n++;
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
  for (fm_waiter *x = w; x; x = x->next) conn_release(t, x->conn);
  free(f);
  return w;
}

size_t fm_inflight_count(const fm_inflight *t) { return t->count; }

uint32_t fm_inflight_waiting(const fm_inflight *t, const struct fm_conn *conn) {
  const conn_count *c = find_conn(t, conn);
  return c ? c->n : 0;
}

void fm_inflight_sweep(fm_inflight *t, int (*is_open)(const struct fm_conn *), void (*abandon)(fm_flight *f, void *ctx),
                       void *ctx) {
  for (size_t i = 0; i < FM_INFLIGHT_BUCKETS && t->count; i++) {
    fm_flight *f = t->buckets[i];
    while (f) {
      fm_flight *next = f->next; /* abandon may take f out */
      int waited_for = 0;
      for (const fm_waiter *w = f->waiters; w && !waited_for; w = w->next) waited_for = is_open(w->conn);
      if (f->cancel && !waited_for) abandon(f, ctx);
      f = next;
    }
  }
}
