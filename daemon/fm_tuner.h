/* fm_tuner.h: the tuning queue: verify and time every compiled candidate of a fragment on the
 * GPU, pick the fastest that verified, store it.
 *
 * Flow (GPU mode, or any mode with --tuner-worker): a miss compiles ALL candidates
 * (fm_codegen_candidates) in parallel on the libuv pool (fm_cmd_kernel.c), then the job
 * comes here. Tuning is serialised per GPU: one tuner thread owns the worker process
 * (fm_tuner_worker.h) and runs one job at a time with blocking I/O and a deadline per
 * candidate; a finished job goes back to the loop thread through uv_async and its done
 * callback answers the waiters.
 *
 * Per job: prepare the worker for the fragment (fresh random inputs, the fp64 reference),
 * then one run request per candidate, the default first. Verdicts:
 *   ok | wrong | load_failed | launch_failed   as the worker says (launch_failed: it exits
 *                                              and is restarted for the next candidate)
 *   timeout   no answer by the deadline: SIGKILL, reap, restart
 *             (deadline = tune_deadline_s + 50x the default candidate's time)
 *   fault     the worker died mid-request (EOF), or answered nonsense
 *   compile_failed   NVRTC refused it (never sent to the worker)
 * The winner (fastest ok) is stored state tuned; its timings blob (msgpack) lists every
 * candidate:
 *   {chosen: i (-1: none), default_ms: f64 (-1: n/a), tune_ms: f64, device: str,
 *    candidates: [{candidate: str (fm_candidate_describe), params: [tmpl, p0..p7],
 *                  verdict: str, rel_err: f64, ms: f64 (-1: not timed), detail: str,
 *                  wall_ms: f64 (the worker's whole answer: load, verify, time; -1: not sent)}]}
 * With none verified the default candidate is stored state bad (never served: the client
 * runs the fragment eagerly) with the same timings. If the worker cannot run at all (no GPU
 * in it, missing executable), nothing is judged: the default is stored untuned as in
 * compile-only mode and the reason logged. Every restart counts FM_STAT_WORKER_RESTARTS, every
 * candidate that is not ok (compile failures aside) FM_STAT_BAD_CANDIDATES, every judged job
 * (tuned or bad, not the untuned fallback) FM_STAT_TUNES; the loop thread counts them from
 * the job's fields.
 *
 * A round may judge some candidates only (`judge`, a bit per candidate): serving first
 * (--tune background) judges the one candidate the reply will carry. Its winner is stored in
 * state verified; if none of them verifies nothing is stored (the caller judges the rest).
 * A background round waits behind every foreground job, and between two of its candidates
 * the tuner thread runs the foreground jobs that came meanwhile (the worker prepares the
 * background fragment again afterwards): a foreground job waits for at most one background
 * candidate. fm_tuner_stop ends a background round at its next candidate, storing nothing
 * (`stopped`). */
#ifndef FM_TUNER_H
#define FM_TUNER_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "fm_compile.h"
#include "fm_error.h"
#include "fm_store.h"

/* Timed per fragment: the default, the cuBLASLt plan and the 16 wgmma + 16 mma.sync GEMM
 * candidates all fit. */
#define FM_TUNE_MAX_CANDIDATES     33
#define FM_TUNE_DEFAULT_DEADLINE_S 5
#define FM_TUNE_PREPARE_MS         120000 /* inputs + fp64 reference for ~64M elements */
#define FM_TUNE_READY_MS           60000  /* worker start: CUDA init */

typedef enum {
  FM_VERDICT_PENDING = 0,
  FM_VERDICT_OK,
  FM_VERDICT_WRONG,
  FM_VERDICT_LOAD_FAILED,
  FM_VERDICT_LAUNCH_FAILED,
  FM_VERDICT_TIMEOUT,
  FM_VERDICT_FAULT,
  FM_VERDICT_COMPILE_FAILED,
} fm_verdict;

const char *fm_verdict_name(fm_verdict v);
/* FM_VERDICT_PENDING for an unknown name. */
fm_verdict fm_verdict_parse(const char *s, size_t len);

