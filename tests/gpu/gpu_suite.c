/* gpu_suite.c: see gpu_suite.h. */
#include "gpu_suite.h"

#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fm_codegen.h"
#include "fm_module.h"
#include "fm_reference.h"

#define MAX_JOBS   1024
#define MAX_CANDS  48
#define ROTATE_MAX 8 /* buffer sets gs_time launches in turn */
#define MAX_CASES  64
#define N_THREADS  16

typedef struct gs_case {
  char name[128];
  fm_fragment canon;
  int64_t outer, k;
  int share; /* gs_share_equal_inputs when the case was added */
} gs_case;

typedef struct job {
  int c;
  fm_candidate cand;
  char desc[96];
  fm_compiled k;
  char *err;
  int rc;
} job;

static const fm_cuda *cu;
static fm_device_id dev;
static fm_CUdevice cdev;
static gs_case cases[MAX_CASES];
static job jobs[MAX_JOBS];
static int n_cases, n_jobs, next_job, next_case, passed, failed, share_equal;
static gu_rng rng;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

typedef struct data {
  void *h_in[FM_MAX_INPUTS], *h_ref[FM_MAX_OUTPUTS], *h_out[FM_MAX_OUTPUTS];
  fm_CUdeviceptr d_in[FM_MAX_INPUTS], d_out[FM_MAX_OUTPUTS];
  size_t n_out[FM_MAX_OUTPUTS];
  void *ins[FM_MAX_INPUTS], *outs[FM_MAX_OUTPUTS + 1]; /* + a plan's scratch */
  int twin_of[FM_MAX_INPUTS];                          /* the earlier input whose memory this one reads, or -1 */
} data;

int gs_start(uint64_t seed) {
  fm_diag d = {{0}};
  fm_CUcontext ctx;
  if (fm_cuda_load(&cu, &d) || fm_cuda_device_id(0, &dev, &d)) {
    fprintf(stderr, "no GPU: %s\n", d.text);
    return 2;
  }
  printf("device %s (%s, %u SMs), seed %#" PRIx64 "\n", dev.name, dev.arch, dev.sm_count, seed);
  /* buffers are allocated before any module is loaded: the primary context first */
  if (cu->cuDeviceGet(&cdev, 0) || cu->cuDevicePrimaryCtxRetain(&ctx, cdev) || cu->cuCtxSetCurrent(ctx)) {
    fprintf(stderr, "cannot make the primary context current\n");
    return 2;
  }
  rng.s = seed;
  return 0;
}

void gs_share_equal_inputs(int on) { share_equal = on; }

/* The same tensor passed twice: dtype, rank, shape and strides all equal. */
static int same_layout(const fm_tensor *a, const fm_tensor *b) {
  if (a->dtype != b->dtype || a->rank != b->rank) return 0;
  for (uint32_t d = 0; d < a->rank; d++)
    if (a->shape[d] != b->shape[d] || a->strides[d] != b->strides[d]) return 0;
  return 1;
}

void gs_add_case(const char *name, const fm_fragment *canon, int64_t outer, int64_t k) {
  if (n_cases == MAX_CASES) {
    printf("FAIL %s: too many cases\n", name);
    failed++;
    return;
  }
  gs_case *c = &cases[n_cases];
  snprintf(c->name, sizeof c->name, "%s", name);
  c->canon = *canon;
  c->outer = outer;
  c->k = k;
  c->share = share_equal;
  fm_candidate cand[MAX_CANDS];
  size_t nc = fm_codegen_candidates(&c->canon, cand, MAX_CANDS);
  if (nc == 0) {
    printf("FAIL %s: no candidates\n", c->name);
    failed++;
  }
  for (size_t i = 0; i < nc && n_jobs < MAX_JOBS; i++) {
    char desc[sizeof jobs[0].desc];
    fm_candidate_describe(&cand[i], desc, sizeof desc);
    if (!gu_picked(desc)) continue;
    job *j = &jobs[n_jobs++];
    memset(j, 0, sizeof *j);
    j->c = n_cases;
    j->cand = cand[i];
    memcpy(j->desc, desc, sizeof desc);
  }
  n_cases++;
}

static void *compile_worker(void *arg) {
  (void)arg;
  for (;;) {
    pthread_mutex_lock(&lock);
    int i = next_job < n_jobs ? next_job++ : -1;
    pthread_mutex_unlock(&lock);
    if (i < 0) return NULL;
    job *j = &jobs[i];
    j->rc = gu_build_candidate(&cases[j->c].canon, &j->cand, dev.sm_count, dev.arch, "suite.cu", &j->k.cubin,
                               &j->k.cubin_len, &j->k.meta, &j->err);
  }
}

/* Random inputs, never zero, the matrix operands scaled by 1 / K^(1/4); device buffers. With
 * share, an input laid out like an earlier one reads that one's memory (and values). */
