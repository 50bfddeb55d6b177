/* test_codegen_siblings.c: sibling GEMM fragments (two products sharing A: SwiGLU's gate and
 * up) without a GPU: what validation accepts and refuses, the fp64 reference on a
 * hand-checked pair, the candidate list (the sm_80 and TMA mainloops; no cuBLASLt plan, no
 * skinny kernel), the generated source and metadata (half of a tile's columns from each B,
 * a third tensor map), and NVRTC compiles of every candidate for sm_90a (the default for
 * sm_80 too). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fm_codegen.h"
#include "fm_codegen_gemm.h"
#include "fm_meta.h"
#include "fm_nvrtc.h"
#include "fm_reference.h"
#include "fm_test.h"
#include "test_codegen_frag.h"

static fm_fragment raw, canon;

/* Llama's MLP up half: x [-1, 256] bf16, gate = x @ Wg.t(), up = x @ Wu.t() (B [256, 512]
 * column-major, nn.Linear's weights), y = silu(gate) * up; gate a second output when
 * with_gate. */
static int build_swiglu(int with_gate, const int64_t *wu_strides) {
  int64_t x[2] = {-1, 256}, w[2] = {256, 512}, wst[2] = {1, 256}, o[2] = {-1, 512};
  tf_init(&raw);
  tf_input(&raw, 1, FM_DT_BF16, 2, x, NULL, 16);
  tf_input(&raw, 2, FM_DT_BF16, 2, w, wst, 16);
  tf_input(&raw, 3, FM_DT_BF16, 2, w, wu_strides ? wu_strides : wst, 16);
  tf_op(&raw, FM_OP_MM, 4, 2, 1, 2, 0);
  tf_op(&raw, FM_OP_MM, 5, 2, 1, 3, 0);
  tf_op(&raw, FM_OP_SILU, 6, 1, 4, 0, 0);
  tf_op(&raw, FM_OP_MUL, 7, 2, 6, 5, 0);
  tf_output(&raw, 7, FM_DT_BF16, 2, o, NULL, 16);
  if (with_gate) tf_output(&raw, 4, FM_DT_BF16, 2, o, NULL, 16);
  raw.m_hint = 2048;
  return tf_finish(&raw, &canon);
}

static void expect_reject(int rc_want, const char *why) { CHECK(tf_rejects(&raw, rc_want, why)); }