typedef struct fm_tune_result {
  fm_verdict verdict;
  double rel_err; /* -1 when not verified */
  double ms;      /* -1 when not timed */
  double wall_ms; /* the worker's whole answer (load, verify, time), -1: not sent */
  char detail[256];
} fm_tune_result;

typedef struct fm_tune_job fm_tune_job;
typedef void (*fm_tune_done_fn)(fm_tune_job *job);

struct fm_tune_job {
  fm_tune_job *next; /* queue link */
  /* inputs: the compiled candidates (owned; cands[0] is the default) */
  fm_compile_job *cands[FM_TUNE_MAX_CANDIDATES];
  size_t n;
  size_t pending;       /* compiles still running (loop thread) */
  uint64_t judge;       /* bit i: this round judges cands[i]; 0: every candidate */
  uint64_t compiled;    /* bit i: cands[i] went through its compile (loop thread) */
  int background;       /* queued behind foreground jobs, yielding to them */
  unsigned keep_states; /* an entry stored meanwhile in one of these states is kept
                                   (FM_STATE_BIT mask, fm_store_put_unless); 0: replaced */
  fm_store *store;      /* NULL: do not store */
  fm_tune_done_fn done;
  void *ctx;
  /* results (tuner thread, read by done on the loop thread) */
  fm_tune_result res[FM_TUNE_MAX_CANDIDATES];
  int winner;       /* index into cands, -1: none */
  int tuned;        /* 1: candidates were judged; 0: worker unavailable (untuned) */
  fm_diag diag;     /* why not tuned / why none verified */
  uint8_t *timings; /* the blob stored (malloc'd) */
  size_t timings_len;
  int store_err;
  fm_diag store_diag;
  int kept;               /* the state of an entry keep_states kept, -1: stored */
  uint64_t bg_mark;       /* (the tuner's) background candidates started before it queued */
  uint32_t waited_behind; /* foreground: background candidates started while it waited */
  int stopped;            /* the tuner stopped mid-round: nothing judged further, nothing stored */
  double tune_ms;
  double prepare_ms;      /* of tune_ms, the worker's prepare (inputs, the fp64 reference) */
  uint32_t restarts, bad; /* for the counters */
};

/* Whether the job's round judges cands[i] (judge). */
int fm_tune_job_judges(const fm_tune_job *j, size_t i);

/* A job owning no candidates yet; add compile jobs to cands[] (n). FM_ENOMEM. */
int fm_tune_job_new(fm_tune_job **out);
void fm_tune_job_free(fm_tune_job *job);

typedef struct fm_tuner fm_tuner;

typedef struct fm_tuner_opts {
  const char *worker_exe; /* fusemld-tuner or a stand-in */
  double deadline_s;      /* base per-candidate deadline (s); 0: the default 5 */
  uint64_t seed;          /* input seed (0: time-based per job) */
} fm_tuner_opts;

/* Starts the tuner thread (the worker starts lazily, with the first job). done callbacks run
 * on loop's thread. */
int fm_tuner_new(uv_loop_t *loop, const fm_tuner_opts *opts, fm_tuner **out, fm_diag *d);
/* Queues a job (loop thread): behind the other foreground jobs, or with job->background set
 * behind every job. */
void fm_tuner_submit(fm_tuner *t, fm_tune_job *job, fm_tune_done_fn done, void *ctx);
/* Stops the thread after the job it is running, or the background candidate it is running
 * (queued ones are dropped: their done is never called), stops the worker and closes the async handle (the loop must run once more to
 * finish the close). Then fm_tuner_free. */
void fm_tuner_stop(fm_tuner *t);
void fm_tuner_free(fm_tuner *t);

/* The synchronous body of one job on a worker the caller owns (the tuner thread's, or a
 * test's): judges the round's candidates, picks the winner, builds the timings, stores. */
struct fm_tworker;
void fm_tuner_run_job(struct fm_tworker *w, const fm_tuner_opts *opts, fm_tune_job *job);

#endif
