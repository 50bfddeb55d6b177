/* test_codegen_b2b.c: chained GEMM fragments (back-to-back GEMMs: an MLP block in one kernel)
 * without a GPU: what validation accepts and refuses (the stage rules), the fp64 reference
 * on a chain checked by hand (the intermediate rounded to bf16 like eager's tensor), the
 * candidates (the b2b template only: no gemm/skinny/cuBLASLt candidate, sm_90a only), the
 * limits answered as bypass reasons, the generated source and metadata, and NVRTC compiles
 * of every candidate for sm_90a. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fm_codegen.h"
#include "fm_meta.h"
#include "fm_nvrtc.h"
#include "fm_reference.h"
#include "fm_test.h"
#include "test_codegen_frag.h"

static fm_fragment raw, canon;

/* y = gelu(x @ W1.t() + b1) @ W2.t() + b2 + r (tf_mlp_chain), m_hint 16384. */
static int build_mlp(int64_t k1, int64_t n1, int64_t n2) { return tf_mlp_chain(&raw, &canon, k1, n1, n2); }

static void expect_reject(int rc_want, const char *why) { CHECK(tf_rejects(&raw, rc_want, why)); }

static void test_validate(void) {
  CHECK_EQ_INT(build_mlp(256, 1024, 256), FM_OK);
  CHECK_EQ_INT(canon.vocab, 3); /* no new op */
  CHECK(fm_fragment_is_gemm(&canon));
  CHECK(fm_fragment_is_chain(&canon));
  fm_chain_info ci;
  fm_diag d = {{0}};
  CHECK_EQ_INT(fm_fragment_chain_info(&canon, &ci, &d), FM_OK);
  CHECK_EQ_INT(ci.stage[ci.op1], 1);
  CHECK_EQ_INT(ci.stage[ci.op2], 2);
  /* the biases: b1 read in stage 1, b2 and r in stage 2, the matrix operands by no stage */
  CHECK_EQ_INT(ci.in_need[2], 1);
  CHECK_EQ_INT(ci.in_need[4], 2);
  CHECK_EQ_INT(ci.in_need[5], 2);
  CHECK_EQ_INT(ci.in_need[0] | ci.in_need[1] | ci.in_need[3], 0);
  CHECK_EQ_INT(canon.inputs[2].rank, 2); /* [N1] -> [1, N1] */

  int64_t x[2] = {32, 64}, w1[2] = {64, 128}, w2[2] = {128, 64}, w2b[2] = {96, 64};
  int64_t o[2] = {32, 64}, h[2] = {32, 128}, r1[2] = {32, 128};
  /* the intermediate as an output */
  tf_init(&raw);
  tf_input(&raw, 1, FM_DT_BF16, 2, x, NULL, 16);
  tf_input(&raw, 2, FM_DT_BF16, 2, w1, NULL, 16);
  tf_input(&raw, 3, FM_DT_BF16, 2, w2, NULL, 16);
  tf_op(&raw, FM_OP_MM, 4, 2, 1, 2, 0);
  tf_op(&raw, FM_OP_RELU, 5, 1, 4, 0, 0);
  tf_op(&raw, FM_OP_MM, 6, 2, 5, 3, 0);
  tf_output(&raw, 6, FM_DT_BF16, 2, o, NULL, 16);
  tf_output(&raw, 5, FM_DT_BF16, 2, h, NULL, 16);
  expect_reject(FM_EUNSUPPORTED, "a chain stores only values of its second stage");
  /* B2's rows are not N1 */
  tf_init(&raw);
  tf_input(&raw, 1, FM_DT_BF16, 2, x, NULL, 16);
  tf_input(&raw, 2, FM_DT_BF16, 2, w1, NULL, 16);
  tf_input(&raw, 3, FM_DT_BF16, 2, w2b, NULL, 16);
  tf_op(&raw, FM_OP_MM, 4, 2, 1, 2, 0);
  tf_op(&raw, FM_OP_MM, 6, 2, 4, 3, 0);
  tf_output(&raw, 6, FM_DT_BF16, 2, o, NULL, 16);
  expect_reject(FM_ESCHEMA, "the second product's B has 96 rows");
  /* a stage-1 input [32, 128] read in stage 2 ([32, 64]) */
  tf_init(&raw);
  tf_input(&raw, 1, FM_DT_BF16, 2, x, NULL, 16);
  tf_input(&raw, 2, FM_DT_BF16, 2, w1, NULL, 16);
  tf_input(&raw, 3, FM_DT_BF16, 2, w2, NULL, 16);
  tf_input(&raw, 7, FM_DT_BF16, 2, r1, NULL, 16);
  tf_op(&raw, FM_OP_MM, 4, 2, 1, 2, 0);
  tf_op(&raw, FM_OP_MM, 6, 2, 4, 3, 0);
  tf_op(&raw, FM_OP_ADD, 8, 2, 6, 7, 0);
  tf_output(&raw, 8, FM_DT_BF16, 2, o, NULL, 16);
  expect_reject(FM_ESCHEMA, "does not broadcast to 64 (read in stage 2 of the chain");
  /* an f32 intermediate (no cast back to the operands' dtype) */
  tf_init(&raw);
  tf_input(&raw, 1, FM_DT_BF16, 2, x, NULL, 16);
  tf_input(&raw, 2, FM_DT_BF16, 2, w1, NULL, 16);
  tf_input(&raw, 3, FM_DT_BF16, 2, w2, NULL, 16);
  tf_op(&raw, FM_OP_MM, 4, 2, 1, 2, 0);
  tf_cast(&raw, 5, 4, FM_DT_F32);
  tf_op(&raw, FM_OP_MM, 6, 2, 5, 3, 0);
  tf_output(&raw, 6, FM_DT_BF16, 2, o, NULL, 16);
  expect_reject(FM_EUNSUPPORTED, "'mm' multiplies bf16 or f16 tensors, got f32");
  /* the second product's A computed from inputs only (not from the first product) */
  tf_init(&raw);
  tf_input(&raw, 1, FM_DT_BF16, 2, x, NULL, 16);
  tf_input(&raw, 2, FM_DT_BF16, 2, w1, NULL, 16);
  tf_input(&raw, 3, FM_DT_BF16, 2, w2, NULL, 16);
  tf_input(&raw, 7, FM_DT_BF16, 2, h, NULL, 16);
  tf_op(&raw, FM_OP_MM, 4, 2, 1, 2, 0);
  tf_op(&raw, FM_OP_RELU, 5, 1, 7, 0, 0);
  tf_op(&raw, FM_OP_MM, 6, 2, 5, 3, 0);
  tf_output(&raw, 6, FM_DT_BF16, 2, o, NULL, 16);
  expect_reject(FM_EUNSUPPORTED, "must be computed from the first product");
  /* a second-stage op reading a first-stage value (N1 == N2, so only the stage rule stops it) */
  tf_init(&raw);
  tf_input(&raw, 1, FM_DT_BF16, 2, x, NULL, 16);
  tf_input(&raw, 2, FM_DT_BF16, 2, w2, NULL, 16);
  tf_input(&raw, 3, FM_DT_BF16, 2, w1, NULL, 16);
  tf_op(&raw, FM_OP_MM, 4, 2, 1, 2, 0);
  tf_op(&raw, FM_OP_MM, 6, 2, 4, 3, 0);
  tf_op(&raw, FM_OP_ADD, 8, 2, 6, 4, 0);
  tf_output(&raw, 8, FM_DT_BF16, 2, o, NULL, 16);
  expect_reject(FM_EUNSUPPORTED, "reads a value of both stages of the chain");
}

