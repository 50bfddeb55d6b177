/* fm_tuner.c: the tuning queue and the judging of one fragment's candidates (fm_tuner.h). */
#include "fm_tuner.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fm_codegen.h"
#include "fm_log.h"
#include "fm_msg.h"
#include "fm_tuner_worker.h"

static const char *const verdict_names[] = {
    [FM_VERDICT_PENDING] = "pending",
    [FM_VERDICT_OK] = "ok",
    [FM_VERDICT_WRONG] = "wrong",
    [FM_VERDICT_LOAD_FAILED] = "load_failed",
    [FM_VERDICT_LAUNCH_FAILED] = "launch_failed",
    [FM_VERDICT_TIMEOUT] = "timeout",
    [FM_VERDICT_FAULT] = "fault",
    [FM_VERDICT_COMPILE_FAILED] = "compile_failed",
};

const char *fm_verdict_name(fm_verdict v) {
  if ((unsigned)v >= sizeof verdict_names / sizeof verdict_names[0]) return "unknown";
  return verdict_names[v];
}

fm_verdict fm_verdict_parse(const char *s, size_t len) {
  for (size_t v = 1; v < sizeof verdict_names / sizeof verdict_names[0]; v++)
    if (strlen(verdict_names[v]) == len && memcmp(verdict_names[v], s, len) == 0) return (fm_verdict)v;
  return FM_VERDICT_PENDING;
}

int fm_tune_job_new(fm_tune_job **out) {
  fm_tune_job *j = calloc(1, sizeof *j);
  if (!j) return FM_ENOMEM;
  j->winner = -1;
  j->kept = -1;
  *out = j;
  return FM_OK;
}

