/* test_tuner_gpu.c: the tuner on a real GPU (bench/device/run; never ctest).
 *  1. planted bad candidates (hand-written CUDA through fm_nvrtc_compile, launched with the
 *     real fragment's metadata) between good ones: one writes far out of bounds
 *     (launch_failed or fault), one spins forever (timeout), one computes zeros (wrong);
 *     the worker is restarted after each fatal one and the next good candidate verifies;
 *     afterwards no fusemld-tuner process is left;
 *  2. a full tune of gelu(x + b) bf16 [-1, 4096]: every candidate ok, the fastest chosen,
 *     times plausible (no faster than 6 TB/s); prints the table, the tuning time and the
 *     chosen vs the default candidate;
 *  3. end to end (when a socket is given): fusectl compile examples/gelu_bias_bf16.json on the
 *     running fusemld answers state "tuned" and fusectl show lists the candidates;
 *  4. fault repetition (RELIABILITY.md section 4): FM_FAULT_REPEAT rounds (default 50) of one
 *     job [good, out-of-bounds, good, never-terminating, good] on a static [1024, 4096]
 *     fragment (cheap to prepare, so 100 worker starts stay short). Every round: the faulty
 *     ones marked bad, the worker killed and replaced (2 restarts, a new pid), the good one
 *     after each fault verifies, exactly one fusemld-tuner child alive (no stray, no zombie),
 *     the round within the deadline; GPU memory in use (nvidia-smi) does not grow over the
 *     rounds and returns to its baseline once the worker is stopped.
 *  5. a decode GEMM (M bucket 8, nn.Linear bias + GELU): both GEMM templates' candidates
 *     verify and one is chosen (test_decode_gemm_tune);
 *  6. twins (test_chain_twins): an MLP chain whose residual is laid out like x; its b2b kernel
 *     verifies, and the same kernel with its shared-memory residual read planted wrong (a
 *     neighbour row of x: right whenever the residual has a memory of its own) is marked
 *     wrong "with the twin inputs sharing memory";
 *  7. sampled verification (test_sampled_verification): a static fragment of 8M elements is
 *     checked on a sample of blocks; a kernel wrong only in the last row, or only in a sixth
 *     of the rows inside, is wrong, and one right everywhere verifies.
 *  8. index_add (test_scatter_tune): the MoE decoder's gathered rows' gradient (bf16 [8192,
 *     1024] added at 8192 i64 rows of an f32 [4096, 1024]): every candidate verifies against
 *     the reference from index rows in range, and the default's kernel with its index read
 *     planted wrong (the next row's index) is wrong.
 *  9. iota (test_iota_tune): cross-entropy's gradient and forward at an odd vocabulary, the
 *     targets filled with columns: a planted kernel whose column is one off is wrong.
 * FM_TUNER_GPU_ONLY=faults runs only 4, FM_TUNER_GPU_ONLY=decode only 5, FM_TUNER_GPU_ONLY=twins
 * only 6, FM_TUNER_GPU_ONLY=sampled only 7, FM_TUNER_GPU_ONLY=scatter only 8 and 9.
 * usage: test_tuner_gpu PATH/TO/fusemld-tuner [SOCKET FUSECTL EXAMPLES_DIR] */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fm_codegen.h"
#include "fm_compile.h"
#include "fm_cuda.h"
#include "fm_nvrtc.h"
#include "fm_test.h"
#include "fm_tuner.h"
#include "fm_tuner_worker.h"
#include "frag_builder.h"
#include "gpu_suite.h"
#include "gpu_util.h"

static const char *worker_exe;
static fm_fragment canon;
static uint8_t *canon_bytes;
static size_t canon_len;
static fm_device_id dev;

/* Planted kernels: the fragment's parameters (x, b, y, outer), misbehaving on purpose. */
static const char *planted_src =
    "extern \"C\" __global__ void planted_oob(const void *x, const void *b, void *y, long long outer) {\n"
    "  ((float *)y)[(1ll << 38) + threadIdx.x] = 1.0f;\n"
    "}\n"
    "extern \"C\" __global__ void planted_hang(const void *x, const void *b, void *y, long long outer) {\n"
    "  volatile unsigned *p = (volatile unsigned *)y;\n"
    "  while (p[0] != 0x12345678u) { }\n"
    "}\n"
    "extern \"C\" __global__ void planted_wrong(const void *x, const void *b, void *y, long long outer) {\n"
    "  unsigned short *o = (unsigned short *)y;\n"
    "  long long n = outer * 4096;\n"
    "  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;\n"
    "       i += (long long)gridDim.x * blockDim.x)\n"
    "    o[i] = 0;\n"
    "}\n";

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int build_fragment(void) {
  fb b;
  fm_fragment tmp;
  fm_diag d = {{0}};
  int64_t xs[2] = {FM_DIM_SYMBOLIC, 4096}, bs[2] = {1, 4096};
  fb_init(&b);
  uint32_t x = fb_input(&b, FM_DT_BF16, 2, xs, NULL, 16);
  uint32_t bias = fb_input(&b, FM_DT_BF16, 2, bs, NULL, 16);
  uint32_t g = fb_op1(&b, FM_OP_GELU, fb_op2(&b, FM_OP_ADD, x, bias));
  fb_output(&b, g, 2, xs);
  tmp = b.f;
  if (fm_fragment_validate(&tmp, &d) || fm_fragment_canonicalize(&tmp, &canon) ||
      fm_fragment_canonical_bytes(&canon, &canon_bytes, &canon_len)) {
    fprintf(stderr, "bad fragment: %s\n", d.text);
    return -1;
  }
  return 0;
}

/* The fragment compile_candidate compiles (the symbolic one unless the fault repetition swaps
 * in its static one). */
