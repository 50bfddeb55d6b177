/* gemm_bench.c (device machine only): the gemm template against cuBLASLt in one process.
 *
 * nn.Linear layouts in bf16: x [M, K] row-major, W [N, K] row-major (the fragment's B =
 * W.t(), K-major), bias [N], out [M, N] row-major. For each shape it times
 *   - cuBLASLt plain GEMM (out = x @ W.t()), best of its first heuristic algorithms;
 *   - cuBLASLt with CUBLASLT_EPILOGUE_GELU_BIAS (tanh GELU), likewise;
 *   - every candidate of the gemm template with bias + GELU (erf, torch's default), the
 *     fragment's M symbolic as torch.compile sends it;
 * each verified first (outputs poisoned with NaN, every element checked finite, 512 sampled
 * elements against an fp64 dot product: rel err <= 1e-2), then timed with CUDA events
 * (5 warm-up launches, median of REPS queued back to back, x and W rotated over copies
 * spanning >= 256 MiB so L2 never holds the previous launch's operands). Prints one line per
 * kernel and a summary table: time, TFLOP/s, and ours / cuBLASLt-plain as a time ratio (< 1: ours faster); for
 * decode shapes (M <= 64) also the copy floor (a device-to-device copy of W, halved: reading
 * W once at copy bandwidth) and each kernel's GB/s of W and % of that floor. The fragment
 * carries m_hint = M, so decode shapes time the skinny template too.
 *
 * Usage: gemm_bench [REPS]   env FM_BENCH_SHAPES=0,3,...  picks shapes (indices below);
 * FM_BENCH_CANDS="sub;sub" keeps the candidates whose description contains one of them;
 * FM_BENCH_EXTRA="p0,...,p9;..." adds gemm candidates by their raw parameters (fm_gemm_config
 * field by field) ("s" before
 * one: a skinny-template candidate);
 * FM_BENCH_EPI=bias fuses the bias alone into ours (no GELU); FM_BENCH_EPI=residual the bias
 * and a residual [M, N] added after it (an MLP's second GEMM: out = x @ W.t() + b + r, r
 * rotated with x); FM_BENCH_EPI=plain the product alone (mm, no bias), the same work as
 * cuBLASLt's plain GEMM; FM_BENCH_SUSTAIN_MS=T (0..60000) also runs each kernel back to back for
 * ~T ms (below, run_sustained); FM_BENCH_SUSTAIN_SPLIT=1 puts a memset between those launches.
 * Exit status 1 if any kernel failed verification. */
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cublasLt.h>

#include "fm_client.h"
#include "fm_codegen.h"
#include "fm_cuda.h"
#include "fm_fragment.h"
#include "fm_nvrtc.h"
#include "gpu_util.h"

typedef struct shape {
  int64_t m, n, k;
} shape;

static const shape shapes[] = {
    {4096, 4096, 4096},
    {8192, 8192, 8192},
    {16384, 1024, 256},
    {16384, 256, 1024},
    {2048, 4096, 1024},
    {2048, 1024, 4096},
    {8, 11008, 4096},
    {8, 4096, 11008},
    {1, 4096, 4096},
    {16, 4096, 4096},
    {32, 4096, 4096},
    /* the benchmark table's large and prefill MLP GEMMs */
    {16384, 16384, 4096},
    {16384, 4096, 16384},
    {4096, 11008, 4096},
    {4096, 4096, 11008},
};
#define N_SHAPES     (sizeof shapes / sizeof shapes[0])
#define MAX_CANDS    32
#define MAX_EXTRA    8
#define MAX_JOBS     (N_SHAPES * (MAX_CANDS + MAX_EXTRA))
#define MAX_REPS     200
#define N_THREADS    16
#define ROTATE_BYTES (256ull << 20)
#define MAX_ROT      64
#define WORKSPACE    (64u << 20)
#define N_ALGOS      4
#define SAMPLES      512

typedef struct job {
  int s;
  fm_candidate cand;
  fm_compiled k;
  char *err;
  int rc;
} job;

static const fm_cuda *cu;
static fm_device_id dev;
static fm_fragment canon[N_SHAPES];
static job jobs[MAX_JOBS];
static int n_jobs, next_job, reps = 30, failed;
/* ours: bias + GELU (erf), or with FM_BENCH_EPI=bias the bias alone (what GELU costs),
   =residual bias + a residual [M, N], =plain the product alone (mm, no bias: the same work as
   cuBLASLt's plain GEMM) */
enum { EPI_NONE, EPI_GELU_ERF, EPI_GELU_TANH, EPI_BIAS, EPI_RESIDUAL, EPI_PLAIN };
static int ours_epi = EPI_GELU_ERF;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

/* ---- the fragment: addmm(bias, x, W.t()) -> gelu, M symbolic ----------------------- */