/* x [3, 4] by W1 [4, 2] then relu, rounded to bf16, by W2 [2, 3] plus r [3, 3], by hand. */
static void test_reference(void) {
  int64_t x[2] = {3, 4}, w1[2] = {4, 2}, w2[2] = {2, 3}, o[2] = {3, 3};
  uint16_t X[12], W1[8], W2[6], R[9];
  float y[9];
  for (int i = 0; i < 12; i++) X[i] = fm_reference_f32_to_bf16((float)(i % 5) * 0.37f - 0.6f);
  for (int i = 0; i < 8; i++) W1[i] = fm_reference_f32_to_bf16((float)(i % 3) * 0.71f - 0.5f);
  for (int i = 0; i < 6; i++) W2[i] = fm_reference_f32_to_bf16((float)(i % 4) - 1.25f);
  for (int i = 0; i < 9; i++) R[i] = fm_reference_f32_to_bf16((float)i * 0.125f);
  tf_init(&raw);
  tf_input(&raw, 1, FM_DT_BF16, 2, x, NULL, 16);
  tf_input(&raw, 2, FM_DT_BF16, 2, w1, NULL, 16);
  tf_input(&raw, 3, FM_DT_BF16, 2, w2, NULL, 16);
  tf_input(&raw, 4, FM_DT_BF16, 2, o, NULL, 16);
  tf_op(&raw, FM_OP_MM, 5, 2, 1, 2, 0);
  tf_op(&raw, FM_OP_RELU, 6, 1, 5, 0, 0);
  tf_op(&raw, FM_OP_MM, 7, 2, 6, 3, 0);
  tf_op(&raw, FM_OP_ADD, 8, 2, 7, 4, 0);
  tf_cast(&raw, 9, 8, FM_DT_F32);
  tf_output(&raw, 9, FM_DT_F32, 2, o, NULL, 16);
  CHECK_EQ_INT(tf_finish(&raw, &canon), FM_OK);
  const void *ins[4] = {X, W1, W2, R};
  void *outs[1] = {y};
  fm_diag d = {{0}};
  CHECK_EQ_INT(fm_reference_eval(&canon, 0, ins, outs, &d), FM_OK);
  for (int m = 0; m < 3; m++)
    for (int n = 0; n < 3; n++) {
      double acc = 0;
      for (int j = 0; j < 2; j++) {
        double h = 0;
        for (int k = 0; k < 4; k++)
          h += (double)fm_reference_bf16_to_f32(X[m * 4 + k]) * fm_reference_bf16_to_f32(W1[k * 2 + j]);
        h = h > 0 ? h : 0;
        h = fm_reference_bf16_to_f32(fm_reference_f32_to_bf16((float)h)); /* the bf16 intermediate */
        acc += h * fm_reference_bf16_to_f32(W2[j * 3 + n]);
      }
      /* the add (bf16 in the IR) stays unrounded like any intermediate; the cast is to f32 */
      double want = (float)(acc + fm_reference_bf16_to_f32(R[m * 3 + n]));
      CHECK(fabs(y[m * 3 + n] - want) <= 1e-6 * (1 + fabs(want)));
    }
}

