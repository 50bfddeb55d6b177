/* test_codegen_gemm.c: GEMM fragments without a GPU: validation (what is accepted, what is
 * refused and why), the fp64 reference on a hand-checked product, golden source for two
 * representative fragments, launch metadata, the candidate list through the generic API,
 * NVRTC compiles of every candidate for sm_80 and sm_90a, and ptxas's verbose log of the
 * short-K ping-pong kernel (no wgmma wait injected or serialised). Regenerate the goldens
 * with FM_UPDATE_GOLDEN=1. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <nvrtc.h>

#include "fm_codegen.h"
#include "fm_codegen_gemm.h"
#include "fm_nvrtc.h"
#include "fm_reference.h"
#include "fm_test.h"
#include "test_codegen_frag.h"

static fm_fragment raw, canon;

#define N_FRAGS 3
static const char *const names[N_FRAGS] = {"gemm_linear_gelu_bf16", "gemm_mm_residual_f16", "gemm_small_rowscale"};

/* 0: nn.Linear + gelu: x [-1, 256] bf16 @ W.t() (B [256, 512], strides [1, 256]) + bias [512];
 *    outputs gelu (bf16) and the pre-activation (bf16).
 * 1: column-major f16 A [300, 128] (lda 304) @ row-major B [128, 200] + residual [300, 200],
 *    silu, f16.
 * 2: A [7, 64] bf16 @ B [64, 24] (column-major) * per-row scale [7, 1] f32 -> f32, relu. */
static int build(int which, fm_fragment *f) {
  tf_init(f);
  if (which == 0) {
    int64_t xs[2] = {-1, 256}, ws[2] = {256, 512}, wst[2] = {1, 256}, bs[1] = {512}, os[2] = {-1, 512};
    tf_input(f, 1, FM_DT_BF16, 2, xs, NULL, 16);
    tf_input(f, 2, FM_DT_BF16, 2, ws, wst, 16);
    tf_input(f, 3, FM_DT_BF16, 1, bs, NULL, 16);
    tf_op(f, FM_OP_ADDMM, 4, 3, 3, 1, 2);
    tf_op(f, FM_OP_GELU, 5, 1, 4, 0, 0);
    tf_output(f, 5, FM_DT_BF16, 2, os, NULL, 16);
    tf_output(f, 4, FM_DT_BF16, 2, os, NULL, 16);
  } else if (which == 1) {
    int64_t as[2] = {300, 128}, ast[2] = {1, 304}, bs[2] = {128, 200}, rs[2] = {300, 200};
    tf_input(f, 1, FM_DT_F16, 2, as, ast, 16);
    tf_input(f, 2, FM_DT_F16, 2, bs, NULL, 16);
    tf_input(f, 3, FM_DT_F16, 2, rs, NULL, 16);
    tf_op(f, FM_OP_MM, 4, 2, 1, 2, 0);
    tf_op(f, FM_OP_ADD, 5, 2, 4, 3, 0);
    tf_op(f, FM_OP_SILU, 6, 1, 5, 0, 0);
    tf_output(f, 6, FM_DT_F16, 2, rs, NULL, 16);
  } else {
    int64_t as[2] = {7, 64}, bs[2] = {64, 24}, bst[2] = {1, 64}, ss[2] = {7, 1}, os[2] = {7, 24};
    tf_input(f, 1, FM_DT_BF16, 2, as, NULL, 16);
    tf_input(f, 2, FM_DT_BF16, 2, bs, bst, 16);
    tf_input(f, 3, FM_DT_F32, 2, ss, NULL, 4);
    tf_op(f, FM_OP_MM, 4, 2, 1, 2, 0);
    tf_op(f, FM_OP_MUL, 5, 2, 4, 3, 0);
    tf_op(f, FM_OP_RELU, 6, 1, 5, 0, 0);
    tf_output(f, 6, FM_DT_F32, 2, os, NULL, 16);
  }
  return tf_finish(f, &canon);
}

static void check_golden(int which) {
  char *src = NULL;
  fm_kernel_meta meta;
  fm_diag d = {{0}};
  fm_candidate c;
  CHECK_EQ_INT(build(which, &raw), FM_OK);
  CHECK_EQ_INT(fm_codegen_default(&canon, &c, &d), FM_OK);
  CHECK_EQ_INT(c.tmpl, FM_TMPL_GEMM);
  CHECK_EQ_INT(fm_codegen_generate(&canon, &c, 132, &src, &meta, &d), FM_OK);
  if (!src) return;
  CHECK(tf_golden(names[which], src));
  CHECK(strstr(src, "#include") == NULL);
  CHECK_STR_CONTAINS(src, "mma.sync.aligned.m16n8k16.row.col.f32.");
  CHECK_STR_CONTAINS(src, "fm_epilogue(");
  free(src);
}

static void test_golden_linear(void) { check_golden(0); }
static void test_golden_residual(void) { check_golden(1); }

/* Accepted shapes become canonical: the rank-1 bias is [1, N] with stride 0. */
static void test_validate(void) {
  CHECK_EQ_INT(build(0, &raw), FM_OK);
  CHECK_EQ_INT(canon.vocab, 3);
  CHECK(fm_fragment_is_gemm(&canon));
  CHECK(!fm_fragment_is_rows(&canon));
  CHECK_EQ_INT(fm_fragment_gemm_op(&canon), 0);
  CHECK_EQ_INT(canon.inputs[2].rank, 2);
  CHECK_EQ_INT(canon.inputs[2].shape[0], 1);
  CHECK_EQ_INT(canon.inputs[2].shape[1], 512);
  CHECK_EQ_INT(canon.inputs[2].strides[0], 0);
  CHECK_EQ_INT(canon.ops[0].dtype, FM_DT_BF16);
}