static void tensor2(fm_tensor *t, uint32_t id, int64_t d0, int64_t d1, int64_t s0, int64_t s1) {
  memset(t, 0, sizeof *t);
  t->id = id;
  t->dtype = FM_DT_BF16;
  t->rank = 2;
  t->shape[0] = d0;
  t->shape[1] = d1;
  t->strides[0] = s0;
  t->strides[1] = s1;
  t->align = 16;
}

static int build(const shape *s, fm_fragment *out) {
  static fm_fragment f;
  fm_diag d = {{0}};
  memset(&f, 0, sizeof f);
  f.vocab = 3;
  f.m_hint = (uint64_t)s->m;                     /* the batch size, as the client sends it */
  tensor2(&f.inputs[0], 1, -1, s->k, s->k, 1);   /* x [M, K] */
  tensor2(&f.inputs[1], 2, s->k, s->n, 1, s->k); /* W.t(): [K, N], K contiguous */
  fm_tensor *b = &f.inputs[2];
  memset(b, 0, sizeof *b);
  b->id = 3;
  b->dtype = FM_DT_BF16;
  b->rank = 1;
  b->shape[0] = s->n;
  b->strides[0] = 1;
  b->align = 16;
  f.n_inputs = 3;
  if (ours_epi == EPI_RESIDUAL) tensor2(&f.inputs[f.n_inputs++], 4, -1, s->n, s->n, 1); /* r [M, N] */
  if (ours_epi == EPI_PLAIN) f.n_inputs = 2;                                            /* no bias */
  fm_opnode *o = &f.ops[0];
  memset(o, 0, 2 * sizeof *o);
  o[0].op = FM_OP_ADDMM;
  o[0].out = 10;
  o[0].nargs = 3;
  o[0].args[0] = 3;
  o[0].args[1] = 1;
  o[0].args[2] = 2;
  if (ours_epi == EPI_PLAIN) { /* mm(x, W.t()) */
    o[0].op = FM_OP_MM;
    o[0].nargs = 2;
    o[0].args[0] = 1;
    o[0].args[1] = 2;
  }
  o[1].op = ours_epi == EPI_RESIDUAL ? FM_OP_ADD : FM_OP_GELU;
  o[1].out = 11;
  o[1].nargs = ours_epi == EPI_RESIDUAL ? 2 : 1;
  o[1].args[0] = 10;
  o[1].args[1] = 4;
  const int one_op = ours_epi == EPI_BIAS || ours_epi == EPI_PLAIN;
  f.n_ops = one_op ? 1 : 2;
  tensor2(&f.outputs[0], one_op ? 10 : 11, -1, s->n, s->n, 1);
  f.n_outputs = 1;
  int rc = fm_fragment_validate(&f, &d);
  if (!rc) rc = fm_fragment_canonicalize(&f, out);
  if (rc) printf("FAIL build: %s\n", d.text);
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
    j->rc = gu_build_candidate(&canon[j->s], &j->cand, dev.sm_count, dev.arch, "gemm.cu", &j->k.cubin, &j->k.cubin_len,
                               &j->k.meta, &j->err);
  }
}

/* ---- candidate selection (for profiling and experiments) --------------------------- */

/* FM_BENCH_CANDS="sub1;sub2": only candidates whose description contains one of them. */
static int picked(const fm_candidate *c) {
  const char *env = getenv("FM_BENCH_CANDS");
  char desc[96], want[96];
  /* the cuBLASLt plan: this benchmark times cuBLASLt itself, beside the kernels */
  if (c->tmpl == FM_TMPL_CUBLASLT) return 0;
  if (!env || !*env) return 1;
  fm_candidate_describe(c, desc, sizeof desc);
  for (const char *p = env; *p;) {
    size_t len = strcspn(p, ";");
    if (len > 0 && len < sizeof want) {
      memcpy(want, p, len);
      want[len] = 0;
      if (strstr(desc, want)) return 1;
    }
    p += len;
    if (*p) p++;
  }
  return 0;
}

/* FM_BENCH_EXTRA="p0,p1,...,p9;...": gemm candidates beyond the template's list (raw
 * candidate parameters, fm_codegen.h), each verified and timed like the others; an entry
 * that starts with 's' ("s8,16,2,1") is a skinny-template one (cols, warps, unroll, pipe). */
static size_t extra_candidates(fm_candidate *out, size_t max) {
  const char *p = getenv("FM_BENCH_EXTRA");
  size_t n = 0;
  while (p && *p && n < max) {
    fm_candidate c;
    memset(&c, 0, sizeof c);
    c.tmpl = FM_TMPL_GEMM;
    if (*p == 's') {
      c.tmpl = FM_TMPL_SKINNY;
      p++;
    }
    for (int k = 0; k < FM_CANDIDATE_PARAMS && *p && *p != ';'; k++) {
      char *end;
      c.p[k] = (uint32_t)strtoul(p, &end, 10);
      if (end == p) return n;
      p = *end == ',' ? end + 1 : end;
    }
    out[n++] = c;
    if (*p == ';') p++;
  }
  return n;
}

