/* fm_cmd_kernel.c: compile and lookup, the kernel path of every client request.
 *
 * On the loop thread: decode + validate the fragment, canonicalize, fingerprint, look in the
 * store (SQLite reads are fast under WAL). A hit is answered at once. A miss joins the
 * compile of the same key already in flight, or starts one on the worker pool; every waiter
 * is answered when it ends. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fm_bgtune.h"
#include "fm_commands.h"
#include "fm_compile.h"
#include "fm_compile_queue.h"
#include "fm_entry_check.h"
#include "fm_fragment.h"
#include "fm_log.h"
#include "fm_msg.h"
#include "fm_remote_tier.h"
#include "fm_reply.h"
#include "fm_tuner.h"

#define FM_COMPILE_LOG_MAX (32u << 10) /* NVRTC log bytes carried in a compile_failed reply */

/* A request's fragment, made ready for the store and the compiler. */
typedef struct prepared {
  fm_fragment *canon;
  uint8_t *bytes; /* canonical bytes */
  size_t len;
  fm_device_id dev;
  char label[192];
  fm_key key;
  char hex[FM_KEY_HEX];
} prepared;

static void prepared_free(prepared *p) {
  free(p->canon);
  free(p->bytes);
}

static int prepare(fm_daemon *dd, const msgpack_object *req, prepared *p, fm_diag *d) {
  int err;
  fm_fragment *raw = NULL;
  char arch[sizeof p->dev.arch] = "";
  memset(p, 0, sizeof *p);
  const msgpack_object *frag = fm_msg_get(req, "fragment");
  if (!frag) return fm_diag_set(d, FM_ESCHEMA, "request has no \"fragment\"");
  if (frag->type != MSGPACK_OBJECT_MAP) return fm_diag_set(d, FM_ESCHEMA, "\"fragment\" must be a map");
  err = fm_msg_copy_str(req, "arch", arch, sizeof arch, d);
  if (err && err != FM_ENOT_FOUND) return err;
  if ((err = fm_device_for_arch(&dd->dev, arch, &p->dev, d))) return err;

  raw = malloc(sizeof *raw);
  p->canon = malloc(sizeof *p->canon);
  if (!raw || !p->canon) {
    err = fm_diag_set(d, FM_ENOMEM, "out of memory");
    goto out;
  }
  if ((err = fm_fragment_decode(frag, raw, d))) goto out;
  if ((err = fm_fragment_canonicalize(raw, p->canon))) {
    fm_diag_set(d, err, "cannot canonicalize the fragment: %s", fm_strerror(err));
    goto out;
  }
  if ((err = fm_fragment_canonical_bytes(p->canon, &p->bytes, &p->len))) {
    fm_diag_set(d, err, "cannot pack the canonical fragment: %s", fm_strerror(err));
    goto out;
  }
  if ((err = fm_device_key(&dd->dev, &p->dev, p->bytes, p->len, &p->key))) {
    fm_diag_set(d, err, "cannot compute the cache key: %s", fm_strerror(err));
    goto out;
  }
  fm_key_to_hex(&p->key, p->hex);
  fm_device_label(&p->dev, p->label, sizeof p->label);
out:
  free(raw);
  if (err) {
    prepared_free(p);
    memset(p, 0, sizeof *p);
  }
  return err;
}

/* Store lookup: FM_OK with *e filled on a usable hit, else FM_ENOT_FOUND (a miss, a corrupt
 * entry the store deleted, a store failure: all of them mean "build it"). */
static int store_lookup(fm_daemon *dd, const prepared *p, fm_entry *e) {
  int err = fm_store_get(dd->store, &p->key, p->label, 1, e);
  if (err == FM_OK) {
    /* The key is a hash: compare what it stands for before serving (DESIGN: the cache key
     * is exact). A mismatch is rebuilt and the put replaces the entry. */
    if (e->canonical_len == p->len && memcmp(e->canonical, p->bytes, p->len) == 0) return FM_OK;
    fm_log_warn("entry %.16s holds a different canonical fragment; rebuilding it", p->hex);
    fm_entry_free(e);
    return FM_ENOT_FOUND;
  }
  if (err == FM_ECORRUPT) {
    fm_log_warn("entry %.16s failed its checksum and was removed; rebuilding it", p->hex);
  } else if (err != FM_ENOT_FOUND) {
    fm_diag why = {{0}};
    fm_store_last_error(dd->store, &why);
    fm_log_error("store lookup of %.16s failed: %s; compiling without the cache", p->hex,
                 why.text[0] ? why.text : fm_strerror(err));
    fm_daemon_count(dd, FM_STAT_STORE_ERRORS, 1);
  }
  return FM_ENOT_FOUND;
}

