/* test_gemm_gpu.c (device machine only): GEMM fragments (mm / addmm + epilogue) compiled
 * locally (codegen + NVRTC for this GPU, every candidate of the gemm and skinny templates,
 * compiles in parallel) and launched through libfusemld (fm_module), each output checked
 * against the CPU reference (fm_reference_eval, fp64) by ‖out−ref‖/‖ref‖ on random inputs
 * (never zeros), outputs poisoned with NaN before each launch so unwritten elements fail.
 *
 * Cases: every M in {1, 7, 64, 127, 128, 700, 4099} x N in {8, 64, 100, 136, 1024}, plus
 * 16384 x 136 x 512 (several tiles per persistent block, K past the stages) (N = 100: the
 * epilogue's masked, element-wise path; M = 700 and 4099: blocks of 2 or 4 row tiles whose
 * second tile is partial, or whose later tiles lie past M), K rotating over
 * {8, 64, 136, 1024} (smaller where the fp64 reference would be slow), the epilogue rotating
 * over plain mm, bias, bias + relu / gelu / silu, residual + relu, bias + gelu with the
 * pre-activation as an extra output; bf16 and f16; A and B row- or column-major; M symbolic
 * in a third of the cases. Then times bias + gelu bf16 (nn.Linear layouts) at 4096^3 and the
 * memory-bound shapes with every candidate (CUDA events, median of 20 after warm-up; the
 * timed outputs spot-checked on 256 elements).
 *
 * The decode suite (check and skinny modes) verifies the skinny template: see
 * add_skinny_cases.
 *
 * Usage: test_gemm_gpu [SEED [check|time|skinny|regular]]   (default both check and time;
 * skinny: the decode suite alone; regular: check without it; env FM_GPU_CANDS="sub;sub" keeps
 * the candidates whose description contains one of them) Prints one line per kernel and
 * "N passed, N failed". The modes run apart so that a fault in one leaves the other. */
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fm_codegen.h"
#include "fm_cuda.h"
#include "fm_fragment.h"
#include "fm_module.h"
#include "fm_nvrtc.h"
#include "fm_reference.h"
#include "gpu_util.h"

#define MAX_JOBS  2048
#define MAX_CANDS 48
#define MAX_CASES 96
#define N_THREADS 16

enum { E_MM, E_BIAS, E_RELU, E_GELU, E_SILU, E_RESIDUAL, E_EXTRA, E__N };
static const char *const epi_name[E__N] = {"mm",        "bias",          "bias+relu",    "bias+gelu",
                                           "bias+silu", "residual+relu", "bias+gelu+pre"};

