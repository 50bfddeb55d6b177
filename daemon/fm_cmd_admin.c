/* fm_cmd_admin.c: stats, list, show, evict and shutdown (what fusectl shows and manages). */
#include <ctype.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "fm_bgtune.h"
#include "fm_commands.h"
#include "fm_log.h"
#include "fm_msg.h"
#include "fm_proto.h"
#include "fm_remote_tier.h"
#include "fm_reply.h"

#define FM_LIST_DEFAULT_LIMIT 10000u /* a reply stays far below a client's frame cap */

/* d = "what: <the store's reason>" for a failed store call; returns err. */
static int store_fail(fm_daemon *dd, int err, const char *what, fm_diag *d) {
  fm_diag why = {{0}};
  fm_store_last_error(dd->store, &why);
  return fm_diag_set(d, err, "%s: %s", what, why.text[0] ? why.text : fm_strerror(err));
}

static void pack_counters(msgpack_packer *pk, const int64_t v[FM_STAT__COUNT]) {
  uint32_t n = 0;
#define FM_COUNT_STAT_(num, name, str) n++;
  FM_STAT_MAP(FM_COUNT_STAT_)
#undef FM_COUNT_STAT_
  msgpack_pack_map(pk, n);
#define FM_PACK_STAT_(num, name, str) fm_pack_kv_i64(pk, str, v[FM_STAT_##name]);
  FM_STAT_MAP(FM_PACK_STAT_)
#undef FM_PACK_STAT_
}

int fm_cmd_stats(fm_request *rq, fm_diag *d) {
  fm_daemon *dd = rq->dd;
  int64_t persistent[FM_STAT__COUNT] = {0};
  uint64_t entries = 0, bytes = 0;
  int err;
  fm_daemon_save_stats(dd);
  /* Stats are most wanted when something is wrong: report what can be read. */
  if ((err = fm_store_stats(dd->store, persistent))) fm_log_warn("reading persistent statistics: %s", fm_strerror(err));
  if ((err = fm_store_usage(dd->store, &entries, &bytes))) fm_log_warn("reading store usage: %s", fm_strerror(err));

  fm_reply r;
  int remote = dd->remote && dd->remote->remote;
  fm_reply_begin(&r, rq->id, 18 + (remote ? 1 : 0));
  fm_pack_kv_cstr(&r.pk, "version", FM_VERSION_STRING);
  fm_pack_kv_u64(&r.pk, "pid", (uint64_t)getpid());
  fm_pack_kv_cstr(&r.pk, "db", dd->cfg->db_path);
  fm_pack_kv_u64(&r.pk, "cache_size", dd->cfg->cache_size);
  fm_pack_kv_u64(&r.pk, "jobs", dd->cfg->jobs);
  fm_pack_kv_cstr(&r.pk, "mode", fm_device_mode(&dd->dev));
  fm_pack_cstr(&r.pk, "device");
  fm_reply_pack_device(&r.pk, &dd->dev.id);
  fm_pack_kv_u64(&r.pk, "uptime_s", (uv_now(dd->loop) - dd->started_ms) / 1000);
  fm_pack_kv_u64(&r.pk, "clients", fm_server_clients(dd->server));
  fm_pack_kv_u64(&r.pk, "inflight", fm_inflight_count(dd->inflight));
  /* "off" where nothing tunes (no GPU and no worker), whatever was asked */
  fm_pack_kv_cstr(&r.pk, "tune", fm_tune_mode_name(dd->tuner ? dd->cfg->tune : FM_TUNE_OFF));
  fm_pack_kv_u64(&r.pk, "background_tunes", fm_bgtune_pending(dd->bgtune));
  fm_pack_kv_u64(&r.pk, "entries", entries);
  fm_pack_kv_u64(&r.pk, "bytes", bytes);
  fm_pack_cstr(&r.pk, "stats");
  pack_counters(&r.pk, persistent);
  fm_pack_cstr(&r.pk, "session");
  pack_counters(&r.pk, dd->session);
  fm_pack_cstr(&r.pk, "nvrtc");
  msgpack_pack_array(&r.pk, 2);
  msgpack_pack_uint32(&r.pk, dd->dev.nvrtc_major);
  msgpack_pack_uint32(&r.pk, dd->dev.nvrtc_minor);
  fm_pack_kv_u64(&r.pk, "cublaslt", dd->dev.cublaslt_version);
  if (remote) {
    fm_pack_cstr(&r.pk, "remote");
    fm_remote_tier_pack_stats(dd->remote, &r.pk);
  }
  fm_reply_send(&r, rq->conn, rq->id);
  return FM_OK;
}

