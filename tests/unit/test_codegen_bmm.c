/* test_codegen_bmm.c: batched GEMM fragments (bmm, vocabulary 4) without a GPU: what
 * validation accepts (canonical shapes) and refuses, the fp64 reference on a hand-checked
 * batch, the "batched" launch grid, the candidate list (only templates that address A and B
 * through pointers), the per-product offsets in the generated source, and NVRTC compiles of
 * every candidate for sm_90a (and the default for sm_80). */
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

/* Attention scores (tf_attention_scores), m_hint 48. */
static int build_scores(void) { return tf_attention_scores(&raw, &canon); }

static void expect_reject(int rc_want, const char *why) { CHECK(tf_rejects(&raw, rc_want, why)); }

static void test_validate(void) {
  CHECK_EQ_INT(build_scores(), FM_OK);
  CHECK_EQ_INT(canon.vocab, 4);
  CHECK(fm_fragment_is_gemm(&canon));
  CHECK(fm_fragment_is_bmm(&canon));
  CHECK(fm_fragment_is_symbolic(&canon));
  CHECK_EQ_INT((int)canon.m_hint, 64); /* the batch's power-of-two bucket */
  /* the [128, 128] mask right-aligned to [1, 128, 128] */
  CHECK_EQ_INT(canon.inputs[2].rank, 3);
  CHECK_EQ_INT(canon.inputs[2].shape[0], 1);
  CHECK_EQ_INT(canon.inputs[2].shape[1], 128);
  CHECK_EQ_INT(canon.inputs[2].strides[0], 0);
  CHECK_EQ_INT(canon.ops[0].dtype, FM_DT_BF16);
  /* mm and addmm fragments keep vocabulary 3 (and their keys) */
  int64_t a[2] = {32, 64}, b[2] = {64, 16}, o[2] = {32, 16};
  tf_init(&raw);
  tf_input(&raw, 1, FM_DT_BF16, 2, a, NULL, 16);
  tf_input(&raw, 2, FM_DT_BF16, 2, b, NULL, 16);
  tf_op(&raw, FM_OP_MM, 3, 2, 1, 2, 0);
  tf_output(&raw, 3, FM_DT_BF16, 2, o, NULL, 16);
  CHECK_EQ_INT(tf_finish(&raw, &canon), FM_OK);
  CHECK_EQ_INT(canon.vocab, 3);
  CHECK(!fm_fragment_is_bmm(&canon));
}

