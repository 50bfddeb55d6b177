/* test_blas_gpu.c: cuBLASLt plans on a real GPU (bench/device/run; never ctest).
 * For GEMM fragments covering both plan forms, every layout and each epilogue cuBLASLt runs
 * itself (mm, bias, bias + relu, bias + tanh-GELU, an [M, N] addend through beta, bias +
 * addend + relu) and the split form (erf GELU, N not a multiple of 8, an extra output):
 *  1. the tuner, with the real worker, searches the heuristic's choices of the plan alone:
 *     verdict ok against the fp64 reference, the chosen algorithm recorded in the metadata;
 *  2. the stored plan (algo set) is judged again at another M (another M bucket, or the
 *     static M of a second fragment): the worker loads it, libfusemld re-checks the algorithm
 *     with cublasLtMatmulAlgoCheck at that M, runs it and it verifies;
 *  3. no tuner process is left behind;
 *  4. full tunes (every candidate, as the daemon runs them) of GEMM + bias + GELU bf16 at the
 *     benchmark's shapes: the plan verifies and the winner is never slower than it; prints
 *     the winner, the plan and the fastest generated kernel side by side (FM_BLAS_TUNES=0
 *     skips this part, FM_BLAS_TUNES=only runs nothing else).
 * usage: test_blas_gpu PATH/TO/fusemld-tuner */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fm_codegen.h"
#include "fm_compile.h"
#include "fm_cuda.h"
#include "fm_test.h"
#include "fm_tuner.h"
#include "fm_tuner_worker.h"
#include "frag_builder.h"
#include "gpu_util.h"

static const char *worker_exe;
static fm_device_id dev;

typedef enum {
  EPI_MM,
  EPI_BIAS,
  EPI_BIAS_RELU,
  EPI_BIAS_GELU_TANH,
  EPI_RESIDUAL,
  EPI_BIAS_RES_RELU,
  EPI_BIAS_GELU,
  EPI_GELU_TWO_OUT
} epi;
static const char *const epi_name[] = {"mm",
                                       "bias",
                                       "bias+relu",
                                       "bias+gelu_tanh",
                                       "+residual",
                                       "bias+residual+relu",
                                       "bias+gelu(erf)",
                                       "gelu, 2 outputs"};

typedef struct tcase {
  epi e;
  int64_t m;            /* FM_DIM_SYMBOLIC: bucketed */
  uint64_t hint, hint2; /* the M bucket tuned at, and the one judged again at */
  int64_t n, k;
  int b_nmajor; /* B as a row-major [K, N] (else nn.Linear's W.t(): K contiguous) */
  int a_mmajor; /* A as the transpose of a row-major [K, M] */
  fm_dtype dt;
  int want_form;
} tcase;

/* The canonical fragment of c at M bucket hint (static M when c->m > 0). */
static int build(const tcase *c, uint64_t hint, fm_fragment *canon, uint8_t **bytes, size_t *len) {
  fb b;
  fm_fragment tmp;
  fm_diag d = {{0}};
  int64_t ms = c->m, as[2] = {ms, c->k}, a_str[2] = {1, ms > 0 ? ms : 0};
  int64_t bs[2] = {c->k, c->n}, b_str[2] = {1, c->k}, bias_s[1] = {c->n}, os[2] = {ms, c->n};
  if (c->b_nmajor) {
    b_str[0] = c->n;
    b_str[1] = 1;
  }
  fb_init(&b);
  uint32_t x = fb_input(&b, c->dt, 2, as, c->a_mmajor ? a_str : NULL, 16);
  uint32_t w = fb_input(&b, c->dt, 2, bs, b_str, 16);
  uint32_t v, extra = 0;
  int has_extra = 0;
  if (c->e == EPI_MM || c->e == EPI_RESIDUAL) {
    v = fb_op2(&b, FM_OP_MM, x, w);
  } else {
    uint32_t bias = fb_input(&b, c->dt, 1, bias_s, NULL, 16);
    /* addmm(bias, A, B): fb has no 3-arg helper, so add the op by hand */
    fm_opnode *o = &b.f.ops[b.f.n_ops++];
    o->op = FM_OP_ADDMM;
    o->out = v = b.next_id++;
    o->nargs = 3;
    o->args[0] = bias;
    o->args[1] = x;
    o->args[2] = w;
    b.dt[v - 100] = c->dt; /* frag_builder numbers values from 100 */
  }
  if (c->e == EPI_RESIDUAL || c->e == EPI_BIAS_RES_RELU)
    v = fb_op2(&b, FM_OP_ADD, v, fb_input(&b, c->dt, 2, os, NULL, 16));
  if (c->e == EPI_BIAS_RELU || c->e == EPI_BIAS_RES_RELU) v = fb_op1(&b, FM_OP_RELU, v);
  if (c->e == EPI_BIAS_GELU_TANH) v = fb_op1(&b, FM_OP_GELU_TANH, v);
  if (c->e == EPI_BIAS_GELU) v = fb_op1(&b, FM_OP_GELU, v);
  if (c->e == EPI_GELU_TWO_OUT) {
    extra = v;
    has_extra = 1;
    v = fb_op1(&b, FM_OP_GELU, v);
  }
  fb_output(&b, v, 2, os);
  if (has_extra) fb_output(&b, extra, 2, os);
  b.f.vocab = 3;
  b.f.m_hint = ms < 0 ? hint : 0;
  tmp = b.f;
  if (fm_fragment_validate(&tmp, &d) || fm_fragment_canonicalize(&tmp, canon) ||
      fm_fragment_canonical_bytes(canon, bytes, len)) {
    fprintf(stderr, "bad fragment: %s\n", d.text);
    return -1;
  }
  return 0;
}