/* {ok, id, key, kind, state, origin, meta, cubin} */
static void reply_kernel(fm_conn *c, uint64_t id, const fm_key *key, const char *kind, fm_kstate state,
                         const char *origin, const uint8_t *meta, size_t meta_len, const uint8_t *cubin,
                         size_t cubin_len) {
  fm_reply r;
  fm_reply_begin(&r, id, 6);
  fm_pack_cstr(&r.pk, "key");
  fm_reply_pack_key(&r.pk, key);
  fm_pack_kv_cstr(&r.pk, "kind", kind);
  fm_pack_kv_cstr(&r.pk, "state", fm_kstate_name(state));
  fm_pack_kv_cstr(&r.pk, "origin", origin);
  fm_pack_cstr(&r.pk, "meta");
  fm_reply_raw(&r, meta, meta_len);
  fm_pack_cstr(&r.pk, "cubin");
  fm_pack_bin(&r.pk, cubin, cubin_len);
  fm_reply_send(&r, c, id);
}

static void reply_entry(fm_conn *c, uint64_t id, const fm_entry *e) {
  if (e->state == FM_STATE_BAD) {
    /* Tuning found no candidate that verified on this device: never serve it; the client
     * runs the fragment eagerly. */
    char hex[FM_KEY_HEX], why[160];
    fm_key_to_hex(&e->key, hex);
    snprintf(why, sizeof why, "no candidate verified on this device (fusectl show %.16s lists why)", hex);
    fm_reply_error(c, id, FM_EUNSUPPORTED, why);
    return;
  }
  reply_kernel(c, id, &e->key, e->kind, e->state, "hit", e->meta, e->meta_len, e->cubin, e->cubin_len);
}

/* The error detail of a failed job: the reason, then NVRTC's log (capped). */
static char *failure_detail(const fm_compile_job *j) {
  size_t log_len = j->log ? strlen(j->log) : 0;
  if (log_len > FM_COMPILE_LOG_MAX) log_len = FM_COMPILE_LOG_MAX;
  size_t cap = strlen(j->diag.text) + log_len + 2;
  char *s = malloc(cap);
  if (!s) return NULL;
  snprintf(s, cap, "%s%s%.*s", j->diag.text, log_len ? "\n" : "", (int)log_len, log_len ? j->log : "");
  return s;
}

/* Answers (and frees) every waiter of a finished flight: the error err, or kernel j. */
static void answer_waiters(fm_waiter *w, const char *hex, int err, const char *detail, const fm_compile_job *j,
                           fm_kstate state) {
  while (w) {
    fm_waiter *next = w->next;
    if (fm_conn_is_open(w->conn)) {
      if (err)
        fm_reply_error(w->conn, w->id, err, detail);
      else
        reply_kernel(w->conn, w->id, &j->key, j->meta.kind, state, w->joined ? "joined" : "compiled", j->meta_bytes,
                     j->meta_len, j->cubin, j->cubin_len);
    } else {
      fm_log_debug("%s: gone before its compile of %.16s ended; reply dropped", fm_conn_name(w->conn), hex);
    }
    fm_conn_unref(w->conn);
    free(w);
    w = next;
  }
}

/* The flight job still answers: NULL once it was abandoned (a new flight for the same key
 * may have started since, and is not this job's to answer). */
static fm_flight *flight_of(fm_daemon *dd, const fm_key *key, const void *job) {
  fm_flight *f = fm_inflight_find(dd->inflight, key);
  return f && f->job == job ? f : NULL;
}

static void on_compile_done(fm_compile_job *j) {
  fm_daemon *dd = j->ctx;
  char hex[FM_KEY_HEX];
  fm_key_to_hex(&j->key, hex);
  fm_flight *f = flight_of(dd, &j->key, j);
  fm_waiter *w = f ? fm_inflight_finish(dd->inflight, f) : NULL;
  char *detail = NULL;

  if (j->err == FM_ECLOSED) {
    fm_log_debug("compile of %.16s %s", hex, j->diag.text);
  } else if (j->err) {
    fm_daemon_count(dd, FM_STAT_COMPILE_ERRORS, 1);
    fm_log_warn("compile of %.16s failed: %s", hex, j->diag.text);
    detail = failure_detail(j);
  } else {
    if (j->store_err) {
      fm_daemon_count(dd, FM_STAT_STORE_ERRORS, 1);
      fm_log_error("%s; serving it uncached", j->store_diag.text);
    }
    fm_log_info("compiled %.16s (%s, %zu-byte cubin, %s) in %.0f ms", hex, j->meta.kind, j->cubin_len, j->device.arch,
                j->compile_ms);
    if (!j->store_err && j->store) fm_remote_publish(dd->loop, dd->remote, &j->key, j->label, j->device.arch);
  }
  answer_waiters(w, hex, j->err ? j->err : FM_OK, detail ? detail : j->diag.text, j, FM_STATE_UNTUNED);
  free(detail);
  fm_compile_job_free(j);
  dd->jobs_running--;
  fm_daemon_job_ended(dd);
}

/* ---- tuning (fm_tuner.h): compile the candidates, then judge them on the GPU ----
 *
 * --tune eager: one round judges every candidate before the waiters are answered (tuned).
 * --tune background: the first round judges one candidate (served_first); its waiters are
 * answered with it, verified, and the full tune is queued in fm_bgtune.h, whose round
 * replaces the entry with the tuned winner. If that one candidate does not compile or
 * verify, the heuristic default is tried next (when the library plan was the one), then every
 * candidate, as eager does: never an unverified kernel. */