static void test_rejections(void) {
  int64_t a[3] = {4, 32, 64}, b[3] = {4, 64, 16}, o[3] = {4, 32, 16};
  int64_t a2[2] = {32, 64}, b2[2] = {64, 16}, o2[2] = {32, 16};
  int64_t b3[3] = {3, 64, 16}, bs[3] = {-1, 64, 16}, as[3] = {-1, 32, 64}, os[3] = {-1, 32, 16};
  int64_t e4[4] = {1, 4, 32, 16}, bad_o[3] = {4, 16, 32}, e3[3] = {4, 32, 8};
  /* rank-2 operands */
  tf_init(&raw);
  tf_input(&raw, 1, FM_DT_BF16, 2, a2, NULL, 16);
  tf_input(&raw, 2, FM_DT_BF16, 2, b2, NULL, 16);
  tf_op(&raw, FM_OP_BMM, 3, 2, 1, 2, 0);
  tf_output(&raw, 3, FM_DT_BF16, 2, o2, NULL, 16);
  expect_reject(FM_ESCHEMA, "'bmm' operands are rank 3, this one is rank 2");
  /* mm of rank-3 operands */
  tf_init(&raw);
  tf_input(&raw, 1, FM_DT_BF16, 3, a, NULL, 16);
  tf_input(&raw, 2, FM_DT_BF16, 3, b, NULL, 16);
  tf_op(&raw, FM_OP_MM, 3, 2, 1, 2, 0);
  tf_output(&raw, 3, FM_DT_BF16, 3, o, NULL, 16);
  raw.vocab = 4;
  expect_reject(FM_ESCHEMA, "'mm' operands are rank 2, this one is rank 3");
  /* batches that do not pair */
  tf_init(&raw);
  tf_input(&raw, 1, FM_DT_BF16, 3, a, NULL, 16);
  tf_input(&raw, 2, FM_DT_BF16, 3, b3, NULL, 16);
  tf_op(&raw, FM_OP_BMM, 3, 2, 1, 2, 0);
  tf_output(&raw, 3, FM_DT_BF16, 3, o, NULL, 16);
  expect_reject(FM_ESCHEMA, "A has 4 matrices and B 3");
  /* a static B batch beside a symbolic A batch */
  tf_init(&raw);
  tf_input(&raw, 1, FM_DT_BF16, 3, as, NULL, 16);
  tf_input(&raw, 2, FM_DT_BF16, 3, b, NULL, 16);
  tf_op(&raw, FM_OP_BMM, 3, 2, 1, 2, 0);
  tf_output(&raw, 3, FM_DT_BF16, 3, os, NULL, 16);
  expect_reject(FM_ESCHEMA, "A has -1 matrices and B 4");
  /* the symbolic batch on both is fine; an output of the wrong shape is not */
  tf_init(&raw);
  tf_input(&raw, 1, FM_DT_BF16, 3, as, NULL, 16);
  tf_input(&raw, 2, FM_DT_BF16, 3, bs, NULL, 16);
  tf_op(&raw, FM_OP_BMM, 3, 2, 1, 2, 0);
  tf_output(&raw, 3, FM_DT_BF16, 3, os, NULL, 16);
  CHECK_EQ_INT(tf_finish(&raw, &canon), FM_OK);
  tf_init(&raw);
  tf_input(&raw, 1, FM_DT_BF16, 3, a, NULL, 16);
  tf_input(&raw, 2, FM_DT_BF16, 3, b, NULL, 16);
  tf_op(&raw, FM_OP_BMM, 3, 2, 1, 2, 0);
  tf_output(&raw, 3, FM_DT_BF16, 3, bad_o, NULL, 16);
  expect_reject(FM_ESCHEMA, "outputs are [Bt, M, N] = [4, 32, 16]");
  /* epilogue inputs: rank 4, and a dim that does not broadcast */
  tf_init(&raw);
  tf_input(&raw, 1, FM_DT_BF16, 3, a, NULL, 16);
  tf_input(&raw, 2, FM_DT_BF16, 3, b, NULL, 16);
  tf_input(&raw, 4, FM_DT_BF16, 4, e4, NULL, 16);
  tf_op(&raw, FM_OP_BMM, 3, 2, 1, 2, 0);
  tf_op(&raw, FM_OP_ADD, 5, 2, 3, 4, 0);
  tf_output(&raw, 5, FM_DT_BF16, 3, o, NULL, 16);
  expect_reject(FM_ESCHEMA, "rank 4; epilogue inputs broadcast to [Bt, M, N]");
  tf_init(&raw);
  tf_input(&raw, 1, FM_DT_BF16, 3, a, NULL, 16);
  tf_input(&raw, 2, FM_DT_BF16, 3, b, NULL, 16);
  tf_input(&raw, 4, FM_DT_BF16, 3, e3, NULL, 16);
  tf_op(&raw, FM_OP_BMM, 3, 2, 1, 2, 0);
  tf_op(&raw, FM_OP_ADD, 5, 2, 3, 4, 0);
  tf_output(&raw, 5, FM_DT_BF16, 3, o, NULL, 16);
  expect_reject(FM_ESCHEMA, "inputs[2].shape[2]: 8 does not broadcast to 16");
  /* the epilogue reads an operand */
  tf_init(&raw);
  tf_input(&raw, 1, FM_DT_BF16, 3, a, NULL, 16);
  tf_input(&raw, 2, FM_DT_BF16, 3, b, NULL, 16);
  tf_op(&raw, FM_OP_BMM, 3, 2, 1, 2, 0);
  tf_op(&raw, FM_OP_RELU, 4, 1, 2, 0, 0);
  tf_output(&raw, 3, FM_DT_BF16, 3, o, NULL, 16);
  tf_output(&raw, 4, FM_DT_BF16, 3, b, NULL, 16);
  expect_reject(FM_EUNSUPPORTED, "the epilogue cannot read it");
}

/* Two products of [2, 4] @ [4, 3] by one shared B (batch dim 1) + a bias [3], checked by
 * hand; the product a second output (f32). */
