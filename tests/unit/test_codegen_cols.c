/* test_codegen_cols.c: the cols template without a GPU: golden source of the bias gradient,
 * NVRTC compiles of every candidate of every test fragment for sm_90a and of those that run
 * there for sm_80 (no clusters), the cluster code of S > 1, the launch metadata and its grid,
 * the candidate list and its pruning, and the dispatch of the generic API. Regenerate the
 * golden with FM_UPDATE_GOLDEN=1 (see test_codegen_golden.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fm_codegen.h"
#include "fm_meta.h"
#include "fm_test.h"
#include "test_codegen_cols_frag.h"
#include "test_codegen_frag.h"

static fm_fragment canon;

static size_t count(const char *s, const char *needle) {
  size_t n = 0;
  for (const char *p = s; p && (p = strstr(p, needle)); p += strlen(needle)) n++;
  return n;
}

static void test_golden_bias_grad(void) {
  char *src = NULL;
  fm_kernel_meta meta;
  fm_diag d = {{0}};
  fm_candidate c;
  CHECK_EQ_INT(cf_fragment(0, &canon), FM_OK);
  CHECK_EQ_INT(fm_codegen_default(&canon, &c, &d), FM_OK);
  CHECK_EQ_INT(c.tmpl, FM_TMPL_COLS);
  CHECK_EQ_INT(fm_codegen_generate(&canon, &c, 132, &src, &meta, &d), FM_OK);
  CHECK(tf_golden(cf_name[0], src));
  /* what the golden was chosen for, whatever the file says */
  CHECK(src && strstr(src, "#include") == NULL);
  CHECK_STR_CONTAINS(src, "reinterpret_cast<const uint4 *>(in0 + mu * 1024LL + n0 + 0)");
  CHECK(count(src, "__cluster_dims__") == 0 && count(src, "fm_cluster_sync") == 0); /* runs on sm_80 */
  CHECK(count(src, "atomic") == 0);
  free(src);
}

/* S > 1: two cluster barriers around rank 0's reads of the others' partials, in rank order. */
static void test_cluster_code(void) {
  fm_cols_config cfg = {64, 4, 8, 4, 256, 0};
  fm_kernel_meta m;
  fm_diag d = {{0}};
  char *src = NULL;
  CHECK_EQ_INT(cf_fragment(1, &canon), FM_OK);
  CHECK_EQ_INT(fm_codegen_cols(&canon, &cfg, 132, &src, &m, &d), FM_OK);
  const char *body = src ? strstr(src, "---- the kernel ----") : NULL;
  CHECK(body != NULL);
  CHECK_STR_CONTAINS(body, "__cluster_dims__(1, 4, 1) __launch_bounds__(256) fm_cols_v");
  CHECK_EQ_INT(count(body, "fm_cluster_sync();"), 2);
  CHECK_STR_CONTAINS(body, "for (unsigned int q = 1; q < 4; ++q)");
  CHECK_STR_CONTAINS(body, "fm_dsmem_load(&fm_part[0 * W + threadIdx.x], q)");
  CHECK_STR_CONTAINS(body, "long long m = (long long)rank * 32 + ty;"); /* TY = 256 / (64 / 8) */
  CHECK_STR_CONTAINS(body, "m += 512LL");                               /* 4 rows of S * TY = 128 */
  CHECK_STR_CONTAINS(body, "v1[i] = in1[n0 + i];");                     /* the scale, once per column */
  CHECK_EQ_INT(m.cluster[1], 4);
  free(src);
  src = NULL;
  /* the scalar form (N = 100) and amax's NaN-propagating fold */
  fm_cols_config scalar = {128, 2, 1, 2, 256, 0};
  CHECK_EQ_INT(cf_fragment(2, &canon), FM_OK);
  CHECK_EQ_INT(fm_codegen_cols(&canon, &scalar, 132, &src, &m, &d), FM_OK);
  CHECK_STR_CONTAINS(src, "r0[u] = in0[mu * 100LL + n0 * 1LL];");
  CHECK_STR_CONTAINS(src, "fm_maximum(t, fm_sh[y * W + threadIdx.x])");
  CHECK_STR_CONTAINS(src, " / (float)M;  /* mean */");
  CHECK_EQ_INT(count(src, "__syncthreads();"), 5); /* three folds: one barrier each, one between */
  free(src);
  src = NULL;
  /* the vector form needs N % 8 == 0 and aligned rows: refused with the reason otherwise */
  fm_cols_config vec = {128, 1, 8, 4, 256, 0};
  CHECK_EQ_INT(fm_codegen_cols(&canon, &vec, 132, &src, &m, &d), FM_EUNSUPPORTED);
  CHECK_STR_CONTAINS(d.text, "vector loads");
  CHECK(src == NULL);
  fm_cols_config bad = {96, 1, 1, 4, 256, 0};
  CHECK_EQ_INT(fm_codegen_cols(&canon, &bad, 132, &src, &m, &d), FM_EINVAL);
  fm_cols_config wide = {512, 1, 1, 4, 256, 0}; /* wider than the block: columns nobody folds */
  CHECK_EQ_INT(fm_codegen_cols(&canon, &wide, 132, &src, &m, &d), FM_EINVAL);
}