static void test_validate(void) {
  CHECK_EQ_INT(build_swiglu(1, NULL), FM_OK);
  CHECK_EQ_INT(canon.vocab, 3); /* no new op: vocabulary 3 */
  CHECK(fm_fragment_is_gemm(&canon));
  CHECK_EQ_INT(fm_fragment_gemm_op(&canon), 0);
  CHECK_EQ_INT(fm_fragment_gemm_op2(&canon), 2); /* canonical order: mm, silu, mm, mul */
  CHECK_EQ_INT(canon.ops[2].op, FM_OP_MM);
  int64_t a[2] = {32, 64}, b[2] = {64, 16}, b3[2] = {64, 24}, o[2] = {32, 16};
  /* a single-product fragment has no second */
  tf_init(&raw);
  tf_input(&raw, 1, FM_DT_BF16, 2, a, NULL, 16);
  tf_input(&raw, 2, FM_DT_BF16, 2, b, NULL, 16);
  tf_op(&raw, FM_OP_MM, 3, 2, 1, 2, 0);
  tf_output(&raw, 3, FM_DT_BF16, 2, o, NULL, 16);
  CHECK_EQ_INT(tf_finish(&raw, &canon), FM_OK);
  CHECK_EQ_INT(fm_fragment_gemm_op2(&canon), -1);
  /* B2 of another shape */
  tf_init(&raw);
  tf_input(&raw, 1, FM_DT_BF16, 2, a, NULL, 16);
  tf_input(&raw, 2, FM_DT_BF16, 2, b, NULL, 16);
  tf_input(&raw, 3, FM_DT_BF16, 2, b3, NULL, 16);
  tf_op(&raw, FM_OP_MM, 4, 2, 1, 2, 0);
  tf_op(&raw, FM_OP_MM, 5, 2, 1, 3, 0);
  tf_output(&raw, 4, FM_DT_BF16, 2, o, NULL, 16);
  tf_output(&raw, 5, FM_DT_BF16, 2, o, NULL, 16);
  expect_reject(FM_ESCHEMA, "the two products' B's differ in shape");
  /* the same B twice */
  tf_init(&raw);
  tf_input(&raw, 1, FM_DT_BF16, 2, a, NULL, 16);
  tf_input(&raw, 2, FM_DT_BF16, 2, b, NULL, 16);
  tf_op(&raw, FM_OP_MM, 4, 2, 1, 2, 0);
  tf_op(&raw, FM_OP_MM, 5, 2, 1, 2, 0);
  tf_op(&raw, FM_OP_ADD, 6, 2, 4, 5, 0);
  tf_output(&raw, 6, FM_DT_BF16, 2, o, NULL, 16);
  expect_reject(FM_EUNSUPPORTED, "the two products have the same B");
  /* three products */
  tf_init(&raw);
  tf_input(&raw, 1, FM_DT_BF16, 2, a, NULL, 16);
  tf_input(&raw, 2, FM_DT_BF16, 2, b, NULL, 16);
  tf_input(&raw, 3, FM_DT_BF16, 2, b, NULL, 16);
  tf_input(&raw, 8, FM_DT_BF16, 2, b, NULL, 16);
  tf_op(&raw, FM_OP_MM, 4, 2, 1, 2, 0);
  tf_op(&raw, FM_OP_MM, 5, 2, 1, 3, 0);
  tf_op(&raw, FM_OP_MM, 6, 2, 1, 8, 0);
  tf_op(&raw, FM_OP_ADD, 7, 2, 4, 5, 0);
  tf_op(&raw, FM_OP_ADD, 9, 2, 7, 6, 0);
  tf_output(&raw, 9, FM_DT_BF16, 2, o, NULL, 16);
  expect_reject(FM_EUNSUPPORTED, "two that share A");
  /* the epilogue reads B2; B2 as an output */
  tf_init(&raw);
  tf_input(&raw, 1, FM_DT_BF16, 2, a, NULL, 16);
  tf_input(&raw, 2, FM_DT_BF16, 2, b, NULL, 16);
  tf_input(&raw, 3, FM_DT_BF16, 2, b, NULL, 16);
  tf_op(&raw, FM_OP_MM, 4, 2, 1, 2, 0);
  tf_op(&raw, FM_OP_MM, 5, 2, 1, 3, 0);
  tf_op(&raw, FM_OP_RELU, 6, 1, 3, 0, 0);
  tf_output(&raw, 4, FM_DT_BF16, 2, o, NULL, 16);
  tf_output(&raw, 5, FM_DT_BF16, 2, o, NULL, 16);
  tf_output(&raw, 6, FM_DT_BF16, 2, b, NULL, 16);
  expect_reject(FM_EUNSUPPORTED, "is a matrix operand; the epilogue cannot read it");
}

/* gate and up of a [2, 4] x by two [4, 3] weights, silu(gate) * up and gate, checked by hand. */
static void test_reference(void) {
  int64_t a[2] = {2, 4}, b[2] = {4, 3}, o[2] = {2, 3};
  uint16_t A[8], B1[12], B2[12];
  float y[6], gate[6];
  for (int i = 0; i < 8; i++) A[i] = fm_reference_f32_to_bf16((float)(i % 5) - 2.0f);
  for (int i = 0; i < 12; i++) {
    B1[i] = fm_reference_f32_to_bf16((float)(i % 3) * 0.5f);
    B2[i] = fm_reference_f32_to_bf16((float)(i % 4) - 1.5f);
  }
  tf_init(&raw);
  tf_input(&raw, 1, FM_DT_BF16, 2, a, NULL, 16);
  tf_input(&raw, 2, FM_DT_BF16, 2, b, NULL, 16);
  tf_input(&raw, 3, FM_DT_BF16, 2, b, NULL, 16);
  tf_op(&raw, FM_OP_MM, 4, 2, 1, 2, 0);
  tf_op(&raw, FM_OP_MM, 5, 2, 1, 3, 0);
  tf_cast(&raw, 6, 4, FM_DT_F32);
  tf_cast(&raw, 7, 5, FM_DT_F32);
  tf_op(&raw, FM_OP_SUB, 8, 2, 6, 7, 0);
  tf_output(&raw, 8, FM_DT_F32, 2, o, NULL, 16);
  tf_output(&raw, 6, FM_DT_F32, 2, o, NULL, 16);
  CHECK_EQ_INT(tf_finish(&raw, &canon), FM_OK);
  const void *ins[3] = {A, B1, B2};
  void *outs[2] = {y, gate};
  fm_diag d = {{0}};
  CHECK_EQ_INT(fm_reference_eval(&canon, 0, ins, outs, &d), FM_OK);
  for (int m = 0; m < 2; m++)
    for (int n = 0; n < 3; n++) {
      double g = 0, u = 0;
      for (int k = 0; k < 4; k++) {
        double x = (double)((m * 4 + k) % 5 - 2);
        g += x * (double)((k * 3 + n) % 3) * 0.5;
        u += x * ((double)((k * 3 + n) % 4) - 1.5);
      }
      CHECK(gate[m * 3 + n] == (float)g);
      CHECK(y[m * 3 + n] == (float)(g - u));
    }
}