static void data_init(data *x, const fm_fragment *f, int64_t outer, int64_t k, int share) {
  memset(x, 0, sizeof *x);
  int g = fm_fragment_gemm_op(f), g2 = fm_fragment_gemm_op2(f);
  for (uint32_t i = 0; i < f->n_inputs; i++) {
    const fm_tensor *t = &f->inputs[i];
    size_t n = gu_span(t, outer), bytes = n * fm_dtype_size(t->dtype);
    x->twin_of[i] = -1;
    for (uint32_t j = 0; share && j < i && x->twin_of[i] < 0; j++)
      if (x->twin_of[j] < 0 && same_layout(t, &f->inputs[j])) x->twin_of[i] = (int)j;
    if (x->twin_of[i] >= 0) {
      x->h_in[i] = malloc(bytes);
      memcpy(x->h_in[i], x->h_in[x->twin_of[i]], bytes);
      continue;
    }
    int operand = 0;
    for (int p = 0; p < 2; p++) {
      int o = p ? g2 : g;
      if (o >= 0)
        operand |= t->id == f->ops[o].args[f->ops[o].nargs - 1] || t->id == f->ops[o].args[f->ops[o].nargs - 2];
    }
    double scale = operand ? 1.0 / sqrt(sqrt((double)k)) : 1.0;
    x->h_in[i] = malloc(bytes);
    for (size_t e = 0; e < n; e++) {
      double v = gu_uniform(&rng, 0.25, 1.0) * scale;
      gu_store(x->h_in[i], t->dtype, e, gu_below(&rng, 2) ? v : -v);
    }
  }
  /* a pooling gradient's argmax holds tap indices, an index_add's index rows, as the tuner's */
  fm_reference_window_taps(f, outer, rng.s, (void *const *)x->h_in);
  fm_reference_index_rows(f, rng.s, (void *const *)x->h_in);
  for (uint32_t i = 0; i < f->n_inputs; i++) {
    if (x->twin_of[i] >= 0) { /* an earlier input's memory (and values) */
      x->ins[i] = x->ins[x->twin_of[i]];
      continue;
    }
    size_t bytes = gu_span(&f->inputs[i], outer) * fm_dtype_size(f->inputs[i].dtype);
    x->d_in[i] = gu_dalloc(cu, bytes);
    gu_h2d(cu, x->d_in[i], x->h_in[i], bytes);
    x->ins[i] = (void *)(uintptr_t)x->d_in[i];
  }
  for (uint32_t i = 0; i < f->n_outputs; i++) {
    const fm_tensor *t = &f->outputs[i];
    x->n_out[i] = gu_span(t, outer);
    size_t bytes = x->n_out[i] * fm_dtype_size(t->dtype);
    x->h_out[i] = malloc(bytes);
    x->h_ref[i] = calloc(1, bytes); /* an index_add adds into zeros */
    x->d_out[i] = gu_dalloc(cu, bytes);
    x->outs[i] = (void *)(uintptr_t)x->d_out[i];
  }
}

static void data_free(data *x, const fm_fragment *f) {
  for (uint32_t i = 0; i < f->n_inputs; i++) {
    free(x->h_in[i]);
    if (x->d_in[i]) cu->cuMemFree(x->d_in[i]);
  }
  for (uint32_t i = 0; i < f->n_outputs; i++) {
    free(x->h_out[i]);
    free(x->h_ref[i]);
    if (x->d_out[i]) cu->cuMemFree(x->d_out[i]);
  }
}

/* A cuBLASLt plan's scratch for a launch at outer, as outs[n_outputs] (0: none needed). */
static fm_CUdeviceptr scratch_for(fm_module *m, data *x, const fm_fragment *f, int64_t outer) {
  uint64_t bytes = fm_module_scratch_bytes(m, outer);
  fm_CUdeviceptr p = bytes ? gu_dalloc(cu, bytes) : 0;
  x->outs[f->n_outputs] = (void *)(uintptr_t)p;
  return p;
}