/* Whose line a flight's compiles wait in (fm_compile_queue.h): the connection that started it. */
static const void *owner_of(const fm_flight *f) { return f->waiters ? (const void *)f->waiters->conn : NULL; }

/* The candidate served first: the library plan where the fragment has one (never slower than
 * what eager runs, and nothing for NVRTC to build in its direct form), else the heuristic
 * default, which fm_codegen_candidates puts first. */
static uint64_t served_first(const fm_tune_job *tj) {
  for (size_t i = 0; i < tj->n; i++)
    if (tj->cands[i]->cand.tmpl == FM_TMPL_CUBLASLT) return 1ull << i;
  return 1;
}

/* Queues the compiles of the round's candidates not compiled yet: in owner's line, or in the
 * background line when owner is NULL; done(j) for each. Returns how many were queued (0:
 * nothing to build, the caller goes on itself). */
static size_t compile_round(fm_daemon *dd, fm_tune_job *tj, const void *owner, fm_compile_done_fn done) {
  size_t queued = 0, n = tj->n;
  uint64_t todo = 0;
  fm_compile_job *cands[FM_TUNE_MAX_CANDIDATES];
  for (size_t i = 0; i < n; i++) {
    cands[i] = tj->cands[i];
    if (fm_tune_job_judges(tj, i) && !((tj->compiled >> i) & 1u)) {
      todo |= 1ull << i;
      tj->pending++;
    }
  }
  /* pending and compiled first: a compile the pool refuses ends at once, inside the submit,
   * and the last one to end may free tj */
  tj->compiled |= todo;
  for (size_t i = 0; i < n; i++) {
    fm_compile_job *cj = cands[i];
    if (!((todo >> i) & 1u)) continue;
    queued++;
    if (!owner) {
      fm_cqueue_submit_background(dd->cqueue, cj, done, tj);
    } else if (fm_cqueue_submit(dd->cqueue, owner, cj, done, tj)) {
      cj->err = fm_diag_set(&cj->diag, FM_ENOMEM, "cannot queue the compile: out of memory");
      cj->ctx = tj;
      done(cj);
    }
  }
  return queued;
}

/* The end of a flight's tune job (answered or dropped). */
static void tune_job_ended(fm_daemon *dd, fm_tune_job *tj) {
  fm_tune_job_free(tj);
  dd->jobs_running--;
  fm_daemon_job_ended(dd);
}

static void candidates_compiled(fm_tune_job *tj);
static void queue_background(fm_daemon *dd, fm_tune_job *tj);

static void on_candidate_compiled(fm_compile_job *j) {
  fm_tune_job *tj = j->ctx;
  fm_daemon *dd = tj->ctx;
  if (j->err && j->err != FM_ECLOSED) fm_daemon_count(dd, FM_STAT_COMPILE_ERRORS, 1);
  if (--tj->pending == 0) candidates_compiled(tj);
}

/* The candidate served first did not compile or verify: the heuristic default next, if the
 * library plan was the one tried, else every candidate (the eager round). */
static void judge_next(fm_daemon *dd, fm_tune_job *tj, const fm_flight *f) {
  tj->judge = tj->judge != 1 ? 1 : 0;
  if (!compile_round(dd, tj, owner_of(f), on_candidate_compiled)) candidates_compiled(tj);
}