static void test_reference(void) {
  int64_t a[3] = {2, 2, 4}, b[3] = {1, 4, 3}, bias[1] = {3}, o[3] = {2, 2, 3};
  uint16_t A[16], B[12], Bias[3];
  float out[12], prod[12];
  for (int i = 0; i < 16; i++) A[i] = fm_reference_f32_to_bf16((float)(i % 7) - 3.0f);
  for (int i = 0; i < 12; i++) B[i] = fm_reference_f32_to_bf16((float)(i % 4) * 0.5f);
  for (int i = 0; i < 3; i++) Bias[i] = fm_reference_f32_to_bf16((float)i - 1.0f);
  tf_init(&raw);
  tf_input(&raw, 1, FM_DT_BF16, 3, a, NULL, 16);
  tf_input(&raw, 2, FM_DT_BF16, 3, b, NULL, 16);
  tf_input(&raw, 3, FM_DT_BF16, 1, bias, NULL, 16);
  tf_op(&raw, FM_OP_BMM, 4, 2, 1, 2, 0);
  tf_cast(&raw, 5, 4, FM_DT_F32);
  tf_op(&raw, FM_OP_ADD, 6, 2, 5, 3, 0);
  tf_output(&raw, 6, FM_DT_F32, 3, o, NULL, 16);
  tf_output(&raw, 5, FM_DT_F32, 3, o, NULL, 16);
  CHECK_EQ_INT(tf_finish(&raw, &canon), FM_OK);
  const void *ins[3] = {A, B, Bias};
  void *outs[2] = {out, prod};
  fm_diag d = {{0}};
  CHECK_EQ_INT(fm_reference_eval(&canon, 0, ins, outs, &d), FM_OK);
  for (int z = 0; z < 2; z++)
    for (int m = 0; m < 2; m++)
      for (int n = 0; n < 3; n++) {
        double want = 0;
        for (int k = 0; k < 4; k++) want += (double)((z * 8 + m * 4 + k) % 7 - 3) * (double)((k * 3 + n) % 4) * 0.5;
        int at = z * 6 + m * 3 + n;
        CHECK(prod[at] == (float)want);
        CHECK(out[at] == (float)(want + n - 1.0));
      }
}

static void test_meta_and_candidates(void) {
  fm_candidate c[48];
  fm_kernel_meta meta;
  char *src = NULL;
  fm_diag d = {{0}};
  CHECK_EQ_INT(build_scores(), FM_OK);
  size_t n = fm_codegen_candidates(&canon, c, 48);
  CHECK(n >= 10);
  int wgmma = 0;
  for (size_t i = 0; i < n; i++) {
    /* the cuBLASLt plan right after the default (its split form: a batch is never direct);
       no skinny kernel, no tensor maps: only templates that move A and B through pointers */
    if (i == 1) {
      CHECK_EQ_INT(c[i].tmpl, FM_TMPL_CUBLASLT);
      CHECK_EQ_INT(c[i].p[0], FM_BLAS_SPLIT);
      continue;
    }
    CHECK_EQ_INT(c[i].tmpl, FM_TMPL_GEMM);
    const fm_gemm_mainloop *ml = tf_gemm_mainloop(&c[i]);
    CHECK(ml && !ml->tma);
    if (ml) wgmma += ml->wgmma;
  }
  CHECK(wgmma > 0); /* the cp.async wgmma forms */
  CHECK_EQ_INT(fm_codegen_generate(&canon, &c[0], 132, &src, &meta, &d), FM_OK);
  CHECK(src != NULL);
  if (!src) return;
  /* each block moves every batched tensor to its product; the mask (batch stride 0) stays */
  CHECK_STR_CONTAINS(src, "const long long fm_z = blockIdx.z;");
  CHECK_STR_CONTAINS(src, "in0 += fm_z * 8192LL;");
  CHECK_STR_CONTAINS(src, "in1 += fm_z * 8192LL;");
  CHECK_STR_CONTAINS(src, "out0 += fm_z * 16384LL;");
  CHECK(strstr(src, "in2 += fm_z") == NULL);
  CHECK_STR_CONTAINS(src, "const long long M = 128LL;");
  free(src);
  CHECK_STR_CONTAINS(meta.grid_rule, "batched");
  CHECK(fm_meta_rule_known("batched"));
  CHECK_EQ_INT((int)meta.inner, 128);
  CHECK_EQ_INT((int)meta.outer, -1);
  /* grid: column tiles x row tiles of one product x the products */
  uint32_t bm = (uint32_t)meta.items_per_block, bn = c[0].p[1];
  CHECK_EQ_INT((int)fm_meta_grid_x(&meta, 48), (int)((128 + bn - 1) / bn));
  CHECK_EQ_INT((int)fm_meta_grid_y(&meta, 48), (int)((128 + bm - 1) / bm));
  CHECK_EQ_INT((int)fm_meta_grid_z(&meta, 48), 48);
  CHECK_EQ_INT((int)fm_meta_grid_x(&meta, 0), 0); /* no products: no launch */
  CHECK_EQ_INT((int)fm_meta_grid_z(&meta, 0), 0);
  /* the metadata survives its wire form */
  fm_kernel_meta back;
  CHECK_EQ_INT(tf_meta_round_trip(&meta, &back, &d), FM_OK);
  CHECK_STR_CONTAINS(back.grid_rule, "batched");
  CHECK_EQ_INT((int)fm_meta_grid_z(&back, 7), 7);
  /* the other rules have one product */
  fm_kernel_meta tiles = meta;
  snprintf(tiles.grid_rule, sizeof tiles.grid_rule, "tiles");
  CHECK_EQ_INT((int)fm_meta_grid_z(&tiles, 48), 1);
}

