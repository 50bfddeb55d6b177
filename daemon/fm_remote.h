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
#define FM_REMOTE_IO_MS      300
#define FM_REMOTE_RETRY_MS   1000
#define FM_REMOTE_URL_MAX    512

typedef struct fm_remote fm_remote;

/* What the stats reply shows; counters since start. */
typedef struct fm_remote_stats {
  int up;                        /* last known state */
  uint64_t hits, misses, errors; /* lookups: found, absent, failed (down, timeout, protocol) */
  uint64_t refused;              /* found but failed verification (counted by the caller) */
  uint64_t published, publish_errors;
  uint64_t outages;                                 /* transitions to unreachable */
  uint64_t lookup_us_total, lookup_us_max, lookups; /* latency of answered lookups */
} fm_remote_stats;

/* A parsed redis[s]://[[user]:password@]host[:port][/db] (docs/REMOTE.md). */
typedef struct fm_redis_url {
  int tls;                       /* rediss:// */
  char host[256];                /* a name, an IPv4 address, or an IPv6 one without brackets */
  int port, db;                  /* 6379 and 0 when left out */
  char user[128];                /* "": AUTH with the password alone (Redis's default user) */
  char password[256];            /* "": no AUTH; percent-decoded */
  char shown[FM_REMOTE_URL_MAX]; /* the URL with its password as "***": what logs and stats show */
} fm_redis_url;

/* Parses url into *u; FM_EINVAL with the reason otherwise. The password never appears in a
 * reason (they quote u->shown, filled before anything is checked). */
int fm_remote_parse_url(const char *url, fm_redis_url *u, fm_diag *d);

/* Does not connect (the first call does): a Redis down at startup is not a startup error. */
int fm_remote_new(const char *url, fm_remote **out, fm_diag *d);
void fm_remote_free(fm_remote *r);
/* The URL as logs and stats show it: its password replaced by "***". */
const char *fm_remote_url(const fm_remote *r);

/* The host the URL names (for fm_remote_check_network). */
const char *fm_remote_host(const fm_remote *r);

/* What to do when the sandbox keeps the daemon off the network (systemd/fusemld-remote.conf). */
#define FM_REMOTE_NET_HINT                                                                              \
  "if fusemld runs under systemd/fusemld.service, whose sandbox allows Unix sockets only, install the " \
  "drop-in fusemld-remote.conf (docs/REMOTE.md, \"systemd\")"

/* Asked once at startup, without connecting: whether this process can reach host at all. A
 * socket of its address family must open (RestrictAddressFamilies=AF_UNIX makes socket()
 * fail with EAFNOSUPPORT), and for a host other than loopback some interface other than
 * loopback must be up with an address (PrivateNetwork=yes leaves none). FM_EDENIED with why
 * and FM_REMOTE_NET_HINT otherwise. */
int fm_remote_check_network(const char *host, fm_diag *d);
/* Whether a connection error's text is one a sandbox gives (EPERM, EACCES, EAFNOSUPPORT,
 * ENETUNREACH: IPAddressDeny= fails connect() with EPERM), so the log adds the hint. */
int fm_remote_net_denied(const char *why);

/* GET rkey: FM_OK with a malloc'd value, FM_ENOT_FOUND, or FM_EIO (unreachable, timeout). */
int fm_remote_get(fm_remote *r, const char *rkey, uint8_t **val, size_t *len);
/* SET rkey value: FM_OK or FM_EIO. */
int fm_remote_put(fm_remote *r, const char *rkey, const uint8_t *val, size_t len);

/* Counts a found value that failed verification. */
void fm_remote_count_refused(fm_remote *r);
void fm_remote_get_stats(fm_remote *r, fm_remote_stats *out);

#endif