static void test_candidates_and_source(void) {
  fm_candidate c[48];
  fm_kernel_meta meta;
  char *src = NULL;
  fm_diag d = {{0}};
  CHECK_EQ_INT(build_swiglu(1, NULL), FM_OK);
  size_t n = fm_codegen_candidates(&canon, c, 48);
  CHECK(n >= 8);
  int tma = 0, sm80 = 0;
  for (size_t i = 0; i < n; i++) {
    if (i == 1) { /* the cuBLASLt plan after the default: two matmuls, then the epilogue */
      CHECK_EQ_INT(c[i].tmpl, FM_TMPL_CUBLASLT);
      CHECK_EQ_INT(c[i].p[0], FM_BLAS_SPLIT);
      continue;
    }
    CHECK_EQ_INT(c[i].tmpl, FM_TMPL_GEMM); /* no skinny kernel */
    const fm_gemm_mainloop *ml = tf_gemm_mainloop(&c[i]);
    if (!ml) continue;
    CHECK(!ml->wgmma || ml->tma); /* not the cp.async wgmma forms */
    tma += ml->tma;
    sm80 += !ml->wgmma;
  }
  CHECK(tma > 0 && sm80 > 0);
  /* the default (sm_80 mainloop): half of a block's BN columns per product */
  CHECK_EQ_INT(fm_codegen_default(&canon, &c[0], &d), FM_OK);
  CHECK_EQ_INT(fm_codegen_generate(&canon, &c[0], 132, &src, &meta, &d), FM_OK);
  CHECK(src != NULL);
  if (src) {
    CHECK_STR_CONTAINS(src, "#define FM_SIB 1");
    CHECK_STR_CONTAINS(src, "fm_mainloop(acc, in0, in1, in2, M, m0, n0);");
    CHECK_STR_CONTAINS(src, "const float (&acc2)[8]");
    CHECK_STR_CONTAINS(src, "fm_unstage(v2, slab, r, c + FM_WCOLS / 2);");
  }
  free(src);
  CHECK_STR_CONTAINS(meta.grid_rule, "tiles");
  CHECK_EQ_INT((int)meta.max_blocks, (int)((512 + c[0].p[1] / 2 - 1) / (c[0].p[1] / 2)));
  /* a TMA form: a third map for B2, each B box half the tile's rows */
  for (size_t i = 0; i < n; i++) {
    const fm_gemm_mainloop *ml = tf_gemm_mainloop(&c[i]);
    if (!ml || !ml->tma || ml->persistent) continue; /* one tile a block */
    CHECK_EQ_INT(fm_codegen_generate(&canon, &c[i], 132, &src, &meta, &d), FM_OK);
    free(src);
    CHECK_EQ_INT((int)meta.n_tmaps, 3);
    CHECK_EQ_INT((int)meta.tmaps[1].input, 1);
    CHECK_EQ_INT((int)meta.tmaps[2].input, 2);
    CHECK_EQ_INT((int)meta.tmaps[1].box[1], (int)c[i].p[1] / 2);
    CHECK_EQ_INT((int)meta.tmaps[2].box[1], (int)c[i].p[1] / 2);
    break;
  }
  /* B2 of another layout than B: the templates refuse it with the reason, and so does the
     plan (one set of cuBLASLt layouts serves both matmuls) */
  int64_t row_major[2] = {512, 1};
  CHECK_EQ_INT(build_swiglu(0, row_major), FM_OK);
  fm_gemm_config gc = fm_codegen_gemm_default(&canon);
  CHECK_EQ_INT(fm_codegen_gemm(&canon, &gc, 132, &src, &meta, &d), FM_EUNSUPPORTED);
  CHECK_STR_CONTAINS(d.text, "the sibling B's differ in layout");
  CHECK_EQ_INT((int)fm_codegen_blas_candidates(&canon, c, 2), 0);
  CHECK_EQ_INT(fm_codegen_default(&canon, &c[0], &d), FM_EUNSUPPORTED);
}