static void on_tune_done(fm_tune_job *tj) {
  fm_daemon *dd = tj->ctx;
  const fm_compile_job *c0 = tj->cands[0];
  char hex[FM_KEY_HEX];
  fm_key_to_hex(&c0->key, hex);
  fm_flight *f = flight_of(dd, &c0->key, tj);
  fm_waiter *w;

  fm_daemon_count(dd, FM_STAT_WORKER_RESTARTS, tj->restarts);
  fm_daemon_count(dd, FM_STAT_BAD_CANDIDATES, tj->bad);
  fm_log_debug("foreground tune of %.16s waited for %u background candidate(s)", hex, tj->waited_behind);
  if (tj->judge && tj->tuned && tj->winner < 0) {
    if (!f) {
      tune_job_ended(dd, tj);
      return;
    }
    fm_log_info("the candidate served first for %.16s did not verify (%s); judging %s before answering", hex,
                tj->diag.text, tj->judge != 1 ? "the heuristic default" : "every candidate");
    judge_next(dd, tj, f);
    return;
  }
  w = f ? fm_inflight_finish(dd->inflight, f) : NULL;
  if (tj->store_err) {
    fm_daemon_count(dd, FM_STAT_STORE_ERRORS, 1);
    fm_log_error("%s; serving it uncached", tj->store_diag.text);
  } else if (!tj->judge || !tj->tuned) {
    /* Whatever tuning stored (tuned, bad, untuned) is worth sharing; a verified entry waits
     * for its tune. */
    fm_remote_publish(dd->loop, dd->remote, &c0->key, c0->label, c0->device.arch);
  }
  if (!tj->tuned) {
    /* The worker could not judge anything: serve the default as compile-only mode would. */
    size_t i = 0;
    while (i + 1 < tj->n && tj->cands[i]->err) i++;
    fm_log_warn("cannot tune %.16s (%s); serving the default configuration untuned", hex, tj->diag.text);
    answer_waiters(w, hex, tj->cands[i]->err, tj->cands[i]->diag.text, tj->cands[i], FM_STATE_UNTUNED);
  } else if (tj->winner >= 0) {
    const fm_compile_job *win = tj->cands[tj->winner];
    char desc[160];
    fm_candidate_describe(&win->cand, desc, sizeof desc);
    if (tj->judge) {
      fm_daemon_count(dd, FM_STAT_VERIFIED, 1);
      fm_log_info(
          "verified %.16s: serving %s (%.4f ms) in %.0f ms (worker's prepare %.0f ms, run %.0f ms); "
          "%zu candidates to tune in the background",
          hex, desc, tj->res[tj->winner].ms, tj->tune_ms, tj->prepare_ms, tj->res[tj->winner].wall_ms, tj->n);
      answer_waiters(w, hex, FM_OK, NULL, win, FM_STATE_VERIFIED);
      if (f) {
        queue_background(dd, tj); /* takes tj, or frees it */
        dd->jobs_running--;
        fm_daemon_job_ended(dd);
        return;
      }
    } else {
      fm_daemon_count(dd, FM_STAT_TUNES, 1);
      fm_log_info(
          "tuned %.16s: %zu candidates in %.0f ms; chose %s (%.4f ms; default %.4f ms, %s); "
          "%u bad, %u worker restarts",
          hex, tj->n, tj->tune_ms, desc, tj->res[tj->winner].ms, tj->res[0].ms, fm_verdict_name(tj->res[0].verdict),
          tj->bad, tj->restarts);
      answer_waiters(w, hex, FM_OK, NULL, win, FM_STATE_TUNED);
    }
  } else {
    fm_daemon_count(dd, FM_STAT_TUNES, 1);
    fm_log_warn("tuned %.16s: %s; stored as bad (clients run it unfused)", hex, tj->diag.text);
    answer_waiters(w, hex, FM_EUNSUPPORTED, tj->diag.text, NULL, FM_STATE_BAD);
  }
  tune_job_ended(dd, tj);
}

/* The round's candidates compiled (or failed to): on to the tuner, unless none compiled or
 * nobody waits any more. */
static void candidates_compiled(fm_tune_job *tj) {
  fm_daemon *dd = tj->ctx;
  fm_compile_job *j = tj->cands[0];
  char hex[FM_KEY_HEX];
  fm_key_to_hex(&j->key, hex);
  fm_flight *f = flight_of(dd, &j->key, tj);
  if (!f) {
    fm_log_debug("tuning of %.16s dropped: nobody waits for it any more", hex);
    tune_job_ended(dd, tj);
    return;
  }
  for (size_t i = 0; i < tj->n; i++) {
    if (!fm_tune_job_judges(tj, i) || tj->cands[i]->err) continue;
    fm_tuner_submit(dd->tuner, tj, on_tune_done, dd);
    return;
  }
  if (tj->judge) {
    judge_next(dd, tj, f);
    return;
  }
  /* Nothing to tune: answer as a failed compile of the default. */
  fm_waiter *w = fm_inflight_finish(dd->inflight, f);
  char *detail = failure_detail(j);
  fm_log_warn("compile of %.16s failed (all %zu candidates): %s", hex, tj->n, j->diag.text);
  answer_waiters(w, hex, j->err, detail ? detail : j->diag.text, j, FM_STATE_UNTUNED);
  free(detail);
  tune_job_ended(dd, tj);
}

/* ---- background tunes (fm_bgtune.h): nobody waits for them ---- */