/* ---- data and verification --------------------------------------------------------- */

typedef struct bufs {
  uint16_t *hx, *hw, *hb, *hr, *hout; /* hr: the residual (EPI_RESIDUAL), rotated with x */
  fm_CUdeviceptr x[MAX_ROT], w[MAX_ROT], r[MAX_ROT], bias, out, ws;
  int rot;
} bufs;

static double gelu_erf(double v) { return 0.5 * v * (1.0 + erf(v * M_SQRT1_2)); }
static double gelu_tanh(double v) { return 0.5 * v * (1.0 + tanh(0.7978845608028654 * (v + 0.044715 * v * v * v))); }

/* Every element finite (NaN poison catches unwritten ones) and SAMPLES elements, the last
 * row and column among them, within 1e-2 of fp64. Returns the relative error (inf: bad). */
static double verify(const shape *s, bufs *b, int epi) {
  size_t n = (size_t)(s->m * s->n);
  if (gu_d2h(cu, b->hout, b->out, n * 2)) return INFINITY;
  for (size_t i = 0; i < n; i++)
    if ((b->hout[i] & 0x7f80) == 0x7f80) return INFINITY;
  gu_rng rng = {0x5eed};
  double num = 0, den = 0;
  for (int t = 0; t < SAMPLES; t++) {
    int64_t r = t == 0 ? s->m - 1 : (int64_t)gu_below(&rng, (uint32_t)s->m);
    int64_t q = t == 1 ? s->n - 1 : (int64_t)gu_below(&rng, (uint32_t)s->n);
    double acc = 0;
    for (int64_t kk = 0; kk < s->k; kk++)
      acc += (double)gu_bf16_to_f32(b->hx[r * s->k + kk]) * (double)gu_bf16_to_f32(b->hw[q * s->k + kk]);
    if (epi != EPI_NONE && epi != EPI_PLAIN) acc += gu_bf16_to_f32(b->hb[q]);
    if (epi == EPI_RESIDUAL) acc += gu_bf16_to_f32(b->hr[r * s->n + q]);
    double want = epi == EPI_GELU_ERF ? gelu_erf(acc) : epi == EPI_GELU_TANH ? gelu_tanh(acc) : acc;
    double got = gu_bf16_to_f32(b->hout[r * s->n + q]) - want;
    num += got * got;
    den += want * want;
  }
  return den > 0 && isfinite(num) ? sqrt(num / den) : INFINITY;
}

static int bufs_init(const shape *s, bufs *b) {
  memset(b, 0, sizeof *b);
  size_t nx = (size_t)(s->m * s->k), nw = (size_t)(s->n * s->k);
  b->hx = malloc(nx * 2);
  b->hw = malloc(nw * 2);
  b->hb = malloc((size_t)s->n * 2);
  b->hout = malloc((size_t)(s->m * s->n) * 2);
  size_t nr = ours_epi == EPI_RESIDUAL ? (size_t)(s->m * s->n) : 0;
  b->hr = nr ? malloc(nr * 2) : NULL;
  if (!b->hx || !b->hw || !b->hb || !b->hout || (nr && !b->hr)) return -1;
  gu_rng rng = {0x6e33 ^ (uint64_t)(s->m * 31 + s->n * 7 + s->k)};
  double scale = 1.0 / sqrt(sqrt((double)s->k)); /* sums over K stay O(1) */
  for (size_t i = 0; i < nx; i++) b->hx[i] = gu_f32_to_bf16((float)(gu_uniform(&rng, -1, 1) * scale));
  for (size_t i = 0; i < nw; i++) b->hw[i] = gu_f32_to_bf16((float)(gu_uniform(&rng, -1, 1) * scale));
  for (int64_t i = 0; i < s->n; i++) b->hb[i] = gu_f32_to_bf16((float)gu_uniform(&rng, -0.5, 0.5));
  for (size_t i = 0; i < nr; i++) b->hr[i] = gu_f32_to_bf16((float)gu_uniform(&rng, -1, 1));
  size_t per = (nx + nw + nr) * 2;
  b->rot = (int)((ROTATE_BYTES + per - 1) / per);
  if (b->rot > MAX_ROT) b->rot = MAX_ROT;
  for (int r = 0; r < b->rot; r++) {
    if (!(b->x[r] = gu_dalloc(cu, nx * 2)) || !(b->w[r] = gu_dalloc(cu, nw * 2))) return -1;
    if (gu_h2d(cu, b->x[r], b->hx, nx * 2) || gu_h2d(cu, b->w[r], b->hw, nw * 2)) return -1;
    if (nr && (!(b->r[r] = gu_dalloc(cu, nr * 2)) || gu_h2d(cu, b->r[r], b->hr, nr * 2))) return -1;
  }
  if (!(b->bias = gu_dalloc(cu, (size_t)s->n * 2)) || gu_h2d(cu, b->bias, b->hb, (size_t)s->n * 2)) return -1;
  if (!(b->out = gu_dalloc(cu, (size_t)(s->m * s->n) * 2)) || !(b->ws = gu_dalloc(cu, WORKSPACE))) return -1;
  return 0;
}

