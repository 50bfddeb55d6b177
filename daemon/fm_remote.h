/* fm_remote.h: the remote tier: a Redis shared by the nodes of a cluster (docs/REMOTE.md).
 *
 * Blocking calls with short timeouts, made from libuv worker threads (never the loop thread);
 * one connection, serialized by a mutex. When Redis is unreachable the calls fail at once
 * (FM_EIO) until the next reconnect attempt, at most one per FM_REMOTE_RETRY_MS, so an outage
 * costs the daemon nothing but the local tier. Each change of state (reachable, unreachable)
 * is logged once. Built without hiredis, fm_remote_new says the tier is unavailable. */
#ifndef FM_REMOTE_H
#define FM_REMOTE_H

#include <stddef.h>
#include <stdint.h>

#include "fm_error.h"

#define FM_REMOTE_CONNECT_MS 200
#define FM_REMOTE_IO_MS 300
#define FM_REMOTE_RETRY_MS 1000
#define FM_REMOTE_URL_MAX 512

typedef struct fm_remote fm_remote;

/* What the stats reply shows; counters since start. */
typedef struct fm_remote_stats {
  int up;                        /* last known state */
  uint64_t hits, misses, errors; /* lookups: found, absent, failed (down, timeout, protocol) */
  uint64_t refused;              /* found but failed verification (counted by the caller) */
  uint64_t published, publish_errors;
  uint64_t outages;              /* transitions to unreachable */
  uint64_t lookup_us_total, lookup_us_max, lookups;   /* latency of answered lookups */
} fm_remote_stats;

/* Parses redis://host[:port][/db] (port 6379, db 0 by default). FM_EINVAL with the reason. */
int fm_remote_parse_url(const char *url, char *host, size_t host_cap, int *port, int *db, fm_diag *d);

/* Does not connect (the first call does): a Redis down at startup is not a startup error. */
int fm_remote_new(const char *url, fm_remote **out, fm_diag *d);
void fm_remote_free(fm_remote *r);
const char *fm_remote_url(const fm_remote *r);

/* GET rkey: FM_OK with a malloc'd value, FM_ENOT_FOUND, or FM_EIO (unreachable, timeout). */
int fm_remote_get(fm_remote *r, const char *rkey, uint8_t **val, size_t *len);
/* SET rkey value: FM_OK or FM_EIO. */
int fm_remote_put(fm_remote *r, const char *rkey, const uint8_t *val, size_t len);

/* Counts a found value that failed verification. */
void fm_remote_count_refused(fm_remote *r);
void fm_remote_get_stats(fm_remote *r, fm_remote_stats *out);

#endif