/* The cuBLASLt plan of a bmm: strided batched (A's and B's batch strides), the product dense
 * in the scratch ([outer, M, N]), then the split epilogue kernel on a "batched" grid whose
 * blocks move to their product; never the direct form. */
static void test_blas_plan(void) {
  fm_candidate c[4];
  fm_kernel_meta meta;
  char *src = NULL;
  fm_diag d = {{0}};
  CHECK_EQ_INT(build_scores(), FM_OK);
  CHECK_EQ_INT((int)fm_codegen_blas_candidates(&canon, c, 4), 1);
  CHECK_EQ_INT(c[0].p[0], FM_BLAS_SPLIT);
  CHECK_EQ_INT(fm_codegen_blas(&canon, FM_BLAS_DIRECT, 132, &src, &meta, &d), FM_EUNSUPPORTED);
  CHECK_EQ_INT(fm_codegen_generate(&canon, &c[0], 132, &src, &meta, &d), FM_OK);
  CHECK(src != NULL);
  if (!src) return;
  CHECK_STR_CONTAINS(src, "fm_scratch += fm_z * M * FM_N;");
  CHECK_STR_CONTAINS(src, "out0 += fm_z * 16384LL;");
  free(src);
  CHECK_STR_CONTAINS(meta.kind, "cublaslt");
  CHECK_STR_CONTAINS(meta.blas.form, "split");
  CHECK_STR_CONTAINS(meta.grid_rule, "batched");
  CHECK_EQ_INT((int)meta.blas.batched, 1);
  CHECK_EQ_INT((int)meta.blas.stride_a, 8192);
  CHECK_EQ_INT((int)meta.blas.stride_b, 8192);
  CHECK_EQ_INT((int)meta.blas.m, 128);
  CHECK_EQ_INT((int)meta.outer, -1);
  /* 48 products of [128, 128] bf16 after the workspace */
  uint64_t fixed = fm_meta_scratch_result_offset(&meta);
  CHECK(fm_meta_scratch_bytes(&meta, 48) == fixed + 48ull * 128 * 128 * 2);
  CHECK_EQ_INT((int)fm_meta_grid_z(&meta, 48), 48);
  CHECK_EQ_INT((int)fm_meta_grid_x(&meta, 48), 1);
  CHECK_EQ_INT((int)(fm_meta_grid_y(&meta, 48) * meta.items_per_block >= 128), 1);
  /* the wire form keeps the batch; without it (a client that ignored it would run one
     product) or with another rule the metadata is refused */
  msgpack_sbuffer sb;
  msgpack_packer pk;
  msgpack_sbuffer_init(&sb);
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  CHECK_EQ_INT(fm_meta_pack(&meta, &pk), FM_OK);
  msgpack_unpacked up;
  msgpack_unpacked_init(&up);
  CHECK(msgpack_unpack_next(&up, sb.data, sb.size, NULL) == MSGPACK_UNPACK_SUCCESS);
  fm_kernel_meta back;
  CHECK_EQ_INT(fm_meta_unpack(&up.data, &back, &d), FM_OK);
  CHECK_EQ_INT((int)back.blas.batched, 1);
  CHECK_EQ_INT((int)back.blas.stride_a, 8192);
  CHECK(fm_meta_scratch_bytes(&back, 48) == fm_meta_scratch_bytes(&meta, 48));
  msgpack_unpacked_destroy(&up);
  msgpack_sbuffer_destroy(&sb);
  fm_kernel_meta wrong = meta;
  snprintf(wrong.grid_rule, sizeof wrong.grid_rule, "elementwise");
  msgpack_sbuffer_init(&sb);
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  CHECK_EQ_INT(fm_meta_pack(&wrong, &pk), FM_OK);
  msgpack_unpacked_init(&up);
  CHECK(msgpack_unpack_next(&up, sb.data, sb.size, NULL) == MSGPACK_UNPACK_SUCCESS);
  CHECK_EQ_INT(fm_meta_unpack(&up.data, &back, &d), FM_ESCHEMA);
  CHECK_STR_CONTAINS(d.text, "a batched plan's kernel has grid rule 'batched'");
  msgpack_unpacked_destroy(&up);
  msgpack_sbuffer_destroy(&sb);
}

