/* test_codegen_rows.c: the rows template without a GPU: golden source for the three
 * representative row fragments, NVRTC compiles of every candidate of every test fragment for
 * sm_80 and sm_90a, the launch metadata, the candidate list and the dispatch of the generic
 * API. Regenerate the goldens with FM_UPDATE_GOLDEN=1 (see test_codegen_golden.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fm_codegen.h"
#include "fm_test.h"
#include "test_codegen_frag.h"
#include "test_codegen_rows_frag.h"

static fm_fragment canon;

static size_t count(const char *s, const char *needle) {
  size_t n = 0;
  for (const char *p = s; (p = strstr(p, needle)); p += strlen(needle)) n++;
  return n;
}

static void check_golden(int which) {
  char *src = NULL;
  fm_kernel_meta meta;
  fm_diag d = {{0}};
  fm_candidate c;
  CHECK_EQ_INT(rf_fragment(which, &canon), FM_OK);
  CHECK_EQ_INT(fm_codegen_default(&canon, &c, &d), FM_OK);
  CHECK_EQ_INT(c.tmpl, FM_TMPL_ROWS);
  CHECK_EQ_INT(fm_codegen_generate(&canon, &c, 132, &src, &meta, &d), FM_OK);
  if (!src) return;
  CHECK(tf_golden(rf_name[which], src));
  CHECK(strstr(src, "#include") == NULL);
  CHECK_STR_CONTAINS(src, "fm_row_sum(");
  free(src);
}

static void test_golden_layer_norm_bf16(void) { check_golden(0); }
static void test_golden_rms_norm_residual(void) { check_golden(1); }
static void test_golden_softmax_f32(void) { check_golden(2); }
static void test_golden_log_softmax_stream(void) { check_golden(7); }
static void test_golden_cross_entropy_stream(void) { check_golden(9); }

/* A row longer than registers hold streams: the default and every candidate is the STREAM
 * variant; log_softmax makes one reduction pass (amax and the sum of exp as an online pair)
 * and one that stores, each a loop over the whole tiles with no bounds test, then the last
 * partial tile with them; the per-row output is stored once per row. */
static void test_stream(void) {
  fm_candidate c[32];
  fm_kernel_meta m;
  fm_diag d = {{0}};
  char *src = NULL;
  CHECK_EQ_INT(rf_fragment(7, &canon), FM_OK);
  size_t n = fm_codegen_candidates(&canon, c, 32);
  CHECK_EQ_INT(n, 3); /* 1024 (the default), 256, 512 threads */
  for (size_t i = 0; i < n; i++) CHECK_EQ_INT(c[i].p[0], FM_ROWS_STREAM);
  CHECK_EQ_INT(c[0].p[1], 1024);
  fm_rows_config stream = {FM_ROWS_STREAM, 512, 0};
  CHECK_EQ_INT(fm_codegen_rows(&canon, &stream, 132, &src, &m, &d), FM_OK);
  if (!src) return;
  CHECK_EQ_INT(count(src, "for (long long fm_t0 = 0; fm_t0 < 49152LL; fm_t0 += 8192LL)"), 2);
  CHECK_EQ_INT(count(src, "const long long fm_t0 = 49152LL;"), 2);
  CHECK_EQ_INT(count(src, "< 50257)"), 2);         /* the online pair's two statements, in the last tile only */
  CHECK_EQ_INT(count(src, "if (j < 50257LL)"), 3); /* in the last tiles: the loads of both passes, the store */
  CHECK_STR_CONTAINS(src, "/* pass 1: the reductions of level 1 */");
  CHECK_EQ_INT(count(src, "/* online: the tile's max, then the sum of exp(x - max) rescaled once */"), 2);
  CHECK_STR_CONTAINS(src, "/* online sum */");
  CHECK(strstr(src, "pass 2") == NULL);
  CHECK_STR_CONTAINS(src, "v0[c] = fm_bf16_to_f32(in0[b0 + j]);"); /* N odd: scalar loads */
  CHECK_EQ_INT(m.items_per_block, 1);
  CHECK_EQ_INT(m.block[0], 512);
  free(src);
  src = NULL;
  /* whole tiles of a vectorised row: no bounds tests; the mean stored per row */
  CHECK_EQ_INT(rf_fragment(8, &canon), FM_OK);
  CHECK_EQ_INT(fm_codegen_rows(&canon, &stream, 132, &src, &m, &d), FM_OK);
  if (!src) return;
  CHECK_STR_CONTAINS(src, "vec 8, 16 elements per thread");
  CHECK_EQ_INT(count(src, "fm_t0 += 8192LL"), 2); /* one reduction pass (mean, amax), the stores */
  CHECK(strstr(src, "< 40960)") == NULL);
  CHECK(strstr(src, "the last tile") == NULL);
  CHECK_STR_CONTAINS(src, "if (lane == 0) out1[");
  free(src);
  src = NULL;
  /* only streamed candidates for it; a row of 4096 is never streamed */
  CHECK_EQ_INT(fm_codegen_candidates(&canon, c, 32), 3);
  CHECK_EQ_INT(rf_fragment(0, &canon), FM_OK);
  n = fm_codegen_candidates(&canon, c, 32);
  for (size_t i = 0; i < n; i++) CHECK(c[i].p[0] != FM_ROWS_STREAM);
}