static const fm_fragment *cur_canon = &canon;
static const uint8_t *cur_bytes;
static size_t cur_len;

static fm_compile_job *compile_candidate(const fm_candidate *c) {
  fm_key key;
  fm_compile_job *j;
  memset(&key, 0x5a, sizeof key);
  if (!cur_bytes) {
    cur_bytes = canon_bytes;
    cur_len = canon_len;
  }
  if (fm_compile_job_new(cur_canon, cur_bytes, cur_len, &key, &dev, NULL, &j)) return NULL;
  j->has_cand = 1;
  j->cand = *c;
  fm_compile_run(j);
  if (j->err) fprintf(stderr, "compile: %s\n", j->diag.text);
  return j;
}

/* A copy of good's compiled candidate with a planted kernel in its place. */
static fm_compile_job *planted(const fm_compile_job *good, const uint8_t *cubin, size_t len, const char *entry) {
  fm_compile_job *j = compile_candidate(&good->cand);
  if (!j) return NULL;
  free(j->cubin);
  j->cubin = malloc(len);
  memcpy(j->cubin, cubin, len);
  j->cubin_len = len;
  snprintf(j->meta.entry, sizeof j->meta.entry, "%s", entry);
  free(j->meta_bytes);
  msgpack_sbuffer sb;
  msgpack_packer pk;
  msgpack_sbuffer_init(&sb);
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  fm_meta_pack(&j->meta, &pk);
  j->meta_len = sb.size;
  j->meta_bytes = (uint8_t *)msgpack_sbuffer_release(&sb);
  return j;
}

static void print_job(const fm_tune_job *tj) {
  char desc[160];
  for (size_t i = 0; i < tj->n; i++) {
    fm_candidate_describe(&tj->cands[i]->cand, desc, sizeof desc);
    printf("  %s%2zu %-56s %-14s %9.4f ms  rel_err %.2e  %.80s\n", (int)i == tj->winner ? "*" : " ", i, desc,
           fm_verdict_name(tj->res[i].verdict), tj->res[i].ms, tj->res[i].rel_err, tj->res[i].detail);
  }
}

static void test_planted_bad_candidates(void) {
  fm_candidate cands[FM_TUNE_MAX_CANDIDATES];
  size_t n = fm_codegen_candidates(&canon, cands, FM_TUNE_MAX_CANDIDATES);
  CHECK(n >= 4);
  if (n < 4) return;
  uint8_t *cubin = NULL;
  size_t len = 0;
  char *log = NULL;
  int err = fm_nvrtc_compile(planted_src, "planted.cu", dev.arch, &cubin, &len, &log);
  CHECK_EQ_INT(err, FM_OK);
  if (err) {
    fprintf(stderr, "%s\n", log ? log : "");
    free(log);
    return;
  }
  fm_tune_job *tj;
  if (fm_tune_job_new(&tj)) return;
  fm_compile_job *g0 = compile_candidate(&cands[0]);
  tj->cands[tj->n++] = g0;
  tj->cands[tj->n++] = planted(g0, cubin, len, "planted_oob");
  tj->cands[tj->n++] = compile_candidate(&cands[1]);
  tj->cands[tj->n++] = planted(g0, cubin, len, "planted_hang");
  tj->cands[tj->n++] = compile_candidate(&cands[2]);
  tj->cands[tj->n++] = planted(g0, cubin, len, "planted_wrong");
  tj->cands[tj->n++] = compile_candidate(&cands[3]);
  free(cubin);
  free(log);

  fm_tworker w;
  fm_tuner_opts o = {.worker_exe = worker_exe, .deadline_s = 2, .seed = 11};
  fm_tworker_init(&w, worker_exe);
  double t0 = now_ms();
  fm_tuner_run_job(&w, &o, tj);
  printf("planted: %.0f ms, %u restarts, %u bad\n", now_ms() - t0, tj->restarts, tj->bad);
  print_job(tj);
  CHECK_EQ_INT(tj->tuned, 1);
  CHECK(tj->res[1].verdict == FM_VERDICT_LAUNCH_FAILED || tj->res[1].verdict == FM_VERDICT_FAULT);
  CHECK_EQ_INT(tj->res[3].verdict, FM_VERDICT_TIMEOUT);
  CHECK_EQ_INT(tj->res[5].verdict, FM_VERDICT_WRONG);
  for (int i = 0; i < 7; i += 2) CHECK_EQ_INT(tj->res[i].verdict, FM_VERDICT_OK);
  CHECK_EQ_INT(tj->restarts, 2);
  CHECK_EQ_INT(tj->bad, 3);
  fm_tworker_stop(&w, 5000);
  CHECK(waitpid(-1, NULL, WNOHANG) < 0 && errno == ECHILD);
  CHECK_EQ_INT(gu_count_child_tuners(), 0);
  fm_tune_job_free(tj);
}