static void bufs_free(bufs *b) {
  for (int r = 0; r < b->rot; r++) {
    if (b->x[r]) cu->cuMemFree(b->x[r]);
    if (b->w[r]) cu->cuMemFree(b->w[r]);
    if (b->r[r]) cu->cuMemFree(b->r[r]);
  }
  if (b->bias) cu->cuMemFree(b->bias);
  if (b->out) cu->cuMemFree(b->out);
  if (b->ws) cu->cuMemFree(b->ws);
  free(b->hx);
  free(b->hw);
  free(b->hb);
  free(b->hr);
  free(b->hout);
}

static void *dp(fm_CUdeviceptr p) { return (void *)(uintptr_t)p; }

/* ---- timing ------------------------------------------------------------------------ */

typedef int (*launch_fn)(void *ctx, const bufs *b, int r);

/* FM_BENCH_SUSTAIN_MS: each kernel also runs back to back (no wait between launches) for
 * about that long after its median is taken. The median covers ~50 launches, too few for
 * the clock to settle; this is the time a launch takes once the GPU sits at its power limit,
 * and its wall-clock window (CLOCK_REALTIME) lets bench/device/gemm-power match a power
 * and clock log to it (bench/NOTES.md, "Timed back to back"). */
typedef struct sustained {
  double ms; /* per launch; < 0: not run or failed */
  int launches;
  double t0, t1; /* wall clock, seconds since the epoch */
} sustained;
static double sustain_ms;
/* FM_BENCH_SUSTAIN_SPLIT=1: a 4-byte memset of the output between the back-to-back launches,
 * so that no launch follows another kernel directly: what a kernel gains from starting
 * under its predecessor's tail (programmatic dependent launch) then shows as a difference. */
static int sustain_split;

static double wall_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void run_sustained(launch_fn fn, void *ctx, const bufs *b, double median, sustained *out) {
  fm_CUevent e0, e1;
  float total = 0;
  int n = median > 0 ? (int)(sustain_ms / median) : 0, bad = 0;
  out->ms = -1;
  out->launches = n;
  if (sustain_ms <= 0 || n < 1) return;
  cu->cuEventCreate(&e0, 0);
  cu->cuEventCreate(&e1, 0);
  out->t0 = wall_now();
  cu->cuEventRecord(e0, NULL);
  for (int r = 0; r < n && !bad; r++) {
    if (sustain_split) bad |= cu->cuMemsetD8(b->out, 0, 4) != 0;
    bad |= fn(ctx, b, r);
  }
  cu->cuEventRecord(e1, NULL);
  bad |= cu->cuEventSynchronize(e1) != 0;
  out->t1 = wall_now();
  cu->cuEventElapsedTime(&total, e0, e1);
  cu->cuEventDestroy(e0);
  cu->cuEventDestroy(e1);
  if (!bad) out->ms = total / n;
}

static void print_sustained(const sustained *s) {
  if (s->ms > 0)
    printf("     sustained: %.4f ms a launch, %d back to back, wall %.3f %.3f\n", s->ms, s->launches, s->t0, s->t1);
}

/* Median ms of reps launches (operands rotated), after 5 warm-ups; < 0 on a failed launch.
 * The launches are queued back to back with an event pair around each and one wait at the
 * end, as the tuner times them: each pair then spans the kernel alone. Waiting after every
 * launch (as this did before 2026-11-26) also timed the host's launch call whenever the GPU
 * sat idle under it, some 2-8 us a launch and more for cuBLASLt's than for ours, which
 * flattered our kernels at the short shapes (bench/NOTES.md, "Timed back to back").
 * With sus, also the back-to-back run above. */
static double time_it(launch_fn fn, void *ctx, const bufs *b, sustained *sus) {
  static float t[MAX_REPS];
  static fm_CUevent ev[2 * MAX_REPS];
  int bad = 0;
  for (int r = 0; r < 2 * reps; r++) cu->cuEventCreate(&ev[r], 0);
  for (int w = 0; w < 5; w++) bad |= fn(ctx, b, w);
  for (int r = 0; r < reps && !bad; r++) {
    cu->cuEventRecord(ev[2 * r], NULL);
    bad |= fn(ctx, b, r + 5);
    cu->cuEventRecord(ev[2 * r + 1], NULL);
  }
  bad |= cu->cuCtxSynchronize() != 0;
  for (int r = 0; r < reps && !bad; r++) bad |= cu->cuEventElapsedTime(&t[r], ev[2 * r], ev[2 * r + 1]) != 0;
  for (int r = 0; r < 2 * reps; r++) cu->cuEventDestroy(ev[r]);
  double median = bad ? -1.0 : gu_median(t, (size_t)reps);
  if (sus) run_sustained(fn, ctx, b, median, sus);
  return median;
}