static void on_bg_tune_done(fm_tune_job *tj) {
  fm_daemon *dd = tj->ctx;
  const fm_compile_job *c0 = tj->cands[0];
  char hex[FM_KEY_HEX];
  fm_key_to_hex(&c0->key, hex);
  fm_daemon_count(dd, FM_STAT_WORKER_RESTARTS, tj->restarts);
  fm_daemon_count(dd, FM_STAT_BAD_CANDIDATES, tj->bad);
  if (tj->stopped) {
    fm_log_debug("background tune of %.16s stopped with the tuner; its verified kernel stays", hex);
  } else if (!tj->tuned) {
    fm_log_warn("background tune of %.16s could not run (%s); its verified kernel stays", hex, tj->diag.text);
  } else if (tj->store_err) {
    fm_daemon_count(dd, FM_STAT_STORE_ERRORS, 1);
    fm_log_error("%s; the verified kernel stays", tj->store_diag.text);
  } else if (tj->kept >= 0) {
    fm_log_info("background tune of %.16s: a %s entry stored meanwhile is kept", hex,
                fm_kstate_name((fm_kstate)tj->kept));
  } else if (tj->winner >= 0) {
    char desc[160];
    fm_candidate_describe(&tj->cands[tj->winner]->cand, desc, sizeof desc);
    fm_daemon_count(dd, FM_STAT_TUNES, 1);
    fm_daemon_count(dd, FM_STAT_UPGRADES, 1);
    fm_log_info(
        "tuned %.16s in the background: %zu candidates in %.0f ms; chose %s (%.4f ms); %u bad, "
        "%u worker restarts; served from now on",
        hex, tj->n, tj->tune_ms, desc, tj->res[tj->winner].ms, tj->bad, tj->restarts);
    fm_remote_publish(dd->loop, dd->remote, &c0->key, c0->label, c0->device.arch);
  } else {
    /* The candidate served verified failed its second check: the rule of eager tuning. */
    fm_daemon_count(dd, FM_STAT_TUNES, 1);
    fm_log_warn("tuned %.16s in the background: %s; stored as bad (clients run it unfused)", hex, tj->diag.text);
  }
  fm_bgtune_done(dd->bgtune, tj);
  fm_tune_job_free(tj);
}

static void bg_candidates_compiled(fm_tune_job *tj) {
  fm_daemon *dd = tj->ctx;
  if (dd->stopping) {
    char hex[FM_KEY_HEX];
    size_t built = 0;
    for (size_t i = 0; i < tj->n; i++) built += !tj->cands[i]->err;
    fm_key_to_hex(&tj->cands[0]->key, hex);
    fm_log_debug("background tune of %.16s dropped at shutdown with %zu of %zu candidates compiled", hex, built, tj->n);
    fm_bgtune_done(dd->bgtune, tj);
    fm_tune_job_free(tj);
    return;
  }
  fm_bgtune_set_phase(dd->bgtune, tj, FM_BG_TUNING);
  fm_tuner_submit(dd->tuner, tj, on_bg_tune_done, dd);
}

static void on_bg_candidate_compiled(fm_compile_job *j) {
  fm_tune_job *tj = j->ctx;
  if (--tj->pending == 0) bg_candidates_compiled(tj);
}

/* fm_bgtune_start_fn: the rest of the candidates compile in the background line. */
static void bg_start(fm_tune_job *tj, void *ctx) {
  if (!compile_round(ctx, tj, NULL, on_bg_candidate_compiled)) bg_candidates_compiled(tj);
}

static void queue_background(fm_daemon *dd, fm_tune_job *tj) {
  tj->judge = 0;
  tj->background = 1;
  tj->keep_states = FM_STATE_BIT(FM_STATE_TUNED); /* an import meanwhile */
  tj->pending = 0;
  /* a stopping daemon starts nothing new: the next start tunes it on its first hit */
  if (dd->stopping || fm_bgtune_add(dd->bgtune, tj) != 1) fm_tune_job_free(tj);
}

int fm_cmd_bgtune_new(fm_daemon *dd) { return fm_bgtune_new(FM_BGTUNE_ACTIVE, bg_start, dd, &dd->bgtune); }

/* fm_flight.cancel for each kind of build. */
static void cancel_compile(void *job) { atomic_store(&((fm_compile_job *)job)->cancel, 1); }

static void cancel_tuning(void *job) {
  fm_tune_job *tj = job;
  for (size_t i = 0; i < tj->n; i++) cancel_compile(tj->cands[i]);
}

/* A tune job with one compile job per candidate, none compiled yet. FM_OK or FM_ENOMEM. */
static int start_tuning(fm_daemon *dd, const prepared *p, fm_tune_job **out) {
  fm_candidate cands[2 * FM_TUNE_MAX_CANDIDATES];
  fm_tune_job *tj = NULL;
  size_t n = fm_codegen_candidates(p->canon, cands, 2 * FM_TUNE_MAX_CANDIDATES), kept = 0;
  /* candidates this GPU cannot run (the sm_90a wgmma mainloop elsewhere) are not compiled;
     dropped before the cap, so they never push a runnable one out; so are those --tune-only
     leaves out */
  const char *only = dd->cfg->tune_only;
  for (size_t i = 0; i < n; i++) {
    char desc[160];
    fm_candidate_describe(&cands[i], desc, sizeof desc);
    if (fm_candidate_runs_on(&cands[i], p->dev.arch) && (!only[0] || strstr(desc, only))) cands[kept++] = cands[i];
  }
  n = kept < FM_TUNE_MAX_CANDIDATES ? kept : FM_TUNE_MAX_CANDIDATES;
  if (n == 0) {
    /* No template offers candidates: the default path says why (unsupported). */
    *out = NULL;
    return FM_OK;
  }
  if (fm_tune_job_new(&tj)) return FM_ENOMEM;
  tj->store = dd->store;
  tj->ctx = dd;
  for (size_t i = 0; i < n; i++) {
    fm_compile_job *cj;
    if (fm_compile_job_new(p->canon, p->bytes, p->len, &p->key, &p->dev, NULL, &cj)) {
      fm_tune_job_free(tj);
      return FM_ENOMEM;
    }
    cj->has_cand = 1;
    cj->cand = cands[i];
    cj->nvrtc = dd->nvrtc.exe ? &dd->nvrtc : NULL;
    tj->cands[tj->n++] = cj;
  }
  *out = tj;
  return FM_OK;
}