static fm_compile_job *compile_plan(const fm_fragment *canon, const uint8_t *bytes, size_t len) {
  fm_candidate c;
  fm_key key;
  fm_compile_job *j;
  if (fm_codegen_blas_candidates(canon, &c, 1) != 1) return NULL;
  memset(&key, 0x6b, sizeof key);
  if (fm_compile_job_new(canon, bytes, len, &key, &dev, NULL, &j)) return NULL;
  j->has_cand = 1;
  j->cand = c;
  fm_compile_run(j);
  if (j->err) fprintf(stderr, "compile: %s\n", j->diag.text);
  return j;
}

/* Judges the one compiled plan j with a real worker; returns its verdict (j stays owned by
 * the caller). */
static fm_verdict judge(fm_compile_job *j, uint64_t seed, fm_tune_result *res) {
  fm_tune_job *tj;
  fm_verdict v = FM_VERDICT_PENDING;
  if (fm_tune_job_new(&tj)) return v;
  tj->cands[tj->n++] = j;
  fm_tworker w;
  fm_tuner_opts opts = {.worker_exe = worker_exe, .deadline_s = 20, .seed = seed};
  fm_tworker_init(&w, worker_exe);
  fm_tuner_run_job(&w, &opts, tj);
  fm_tworker_stop(&w, 5000);
  if (!tj->tuned) fprintf(stderr, "  not tuned: %s\n", tj->diag.text);
  *res = tj->res[0];
  v = tj->tuned ? res->verdict : FM_VERDICT_PENDING;
  tj->n = 0; /* j is the caller's */
  fm_tune_job_free(tj);
  return v;
}

static void run_case(const tcase *c) {
  fm_fragment *canon = malloc(sizeof *canon), *canon2 = malloc(sizeof *canon2);
  uint8_t *bytes = NULL, *bytes2 = NULL;
  size_t len = 0, len2 = 0;
  fm_compile_job *j = NULL, *j2 = NULL;
  fm_tune_result r1, r2;
  char desc[64];
  snprintf(desc, sizeof desc, "%s %s M=%lld%s N=%lld K=%lld%s%s", epi_name[c->e], fm_dtype_name(c->dt),
           (long long)(c->m > 0 ? c->m : (int64_t)c->hint), c->m > 0 ? "" : "(bucket)", (long long)c->n,
           (long long)c->k, c->b_nmajor ? " B n-major" : "", c->a_mmajor ? " A m-major" : "");
  CHECK(canon && canon2);
  if (!canon || !canon2 || build(c, c->hint, canon, &bytes, &len)) goto out;
  j = compile_plan(canon, bytes, len);
  CHECK(j != NULL && j->err == FM_OK);
  if (!j || j->err) goto out;
  CHECK_EQ_INT((int)j->cand.p[0], c->want_form);
  fm_verdict v = judge(j, 0x5eed + (uint64_t)c->e, &r1);
  printf("  %-58s %-6s %-11s %9.4f ms  rel %.2e  %.90s\n", desc, j->meta.blas.form, fm_verdict_name(v), r1.ms,
         r1.rel_err, r1.detail);
  CHECK_EQ_INT(v, FM_VERDICT_OK);
  CHECK_EQ_INT((int)j->meta.blas.has_algo, 1);
  if (v != FM_VERDICT_OK || !j->meta.blas.has_algo) goto out;
  /* 2: the stored plan at another M: a fragment with the second bucket (same epilogue and
     layouts) carrying the first one's algorithm */
  if (c->m > 0 || build(c, c->hint2, canon2, &bytes2, &len2)) goto out;
  j2 = compile_plan(canon2, bytes2, len2);
  CHECK(j2 != NULL && j2->err == FM_OK);
  if (!j2 || j2->err) goto out;
  CHECK_EQ_INT(fm_compile_job_set_algo(j2, j->meta.blas.algo, FM_META_ALGO_BYTES), FM_OK);
  v = judge(j2, 0xabc + (uint64_t)c->e, &r2);
  printf("  %-58s stored plan at bucket %llu: %s %.4f ms  %.80s\n", "", (unsigned long long)c->hint2,
         fm_verdict_name(v), r2.ms, r2.detail);
  CHECK_EQ_INT(v, FM_VERDICT_OK);
out:
  fm_compile_job_free(j);
  fm_compile_job_free(j2);
  free(bytes);
  free(bytes2);
  free(canon);
  free(canon2);
}