static void test_full_tune(void) {
  fm_candidate cands[FM_TUNE_MAX_CANDIDATES];
  size_t n = fm_codegen_candidates(&canon, cands, FM_TUNE_MAX_CANDIDATES);
  fm_tune_job *tj;
  if (fm_tune_job_new(&tj)) return;
  double t0 = now_ms();
  for (size_t i = 0; i < n; i++) tj->cands[tj->n++] = compile_candidate(&cands[i]);
  double compiled = now_ms() - t0;
  fm_tworker w;
  fm_tuner_opts o = {.worker_exe = worker_exe, .deadline_s = 5, .seed = 12};
  fm_tworker_init(&w, worker_exe);
  fm_tuner_run_job(&w, &o, tj);
  fm_tworker_stop(&w, 5000);
  printf("full tune on %s: %zu candidates, compile %.0f ms (one thread), tune %.0f ms (worker start included)\n",
         w.device, n, compiled, tj->tune_ms);
  print_job(tj);
  CHECK_EQ_INT(tj->tuned, 1);
  CHECK(tj->winner >= 0);
  /* 16384 x 4096 bf16 in and out: 256 MiB moved per launch. */
  double bytes = 2.0 * 16384 * 4096 * 2;
  for (size_t i = 0; i < n; i++) {
    CHECK_EQ_INT(tj->res[i].verdict, FM_VERDICT_OK);
    CHECK(tj->res[i].ms > bytes / 6e12 * 1e3 && tj->res[i].ms < 100);
    if (tj->winner >= 0) CHECK(tj->res[i].ms >= tj->res[tj->winner].ms);
  }
  if (tj->winner >= 0) {
    char desc[160];
    fm_candidate_describe(&tj->cands[tj->winner]->cand, desc, sizeof desc);
    printf("chosen: %s %.4f ms (%.2f TB/s); default %.4f ms (%.2f TB/s)\n", desc, tj->res[tj->winner].ms,
           bytes / tj->res[tj->winner].ms / 1e9, tj->res[0].ms, bytes / tj->res[0].ms / 1e9);
  }
  CHECK_EQ_INT(gu_count_child_tuners(), 0);
  fm_tune_job_free(tj);
}

/* Makes c (f validated and canonicalized) the fragment compile_candidate compiles, its
 * canonical bytes in *bytes (freed by the caller after restore_fragment); 0, or -1 after a
 * failed check. */
static int use_fragment(fm_fragment *f, fm_fragment *c, uint8_t **bytes, const char *what) {
  fm_diag d = {{0}};
  size_t len = 0;
  int rc = fm_fragment_validate(f, &d);
  if (!rc) rc = fm_fragment_canonicalize(f, c);
  if (!rc) rc = fm_fragment_canonical_bytes(c, bytes, &len);
  CHECK_EQ_INT(rc, FM_OK);
  if (rc) {
    fprintf(stderr, "%s fragment: %s\n", what, d.text);
    return -1;
  }
  cur_canon = c;
  cur_bytes = *bytes;
  cur_len = len;
  return 0;
}

static void restore_fragment(void) {
  cur_canon = &canon;
  cur_bytes = canon_bytes;
  cur_len = canon_len;
}

/* Tunes tj's candidates in a worker of its own (deadline 5 s), stopped afterwards. */
static void run_job(fm_tune_job *tj, uint64_t seed) {
  fm_tworker w;
  fm_tuner_opts opts = {.worker_exe = worker_exe, .deadline_s = 5, .seed = seed};
  fm_tworker_init(&w, worker_exe);
  fm_tuner_run_job(&w, &opts, tj);
  fm_tworker_stop(&w, 5000);
}

/* 5. A decode GEMM through the tuner: bias + GELU bf16, x [-1, 4096] with M bucket 8 @ W.t()
 * (W [4096, 4096]): both GEMM templates' candidates (the skinny ones first) pass the worker's
 * verification and timing at the bucket, M = 8, unchanged; one is chosen. */
static void test_decode_gemm_tune(void) {
  static fm_fragment f, gcanon;
  uint8_t *bytes = NULL;
  memset(&f, 0, sizeof f);
  f.vocab = 3;
  f.m_hint = 8;
  gs_matrix(&f.inputs[f.n_inputs++], 1, FM_DT_BF16, FM_DIM_SYMBOLIC, 4096, 0);
  gs_matrix(&f.inputs[f.n_inputs++], 2, FM_DT_BF16, 4096, 4096, 1);
  gs_vector(&f.inputs[f.n_inputs++], 3, FM_DT_BF16, 4096);
  gs_op(&f, FM_OP_ADDMM, 10, 3, 3, 1, 2);
  gs_op(&f, FM_OP_GELU, 11, 1, 10, 0, 0);
  gs_matrix(&f.outputs[f.n_outputs++], 11, FM_DT_BF16, FM_DIM_SYMBOLIC, 4096, 0);
  if (use_fragment(&f, &gcanon, &bytes, "decode")) return;
  fm_candidate cands[FM_TUNE_MAX_CANDIDATES];
  size_t n = fm_codegen_candidates(&gcanon, cands, FM_TUNE_MAX_CANDIDATES), skinny = 0;
  for (size_t i = 0; i < n; i++) skinny += cands[i].tmpl == FM_TMPL_SKINNY;
  CHECK(skinny >= 5);
  CHECK_EQ_INT(cands[0].tmpl, FM_TMPL_SKINNY);
  fm_tune_job *tj;
  if (fm_tune_job_new(&tj) == 0) {
    for (size_t i = 0; i < n; i++) tj->cands[tj->n++] = compile_candidate(&cands[i]);
    run_job(tj, 13);
    printf("decode GEMM tune: %zu candidates (%zu skinny), tune %.0f ms\n", n, skinny, tj->tune_ms);
    print_job(tj);
    CHECK_EQ_INT(tj->tuned, 1);
    CHECK(tj->winner >= 0);
    for (size_t i = 0; i < n; i++) CHECK_EQ_INT(tj->res[i].verdict, FM_VERDICT_OK);
    CHECK_EQ_INT(gu_count_child_tuners(), 0);
    fm_tune_job_free(tj);
  }
  restore_fragment();
  free(bytes);
}

/* 6. Twins: y = gelu(x W1.t() + b1) W2.t() + b2 + r, 64 -> 128 -> 64, M bucket 16384, r laid
 * out like x. The b2b kernel verifies; the same kernel with its shared-memory read of r
 * planted wrong (x's neighbour row: right whenever r has a memory of its own) is wrong "with
 * the twin inputs sharing memory". */