/* Cross-entropy's forward over 32000 logits: the default streams it (1024 threads would hold
 * 32 elements of each of the logits and the column index in 64 registers: it spilled), and
 * its three reductions (amax, the online sum of exp, the picked logit) share ONE pass, so the
 * row is read once, by 256 threads; the held variant stays a candidate, timed against it. */
static void test_stream_cross_entropy(void) {
  fm_candidate c[32];
  fm_kernel_meta m;
  fm_diag d = {{0}};
  char *src = NULL;
  CHECK_EQ_INT(rf_fragment(9, &canon), FM_OK);
  size_t n = fm_codegen_candidates(&canon, c, 32);
  CHECK(n >= 3);
  CHECK_EQ_INT(c[0].p[0], FM_ROWS_STREAM);
  CHECK_EQ_INT(c[0].p[1], 256);
  int held = 0, stream_1024 = 0;
  for (size_t i = 0; i < n; i++) stream_1024 += c[i].p[0] == FM_ROWS_STREAM && c[i].p[1] == 1024;
  CHECK_EQ_INT(stream_1024, 1);
  for (size_t i = 0; i < n; i++) held += c[i].p[0] == FM_ROWS_BLOCK;
  CHECK(held >= 1);
  CHECK_EQ_INT(fm_codegen_generate(&canon, &c[0], 132, &src, &m, &d), FM_OK);
  if (!src) return;
  CHECK_EQ_INT(count(src, "for (long long fm_t0 = 0; fm_t0 < 28672LL;"), 1); /* 7 whole tiles of 4096 */
  CHECK_EQ_INT(count(src, "const long long fm_t0 = 28672LL;"), 1);           /* and the last */
  CHECK_EQ_INT(count(src, "/* online: the tile's max, then the sum of exp(x - max) rescaled once */"), 2);
  const char *last = strstr(src, "the last tile");
  CHECK(last != NULL);
  if (last) { /* the whole tiles test no column against the row's end */
    const char *first_test = strstr(src, "< 32000");
    CHECK(first_test != NULL && first_test > last);
  }
  CHECK_EQ_INT(count(src, "fm_row_sum("), 3); /* the helper, the online sum, the picked logit */
  CHECK_EQ_INT(count(src, "fm_row_max(fm_a"), 1);
  CHECK(strstr(src, "pass 2") == NULL);
  free(src);
}

/* Gemma 2's softcapped logits, written beside the loss's statistics: the written row depends on
 * no reduction, so the one pass that reduces the row also stores it; no second pass reads the
 * row again. */
