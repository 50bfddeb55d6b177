/* fm_remote.c: the remote tier over hiredis (blocking context, timeouts, reconnects). */
#include "fm_remote.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <hiredis/hiredis.h>

#include "fm_log.h"

struct fm_remote {
  pthread_mutex_t mu;
  fm_redis_url u;
  redisContext *ctx;    /* NULL while disconnected */
  int state;            /* -1 unknown (never tried), 0 down, 1 up */
  uint64_t retry_at_ms; /* no connect attempt before this */
  fm_remote_stats st;
};

static uint64_t now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

int fm_remote_new(const char *url, fm_remote **out, fm_diag *d) {
  fm_remote *r = calloc(1, sizeof *r);
  if (!r) return fm_diag_set(d, FM_ENOMEM, "out of memory");
  int err = fm_remote_parse_url(url, &r->u, d);
  /* hiredis_ssl is not linked: TLS would need it and its own tests (docs/REMOTE.md). */
  if (!err && r->u.tls)
    err = fm_diag_set(d, FM_EUNSUPPORTED,
                      "remote %s: TLS (rediss://) is not supported by this fusemld (built "
                      "without hiredis_ssl); use redis:// on a private network, or a TLS tunnel",
                      r->u.shown);
  if (err) {
    explicit_bzero(&r->u, sizeof r->u);
    free(r);
    return err;
  }
  pthread_mutex_init(&r->mu, NULL);
  r->state = -1;
  *out = r;
  return FM_OK;
}

void fm_remote_free(fm_remote *r) {
  if (!r) return;
  if (r->ctx) redisFree(r->ctx);
  pthread_mutex_destroy(&r->mu);
  explicit_bzero(&r->u, sizeof r->u);
  free(r);
}

const char *fm_remote_url(const fm_remote *r) { return r->u.shown; }

const char *fm_remote_host(const fm_remote *r) { return r->u.host; }

/* Under mu. One log line per change of state. */
static void went_down(fm_remote *r, const char *why) {
  if (r->ctx) {
    redisFree(r->ctx);
    r->ctx = NULL;
  }
  r->retry_at_ms = now_us() / 1000 + FM_REMOTE_RETRY_MS;
  if (r->state != 0) {
    fm_log_warn("remote %s unreachable (%s); serving from the local store, retrying every %d ms%s", r->u.shown, why,
                FM_REMOTE_RETRY_MS, fm_remote_net_denied(why) ? "; " FM_REMOTE_NET_HINT : "");
    r->st.outages++;
  }
  r->state = 0;
  r->st.up = 0;
}

static void went_up(fm_remote *r) {
  if (r->state != 1) fm_log_info("remote %s reachable", r->u.shown);
  r->state = 1;
  r->st.up = 1;
}

/* Whether a setup command's reply is +OK; why otherwise. */
static int ok_reply(redisContext *c, redisReply *rep, const char *what, char *why, size_t cap) {
  int ok = rep && rep->type == REDIS_REPLY_STATUS;
  if (!ok)
    snprintf(why, cap, "%s failed: %s", what,
             rep && rep->type == REDIS_REPLY_ERROR ? rep->str
             : c->err                              ? c->errstr
                                                   : "unexpected reply");
  if (rep) freeReplyObject(rep);
  return ok;
}

/* Under mu, on a fresh connection: AUTH when the URL has a password (with its user name for
 * a Redis 6 ACL user), then SELECT. Each argument travels as its own bulk string, so a
 * password is never parsed as part of a command line; Redis's error replies never quote it. */
static int prepared(fm_remote *r, redisContext *c, char *why, size_t cap) {
  if (r->u.user[0] && !ok_reply(c, redisCommand(c, "AUTH %s %s", r->u.user, r->u.password), "AUTH", why, cap)) return 0;
  if (!r->u.user[0] && r->u.password[0] && !ok_reply(c, redisCommand(c, "AUTH %s", r->u.password), "AUTH", why, cap))
    return 0;
  return r->u.db == 0 || ok_reply(c, redisCommand(c, "SELECT %d", r->u.db), "SELECT", why, cap);
}