static void expect_reject(int rc_want, const char *why) { CHECK(tf_rejects(&raw, rc_want, why)); }

static void test_rejections(void) {
  int64_t a[2] = {32, 64}, b[2] = {64, 16}, o[2] = {32, 16}, b2[2] = {48, 16}, ast[2] = {128, 2};
  /* the operand of mm computed by an op: nothing runs before the GEMM */
  tf_init(&raw);
  tf_input(&raw, 1, FM_DT_BF16, 2, a, NULL, 16);
  tf_input(&raw, 2, FM_DT_BF16, 2, b, NULL, 16);
  tf_op(&raw, FM_OP_RELU, 3, 1, 1, 0, 0);
  tf_op(&raw, FM_OP_MM, 4, 2, 3, 2, 0);
  tf_output(&raw, 4, FM_DT_BF16, 2, o, NULL, 16);
  expect_reject(FM_EUNSUPPORTED, "must be fragment inputs");
  /* two products */
  tf_init(&raw);
  tf_input(&raw, 1, FM_DT_BF16, 2, a, NULL, 16);
  tf_input(&raw, 2, FM_DT_BF16, 2, b, NULL, 16);
  tf_input(&raw, 5, FM_DT_BF16, 2, a, NULL, 16);
  tf_input(&raw, 6, FM_DT_BF16, 2, b, NULL, 16);
  tf_op(&raw, FM_OP_MM, 3, 2, 1, 2, 0);
  tf_op(&raw, FM_OP_MM, 4, 2, 5, 6, 0);
  tf_op(&raw, FM_OP_ADD, 7, 2, 3, 4, 0);
  tf_output(&raw, 7, FM_DT_BF16, 2, o, NULL, 16);
  expect_reject(FM_EUNSUPPORTED, "a second matrix product must share A");
  /* inner dims differ */
  tf_init(&raw);
  tf_input(&raw, 1, FM_DT_BF16, 2, a, NULL, 16);
  tf_input(&raw, 2, FM_DT_BF16, 2, b2, NULL, 16);
  tf_op(&raw, FM_OP_MM, 3, 2, 1, 2, 0);
  tf_output(&raw, 3, FM_DT_BF16, 2, o, NULL, 16);
  expect_reject(FM_ESCHEMA, "the inner dims differ");
  /* mixed dtypes; f32 operands */
  tf_init(&raw);
  tf_input(&raw, 1, FM_DT_BF16, 2, a, NULL, 16);
  tf_input(&raw, 2, FM_DT_F16, 2, b, NULL, 16);
  tf_op(&raw, FM_OP_MM, 3, 2, 1, 2, 0);
  tf_output(&raw, 3, FM_DT_BF16, 2, o, NULL, 16);
  expect_reject(FM_ESCHEMA, "operands differ in dtype");
  tf_init(&raw);
  tf_input(&raw, 1, FM_DT_F32, 2, a, NULL, 16);
  tf_input(&raw, 2, FM_DT_F32, 2, b, NULL, 16);
  tf_op(&raw, FM_OP_MM, 3, 2, 1, 2, 0);
  tf_output(&raw, 3, FM_DT_F32, 2, o, NULL, 16);
  expect_reject(FM_EUNSUPPORTED, "multiplies bf16 or f16");
  /* no unit stride */
  tf_init(&raw);
  tf_input(&raw, 1, FM_DT_BF16, 2, a, ast, 16);
  tf_input(&raw, 2, FM_DT_BF16, 2, b, NULL, 16);
  tf_op(&raw, FM_OP_MM, 3, 2, 1, 2, 0);
  tf_output(&raw, 3, FM_DT_BF16, 2, o, NULL, 16);
  expect_reject(FM_EUNSUPPORTED, "A is neither row- nor column-major");
  /* the epilogue reads an operand */
  tf_init(&raw);
  tf_input(&raw, 1, FM_DT_BF16, 2, a, NULL, 16);
  tf_input(&raw, 2, FM_DT_BF16, 2, b, NULL, 16);
  tf_op(&raw, FM_OP_MM, 3, 2, 1, 2, 0);
  tf_op(&raw, FM_OP_ADD, 4, 2, 3, 1, 0);
  tf_output(&raw, 4, FM_DT_BF16, 2, o, NULL, 16);
  expect_reject(FM_EUNSUPPORTED, "the epilogue cannot read it");
}

/* Valid fragments the generated templates cannot run: the template says why, and the default
 * (the only candidate) is the cuBLASLt plan, which takes any K and leading dim. */
