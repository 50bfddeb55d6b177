/* test_codegen_nvrtc.c: real NVRTC (it needs no GPU). Every op of the vocabulary, the
 * representative fragments, and the default plus every candidate config of one of them
 * are generated and compiled to CUBIN for sm_80 and sm_90a, on two threads at once (the
 * daemon compiles from a worker pool, so fm_nvrtc_compile must be thread-safe). Also: the
 * options string, the architecture check, and the compile-error path. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fm_codegen.h"
#include "fm_nvrtc.h"
#include "fm_test.h"
#include "test_codegen_frag.h"

#define MAX_JOBS  256
#define N_THREADS 2

static const char *const archs[] = {"sm_80", "sm_90a"};

typedef struct job {
  char name[64];
  char *src;
  const char *arch;
  int rc;
  size_t cubin_len;
  int elf;
  char *log;
} job;

static job jobs[MAX_JOBS];
static int n_jobs;
static atomic_int next_job;
static fm_fragment raw, canon;

/* Generates canon with cfg and queues it once per architecture. */
static void add_jobs(const char *name, const fm_fragment *f, const fm_pw_config *cfg) {
  char *src = NULL;
  fm_kernel_meta m;
  fm_diag d = {{0}};
  fm_candidate def;
  int rc = !fm_fragment_is_scatter(f)        ? fm_codegen_pointwise(f, cfg, 132, &src, &m, &d)
           : fm_codegen_default(f, &def, &d) ? FM_EUNSUPPORTED
                                             : fm_codegen_generate(f, &def, 132, &src, &m, &d);
  if (rc) fprintf(stderr, "  %s: codegen: %s: %s\n", name, fm_strerror(rc), d.text);
  CHECK_EQ_INT(rc, FM_OK);
  if (!src) return;
  for (size_t a = 0; a < sizeof archs / sizeof archs[0]; a++) {
    CHECK(n_jobs < MAX_JOBS);
    if (n_jobs >= MAX_JOBS) break;
    job *j = &jobs[n_jobs++];
    snprintf(j->name, sizeof j->name, "%s", name);
    j->src = a == 0 ? src : strdup(src);
    j->arch = archs[a];
  }
}

static void *worker(void *arg) {
  (void)arg;
  for (;;) {
    int i = atomic_fetch_add(&next_job, 1);
    if (i >= n_jobs) return NULL;
    job *j = &jobs[i];
    uint8_t *cubin = NULL;
    j->rc = fm_nvrtc_compile(j->src, "fusemld_test.cu", j->arch, &cubin, &j->cubin_len, &j->log);
    j->elf = cubin && j->cubin_len >= 4 &&
             memcmp(cubin,
                    "\x7f"
                    "ELF",
                    4) == 0;
    free(cubin);
  }
}

static void run_jobs(void) {
  pthread_t t[N_THREADS];
  atomic_store(&next_job, 0);
  for (int i = 0; i < N_THREADS; i++) CHECK(pthread_create(&t[i], NULL, worker, NULL) == 0);
  for (int i = 0; i < N_THREADS; i++) pthread_join(t[i], NULL);
  for (int i = 0; i < n_jobs; i++) {
    job *j = &jobs[i];
    if (j->rc != FM_OK || !j->elf) {
      fprintf(stderr, "  %s (%s): %s\n%s\n", j->name, j->arch, fm_strerror(j->rc), j->log ? j->log : "");
      fprintf(stderr, "---- source ----\n%s\n", j->src);
    }
    CHECK_EQ_INT(j->rc, FM_OK);
    CHECK(j->elf);
    CHECK(j->log == NULL);
    free(j->src);
    free(j->log);
  }
  n_jobs = 0;
}

static void finish(const char *name) {
  if (tf_finish(&raw, &canon) != FM_OK) {
    fprintf(stderr, "  %s: fragment refused\n", name);
    CHECK(!"fragment is valid");
    return;
  }
  add_jobs(name, &canon, NULL);
}