/* One kernel of case c on data x: 1 when every output matched the reference. */
static int check_job(gs_case *c, job *j, data *x) {
  const fm_fragment *f = &c->canon;
  fm_diag d = {{0}};
  fm_module *m = NULL;
  int ok = 1;
  if (j->rc) {
    printf("FAIL %s [%s]: compile: %s\n", c->name, j->desc, j->err ? j->err : "?");
    return 0;
  }
  if (fm_module_load(&j->k, &m, &d)) {
    printf("FAIL %s [%s]: load: %s\n", c->name, j->desc, d.text);
    return 0;
  }
  for (uint32_t o = 0; o < f->n_outputs; o++) /* NaN in every float dtype; zeros for an index_add, which adds */
    cu->cuMemsetD8(x->d_out[o], fm_fragment_is_scatter(f) ? 0 : 0xff, x->n_out[o] * fm_dtype_size(f->outputs[o].dtype));
  fm_CUdeviceptr scratch = scratch_for(m, x, f, c->outer);
  fm_CUresult r = 0;
  if (fm_module_launch(m, x->ins, x->outs, c->outer, NULL, &d) || (r = cu->cuCtxSynchronize())) {
    printf("FAIL %s [%s]: launch: %s (cuda %d)\n", c->name, j->desc, d.text, r);
    if (r) exit(3); /* the context is gone */
    ok = 0;
  }
  for (uint32_t o = 0; ok && o < f->n_outputs; o++) {
    const fm_tensor *t = &f->outputs[o];
    gu_d2h(cu, x->h_out[o], x->d_out[o], x->n_out[o] * fm_dtype_size(t->dtype));
    double e = gu_rel_err(x->h_out[o], t->dtype, x->h_ref[o], t->dtype, x->n_out[o]);
    if (!(e <= fm_reference_tolerance(f, o))) { /* NaN fails too */
      printf("FAIL %s [%s] out%u rel_err=%.3e (tol %.0e)\n", c->name, j->desc, o, e, fm_reference_tolerance(f, o));
      ok = 0;
    }
  }
  if (ok) printf("ok   %s [%s]\n", c->name, j->desc);
  if (scratch) cu->cuMemFree(scratch);
  fm_module_unload(m);
  return ok;
}

int gs_run(void) {
  pthread_t th[N_THREADS];
  printf("%d cases, %d kernels to compile\n", n_cases - next_case, n_jobs - next_job);
  fflush(stdout);
  for (int i = 0; i < N_THREADS; i++) pthread_create(&th[i], NULL, compile_worker, NULL);
  for (int i = 0; i < N_THREADS; i++) pthread_join(th[i], NULL);
  for (; next_case < n_cases; next_case++) {
    gs_case *c = &cases[next_case];
    data x;
    fm_diag d = {{0}};
    data_init(&x, &c->canon, c->outer, c->k, c->share);
    if (fm_reference_eval(&c->canon, c->outer, (const void *const *)x.h_in, x.h_ref, &d)) {
      printf("FAIL %s: reference: %s\n", c->name, d.text);
      failed++;
    } else {
      for (int i = 0; i < n_jobs; i++)
        if (jobs[i].c == next_case) check_job(c, &jobs[i], &x) ? passed++ : failed++;
    }
    data_free(&x, &c->canon);
    fflush(stdout);
  }
  for (int i = 0; i < n_jobs; i++) {
    free(jobs[i].k.cubin);
    free(jobs[i].err);
    jobs[i].k.cubin = NULL;
    jobs[i].err = NULL;
  }
  return failed;
}