/* What a client launches by: kind and rule "columns", a block per strip, the cluster. */
static void test_meta(void) {
  fm_cols_config cfg = {128, 8, 8, 4, 256, 0};
  fm_kernel_meta m;
  fm_diag d = {{0}};
  char *src = NULL;
  CHECK_EQ_INT(cf_fragment(0, &canon), FM_OK); /* [-1, 1024] */
  CHECK_EQ_INT(fm_codegen_cols(&canon, &cfg, 132, &src, &m, &d), FM_OK);
  CHECK(strcmp(m.kind, "columns") == 0 && strcmp(m.grid_rule, "columns") == 0);
  CHECK_EQ_INT(m.block[0], 256);
  CHECK_EQ_INT(m.inner, 1024);
  CHECK_EQ_INT(m.items_per_block, 128);
  CHECK_EQ_INT(m.max_blocks, 8);
  CHECK_EQ_INT(m.outer, -1);
  CHECK_EQ_INT(m.n_inputs, 1);
  CHECK_EQ_INT(m.n_outputs, 1);
  CHECK_EQ_INT(fm_meta_grid_x(&m, 16384), 8);
  CHECK_EQ_INT(fm_meta_grid_y(&m, 16384), 8);
  CHECK_EQ_INT(fm_meta_grid_x(&m, 0), 8); /* M = 0 launches: the outputs are written */
  free(src);
  src = NULL;
  CHECK_EQ_INT(cf_fragment(3, &canon), FM_OK); /* static [300, 48] */
  fm_cols_config one = {32, 1, 1, 4, 256, 0};
  CHECK_EQ_INT(fm_codegen_cols(&canon, &one, 132, &src, &m, &d), FM_OK);
  CHECK_EQ_INT(m.outer, 300);
  CHECK_EQ_INT(m.max_blocks, 2);
  CHECK_EQ_INT(m.cluster[1], 0); /* none */
  CHECK_EQ_INT(fm_meta_grid_y(&m, 5), 1);
  CHECK_STR_CONTAINS(src, "const long long M = 300LL;");
  CHECK_STR_CONTAINS(src, "#define FM_FAST_MATH 0");
  free(src);
}

static void test_candidates(void) {
  fm_candidate c[40];
  char desc[128];
  CHECK_EQ_INT(cf_fragment(0, &canon), FM_OK); /* N 1024: every width, every cluster */
  size_t n = fm_codegen_candidates(&canon, c, 40);
  CHECK_EQ_INT(n, 20);
  for (size_t i = 0; i < n; i++) {
    CHECK_EQ_INT(c[i].tmpl, FM_TMPL_COLS);
    CHECK_EQ_INT(c[i].p[2], 8); /* vectorised */
    CHECK(fm_candidate_runs_on(&c[i], "sm_90a"));
    CHECK(fm_candidate_runs_on(&c[i], "sm_100"));
    CHECK_EQ_INT(fm_candidate_runs_on(&c[i], "sm_80"), c[i].p[1] == 1);
  }
  fm_candidate_describe(&c[0], desc, sizeof desc);
  CHECK_STR_CONTAINS(desc, "cols width=16 cluster=1 vec=8 unroll=8 block=256");
  CHECK_EQ_INT(cf_fragment(5, &canon), FM_OK); /* N 1: one strip of 16, clusters only, split too */
  n = fm_codegen_candidates(&canon, c, 40);
  CHECK_EQ_INT(n, 6);
  CHECK(c[4].p[5] > 1 && c[5].p[5] > 1);
  CHECK_EQ_INT(c[0].p[2], 1);                  /* the scalar form */
  CHECK_EQ_INT(cf_fragment(3, &canon), FM_OK); /* static M 300: 256-thread blocks of 8..256 rows */
  n = fm_codegen_candidates(&canon, c, 40);
  for (size_t i = 0; i < n; i++) {
    uint32_t ty = 256 / c[i].p[0];
    CHECK(c[i].p[1] == 1 || c[i].p[1] * ty <= 300); /* every block of a cluster has rows */
    CHECK(c[i].p[0] / 2 < 48 || c[i].p[0] == 16);   /* no strip mostly past N */
  }
  CHECK(n >= 4);
  CHECK_EQ_INT(c[0].p[3], 8);                  /* 8 bytes a row: 8 rows in flight */
  CHECK_EQ_INT(cf_fragment(1, &canon), FM_OK); /* 16 bytes a row (the scale is per column) */
  CHECK_EQ_INT(fm_codegen_cols_default(&canon).unroll, 8);
}