/* A hit on a verified entry whose tune is not queued (a restart lost it, or a crash mid-tune
 * left the entry): queue it again. */
static void retune_verified(fm_daemon *dd, const prepared *p) {
  fm_bg_phase phase;
  size_t ahead, n;
  fm_tune_job *tj = NULL;
  if (!dd->bgtune || fm_bgtune_find(dd->bgtune, &p->key, &phase, &ahead, &n)) return;
  if (start_tuning(dd, p, &tj) || !tj) return;
  fm_log_debug("%.16s is served verified with no tune queued; queueing it", p->hex);
  queue_background(dd, tj);
}

/* Undoes fm_inflight_start when the job could not be queued (no waiter holds a reference). */
static void drop_flight(fm_daemon *dd, fm_flight *f) {
  fm_waiter *w = fm_inflight_finish(dd->inflight, f);
  while (w) {
    fm_waiter *next = w->next;
    free(w);
    w = next;
  }
}

/* Starts the local build of flight f: candidates then tuning, or the default alone. */
static int start_build(fm_daemon *dd, prepared *p, fm_flight *f, fm_diag *d) {
  fm_compile_job *job = NULL;
  fm_tune_job *tj = NULL;
  int err;
  if (dd->tuner) {
    if (start_tuning(dd, p, &tj)) return fm_diag_set(d, FM_ENOMEM, "out of memory");
  }
  if (tj) {
    f->job = tj;
    f->cancel = cancel_tuning;
    dd->jobs_running++;
    fm_daemon_count(dd, FM_STAT_COMPILES, 1);
    if (dd->cfg->tune == FM_TUNE_BACKGROUND) tj->judge = served_first(tj);
    fm_log_debug("compiling %s of %zu candidates of %.16s for %s, then tuning", tj->judge ? "one" : "all", tj->n,
                 p->hex, p->dev.arch);
    if (!compile_round(dd, tj, owner_of(f), on_candidate_compiled)) candidates_compiled(tj);
    return FM_OK;
  }
  if (fm_compile_job_new(p->canon, p->bytes, p->len, &p->key, &p->dev, dd->store, &job))
    return fm_diag_set(d, FM_ENOMEM, "out of memory");
  job->nvrtc = dd->nvrtc.exe ? &dd->nvrtc : NULL;
  f->job = job;
  f->cancel = cancel_compile;
  fm_log_debug("compiling %.16s for %s", p->hex, p->dev.arch);
  dd->jobs_running++; /* first: a job the pool refuses ends (on_compile_done) right away */
  if ((err = fm_cqueue_submit(dd->cqueue, owner_of(f), job, on_compile_done, dd))) {
    dd->jobs_running--;
    fm_compile_job_free(job);
    return fm_diag_set(d, err, "cannot queue the compile");
  }
  fm_daemon_count(dd, FM_STAT_COMPILES, 1);
  return FM_OK;
}

/* ---- the remote tier (fm_remote_tier.h): asked before building ---- */

typedef struct remote_wait {
  fm_remote_lookup lk;
  fm_daemon *dd;
  prepared p; /* owned */
} remote_wait;

static void on_remote_done(fm_remote_lookup *lk) {
  remote_wait *rw = lk->ctx;
  fm_daemon *dd = rw->dd;
  fm_flight *f = flight_of(dd, &rw->p.key, rw);
  dd->jobs_running--;
  if (lk->found) {
    fm_waiter *w = f ? fm_inflight_finish(dd->inflight, f) : NULL;
    if (lk->store_err) {
      fm_daemon_count(dd, FM_STAT_STORE_ERRORS, 1);
      fm_log_error("cannot store remote entry %.16s; serving it uncached", rw->p.hex);
    }
    fm_log_info("remote hit %.16s (%s, %zu-byte cubin)", rw->p.hex, lk->e.kind, lk->e.cubin_len);
    while (w) {
      fm_waiter *next = w->next;
      if (fm_conn_is_open(w->conn)) {
        if (lk->e.state == FM_STATE_BAD)
          reply_entry(w->conn, w->id, &lk->e);
        else
          reply_kernel(w->conn, w->id, &lk->e.key, lk->e.kind, lk->e.state, "remote", lk->e.meta, lk->e.meta_len,
                       lk->e.cubin, lk->e.cubin_len);
      }
      fm_conn_unref(w->conn);
      free(w);
      w = next;
    }
    fm_entry_free(&lk->e);
  } else if (f) {
    fm_diag d = {{0}};
    int err = start_build(dd, &rw->p, f, &d);
    if (err) answer_waiters(fm_inflight_finish(dd->inflight, f), rw->p.hex, err, d.text, NULL, FM_STATE_UNTUNED);
  }
  prepared_free(&rw->p);
  free(rw);
  fm_daemon_job_ended(dd);
}

