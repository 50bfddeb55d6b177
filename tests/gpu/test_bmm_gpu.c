/* test_bmm_gpu.c (device machine only): batched GEMM fragments (bmm + epilogue) compiled
 * locally (codegen + NVRTC for this GPU, every candidate, compiles in parallel) and launched
 * through libfusemld (the "batched" grid), each output checked against the CPU reference
 * (fm_reference_eval, fp64) by ||out-ref||/||ref|| on random inputs (never zeros), outputs
 * poisoned with NaN before each launch so unwritten elements fail. The cuBLASLt plan (strided
 * batched product into the scratch, then the split epilogue kernel) is one of the candidates,
 * run with the heuristic's first choice.
 *
 * Cases: M in {1, 7, 64, 127, 200} x N in {8, 64, 100, 136}, K rotating over {8, 64, 136},
 * the batch over a static 1, a static 3, a symbolic 5 and a static 4 whose B is one matrix
 * for all (batch dim 1); the epilogue over plain bmm, scale + a [M, N] mask (attention
 * scores), bias [N] + gelu, residual [Bt, M, N] + relu, bias + gelu with the product as a
 * second output; bf16 and f16; A and B row- or column-major per product. Then times the
 * attention-score shape (64 products of 1024 x 1024 x 64, bf16, * 0.125 + mask) with every
 * candidate (CUDA events, median of 20 after warm-up) against the bytes and flops floors.
 *
 * Usage: test_bmm_gpu [SEED [check|time]]   Prints one line per kernel and "N passed, N failed". */
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fm_client.h"
#include "fm_codegen.h"
#include "fm_cuda.h"
#include "fm_fragment.h"
#include "fm_reference.h"
#include "gpu_util.h"

#define MAX_JOBS 1024
#define MAX_CANDS 48
#define MAX_CASES 32
#define N_THREADS 16

enum { E_BMM, E_SCORES, E_GELU, E_RESIDUAL, E_EXTRA, E__N };
static const char *const epi_name[E__N] = {"bmm", "scale+mask", "bias+gelu", "residual+relu",
                                           "bias+gelu+product"};

typedef struct tcase {
  char name[128];
  fm_fragment canon;
  int64_t outer;                 /* the batch at launch */
} tcase;

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
static tcase cases[MAX_CASES];
static job jobs[MAX_JOBS];
static int n_cases, n_jobs, next_job, passed, failed;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

/* A rank-3 tensor [z, r, c]: each matrix row-major (or column-major with colmajor), its
 * leading dim padded to 16 bytes when pad (the operands: the templates load 16-byte chunks),
 * dense across the batch; a batch dim of 1 gets stride 0. */
static void tensor3(fm_tensor *t, uint32_t id, fm_dtype dt, int64_t z, int64_t r, int64_t c, int colmajor,
                    int pad) {
  memset(t, 0, sizeof *t);
  t->id = id;
  t->dtype = dt;
  t->rank = 3;
  t->shape[0] = z;
  t->shape[1] = r;
  t->shape[2] = c;
  int64_t rs = colmajor ? 1 : pad ? (c + 7) / 8 * 8 : c, cs = colmajor ? (pad ? (r + 7) / 8 * 8 : r) : 1;
  t->strides[1] = rs;
  t->strides[2] = cs;
  t->strides[0] = z == 1 ? 0 : (colmajor ? cs * c : rs * r);
  t->align = 16;
}

static void op(fm_fragment *f, fm_op o, uint32_t out, uint32_t nargs, uint32_t a0, uint32_t a1) {
  fm_opnode *n = &f->ops[f->n_ops++];
  memset(n, 0, sizeof *n);
  n->op = o;
  n->out = out;
  n->nargs = nargs;
  n->args[0] = a0;
  n->args[1] = a1;
}