/* One fragment per op, each over a different layout so the paths are all exercised. */
static void queue_every_op(void) {
  int64_t sym[2] = {-1, 256}, row[2] = {1, 256};
  int64_t odd[2] = {33, 65};
  int64_t sq[2] = {128, 64}, tr[2] = {1, 128};
  int covered[FM_OP__COUNT] = {0};
  char name[64];
  for (int op = 0; op < FM_OP__COUNT; op++) {
    tf_init(&raw);
    snprintf(name, sizeof name, "op %s", fm_op_name((fm_op)op));
    switch (fm_op_kind((fm_op)op)) {
      case FM_OPK_CONST: /* a fill: no inputs at all */
        tf_const(&raw, 1, 3.0);
        tf_output(&raw, 1, FM_DT_F32, 2, sym, NULL, 16);
        break;
      case FM_OPK_BINARY:            /* bf16 [-1, 256] op f32 bias [1, 256] -> f32: strided */
        if (op == FM_OP_FLOOR_DIV) { /* of integers (vocab 10): i64 [-1, 256] by a const -> i64 */
          raw.vocab = FM_VOCAB_INTEGER;
          tf_input(&raw, 1, FM_DT_I64, 2, sym, NULL, 16);
          tf_const(&raw, 2, -3);
          tf_op(&raw, (fm_op)op, 3, 2, 1, 2, 0);
          tf_output(&raw, 3, FM_DT_I64, 2, sym, NULL, 16);
          break;
        }
        tf_input(&raw, 1, FM_DT_BF16, 2, sym, NULL, 16);
        tf_input(&raw, 2, FM_DT_F32, 2, row, NULL, 16);
        tf_op(&raw, (fm_op)op, 3, 2, 1, 2, 0);
        tf_output(&raw, 3, FM_DT_F32, 2, sym, NULL, 16);
        break;
      case FM_OPK_POW: /* every special-cased exponent and a general one */
        tf_input(&raw, 1, FM_DT_F32, 2, odd, NULL, 16);
        {
          static const double e[] = {2.0, 3.0, 1.0, 0.5, -0.5, -1.0, -2.0, 1.5};
          uint32_t prev = 1;
          for (uint32_t i = 0; i < 8; i++) {
            tf_const(&raw, 10 + 2 * i, e[i]);
            tf_op(&raw, (fm_op)op, 11 + 2 * i, 2, prev, 10 + 2 * i, 0);
            prev = 11 + 2 * i;
          }
          tf_output(&raw, prev, FM_DT_F32, 2, odd, NULL, 16);
        }
        break;
      case FM_OPK_UNARY: /* f16 [33, 65]: flat with a tail */
        tf_input(&raw, 1, FM_DT_F16, 2, odd, NULL, 16);
        tf_op(&raw, (fm_op)op, 2, 1, 1, 0, 0);
        tf_output(&raw, 2, FM_DT_F16, 2, odd, NULL, 16);
        break;
      case FM_OPK_COMPARE: /* f32 vs a transposed bf16 -> bool: strided, scalar access */
        tf_input(&raw, 1, FM_DT_F32, 2, sq, NULL, 16);
        tf_input(&raw, 2, FM_DT_BF16, 2, sq, tr, 16);
        tf_op(&raw, (fm_op)op, 3, 2, 1, 2, 0);
        tf_output(&raw, 3, FM_DT_BOOL, 2, sq, NULL, 16);
        break;
      case FM_OPK_WHERE: /* bool cond, bf16 x, const -> bf16 */
        tf_input(&raw, 1, FM_DT_BOOL, 2, sym, NULL, 16);
        tf_input(&raw, 2, FM_DT_BF16, 2, sym, NULL, 16);
        tf_const(&raw, 3, -1e39);
        tf_op(&raw, (fm_op)op, 4, 3, 1, 2, 3);
        tf_output(&raw, 4, FM_DT_BF16, 2, sym, NULL, 16);
        break;
      case FM_OPK_CAST: /* f32 to every dtype, and bool back to f16 */
        tf_input(&raw, 1, FM_DT_F32, 2, sq, NULL, 16);
        for (uint32_t dt = 0; dt < FM_DT__COUNT; dt++) {
          if (dt == FM_DT_I64) continue; /* an index dtype: nothing is cast to it */
          tf_cast(&raw, 10 + dt, 1, (fm_dtype)dt);
          tf_output(&raw, 10 + dt, (fm_dtype)dt, 2, sq, NULL, 16);
        }
        tf_cast(&raw, 20, 10 + FM_DT_BOOL, FM_DT_F16);
        tf_output(&raw, 20, FM_DT_F16, 2, sq, NULL, 16);
        break;
      case FM_OPK_CAT: /* bf16 [-1, 100] and a computed f32 [-1, 28] -> f32 [-1, 128] */
      {
        int64_t a[2] = {-1, 100}, b[2] = {-1, 28}, o[2] = {-1, 128};
        raw.vocab = 6;
        tf_input(&raw, 1, FM_DT_BF16, 2, a, NULL, 16);
        tf_input(&raw, 2, FM_DT_F32, 2, b, NULL, 16);
        tf_op(&raw, FM_OP_EXP, 3, 1, 2, 0, 0);
        tf_op(&raw, (fm_op)op, 4, 2, 1, 3, 0);
        raw.ops[raw.n_ops - 1].dim = 1;
        tf_output(&raw, 4, FM_DT_F32, 2, o, NULL, 16);
      } break;            /* more in test_codegen_cat */
      case FM_OPK_WINDOW: /* ResNet's stem max pool and its backward, channels-last bf16 (the
                             goldens of test_codegen_window) */
      {
        static const int64_t stem[4] = {-1, 64, 12, 12};
        static const int32_t window[8] = {3, 3, 2, 2, 1, 1, 1, 1};
        CHECK_EQ_INT(tf_max_pool(&raw, &canon, FM_DT_BF16, stem, window, 0, 1,
                                 op == FM_OP_MAX_POOL2D_BACKWARD ? TF_POOL_BACKWARD : TF_POOL_ARGMAX),
                     FM_OK);
      } break;
      case FM_OPK_SCATTER: /* bf16 rows [33, 65] added at 33 i64 rows of an f32 [40, 65] */
      {
        int64_t src[2] = {33, 65}, index[1] = {33}, out[2] = {40, 65};
        raw.vocab = FM_VOCAB_SCATTER;
        tf_input(&raw, 1, FM_DT_BF16, 2, src, NULL, 16);
        tf_input(&raw, 2, FM_DT_I64, 1, index, NULL, 16);
        tf_op(&raw, (fm_op)op, 3, 2, 1, 2, 0);
        tf_output(&raw, 3, FM_DT_F32, 2, out, NULL, 16);
      } break;            /* more in test_codegen_scatter */
      case FM_OPK_GATHER: /* bf16 rows [40, 65] taken at every other of 66 i64 rows, scaled */
      {
        int64_t src[2] = {40, 65}, index[2] = {33, 1}, pick[2] = {2, 0}, out[2] = {33, 65};
        raw.vocab = FM_VOCAB_GATHER;
        tf_input(&raw, 1, FM_DT_BF16, 2, src, NULL, 16);
        tf_input(&raw, 2, FM_DT_I64, 2, index, pick, 16);
        tf_input(&raw, 3, FM_DT_F32, 2, index, NULL, 16);
        tf_op(&raw, (fm_op)op, 4, 2, 1, 2, 0);
        tf_op(&raw, FM_OP_MUL, 5, 2, 4, 3, 0);
        tf_cast(&raw, 6, 5, FM_DT_BF16);
        tf_output(&raw, 6, FM_DT_BF16, 2, out, NULL, 16);
      } break;          /* more in test_codegen_gather */
      case FM_OPK_IOTA: /* cross-entropy's gradient at odd rows: where(iota == t, x - 1, x), units */
      {
        int64_t t[2] = {33, 1};
        tf_input(&raw, 1, FM_DT_BF16, 2, odd, NULL, 16);
        tf_input(&raw, 2, FM_DT_F32, 2, t, NULL, 16);
        tf_iota(&raw, 3, FM_DT_F32);
        tf_op(&raw, FM_OP_EQ, 4, 2, 3, 2, 0);
        tf_const(&raw, 5, 1.0);
        tf_op(&raw, FM_OP_SUB, 6, 2, 1, 5, 0);
        tf_op(&raw, FM_OP_WHERE, 7, 3, 4, 6, 1);
        tf_cast(&raw, 8, 7, FM_DT_BF16);
        tf_output(&raw, 8, FM_DT_BF16, 2, odd, NULL, 16);
      } break; /* more in test_codegen_iota */
      case FM_OPK_RESERVED:
      case FM_OPK_REDUCE: /* row fragments: test_codegen_rows */
      case FM_OPK_COMPOSITE:
      case FM_OPK_MATMUL: /* GEMM fragments: test_codegen_gemm */
        continue;
    }
    covered[op] = 1;
    finish(name);
  }
  for (int op = 0; op < FM_OP__COUNT; op++)
    if (fm_op_vocab((fm_op)op) == 1) CHECK(covered[op]);
}