double gs_time(const fm_fragment *canon, int64_t outer, int64_t k, char *best_desc, size_t cap) {
  data x;
  fm_candidate cand[MAX_CANDS];
  fm_CUevent e0, e1;
  double best = INFINITY;
  data_init(&x, canon, outer, k, share_equal);
  /* buffer sets launched in turn, copies of the inputs and outputs until they span 128 MiB
     (at most 8), so that L2 does not flatter: inputs come from memory as in a model (the
     tuner's rule) */
  size_t set_bytes = 0;
  for (uint32_t i = 0; i < canon->n_inputs; i++)
    if (x.twin_of[i] < 0) set_bytes += gu_span(&canon->inputs[i], outer) * fm_dtype_size(canon->inputs[i].dtype);
  for (uint32_t i = 0; i < canon->n_outputs; i++) set_bytes += x.n_out[i] * fm_dtype_size(canon->outputs[i].dtype);
  int sets = set_bytes ? (int)((128u << 20) / set_bytes) + 1 : 1;
  sets = sets > ROTATE_MAX ? ROTATE_MAX : sets;
  void *ins[ROTATE_MAX][FM_MAX_INPUTS], *outs[ROTATE_MAX][FM_MAX_OUTPUTS + 1];
  fm_CUdeviceptr copies[ROTATE_MAX][FM_MAX_INPUTS + FM_MAX_OUTPUTS] = {{0}};
  memcpy(ins[0], x.ins, sizeof x.ins);
  memcpy(outs[0], x.outs, sizeof x.outs);
  for (int b = 1; b < sets; b++) {
    for (uint32_t i = 0; i < canon->n_inputs; i++) {
      if (x.twin_of[i] >= 0) { /* inputs come before their twins */
        ins[b][i] = ins[b][x.twin_of[i]];
        continue;
      }
      size_t bytes = gu_span(&canon->inputs[i], outer) * fm_dtype_size(canon->inputs[i].dtype);
      copies[b][i] = gu_dalloc(cu, bytes);
      gu_h2d(cu, copies[b][i], x.h_in[i], bytes);
      ins[b][i] = (void *)(uintptr_t)copies[b][i];
    }
    for (uint32_t i = 0; i < canon->n_outputs; i++) {
      copies[b][FM_MAX_INPUTS + i] = gu_dalloc(cu, x.n_out[i] * fm_dtype_size(canon->outputs[i].dtype));
      outs[b][i] = (void *)(uintptr_t)copies[b][FM_MAX_INPUTS + i];
    }
  }
  size_t nc = fm_codegen_candidates(canon, cand, MAX_CANDS);
  cu->cuEventCreate(&e0, 0);
  cu->cuEventCreate(&e1, 0);
  if (cap) best_desc[0] = 0;
  for (size_t i = 0; i < nc; i++) {
    fm_compiled kc = {0};
    char *err = NULL, desc[96];
    fm_diag d = {{0}};
    fm_module *m = NULL;
    fm_candidate_describe(&cand[i], desc, sizeof desc);
    if (!gu_picked(desc)) continue;
    if (gu_build_candidate(canon, &cand[i], dev.sm_count, dev.arch, "suite.cu", &kc.cubin, &kc.cubin_len, &kc.meta,
                           &err) ||
        fm_module_load(&kc, &m, &d)) {
      printf("time [%s]: %s%s\n", desc, err ? err : "", d.text);
      free(err);
      free(kc.cubin);
      continue;
    }
    float t[20];
    fm_CUdeviceptr scratch = scratch_for(m, &x, canon, outer);
    for (int b = 0; b < sets; b++) outs[b][canon->n_outputs] = x.outs[canon->n_outputs];
    for (int w = 0; w < 3; w++) fm_module_launch(m, ins[w % sets], outs[w % sets], outer, NULL, &d);
    for (int r = 0; r < 20; r++) {
      cu->cuEventRecord(e0, NULL);
      fm_module_launch(m, ins[(r + 3) % sets], outs[(r + 3) % sets], outer, NULL, &d);
      cu->cuEventRecord(e1, NULL);
      cu->cuEventSynchronize(e1);
      cu->cuEventElapsedTime(&t[r], e0, e1);
    }
    double ms = gu_median(t, 20);
    printf("time [%s]: %.4f ms\n", desc, ms);
    if (ms < best) {
      best = ms;
      snprintf(best_desc, cap, "%s", desc);
    }
    if (scratch) cu->cuMemFree(scratch);
    fm_module_unload(m);
    free(kc.cubin);
  }
  cu->cuEventDestroy(e0);
  cu->cuEventDestroy(e1);
  for (int b = 1; b < sets; b++)
    for (uint32_t i = 0; i < FM_MAX_INPUTS + FM_MAX_OUTPUTS; i++)
      if (copies[b][i]) cu->cuMemFree(copies[b][i]);
  data_free(&x, canon);
  fflush(stdout);
  return best;
}

int gs_finish(void) {
  cu->cuDevicePrimaryCtxRelease(cdev);
  printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}

void gs_matrix(fm_tensor *t, uint32_t id, fm_dtype dt, int64_t d0, int64_t d1, int colmajor) {
  memset(t, 0, sizeof *t);
  t->id = id;
  t->dtype = dt;
  t->rank = 2;
  t->shape[0] = d0;
  t->shape[1] = d1;
  int64_t ld = colmajor ? (d0 + 7) / 8 * 8 : (d1 + 7) / 8 * 8; /* 16-byte leading dims */
  t->strides[0] = colmajor ? 1 : ld;
  t->strides[1] = colmajor ? ld : 1;
  t->align = 16;
}

void gs_vector(fm_tensor *t, uint32_t id, fm_dtype dt, int64_t n) {
  memset(t, 0, sizeof *t);
  t->id = id;
  t->dtype = dt;
  t->rank = 1;
  t->shape[0] = n;
  t->strides[0] = 1;
  t->align = 16;
}

void gs_op(fm_fragment *f, fm_op o, uint32_t out, uint32_t nargs, uint32_t a0, uint32_t a1, uint32_t a2) {
  fm_opnode *n = &f->ops[f->n_ops++];
  memset(n, 0, sizeof *n);
  n->op = o;
  n->out = out;
  n->nargs = nargs;
  n->args[0] = a0;
  n->args[1] = a1;
  n->args[2] = a2;
}

int gs_canon(fm_fragment *f, fm_fragment *canon, const char *what) {
  fm_diag d = {{0}};
  int rc = fm_fragment_validate(f, &d);
  if (!rc) rc = fm_fragment_canonicalize(f, canon);
  if (rc) printf("FAIL build %s: %s\n", what, d.text);
  return rc;
}