static void test_candidates_and_source(void) {
  CHECK_EQ_INT(build_mlp(256, 1024, 256), FM_OK);
  fm_candidate c[16];
  size_t n = fm_codegen_candidates(&canon, c, 16);
  CHECK(n >= 2);
  for (size_t i = 0; i < n; i++) {
    CHECK_EQ_INT(c[i].tmpl, FM_TMPL_B2B);
    CHECK(fm_candidate_runs_on(&c[i], "sm_90a"));
    CHECK(!fm_candidate_runs_on(&c[i], "sm_80"));
  }
  CHECK_EQ_INT(c[0].p[0], 128); /* the default: two warpgroups fed by TMA */
  CHECK_EQ_INT(c[0].p[1], FM_B2B_TMA);
  fm_candidate blas[2];
  CHECK_EQ_INT(fm_codegen_blas_candidates(&canon, blas, 2), 0); /* no plan keeps h on chip */
  char *src = NULL;
  fm_kernel_meta meta;
  fm_diag d = {{0}};
  CHECK_EQ_INT(fm_codegen_generate(&canon, &c[0], 132, &src, &meta, &d), FM_OK);
  if (src) {
    CHECK_STR_CONTAINS(src, "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16");
    CHECK_STR_CONTAINS(src, "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16");
    CHECK_STR_CONTAINS(src, "fm_loader(&fm_tmx, &fm_tmw1, &fm_tmw2, xs, w1s, w2s, bars, (int)m0);");
    /* 64 KiB of A's rows + five 32 KiB buffers: three of B's chunks, two of B2's */
    CHECK_STR_CONTAINS(src, "#define FM_S1 3\n#define FM_S2 2\n");
    CHECK_STR_CONTAINS(src, "fm_h = v");
  }
  free(src);
  CHECK(strcmp(meta.grid_rule, "tiles") == 0);
  CHECK_EQ_INT(meta.max_blocks, 1);
  CHECK_EQ_INT(meta.items_per_block, 128);
  CHECK_EQ_INT(meta.inner, 256);
  CHECK_EQ_INT(meta.block[0], 384); /* + the loader warpgroup */
  CHECK(meta.smem > 48 * 1024 && meta.smem <= 227 * 1024);
  CHECK_EQ_INT(meta.outer, -1);
  /* the three tensor maps: x [M, 256] in boxes of 128 rows, W1 as [1024, 256] rows in boxes of
     64, W2 as [256, 1024] rows in one box of 256 */
  CHECK_EQ_INT(meta.n_tmaps, 3);
  CHECK_EQ_INT(meta.tmaps[0].input, 0);
  CHECK_EQ_INT(meta.tmaps[0].rows, -1);
  CHECK_EQ_INT(meta.tmaps[0].box[1], 128);
  CHECK_EQ_INT(meta.tmaps[1].input, 1);
  CHECK_EQ_INT(meta.tmaps[1].rows, 1024);
  CHECK_EQ_INT(meta.tmaps[1].cols, 256);
  CHECK_EQ_INT(meta.tmaps[1].box[1], 64);
  CHECK_EQ_INT(meta.tmaps[2].input, 3);
  CHECK_EQ_INT(meta.tmaps[2].rows, 256);
  CHECK_EQ_INT(meta.tmaps[2].ld, 1024);
  CHECK_EQ_INT(meta.tmaps[2].box[1], 256);
  /* the cluster form: pairs of blocks, each loading half of every weight chunk into both */
  int clusters = 0;
  for (size_t i = 0; i < n; i++) {
    if (c[i].p[1] != FM_B2B_TMA_PAIR) continue;
    clusters++;
    CHECK_EQ_INT(fm_codegen_generate(&canon, &c[i], 132, &src, &meta, &d), FM_OK);
    if (src) {
      CHECK_STR_CONTAINS(src, "__cluster_dims__(2, 1, 1)");
      CHECK_STR_CONTAINS(src, "fm_tma_load_both(");
      CHECK_STR_CONTAINS(src, "fm_arrive_peer(bar);");
    }
    free(src);
    CHECK_EQ_INT(meta.max_blocks, 2); /* grid (2, row-tile pairs) */
    CHECK_EQ_INT(meta.items_per_block, 2 * c[i].p[0]);
    CHECK_EQ_INT(meta.tmaps[1].box[1], 32);  /* half of B's 64-row chunk */
    CHECK_EQ_INT(meta.tmaps[2].box[1], 128); /* half of B2's 256 rows */
  }
  CHECK(clusters >= 1);
  /* the cp.async form: every thread loads, no tensor maps */
  for (size_t i = 0; i < n; i++) {
    if (c[i].p[1] != FM_B2B_CPASYNC) continue;
    CHECK_EQ_INT(fm_codegen_generate(&canon, &c[i], 132, &src, &meta, &d), FM_OK);
    if (src) CHECK_STR_CONTAINS(src, "fm_load_a(xs, in0, M, m0, tid);");
    free(src);
    CHECK_EQ_INT(meta.n_tmaps, 0);
    CHECK_EQ_INT(meta.block[0], c[i].p[0] / 64 * 128);
  }
  /* the residual r is laid out like x (N2 = K1): where the launch passes one memory for both
     (the client does), the last stage reads it from x's rows in shared memory, so its staging
     goes after them: in one pass where BM x (N2 + 8) floats fit in the chunk buffers (the TMA
     forms and BM 64), in two where they do not (the cp.async form at BM 128: 128 KiB of
     buffers for 132 KiB of rows); tests/gpu/test_b2b_gpu runs both, and both memories */
  int two_passes = 0;
  for (size_t i = 0; i < n; i++) {
    CHECK_EQ_INT(fm_codegen_generate(&canon, &c[i], 132, &src, &meta, &d), FM_OK);
    if (src && c[i].p[1] == FM_B2B_CPASYNC && c[i].p[0] == 128) {
      CHECK_STR_CONTAINS(src, "#define FM_PASSES 2\n#define FM_PCOLS 128\n");
      two_passes++;
    } else if (src) {
      CHECK_STR_CONTAINS(src, "#define FM_PASSES 1\n#define FM_PCOLS 256\n");
    }
    if (src) {
      CHECK_STR_CONTAINS(src, "(const void *)in5 == (const void *)in0 ? xs : 0u");
      CHECK_STR_CONTAINS(src, "if (fm_xa) *(uint4 *)r5 = fm_lds16(");
      CHECK_STR_CONTAINS(src, "fm_stage_base() + FM_X_BYTES - fm_saddr(fm_smem)");
    }
    free(src);
  }
  CHECK_EQ_INT(two_passes, 1);
  /* N2 != K1: no input is laid out like x, the staging starts at x's rows; the cp.async form
     at K1 = 64, N2 = 256 stages in two passes (96 KiB of buffers for 132 KiB of rows) */
  CHECK_EQ_INT(build_mlp(64, 128, 256), FM_OK);
  n = fm_codegen_candidates(&canon, c, 16);
  two_passes = 0;
  for (size_t i = 0; i < n; i++) {
    CHECK_EQ_INT(fm_codegen_generate(&canon, &c[i], 132, &src, &meta, &d), FM_OK);
    if (src && c[i].p[1] == FM_B2B_CPASYNC && c[i].p[0] == 128) {
      CHECK_STR_CONTAINS(src, "#define FM_PASSES 2\n#define FM_PCOLS 128\n");
      two_passes++;
    }
    if (src) {
      CHECK(!strstr(src, "fm_lds16("));
      CHECK_STR_CONTAINS(src, "(fm_stage_base() - fm_saddr(fm_smem))");
    }
    CHECK(meta.smem <= 227 * 1024);
    free(src);
  }
  CHECK_EQ_INT(two_passes, 1);
  /* every shape the limits allow: the passes (two at most) cover N2 in whole 8-column groups,
     and BM padded rows of one pass fit in the kernel's shared memory (at K1 = 64, N2 = 144: two
     passes of 72) */
  for (int64_t k1 = 64; k1 <= 256; k1 += 64)
    for (int64_t n2 = 16; n2 <= 256; n2 += 16) {
      CHECK_EQ_INT(build_mlp(k1, 128, n2), FM_OK);
      n = fm_codegen_candidates(&canon, c, 16);
      CHECK(n >= 4);
      for (size_t i = 0; i < n; i++) {
        CHECK_EQ_INT(fm_codegen_generate(&canon, &c[i], 132, &src, &meta, &d), FM_OK);
        const char *at = src ? strstr(src, "#define FM_PASSES ") : NULL;
        unsigned passes = 0, pcols = 0;
        CHECK(at && sscanf(at, "#define FM_PASSES %u\n#define FM_PCOLS %u", &passes, &pcols) == 2);
        CHECK_EQ_INT((int64_t)passes * pcols, n2);
        CHECK_EQ_INT(pcols % 8, 0);
        /* with N2 = K1 the residual is x's twin: the staging goes after x's rows */
        const uint64_t x_rows = k1 == n2 ? (uint64_t)c[i].p[0] * (uint64_t)k1 * 2u : 0u;
        CHECK((uint64_t)c[i].p[0] * (pcols + 8) * 4 + 1024 + x_rows <= meta.smem);
        CHECK(passes <= 2);
        free(src);
      }
    }
  /* the limits, as the reasons a client sees with "bypass" */
  struct {
    int64_t k1, n1, n2;
    const char *why;
  } refuse[] = {
      {1024, 4096, 1024, "K1 = 1024"},
      {256, 1000, 256, "N1 = 1000"},
      {256, 1024, 512, "N2 = 512"},
      {96, 1024, 256, "K1 = 96"},
  };
  /* too few rows: the two GEMM kernels win (the bucket of a symbolic M, or a static M) */
  CHECK_EQ_INT(build_mlp(256, 1024, 256), FM_OK);
  canon.m_hint = 128;
  fm_candidate def;
  fm_diag why = {{0}};
  CHECK_EQ_INT(fm_codegen_default(&canon, &def, &why), FM_EUNSUPPORTED);
  CHECK_STR_CONTAINS(why.text, "M = 128 (its bucket");
  CHECK_EQ_INT(fm_codegen_candidates(&canon, c, 16), 0);
  for (size_t i = 0; i < sizeof refuse / sizeof refuse[0]; i++) {
    CHECK_EQ_INT(build_mlp(refuse[i].k1, refuse[i].n1, refuse[i].n2), FM_OK);
    memset(&why, 0, sizeof why);
    CHECK_EQ_INT(fm_codegen_default(&canon, &def, &why), FM_EUNSUPPORTED);
    CHECK_STR_CONTAINS(why.text, refuse[i].why);
    CHECK_EQ_INT(fm_codegen_candidates(&canon, c, 16), 0);
  }
}

static void test_nvrtc_every_candidate(void) {
  static const int64_t shapes[][3] = {{256, 1024, 256}, {128, 512, 64}, {64, 192, 16}};
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
    int compiled = 0;
    CHECK_EQ_INT(build_mlp(shapes[i][0], shapes[i][1], shapes[i][2]), FM_OK);
    CHECK_EQ_INT(tf_compile_candidates(&canon, "b2b", &compiled), 0);
    CHECK(compiled > 0);
  }
}

int main(void) {
  RUN(test_validate);
  RUN(test_reference);
  RUN(test_candidates_and_source);
  RUN(test_nvrtc_every_candidate);
  return FM_TEST_DONE();
}