/* [z, M, K] @ [zb, K, N] with epilogue e; z < 0: a symbolic batch (m_hint hint). */
static int build(int e, fm_dtype dt, int64_t z, int64_t zb, uint64_t hint, int64_t m, int64_t n, int64_t k,
                 int a_col, int b_col, fm_fragment *canon) {
  static fm_fragment f;
  fm_diag d = {{0}};
  memset(&f, 0, sizeof f);
  f.vocab = 4;
  f.m_hint = hint;
  tensor3(&f.inputs[f.n_inputs++], 1, dt, z, m, k, a_col, 1);
  tensor3(&f.inputs[f.n_inputs++], 2, dt, zb, k, n, b_col, 1);
  op(&f, FM_OP_BMM, 10, 2, 1, 2);
  uint32_t y = 10;
  if (e == E_SCORES) {
    tensor3(&f.inputs[f.n_inputs++], 3, dt, 1, m, n, 0, 0);
    f.inputs[f.n_inputs - 1].rank = 2;   /* [M, N]: validation right-aligns it */
    memmove(&f.inputs[f.n_inputs - 1].shape[0], &f.inputs[f.n_inputs - 1].shape[1], 2 * sizeof(int64_t));
    memmove(&f.inputs[f.n_inputs - 1].strides[0], &f.inputs[f.n_inputs - 1].strides[1], 2 * sizeof(int64_t));
    fm_opnode *c = &f.ops[f.n_ops++];
    memset(c, 0, sizeof *c);
    c->op = FM_OP_CONST;
    c->out = 11;
    c->value = 0.125;
    op(&f, FM_OP_MUL, 12, 2, 10, 11);
    op(&f, FM_OP_ADD, 13, 2, 12, 3);
    y = 13;
  } else if (e == E_GELU || e == E_EXTRA) {
    fm_tensor *b = &f.inputs[f.n_inputs++];   /* bias [N] */
    memset(b, 0, sizeof *b);
    b->id = 3;
    b->dtype = dt;
    b->rank = 1;
    b->shape[0] = n;
    b->strides[0] = 1;
    b->align = 16;
    op(&f, FM_OP_ADD, 11, 2, 10, 3);
    op(&f, FM_OP_GELU, 12, 1, 11, 0);
    y = 12;
  } else if (e == E_RESIDUAL) {
    tensor3(&f.inputs[f.n_inputs++], 3, dt, z, m, n, 0, 0);
    op(&f, FM_OP_ADD, 11, 2, 10, 3);
    op(&f, FM_OP_RELU, 12, 1, 11, 0);
    y = 12;
  }
  tensor3(&f.outputs[f.n_outputs++], y, dt, z, m, n, 0, 0);
  if (e == E_EXTRA) tensor3(&f.outputs[f.n_outputs++], 10, dt, z, m, n, 0, 0);
  int rc = fm_fragment_validate(&f, &d);
  if (!rc) rc = fm_fragment_canonicalize(&f, canon);
  if (rc) printf("FAIL build %s: %s\n", epi_name[e], d.text);
  return rc;
}

static void *compile_worker(void *arg) {
  (void)arg;
  for (;;) {
    pthread_mutex_lock(&lock);
    int i = next_job < n_jobs ? next_job++ : -1;
    pthread_mutex_unlock(&lock);
    if (i < 0) return NULL;
    job *j = &jobs[i];
    j->rc = gu_build_candidate(&cases[j->c].canon, &j->cand, dev.sm_count, dev.arch, "bmm.cu", &j->k.cubin,
                               &j->k.cubin_len, &j->k.meta, &j->err);
  }
}

typedef struct data {
  void *h_in[FM_MAX_INPUTS], *h_ref[FM_MAX_OUTPUTS], *h_out[FM_MAX_OUTPUTS];
  fm_CUdeviceptr d_in[FM_MAX_INPUTS], d_out[FM_MAX_OUTPUTS];
  size_t n_out[FM_MAX_OUTPUTS];
  void *ins[FM_MAX_INPUTS], *outs[FM_MAX_OUTPUTS + 1];   /* + a plan's scratch */
} data;

/* A cuBLASLt plan's scratch for a launch at outer, as outs[n_outputs] (0: none needed). */
static fm_CUdeviceptr scratch_for(fm_module *m, data *x, const fm_fragment *f, int64_t outer) {
  uint64_t bytes = fm_module_scratch_bytes(m, outer);
  fm_CUdeviceptr p = bytes ? gu_dalloc(cu, bytes) : 0;
  x->outs[f->n_outputs] = (void *)(uintptr_t)p;
  return p;
}