static void test_chain_twins(void) {
  static fm_fragment f, ccanon;
  uint8_t *bytes = NULL;
  fm_diag d = {{0}};
  memset(&f, 0, sizeof f);
  f.vocab = 3;
  f.m_hint = 16384;
  gs_matrix(&f.inputs[f.n_inputs++], 1, FM_DT_BF16, FM_DIM_SYMBOLIC, 64, 0);
  gs_matrix(&f.inputs[f.n_inputs++], 2, FM_DT_BF16, 64, 128, 1);
  gs_vector(&f.inputs[f.n_inputs++], 3, FM_DT_BF16, 128);
  gs_matrix(&f.inputs[f.n_inputs++], 4, FM_DT_BF16, 128, 64, 1);
  gs_vector(&f.inputs[f.n_inputs++], 5, FM_DT_BF16, 64);
  gs_matrix(&f.inputs[f.n_inputs++], 6, FM_DT_BF16, FM_DIM_SYMBOLIC, 64, 0);
  gs_op(&f, FM_OP_ADDMM, 7, 3, 3, 1, 2);
  gs_op(&f, FM_OP_GELU, 8, 1, 7, 0, 0);
  gs_op(&f, FM_OP_ADDMM, 9, 3, 5, 8, 4);
  gs_op(&f, FM_OP_ADD, 10, 2, 9, 6, 0);
  gs_matrix(&f.outputs[f.n_outputs++], 10, FM_DT_BF16, FM_DIM_SYMBOLIC, 64, 0);
  if (use_fragment(&f, &ccanon, &bytes, "chain")) return;
  fm_candidate cands[FM_TUNE_MAX_CANDIDATES];
  size_t n = fm_codegen_candidates(&ccanon, cands, FM_TUNE_MAX_CANDIDATES);
  CHECK(n >= 1);
  char *src = NULL, *log = NULL;
  fm_kernel_meta meta;
  uint8_t *cubin = NULL;
  size_t clen = 0;
  static const char read_x[] = "fm_rl, (n >> 3) & 7";
  const char *at = NULL;
  if (n >= 1 && fm_codegen_generate(&ccanon, &cands[0], dev.sm_count, &src, &meta, &d) == FM_OK)
    at = strstr(src, read_x);
  CHECK(at != NULL); /* the default candidate reads a twin residual from x's rows */
  if (at) {
    size_t head = (size_t)(at - src), total = strlen(src) + 8;
    char *bad = malloc(total);
    snprintf(bad, total, "%.*sfm_rl ^ 1, (n >> 3) & 7%s", (int)head, src, at + strlen(read_x));
    int rc = fm_nvrtc_compile(bad, "twin.cu", dev.arch, &cubin, &clen, &log);
    CHECK_EQ_INT(rc, FM_OK);
    if (rc) fprintf(stderr, "%s\n", log ? log : "");
    free(bad);
  }
  fm_tune_job *tj;
  if (cubin && fm_tune_job_new(&tj) == 0) {
    fm_compile_job *g0 = compile_candidate(&cands[0]);
    tj->cands[tj->n++] = g0;
    tj->cands[tj->n++] = planted(g0, cubin, clen, meta.entry);
    run_job(tj, 14);
    printf("chain twins: tune %.0f ms\n", tj->tune_ms);
    print_job(tj);
    CHECK_EQ_INT(tj->res[0].verdict, FM_VERDICT_OK);
    CHECK_EQ_INT(tj->res[1].verdict, FM_VERDICT_WRONG);
    CHECK(strstr(tj->res[1].detail, "twin inputs sharing memory") != NULL);
    CHECK_EQ_INT(tj->winner, 0);
    CHECK_EQ_INT(gu_count_child_tuners(), 0);
    fm_tune_job_free(tj);
  }
  free(src);
  free(log);
  free(cubin);
  restore_fragment();
  free(bytes);
}

/* 7. A large static fragment is verified on a sample of blocks (fm_reference_sample.h):
 * y = x + b, x [8192, 1024] bf16 (8M elements), b [1, 1024]. The default candidate verifies;
 * a kernel right everywhere but the last row, or but a sixth of the rows a third of the way
 * in, is wrong (the strips hold the last rows; every stretch of a twelfth holds a random
 * row). */
static const char *sampled_src =
    "__device__ unsigned short to_bf16(float f) {\n"
    "  unsigned u = __float_as_uint(f);\n"
    "  return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);\n"
    "}\n"
    "__device__ void add_rows(const void *x, const void *b, void *y, long long lo, long long hi) {\n"
    "  const unsigned short *xs = (const unsigned short *)x, *bs = (const unsigned short *)b;\n"
    "  unsigned short *o = (unsigned short *)y;\n"
    "  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < 8192ll * 1024;\n"
    "       i += (long long)gridDim.x * blockDim.x) {\n"
    "    float v = __uint_as_float((unsigned)xs[i] << 16) + __uint_as_float((unsigned)bs[i % 1024] << 16);\n"
    "    long long row = i / 1024;\n"
    "    o[i] = row >= lo && row < hi ? 0 : to_bf16(v);\n"
    "  }\n"
    "}\n"
    "extern \"C\" __global__ void wrong_last_row(const void *x, const void *b, void *y, long long outer) {\n"
    "  add_rows(x, b, y, 8191, 8192);\n"
    "}\n"
    "extern \"C\" __global__ void wrong_middle(const void *x, const void *b, void *y, long long outer) {\n"
    "  add_rows(x, b, y, 8192 / 3, 8192 / 3 + 8192 / 6);\n"
    "}\n"
    "extern \"C\" __global__ void right_everywhere(const void *x, const void *b, void *y, long long outer) {\n"
    "  add_rows(x, b, y, 0, 0);\n"
    "}\n";