static void test_stream_stores_in_the_first_pass(void) {
  fm_candidate c[32];
  fm_kernel_meta m;
  fm_diag d = {{0}};
  char *src = NULL;
  CHECK_EQ_INT(rf_fragment(10, &canon), FM_OK);
  size_t n = fm_codegen_candidates(&canon, c, 32);
  CHECK(n >= 1);
  CHECK_EQ_INT(c[0].p[0], FM_ROWS_STREAM);
  CHECK_EQ_INT(fm_codegen_generate(&canon, &c[0], 132, &src, &m, &d), FM_OK);
  if (!src) return;
  const char *body = strstr(src, "---- the kernel ----");
  CHECK(body != NULL);
  if (body) {
    CHECK_EQ_INT(count(body, "for (long long fm_t0 = 0;"), 1); /* one pass over the row */
    CHECK_EQ_INT(count(body, "fm_tanh("), 2);                  /* its whole tiles, its last one */
    CHECK(strstr(body, "the last pass") == NULL);
    const char *loop = strstr(body, "for (long long fm_t0 = 0;"),
               *store = strstr(body, "reinterpret_cast<uint4 *>(out2");
    CHECK(loop != NULL && store != NULL && store > loop);
  }
  free(src);
}

/* layer_norm's mean and var are ONE cross-thread reduction of (count, sum, shifted sum, M2),
 * and every block reduction helper has a single barrier (double-buffered shared memory). */
static void test_layer_norm_one_reduction(void) {
  static const fm_rows_config cfgs[2] = {{FM_ROWS_BLOCK, 128, 0}, {FM_ROWS_BLOCK, 512, 0}};
  fm_kernel_meta m;
  fm_diag d = {{0}};
  char *src = NULL;
  CHECK_EQ_INT(rf_fragment(0, &canon), FM_OK);
  for (int i = 0; i < 2; i++) {
    CHECK_EQ_INT(fm_codegen_rows(&canon, &cfgs[i], 132, &src, &m, &d), FM_OK);
    if (!src) return;
    const char *body = strstr(src, "---- the kernel ----");
    CHECK(body != NULL);
    if (body) {
      CHECK_EQ_INT(count(body, "fm_row_msum(p, k, fm_red, fm_par)"), 1);
      CHECK_EQ_INT(count(body, "fm_row_sum("), 0);
      CHECK_EQ_INT(count(body, "fm_row_max("), 0);
    }
    CHECK_EQ_INT(count(src, "__syncthreads()"), 3); /* fm_row_sum, fm_row_max, fm_row_msum */
    free(src);
    src = NULL;
  }
  /* var alone (no mean before it) is one reduction too; the stats fragment's mean feeds both
   * vars (correction 0 and 1) */
  CHECK_EQ_INT(rf_fragment(3, &canon), FM_OK);
  fm_rows_config warp = {FM_ROWS_WARP, 256, 0};
  CHECK_EQ_INT(fm_codegen_rows(&canon, &warp, 132, &src, &m, &d), FM_OK);
  if (!src) return;
  CHECK_EQ_INT(count(src, "fm_row_msum(p, k, fm_red, fm_par)"), 1);
  CHECK_STR_CONTAINS(src, "v7 = fm_q3 / 6.0f;");
  CHECK_STR_CONTAINS(src, "v9 = fm_q3 / 7.0f;");
  free(src);
}