int fm_cmd_stats_zero(fm_request *rq, fm_diag *d) {
  fm_daemon *dd = rq->dd;
  int err = fm_store_stats_zero(dd->store);
  if (err) return store_fail(dd, err, "zeroing the counters failed", d);
  /* The since-start counters too, and what was counted but not yet saved (it would come back). */
  memset(dd->session, 0, sizeof dd->session);
  memset(dd->unsaved, 0, sizeof dd->unsaved);
  fm_log_info("%s: counters zeroed", fm_conn_name(rq->conn));
  fm_reply r;
  fm_reply_begin(&r, rq->id, 1);
  fm_pack_kv_bool(&r.pk, "zeroed", true);
  fm_reply_send(&r, rq->conn, rq->id);
  return FM_OK;
}

/* The fields list and show share: key, device, kind, state, size, hits, created, last_used. */
#define FM_ENTRY_SUMMARY_FIELDS 8
static void pack_summary(msgpack_packer *pk, const fm_entry *e) {
  fm_pack_cstr(pk, "key");
  fm_reply_pack_key(pk, &e->key);
  fm_pack_kv_cstr(pk, "device", e->device);
  fm_pack_kv_cstr(pk, "kind", e->kind);
  fm_pack_kv_cstr(pk, "state", fm_kstate_name(e->state));
  fm_pack_kv_u64(pk, "size", e->cubin_len);
  fm_pack_kv_i64(pk, "hits", e->hits);
  fm_pack_kv_i64(pk, "created", e->created);
  fm_pack_kv_i64(pk, "last_used", e->last_used);
}

typedef struct list_acc {
  fm_reply body; /* the packed entries, spliced after the array header */
  uint32_t n;
} list_acc;

static int list_one(const fm_entry *e, void *ctx) {
  list_acc *a = ctx;
  msgpack_pack_map(&a->body.pk, FM_ENTRY_SUMMARY_FIELDS);
  pack_summary(&a->body.pk, e);
  a->n++;
  return a->body.err ? 1 : 0;
}

int fm_cmd_list(fm_request *rq, fm_diag *d) {
  uint64_t limit = FM_LIST_DEFAULT_LIMIT;
  int err = fm_msg_get_u64(rq->msg, "limit", &limit, d);
  if (err && err != FM_ENOT_FOUND) return err;
  if (limit == 0 || limit > UINT32_MAX) limit = UINT32_MAX;
  list_acc a = {.n = 0};
  fm_reply_init(&a.body);
  err = fm_store_list(rq->dd->store, (uint32_t)limit, list_one, &a);
  if (err || a.body.err) {
    fm_reply_discard(&a.body);
    if (err) return store_fail(rq->dd, err, "listing the store failed", d);
    return fm_diag_set(d, FM_ENOMEM, "out of memory listing the store");
  }
  fm_reply r;
  fm_reply_begin(&r, rq->id, 1);
  fm_pack_cstr(&r.pk, "entries");
  msgpack_pack_array(&r.pk, a.n);
  fm_reply_append(&r, a.body.sb.data, a.body.sb.size);
  fm_reply_discard(&a.body);
  fm_reply_send(&r, rq->conn, rq->id);
  return FM_OK;
}

/* A key prefix from a request: 4..64 hex digits, returned NUL-terminated. */
static int get_prefix(const msgpack_object *msg, char out[FM_KEY_HEX], fm_diag *d) {
  const char *s;
  size_t n;
  int err = fm_msg_get_str(msg, "key", &s, &n, d);
  if (err == FM_ENOT_FOUND) return fm_diag_set(d, FM_ESCHEMA, "request has no \"key\"");
  if (err) return err;
  if (n < 4 || n > FM_KEY_BYTES * 2)
    return fm_diag_set(d, FM_ESCHEMA, "\"key\" must be 4 to 64 hex digits, got %zu characters", n);
  for (size_t i = 0; i < n; i++) {
    if (!isxdigit((unsigned char)s[i])) return fm_diag_set(d, FM_ESCHEMA, "\"key\" must be hex digits");
    out[i] = (char)tolower((unsigned char)s[i]);
  }
  out[n] = '\0';
  return FM_OK;
}

static int find_entry(fm_daemon *dd, const char *prefix, fm_entry *e, fm_diag *d) {
  int err = fm_store_find_prefix(dd->store, prefix, e);
  if (err == FM_ENOT_FOUND) return fm_diag_set(d, FM_ENOT_FOUND, "no entry with key %s...", prefix);
  if (err == FM_EINVAL)
    return fm_diag_set(d, FM_EINVAL, "key prefix %s matches more than one entry; give more digits", prefix);
  if (err) return store_fail(dd, err, "store lookup failed", d);
  return FM_OK;
}