/* Asks the remote tier for p's key on the worker pool; takes p's buffers on success. */
static int start_remote(fm_daemon *dd, prepared *p, fm_flight *f, fm_diag *d) {
  remote_wait *rw = calloc(1, sizeof *rw);
  if (!rw) return fm_diag_set(d, FM_ENOMEM, "out of memory");
  rw->dd = dd;
  rw->p = *p;
  rw->lk.tier = dd->remote;
  rw->lk.key = p->key;
  snprintf(rw->lk.label, sizeof rw->lk.label, "%s", p->label);
  snprintf(rw->lk.arch, sizeof rw->lk.arch, "%s", p->dev.arch);
  rw->lk.canonical = p->bytes;
  rw->lk.canonical_len = p->len;
  f->job = rw;
  if (fm_remote_lookup_submit(dd->loop, &rw->lk, on_remote_done, rw)) {
    free(rw);
    return fm_diag_set(d, FM_EIO, "cannot queue the remote lookup");
  }
  p->canon = NULL;
  p->bytes = NULL;
  dd->jobs_running++;
  return FM_OK;
}

/* Joins the flight for p's key, or starts one: the remote tier first when there is one. */
static int join_or_start(fm_request *rq, prepared *p, fm_diag *d) {
  fm_daemon *dd = rq->dd;
  fm_flight *f = fm_inflight_find(dd->inflight, &p->key);
  uint32_t waiting = fm_inflight_waiting(dd->inflight, rq->conn), cost;
  int err;
  /* One client must not queue work without bound ahead of everyone else: past its limit it
   * is told to wait for answers first (the connection stays). */
  if (waiting >= dd->cfg->max_client_compiles)
    return fm_diag_set(d, FM_EBUSY,
                       "this connection already has %u compiles waiting (--max-client-compiles %u); "
                       "send more once some are answered",
                       waiting, dd->cfg->max_client_compiles);
  if (!f && (cost = fm_codegen_cost(p->canon)) > dd->cfg->max_compile_cost)
    return fm_diag_set(d, FM_ELIMIT,
                       "fragment too costly to compile: cost %u, over the bound of %u "
                       "(--max-compile-cost; a general pow costs 32, erf 6, an add 1)",
                       cost, dd->cfg->max_compile_cost);
  if (f) {
    if (fm_inflight_join(dd->inflight, f, rq->conn, rq->id, 1)) return fm_diag_set(d, FM_ENOMEM, "out of memory");
    fm_conn_ref(rq->conn);
    fm_daemon_count(dd, FM_STAT_JOINED, 1);
    return FM_OK;
  }
  if (fm_inflight_start(dd->inflight, &p->key, NULL, &f)) return fm_diag_set(d, FM_ENOMEM, "out of memory");
  if (fm_inflight_join(dd->inflight, f, rq->conn, rq->id, 0)) {
    drop_flight(dd, f);
    return fm_diag_set(d, FM_ENOMEM, "out of memory");
  }
  /* Referenced before starting: a build whose every candidate fails to queue answers at once. */
  fm_conn_ref(rq->conn);
  if (dd->remote && dd->remote->remote)
    err = start_remote(dd, p, f, d);
  else
    err = start_build(dd, p, f, d);
  if (err) {
    drop_flight(dd, f);
    fm_conn_unref(rq->conn);
    return err;
  }
  fm_log_debug("%s: %.16s in flight", fm_conn_name(rq->conn), p->hex);
  return FM_OK;
}

/* ---- work nobody waits for (fm_commands.h) ---- */

static int conn_open(const struct fm_conn *c) { return fm_conn_is_open(c); }

typedef struct sweep {
  fm_daemon *dd;
  unsigned cancelled;
} sweep;

static void abandon_flight(fm_flight *f, void *ctx) {
  sweep *sw = ctx;
  char hex[FM_KEY_HEX];
  fm_key_to_hex(&f->key, hex);
  fm_log_debug("every requester of %.16s hung up: its build is cancelled", hex);
  f->cancel(f->job);
  sw->cancelled++;
  /* Out of the table now: a new request for the key starts afresh, and the job, when it
   * ends, finds no flight of its own to answer (flight_of). */
  answer_waiters(fm_inflight_finish(sw->dd->inflight, f), hex, FM_ECLOSED, "", NULL, FM_STATE_UNTUNED);
}

void fm_cmd_sweep_abandoned(fm_daemon *dd) {
  sweep sw = {dd, 0};
  if (!fm_inflight_count(dd->inflight)) return;
  fm_inflight_sweep(dd->inflight, conn_open, abandon_flight, &sw);
  /* One line per sweep, not per build: a client that queues hundreds and hangs up, again
   * and again, must not flood the log. */
  if (sw.cancelled) fm_log_info("cancelled %u build(s) whose requesters all hung up", sw.cancelled);
}