static void test_sampled_verification(void) {
  static fm_fragment f, scanon;
  uint8_t *bytes = NULL, *cubin = NULL;
  size_t clen = 0;
  char *log = NULL;
  memset(&f, 0, sizeof f);
  f.vocab = 1;
  gs_matrix(&f.inputs[f.n_inputs++], 1, FM_DT_BF16, 8192, 1024, 0);
  gs_matrix(&f.inputs[f.n_inputs++], 2, FM_DT_BF16, 1, 1024, 0);
  gs_op(&f, FM_OP_ADD, 3, 2, 1, 2, 0);
  gs_matrix(&f.outputs[f.n_outputs++], 3, FM_DT_BF16, 8192, 1024, 0);
  if (use_fragment(&f, &scanon, &bytes, "sampled")) return;
  int rc = fm_nvrtc_compile(sampled_src, "sampled.cu", dev.arch, &cubin, &clen, &log);
  CHECK_EQ_INT(rc, FM_OK);
  if (rc) fprintf(stderr, "%s\n", log ? log : "");
  fm_candidate cands[FM_TUNE_MAX_CANDIDATES];
  size_t n = fm_codegen_candidates(&scanon, cands, FM_TUNE_MAX_CANDIDATES);
  fm_tune_job *tj;
  if (!rc && n >= 1 && fm_tune_job_new(&tj) == 0) {
    fm_compile_job *g0 = compile_candidate(&cands[0]);
    tj->cands[tj->n++] = g0;
    tj->cands[tj->n++] = planted(g0, cubin, clen, "wrong_last_row");
    tj->cands[tj->n++] = planted(g0, cubin, clen, "wrong_middle");
    tj->cands[tj->n++] = planted(g0, cubin, clen, "right_everywhere");
    run_job(tj, 15);
    printf("sampled verification (8M elements): tune %.0f ms\n", tj->tune_ms);
    print_job(tj);
    CHECK_EQ_INT(tj->res[0].verdict, FM_VERDICT_OK);
    CHECK_EQ_INT(tj->res[1].verdict, FM_VERDICT_WRONG);
    CHECK_EQ_INT(tj->res[2].verdict, FM_VERDICT_WRONG);
    CHECK_EQ_INT(tj->res[3].verdict, FM_VERDICT_OK);
    CHECK_EQ_INT(gu_count_child_tuners(), 0);
    fm_tune_job_free(tj);
  }
  free(log);
  free(cubin);
  restore_fragment();
  free(bytes);
}

static const char *sock, *fusectl, *examples;

static void test_daemon_tunes(void) {
  char cmd[2048], line[512], key[65] = "";
  int tuned = 0, listed = 0;
  snprintf(cmd, sizeof cmd, "%s --socket %s --json --timeout 120000 compile %s/gelu_bias_bf16.json 2>&1", fusectl, sock,
           examples);
  double t0 = now_ms();
  FILE *p = popen(cmd, "r");
  while (p && fgets(line, sizeof line, p)) {
    char *k = strstr(line, "\"key\": \"");
    if (k) snprintf(key, sizeof key, "%.64s", k + 8);
    if (strstr(line, "\"state\": \"tuned\"")) tuned = 1;
  }
  if (p) pclose(p);
  printf("fusemld: compile of gelu_bias_bf16 (cold: 24 compiles + tuning) took %.0f ms; state %s\n", now_ms() - t0,
         tuned ? "tuned" : "NOT tuned");
  CHECK(tuned);
  CHECK(key[0]);
  snprintf(cmd, sizeof cmd, "%s --socket %s show %.16s 2>&1", fusectl, sock, key);
  p = popen(cmd, "r");
  int in_cands = 0;
  while (p && fgets(line, sizeof line, p)) {
    if (strstr(line, "candidates (tuned on")) in_cands = 1;
    if (in_cands) {
      fputs(line, stdout);
      if (strstr(line, "pointwise block=") && strstr(line, " ok ")) listed++;
    }
  }
  if (p) pclose(p);
  CHECK(listed >= 4);
}

/* ---- 4. fault repetition ---- */

/* GPU memory in use on device 0 (MiB, from nvidia-smi), or -1. */
static long gpu_mem_used_mib(void) {
  FILE *p = popen("nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 2>/dev/null", "r");
  long v = -1;
  if (p) {
    if (fscanf(p, "%ld", &v) != 1) v = -1;
    pclose(p);
  }
  return v;
}