/* Metadata a client launches by: kind, rule, rows per outer unit and per block. */
static void test_meta(void) {
  fm_kernel_meta m;
  fm_diag d = {{0}};
  char *src = NULL;
  fm_rows_config warp = {FM_ROWS_WARP, 256, 0}, block = {FM_ROWS_BLOCK, 512, 0};
  CHECK_EQ_INT(rf_fragment(0, &canon), FM_OK); /* [-1, 4096] */
  CHECK_EQ_INT(fm_codegen_rows(&canon, &block, 132, &src, &m, &d), FM_OK);
  CHECK(strcmp(m.kind, "rows") == 0 && strcmp(m.grid_rule, "rows") == 0);
  CHECK_EQ_INT(m.block[0], 512);
  CHECK_EQ_INT(m.inner, 1);
  CHECK_EQ_INT(m.items_per_block, 1);
  CHECK_EQ_INT(m.outer, -1);
  CHECK_EQ_INT(m.n_inputs, 3);
  CHECK_EQ_INT(m.n_outputs, 1);
  CHECK_EQ_INT(fm_meta_grid_x(&m, 1000), 1000);
  CHECK_STR_CONTAINS(src, "vec 8, 8 elements per thread");
  free(src);
  src = NULL;
  CHECK_EQ_INT(rf_fragment(2, &canon), FM_OK); /* [64, 1000] f32 */
  CHECK_EQ_INT(fm_codegen_rows(&canon, &warp, 132, &src, &m, &d), FM_OK);
  CHECK_EQ_INT(m.items_per_block, 8);
  CHECK_EQ_INT(m.outer, 64);
  CHECK_EQ_INT(fm_meta_grid_x(&m, 5), 8); /* static: 64 rows / 8 per block */
  CHECK_STR_CONTAINS(src, "vec 4, 32 elements per thread");
  CHECK_STR_CONTAINS(src, "#define FM_FAST_MATH 0");
  free(src);
  src = NULL;
  /* a row too long for one warp's registers: refused for that config, with the reason */
  CHECK_EQ_INT(rf_fragment(0, &canon), FM_OK);
  CHECK_EQ_INT(fm_codegen_rows(&canon, &warp, 132, &src, &m, &d), FM_EUNSUPPORTED);
  CHECK_STR_CONTAINS(d.text, "per thread");
  CHECK(src == NULL);
  fm_rows_config bad = {4, 256, 0};
  CHECK_EQ_INT(fm_codegen_rows(&canon, &bad, 132, &src, &m, &d), FM_EINVAL);
}

static void test_candidates(void) {
  fm_candidate c[32];
  char desc[128];
  CHECK_EQ_INT(rf_fragment(0, &canon), FM_OK);
  size_t n = fm_codegen_candidates(&canon, c, 32);
  CHECK(n >= 3);
  for (size_t i = 0; i < n; i++) {
    CHECK_EQ_INT(c[i].tmpl, FM_TMPL_ROWS);
    CHECK_EQ_INT(c[i].p[0], FM_ROWS_BLOCK); /* 4096 is too long for a warp */
  }
  fm_candidate_describe(&c[0], desc, sizeof desc);
  CHECK_STR_CONTAINS(desc, "rows block-per-row block=128"); /* 32 elements per thread */
  CHECK_EQ_INT(rf_fragment(2, &canon), FM_OK);
  n = fm_codegen_candidates(&canon, c, 32);
  CHECK(n >= 4);
  CHECK_EQ_INT(c[0].p[0], FM_ROWS_WARP);
  int has_block = 0;
  for (size_t i = 0; i < n; i++) has_block |= c[i].p[0] == FM_ROWS_BLOCK;
  CHECK(has_block);
}

/* Every candidate of every test fragment compiles for both target generations. */
static void test_nvrtc_every_candidate(void) {
  int compiled = 0, total = 0;
  for (int w = 0; w < RF_N_FRAGMENTS; w++) {
    CHECK_EQ_INT(rf_fragment(w, &canon), FM_OK);
    CHECK_EQ_INT(tf_compile_every(&canon, rf_name[w], &compiled), 0);
    total += compiled;
  }
  printf("  %d compiles\n", total);
}

int main(void) {
  RUN(test_golden_layer_norm_bf16);
  RUN(test_golden_rms_norm_residual);
  RUN(test_golden_softmax_f32);
  RUN(test_golden_log_softmax_stream);
  RUN(test_golden_cross_entropy_stream);
  RUN(test_stream);
  RUN(test_stream_stores_in_the_first_pass);
  RUN(test_stream_cross_entropy);
  RUN(test_layer_norm_one_reduction);
  RUN(test_meta);
  RUN(test_candidates);
  RUN(test_nvrtc_every_candidate);
  return FM_TEST_DONE();
}