typedef struct tcase {
  char name[128];
  fm_fragment canon;
  int64_t outer; /* M at launch */
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

/* ---- fragments --------------------------------------------------------------------- */

static void tensor(fm_tensor *t, uint32_t id, fm_dtype dt, int64_t d0, int64_t d1, int colmajor, int64_t ld) {
  memset(t, 0, sizeof *t);
  t->id = id;
  t->dtype = dt;
  t->rank = 2;
  t->shape[0] = d0;
  t->shape[1] = d1;
  t->strides[0] = colmajor ? 1 : ld;
  t->strides[1] = colmajor ? ld : 1;
  t->align = 16;
}

static void op(fm_fragment *f, fm_op o, uint32_t out, uint32_t nargs, uint32_t a0, uint32_t a1, uint32_t a2) {
  fm_opnode *n = &f->ops[f->n_ops++];
  memset(n, 0, sizeof *n);
  n->op = o;
  n->out = out;
  n->nargs = nargs;
  n->args[0] = a0;
  n->args[1] = a1;
  n->args[2] = a2;
}

static int64_t round8(int64_t x) { return (x + 7) / 8 * 8; }

/* A [M, K] @ B [K, N] with epilogue e; M < 0: symbolic (A row-major then), m_hint its
 * expected M (0: none). */
static int build(int e, fm_dtype dt, int64_t m, uint64_t m_hint, int64_t n, int64_t k, int a_col, int b_col,
                 fm_fragment *canon) {
  static fm_fragment f;
  fm_diag d = {{0}};
  memset(&f, 0, sizeof f);
  f.vocab = 3;
  f.m_hint = m_hint;
  if (m < 0) a_col = 0;
  tensor(&f.inputs[f.n_inputs++], 1, dt, m, k, a_col, a_col ? round8(m) : k);
  tensor(&f.inputs[f.n_inputs++], 2, dt, k, n, b_col, b_col ? k : round8(n));
  uint32_t acc = 10;
  if (e == E_MM || e == E_RESIDUAL) {
    op(&f, FM_OP_MM, 10, 2, 1, 2, 0);
  } else {
    fm_tensor *b = &f.inputs[f.n_inputs++]; /* bias [N], torch's nn.Linear shape */
    memset(b, 0, sizeof *b);
    b->id = 3;
    b->dtype = dt;
    b->rank = 1;
    b->shape[0] = n;
    b->strides[0] = 1;
    b->align = 16;
    op(&f, FM_OP_ADDMM, 10, 3, 3, 1, 2);
  }
  uint32_t y = acc;
  switch (e) {
    case E_RELU:
      op(&f, FM_OP_RELU, 11, 1, 10, 0, 0);
      y = 11;
      break;
    case E_GELU:
    case E_EXTRA:
      op(&f, FM_OP_GELU, 11, 1, 10, 0, 0);
      y = 11;
      break;
    case E_SILU:
      op(&f, FM_OP_SILU, 11, 1, 10, 0, 0);
      y = 11;
      break;
    case E_RESIDUAL:
      tensor(&f.inputs[f.n_inputs++], 4, dt, m, n, 0, n);
      op(&f, FM_OP_ADD, 11, 2, 10, 4, 0);
      op(&f, FM_OP_RELU, 12, 1, 11, 0, 0);
      y = 12;
      break;
    default:
      break;
  }
  tensor(&f.outputs[f.n_outputs++], y, dt, m, n, 0, n);
  if (e == E_EXTRA) tensor(&f.outputs[f.n_outputs++], 10, dt, m, n, 0, n);
  int rc = fm_fragment_validate(&f, &d);
  if (!rc) rc = fm_fragment_canonicalize(&f, canon);
  if (rc) printf("FAIL build %s: %s\n", epi_name[e], d.text);
  return rc;
}

/* ---- compile (parallel) ----------------------------------------------------------- */

static void *compile_worker(void *arg) {
  (void)arg;
  for (;;) {
    pthread_mutex_lock(&lock);
    int i = next_job < n_jobs ? next_job++ : -1;
    pthread_mutex_unlock(&lock);
    if (i < 0) return NULL;
    job *j = &jobs[i];
    j->rc = gu_build_candidate(&cases[j->c].canon, &j->cand, dev.sm_count, dev.arch, "gemm.cu", &j->k.cubin,
                               &j->k.cubin_len, &j->k.meta, &j->err);
  }
}

/* ---- data ------------------------------------------------------------------------ */

typedef struct data {
  void *h_in[FM_MAX_INPUTS], *h_ref[FM_MAX_OUTPUTS], *h_out[FM_MAX_OUTPUTS];
  fm_CUdeviceptr d_in[FM_MAX_INPUTS], d_out[FM_MAX_OUTPUTS];
  size_t n_out[FM_MAX_OUTPUTS];
  void *ins[FM_MAX_INPUTS], *outs[FM_MAX_OUTPUTS];
} data;

/* Random inputs, never zero: magnitudes in [0.25, 1], random signs, scaled so that the sum
 * over K stays O(1); host buffers only (data_device copies them). */
static void data_host(data *x, const fm_fragment *f, int64_t outer, gu_rng *rng) {
  memset(x, 0, sizeof *x);
  int g = fm_fragment_gemm_op(f);
  int64_t k = f->inputs[f->ops[g].args[f->ops[g].nargs - 1]].shape[0];
  for (uint32_t i = 0; i < f->n_inputs; i++) {
    const fm_tensor *t = &f->inputs[i];
    size_t n = gu_span(t, outer), bytes = n * fm_dtype_size(t->dtype);
    int operand =
        t->rank == 2 && (t->id == f->ops[g].args[f->ops[g].nargs - 1] || t->id == f->ops[g].args[f->ops[g].nargs - 2]);
    double scale = operand ? 1.0 / sqrt(sqrt((double)k)) : 1.0;
    x->h_in[i] = malloc(bytes);
    for (size_t e = 0; e < n; e++) {
      double v = gu_uniform(rng, 0.25, 1.0) * scale;
      gu_store(x->h_in[i], t->dtype, e, gu_below(rng, 2) ? v : -v);
    }
  }
  for (uint32_t i = 0; i < f->n_outputs; i++) {
    const fm_tensor *t = &f->outputs[i];
    x->n_out[i] = gu_span(t, outer);
    size_t bytes = x->n_out[i] * fm_dtype_size(t->dtype);
    x->h_out[i] = malloc(bytes);
    x->h_ref[i] = malloc(bytes);
  }
}

/* Device buffers for data_host's inputs (copied) and outputs. */
static void data_device(data *x, const fm_fragment *f, int64_t outer) {
  for (uint32_t i = 0; i < f->n_inputs; i++) {
    size_t bytes = gu_span(&f->inputs[i], outer) * fm_dtype_size(f->inputs[i].dtype);
    x->d_in[i] = gu_dalloc(cu, bytes);
    gu_h2d(cu, x->d_in[i], x->h_in[i], bytes);
    x->ins[i] = (void *)(uintptr_t)x->d_in[i];
  }
  for (uint32_t i = 0; i < f->n_outputs; i++) {
    x->d_out[i] = gu_dalloc(cu, x->n_out[i] * fm_dtype_size(f->outputs[i].dtype));
    x->outs[i] = (void *)(uintptr_t)x->d_out[i];
  }
}

static void data_init(data *x, const fm_fragment *f, int64_t outer, gu_rng *rng) {
  data_host(x, f, outer, rng);
  data_device(x, f, outer);
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

/* ---- the correctness suite --------------------------------------------------------- */

/* Case ci's kernels on host data x whose reference is computed (ref_ok) or failed. */
static void check_case(int ci, data *px, int ref_ok) {
  tcase *c = &cases[ci];
  const fm_fragment *f = &c->canon;
  data x = *px;
  fm_diag d = {{0}};
  data_device(&x, f, c->outer);
  for (int i = 0; i < n_jobs; i++) {
    job *j = &jobs[i];
    fm_module *m = NULL;
    int ok = ref_ok;
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
    for (uint32_t k = 0; k < f->n_outputs; k++) /* NaN in every float dtype */
      cu->cuMemsetD8(x.d_out[k], 0xff, x.n_out[k] * fm_dtype_size(f->outputs[k].dtype));
    fm_CUresult r = 0;
    if (fm_module_launch(m, x.ins, x.outs, c->outer, NULL, &d) || (r = cu->cuCtxSynchronize())) {
      printf("FAIL %s [%s]: launch: %s (cuda %d)\n", c->name, j->desc, d.text, r);
      fm_module_unload(m);
      failed++;
      if (r) exit(3); /* the context is gone */
      continue;
    }
    for (uint32_t k = 0; ok && k < f->n_outputs; k++) {
      const fm_tensor *t = &f->outputs[k];
      gu_d2h(cu, x.h_out[k], x.d_out[k], x.n_out[k] * fm_dtype_size(t->dtype));
      double e = gu_rel_err(x.h_out[k], t->dtype, x.h_ref[k], t->dtype, x.n_out[k]);
      if (!(e <= fm_reference_tolerance(f, k))) { /* NaN fails too */
        printf("FAIL %s [%s] out%u rel_err=%.3e (tol %.0e)\n", c->name, j->desc, k, e, fm_reference_tolerance(f, k));
        ok = 0;
      }
    }
    if (ok) printf("ok   %s [%s]\n", c->name, j->desc);
    if (ok)
      passed++;
    else
      failed++;
    fm_module_unload(m);
  }
  data_free(&x, f);
  fflush(stdout);
}

static void run_case(int ci, gu_rng *rng) {
  tcase *c = &cases[ci];
  data x;
  fm_diag d = {{0}};
  data_host(&x, &c->canon, c->outer, rng);
  int ref_ok = fm_reference_eval(&c->canon, c->outer, (const void *const *)x.h_in, x.h_ref, &d) == FM_OK;
  if (!ref_ok) printf("FAIL %s: reference: %s\n", c->name, d.text);
  check_case(ci, &x, ref_ok);
}

/* ---- the skinny (decode) suite ------------------------------------------------------
 * nn.Linear layouts, M in {1, 3, 8, 16} (3 and 16 symbolic with that M bucket, as the
 * client sends decode batches) x (N, K) in {(11008, 4096), (4096, 11008), (100, 72),
 * (4096, 4096)} x {bias + GELU, residual + relu}, every skinny candidate; then an M bucket of 8
 * run at M = 1000 (the tuner verifies there: 63 row tiles) with every candidate. The fp64
 * references (up to 0.7 G multiply-adds each) are computed by N_THREADS threads first. */

static int skinny_first, skinny_end, next_prep;
static data prep[MAX_CASES];
static int prep_ok[MAX_CASES];
static uint64_t prep_seed;

static void *prep_worker(void *arg) {
  (void)arg;
  for (;;) {
    pthread_mutex_lock(&lock);
    int ci = next_prep < skinny_end ? next_prep++ : -1;
    pthread_mutex_unlock(&lock);
    if (ci < 0) return NULL;
    gu_rng rng = {prep_seed ^ ((uint64_t)(ci + 1) * 0x9e3779b97f4a7c15ull)};
    fm_diag d = {{0}};
    data_host(&prep[ci], &cases[ci].canon, cases[ci].outer, &rng);
    prep_ok[ci] = fm_reference_eval(&cases[ci].canon, cases[ci].outer, (const void *const *)prep[ci].h_in,
                                    prep[ci].h_ref, &d) == FM_OK;
    if (!prep_ok[ci]) printf("FAIL %s: reference: %s\n", cases[ci].name, d.text);
  }
}

/* Adds case (e, dt, m, hint, n, k) with its candidates (only the skinny ones unless all). */
static void add_skinny_case(int e, fm_dtype dt, int64_t m, uint64_t hint, int64_t n, int64_t k, int all) {
  tcase *c = &cases[n_cases];
  snprintf(c->name, sizeof c->name, "decode %s %s M=%lld%s N=%lld K=%lld", epi_name[e], fm_dtype_name(dt), (long long)m,
           hint ? " (sym)" : "", (long long)n, (long long)k);
  c->outer = m;
  if (build(e, dt, hint ? -1 : m, hint, n, k, 0, 1, &c->canon)) {
    failed++;
    return;
  }
  fm_candidate cand[MAX_CANDS];
  size_t nc = fm_codegen_candidates(&c->canon, cand, MAX_CANDS), ns = 0;
  for (size_t i = 0; i < nc && n_jobs < MAX_JOBS; i++) {
    if (!all && cand[i].tmpl != FM_TMPL_SKINNY) continue;
    if (cand[i].tmpl == FM_TMPL_CUBLASLT) continue; /* plans: test_blas_gpu */
    job *j = &jobs[n_jobs++];
    memset(j, 0, sizeof *j);
    j->c = n_cases;
    j->cand = cand[i];
    fm_candidate_describe(&cand[i], j->desc, sizeof j->desc);
    ns += cand[i].tmpl == FM_TMPL_SKINNY;
  }
  if (ns == 0) {
    printf("FAIL %s: no skinny candidates\n", c->name);
    failed++;
  }
  n_cases++;
}

static void add_skinny_cases(void) {
  static const int64_t ms[] = {1, 3, 8, 16};
  static const int64_t nk[][2] = {{11008, 4096}, {4096, 11008}, {100, 72}, {4096, 4096}};
  skinny_first = n_cases;
  for (size_t mi = 0; mi < sizeof ms / sizeof ms[0]; mi++)
    for (size_t s = 0; s < sizeof nk / sizeof nk[0]; s++)
      for (int r = 0; r < 2; r++) {
        int sym = ms[mi] == 3 || ms[mi] == 16;
        fm_dtype dt = r && nk[s][0] == 100 ? FM_DT_F16 : FM_DT_BF16;
        add_skinny_case(r ? E_RESIDUAL : E_GELU, dt, ms[mi], sym ? (uint64_t)ms[mi] : 0, nk[s][0], nk[s][1], 0);
      }
  add_skinny_case(E_EXTRA, FM_DT_BF16, 1000, 8, 100, 72, 1);
  skinny_end = n_cases;
}

static void run_skinny_cases(uint64_t seed) {
  pthread_t th[N_THREADS];
  prep_seed = seed;
  next_prep = skinny_first;
  for (int i = 0; i < N_THREADS; i++) pthread_create(&th[i], NULL, prep_worker, NULL);
  for (int i = 0; i < N_THREADS; i++) pthread_join(th[i], NULL);
  for (int ci = skinny_first; ci < skinny_end; ci++) check_case(ci, &prep[ci], prep_ok[ci]);
}

/* ---- timing ------------------------------------------------------------------------ */

static double gelu(double v) { return 0.5 * v * (1.0 + erf(v * M_SQRT1_2)); }

/* bias + gelu, bf16, x [M, K] row-major @ W.t() (B [K, N] column-major) + bias [N]. */
static void time_shape(int64_t m, int64_t n, int64_t k, gu_rng *rng) {
  fm_fragment canon;
  if (build(E_GELU, FM_DT_BF16, -1, 0, n, k, 0, 1, &canon)) {
    failed++;
    return;
  }
  fm_candidate cand[MAX_CANDS];
  size_t nc = fm_codegen_candidates(&canon, cand, MAX_CANDS);
  data x;
  data_init(&x, &canon, m, rng);
  double flops = 2.0 * (double)m * (double)n * (double)k, best = 1e30;
  char best_desc[96] = "";
  fm_CUevent e0, e1;
  cu->cuEventCreate(&e0, 0);
  cu->cuEventCreate(&e1, 0);
  for (size_t i = 0; i < nc; i++) {
    char desc[96], *src = NULL, *log = NULL;
    fm_compiled kc;
    fm_module *mod = NULL;
    fm_diag d = {{0}};
    memset(&kc, 0, sizeof kc);
    if (cand[i].tmpl == FM_TMPL_CUBLASLT) continue; /* timed by the tuner: test_blas_gpu */
    fm_candidate_describe(&cand[i], desc, sizeof desc);
    if (fm_codegen_generate(&canon, &cand[i], dev.sm_count, &src, &kc.meta, &d) ||
        fm_nvrtc_compile(src, "gemm.cu", dev.arch, &kc.cubin, &kc.cubin_len, &log) || fm_module_load(&kc, &mod, &d)) {
      printf("FAIL time %lldx%lldx%lld [%s]: %s\n", (long long)m, (long long)n, (long long)k, desc, log ? log : d.text);
      failed++;
      free(src);
      free(log);
      free(kc.cubin);
      continue;
    }
    free(src);
    free(log);
    cu->cuMemsetD8(x.d_out[0], 0xff, x.n_out[0] * 2);
    float t[20];
    int bad = 0;
    for (int w = 0; w < 3; w++) bad |= fm_module_launch(mod, x.ins, x.outs, m, NULL, &d);
    for (int r = 0; r < 20 && !bad; r++) {
      cu->cuEventRecord(e0, NULL);
      bad |= fm_module_launch(mod, x.ins, x.outs, m, NULL, &d);
      cu->cuEventRecord(e1, NULL);
      cu->cuEventSynchronize(e1);
      cu->cuEventElapsedTime(&t[r], e0, e1);
    }
    if (bad || cu->cuCtxSynchronize()) {
      printf("FAIL time [%s]: launch: %s\n", desc, d.text);
      failed++;
      fm_module_unload(mod);
      free(kc.cubin);
      continue;
    }
    /* spot check 256 elements against an fp64 dot product */
    gu_d2h(cu, x.h_out[0], x.d_out[0], x.n_out[0] * 2);
    double num = 0, den = 0;
    for (int s = 0; s < 256; s++) {
      int64_t r = (int64_t)gu_below(rng, (uint32_t)m), q = (int64_t)gu_below(rng, (uint32_t)n);
      double acc = gu_load(x.h_in[2], FM_DT_BF16, (size_t)q);
      for (int64_t kk = 0; kk < k; kk++)
        acc +=
            gu_load(x.h_in[0], FM_DT_BF16, (size_t)(r * k + kk)) * gu_load(x.h_in[1], FM_DT_BF16, (size_t)(q * k + kk));
      double want = gelu(acc), got = gu_load(x.h_out[0], FM_DT_BF16, (size_t)(r * n + q));
      num += (got - want) * (got - want);
      den += want * want;
    }
    double err = isfinite(num) && den > 0 ? sqrt(num / den) : INFINITY;
    double ms = gu_median(t, 20);
    int good = err <= 1e-2;
    printf("%s time M=%lld N=%lld K=%lld bias+gelu bf16 [%s]: %.4f ms, %.1f TFLOP/s, spot rel_err %.1e\n",
           good ? "ok  " : "FAIL", (long long)m, (long long)n, (long long)k, desc, ms, flops / (ms * 1e-3) / 1e12, err);
    if (good)
      passed++;
    else
      failed++;
    if (good && ms < best) {
      best = ms;
      snprintf(best_desc, sizeof best_desc, "%s", desc);
    }
    fm_module_unload(mod);
    free(kc.cubin);
  }
  if (best < 1e30)
    printf("best M=%lld N=%lld K=%lld bias+gelu bf16: %.4f ms, %.1f TFLOP/s (%.0f%% of 989 dense bf16 peak) [%s]\n",
           (long long)m, (long long)n, (long long)k, best, flops / (best * 1e-3) / 1e12,
           100.0 * flops / (best * 1e-3) / 989e12, best_desc);
  cu->cuEventDestroy(e0);
  cu->cuEventDestroy(e1);
  data_free(&x, &canon);
  fflush(stdout);
}

/* One case of the regular suite: epilogue, dtype, symbolic M and layouts rotate with idx;
 * every candidate the filter keeps becomes a job. */
static void add_regular_case(int64_t m, int64_t n, int64_t k, int idx) {
  int e = idx % E__N;
  fm_dtype dt = idx % 2 ? FM_DT_F16 : FM_DT_BF16;
  int symbolic = idx % 3 == 0, a_col = (idx / 2) % 2, b_col = (idx / 4) % 2 == 0;
  tcase *c = &cases[n_cases];
  snprintf(c->name, sizeof c->name, "%s %s M=%lld%s N=%lld K=%lld A %s B %s", epi_name[e], fm_dtype_name(dt),
           (long long)m, symbolic ? " (sym)" : "", (long long)n, (long long)k, symbolic || !a_col ? "row" : "col",
           b_col ? "col" : "row");
  c->outer = m;
  if (build(e, dt, symbolic ? -1 : m, 0, n, k, a_col, b_col, &c->canon)) {
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
    char desc[sizeof jobs[0].desc];
    fm_candidate_describe(&cand[i], desc, sizeof desc);
    /* cuBLASLt plans run through libfusemld, not a CUBIN of their own: test_blas_gpu */
    if (!gu_picked(desc) || cand[i].tmpl == FM_TMPL_CUBLASLT) continue;
    job *j = &jobs[n_jobs++];
    memset(j, 0, sizeof *j);
    j->c = n_cases;
    j->cand = cand[i];
    memcpy(j->desc, desc, sizeof desc);
  }
  n_cases++;
}

int main(int argc, char **argv) {
  static const int64_t ms[] = {1, 7, 64, 127, 128, 700, 4099};
  static const int64_t ns[] = {8, 64, 100, 136, 1024}; /* 100: rows not 16-byte aligned */
  static const int64_t ks[] = {8, 64, 136, 1024};
  uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 0) : 0x6e33;
  fm_diag d = {{0}};
  if (fm_cuda_load(&cu, &d) || fm_cuda_device_id(0, &dev, &d)) {
    fprintf(stderr, "no GPU: %s\n", d.text);
    return 2;
  }
  printf("device %s (%s, %u SMs), seed %#" PRIx64 "\n", dev.name, dev.arch, dev.sm_count, seed);
  /* buffers are allocated before any module is loaded: make device 0's primary context
     current first (the one fm_module_load would pick) */
  fm_CUdevice cdev;
  fm_CUcontext ctx;
  if (cu->cuDeviceGet(&cdev, 0) || cu->cuDevicePrimaryCtxRetain(&ctx, cdev) || cu->cuCtxSetCurrent(ctx)) {
    fprintf(stderr, "cannot make the primary context current\n");
    return 2;
  }
  const char *mode = argc > 2 ? argv[2] : "both";
  int skinny_only = strcmp(mode, "skinny") == 0, regular = strcmp(mode, "regular") == 0;
  int check = strcmp(mode, "time") != 0 && !skinny_only;
  int timing = strcmp(mode, "check") != 0 && !skinny_only && !regular;
  int idx = 0;
  for (size_t mi = 0; check && mi < sizeof ms / sizeof ms[0]; mi++)
    for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++, idx++) {
      int64_t m = ms[mi], n = ns[ni], k = ks[(size_t)idx % 4];
      while (k > 8 && (double)m * (double)n * (double)k > 3e8) k = k == 1024 ? 136 : k == 136 ? 64 : 8;
      add_regular_case(m, n, k, idx);
    }
  /* More tiles than blocks with K past the stages: the persistent forms' blocks walk two or
     more tiles each, their mbarrier phases carried from tile to tile (and, ping-pong, the
     turns between warpgroups). idx 24: bias + gelu, bf16, symbolic M, nn.Linear layouts. */
  if (check) add_regular_case(16384, 136, 512, 24);
  int regular_end = n_cases;
  if ((check && !regular) || skinny_only) add_skinny_cases();
  printf("%d cases, %d kernels to compile\n", n_cases, n_jobs);
  fflush(stdout);
  pthread_t th[N_THREADS];
  for (int i = 0; i < N_THREADS; i++) pthread_create(&th[i], NULL, compile_worker, NULL);
  for (int i = 0; i < N_THREADS; i++) pthread_join(th[i], NULL);
  gu_rng rng = {seed};
  for (int ci = 0; ci < regular_end; ci++) run_case(ci, &rng);
  if (skinny_end > skinny_first) run_skinny_cases(seed);
  for (int i = 0; i < n_jobs; i++) {
    free(jobs[i].k.cubin);
    free(jobs[i].err);
  }
  if (timing) {
    time_shape(4096, 4096, 4096, &rng);
    time_shape(16384, 1024, 256, &rng);
    time_shape(16384, 256, 1024, &rng);
  }
  cu->cuDevicePrimaryCtxRelease(cdev);
  printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