static void test_fault_repetition(void) {
  const char *rep_s = getenv("FM_FAULT_REPEAT");
  int rounds = rep_s && atoi(rep_s) > 0 ? atoi(rep_s) : 50;
  const double deadline_s = 0.5;
  /* the static fragment: x [1024, 4096] bf16 + b [1, 4096], gelu */
  fb b;
  fm_fragment tmp, scanon;
  fm_diag d = {{0}};
  uint8_t *sbytes = NULL;
  size_t slen = 0;
  int64_t xs[2] = {1024, 4096}, bs[2] = {1, 4096};
  fb_init(&b);
  uint32_t x = fb_input(&b, FM_DT_BF16, 2, xs, NULL, 16);
  uint32_t bias = fb_input(&b, FM_DT_BF16, 2, bs, NULL, 16);
  fb_output(&b, fb_op1(&b, FM_OP_GELU, fb_op2(&b, FM_OP_ADD, x, bias)), 2, xs);
  tmp = b.f;
  CHECK(fm_fragment_validate(&tmp, &d) == FM_OK && fm_fragment_canonicalize(&tmp, &scanon) == FM_OK &&
        fm_fragment_canonical_bytes(&scanon, &sbytes, &slen) == FM_OK);
  if (!sbytes) return;
  cur_canon = &scanon;
  cur_bytes = sbytes;
  cur_len = slen;

  fm_candidate cands[FM_TUNE_MAX_CANDIDATES];
  size_t n = fm_codegen_candidates(&scanon, cands, FM_TUNE_MAX_CANDIDATES);
  uint8_t *cubin = NULL;
  size_t len = 0;
  char *log = NULL;
  CHECK(n >= 3);
  CHECK_EQ_INT(fm_nvrtc_compile(planted_src, "planted.cu", dev.arch, &cubin, &len, &log), FM_OK);
  free(log);
  if (n < 3 || !cubin) goto out;

  fm_tworker w;
  fm_tuner_opts o = {.worker_exe = worker_exe, .deadline_s = deadline_s, .seed = 13};
  fm_tworker_init(&w, worker_exe);
  long base = gpu_mem_used_mib(), first_round = -1, last_round = -1;
  int restarts = 0, bad = 0, ok_after = 0, stray = 0, same_pid = 0, rounds_ok = 0;
  double t_max = 0, t_sum = 0;
  for (int r = 0; r < rounds; r++) {
    fm_tune_job *tj;
    if (fm_tune_job_new(&tj)) break;
    fm_compile_job *g0 = compile_candidate(&cands[0]);
    tj->cands[tj->n++] = g0;
    tj->cands[tj->n++] = planted(g0, cubin, len, "planted_oob");
    tj->cands[tj->n++] = compile_candidate(&cands[1]);
    tj->cands[tj->n++] = planted(g0, cubin, len, "planted_hang");
    tj->cands[tj->n++] = compile_candidate(&cands[2]);
    pid_t pid_before = w.pid;
    double t0 = now_ms();
    fm_tuner_run_job(&w, &o, tj);
    double t = now_ms() - t0;
    t_sum += t;
    if (t > t_max) t_max = t;
    int fault_ok = tj->res[1].verdict == FM_VERDICT_LAUNCH_FAILED || tj->res[1].verdict == FM_VERDICT_FAULT;
    int hang_ok = tj->res[3].verdict == FM_VERDICT_TIMEOUT;
    int good = tj->res[0].verdict == FM_VERDICT_OK && tj->res[2].verdict == FM_VERDICT_OK &&
               tj->res[4].verdict == FM_VERDICT_OK;
    int procs = gu_count_child_tuners();
    restarts += (int)tj->restarts;
    bad += (int)tj->bad;
    ok_after += good;
    stray += procs != 1;
    same_pid += r > 0 && w.pid == pid_before;
    int this_ok = fault_ok && hang_ok && good && tj->restarts == 2 && tj->bad == 2 && procs == 1 && tj->tuned &&
                  w.pid != pid_before;
    rounds_ok += this_ok;
    if (!this_ok) {
      printf("round %d: %.0f ms, %u restarts, %u bad, %d tuner processes, pid %ld -> %ld\n", r, t, tj->restarts,
             tj->bad, procs, (long)pid_before, (long)w.pid);
      print_job(tj);
    }
    if (r == 0 || r == rounds - 1 || r % 10 == 9) {
      long used = gpu_mem_used_mib();
      if (r == 0) first_round = used;
      last_round = used;
      printf("fault round %d: %.0f ms, GPU memory used %ld MiB (baseline %ld)\n", r + 1, t, used, base);
    } else {
      printf("fault round %d: %.0f ms\n", r + 1, t);
    }
    fm_tune_job_free(tj);
  }
  fm_tworker_stop(&w, 5000);
  long after = -1;
  /* the driver frees a dead context's memory asynchronously: give it a moment */
  for (int i = 0; i < 30; i++) {
    after = gpu_mem_used_mib();
    if (base < 0 || after <= base + 16) break;
    usleep(100 * 1000);
  }
  printf(
      "faults: %d rounds (%d ok), %d restarts, %d marked bad, %d good-after-fault rounds, "
      "round mean %.0f ms max %.0f ms (deadline %.1f s + restarts), %d rounds with a stray process; "
      "GPU memory used: baseline %ld MiB, first round %ld, last round %ld, after stop %ld\n",
      rounds, rounds_ok, restarts, bad, ok_after, t_sum / (rounds ? rounds : 1), t_max, deadline_s, stray, base,
      first_round, last_round, after);
  CHECK_EQ_INT(rounds_ok, rounds);
  CHECK_EQ_INT(restarts, 2 * rounds);
  CHECK_EQ_INT(bad, 2 * rounds);
  CHECK_EQ_INT(same_pid, 0);
  CHECK_EQ_INT(stray, 0);
  CHECK(t_max < deadline_s * 1000 + 10000);
  CHECK(waitpid(-1, NULL, WNOHANG) < 0 && errno == ECHILD);
  CHECK_EQ_INT(gu_count_child_tuners(), 0);
  if (base >= 0) {
    CHECK(last_round <= first_round + 64); /* no dead worker's memory piles up */
    CHECK(after <= base + 16);
  }
out:
  free(cubin);
  free(sbytes);
  cur_canon = &canon;
  cur_bytes = canon_bytes;
  cur_len = canon_len;
}

/* The current fragment (use_fragment) tuned with its default, a planted copy of the default
 * whose source has `find` replaced by `wrong` (a kernel that runs to the end and writes a wrong
 * result), and up to `most` candidates in all: the planted one is marked wrong, every other
 * one passes, and it never wins. */