static void test_codegen_refusals(void) {
  int64_t a[2] = {32, 100}, b[2] = {100, 16}, o[2] = {32, 16};
  int64_t a2[2] = {32, 64}, b2[2] = {64, 16}, a2s[2] = {1, 36};
  fm_candidate c;
  fm_diag d = {{0}};
  tf_init(&raw);
  tf_input(&raw, 1, FM_DT_BF16, 2, a, NULL, 16);
  tf_input(&raw, 2, FM_DT_BF16, 2, b, NULL, 16);
  tf_op(&raw, FM_OP_MM, 3, 2, 1, 2, 0);
  tf_output(&raw, 3, FM_DT_BF16, 2, o, NULL, 16);
  CHECK_EQ_INT(tf_finish(&raw, &canon), FM_OK);
  fm_gemm_config gc = fm_codegen_gemm_default(&canon);
  char *src = NULL;
  fm_kernel_meta meta;
  CHECK_EQ_INT(fm_codegen_gemm(&canon, &gc, 132, &src, &meta, &d), FM_EUNSUPPORTED);
  CHECK_STR_CONTAINS(d.text, "K not a multiple of 8");
  CHECK(src == NULL);
  CHECK_EQ_INT(fm_codegen_default(&canon, &c, &d), FM_OK);
  CHECK_EQ_INT(c.tmpl, FM_TMPL_CUBLASLT);
  fm_candidate all[8];
  CHECK_EQ_INT((int)fm_codegen_candidates(&canon, all, 8), 1);
  CHECK_EQ_INT(all[0].tmpl, FM_TMPL_CUBLASLT);
  tf_init(&raw);
  tf_input(&raw, 1, FM_DT_BF16, 2, a2, a2s, 16); /* column-major, lda 36 */
  tf_input(&raw, 2, FM_DT_BF16, 2, b2, NULL, 16);
  tf_op(&raw, FM_OP_MM, 3, 2, 1, 2, 0);
  tf_output(&raw, 3, FM_DT_BF16, 2, o, NULL, 16);
  CHECK_EQ_INT(tf_finish(&raw, &canon), FM_OK);
  gc = fm_codegen_gemm_default(&canon);
  CHECK_EQ_INT(fm_codegen_gemm(&canon, &gc, 132, &src, &meta, &d), FM_EUNSUPPORTED);
  CHECK_STR_CONTAINS(d.text, "leading dimension 36 is not a multiple of 8");
  CHECK_EQ_INT(fm_codegen_default(&canon, &c, &d), FM_OK);
  CHECK_EQ_INT(c.tmpl, FM_TMPL_CUBLASLT);
  CHECK_EQ_INT(fm_codegen_generate(&canon, &c, 132, &src, &meta, &d), FM_OK);
  CHECK(src == NULL); /* mm alone: the direct form */
  CHECK_EQ_INT((int)meta.blas.lda, 36);
  CHECK_EQ_INT((int)meta.blas.a_kmajor, 0);
}

/* A 3x8 @ 8x2 product checked by hand, through addmm with a rank-1 bias and relu. */
static void test_reference(void) {
  int64_t a[2] = {3, 8}, b[2] = {8, 2}, bst[2] = {1, 8}, bias[1] = {2}, o[2] = {3, 2};
  uint16_t A[24], B[16], Bias[2];
  float out[6], pre[6];
  for (int i = 0; i < 24; i++) A[i] = fm_reference_f32_to_bf16((float)(i % 5) - 2.0f);
  for (int i = 0; i < 16; i++) B[i] = fm_reference_f32_to_bf16((float)(i % 3) * 0.5f);
  Bias[0] = fm_reference_f32_to_bf16(1.0f);
  Bias[1] = fm_reference_f32_to_bf16(-100.0f);
  tf_init(&raw);
  tf_input(&raw, 1, FM_DT_BF16, 2, a, NULL, 16);
  tf_input(&raw, 2, FM_DT_BF16, 2, b, bst, 16);
  tf_input(&raw, 3, FM_DT_BF16, 1, bias, NULL, 16);
  tf_op(&raw, FM_OP_ADDMM, 4, 3, 3, 1, 2);
  tf_cast(&raw, 5, 4, FM_DT_F32);
  tf_op(&raw, FM_OP_RELU, 6, 1, 5, 0, 0);
  tf_output(&raw, 6, FM_DT_F32, 2, o, NULL, 16);
  tf_output(&raw, 5, FM_DT_F32, 2, o, NULL, 16);
  CHECK_EQ_INT(tf_finish(&raw, &canon), FM_OK);
  const void *ins[3] = {A, B, Bias};
  void *outs[2] = {out, pre};
  fm_diag d = {{0}};
  CHECK_EQ_INT(fm_reference_eval(&canon, 0, ins, outs, &d), FM_OK);
  for (int m = 0; m < 3; m++) {
    for (int n = 0; n < 2; n++) {
      double want = n == 0 ? 1.0 : -100.0;
      for (int k = 0; k < 8; k++) /* B column-major: B[k, n] at k + 8 n */
        want += (double)((m * 8 + k) % 5 - 2) * (double)((k + 8 * n) % 3) * 0.5;
      /* the cast rounds the bf16-typed product to bf16: all values here are exact */
      CHECK(pre[m * 2 + n] == (float)want);
      CHECK(out[m * 2 + n] == (want > 0 ? (float)want : 0.0f));
    }
  }
}