/* A static batch of 3 with one broadcast B: a 64x64 default (few tiles); a batch stride
 * that is no multiple of 16 bytes: the templates refuse it, the cuBLASLt plan (told the
 * products' 4-byte alignment) is the default. */
static void test_static_batch(void) {
  int64_t a[3] = {3, 40, 24}, b[3] = {1, 24, 72}, o[3] = {3, 40, 72}, ast[3] = {970, 24, 1};
  fm_candidate c;
  fm_kernel_meta meta;
  char *src = NULL;
  fm_diag d = {{0}};
  tf_init(&raw);
  tf_input(&raw, 1, FM_DT_F16, 3, a, NULL, 16);
  tf_input(&raw, 2, FM_DT_F16, 3, b, NULL, 16);
  tf_op(&raw, FM_OP_BMM, 3, 2, 1, 2, 0);
  tf_output(&raw, 3, FM_DT_F16, 3, o, NULL, 16);
  CHECK_EQ_INT(tf_finish(&raw, &canon), FM_OK);
  CHECK_EQ_INT(fm_codegen_default(&canon, &c, &d), FM_OK);
  CHECK_EQ_INT(c.p[0], 64);
  CHECK_EQ_INT(fm_codegen_generate(&canon, &c, 132, &src, &meta, &d), FM_OK);
  CHECK(src && strstr(src, "in1 += fm_z") == NULL); /* B is every product's */
  free(src);
  CHECK_EQ_INT((int)meta.outer, 3);
  CHECK_EQ_INT((int)fm_meta_grid_z(&meta, 99), 3); /* a static batch ignores the caller's */
  tf_init(&raw);
  tf_input(&raw, 1, FM_DT_F16, 3, a, ast, 16); /* batch stride 970: not 16-byte chunks */
  tf_input(&raw, 2, FM_DT_F16, 3, b, NULL, 16);
  tf_op(&raw, FM_OP_BMM, 3, 2, 1, 2, 0);
  tf_output(&raw, 3, FM_DT_F16, 3, o, NULL, 16);
  CHECK_EQ_INT(tf_finish(&raw, &canon), FM_OK);
  fm_gemm_config gc = fm_codegen_gemm_default(&canon);
  CHECK_EQ_INT(fm_codegen_gemm(&canon, &gc, 132, &src, &meta, &d), FM_EUNSUPPORTED);
  CHECK_STR_CONTAINS(d.text, "batch stride of A or B (970, 0) is not a multiple of 8");
  CHECK_EQ_INT(fm_codegen_default(&canon, &c, &d), FM_OK);
  CHECK_EQ_INT(c.tmpl, FM_TMPL_CUBLASLT);
  CHECK_EQ_INT(fm_codegen_generate(&canon, &c, 132, &src, &meta, &d), FM_OK);
  free(src);
  CHECK_EQ_INT((int)meta.blas.align[0], 4);  /* A: 970 x 2 bytes apart */
  CHECK_EQ_INT((int)meta.blas.align[1], 16); /* B: one for all */
}

static void test_nvrtc_every_candidate(void) {
  int compiled = 0;
  CHECK_EQ_INT(build_scores(), FM_OK);
  CHECK_EQ_INT(tf_compile_candidates(&canon, "bmm_scores", &compiled), 0);
  CHECK(compiled > 0);
}

int main(void) {
  RUN(test_validate);
  RUN(test_rejections);
  RUN(test_reference);
  RUN(test_meta_and_candidates);
  RUN(test_blas_plan);
  RUN(test_static_batch);
  RUN(test_nvrtc_every_candidate);
  return FM_TEST_DONE();
}
