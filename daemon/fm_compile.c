/* fm_compile.c: codegen -> NVRTC -> store, on a worker thread. */
#include "fm_compile.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fm_codegen.h"
#include "fm_nvrtc.h"

int fm_compile_job_new(const fm_fragment *canon, const uint8_t *canonical, size_t canonical_len, const fm_key *key,
                       const fm_device_id *device, fm_store *store, fm_compile_job **out) {
  fm_compile_job *j = calloc(1, sizeof *j);
  if (!j) return FM_ENOMEM;
  j->canonical = malloc(canonical_len ? canonical_len : 1);
  if (!j->canonical) {
    free(j);
    return FM_ENOMEM;
  }
  memcpy(j->canonical, canonical, canonical_len);
  j->canonical_len = canonical_len;
  j->canon = *canon;
  j->key = *key;
  j->device = *device;
  fm_device_label(device, j->label, sizeof j->label);
  j->store = store;
  j->store_err = FM_OK;
  *out = j;
  return FM_OK;
}

void fm_compile_job_free(fm_compile_job *job) {
  if (!job) return;
  free(job->canonical);
  free(job->log);
  free(job->source);
  free(job->meta_bytes);
  free(job->cubin);
  free(job);
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* Packs the metadata once, so the store and every reply share the same bytes. */
static int pack_meta(fm_compile_job *j) {
  msgpack_sbuffer sb;
  msgpack_packer pk;
  msgpack_sbuffer_init(&sb);
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  int err = fm_meta_pack(&j->meta, &pk);
  if (err || !sb.data) {
    msgpack_sbuffer_destroy(&sb);
    return err ? err : FM_ENOMEM;
  }
  free(j->meta_bytes);
  j->meta_len = sb.size;
  j->meta_bytes = (uint8_t *)msgpack_sbuffer_release(&sb);
  return FM_OK;
}

int fm_compile_job_set_algo(fm_compile_job *j, const uint8_t *algo, size_t len) {
  if (!j || !algo || len != FM_META_ALGO_BYTES || !j->meta.blas.form[0]) return FM_EINVAL;
  memcpy(j->meta.blas.algo, algo, FM_META_ALGO_BYTES);
  j->meta.blas.has_algo = 1;
  return pack_meta(j);
}

void fm_compile_job_entry(const fm_compile_job *j, fm_kstate state, fm_entry *e) {
  memset(e, 0, sizeof *e);
  e->key = j->key;
  snprintf(e->device, sizeof e->device, "%s", j->label);
  snprintf(e->kind, sizeof e->kind, "%s", j->meta.kind);
  e->canonical = j->canonical;
  e->canonical_len = j->canonical_len;
  e->cubin = j->cubin;
  e->cubin_len = j->cubin_len;
  e->meta = j->meta_bytes;
  e->meta_len = j->meta_len;
  e->source = j->source;
  e->state = state;
  e->created = e->last_used = (int64_t)time(NULL);
}

void fm_compile_run(fm_compile_job *j) {
  double t0 = now_ms();
  if (atomic_load(&j->cancel)) {
    /* Dropped before it started: every requester hung up while it was queued. */
    j->err = fm_diag_set(&j->diag, FM_ECLOSED, "dropped before it started: nobody waits for it any more");
    return;
  }
  char key_hex[FM_KEY_HEX], name[32];
  fm_key_to_hex(&j->key, key_hex);
  /* The NVRTC program name shows up in its log: make it the key's prefix so the log can be
   * matched to `fusectl show`. */
  snprintf(name, sizeof name, "fm_%.16s.cu", key_hex);

  fm_candidate cand;
  if (j->has_cand)
    cand = j->cand;
  else
    j->err = fm_codegen_default(&j->canon, &cand, &j->diag);
  if (!j->err) j->err = fm_codegen_generate(&j->canon, &cand, j->device.sm_count, &j->source, &j->meta, &j->diag);
  if (j->err) {
    if (!j->diag.text[0]) fm_diag_set(&j->diag, j->err, "code generation failed: %s", fm_strerror(j->err));
    goto out;
  }
  /* A direct cuBLASLt plan has no kernel: nothing to compile, an empty CUBIN. */
  if (j->source && j->nvrtc) {
    fm_diag why = {{0}};
    j->err = fm_nvrtc_child_compile(j->nvrtc, j->source, name, j->device.arch, &j->cancel, &j->cubin, &j->cubin_len,
                                    &j->log, &why);
    if (j->err && why.text[0]) { /* the worker's own failure (deadline, cancel, memory) */
      j->diag = why;
      goto out;
    }
  } else if (j->source) {
    j->err = fm_nvrtc_compile(j->source, name, j->device.arch, &j->cubin, &j->cubin_len, &j->log);
  }
  if (j->err) {
    fm_diag_set(&j->diag, j->err, "NVRTC (%s) failed: %s%s", j->device.arch, fm_strerror(j->err),
                j->log ? " (log in detail)" : "");
    goto out;
  }
  j->err = pack_meta(j);
  if (j->err) {
    fm_diag_set(&j->diag, j->err, "cannot pack the launch metadata: %s", fm_strerror(j->err));
    goto out;
  }
  j->compile_ms = now_ms() - t0;

  if (j->store) {
    fm_entry e;
    fm_compile_job_entry(j, FM_STATE_UNTUNED, &e);
    j->store_err = fm_store_put(j->store, &e);
    if (j->store_err) {
      fm_diag why = {{0}};
      fm_store_last_error(j->store, &why); /* now: other threads share the store */
      fm_diag_set(&j->store_diag, j->store_err, "cannot store kernel %.16s: %s", key_hex,
                  why.text[0] ? why.text : fm_strerror(j->store_err));
    }
  }
out:
  if (!j->compile_ms) j->compile_ms = now_ms() - t0;
}

static void work_cb(uv_work_t *req) { fm_compile_run((fm_compile_job *)req->data); }

static void after_work_cb(uv_work_t *req, int status) {
  fm_compile_job *j = req->data;
  /* UV_ECANCELED only if the job never started (we never cancel, but be exact). */
  if (status < 0 && j->err == FM_OK && !j->cubin) {
    j->err = FM_ESHUTDOWN;
    fm_diag_set(&j->diag, FM_ESHUTDOWN, "compile cancelled");
  }
  j->done(j);
}

int fm_compile_submit(uv_loop_t *loop, fm_compile_job *job, fm_compile_done_fn done, void *ctx) {
  job->done = done;
  job->ctx = ctx;
  job->work.data = job;
  int r = uv_queue_work(loop, &job->work, work_cb, after_work_cb);
  return r ? FM_EIO : FM_OK;
}