/* The siblings' cuBLASLt plan: A@B then A@B2 into the scratch, the split kernel reading both
 * (params end "scratch", "scratch2"), never the direct form; the metadata round-trips and a
 * client must refuse it without the second product parameter. */
static void test_blas_plan(void) {
  fm_candidate c[2];
  fm_kernel_meta meta, back;
  char *src = NULL;
  fm_diag d = {{0}};
  CHECK_EQ_INT(build_swiglu(1, NULL), FM_OK);
  CHECK_EQ_INT((int)fm_codegen_blas_candidates(&canon, c, 2), 1);
  CHECK_EQ_INT(c[0].p[0], FM_BLAS_SPLIT);
  CHECK_EQ_INT(fm_codegen_blas(&canon, FM_BLAS_DIRECT, 132, &src, &meta, &d), FM_EUNSUPPORTED);
  CHECK_EQ_INT(fm_codegen_generate(&canon, &c[0], 132, &src, &meta, &d), FM_OK);
  CHECK(src != NULL);
  if (src) {
    CHECK_STR_CONTAINS(src, "const unsigned short *__restrict__ fm_scratch2");
    CHECK_STR_CONTAINS(src, "fm_epilogue(acc, acc2, m, n");
  }
  free(src);
  CHECK_EQ_INT((int)meta.blas.has_b2, 1);
  CHECK_EQ_INT((int)meta.blas.b, 1);
  CHECK_EQ_INT((int)meta.blas.b2, 2);
  uint64_t fixed = fm_meta_scratch_result_offset(&meta);
  CHECK(fm_meta_scratch_bytes(&meta, 100) == fixed + 2ull * 100 * 512 * 2);
  CHECK(fm_meta_scratch_second_offset(&meta, 100) == 100ull * 512 * 2);
  msgpack_sbuffer sb;
  msgpack_packer pk;
  msgpack_unpacked up;
  msgpack_sbuffer_init(&sb);
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  CHECK_EQ_INT(fm_meta_pack(&meta, &pk), FM_OK);
  msgpack_unpacked_init(&up);
  CHECK(msgpack_unpack_next(&up, sb.data, sb.size, NULL) == MSGPACK_UNPACK_SUCCESS);
  CHECK_EQ_INT(fm_meta_unpack(&up.data, &back, &d), FM_OK);
  CHECK_EQ_INT((int)back.blas.has_b2, 1);
  CHECK_EQ_INT((int)back.blas.b2, 2);
  CHECK(fm_meta_scratch_bytes(&back, 100) == fm_meta_scratch_bytes(&meta, 100));
  /* the params name both products: the last two are "scratch", "scratch2" */
  const msgpack_object *params = NULL;
  for (uint32_t i = 0; i < up.data.via.map.size; i++)
    if (up.data.via.map.ptr[i].key.via.str.size == 6 && !memcmp(up.data.via.map.ptr[i].key.via.str.ptr, "params", 6))
      params = &up.data.via.map.ptr[i].val;
  CHECK(params && params->via.array.size >= 2);
  if (params && params->via.array.size >= 2) {
    const msgpack_object *last = &params->via.array.ptr[params->via.array.size - 1];
    CHECK(last->via.str.size == 8 && !memcmp(last->via.str.ptr, "scratch2", 8));
  }
  msgpack_unpacked_destroy(&up);
  msgpack_sbuffer_destroy(&sb);
}

static void test_nvrtc_every_candidate(void) {
  int compiled = 0;
  CHECK_EQ_INT(build_swiglu(1, NULL), FM_OK);
  CHECK_EQ_INT(tf_compile_candidates(&canon, "swiglu", &compiled), 0);
  CHECK(compiled > 0);
}

int main(void) {
  RUN(test_validate);
  RUN(test_reference);
  RUN(test_candidates_and_source);
  RUN(test_blas_plan);
  RUN(test_nvrtc_every_candidate);
  return FM_TEST_DONE();
}