static void test_every_op_compiles(void) {
  queue_every_op();
  run_jobs();
}

/* The representative fragments, their default, every candidate of the first, and a few
 * layouts with access patterns the ops above do not produce. */
static void test_configs_compile(void) {
  char name[64];
  for (int w = 0; w < TF_N_REPRESENTATIVE; w++) {
    CHECK_EQ_INT(tf_representative(w, &canon), FM_OK);
    add_jobs(tf_representative_name[w], &canon, NULL);
  }
  fm_pw_config c[32];
  CHECK_EQ_INT(tf_representative(0, &canon), FM_OK);
  size_t n = fm_codegen_pointwise_candidates(&canon, c, 32);
  CHECK_EQ_INT(n, 24);
  for (size_t i = 0; i < n; i++) {
    snprintf(name, sizeof name, "candidate %zu (%u/%u/%u)", i, c[i].block, c[i].unroll, c[i].blocks_per_sm);
    add_jobs(name, &canon, &c[i]);
  }
  fm_pw_config scalar = {128, 1, 8, 8}; /* vec 1 on a flat fragment */
  add_jobs("flat scalar", &canon, &scalar);
  CHECK_EQ_INT(tf_representative(1, &canon), FM_OK);
  fm_pw_config narrow = {512, 2, 3, 4}; /* 4-byte vectors on the strided path */
  add_jobs("strided vec 2", &canon, &narrow);

  int64_t bs[2] = {-1, 256}, rs[2] = {64, 128}, cs[2] = {64, 1};
  tf_init(&raw); /* all-bool, 16 per access */
  tf_input(&raw, 1, FM_DT_BOOL, 2, bs, NULL, 16);
  tf_input(&raw, 2, FM_DT_BOOL, 2, bs, NULL, 16);
  tf_op(&raw, FM_OP_EQ, 3, 2, 1, 2, 0);
  tf_output(&raw, 3, FM_DT_BOOL, 2, bs, NULL, 16);
  finish("bool vec 16");
  tf_init(&raw); /* a per-row f32 scale splatted over bf16 vectors */
  tf_input(&raw, 1, FM_DT_BF16, 2, rs, NULL, 16);
  tf_input(&raw, 2, FM_DT_F32, 2, cs, NULL, 4);
  tf_op(&raw, FM_OP_MUL, 3, 2, 1, 2, 0);
  tf_cast(&raw, 4, 3, FM_DT_BF16);
  tf_output(&raw, 4, FM_DT_BF16, 2, rs, NULL, 16);
  finish("splat");
  tf_init(&raw); /* rank 0 */
  tf_input(&raw, 1, FM_DT_BF16, 0, NULL, NULL, 2);
  tf_op(&raw, FM_OP_SIGMOID, 2, 1, 1, 0, 0);
  tf_output(&raw, 2, FM_DT_BF16, 0, NULL, NULL, 2);
  finish("rank 0");
  tf_init(&raw); /* 4-D with a 2-D bias: coalesced to 2 dims, plus an unused input */
  int64_t x4[4] = {2, 3, 4, 8}, b4[4] = {1, 1, 4, 8};
  tf_input(&raw, 1, FM_DT_F16, 4, x4, NULL, 16);
  tf_input(&raw, 2, FM_DT_F16, 4, b4, NULL, 16);
  tf_input(&raw, 3, FM_DT_F32, 4, b4, NULL, 16);
  tf_op(&raw, FM_OP_ADD, 4, 2, 1, 2, 0);
  tf_output(&raw, 4, FM_DT_F16, 4, x4, NULL, 16);
  finish("4-D bias");
  run_jobs();
}