static void tune_planted(const fm_fragment *frag, const char *what, const char *find, const char *wrong, size_t most) {
  fm_diag d = {{0}};
  fm_candidate cands[FM_TUNE_MAX_CANDIDATES];
  size_t n = fm_codegen_candidates(frag, cands, FM_TUNE_MAX_CANDIDATES);
  CHECK(n >= 2);
  char *src = NULL, *log = NULL;
  fm_kernel_meta meta;
  uint8_t *cubin = NULL;
  size_t clen = 0;
  const char *at = NULL;
  if (n >= 1 && fm_codegen_generate(frag, &cands[0], dev.sm_count, &src, &meta, &d) == FM_OK) at = strstr(src, find);
  CHECK(at != NULL);
  if (at) {
    size_t head = (size_t)(at - src), total = strlen(src) + strlen(wrong) + 1;
    char *bad = malloc(total);
    snprintf(bad, total, "%.*s%s%s", (int)head, src, wrong, at + strlen(find));
    int rc = fm_nvrtc_compile(bad, "planted.cu", dev.arch, &cubin, &clen, &log);
    CHECK_EQ_INT(rc, FM_OK);
    if (rc) fprintf(stderr, "%s\n", log ? log : "");
    free(bad);
  }
  fm_tune_job *tj;
  if (cubin && fm_tune_job_new(&tj) == 0) {
    fm_compile_job *g0 = compile_candidate(&cands[0]);
    tj->cands[tj->n++] = g0;
    tj->cands[tj->n++] = planted(g0, cubin, clen, meta.entry);
    for (size_t i = 1; i < n && tj->n < most; i++) tj->cands[tj->n++] = compile_candidate(&cands[i]);
    run_job(tj, 15);
    printf("%s: tune %.0f ms\n", what, tj->tune_ms);
    print_job(tj);
    CHECK_EQ_INT(tj->res[0].verdict, FM_VERDICT_OK);
    CHECK_EQ_INT(tj->res[1].verdict, FM_VERDICT_WRONG);
    for (size_t i = 2; i < tj->n; i++) CHECK_EQ_INT(tj->res[i].verdict, FM_VERDICT_OK);
    CHECK(tj->winner != 1);
    CHECK_EQ_INT(gu_count_child_tuners(), 0);
    fm_tune_job_free(tj);
  }
  free(src);
  free(log);
  free(cubin);
}

/* index_add (vocabulary 8): a planted kernel that reads the next row's index, so that every
 * row lands where another belongs (bf16 rows [8192, 1024] into f32 [4096, 1024]). */
static void test_scatter_tune(void) {
  static fm_fragment f, scanon;
  uint8_t *bytes = NULL;
  memset(&f, 0, sizeof f);
  f.vocab = FM_VOCAB_SCATTER;
  gs_matrix(&f.inputs[f.n_inputs++], 1, FM_DT_BF16, 8192, 1024, 0);
  gs_vector(&f.inputs[f.n_inputs++], 2, FM_DT_I64, 8192);
  gs_op(&f, FM_OP_INDEX_ADD, 3, 2, 1, 2, 0);
  gs_matrix(&f.outputs[f.n_outputs++], 3, FM_DT_F32, 4096, 1024, 0);
  if (use_fragment(&f, &scanon, &bytes, "index_add")) return;
  tune_planted(&scanon, "index_add", "index[m * 1ll]", "index[(m + 1) % 8192ll]", FM_TUNE_MAX_CANDIDATES);
  restore_fragment();
  free(bytes);
}

/* take_rows (vocabulary 9): a planted kernel that reads the next row (every element from a row
 * in range, but the wrong one). */
static void test_gather_tune(void) {
  static fm_fragment f, gcanon;
  uint8_t *bytes = NULL;
  memset(&f, 0, sizeof f);
  f.vocab = FM_VOCAB_GATHER;
  gs_matrix(&f.inputs[f.n_inputs++], 1, FM_DT_BF16, 4096, 256, 0);
  gs_matrix(&f.inputs[f.n_inputs++], 2, FM_DT_I64, 2048, 1, 0);
  gs_op(&f, FM_OP_TAKE_ROWS, 3, 2, 1, 2, 0);
  gs_matrix(&f.outputs[f.n_outputs++], 3, FM_DT_BF16, 2048, 256, 0);
  if (use_fragment(&f, &gcanon, &bytes, "take_rows")) return;
  tune_planted(&gcanon, "take_rows", "/* take_rows: the row */", "t2 = (t2 + 1) % 4096LL;", 8);
  restore_fragment();
  free(bytes);
}

/* iota (vocabulary 11): cross-entropy's gradient at an odd vocabulary (bf16 logits [512, 1001]
 * read at the padded stride 1008, written contiguous: units) and its forward's logit at the
 * target column (rows). The verifier fills the targets with columns, so a planted kernel whose
 * column is one off is wrong: in f32 by the norm (a one-hot one column off changes two elements
 * of a row of 1001 by 1), in bf16 by the bound on each element (the norm stays under bf16's
 * 1e-2 on random logits; the verifier holds every element of a fragment with an iota within
 * the tolerance of the largest). */