/* Under mu: a usable context, or NULL (down, or too soon to retry). */
static redisContext *connected(fm_remote *r) {
  if (r->ctx) return r->ctx;
  if (r->state == 0 && now_us() / 1000 < r->retry_at_ms) return NULL;
  struct timeval ct = {0, FM_REMOTE_CONNECT_MS * 1000}, io = {0, FM_REMOTE_IO_MS * 1000};
  redisContext *c = redisConnectWithTimeout(r->u.host, r->u.port, ct);
  char why[200];
  if (!c || c->err) {
    snprintf(why, sizeof why, "%s", c ? c->errstr : "out of memory");
    if (c) redisFree(c);
    went_down(r, why);
    return NULL;
  }
  redisSetTimeout(c, io);
  r->ctx = c;
  if (!prepared(r, c, why, sizeof why)) {
    went_down(r, why);
    return NULL;
  }
  return r->ctx;
}

/* Under mu: a failed command: the connection is dropped (a timed-out reply may still come
 * and would answer the next command). */
static void failed(fm_remote *r, redisReply *rep) {
  char why[160];
  if (rep && rep->type == REDIS_REPLY_ERROR)
    snprintf(why, sizeof why, "%.*s", (int)rep->len, rep->str);
  else
    snprintf(why, sizeof why, "%s", r->ctx && r->ctx->err ? r->ctx->errstr : "unexpected reply");
  if (rep) freeReplyObject(rep);
  went_down(r, why);
}

/* Under mu: sends a command; NULL (state down, logged) on an I/O failure. A connection that
 * was idle may have been closed by a Redis restart: one failure on it is retried at once on a
 * fresh connection before the tier is declared down. */
static redisReply *run(fm_remote *r, const char *fmt, ...) {
  for (int attempt = 0; attempt < 2; attempt++) {
    int reused = r->ctx != NULL;
    redisContext *c = connected(r);
    if (!c) return NULL;
    va_list ap;
    va_start(ap, fmt);
    redisReply *rep = redisvCommand(c, fmt, ap);
    va_end(ap);
    if (rep) return rep;
    if (!reused || attempt == 1) break;
    redisFree(r->ctx);
    r->ctx = NULL;
  }
  failed(r, NULL);
  return NULL;
}

int fm_remote_get(fm_remote *r, const char *rkey, uint8_t **val, size_t *len) {
  int err = FM_EIO;
  uint64_t t0 = now_us();
  pthread_mutex_lock(&r->mu);
  redisReply *rep = run(r, "GET %s", rkey);
  if (!rep) goto out;
  if (rep->type != REDIS_REPLY_STRING && rep->type != REDIS_REPLY_NIL) {
    failed(r, rep);
    goto out;
  }
  went_up(r);
  if (rep->type == REDIS_REPLY_NIL) {
    err = FM_ENOT_FOUND;
  } else if ((*val = malloc(rep->len ? rep->len : 1))) {
    memcpy(*val, rep->str, rep->len);
    *len = rep->len;
    err = FM_OK;
  } else {
    err = FM_ENOMEM;
  }
  freeReplyObject(rep);
  uint64_t us = now_us() - t0;
  r->st.lookups++;
  r->st.lookup_us_total += us;
  if (us > r->st.lookup_us_max) r->st.lookup_us_max = us;
out:
  if (err == FM_OK)
    r->st.hits++;
  else if (err == FM_ENOT_FOUND)
    r->st.misses++;
  else
    r->st.errors++;
  pthread_mutex_unlock(&r->mu);
  return err;
}

int fm_remote_put(fm_remote *r, const char *rkey, const uint8_t *val, size_t len) {
  int err = FM_EIO;
  pthread_mutex_lock(&r->mu);
  redisReply *rep = run(r, "SET %s %b", rkey, (const char *)val, len);
  if (!rep) goto out;
  if (rep->type != REDIS_REPLY_STATUS) {
    failed(r, rep);
    goto out;
  }
  freeReplyObject(rep);
  went_up(r);
  err = FM_OK;
out:
  if (err)
    r->st.publish_errors++;
  else
    r->st.published++;
  pthread_mutex_unlock(&r->mu);
  return err;
}

void fm_remote_count_refused(fm_remote *r) {
  pthread_mutex_lock(&r->mu);
  r->st.refused++;
  pthread_mutex_unlock(&r->mu);
}

void fm_remote_get_stats(fm_remote *r, fm_remote_stats *out) {
  pthread_mutex_lock(&r->mu);
  *out = r->st;
  pthread_mutex_unlock(&r->mu);
}