static void test_plans(void) {
  static const tcase cases[] = {
      {EPI_MM, FM_DIM_SYMBOLIC, 4096, 64, 4096, 4096, 0, 0, FM_DT_BF16, FM_BLAS_DIRECT},
      {EPI_BIAS, FM_DIM_SYMBOLIC, 16384, 1000, 1024, 256, 0, 0, FM_DT_BF16, FM_BLAS_DIRECT},
      {EPI_BIAS_RELU, FM_DIM_SYMBOLIC, 2048, 8, 4096, 1024, 0, 0, FM_DT_F16, FM_BLAS_DIRECT},
      {EPI_BIAS_GELU_TANH, FM_DIM_SYMBOLIC, 1024, 4096, 1024, 4096, 0, 0, FM_DT_BF16, FM_BLAS_DIRECT},
      {EPI_RESIDUAL, FM_DIM_SYMBOLIC, 1024, 32, 768, 3072, 0, 0, FM_DT_BF16, FM_BLAS_DIRECT},
      {EPI_BIAS_RES_RELU, 777, 0, 0, 512, 256, 1, 0, FM_DT_BF16, FM_BLAS_DIRECT},
      {EPI_MM, 1000, 0, 0, 1024, 512, 0, 1, FM_DT_BF16, FM_BLAS_DIRECT},
      {EPI_BIAS_GELU, FM_DIM_SYMBOLIC, 16384, 512, 1024, 256, 0, 0, FM_DT_BF16, FM_BLAS_SPLIT},
      {EPI_BIAS_GELU, 1000, 0, 0, 100, 64, 0, 1, FM_DT_F16, FM_BLAS_SPLIT},
      {EPI_GELU_TWO_OUT, FM_DIM_SYMBOLIC, 4096, 128, 4096, 4096, 0, 0, FM_DT_BF16, FM_BLAS_SPLIT},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(&cases[i]);
  CHECK_EQ_INT(gu_count_child_tuners(), 0);
}

/* One full tune: every candidate of bias + GELU at M x N x K (static M), compiled in parallel
 * like the daemon does (here: one thread per candidate batch), judged by one worker. */
typedef struct cjob {
  const fm_fragment *canon;
  const uint8_t *bytes;
  size_t len;
  fm_candidate c;
  fm_compile_job *j;
} cjob;

static void *compile_thread(void *arg) {
  cjob *cj = arg;
  fm_key key;
  memset(&key, 0x6b, sizeof key);
  if (fm_compile_job_new(cj->canon, cj->bytes, cj->len, &key, &dev, NULL, &cj->j) == 0) {
    cj->j->has_cand = 1;
    cj->j->cand = cj->c;
    fm_compile_run(cj->j);
  }
  return NULL;
}

static void full_tune(int64_t m, int64_t n, int64_t k) {
  tcase c = {EPI_BIAS_GELU, m, 0, 0, n, k, 0, 0, FM_DT_BF16, FM_BLAS_SPLIT};
  fm_fragment *canon = malloc(sizeof *canon);
  uint8_t *bytes = NULL;
  size_t len = 0;
  static cjob cj[FM_TUNE_MAX_CANDIDATES];
  pthread_t th[FM_TUNE_MAX_CANDIDATES];
  fm_candidate cands[FM_TUNE_MAX_CANDIDATES];
  fm_tune_job *tj = NULL;
  if (!canon || build(&c, 0, canon, &bytes, &len)) goto out;
  size_t nc = fm_codegen_candidates(canon, cands, FM_TUNE_MAX_CANDIDATES), kept = 0;
  for (size_t i = 0; i < nc; i++)
    if (fm_candidate_runs_on(&cands[i], dev.arch)) cands[kept++] = cands[i];
  for (size_t i = 0; i < kept; i++) {
    cj[i] = (cjob){canon, bytes, len, cands[i], NULL};
    pthread_create(&th[i], NULL, compile_thread, &cj[i]);
  }
  for (size_t i = 0; i < kept; i++) pthread_join(th[i], NULL);
  if (fm_tune_job_new(&tj)) goto out;
  for (size_t i = 0; i < kept; i++) tj->cands[tj->n++] = cj[i].j;
  fm_tworker w;
  fm_tuner_opts opts = {.worker_exe = worker_exe, .deadline_s = 20, .seed = 77};
  fm_tworker_init(&w, worker_exe);
  fm_tuner_run_job(&w, &opts, tj);
  fm_tworker_stop(&w, 5000);
  int plan = -1, best_kernel = -1;
  for (size_t i = 0; i < tj->n; i++) {
    if (tj->cands[i]->cand.tmpl == FM_TMPL_CUBLASLT)
      plan = (int)i;
    else if (tj->res[i].verdict == FM_VERDICT_OK && (best_kernel < 0 || tj->res[i].ms < tj->res[best_kernel].ms))
      best_kernel = (int)i;
  }
  CHECK_EQ_INT(tj->tuned, 1);
  if (!tj->tuned) printf("  %lldx%lldx%lld not tuned: %s\n", (long long)m, (long long)n, (long long)k, tj->diag.text);
  for (size_t i = 0; i < tj->n; i++) {
    char desc[160];
    if (tj->res[i].verdict == FM_VERDICT_OK) continue;
    fm_candidate_describe(&tj->cands[i]->cand, desc, sizeof desc);
    printf("  %lldx%lldx%lld %s: %s: %.200s\n", (long long)m, (long long)n, (long long)k, desc,
           fm_verdict_name(tj->res[i].verdict), tj->res[i].detail);
  }
  CHECK(plan >= 0 && tj->res[plan].verdict == FM_VERDICT_OK);
  CHECK(tj->winner >= 0);
  if (plan < 0 || tj->winner < 0 || best_kernel < 0 || tj->res[plan].verdict != FM_VERDICT_OK) goto out;
  CHECK(tj->res[tj->winner].ms <= tj->res[plan].ms);
  char wd[160], kd[160];
  fm_candidate_describe(&tj->cands[tj->winner]->cand, wd, sizeof wd);
  fm_candidate_describe(&tj->cands[best_kernel]->cand, kd, sizeof kd);
  printf("| %lld | %lld | %lld | %.4f | %.4f | %.2f | %s | %.0f |\n", (long long)m, (long long)n, (long long)k,
         tj->res[plan].ms, tj->res[best_kernel].ms, tj->res[best_kernel].ms / tj->res[plan].ms, wd, tj->tune_ms);
  printf("|   |   |   | (%.34s) | (%s) |   |   |   |\n", tj->res[plan].detail, kd);
  double wall = 0, worst = 0;
  for (size_t i = 0; i < tj->n; i++) {
    if (tj->res[i].wall_ms > 0) wall += tj->res[i].wall_ms;
    if (tj->res[i].wall_ms > worst) worst = tj->res[i].wall_ms;
  }
  /* where a tune's time goes: the worker's answers (the rest is its start and the prepare) */
  printf("  (worker answers %.0f ms of the %.0f: the plan's %.0f ms, the slowest %.0f ms)\n", wall, tj->tune_ms,
         tj->res[plan].wall_ms, worst);
out:
  fm_tune_job_free(tj);
  free(bytes);
  free(canon);
}

static void test_full_tunes(void) {
  printf(
      "| M | N | K | cuBLASLt plan ms | best generated ms | generated/plan | chosen | tune ms |\n"
      "|---|---|---|---|---|---|---|---|\n");
  full_tune(4096, 4096, 4096);
  full_tune(8192, 8192, 8192);
  full_tune(16384, 1024, 256);
  full_tune(16384, 256, 1024);
  CHECK_EQ_INT(gu_count_child_tuners(), 0);
}

int main(int argc, char **argv) {
  fm_diag d = {{0}};
  if (argc < 2) {
    fprintf(stderr, "usage: %s PATH/TO/fusemld-tuner\n", argv[0]);
    return 2;
  }
  setvbuf(stdout, NULL, _IOLBF, 0);
  worker_exe = argv[1];
  if (fm_cuda_device_id(0, &dev, &d)) {
    fprintf(stderr, "no GPU: %s\n", d.text);
    printf("0 passed, 1 failed\n");
    return 1;
  }
  printf("device: %s (%s, %u SMs)\n", dev.name, dev.arch, dev.sm_count);
  const char *tunes = getenv("FM_BLAS_TUNES");
  if (!tunes || strcmp(tunes, "only") != 0) RUN(test_plans);
  if (!tunes || strcmp(tunes, "0") != 0) RUN(test_full_tunes);
  return FM_TEST_DONE();
}