typedef struct lt_ctx {
  cublasLtHandle_t h;
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t la, lb, lc;
  cublasLtMatmulAlgo_t algo;
} lt_ctx;

/* Column-major view: out^T [N, M] = (W [K, N] col-major)^T @ x^T [K, M] col-major. */
static int lt_launch(void *vctx, const bufs *b, int r) {
  lt_ctx *c = vctx;
  const float alpha = 1.0f, beta = 0.0f;
  int i = r % b->rot;
  return cublasLtMatmul(c->h, c->op, &alpha, dp(b->w[i]), c->la, dp(b->x[i]), c->lb, &beta, dp(b->out), c->lc,
                        dp(b->out), c->lc, &c->algo, dp(b->ws), WORKSPACE, NULL) != CUBLAS_STATUS_SUCCESS;
}

/* Best verified time of cuBLASLt's first N_ALGOS heuristic algorithms (ms; < 0: none);
 * *best_sus: the best sustained time among them (FM_BENCH_SUSTAIN_MS; < 0: not run). */
static double time_cublaslt(cublasLtHandle_t h, const shape *s, bufs *b, int gelu_bias, char *desc, size_t cap,
                            double *best_sus) {
  lt_ctx c;
  memset(&c, 0, sizeof c);
  c.h = h;
  double best = -1;
  *best_sus = -1;
  cublasLtMatmulPreference_t pref = NULL;
  cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  uint64_t wsz = WORKSPACE;
  cublasLtEpilogue_t epi = gelu_bias ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  void *bias = dp(b->bias);
  cublasLtMatmulHeuristicResult_t res[N_ALGOS];
  int nres = 0;
  snprintf(desc, cap, "none");
  if (cublasLtMatmulDescCreate(&c.op, CUBLAS_COMPUTE_32F, CUDA_R_32F) ||
      cublasLtMatmulDescSetAttribute(c.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta) ||
      cublasLtMatmulDescSetAttribute(c.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb) ||
      cublasLtMatmulDescSetAttribute(c.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi) ||
      (gelu_bias && cublasLtMatmulDescSetAttribute(c.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias)) ||
      cublasLtMatrixLayoutCreate(&c.la, CUDA_R_16BF, (uint64_t)s->k, (uint64_t)s->n, s->k) ||
      cublasLtMatrixLayoutCreate(&c.lb, CUDA_R_16BF, (uint64_t)s->k, (uint64_t)s->m, s->k) ||
      cublasLtMatrixLayoutCreate(&c.lc, CUDA_R_16BF, (uint64_t)s->n, (uint64_t)s->m, s->n) ||
      cublasLtMatmulPreferenceCreate(&pref) ||
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsz, sizeof wsz) ||
      cublasLtMatmulAlgoGetHeuristic(h, c.op, c.la, c.lb, c.lc, c.lc, pref, N_ALGOS, res, &nres) || nres == 0) {
    printf("FAIL cublaslt%s: setup or heuristic failed\n", gelu_bias ? " gelu_bias" : "");
    failed++;
    goto out;
  }
  for (int a = 0; a < nres; a++) {
    c.algo = res[a].algo;
    cu->cuMemsetD8(b->out, 0xff, (size_t)(s->m * s->n) * 2);
    if (lt_launch(&c, b, 0) || cu->cuCtxSynchronize()) {
      printf("     cublaslt%s algo %d: launch failed\n", gelu_bias ? " gelu_bias" : "", a);
      continue;
    }
    double err = verify(s, b, gelu_bias ? EPI_GELU_TANH : EPI_NONE);
    sustained sus = {-1, 0, 0, 0};
    double ms = err <= 1e-2 ? time_it(lt_launch, &c, b, &sus) : -1;
    printf("%s cublaslt%s algo %d: %.4f ms, %.1f TFLOP/s, rel_err %.1e\n", ms > 0 ? "ok  " : "FAIL",
           gelu_bias ? " gelu_bias" : "", a, ms, ms > 0 ? 2e-9 * (double)s->m * (double)s->n * (double)s->k / ms : 0,
           err);
    print_sustained(&sus);
    if (ms > 0 && sus.ms > 0 && (*best_sus < 0 || sus.ms < *best_sus)) *best_sus = sus.ms;
    if (ms > 0 && (best < 0 || ms < best)) {
      best = ms;
      snprintf(desc, cap, "heuristic #%d", a);
    }
  }
  if (best < 0) failed++;
out:
  if (pref) cublasLtMatmulPreferenceDestroy(pref);
  if (c.la) cublasLtMatrixLayoutDestroy(c.la);
  if (c.lb) cublasLtMatrixLayoutDestroy(c.lb);
  if (c.lc) cublasLtMatrixLayoutDestroy(c.lc);
  if (c.op) cublasLtMatmulDescDestroy(c.op);
  return best;
}

