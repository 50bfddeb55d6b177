/* fm_compile.h: one compile job, run on a libuv worker thread (uv_queue_work).
 *
 * The loop thread has already decoded, validated and canonicalized the fragment and computed
 * its key. The worker generates the kernel with the heuristic (untuned) configuration,
 * compiles it with NVRTC and stores it (fm_store_put, state untuned). The done callback runs
 * back on the loop thread. A job whose store put failed (disk full) still carries the
 * compiled kernel: the requests are answered, only the caching was lost.
 *
 * With job->nvrtc set, NVRTC runs in a child process (fm_nvrtc_child.h): killed at the
 * compile deadline (err FM_ECOMPILE_TIMEOUT), on cancel, or bounded in memory. */
#ifndef FM_COMPILE_H
#define FM_COMPILE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "fm_codegen.h"
#include "fm_error.h"
#include "fm_fingerprint.h"
#include "fm_fragment.h"
#include "fm_meta.h"
#include "fm_nvrtc_child.h"
#include "fm_store.h"

typedef struct fm_compile_job fm_compile_job;
typedef void (*fm_compile_done_fn)(fm_compile_job *job);

struct fm_compile_job {
  uv_work_t work;
  /* inputs, owned by the job */
  fm_fragment canon;
  uint8_t *canonical;
  size_t canonical_len;
  fm_key key;
  fm_device_id device;
  char label[192]; /* fm_device_label(device): the store's device column */
  fm_store *store; /* NULL: do not store */
  int has_cand;    /* 1: build `cand` (a tuning candidate), 0: the default */
  fm_candidate cand;
  const fm_nvrtc_limits *nvrtc; /* NVRTC in a killable child with these limits; NULL: in this
                                     process, unbounded (tests of codegen alone) */
  fm_compile_done_fn done;
  void *ctx; /* the caller's */
  /* Set by the loop thread when nobody waits for the result any more: a job that has not
   * started skips everything, one inside NVRTC has its worker killed (err FM_ECLOSED). A job
   * past NVRTC finishes (nearly done: its store is kept). */
  atomic_int cancel;
  /* fm_compile_queue's, while the job waits for a worker there */
  struct fm_compile_job *queue_next;
  fm_compile_done_fn queue_done;
  void *queue_ctx;
  int queue_background; /* waits in the background line */
  /* results */
  int err;      /* FM_OK, or why the kernel could not be built */
  fm_diag diag; /* the reason, for err */
  char *log;    /* NVRTC's log on FM_ECOMPILE (malloc'd, may be NULL) */
  char *source;
  fm_kernel_meta meta;
  uint8_t *meta_bytes; /* fm_meta_pack */
  size_t meta_len;
  uint8_t *cubin;
  size_t cubin_len;
  int store_err; /* FM_OK if stored */
  fm_diag store_diag;
  double compile_ms; /* codegen + NVRTC wall time */
};

/* A job for canon (copied); canonical bytes are copied. FM_ENOMEM. */
int fm_compile_job_new(const fm_fragment *canon, const uint8_t *canonical, size_t canonical_len, const fm_key *key,
                       const fm_device_id *device, fm_store *store, fm_compile_job **out);
void fm_compile_job_free(fm_compile_job *job);

/* Queues the job on loop's thread pool; done(job) runs on the loop thread when it ends
 * (and owns the job from then on). A negative libuv-mapped fm_err if it could not be queued. */
int fm_compile_submit(uv_loop_t *loop, fm_compile_job *job, fm_compile_done_fn done, void *ctx);

/* The synchronous body (what the worker runs), exposed for tests. */
void fm_compile_run(fm_compile_job *job);

/* Records the cuBLASLt algorithm the tuner chose for a plan (kind "cublaslt"; len 64) in the
 * job's metadata and its packed bytes. FM_EINVAL for anything else, FM_ENOMEM. */
int fm_compile_job_set_algo(fm_compile_job *j, const uint8_t *algo, size_t len);

/* The cache entry for a finished job's kernel in `state` (no timings; buffers borrowed from
 * the job, valid while it lives). One place, so untuned and tuned entries cannot drift. */
void fm_compile_job_entry(const fm_compile_job *job, fm_kstate state, fm_entry *e);

#endif