/* Random inputs, never zero, the operands scaled so that the sum over K stays O(1). */
static void data_init(data *x, const fm_fragment *f, int64_t outer, int64_t k, gu_rng *rng) {
  memset(x, 0, sizeof *x);
  int g = fm_fragment_gemm_op(f);
  for (uint32_t i = 0; i < f->n_inputs; i++) {
    const fm_tensor *t = &f->inputs[i];
    size_t n = gu_span(t, outer), bytes = n * fm_dtype_size(t->dtype);
    int operand = t->id == f->ops[g].args[0] || t->id == f->ops[g].args[1];
    double scale = operand ? 1.0 / sqrt(sqrt((double)k)) : 1.0;
    x->h_in[i] = malloc(bytes);
    for (size_t e = 0; e < n; e++) {
      double v = gu_uniform(rng, 0.25, 1.0) * scale;
      gu_store(x->h_in[i], t->dtype, e, gu_below(rng, 2) ? v : -v);
    }
    x->d_in[i] = gu_dalloc(cu, bytes);
    gu_h2d(cu, x->d_in[i], x->h_in[i], bytes);
    x->ins[i] = (void *)(uintptr_t)x->d_in[i];
  }
  for (uint32_t i = 0; i < f->n_outputs; i++) {
    const fm_tensor *t = &f->outputs[i];
    x->n_out[i] = gu_span(t, outer);
    size_t bytes = x->n_out[i] * fm_dtype_size(t->dtype);
    x->h_out[i] = malloc(bytes);
    x->h_ref[i] = malloc(bytes);
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

static double tolerance(fm_dtype dt) { return dt == FM_DT_BF16 ? 1e-2 : dt == FM_DT_F16 ? 2e-3 : 1e-4; }

static void run_case(int ci, int64_t k, gu_rng *rng) {
  tcase *c = &cases[ci];
  const fm_fragment *f = &c->canon;
  data x;
  fm_diag d = {{0}};
  data_init(&x, f, c->outer, k, rng);
  int ref_ok = fm_reference_eval(f, c->outer, (const void *const *)x.h_in, x.h_ref, &d) == FM_OK;
  if (!ref_ok) {
    printf("FAIL %s: reference: %s\n", c->name, d.text);
    failed++;
  }
  for (int i = 0; ref_ok && i < n_jobs; i++) {
    job *j = &jobs[i];
    fm_module *m = NULL;
    int ok = 1;
    if (j->c != ci) continue;
    if (j->rc) {
      printf("FAIL %s [%s]: compile: %s\n", c->name, j->desc, j->err ? j->err : "?");
      failed++;
      continue;
    }
    if (fm_module_load(&j->k, &m, &d)) {
      printf("FAIL %s [%s]: load: %s\n", c->name, j->desc, d.text);
      failed++;
      continue;
    }
    for (uint32_t o = 0; o < f->n_outputs; o++)   /* NaN in every float dtype */
      cu->cuMemsetD8(x.d_out[o], 0xff, x.n_out[o] * fm_dtype_size(f->outputs[o].dtype));
    fm_CUdeviceptr scratch = scratch_for(m, &x, f, c->outer);
    fm_CUresult r = 0;
    int launch_rc = fm_module_launch(m, x.ins, x.outs, c->outer, NULL, &d);
    if (launch_rc || (r = cu->cuCtxSynchronize())) {
      printf("FAIL %s [%s]: launch: %s (cuda %d)\n", c->name, j->desc, d.text, r);
      if (scratch) cu->cuMemFree(scratch);
      fm_module_unload(m);
      failed++;
      if (r) exit(3);   /* the context is gone */
      continue;
    }
    for (uint32_t o = 0; ok && o < f->n_outputs; o++) {
      const fm_tensor *t = &f->outputs[o];
      gu_d2h(cu, x.h_out[o], x.d_out[o], x.n_out[o] * fm_dtype_size(t->dtype));
      double e = gu_rel_err(x.h_out[o], t->dtype, x.h_ref[o], t->dtype, x.n_out[o]);
      if (!(e <= tolerance(t->dtype))) {   /* NaN fails too */
        printf("FAIL %s [%s] out%u rel_err=%.3e (tol %.0e)\n", c->name, j->desc, o, e, tolerance(t->dtype));
        ok = 0;
      }
    }
    if (ok) printf("ok   %s [%s]\n", c->name, j->desc);
    if (ok) passed++;
    else failed++;
    if (scratch) cu->cuMemFree(scratch);
    fm_module_unload(m);
  }
  data_free(&x, f);
  fflush(stdout);
}

static void add_case(int e, fm_dtype dt, int64_t z, int64_t zb, uint64_t hint, int64_t outer, int64_t m,
                     int64_t n, int64_t k, int a_col, int b_col) {
  tcase *c = &cases[n_cases];
  snprintf(c->name, sizeof c->name, "%s %s Bt=%lld%s%s M=%lld N=%lld K=%lld A %s B %s", epi_name[e],
           fm_dtype_name(dt), (long long)outer, z < 0 ? " (sym)" : "", zb == 1 && outer > 1 ? " B shared" : "",
           (long long)m, (long long)n, (long long)k, a_col ? "col" : "row", b_col ? "col" : "row");
  c->outer = outer;
  if (build(e, dt, z, zb, hint, m, n, k, a_col, b_col, &c->canon)) {
    failed++;
    return;
  }
  fm_candidate cand[MAX_CANDS];
  size_t nc = fm_codegen_candidates(&c->canon, cand, MAX_CANDS);
  if (nc == 0) {
    printf("FAIL %s: no candidates\n", c->name);
    failed++;
  }
  for (size_t i = 0; i < nc && n_jobs < MAX_JOBS; i++) {
    job *j = &jobs[n_jobs++];
    memset(j, 0, sizeof *j);
    j->c = n_cases;
    j->cand = cand[i];
    fm_candidate_describe(&cand[i], j->desc, sizeof j->desc);
  }
  n_cases++;
}

/* Every candidate of the attention-score fragment at 64 x 1024 x 1024 x 64, timed; the floor
 * is the larger of the bytes (q, k, mask read once, scores written once) over the copy rate
 * and the flops over ~990 TFLOP/s (H100 dense bf16), both printed. */
static void time_scores(gu_rng *rng) {
  const int64_t z = 64, s = 1024, dh = 64;
  fm_fragment canon;
  if (build(E_SCORES, FM_DT_BF16, -1, -1, (uint64_t)z, s, s, dh, 0, 1, &canon)) return;
  data x;
  data_init(&x, &canon, z, dh, rng);
  fm_candidate cand[MAX_CANDS];
  size_t nc = fm_codegen_candidates(&canon, cand, MAX_CANDS);
  fm_CUevent e0, e1;
  cu->cuEventCreate(&e0, 0);
  cu->cuEventCreate(&e1, 0);
  double best = 1e30;
  char best_desc[96] = "";
  for (size_t i = 0; i < nc; i++) {
    fm_compiled k = {0};
    char *err = NULL, desc[96];
    fm_diag d = {{0}};
    fm_module *m = NULL;
    fm_candidate_describe(&cand[i], desc, sizeof desc);
    if (gu_build_candidate(&canon, &cand[i], dev.sm_count, dev.arch, "bmm.cu", &k.cubin, &k.cubin_len,
                           &k.meta, &err) ||
        fm_module_load(&k, &m, &d)) {
      printf("time [%s]: %s%s\n", desc, err ? err : "", d.text);
      free(err);
      free(k.cubin);
      continue;
    }
    float t[20];
    fm_CUdeviceptr scratch = scratch_for(m, &x, &canon, z);
    for (int w = 0; w < 3; w++) fm_module_launch(m, x.ins, x.outs, z, NULL, &d);
    for (int r = 0; r < 20; r++) {
      cu->cuEventRecord(e0, NULL);
      fm_module_launch(m, x.ins, x.outs, z, NULL, &d);
      cu->cuEventRecord(e1, NULL);
      cu->cuEventSynchronize(e1);
      cu->cuEventElapsedTime(&t[r], e0, e1);
    }
    double ms = gu_median(t, 20);
    printf("time [%s]: %.4f ms\n", desc, ms);
    if (ms < best) {
      best = ms;
      snprintf(best_desc, sizeof best_desc, "%s", desc);
    }
    if (scratch) cu->cuMemFree(scratch);
    fm_module_unload(m);
    free(k.cubin);
  }
  double bytes = 2.0 * (double)(z * s * dh * 2 + s * s + z * s * s), flops = 2.0 * (double)z * s * s * dh;
  printf("best scores 64x1024x1024x64 bf16: %.4f ms [%s], %.0f GB/s, %.0f TFLOP/s\n", best, best_desc,
         bytes / best / 1e6, flops / best / 1e9);
  cu->cuEventDestroy(e0);
  cu->cuEventDestroy(e1);
  data_free(&x, &canon);
}

int main(int argc, char **argv) {
  static const int64_t ms[] = {1, 7, 64, 127, 200};
  static const int64_t ns[] = {8, 64, 100, 136};   /* 100: rows not 16-byte aligned */
  static const int64_t ks[] = {8, 64, 136};
  uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 0) : 0xb33;
  const char *mode = argc > 2 ? argv[2] : "both";
  fm_diag d = {{0}};
  if (fm_cuda_load(&cu, &d) || fm_cuda_device_id(0, &dev, &d)) {
    fprintf(stderr, "no GPU: %s\n", d.text);
    return 2;
  }
  printf("device %s (%s, %u SMs), seed %#" PRIx64 "\n", dev.name, dev.arch, dev.sm_count, seed);
  fm_CUdevice cdev;
  fm_CUcontext ctx;
  if (cu->cuDeviceGet(&cdev, 0) || cu->cuDevicePrimaryCtxRetain(&ctx, cdev) || cu->cuCtxSetCurrent(ctx)) {
    fprintf(stderr, "cannot make the primary context current\n");
    return 2;
  }
  int64_t case_k[MAX_CASES];
  int idx = 0;
  if (strcmp(mode, "time") != 0)
    for (size_t mi = 0; mi < sizeof ms / sizeof ms[0]; mi++)
      for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++, idx++) {
        /* the batch kind and the layouts rotate apart from N (idx % 4 would tie them) */
        int e = idx % E__N, batch = (int)((mi + ni) % 4);
        fm_dtype dt = idx % 2 ? FM_DT_F16 : FM_DT_BF16;
        int64_t k = ks[(size_t)idx % 3];
        /* 0: static 1; 1: static 3; 2: symbolic, launched with 5 (hint 8); 3: 4 by one B */
        int64_t z = batch == 0 ? 1 : batch == 1 ? 3 : batch == 2 ? -1 : 4;
        int64_t zb = batch == 3 ? 1 : z, outer = batch == 2 ? 5 : z;
        case_k[n_cases] = k;
        add_case(e, dt, z, zb, batch == 2 ? 8 : 0, outer, ms[mi], ns[ni], k, (int)(mi % 2), (idx / 3) % 2 == 0);
      }
  printf("%d cases, %d kernels to compile\n", n_cases, n_jobs);
  fflush(stdout);
  pthread_t th[N_THREADS];
  for (int i = 0; i < N_THREADS; i++) pthread_create(&th[i], NULL, compile_worker, NULL);
  for (int i = 0; i < N_THREADS; i++) pthread_join(th[i], NULL);
  gu_rng rng = {seed};
  for (int ci = 0; ci < n_cases; ci++) run_case(ci, case_k[ci], &rng);
  for (int i = 0; i < n_jobs; i++) {
    free(jobs[i].k.cubin);
    free(jobs[i].err);
  }
  if (strcmp(mode, "check") != 0) time_scores(&rng);
  cu->cuDevicePrimaryCtxRelease(cdev);
  printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