/* The copy floor: W's bytes copied device to device (rotated like the operands). */
static int copy_launch(void *vctx, const bufs *b, int r) {
  const shape *s = vctx;
  int i = r % b->rot, j = (r + 1) % b->rot;
  return cu->cuMemcpyDtoD(b->w[j], b->w[i], (size_t)(s->n * s->k) * 2) != 0;
}

typedef struct fm_ctx {
  fm_module *mod;
  int64_t m;
} fm_ctx;

static int fm_launch(void *vctx, const bufs *b, int r) {
  fm_ctx *c = vctx;
  int i = r % b->rot;
  void *ins[4] = {dp(b->x[i]), dp(b->w[i]), dp(b->bias), dp(b->r[i])}, *outs[1] = {dp(b->out)};
  return fm_module_launch(c->mod, ins, outs, c->m, NULL, NULL) != FM_OK;
}

/* Host time of one fm_module_launch in microseconds (the launch queue absorbs 100 short
 * kernels): same operands every time (the tensor maps cached), then rotating operands (both
 * maps encoded on every launch). */
static void host_launch_cost(fm_ctx *c, const bufs *b, double *cached_us, double *encoded_us) {
  struct timespec t0, t1;
  for (int pass = 0; pass < 2; pass++) {
    fm_launch(c, b, 0);
    cu->cuCtxSynchronize();
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int r = 0; r < 100; r++) fm_launch(c, b, pass ? r : 0);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    cu->cuCtxSynchronize();
    double us = ((double)(t1.tv_sec - t0.tv_sec) * 1e9 + (double)(t1.tv_nsec - t0.tv_nsec)) / 1e3 / 100;
    *(pass ? encoded_us : cached_us) = us;
  }
}

typedef struct result {
  double plain, gelu, ours, ours_default, copy;
  double plain_sus, gelu_sus, ours_sus; /* best sustained times (FM_BENCH_SUSTAIN_MS) */
  char plain_desc[32], gelu_desc[32], ours_desc[96], ours_sus_desc[96];
} result;

static void run_shape(int si, cublasLtHandle_t h, result *res) {
  const shape *s = &shapes[si];
  bufs b;
  memset(res, 0, sizeof *res);
  res->plain = res->gelu = res->ours = res->ours_default = res->copy = -1;
  res->plain_sus = res->gelu_sus = res->ours_sus = -1;
  printf("== M=%" PRId64 " N=%" PRId64 " K=%" PRId64 "\n", s->m, s->n, s->k);
  if (bufs_init(s, &b)) {
    printf("FAIL M=%" PRId64 " N=%" PRId64 " K=%" PRId64 ": out of memory\n", s->m, s->n, s->k);
    failed++;
    bufs_free(&b);
    return;
  }
  printf("   operands rotated over %d copies\n", b.rot);
  if (b.rot >= 2 && s->m <= 64) {
    /* a copy reads and writes W: reading W alone at copy bandwidth takes half of it */
    double ms = time_it(copy_launch, (void *)s, &b, NULL);
    res->copy = ms > 0 ? ms / 2 : -1;
    printf("     copy of W (%.1f MB): %.4f ms, %.0f GB/s; floor for reading W once %.4f ms\n",
           (double)(s->n * s->k) * 2e-6, ms, ms > 0 ? 2.0 * (double)(s->n * s->k) * 2 / (ms * 1e-3) / 1e9 : 0,
           res->copy);
  }
  res->plain = time_cublaslt(h, s, &b, 0, res->plain_desc, sizeof res->plain_desc, &res->plain_sus);
  res->gelu = time_cublaslt(h, s, &b, 1, res->gelu_desc, sizeof res->gelu_desc, &res->gelu_sus);
  double flops = 2.0 * (double)s->m * (double)s->n * (double)s->k;
  int first = 1;
  for (int i = 0; i < n_jobs; i++) {
    job *j = &jobs[i];
    char desc[96];
    fm_diag d = {{0}};
    if (j->s != si) continue;
    fm_candidate_describe(&j->cand, desc, sizeof desc);
    fm_ctx c = {NULL, s->m};
    if (j->rc || fm_module_load(&j->k, &c.mod, &d)) {
      printf("FAIL ours [%s]: %s\n", desc, j->rc ? (j->err ? j->err : "?") : d.text);
      failed++;
      first = 0;
      continue;
    }
    cu->cuMemsetD8(b.out, 0xff, (size_t)(s->m * s->n) * 2);
    fm_CUresult cr = 0;
    double err = INFINITY, ms = -1;
    if (!fm_launch(&c, &b, 0) && !(cr = cu->cuCtxSynchronize())) err = verify(s, &b, ours_epi);
    if (cr) {
      printf("FAIL ours [%s]: cuda error %d, the context is gone\n", desc, cr);
      exit(3);
    }
    sustained sus = {-1, 0, 0, 0};
    if (err <= 1e-2) ms = time_it(fm_launch, &c, &b, &sus);
    printf("%s ours [%s]: %.4f ms, %.1f TFLOP/s, rel_err %.1e\n", ms > 0 ? "ok  " : "FAIL", desc, ms,
           ms > 0 ? flops / (ms * 1e-3) / 1e12 : 0, err);
    print_sustained(&sus);
    if (ms > 0 && sus.ms > 0 && (res->ours_sus < 0 || sus.ms < res->ours_sus)) {
      res->ours_sus = sus.ms;
      snprintf(res->ours_sus_desc, sizeof res->ours_sus_desc, "%s", desc);
    }
    if (ms > 0 && s->m * s->n <= (1 << 24)) {
      double cached, encoded;
      host_launch_cost(&c, &b, &cached, &encoded);
      printf("     host per launch: %.2f us (%u tensor maps; %.2f us with new operand addresses)\n", cached,
             j->k.meta.n_tmaps, encoded);
    }
    if (ms <= 0) failed++;
    if (ms > 0 && first) res->ours_default = ms;
    if (ms > 0 && (res->ours < 0 || ms < res->ours)) {
      res->ours = ms;
      snprintf(res->ours_desc, sizeof res->ours_desc, "%s", desc);
    }
    first = 0;
    fm_module_unload(c.mod);
  }
  fflush(stdout);
  bufs_free(&b);
}

