/* fm_inflight.h: compiles in progress, by key, each with the requests waiting on it.
 *
 * The first compile request for a key starts a flight and waits on it; any later request for
 * the same key while it runs joins it (origin "joined") instead of starting another NVRTC run.
 * When the job ends the flight is taken out of the table (fm_inflight_finish) and every waiter
 * is answered. Loop thread only. The table does not touch connections: the caller keeps a
 * reference on a waiter's connection (fm_conn_ref) so the answer to a peer that hung up is
 * dropped rather than written into freed memory.
 *
 * The table also counts each connection's waiting requests (the per-client limit), and
 * finds flights nobody waits for any more (every waiter's peer hung up) so their work can be
 * cancelled. */
#ifndef FM_INFLIGHT_H
#define FM_INFLIGHT_H

#include <stddef.h>
#include <stdint.h>

#include "fm_error.h"
#include "fm_fingerprint.h"

struct fm_conn;

typedef struct fm_waiter {
  struct fm_waiter *next;
  struct fm_conn *conn; /* referenced by the caller */
  uint64_t id;          /* request id to answer */
  int joined;           /* 0: the request that started the job */
} fm_waiter;

typedef struct fm_flight {
  struct fm_flight *next; /* hash chain */
  fm_key key;
  fm_waiter *waiters, **tail;
  uint32_t n_waiters;
  void *job;                 /* the caller's job (fm_compile_job) */
  void (*cancel)(void *job); /* stops job once nobody waits for it; NULL: not cancellable */
} fm_flight;

typedef struct fm_inflight fm_inflight;

int fm_inflight_new(fm_inflight **out);
/* Frees the table; flights still in it (shutdown past the deadline) are freed with their waiters. */
void fm_inflight_free(fm_inflight *t);

fm_flight *fm_inflight_find(fm_inflight *t, const fm_key *key);
/* Adds a new, empty flight for key (which must not be in flight). FM_ENOMEM. */
int fm_inflight_start(fm_inflight *t, const fm_key *key, void *job, fm_flight **out);
/* Appends a waiter (counted for conn). FM_ENOMEM. */
int fm_inflight_join(fm_inflight *t, fm_flight *f, struct fm_conn *conn, uint64_t id, int joined);
/* Takes f out of the table, frees it and returns its waiters in arrival order (the caller
 * answers each and frees it with free()); they no longer count for their connections. */
fm_waiter *fm_inflight_finish(fm_inflight *t, fm_flight *f);

size_t fm_inflight_count(const fm_inflight *t);

/* Requests conn has waiting in flights: the per-client limit. */
uint32_t fm_inflight_waiting(const fm_inflight *t, const struct fm_conn *conn);

/* Calls abandon(f, ctx) for every cancellable flight (f->cancel set) none of whose waiters'
 * connections is open any more (is_open); abandon may finish f. */
void fm_inflight_sweep(fm_inflight *t, int (*is_open)(const struct fm_conn *), void (*abandon)(fm_flight *f, void *ctx),
                       void *ctx);

#endif