/* Every candidate of every test fragment compiles for both target generations where it runs. */
/* The split form: G clusters' partials into the caller's scratch, a second kernel adds them
 * per column and runs the epilogue; the metadata says so (finish), round-trips, and sizes the
 * grid (y: S * G) and the scratch (G x reductions x N fp32). */
static void test_split(void) {
  fm_candidate c[40];
  char desc[128];
  CHECK_EQ_INT(cf_fragment(6, &canon), FM_OK); /* 64 columns, 2 reductions */
  size_t n = fm_codegen_candidates(&canon, c, 40), split = 0;
  for (size_t i = 0; i < n; i++) split += c[i].p[5] > 1;
  CHECK_EQ_INT(split, 6); /* strips of 16, 32, 64 x clusters of 1 and 8 */
  fm_cols_config cfg = {16, 8, 8, 8, 256, 4};
  char *src = NULL;
  fm_kernel_meta m;
  fm_diag d = {{0}};
  CHECK_EQ_INT(fm_codegen_cols(&canon, &cfg, 132, &src, &m, &d), FM_OK);
  if (!src) return;
  char want[64];
  snprintf(want, sizeof want, "fm_cols_v%d_finish(", FM_CODEGEN_VERSION);
  CHECK_STR_CONTAINS(src, want);
  CHECK_STR_CONTAINS(src, "float *__restrict__ fm_scratch) {");
  CHECK_STR_CONTAINS(src, "long long m = (long long)blockIdx.y * 128 + ty;"); /* TY 128, stepping by 4 x 8 x 128 */
  CHECK_STR_CONTAINS(src, "for (int g = 1; g < 4; ++g)");
  CHECK_EQ_INT(m.finish.groups, 4);
  CHECK_EQ_INT(m.finish.grid, 1);
  CHECK_EQ_INT(m.finish.block, 256);
  CHECK_EQ_INT((long long)(m.finish.scratch), (long long)(4 * 2 * 64 * 4));
  CHECK_EQ_INT((long long)(fm_meta_grid_y(&m, 1000)), (long long)(8 * 4));
  CHECK_EQ_INT((long long)(fm_meta_scratch_bytes(&m, 1000)), (long long)(4 * 2 * 64 * 4));
  /* packed and read back: the same launch */
  fm_kernel_meta back;
  CHECK_EQ_INT(tf_meta_round_trip(&m, &back, &d), FM_OK);
  CHECK(strcmp(back.finish.entry, m.finish.entry) == 0);
  CHECK_EQ_INT(back.finish.groups, 4);
  CHECK_EQ_INT((long long)(fm_meta_scratch_bytes(&back, 7)), (long long)(m.finish.scratch));
  free(src);
  fm_candidate k = {.tmpl = FM_TMPL_COLS, .p = {16, 8, 8, 8, 256, 4}};
  fm_candidate_describe(&k, desc, sizeof desc);
  CHECK_STR_CONTAINS(desc, "split=4");
  fm_cols_config bad = {16, 8, 8, 8, 256, 3}; /* not a power of two */
  CHECK_EQ_INT(fm_codegen_cols(&canon, &bad, 132, &src, &m, &d), FM_EINVAL);
}

static void test_nvrtc_every_candidate(void) {
  int compiled = 0, total = 0;
  for (int w = 0; w < CF_N_FRAGMENTS; w++) {
    CHECK_EQ_INT(cf_fragment(w, &canon), FM_OK);
    CHECK_EQ_INT(tf_compile_every(&canon, cf_name[w], &compiled), 0);
    total += compiled;
  }
  printf("  %d compiles\n", total);
}

int main(void) {
  RUN(test_golden_bias_grad);
  RUN(test_cluster_code);
  RUN(test_meta);
  RUN(test_candidates);
  RUN(test_split);
  RUN(test_nvrtc_every_candidate);
  return FM_TEST_DONE();
}