static double tf(const shape *s, double ms) {
  return ms > 0 ? 2.0 * (double)s->m * (double)s->n * (double)s->k / (ms * 1e-3) / 1e12 : 0;
}

int main(int argc, char **argv) {
  fm_diag d = {{0}};
  int pick[N_SHAPES], n_pick = 0;
  setvbuf(stdout, NULL, _IOLBF, 0); /* a run cut short still leaves its lines */
  if (argc > 1) reps = atoi(argv[1]);
  if (reps < 20) reps = 20;
  if (reps > MAX_REPS) reps = MAX_REPS;
  const char *epi_env = getenv("FM_BENCH_EPI");
  ours_epi = !epi_env || !*epi_env              ? EPI_GELU_ERF
             : strcmp(epi_env, "bias") == 0     ? EPI_BIAS
             : strcmp(epi_env, "residual") == 0 ? EPI_RESIDUAL
             : strcmp(epi_env, "plain") == 0    ? EPI_PLAIN
                                                : EPI_NONE;
  if (ours_epi == EPI_NONE) { /* a typo must not time the default epilogue under another name */
    fprintf(stderr, "FM_BENCH_EPI=%s: expected bias, residual or plain (unset: bias + GELU)\n", epi_env);
    return 2;
  }
  /* like FM_BENCH_EPI: a typo must not silently drop the sustained run, nor time for hours */
  const char *sus_env = getenv("FM_BENCH_SUSTAIN_MS"), *split_env = getenv("FM_BENCH_SUSTAIN_SPLIT");
  if (sus_env && *sus_env) {
    char *end;
    sustain_ms = strtod(sus_env, &end);
    if (*end || !(sustain_ms >= 0 && sustain_ms <= 60000)) {
      fprintf(stderr, "FM_BENCH_SUSTAIN_MS=%s: expected milliseconds, 0..60000\n", sus_env);
      return 2;
    }
  }
  if (split_env && *split_env) {
    if (strcmp(split_env, "0") && strcmp(split_env, "1")) {
      fprintf(stderr, "FM_BENCH_SUSTAIN_SPLIT=%s: expected 0 or 1\n", split_env);
      return 2;
    }
    sustain_split = split_env[0] == '1';
  }
  const char *env = getenv("FM_BENCH_SHAPES");
  for (size_t i = 0; i < N_SHAPES; i++) pick[i] = env == NULL;
  for (const char *p = env; p && *p;) {
    char *end;
    long v = strtol(p, &end, 10);
    if (end == p) break;
    if (v >= 0 && (size_t)v < N_SHAPES) pick[v] = 1;
    p = *end ? end + 1 : end;
  }
  if (fm_cuda_load(&cu, &d) || fm_cuda_device_id(0, &dev, &d)) {
    fprintf(stderr, "no GPU: %s\n", d.text);
    return 2;
  }
  fm_CUdevice cdev;
  fm_CUcontext ctx;
  if (cu->cuDeviceGet(&cdev, 0) || cu->cuDevicePrimaryCtxRetain(&ctx, cdev) || cu->cuCtxSetCurrent(ctx)) {
    fprintf(stderr, "cannot make the primary context current\n");
    return 2;
  }
  cublasLtHandle_t h;
  if (cublasLtCreate(&h) != CUBLAS_STATUS_SUCCESS) {
    fprintf(stderr, "cublasLtCreate failed\n");
    return 2;
  }
  printf("device %s (%s, %u SMs), cuBLASLt %zu, %d reps, bf16, nn.Linear layouts\n", dev.name, dev.arch, dev.sm_count,
         cublasLtGetVersion(), reps);
  /* every candidate of every picked shape, compiled in parallel first */
  for (size_t si = 0; si < N_SHAPES; si++) {
    if (!pick[si]) continue;
    n_pick++;
    if (build(&shapes[si], &canon[si])) return 2;
    fm_candidate cand[MAX_CANDS + MAX_EXTRA];
    size_t nc = fm_codegen_candidates(&canon[si], cand, MAX_CANDS);
    nc += extra_candidates(cand + nc, MAX_EXTRA);
    for (size_t i = 0; i < nc && n_jobs < (int)MAX_JOBS; i++) {
      if (!picked(&cand[i])) continue;
      job *j = &jobs[n_jobs++];
      memset(j, 0, sizeof *j);
      j->s = (int)si;
      j->cand = cand[i];
    }
  }
  printf("%d shapes, %d kernels to compile\n", n_pick, n_jobs);
  fflush(stdout);
  pthread_t th[N_THREADS];
  for (int i = 0; i < N_THREADS; i++) pthread_create(&th[i], NULL, compile_worker, NULL);
  for (int i = 0; i < N_THREADS; i++) pthread_join(th[i], NULL);
  static result res[N_SHAPES];
  for (size_t si = 0; si < N_SHAPES; si++)
    if (pick[si]) run_shape((int)si, h, &res[si]);
  const char *epi_name = ours_epi == EPI_BIAS       ? "bias"
                         : ours_epi == EPI_RESIDUAL ? "bias+residual"
                         : ours_epi == EPI_PLAIN    ? "plain"
                                                    : "bias+GELU";
  printf(
      "\n| M | N | K | cuBLASLt plain ms (TFLOP/s) | cuBLASLt GELU_BIAS ms (TFLOP/s) | ours %s best ms "
      "(TFLOP/s) | ours default ms | ours/plain time | best candidate |\n|---|---|---|---|---|---|---|---|---|\n",
      epi_name);
  for (size_t si = 0; si < N_SHAPES; si++) {
    if (!pick[si]) continue;
    const shape *s = &shapes[si];
    const result *r = &res[si];
    printf("| %" PRId64 " | %" PRId64 " | %" PRId64 " | %.4f (%.0f) | %.4f (%.0f) | %.4f (%.0f) | %.4f | %.2f | %s |\n",
           s->m, s->n, s->k, r->plain, tf(s, r->plain), r->gelu, tf(s, r->gelu), r->ours, tf(s, r->ours),
           r->ours_default, r->plain > 0 && r->ours > 0 ? r->ours / r->plain : 0, r->ours_desc);
  }
  if (sustain_ms > 0) {
    printf(
        "\n| M | N | K | sustained: cuBLASLt plain ms | cuBLASLt GELU_BIAS ms | ours %s best ms | ours/plain time | "
        "best candidate |\n|---|---|---|---|---|---|---|---|\n",
        epi_name);
    for (size_t si = 0; si < N_SHAPES; si++) {
      const shape *s = &shapes[si];
      const result *r = &res[si];
      if (!pick[si]) continue;
      printf("| %" PRId64 " | %" PRId64 " | %" PRId64 " | %.4f | %.4f | %.4f | %.3f | %s |\n", s->m, s->n, s->k,
             r->plain_sus, r->gelu_sus, r->ours_sus,
             r->plain_sus > 0 && r->ours_sus > 0 ? r->ours_sus / r->plain_sus : 0, r->ours_sus_desc);
    }
  }
  printf(
      "\n| M | N | K | W MB | copy floor ms | cuBLASLt plain ms (GB/s of W) | ours best ms (GB/s of W) | ours %% of copy | "
      "cuBLASLt %% of copy | best candidate |\n|---|---|---|---|---|---|---|---|---|---|\n");
  for (size_t si = 0; si < N_SHAPES; si++) {
    const shape *s = &shapes[si];
    const result *r = &res[si];
    if (!pick[si] || r->copy <= 0) continue;
    double wb = (double)(s->n * s->k) * 2;
    printf("| %" PRId64 " | %" PRId64 " | %" PRId64
           " | %.1f | %.4f | %.4f (%.0f) | %.4f (%.0f) | %.0f%% | %.0f%% | %s |\n",
           s->m, s->n, s->k, wb * 1e-6, r->copy, r->plain, r->plain > 0 ? wb / (r->plain * 1e-3) / 1e9 : 0, r->ours,
           r->ours > 0 ? wb / (r->ours * 1e-3) / 1e9 : 0, r->ours > 0 ? 100.0 * r->copy / r->ours : 0,
           r->plain > 0 ? 100.0 * r->copy / r->plain : 0, r->ours_desc);
  }
  for (int i = 0; i < n_jobs; i++) {
    free(jobs[i].k.cubin);
    free(jobs[i].err);
  }
  cublasLtDestroy(h);
  cu->cuDevicePrimaryCtxRelease(cdev);
  printf("%d failed\n", failed);
  return failed ? 1 : 0;
}