static void test_meta_and_candidates(void) {
  fm_candidate c[16];
  fm_kernel_meta meta;
  char *src = NULL;
  fm_diag d = {{0}};
  CHECK_EQ_INT(build(1, &raw), FM_OK);
  size_t n = fm_codegen_candidates(&canon, c, 16);
  CHECK(n >= 4);
  for (size_t i = 0; i < n; i++) {
    /* the cuBLASLt plan right after the default, so no cap drops it */
    CHECK_EQ_INT(c[i].tmpl, i == 1 ? FM_TMPL_CUBLASLT : FM_TMPL_GEMM);
    for (size_t j = 0; j < i; j++) CHECK(memcmp(&c[i], &c[j], sizeof c[i]) != 0);
  }
  char desc[96];
  fm_candidate_describe(&c[0], desc, sizeof desc);
  CHECK_STR_CONTAINS(desc, "gemm ");
  /* 300 x 200 is few 128x128 tiles: the default takes 64x64 */
  CHECK_EQ_INT(c[0].p[0], 64);
  CHECK_EQ_INT(c[0].p[1], 64);
  CHECK_EQ_INT(fm_codegen_generate(&canon, &c[0], 132, &src, &meta, &d), FM_OK);
  free(src);
  CHECK_STR_CONTAINS(meta.kind, "gemm");
  CHECK_STR_CONTAINS(meta.grid_rule, "tiles");
  CHECK_EQ_INT(meta.block[0], 128);
  CHECK_EQ_INT(meta.outer, 300);
  CHECK_EQ_INT(meta.max_blocks, 4); /* ceil(200 / 64) */
  CHECK_EQ_INT((int)fm_meta_grid_x(&meta, 0), 4);
  CHECK_EQ_INT((int)fm_meta_grid_y(&meta, 0), 5); /* ceil(300 / 64) */
  /* A column-major (stage [64][72]) + B row-major (stage [64][72]), 4 stages, 2 bytes */
  CHECK_EQ_INT(meta.smem, 4 * (64 * 72 + 64 * 72) * 2);
  /* symbolic M: grid.y from the launch's outer */
  CHECK_EQ_INT(build(0, &raw), FM_OK);
  CHECK_EQ_INT(fm_codegen_default(&canon, &c[0], &d), FM_OK);
  CHECK_EQ_INT(c[0].p[0], 128);
  CHECK_EQ_INT(fm_codegen_generate(&canon, &c[0], 132, &src, &meta, &d), FM_OK);
  free(src);
  CHECK_EQ_INT(meta.outer, -1);
  CHECK_EQ_INT((int)fm_meta_grid_y(&meta, 4099), 33);
  CHECK_EQ_INT((int)fm_meta_grid_y(&meta, 0), 0);
  CHECK_EQ_INT((int)fm_meta_grid_x(&meta, 0), 0);
  CHECK_EQ_INT((int)fm_meta_grid_x(&meta, 1), 4);
  CHECK(meta.smem > 48 * 1024);
  /* the metadata survives its wire form, rule "tiles" included */
  msgpack_sbuffer sbuf;
  msgpack_packer pk;
  msgpack_unpacked u;
  fm_kernel_meta back;
  msgpack_sbuffer_init(&sbuf);
  msgpack_packer_init(&pk, &sbuf, msgpack_sbuffer_write);
  CHECK_EQ_INT(fm_meta_pack(&meta, &pk), FM_OK);
  msgpack_unpacked_init(&u);
  CHECK(msgpack_unpack_next(&u, sbuf.data, sbuf.size, NULL) == MSGPACK_UNPACK_SUCCESS);
  CHECK_EQ_INT(fm_meta_unpack(&u.data, &back, &d), FM_OK);
  CHECK_STR_CONTAINS(back.grid_rule, "tiles");
  CHECK_EQ_INT(back.smem, meta.smem);
  CHECK_EQ_INT((int)fm_meta_grid_y(&back, 4099), 33);
  msgpack_unpacked_destroy(&u);
  msgpack_sbuffer_destroy(&sbuf);
  /* an invalid config is refused, not generated */
  fm_candidate bad = c[0];
  bad.p[3] = 7;
  CHECK_EQ_INT(fm_codegen_generate(&canon, &bad, 132, &src, &meta, &d), FM_EINVAL);
  CHECK(src == NULL);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Every candidate of the representative fragments (the default of the third) compiles for
 * both target generations. The first fragment (symbolic M, K-major operands) keeps every
 * configuration of the template, so each one compiles; the second covers the M/N-major
 * shared-memory layouts. Prints the mean and worst time of one compile (goal: 1.5 s). */
static void test_nvrtc_every_candidate(void) {
  static const char *const archs[] = {"sm_80", "sm_90a"};
  int compiled = 0;
  double total = 0, worst = 0;
  char worst_desc[96] = "";
  for (int w = 0; w < N_FRAGS; w++) {
    fm_candidate c[40];
    CHECK_EQ_INT(build(w, &raw), FM_OK);
    size_t n = fm_codegen_candidates(&canon, c, w == 2 ? 1 : 40);
    CHECK(n >= 1);
    /* every configuration (16 + 16 wgmma, none pruned) and the cuBLASLt plan */
    if (w == 0) CHECK_EQ_INT((int)n, 33);
    for (size_t i = 0; i < n; i++) {
      char *src = NULL;
      fm_kernel_meta m;
      fm_diag d = {{0}};
      int rc = fm_codegen_generate(&canon, &c[i], 132, &src, &m, &d);
      CHECK_EQ_INT(rc, FM_OK);
      if (rc) {
        fprintf(stderr, "  %s candidate %zu: %s\n", names[w], i, d.text);
        continue;
      }
      if (!src) { /* a direct cuBLASLt plan: no kernel to compile */
        CHECK_EQ_INT(c[i].tmpl, FM_TMPL_CUBLASLT);
        continue;
      }
      for (size_t a = 0; a < 2; a++) {
        if (!fm_nvrtc_arch_supported(archs[a]) || !fm_candidate_runs_on(&c[i], archs[a])) continue;
        uint8_t *cubin = NULL;
        size_t len = 0;
        char *log = NULL;
        double t0 = now_s();
        rc = fm_nvrtc_compile(src, names[w], archs[a], &cubin, &len, &log);
        double dt = now_s() - t0;
        total += dt;
        if (dt > worst) {
          worst = dt;
          fm_candidate_describe(&c[i], worst_desc, sizeof worst_desc);
          snprintf(worst_desc + strlen(worst_desc), sizeof worst_desc - strlen(worst_desc), " %s", archs[a]);
        }
        CHECK_EQ_INT(rc, FM_OK);
        if (rc)
          fprintf(stderr, "  %s candidate %zu %s:\n%s\n", names[w], i, archs[a], log ? log : "");
        else
          compiled++;
        free(cubin);
        free(log);
      }
      free(src);
    }
  }
  printf("  %d compiles, %.2f s each on average, %.2f s at worst (%s)\n", compiled, compiled ? total / compiled : 0.0,
         worst, worst_desc);
}

/* The Hopper mainloop: offered for K-major operands only, never the default, sm_90a only
 * (the daemon drops it elsewhere, and its source refuses to compile for sm_80), a block of
 * BM / 16 warps, and shared memory for its swizzled stages plus the alignment slack. */
static void test_wgmma_candidates(void) {
  fm_candidate c[40], def;
  fm_diag d = {{0}};
  CHECK_EQ_INT(build(0, &raw), FM_OK); /* symbolic M, nn.Linear layouts */
  size_t n = fm_codegen_candidates(&canon, c, 40);
  CHECK_EQ_INT(fm_codegen_default(&canon, &def, &d), FM_OK);
  CHECK(tf_gemm_mainloop(&def) && !tf_gemm_mainloop(&def)->wgmma);
  int wg = 0;
  for (size_t i = 0; i < n; i++) {
    const fm_gemm_mainloop *ml = tf_gemm_mainloop(&c[i]);
    if (!ml || !ml->wgmma) continue;
    wg++;
    CHECK(fm_candidate_runs_on(&c[i], "sm_90a"));
    CHECK(!fm_candidate_runs_on(&c[i], "sm_80"));
    CHECK(!fm_candidate_runs_on(&c[i], "sm_100"));
    char *src = NULL;
    fm_kernel_meta m;
    CHECK_EQ_INT(fm_codegen_generate(&canon, &c[i], 132, &src, &m, &d), FM_OK);
    if (!src) continue;
    CHECK_STR_CONTAINS(src, "wgmma.mma_async.sync.aligned.m64n");
    CHECK_STR_CONTAINS(m.entry, "_wgmma");
    /* BM / 16 warps of 32 threads, and the loaders when warp-specialised (a warpgroup for
       cp.async, one warp for TMA), each stage then with two mbarriers */
    uint32_t cluster = fm_cg_gemm_config_of(&c[i]).cluster;
    /* ping-pong: two warpgroups of 4 warps whatever BM */
    uint32_t mma_warps = ml->pingpong ? 8 : c[i].p[0] / 16;
    CHECK_EQ_INT(m.block[0], mma_warps * 32 + (ml->specialized ? (ml->tma ? 32 : 128) : 0));
    uint32_t stages = c[i].p[3] * (c[i].p[0] + c[i].p[1]) * 128 + 1024 + (ml->specialized ? 16 * c[i].p[3] : 0);
    uint32_t slabs = c[i].p[0] / 16 * 16 * (c[i].p[1] + 8) * 4;
    if (ml->persistent) {
      /* persistent: the slabs (16 rows a warp) sit after the stages and their mbarriers, as
         wide as fits */
      uint32_t per_col = mma_warps * 16 * 4;
      CHECK(m.smem > stages);
      CHECK_EQ_INT((m.smem - stages) % per_col, 0);
      uint32_t scols = (m.smem - stages) / per_col - 8;
      CHECK_EQ_INT(c[i].p[1] % scols, 0);
      CHECK_EQ_INT(scols % 32, 0);
      CHECK(m.smem + per_col * scols > 227 * 1024 || scols == c[i].p[1]); /* the widest */
      CHECK(strcmp(m.grid_rule, "persistent") == 0);
      CHECK_STR_CONTAINS(src, "fm_load_tiles(&fm_tma, &fm_tmb");
      CHECK_STR_CONTAINS(m.entry, ml->pingpong ? "_wgmma_pp" : "_wgmma_tmap");
      CHECK_STR_CONTAINS(src, ml->pingpong ? "#define FM_WG_PINGPONG 1" : "#define FM_WG_PINGPONG 0");
      /* inner: the column tiles; at most one block per SM of the 132 passed */
      CHECK_EQ_INT((int)m.inner, (int)((m.tmaps[1].rows + c[i].p[1] - 1) / c[i].p[1]));
      CHECK_EQ_INT((int)m.max_blocks, 132);
      CHECK_EQ_INT((int)m.items_per_block, (int)c[i].p[0]);
    } else {
      CHECK_EQ_INT(m.smem, stages > slabs ? stages : slabs);
    }
    /* the tile epilogue's loop is rolled in the ping-pong form only (its warps stalled on
       instruction fetch; the others measured faster whole), and whole rows of 8 outputs
       leave in one 16-byte store, never through a uint4 cast the compiler may split */
    if (ml->pingpong)
      CHECK_STR_CONTAINS(src, "#pragma unroll 8\n");
    else
      CHECK(!strstr(src, "#pragma unroll 8\n"));
    CHECK_STR_CONTAINS(src, "fm_st16(out0 + ");
    CHECK(!strstr(src, "*(uint4 *)(out"));
    CHECK(m.smem <= 227 * 1024);
    /* the TMA form: two tensor maps after outer, A [M (outer), K] in 64 x BM boxes and
       B [N, K] in 64 x BN boxes, K-major with their leading dims */
    if (ml->tma) {
      CHECK_STR_CONTAINS(m.entry, "_wgmma_");
      CHECK_STR_CONTAINS(src, "cp.async.bulk.tensor.2d");
      CHECK_STR_CONTAINS(src, "const __grid_constant__ fm_tmap fm_tmb");
      CHECK_EQ_INT((int)m.n_tmaps, 2);
      CHECK_EQ_INT((int)m.tmaps[0].input, 0);
      CHECK_EQ_INT((int)m.tmaps[0].rows, -1);
      CHECK_EQ_INT((int)m.tmaps[0].box[1], (int)c[i].p[0]);
      CHECK_EQ_INT((int)m.tmaps[1].input, 1);
      if (!ml->persistent) CHECK_EQ_INT((int)m.tmaps[1].rows, (int)m.inner);
      /* a cluster pair loads half of B each, and its grid pairs blocks along x */
      CHECK_EQ_INT((int)m.tmaps[1].box[1], (int)(cluster == 2 ? c[i].p[1] / 2 : c[i].p[1]));
      CHECK_EQ_INT((int)m.items_per_block, (int)(cluster == 2 ? 2 * c[i].p[0] : c[i].p[0]));
      if (!ml->persistent)
        CHECK_EQ_INT((int)m.max_blocks, (int)((cluster == 2 ? 2 : 1) * ((m.inner + c[i].p[1] - 1) / c[i].p[1])));
      if (cluster == 2) {
        CHECK_STR_CONTAINS(src, "__cluster_dims__(2, 1, 1)");
        CHECK_STR_CONTAINS(src, "multicast::cluster");
        CHECK_STR_CONTAINS(m.entry, "_c2");
      }
      CHECK_EQ_INT((int)m.tmaps[1].box[0], 64);
      CHECK_EQ_INT((int)m.tmaps[0].cols, (int)m.tmaps[1].cols);
      CHECK(strcmp(m.tmaps[0].dtype, "bf16") == 0);
    } else {
      CHECK_EQ_INT((int)m.n_tmaps, 0);
    }
    if (wg == 1 && fm_nvrtc_arch_supported("sm_80")) {
      uint8_t *cubin = NULL;
      size_t len = 0;
      char *log = NULL;
      CHECK_EQ_INT(fm_nvrtc_compile(src, "wgmma_on_sm80.cu", "sm_80", &cubin, &len, &log) != FM_OK, 1);
      CHECK(log && strstr(log, "needs sm_90a"));
      free(cubin);
      free(log);
    }
    free(src);
  }
  CHECK_EQ_INT(wg, 16);
  /* a bad wgmma config is refused with its reason */
  fm_candidate bad = c[1];
  for (size_t i = 0; i < n; i++)
    if (tf_gemm_mainloop(&c[i]) && tf_gemm_mainloop(&c[i])->wgmma) bad = c[i];
  bad.p[2] = 32;
  char *src = NULL;
  fm_kernel_meta m;
  CHECK_EQ_INT(fm_codegen_generate(&canon, &bad, 132, &src, &m, &d), FM_EINVAL);
  CHECK_STR_CONTAINS(d.text, "wgmma");
  /* M/N-major operands (the backward's layouts): the mma.sync mainloop only */
  CHECK_EQ_INT(build(1, &raw), FM_OK);
  n = fm_codegen_candidates(&canon, c, 32);
  for (size_t i = 0; i < n; i++) CHECK(!tf_gemm_mainloop(&c[i]) || !tf_gemm_mainloop(&c[i])->wgmma);
}

/* src compiles for sm_90a (where this NVRTC has it); the log is printed on failure. */
static void compiles_for_sm90a(const char *src, const char *name) {
  if (!fm_nvrtc_arch_supported("sm_90a")) return;
  uint8_t *cubin = NULL;
  size_t len = 0;
  char *log = NULL;
  int rc = fm_nvrtc_compile(src, name, "sm_90a", &cubin, &len, &log);
  CHECK_EQ_INT(rc, FM_OK);
  if (rc && log) fprintf(stderr, "%s\n", log);
  free(cubin);
  free(log);
}

/* Clusters of two blocks sharing B (the 128x256 TMA pair is a candidate since codegen v21): the
 * cluster shape is compiled in, the grid pairs blocks along x (twice the column tiles, one
 * grid row per pair of row tiles), B's tensor map reads half a tile per block; NVRTC accepts
 * it for sm_90a, and the forms it does not apply to are refused. */
static void test_cluster_pairs(void) {
  fm_gemm_config pair = {128, 256, 64, 4, 8, 1, 8, 4, 0, 2};
  char *src = NULL;
  fm_kernel_meta m;
  fm_diag d = {{0}};
  CHECK_EQ_INT(build(0, &raw), FM_OK); /* N 512: 2 column tiles of 256 */
  CHECK_EQ_INT(fm_codegen_gemm(&canon, &pair, 132, &src, &m, &d), FM_OK);
  if (src) {
    CHECK_STR_CONTAINS(src, "__cluster_dims__(2, 1, 1)");
    CHECK_STR_CONTAINS(src, "multicast::cluster");
    CHECK_STR_CONTAINS(src, "#define FM_CLUSTER 2");
    CHECK_STR_CONTAINS(m.entry, "_wgmma_tma_c2");
    CHECK_EQ_INT((int)m.items_per_block, 256);
    CHECK_EQ_INT((int)m.max_blocks, 4);
    CHECK_EQ_INT((int)m.n_tmaps, 2);
    CHECK_EQ_INT((int)m.tmaps[0].box[1], 128);
    CHECK_EQ_INT((int)m.tmaps[1].box[1], 128);
    CHECK_EQ_INT((int)fm_meta_grid_x(&m, 1000), 4);
    CHECK_EQ_INT((int)fm_meta_grid_y(&m, 1000), 4); /* 8 row tiles in 4 pairs */
    compiles_for_sm90a(src, "cluster.cu");
  }
  free(src);
  src = NULL;
  fm_gemm_config bad = pair;
  bad.wgmma = 2;
  CHECK_EQ_INT(fm_codegen_gemm(&canon, &bad, 132, &src, &m, &d), FM_EINVAL);
  CHECK_STR_CONTAINS(d.text, "cluster");
  bad = pair;
  bad.cluster = 4;
  CHECK_EQ_INT(fm_codegen_gemm(&canon, &bad, 132, &src, &m, &d), FM_EINVAL);
  bad = (fm_gemm_config){128, 128, 64, 3, 2, 4, 8, 0, 0, 2};
  CHECK_EQ_INT(fm_codegen_gemm(&canon, &bad, 132, &src, &m, &d), FM_EINVAL);
  CHECK_STR_CONTAINS(d.text, "TMA");
  /* the candidate form carries it too */
  fm_candidate c = fm_cg_gemm_candidate_of(pair);
  char desc[96];
  fm_candidate_describe(&c, desc, sizeof desc);
  CHECK_STR_CONTAINS(desc, "wgmma tma cluster=2");
  CHECK_EQ_INT(fm_codegen_generate(&canon, &c, 132, &src, &m, &d), FM_OK);
  if (src) CHECK_STR_CONTAINS(m.entry, "_c2");
  free(src);
  src = NULL;
  /* persistent pairs: each cluster walks pairs of row tiles (units), both blocks leave
     together; the grid rule counts two blocks per unit, capped at an even block count */
  fm_gemm_config ppair = {128, 256, 64, 3, 8, 1, 8, 5, 0, 2};
  CHECK_EQ_INT(fm_codegen_gemm(&canon, &ppair, 133, &src, &m, &d), FM_OK);
  if (src) {
    CHECK_STR_CONTAINS(src, "__cluster_dims__(2, 1, 1)");
    CHECK_STR_CONTAINS(src, "fm_pipe_done();");
    CHECK_STR_CONTAINS(m.entry, "_wgmma_tmap_c2");
    CHECK(strcmp(m.grid_rule, "persistent") == 0);
    CHECK_EQ_INT((int)m.items_per_block, 256);
    CHECK_EQ_INT((int)m.inner, 4);                   /* 2 column tiles x 2 blocks */
    CHECK_EQ_INT((int)m.max_blocks, 132);            /* 133 SMs: an even grid */
    CHECK_EQ_INT((int)fm_meta_grid_x(&m, 1000), 16); /* 4 pairs x 4 */
    CHECK_EQ_INT((int)fm_meta_grid_x(&m, 1 << 20), 132);
    compiles_for_sm90a(src, "cluster_persistent.cu");
  }
  free(src);
  src = NULL;
  bad = (fm_gemm_config){128, 128, 64, 4, 4, 1, 8, 6, 0, 2}; /* ping-pong: no clusters */
  CHECK_EQ_INT(fm_codegen_gemm(&canon, &bad, 132, &src, &m, &d), FM_EINVAL);
  CHECK_STR_CONTAINS(d.text, "ping-pong");
  bad = (fm_gemm_config){128, 128, 64, 4, 8, 1, 8, 6, 0, 0}; /* ping-pong warpgroups are 4 warps */
  CHECK_EQ_INT(fm_codegen_gemm(&canon, &bad, 132, &src, &m, &d), FM_EINVAL);
  CHECK_STR_CONTAINS(d.text, "ping-pong");
  bad = (fm_gemm_config){128, 256, 64, 4, 4, 1, 8, 6, 0, 0}; /* 256 accumulators a thread */
  CHECK_EQ_INT(fm_codegen_gemm(&canon, &bad, 132, &src, &m, &d), FM_EINVAL);
  bad = ppair;
  bad.wgmma = 7;
  CHECK_EQ_INT(fm_codegen_gemm(&canon, &bad, 132, &src, &m, &d), FM_EINVAL);
  CHECK_STR_CONTAINS(d.text, "wgmma mode 7");
  CHECK(src == NULL);
}

/* Several row tiles per block (not a candidate; the tuner's extras and the bench use it): a
 * block owns rtiles x BM rows (the client's grid.y = ceil(M / items_per_block)), its slabs
 * sit beside the stages, half-width when whole ones would not fit, and it compiles for
 * sm_90a. The mma.sync mainloop and the warp-specialised form refuse it. */
static void test_row_tiles(void) {
  fm_diag d = {{0}};
  CHECK_EQ_INT(build(0, &raw), FM_OK); /* symbolic M, nn.Linear layouts, K 256, two outputs */
  fm_gemm_config whole = {128, 128, 64, 4, 8, 1, 8, 2, 2, 0}, half = {128, 256, 64, 3, 8, 1, 8, 1, 4, 0};
  char *src = NULL;
  fm_kernel_meta m;
  CHECK_EQ_INT(fm_codegen_gemm(&canon, &whole, 132, &src, &m, &d), FM_OK);
  CHECK_EQ_INT((int)m.items_per_block, 256);
  CHECK_STR_CONTAINS(m.entry, "_wgmma_i1_t2");
  CHECK_EQ_INT(m.smem, 4 * 256 * 128 + 1024 + 8 * 16 * (128 + 8) * 4);
  if (src) {
    CHECK_STR_CONTAINS(src, "#define FM_SCOLS 128");
    CHECK_STR_CONTAINS(src, "fm_prologue(in");
    compiles_for_sm90a(src, "row_tiles.cu");
  }
  free(src);
  src = NULL;
  CHECK_EQ_INT(fm_codegen_gemm(&canon, &half, 132, &src, &m, &d), FM_OK);
  CHECK_EQ_INT((int)m.items_per_block, 512);
  CHECK_EQ_INT(m.smem, 3 * 384 * 128 + 1024 + 8 * 16 * (128 + 8) * 4);
  if (src) CHECK_STR_CONTAINS(src, "#define FM_SCOLS 128");
  free(src);
  src = NULL;
  fm_gemm_config bad = whole;
  bad.wgmma = 3;
  CHECK_EQ_INT(fm_codegen_gemm(&canon, &bad, 132, &src, &m, &d), FM_EINVAL);
  bad = (fm_gemm_config){128, 128, 64, 3, 2, 4, 8, 0, 2, 0};
  CHECK_EQ_INT(fm_codegen_gemm(&canon, &bad, 132, &src, &m, &d), FM_EINVAL);
  CHECK_STR_CONTAINS(d.text, "row tiles");
  fm_candidate c = fm_cg_gemm_candidate_of(whole);
  char desc[96];
  fm_candidate_describe(&c, desc, sizeof desc);
  CHECK_STR_CONTAINS(desc, "wgmma inflight=1 tiles=2");
  CHECK(fm_candidate_runs_on(&c, "sm_90a") && !fm_candidate_runs_on(&c, "sm_80"));
}

/* ptxas's verbose log for src on sm_90a: NVRTC with the options fusemld compiles with, plus
 * -v (malloc'd; NULL if the compile failed). */
static char *ptxas_verbose_log(const char *src) {
  char buf[256], *save = NULL;
  const char *opts[8];
  int n = 0;
  if (!fm_nvrtc_options("sm_90a", buf, sizeof buf)) return NULL;
  for (char *t = strtok_r(buf, " ", &save); t && n < 7; t = strtok_r(NULL, " ", &save)) opts[n++] = t;
  opts[n++] = "--ptxas-options=-v";
  nvrtcProgram prog;
  if (nvrtcCreateProgram(&prog, src, "pingpong.cu", 0, NULL, NULL) != NVRTC_SUCCESS) return NULL;
  char *log = NULL;
  size_t len = 0;
  if (nvrtcCompileProgram(prog, n, opts) == NVRTC_SUCCESS && nvrtcGetProgramLogSize(prog, &len) == NVRTC_SUCCESS &&
      (log = calloc(len + 1, 1)) && nvrtcGetProgramLog(prog, log) != NVRTC_SUCCESS) {
    free(log);
    log = NULL;
  }
  nvrtcDestroyProgram(&prog);
  return log;
}

/* At K = 256 (the K loop unrolled whole) the ping-pong kernel's wgmmas run back to back:
 * before codegen v28 ptxas placed the accumulators' zeroing after a tile's first wgmma and
 * injected a wait for it (C7517) on every tile, 7% of the kernel's time at 16384 x 1024 x
 * 256. ptxas reports such waits, and wgmmas it serialises, in its verbose log. */
static void test_pingpong_wgmma_not_serialised(void) {
  fm_candidate c[40];
  fm_diag d = {{0}};
  CHECK_EQ_INT(build(0, &raw), FM_OK); /* K = 256, bias + GELU, two bf16 outputs */
  if (!fm_nvrtc_arch_supported("sm_90a")) return;
  size_t n = fm_codegen_candidates(&canon, c, 40);
  int checked = 0;
  for (size_t i = 0; i < n; i++) {
    if (!tf_gemm_mainloop(&c[i]) || !tf_gemm_mainloop(&c[i])->pingpong) continue;
    char *src = NULL;
    fm_kernel_meta m;
    CHECK_EQ_INT(fm_codegen_generate(&canon, &c[i], 132, &src, &m, &d), FM_OK);
    char *log = src ? ptxas_verbose_log(src) : NULL;
    CHECK(log != NULL);
    if (log) {
      CHECK_STR_CONTAINS(log, "registers"); /* the verbose log it is meant to be */
      CHECK(strstr(log, "C7517") == NULL);
      CHECK(strstr(log, "serialized") == NULL);
      if (strstr(log, "C7517") || strstr(log, "serialized")) fprintf(stderr, "  %s\n", log);
      checked++;
    }
    free(log);
    free(src);
  }
  CHECK(checked >= 2); /* the 4- and 5-stage 128x128 ping-pong candidates at least */
}

int main(void) {
  RUN(test_validate);
  RUN(test_rejections);
  RUN(test_codegen_refusals);
  RUN(test_reference);
  RUN(test_meta_and_candidates);
  RUN(test_wgmma_candidates);
  RUN(test_row_tiles);
  RUN(test_cluster_pairs);
  RUN(test_golden_linear);
  RUN(test_golden_residual);
  RUN(test_nvrtc_every_candidate);
  RUN(test_pingpong_wgmma_not_serialised);
  return FM_TEST_DONE();
}