int fm_cmd_compile(fm_request *rq, fm_diag *d) {
  fm_daemon *dd = rq->dd;
  prepared p;
  fm_entry e;
  int err;
  if (dd->stopping) return fm_diag_set(d, FM_ESHUTDOWN, "the daemon is shutting down; compile refused");
  if ((err = prepare(dd, rq->msg, &p, d))) return err;
  if (store_lookup(dd, &p, &e) == FM_OK) {
    fm_daemon_count(dd, FM_STAT_HITS, 1);
    reply_entry(rq->conn, rq->id, &e);
    if (e.state == FM_STATE_VERIFIED) retune_verified(dd, &p);
    fm_entry_free(&e);
    prepared_free(&p);
    return FM_OK;
  }
  fm_daemon_count(dd, FM_STAT_MISSES, 1);
  err = join_or_start(rq, &p, d);
  prepared_free(&p);
  return err;
}

/* A lookup by key has no fragment to compare the entry with (compile does): the key must be
 * the fingerprint of the entry's own canonical fragment on its device, as the key of every
 * entry this daemon writes is. One that is not is removed and counted as corrupt, like a
 * checksum failure: serving it would run another fragment's kernel. */
static int check_key(fm_daemon *dd, const fm_key *key, const fm_entry *e, fm_diag *d) {
  fm_key want;
  fm_diag why = {{0}};
  char hex[FM_KEY_HEX];
  int err = fm_entry_expected_key(&dd->dev, e->device, e->canonical, e->canonical_len, &want, &why);
  if (err == FM_ENOMEM) return fm_diag_set(d, err, "%s", why.text);
  if (err == FM_OK && memcmp(want.bytes, key->bytes, sizeof want.bytes) == 0) return FM_OK;
  fm_key_to_hex(key, hex);
  fm_log_warn("entry %.16s does not hold the fragment its key names (%s); removed", hex,
              err ? why.text : "another fragment's kernel");
  fm_store_evict(dd->store, key);
  fm_store_stat_add(dd->store, FM_STAT_CORRUPT, 1);
  return fm_diag_set(d, FM_ECORRUPT,
                     "the entry under key %.16s holds another fragment's kernel and was removed; "
                     "compile the fragment to rebuild it",
                     hex);
}

static int lookup_by_key(fm_request *rq, const char *hex, size_t hex_len, fm_diag *d) {
  fm_daemon *dd = rq->dd;
  fm_key key;
  fm_entry e;
  if (fm_key_from_hex(hex, hex_len, &key)) return fm_diag_set(d, FM_ESCHEMA, "\"key\" must be 64 hex digits");
  int err = fm_store_get(dd->store, &key, dd->dev.label, 1, &e);
  if (err == FM_ENOT_FOUND) {
    /* The key already covers the device; the store still wants its label, so learn it. */
    char full[FM_KEY_HEX];
    fm_entry meta;
    fm_key_to_hex(&key, full);
    if (fm_store_find_prefix(dd->store, full, &meta) == FM_OK) {
      err = fm_store_get(dd->store, &key, meta.device, 1, &e);
      fm_entry_free(&meta);
    }
  }
  if (err == FM_ENOT_FOUND) return fm_diag_set(d, FM_ENOT_FOUND, "no kernel with key %.*s", (int)hex_len, hex);
  if (err == FM_ECORRUPT)
    return fm_diag_set(d, FM_ECORRUPT,
                       "the entry failed its checksum and was removed; compile the fragment to rebuild it");
  if (err) {
    fm_diag why = {{0}};
    fm_store_last_error(dd->store, &why);
    return fm_diag_set(d, err, "store lookup failed: %s", why.text[0] ? why.text : fm_strerror(err));
  }
  if ((err = check_key(dd, &key, &e, d))) {
    fm_entry_free(&e);
    return err;
  }
  reply_entry(rq->conn, rq->id, &e);
  fm_entry_free(&e);
  return FM_OK;
}

/* lookup never compiles, and is not counted as a hit or miss: those count what the daemon
 * had to build. */
int fm_cmd_lookup(fm_request *rq, fm_diag *d) {
  fm_daemon *dd = rq->dd;
  const char *hex;
  size_t hex_len;
  prepared p;
  fm_entry e;
  int err = fm_msg_get_str(rq->msg, "key", &hex, &hex_len, d);
  if (err == FM_OK) return lookup_by_key(rq, hex, hex_len, d);
  if (err != FM_ENOT_FOUND) return err;
  if (!fm_msg_get(rq->msg, "fragment")) return fm_diag_set(d, FM_ESCHEMA, "lookup needs \"fragment\" or \"key\"");
  if ((err = prepare(dd, rq->msg, &p, d))) return err;
  if (store_lookup(dd, &p, &e) != FM_OK) {
    err = fm_diag_set(d, FM_ENOT_FOUND, "no kernel for this fragment on %s (key %.16s)", p.label, p.hex);
    prepared_free(&p);
    return err;
  }
  reply_entry(rq->conn, rq->id, &e);
  fm_entry_free(&e);
  prepared_free(&p);
  return FM_OK;
}