static void test_iota_tune(void) {
  static fm_fragment f, icanon;
  uint8_t *bytes = NULL;
  memset(&f, 0, sizeof f);
  f.vocab = FM_VOCAB_IOTA;
  gs_matrix(&f.inputs[f.n_inputs++], 1, FM_DT_BF16, 512, 1001, 0);
  gs_matrix(&f.inputs[f.n_inputs++], 2, FM_DT_F32, 512, 1, 0);
  gs_op(&f, FM_OP_IOTA, 3, 0, 0, 0, 0);
  f.ops[f.n_ops - 1].dtype = FM_DT_F32;
  gs_op(&f, FM_OP_EQ, 4, 2, 3, 2, 0);
  gs_op(&f, FM_OP_CAST, 10, 1, 1, 0, 0);
  f.ops[f.n_ops - 1].dtype = FM_DT_F32;
  gs_op(&f, FM_OP_EXP, 5, 1, 10, 0, 0);
  gs_op(&f, FM_OP_CONST, 6, 0, 0, 0, 0);
  f.ops[f.n_ops - 1].value = 1.0;
  gs_op(&f, FM_OP_SUB, 7, 2, 5, 6, 0);
  gs_op(&f, FM_OP_WHERE, 8, 3, 4, 7, 5);
  gs_matrix(&f.outputs[f.n_outputs++], 8, FM_DT_F32, 512, 1001, 0);
  f.outputs[0].strides[0] = 1001; /* contiguous: one unit of 8 may span two rows */
  if (use_fragment(&f, &icanon, &bytes, "iota gradient")) return;
  tune_planted(&icanon, "iota gradient", "const long long fm_cb = ", "const long long fm_cb = 1 + ", 8);
  restore_fragment();
  free(bytes);
  /* in bf16, where the norm stays under 1e-2: the largest element's bound catches it */
  f.ops[f.n_ops++] = (fm_opnode){.op = FM_OP_CAST, .out = 9, .nargs = 1, .args = {8}, .dtype = FM_DT_BF16};
  f.outputs[0].id = 9;
  f.outputs[0].dtype = FM_DT_BF16;
  if (use_fragment(&f, &icanon, &bytes, "iota gradient bf16")) return;
  tune_planted(&icanon, "iota gradient bf16", "const long long fm_cb = ", "const long long fm_cb = 1 + ", 8);
  restore_fragment();
  free(bytes);
  /* the forward: sum(where(iota == t, x, 0)) over each row */
  memset(&f, 0, sizeof f);
  f.vocab = FM_VOCAB_IOTA;
  gs_matrix(&f.inputs[f.n_inputs++], 1, FM_DT_BF16, 512, 1001, 0);
  gs_matrix(&f.inputs[f.n_inputs++], 2, FM_DT_F32, 512, 1, 0);
  gs_op(&f, FM_OP_IOTA, 3, 0, 0, 0, 0);
  f.ops[f.n_ops - 1].dtype = FM_DT_F32;
  gs_op(&f, FM_OP_EQ, 4, 2, 3, 2, 0);
  gs_op(&f, FM_OP_CONST, 5, 0, 0, 0, 0);
  gs_op(&f, FM_OP_CAST, 6, 1, 1, 0, 0);
  f.ops[f.n_ops - 1].dtype = FM_DT_F32;
  gs_op(&f, FM_OP_WHERE, 7, 3, 4, 6, 5);
  gs_op(&f, FM_OP_SUM, 8, 1, 7, 0, 0);
  f.ops[f.n_ops - 1].dim = -1;
  gs_matrix(&f.outputs[f.n_outputs++], 8, FM_DT_F32, 512, 1, 0);
  if (use_fragment(&f, &icanon, &bytes, "iota rows")) return;
  tune_planted(&icanon, "iota rows", ");  /* iota */", ") + 1.0f;  /* iota */", 8);
  restore_fragment();
  free(bytes);
}

int main(int argc, char **argv) {
  fm_diag d = {{0}};
  if (argc < 2) {
    fprintf(stderr, "usage: %s PATH/TO/fusemld-tuner [SOCKET FUSECTL EXAMPLES_DIR]\n", argv[0]);
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  /* Line-buffered even into a file: a run cut off by `timeout` keeps what it printed. */
  setvbuf(stdout, NULL, _IOLBF, 0);
  worker_exe = argv[1];
  if (fm_cuda_device_id(0, &dev, &d)) {
    fprintf(stderr, "no GPU: %s\n", d.text);
    printf("0 passed, 1 failed\n");
    return 1;
  }
  printf("device: %s (%s, %u SMs)\n", dev.name, dev.arch, dev.sm_count);
  if (build_fragment()) return 1;
  const char *only = getenv("FM_TUNER_GPU_ONLY");
  if (only && strcmp(only, "decode") == 0) {
    RUN(test_decode_gemm_tune);
    free(canon_bytes);
    return FM_TEST_DONE();
  }
  if (only && strcmp(only, "twins") == 0) {
    RUN(test_chain_twins);
    free(canon_bytes);
    return FM_TEST_DONE();
  }
  if (only && strcmp(only, "sampled") == 0) {
    RUN(test_sampled_verification);
    free(canon_bytes);
    return FM_TEST_DONE();
  }
  if (only && strcmp(only, "scatter") == 0) {
    RUN(test_scatter_tune);
    RUN(test_gather_tune);
    RUN(test_iota_tune);
    free(canon_bytes);
    return FM_TEST_DONE();
  }
  if (only && strcmp(only, "faults") == 0) {
    RUN(test_fault_repetition);
    free(canon_bytes);
    return FM_TEST_DONE();
  }
  RUN(test_planted_bad_candidates);
  RUN(test_full_tune);
  RUN(test_decode_gemm_tune);
  RUN(test_chain_twins);
  RUN(test_sampled_verification);
  RUN(test_scatter_tune);
  RUN(test_gather_tune);
  RUN(test_iota_tune);
  if (argc >= 5) {
    sock = argv[2];
    fusectl = argv[3];
    examples = argv[4];
    RUN(test_daemon_tunes);
  }
  /* Last: the longest (100 worker starts); a run cut off by a timeout loses only it. */
  RUN(test_fault_repetition);
  free(canon_bytes);
  return FM_TEST_DONE();
}