void fm_tune_job_free(fm_tune_job *job) {
  if (!job) return;
  for (size_t i = 0; i < job->n; i++) fm_compile_job_free(job->cands[i]);
  free(job->timings);
  free(job);
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* ---- judging one job ---- */

/* Per-job state of the conversation with the worker. */
typedef struct session {
  fm_tworker *w;
  const fm_tuner_opts *opts;
  fm_tune_job *job;
  uint64_t seed;
  int prepared; /* the running worker holds this fragment's inputs */
  int lost;     /* the worker was killed or died: the next start is a restart */
  /* Called before each candidate of a background round: runs the foreground jobs waiting;
   * returns 1 if it ran any (the worker holds their inputs now), 0 if none, -1 to stop. */
  int (*yield)(void *ctx);
  void *yield_ctx;
} session;

int fm_tune_job_judges(const fm_tune_job *j, size_t i) { return !j->judge || ((j->judge >> i) & 1u); }

static void pack_begin(msgpack_sbuffer *sb, msgpack_packer *pk) {
  msgpack_sbuffer_init(sb);
  msgpack_packer_init(pk, sb, msgpack_sbuffer_write);
}

/* Starts the worker if needed. FM_OK, or the reason it cannot run. */
static int ensure_worker(session *s, fm_diag *d) {
  if (fm_tworker_running(s->w)) return FM_OK;
  int err = fm_tworker_start(s->w, FM_TUNE_READY_MS, d);
  if (err) return err;
  s->prepared = 0;
  if (s->lost) {
    s->job->restarts++;
    s->lost = 0;
  }
  return FM_OK;
}

/* Sends prepare for the job's fragment. FM_OK; FM_EUNSUPPORTED (the worker cannot set it up:
 * reason in d); a worker failure (it was killed). */
static int prepare(session *s, fm_diag *d) {
  const fm_compile_job *c0 = s->job->cands[0];
  msgpack_sbuffer sb;
  msgpack_packer pk;
  msgpack_zone zone;
  msgpack_object reply;
  uint64_t id = s->w->next_id++;
  pack_begin(&sb, &pk);
  msgpack_pack_map(&pk, 4);
  fm_pack_kv_cstr(&pk, "op", "prepare");
  fm_pack_kv_u64(&pk, "id", id);
  fm_pack_cstr(&pk, "canonical");
  fm_pack_bin(&pk, c0->canonical, c0->canonical_len);
  fm_pack_kv_u64(&pk, "seed", s->seed);
  msgpack_zone_init(&zone, 4096);
  int err = sb.data ? fm_tworker_call(s->w, (const uint8_t *)sb.data, sb.size, id, FM_TUNE_PREPARE_MS, &zone, &reply, d)
                    : fm_diag_set(d, FM_ENOMEM, "out of memory");
  if (err == FM_OK) {
    bool ok = false;
    char detail[512] = "";
    fm_msg_get_bool(&reply, "ok", &ok, NULL);
    fm_msg_copy_str(&reply, "detail", detail, sizeof detail, NULL);
    if (!ok)
      err = fm_diag_set(d, FM_EUNSUPPORTED, "the tuner worker cannot prepare the fragment: %s", detail);
    else
      s->prepared = 1;
  } else if (err != FM_ENOMEM) {
    fm_tworker_kill(s->w);
    s->lost = 1;
  }
  msgpack_zone_destroy(&zone);
  msgpack_sbuffer_destroy(&sb);
  return err;
}

/* One run request: fills r. Returns FM_OK when the candidate was judged (any verdict). */
static void run_one(session *s, size_t i, double deadline_ms, fm_tune_result *r) {
  fm_compile_job *c = s->job->cands[i];
  msgpack_sbuffer sb;
  msgpack_packer pk;
  msgpack_zone zone;
  msgpack_object reply;
  fm_diag d = {{0}};
  uint64_t id = s->w->next_id++;
  pack_begin(&sb, &pk);
  msgpack_pack_map(&pk, 5);
  fm_pack_kv_cstr(&pk, "op", "run");
  fm_pack_kv_u64(&pk, "id", id);
  fm_pack_kv_u64(&pk, "index", i);
  fm_pack_cstr(&pk, "cubin");
  fm_pack_bin(&pk, c->cubin, c->cubin_len);
  fm_pack_cstr(&pk, "meta");
  msgpack_sbuffer_write(&sb, (const char *)c->meta_bytes, c->meta_len);
  msgpack_zone_init(&zone, 4096);
  double t0 = now_ms();
  int err = sb.data ? fm_tworker_call(s->w, (const uint8_t *)sb.data, sb.size, id, (int)deadline_ms, &zone, &reply, &d)
                    : fm_diag_set(&d, FM_ENOMEM, "out of memory");
  r->wall_ms = now_ms() - t0;
  if (err == FM_OK) {
    const char *v;
    size_t vlen;
    if (fm_msg_get_str(&reply, "verdict", &v, &vlen, NULL) == FM_OK) r->verdict = fm_verdict_parse(v, vlen);
    if (r->verdict == FM_VERDICT_PENDING || r->verdict == FM_VERDICT_TIMEOUT ||
        r->verdict == FM_VERDICT_COMPILE_FAILED) {
      r->verdict = FM_VERDICT_FAULT;
      snprintf(r->detail, sizeof r->detail, "the tuner worker answered without a known verdict");
      fm_tworker_kill(s->w);
      s->lost = 1;
    } else {
      fm_msg_get_f64(&reply, "rel_err", &r->rel_err, NULL);
      fm_msg_get_f64(&reply, "ms", &r->ms, NULL);
      fm_msg_copy_str(&reply, "detail", r->detail, sizeof r->detail, NULL);
      if (r->verdict == FM_VERDICT_OK && !(r->ms > 0)) {
        r->verdict = FM_VERDICT_FAULT;
        snprintf(r->detail, sizeof r->detail, "ok without a positive time");
      }
      /* A cuBLASLt plan comes back with the algorithm the worker chose: it is the plan. */
      const uint8_t *algo;
      size_t algo_len;
      if (r->verdict == FM_VERDICT_OK && c->meta.blas.form[0] && !c->meta.blas.has_algo &&
          (fm_msg_get_bin(&reply, "algo", &algo, &algo_len, NULL) != FM_OK ||
           fm_compile_job_set_algo(c, algo, algo_len) != FM_OK)) {
        r->verdict = FM_VERDICT_FAULT;
        snprintf(r->detail, sizeof r->detail, "a cuBLASLt plan verified without a usable algorithm");
      }
    }
    if (r->verdict == FM_VERDICT_LAUNCH_FAILED) {
      /* Its context is gone: it exits by itself; reap it (killing it if it lingers). */
      fm_tworker_stop(s->w, 2000);
      s->lost = 1;
    }
  } else if (err == FM_ETIMEOUT) {
    r->verdict = FM_VERDICT_TIMEOUT;
    snprintf(r->detail, sizeof r->detail, "%.230s; worker killed", d.text);
    fm_tworker_kill(s->w);
    s->lost = 1;
  } else {
    r->verdict = FM_VERDICT_FAULT;
    snprintf(r->detail, sizeof r->detail, "%.250s", d.text);
    fm_tworker_kill(s->w);
    s->lost = 1;
  }
  msgpack_zone_destroy(&zone);
  msgpack_sbuffer_destroy(&sb);
}

static void pack_timings(fm_tune_job *j, double default_ms, const char *device) {
  msgpack_sbuffer sb;
  msgpack_packer pk;
  char desc[160];
  pack_begin(&sb, &pk);
  msgpack_pack_map(&pk, 5);
  fm_pack_kv_i64(&pk, "chosen", j->winner);
  fm_pack_kv_f64(&pk, "default_ms", default_ms);
  fm_pack_kv_f64(&pk, "tune_ms", j->tune_ms);
  fm_pack_kv_cstr(&pk, "device", device);
  fm_pack_cstr(&pk, "candidates");
  msgpack_pack_array(&pk, (uint32_t)j->n);
  for (size_t i = 0; i < j->n; i++) {
    const fm_tune_result *r = &j->res[i];
    const fm_candidate *c = &j->cands[i]->cand;
    fm_candidate_describe(c, desc, sizeof desc);
    msgpack_pack_map(&pk, 7);
    fm_pack_kv_cstr(&pk, "candidate", desc);
    fm_pack_cstr(&pk, "params");
    msgpack_pack_array(&pk, 1 + FM_CANDIDATE_PARAMS);
    msgpack_pack_uint32(&pk, (uint32_t)c->tmpl);
    for (int k = 0; k < FM_CANDIDATE_PARAMS; k++) msgpack_pack_uint32(&pk, c->p[k]);
    fm_pack_kv_cstr(&pk, "verdict", fm_verdict_name(r->verdict));
    fm_pack_kv_f64(&pk, "rel_err", r->rel_err);
    fm_pack_kv_f64(&pk, "ms", r->ms);
    fm_pack_kv_cstr(&pk, "detail", r->detail);
    fm_pack_kv_f64(&pk, "wall_ms", r->wall_ms);
  }
  if (sb.data) {
    j->timings_len = sb.size;
    j->timings = (uint8_t *)msgpack_sbuffer_release(&sb);
  }
  msgpack_sbuffer_destroy(&sb);
}

static void store_result(fm_tune_job *j, const fm_compile_job *c, fm_kstate state) {
  char hex[FM_KEY_HEX];
  fm_entry e;
  if (!j->store) return;
  fm_compile_job_entry(c, state, &e);
  e.timings = j->timings;
  e.timings_len = j->timings_len;
  /* One transaction: the entry served until now stays whole until the new one replaces it. */
  j->store_err = fm_store_put_unless(j->store, &e, j->keep_states, &j->kept);
  if (j->store_err) {
    fm_diag why = {{0}};
    fm_store_last_error(j->store, &why);
    fm_key_to_hex(&c->key, hex);
    fm_diag_set(&j->store_diag, j->store_err, "cannot store kernel %.16s: %s", hex,
                why.text[0] ? why.text : fm_strerror(j->store_err));
  }
}

static void run_job(fm_tworker *w, const fm_tuner_opts *opts, fm_tune_job *j, int (*yield)(void *), void *yield_ctx) {
  double t0 = now_ms(), default_ms = -1;
  double base_ms = (opts->deadline_s > 0 ? opts->deadline_s : FM_TUNE_DEFAULT_DEADLINE_S) * 1000.0;
  session s = {.w = w, .opts = opts, .job = j, .yield = yield, .yield_ctx = yield_ctx};
  int first_compiled = -1, err = FM_OK;

  s.seed = opts->seed ? opts->seed : (uint64_t)time(NULL) ^ ((uint64_t)(uintptr_t)j << 7);
  j->winner = -1;
  j->tuned = 1;
  j->kept = -1;
  j->stopped = 0;
  j->restarts = j->bad = 0; /* counted per round by the loop thread */
  j->prepare_ms = 0;
  free(j->timings); /* an earlier round's (the one candidate served first) */
  j->timings = NULL;
  j->timings_len = 0;
  for (size_t i = 0; i < j->n; i++) {
    fm_tune_result *r = &j->res[i];
    r->verdict = FM_VERDICT_PENDING;
    r->rel_err = r->ms = r->wall_ms = -1;
    if (!fm_tune_job_judges(j, i)) continue;
    if (j->cands[i]->err) {
      r->verdict = FM_VERDICT_COMPILE_FAILED;
      snprintf(r->detail, sizeof r->detail, "%.250s", j->cands[i]->diag.text);
    } else if (first_compiled < 0) {
      first_compiled = (int)i;
    }
  }
  if (first_compiled < 0) {
    j->tuned = 0;
    fm_diag_set(&j->diag, FM_ECOMPILE, "no candidate compiled");
    goto out;
  }

  for (size_t i = 0; i < j->n; i++) {
    fm_tune_result *r = &j->res[i];
    fm_diag d = {{0}};
    if (!fm_tune_job_judges(j, i) || r->verdict == FM_VERDICT_COMPILE_FAILED) continue;
    int yielded = s.yield ? s.yield(s.yield_ctx) : 0;
    if (yielded < 0) {
      j->stopped = 1;
      j->tune_ms = now_ms() - t0;
      return;
    }
    if (yielded) s.prepared = 0; /* the worker holds a foreground fragment's inputs now */
    if ((err = ensure_worker(&s, &d)) == FM_OK && !s.prepared) {
      double p0 = now_ms();
      err = prepare(&s, &d);
      j->prepare_ms += now_ms() - p0;
    }
    if (err) {
      /* The worker cannot run this fragment at all: nothing was judged, serve untuned. A
       * failure after some candidates ran is charged to the candidate at hand. */
      if (i == (size_t)first_compiled || err == FM_EUNSUPPORTED || err == FM_ENOGPU) {
        j->tuned = 0;
        fm_diag_set(&j->diag, err, "%s", d.text);
        goto out;
      }
      r->verdict = FM_VERDICT_FAULT;
      snprintf(r->detail, sizeof r->detail, "cannot restart the tuner worker: %.200s", d.text);
      j->bad++;
      continue;
    }
    /* The default candidate's time scales the deadline: a candidate 50x slower than the
     * heuristic is not worth waiting for, and a hang is cut off in bounded time. */
    run_one(&s, i, base_ms + (default_ms > 0 ? 50.0 * default_ms : 0), r);
    if (r->verdict != FM_VERDICT_OK) j->bad++;
    if ((int)i == first_compiled && r->verdict == FM_VERDICT_OK) default_ms = r->ms;
    if (r->verdict == FM_VERDICT_OK && (j->winner < 0 || r->ms < j->res[j->winner].ms)) j->winner = (int)i;
  }

out:
  j->tune_ms = now_ms() - t0;
  if (!j->tuned) {
    /* A background round leaves the verified entry it would have replaced. */
    if (!j->background) store_result(j, j->cands[first_compiled >= 0 ? first_compiled : 0], FM_STATE_UNTUNED);
    return;
  }
  pack_timings(j, default_ms, w->device);
  if (j->winner >= 0) {
    store_result(j, j->cands[j->winner], j->judge ? FM_STATE_VERIFIED : FM_STATE_TUNED);
  } else {
    /* Summarise the verdicts for the error reply: the client falls back to eager. */
    char *p = j->diag.text;
    size_t cap = sizeof j->diag.text, used;
    used = (size_t)snprintf(p, cap, "no candidate verified:");
    for (size_t i = 0; i < j->n && used < cap; i++)
      if (fm_tune_job_judges(j, i))
        used += (size_t)snprintf(p + used, cap - used, " %s", fm_verdict_name(j->res[i].verdict));
    /* Some candidates only: the others may still verify (the caller judges them next). */
    if (!j->judge) store_result(j, j->cands[first_compiled], FM_STATE_BAD);
  }
}

void fm_tuner_run_job(fm_tworker *w, const fm_tuner_opts *opts, fm_tune_job *j) { run_job(w, opts, j, NULL, NULL); }

/* ---- the tuner thread ---- */

struct fm_tuner {
  uv_loop_t *loop;
  uv_async_t async;
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  fm_tune_job *queue, **queue_tail;
  fm_tune_job *bg_queue, **bg_queue_tail; /* background jobs: after every foreground one */
  fm_tune_job *done, **done_tail;
  uint64_t bg_candidates; /* background candidates started (what a foreground job waits for) */
  int stop, thread_started, async_ready;
  fm_tuner_opts opts;
  char exe[4096];
  fm_tworker worker;
};

/* The first job of a queue, taken out (mu held). */
static fm_tune_job *pop(fm_tuner *t, fm_tune_job **head, fm_tune_job ***tail) {
  fm_tune_job *j = *head;
  *head = j->next;
  if (!*head) *tail = head;
  j->next = NULL;
  j->waited_behind = (uint32_t)(t->bg_candidates - j->bg_mark);
  return j;
}

/* A finished job, for the loop thread (mu held). */
static void finished(fm_tuner *t, fm_tune_job *j) {
  *t->done_tail = j;
  t->done_tail = &j->next;
  uv_async_send(&t->async);
}

/* Between two candidates of a background round: the foreground jobs first (session.yield). */
static int yield_to_foreground(void *arg) {
  fm_tuner *t = arg;
  int ran = 0;
  pthread_mutex_lock(&t->mu);
  while (!t->stop && t->queue) {
    fm_tune_job *j = pop(t, &t->queue, &t->queue_tail);
    pthread_mutex_unlock(&t->mu);
    fm_tuner_run_job(&t->worker, &t->opts, j);
    pthread_mutex_lock(&t->mu);
    finished(t, j);
    ran = 1;
  }
  int stop = t->stop;
  if (!stop) t->bg_candidates++; /* the caller runs its next candidate now */
  pthread_mutex_unlock(&t->mu);
  return stop ? -1 : ran;
}

static void *tuner_main(void *arg) {
  fm_tuner *t = arg;
  pthread_mutex_lock(&t->mu);
  for (;;) {
    while (!t->stop && !t->queue && !t->bg_queue) pthread_cond_wait(&t->cv, &t->mu);
    if (t->stop) break;
    fm_tune_job *j = t->queue ? pop(t, &t->queue, &t->queue_tail) : pop(t, &t->bg_queue, &t->bg_queue_tail);
    pthread_mutex_unlock(&t->mu);

    run_job(&t->worker, &t->opts, j, j->background ? yield_to_foreground : NULL, t);

    pthread_mutex_lock(&t->mu);
    finished(t, j);
  }
  pthread_mutex_unlock(&t->mu);
  return NULL;
}

static void on_async(uv_async_t *h) {
  fm_tuner *t = h->data;
  pthread_mutex_lock(&t->mu);
  fm_tune_job *j = t->done;
  t->done = NULL;
  t->done_tail = &t->done;
  pthread_mutex_unlock(&t->mu);
  while (j) {
    fm_tune_job *next = j->next;
    j->next = NULL;
    j->done(j);
    j = next;
  }
}

int fm_tuner_new(uv_loop_t *loop, const fm_tuner_opts *opts, fm_tuner **out, fm_diag *d) {
  fm_tuner *t = calloc(1, sizeof *t);
  if (!t) return fm_diag_set(d, FM_ENOMEM, "out of memory");
  t->loop = loop;
  t->opts = *opts;
  snprintf(t->exe, sizeof t->exe, "%s", opts->worker_exe ? opts->worker_exe : "");
  t->opts.worker_exe = t->exe;
  t->queue_tail = &t->queue;
  t->bg_queue_tail = &t->bg_queue;
  t->done_tail = &t->done;
  fm_tworker_init(&t->worker, t->exe);
  pthread_mutex_init(&t->mu, NULL);
  pthread_cond_init(&t->cv, NULL);
  if (uv_async_init(loop, &t->async, on_async) != 0) {
    fm_tuner_free(t);
    return fm_diag_set(d, FM_EIO, "cannot create the tuner's wake-up handle");
  }
  t->async.data = t;
  t->async_ready = 1;
  /* The async handle must not keep the loop alive by itself: jobs_running does that. */
  uv_unref((uv_handle_t *)&t->async);
  if (pthread_create(&t->thread, NULL, tuner_main, t) != 0) {
    fm_tuner_stop(t);
    *out = t; /* the caller frees it after the loop closed the handle */
    return fm_diag_set(d, FM_EIO, "cannot start the tuner thread");
  }
  t->thread_started = 1;
  *out = t;
  return FM_OK;
}

void fm_tuner_submit(fm_tuner *t, fm_tune_job *job, fm_tune_done_fn done, void *ctx) {
  job->done = done;
  job->ctx = ctx;
  job->next = NULL;
  pthread_mutex_lock(&t->mu);
  job->bg_mark = t->bg_candidates;
  if (job->background) {
    *t->bg_queue_tail = job;
    t->bg_queue_tail = &job->next;
  } else {
    *t->queue_tail = job;
    t->queue_tail = &job->next;
  }
  pthread_cond_signal(&t->cv);
  pthread_mutex_unlock(&t->mu);
}

void fm_tuner_stop(fm_tuner *t) {
  if (!t) return;
  pthread_mutex_lock(&t->mu);
  t->stop = 1;
  pthread_cond_signal(&t->cv);
  pthread_mutex_unlock(&t->mu);
  if (t->thread_started) pthread_join(t->thread, NULL);
  t->thread_started = 0;
  fm_tworker_stop(&t->worker, 2000);
  if (t->async_ready && !uv_is_closing((uv_handle_t *)&t->async)) uv_close((uv_handle_t *)&t->async, NULL);
}

void fm_tuner_free(fm_tuner *t) {
  if (!t) return;
  fm_tuner_stop(t);
  for (fm_tune_job *lists[3] = {t->queue, t->bg_queue, t->done}, **l = lists; l < lists + 3; l++) {
    while (*l) {
      fm_tune_job *next = (*l)->next;
      fm_tune_job_free(*l);
      *l = next;
    }
  }
  pthread_mutex_destroy(&t->mu);
  pthread_cond_destroy(&t->cv);
  free(t);
}