int fm_cmd_show(fm_request *rq, fm_diag *d) {
  char prefix[FM_KEY_HEX];
  fm_entry e;
  int err;
  if ((err = get_prefix(rq->msg, prefix, d))) return err;
  if ((err = find_entry(rq->dd, prefix, &e, d))) return err;
  fm_bg_phase phase;
  size_t ahead = 0, candidates = 0;
  int tuning = fm_bgtune_find(rq->dd->bgtune, &e.key, &phase, &ahead, &candidates);
  fm_reply r;
  fm_reply_begin(&r, rq->id, 1);
  fm_pack_cstr(&r.pk, "entry");
  msgpack_pack_map(&r.pk, FM_ENTRY_SUMMARY_FIELDS + 5);
  pack_summary(&r.pk, &e);
  /* The entry is what is served; this is the tune that will replace it, if one is queued. */
  fm_pack_cstr(&r.pk, "background");
  if (tuning) {
    msgpack_pack_map(&r.pk, 3);
    fm_pack_kv_cstr(&r.pk, "phase", fm_bg_phase_name(phase));
    fm_pack_kv_u64(&r.pk, "ahead", ahead);
    fm_pack_kv_u64(&r.pk, "candidates", candidates);
  } else {
    msgpack_pack_nil(&r.pk);
  }
  /* The canonical fragment and the metadata are stored packed: splice them in as they are. */
  fm_pack_cstr(&r.pk, "fragment");
  fm_reply_raw(&r, e.canonical, e.canonical_len);
  fm_pack_cstr(&r.pk, "meta");
  fm_reply_raw(&r, e.meta, e.meta_len);
  if (e.source)
    fm_pack_kv_cstr(&r.pk, "source", e.source);
  else {
    fm_pack_cstr(&r.pk, "source");
    msgpack_pack_nil(&r.pk);
  }
  fm_pack_cstr(&r.pk, "timings");
  fm_reply_raw(&r, e.timings, e.timings_len);
  fm_entry_free(&e);
  fm_reply_send(&r, rq->conn, rq->id);
  return FM_OK;
}

int fm_cmd_evict(fm_request *rq, fm_diag *d) {
  fm_daemon *dd = rq->dd;
  bool all = false;
  uint64_t evicted = 0;
  int err = fm_msg_get_bool(rq->msg, "all", &all, d);
  if (err && err != FM_ENOT_FOUND) return err;
  if (all) {
    if ((err = fm_store_evict_all(dd->store, &evicted))) return store_fail(dd, err, "evicting all entries failed", d);
    fm_log_info("evicted all %llu entries", (unsigned long long)evicted);
  } else {
    /* A full key, or (for fusectl's convenience) an unambiguous prefix like show takes. */
    char prefix[FM_KEY_HEX];
    fm_entry e;
    if ((err = get_prefix(rq->msg, prefix, d))) {
      if (!fm_msg_get(rq->msg, "key")) return fm_diag_set(d, FM_ESCHEMA, "evict needs \"key\" or \"all\": true");
      return err;
    }
    if ((err = find_entry(dd, prefix, &e, d))) return err;
    err = fm_store_evict(dd->store, &e.key);
    fm_entry_free(&e);
    if (err == FM_ENOT_FOUND) return fm_diag_set(d, FM_ENOT_FOUND, "no entry with key %s...", prefix);
    if (err) return store_fail(dd, err, "evicting failed", d);
    evicted = 1;
    fm_log_info("evicted %s", prefix);
  }
  fm_reply r;
  fm_reply_begin(&r, rq->id, 1);
  fm_pack_kv_u64(&r.pk, "evicted", evicted);
  fm_reply_send(&r, rq->conn, rq->id);
  return FM_OK;
}

int fm_cmd_shutdown(fm_request *rq, fm_diag *d) {
  fm_daemon *dd = rq->dd;
  uint32_t uid = 0;
  char why[192];
  /* Answered first, so the reply is queued before the connections are closed: the drain
   * writes it out like every other. */
  fm_reply r;
  fm_reply_begin(&r, rq->id, 2);
  fm_pack_kv_u64(&r.pk, "pid", (uint64_t)getpid());
  fm_pack_kv_u64(&r.pk, "inflight", dd->jobs_running);
  fm_reply_send(&r, rq->conn, rq->id);
  fm_conn_peer_uid(rq->conn, &uid);
  snprintf(why, sizeof why, "%s (uid %u) asked to shut down", fm_conn_name(rq->conn), (unsigned)uid);
  fm_daemon_shutdown(dd, why);
  return FM_OK;
}