static void test_options_and_archs(void) {
  char buf[128];
  CHECK(fm_nvrtc_options("sm_90a", buf, sizeof buf) == buf);
  CHECK(strcmp(buf, "--gpu-architecture=sm_90a -default-device --std=c++17") == 0);
  CHECK(fm_nvrtc_options("sm_80", buf, 10) == NULL); /* does not fit */
  CHECK(fm_nvrtc_arch_supported("sm_80"));
  CHECK(fm_nvrtc_arch_supported("sm_90a"));
  CHECK(!fm_nvrtc_arch_supported("sm_75")); /* not a target of ours */
  CHECK(!fm_nvrtc_arch_supported("sm_90a;rm -rf"));
  CHECK(!fm_nvrtc_arch_supported(NULL));
  uint32_t major = 0, minor = 0;
  CHECK_EQ_INT(fm_nvrtc_version(&major, &minor), FM_OK);
  CHECK(major >= 12);
}

static void test_compile_error(void) {
  uint8_t *cubin = (uint8_t *)1;
  size_t len = 7;
  char *log = NULL;
  const char *broken = "extern \"C\" __global__ void k(float *p) { p[0] = undeclared_thing; }\n";
  CHECK_EQ_INT(fm_nvrtc_compile(broken, "broken.cu", "sm_90a", &cubin, &len, &log), FM_ECOMPILE);
  CHECK(cubin == NULL && len == 0);
  CHECK_STR_CONTAINS(log, "error");
  CHECK_STR_CONTAINS(log, "undeclared_thing");
  free(log);
  /* the fixed options mean #include of a file cannot resolve */
  log = NULL;
  CHECK_EQ_INT(fm_nvrtc_compile("#include <stdio.h>\n", "inc.cu", "sm_80", &cubin, &len, &log), FM_ECOMPILE);
  CHECK_STR_CONTAINS(log, "error");
  free(log);
  log = NULL;
  CHECK_EQ_INT(fm_nvrtc_compile("", NULL, "sm_75", &cubin, &len, &log), FM_EINVAL);
  free(log);
  CHECK_EQ_INT(fm_nvrtc_compile(NULL, NULL, "sm_80", &cubin, &len, NULL), FM_EINVAL);
}

int main(void) {
  RUN(test_options_and_archs);
  RUN(test_compile_error);
  RUN(test_every_op_compiles);
  RUN(test_configs_compile);
  return FM_TEST_DONE();
}
