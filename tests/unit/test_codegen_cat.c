/* test_codegen_cat.c: fragments with a `cat` (vocabulary 6): the CPU reference against values
 * computed here by hand (rotary embeddings, three operands along a middle dim, computed
 * operands, a broadcast operand, a symbolic dim 0, a row padded with zeros), the generated
 * source (golden; 16-byte stores where rows hold whole vectors), NVRTC compiles of every
 * candidate for sm_80 and sm_90a, and the compile cost of the branches. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fm_codegen.h"
#include "fm_reference.h"
#include "fm_test.h"
#include "test_codegen_frag.h"

static fm_fragment raw, canon;

static void set_dim(fm_fragment *f, int32_t dim) { f->ops[f->n_ops - 1].dim = dim; }

/* RoPE over x [-1, H, d] f32: out = x * cos + cat([-x2, x1], -1) * sin, x1 and x2 views of
 * x's halves, cos and sin [-1, 1, d] (broadcast over H). */
#define H 3
#define D 8
static void rope_d(fm_dtype dt, int64_t d) {
  int64_t half[3] = {-1, H, d / 2}, full[3] = {-1, H, d}, cs[3] = {-1, 1, d};
  int64_t xs[3] = {H * d, d, 1};
  tf_init(&raw);
  raw.vocab = 6;
  tf_input(&raw, 0, dt, 3, half, xs, 16);   /* x1 = x[..., :D/2] */
  tf_input(&raw, 1, dt, 3, half, xs, 16);   /* x2 = x[..., D/2:] (its own pointer) */
  tf_input(&raw, 2, dt, 3, full, NULL, 16); /* x */
  tf_input(&raw, 3, dt, 3, cs, NULL, 16);   /* cos */
  tf_input(&raw, 4, dt, 3, cs, NULL, 16);   /* sin */
  tf_op(&raw, FM_OP_NEG, 5, 1, 1, 0, 0);
  tf_op(&raw, FM_OP_CAT, 6, 2, 5, 0, 0);
  set_dim(&raw, -1);
  tf_op(&raw, FM_OP_MUL, 7, 2, 2, 3, 0);
  tf_op(&raw, FM_OP_MUL, 8, 2, 6, 4, 0);
  tf_op(&raw, FM_OP_ADD, 9, 2, 7, 8, 0);
  tf_output(&raw, 9, dt, 3, full, NULL, 16);
}

static void rope(fm_dtype dt) { rope_d(dt, D); }

static void test_reference_rope(void) {
  enum { B = 2, N = B * H * D };
  float x[N], c[B * D], s[B * D], out[N];
  for (int i = 0; i < N; i++) x[i] = (float)(i % 13) - 6.0f;
  for (int i = 0; i < B * D; i++) c[i] = 0.25f * (float)(i % 5), s[i] = 1.0f - 0.125f * (float)(i % 7);
  rope(FM_DT_F32);
  CHECK_EQ_INT(tf_finish(&raw, &canon), FM_OK);
  const void *in[5] = {x, x + D / 2, x, c, s};
  void *o[1] = {out};
  fm_diag d = {{0}};
  CHECK_EQ_INT(fm_reference_eval(&canon, B, in, o, &d), FM_OK);
  int bad = 0;
  for (int b = 0; b < B; b++)
    for (int h = 0; h < H; h++)
      for (int j = 0; j < D; j++) {
        const float *row = x + (b * H + h) * D;
        float rot = j < D / 2 ? -row[j + D / 2] : row[j - D / 2];
        float want = row[j] * c[b * D + j] + rot * s[b * D + j];
        bad += fabsf(out[(b * H + h) * D + j] - want) > 1e-6f;
      }
  CHECK_EQ_INT(bad, 0);
}

/* cat([exp(a) [2, 3, 4], b [2, 1, 4], w [2, 2, 1]], dim 1) -> [2, 6, 4]: three operands on a
 * middle dim, a computed one, one broadcast along the last dim. */
static void three_middle(void) {
  int64_t sa[3] = {2, 3, 4}, sb[3] = {2, 1, 4}, sw[3] = {2, 2, 1}, so[3] = {2, 6, 4};
  tf_init(&raw);
  raw.vocab = 6;
  tf_input(&raw, 0, FM_DT_F32, 3, sa, NULL, 16);
  tf_input(&raw, 1, FM_DT_BF16, 3, sb, NULL, 16);
  tf_input(&raw, 2, FM_DT_F32, 3, sw, NULL, 16);
  tf_op(&raw, FM_OP_EXP, 3, 1, 0, 0, 0);
  tf_op(&raw, FM_OP_CAT, 4, 3, 3, 1, 2);
  set_dim(&raw, 1);
  tf_output(&raw, 4, FM_DT_F32, 3, so, NULL, 16);
}

static void test_reference_three_middle(void) {
  float a[24], w[4], out[48];
  uint16_t b[8];
  for (int i = 0; i < 24; i++) a[i] = 0.1f * (float)i;
  for (int i = 0; i < 8; i++) b[i] = fm_reference_f32_to_bf16((float)i + 0.5f);
  for (int i = 0; i < 4; i++) w[i] = -(float)i;
  three_middle();
  CHECK_EQ_INT(tf_finish(&raw, &canon), FM_OK);
  CHECK_EQ_INT(canon.ops[canon.n_ops - 1].dim, 1);
  const void *in[3] = {a, b, w};
  void *o[1] = {out};
  fm_diag d = {{0}};
  CHECK_EQ_INT(fm_reference_eval(&canon, 0, in, o, &d), FM_OK);
  int bad = 0;
  for (int z = 0; z < 2; z++)
    for (int r = 0; r < 6; r++)
      for (int k = 0; k < 4; k++) {
        double want = r < 3    ? exp((double)a[(z * 3 + r) * 4 + k])
                      : r == 3 ? (double)(z * 4 + k) + 0.5   /* b[z, 0, k] */
                               : (double)w[z * 2 + (r - 4)]; /* w[z, r-4, 0], broadcast */
        bad += fabs(out[(z * 6 + r) * 4 + k] - (float)want) > 1e-6 * fabs(want) + 1e-7;
      }
  CHECK_EQ_INT(bad, 0);
}

/* cat of two computed values of one input and a broadcast input on the last dim:
 * [x * 2, relu(x) + y], x [-1, 5], y [1, 1] -> [-1, 10], bool compare after it. */
static void computed_broadcast(void) {
  int64_t sx[2] = {-1, 5}, sy[2] = {1, 1}, so[2] = {-1, 10};
  tf_init(&raw);
  raw.vocab = 6;
  tf_input(&raw, 0, FM_DT_F16, 2, sx, NULL, 16);
  tf_input(&raw, 1, FM_DT_F32, 2, sy, NULL, 16);
  tf_const(&raw, 2, 2.0);
  tf_op(&raw, FM_OP_MUL, 3, 2, 0, 2, 0);
  tf_op(&raw, FM_OP_RELU, 4, 1, 0, 0, 0);
  tf_op(&raw, FM_OP_ADD, 5, 2, 4, 1, 0);
  tf_cast(&raw, 6, 5, FM_DT_F16);
  tf_op(&raw, FM_OP_CAT, 7, 2, 3, 6, 0);
  set_dim(&raw, 1);
  tf_op(&raw, FM_OP_GT, 8, 2, 7, 2, 0);
  tf_output(&raw, 7, FM_DT_F16, 2, so, NULL, 16);
  tf_output(&raw, 8, FM_DT_BOOL, 2, so, NULL, 16);
}

static void test_reference_computed(void) {
  enum { M = 3 };
  uint16_t x[M * 5], out[M * 10];
  uint8_t gt[M * 10];
  float y = 1.5f;
  for (int i = 0; i < M * 5; i++) x[i] = fm_reference_f32_to_f16((float)i - 7.0f);
  computed_broadcast();
  CHECK_EQ_INT(tf_finish(&raw, &canon), FM_OK);
  const void *in[2] = {x, &y};
  void *o[2] = {out, gt};
  fm_diag d = {{0}};
  CHECK_EQ_INT(fm_reference_eval(&canon, M, in, o, &d), FM_OK);
  int bad = 0;
  for (int m = 0; m < M; m++)
    for (int j = 0; j < 10; j++) {
      float v = (float)(m * 5 + j % 5) - 7.0f;
      float want = j < 5 ? v * 2.0f : fmaxf(v, 0.0f) + y;
      bad += fm_reference_f16_to_f32(out[m * 10 + j]) != want;
      bad += gt[m * 10 + j] != (want > 2.0f);
    }
  CHECK_EQ_INT(bad, 0);
}

/* NVRTC: every candidate of each case, sm_80 and sm_90a; the RoPE source is golden. */
static void test_compiles(void) {
  static const char *const names[] = {"cat rope bf16", "cat rope f32", "cat three middle", "cat computed"};
  for (int c = 0; c < 4; c++) {
    if (c < 2)
      rope(c == 0 ? FM_DT_BF16 : FM_DT_F32);
    else if (c == 2)
      three_middle();
    else
      computed_broadcast();
    CHECK_EQ_INT(tf_finish(&raw, &canon), FM_OK);
    int compiled = 0;
    CHECK_EQ_INT(
        c == 0 ? tf_compile_every(&canon, names[c], &compiled) : tf_compile_candidates(&canon, names[c], &compiled), 0);
    CHECK(compiled > 0);
    if (c != 0) continue;
    char *src = NULL;
    fm_kernel_meta m;
    fm_diag d = {{0}};
    CHECK_EQ_INT(fm_codegen_pointwise(&canon, NULL, 132, &src, &m, &d), FM_OK);
    CHECK(src && tf_golden("pointwise_cat_rope", src));
    /* a unit of 8 elements (16 bytes of bf16 along D) a thread a step: the grid covers
     * outer * H * D elements; capped at vec 1, one element a thread */
    CHECK(strcmp(m.kind, "pointwise") == 0 && strcmp(m.grid_rule, "elementwise") == 0);
    CHECK_EQ_INT((int)m.inner, H * D);
    CHECK_EQ_INT((int)m.items_per_block, 256 * 2 * 8);
    CHECK(m.outer == -1 && m.n_inputs == 5 && m.n_outputs == 1);
    free(src);
    src = NULL;
    fm_pw_config one = fm_codegen_pointwise_default(&canon);
    one.vec = 1;
    CHECK_EQ_INT(fm_codegen_pointwise(&canon, &one, 132, &src, &m, &d), FM_OK);
    CHECK_EQ_INT((int)m.items_per_block, 256 * 2);
    CHECK(src && strstr(src, "reinterpret_cast") == NULL);
    free(src);
  }
}

/* Heads of 64 in bf16: units of 8 never straddle the cat at 32, so a unit's values are register
 * arrays, its branch taken once and each input read once: x and the rotated half as 16-byte
 * vectors, cos and sin too (contiguous along the last dim, broadcast over the heads). Golden,
 * and every candidate compiles. */
static void test_rope_units(void) {
  rope_d(FM_DT_BF16, 64);
  CHECK_EQ_INT(tf_finish(&raw, &canon), FM_OK);
  char *src = NULL;
  fm_kernel_meta m;
  fm_diag d = {{0}};
  CHECK_EQ_INT(fm_codegen_pointwise(&canon, NULL, 132, &src, &m, &d), FM_OK);
  CHECK(src && tf_golden("pointwise_cat_rope_units", src));
  CHECK(src && strstr(src, "const long long cl") == NULL); /* no element-wise load */
  for (int k = 0; k < 5; k++) {
    char load[64];
    snprintf(load, sizeof load, "reinterpret_cast<const uint4 *>(in%d + ", k);
    CHECK(src && strstr(src, load));
  }
  CHECK(src && strstr(src, "if (c2 < 32LL)"));
  free(src);
  int compiled = 0;
  CHECK_EQ_INT(tf_compile_candidates(&canon, "cat rope units", &compiled), 0);
  CHECK(compiled > 0);
  /* a stride-2 x is read element by element, in the same form */
  const int64_t xs[3] = {H * 128, 128, 2};
  raw.inputs[0].strides[0] = raw.inputs[1].strides[0] = raw.inputs[2].strides[0] = xs[0];
  raw.inputs[0].strides[1] = raw.inputs[1].strides[1] = raw.inputs[2].strides[1] = xs[1];
  raw.inputs[0].strides[2] = raw.inputs[1].strides[2] = raw.inputs[2].strides[2] = xs[2];
  CHECK_EQ_INT(tf_finish(&raw, &canon), FM_OK);
  CHECK_EQ_INT(fm_codegen_pointwise(&canon, NULL, 132, &src, &m, &d), FM_OK);
  CHECK(src && strstr(src, "const long long cl = c2 + q;"));
  CHECK(src && strstr(src, "reinterpret_cast<const uint4 *>(in3 + "));
  free(src);
}

/* A gradient padded for a GEMM: cat([x, zeros], -1), x [-1, 13] bf16 (odd rows), zeros
 * [-1, 3], into [-1, 16] rows. */
static void pad_rows(int64_t cols_out) {
  int64_t sx[2] = {-1, 13}, sz[2] = {-1, cols_out - 13}, so[2] = {-1, cols_out};
  tf_init(&raw);
  raw.vocab = 6;
  tf_input(&raw, 0, FM_DT_BF16, 2, sx, NULL, 2);
  tf_input(&raw, 1, FM_DT_BF16, 2, sz, NULL, 2);
  tf_op(&raw, FM_OP_CAT, 2, 2, 0, 1, 0);
  set_dim(&raw, 1);
  tf_output(&raw, 2, FM_DT_BF16, 2, so, NULL, 16);
}

/* Rows of whole aligned vectors are stored a 16-byte unit at a time, each element of the unit
 * read from its own branch (the reference agrees element by element); rows of an odd length
 * keep one element a thread. Every candidate compiles. */
static void test_pad_vectorised(void) {
  enum { R = 3 };
  uint16_t x[R * 13], z[R * 3], out[R * 16];
  for (int i = 0; i < R * 13; i++) x[i] = fm_reference_f32_to_bf16((float)i - 7.5f);
  for (int i = 0; i < R * 3; i++) z[i] = fm_reference_f32_to_bf16(100.0f + (float)i);
  pad_rows(16);
  CHECK_EQ_INT(tf_finish(&raw, &canon), FM_OK);
  const void *in[2] = {x, z};
  void *o[1] = {out};
  fm_diag d = {{0}};
  CHECK_EQ_INT(fm_reference_eval(&canon, R, in, o, &d), FM_OK);
  int bad = 0;
  for (int r = 0; r < R; r++)
    for (int j = 0; j < 16; j++) bad += out[r * 16 + j] != (j < 13 ? x[r * 13 + j] : z[r * 3 + j - 13]);
  CHECK_EQ_INT(bad, 0);
  char *src = NULL;
  fm_kernel_meta m;
  CHECK_EQ_INT(fm_codegen_pointwise(&canon, NULL, 132, &src, &m, &d), FM_OK);
  CHECK(src && strstr(src, "CAT path, vec 8,") && strstr(src, "*reinterpret_cast<uint4 *>(out0 + "));
  CHECK(src && strstr(src, "const long long cl = c1 + q;"));
  free(src);
  src = NULL;
  int compiled = 0;
  CHECK_EQ_INT(tf_compile_every(&canon, "cat pad rows", &compiled), 0);
  CHECK(compiled > 0);
  pad_rows(15); /* [-1, 15] rows: no whole vectors */
  CHECK_EQ_INT(tf_finish(&raw, &canon), FM_OK);
  CHECK_EQ_INT(fm_codegen_pointwise(&canon, NULL, 132, &src, &m, &d), FM_OK);
  CHECK(src && strstr(src, "CAT path, vec 1,") && !strstr(src, "reinterpret_cast"));
  free(src);
}

/* A loss's gradient written padded for a GEMM (GPT-2's 50 257 columns and zeros to 50 304, at
 * a smaller size): cat([exp(x) * 2 (x [-1, 1001] bf16 at the padded stride 1008), z [-1, 7]], -1)
 * into [-1, 1008]. The split at 1001 falls inside the unit of columns 1000..1007: only that unit
 * is computed element by element; every other is a unit, x read as 16-byte vectors and z (its
 * branch starting off a multiple of 8) element by element. The reference places every element,
 * and every candidate compiles. Golden. */
static void test_units_unless_straddling(void) {
  enum { R = 2, C = 1001, LD = 1008 };
  int64_t sx[2] = {-1, C}, stx[2] = {LD, 1}, sz[2] = {-1, LD - C}, so[2] = {-1, LD};
  tf_init(&raw);
  raw.vocab = 6;
  tf_input(&raw, 0, FM_DT_BF16, 2, sx, stx, 16);
  tf_input(&raw, 1, FM_DT_BF16, 2, sz, NULL, 2);
  tf_op(&raw, FM_OP_EXP, 2, 1, 0, 0, 0);
  tf_const(&raw, 3, 2.0);
  tf_op(&raw, FM_OP_MUL, 4, 2, 2, 3, 0);
  tf_cast(&raw, 5, 4, FM_DT_BF16);
  tf_op(&raw, FM_OP_CAT, 6, 2, 5, 1, 0);
  set_dim(&raw, 1);
  tf_output(&raw, 6, FM_DT_BF16, 2, so, NULL, 16);
  CHECK_EQ_INT(tf_finish(&raw, &canon), FM_OK);
  static uint16_t x[R * LD], z[R * (LD - C)], out[R * LD];
  for (int i = 0; i < R * LD; i++) x[i] = fm_reference_f32_to_bf16((float)(i % 97) / 97.0f - 0.5f);
  for (int i = 0; i < R * (LD - C); i++) z[i] = fm_reference_f32_to_bf16(-3.0f - (float)i);
  const void *in[2] = {x, z};
  void *o[1] = {out};
  fm_diag d = {{0}};
  CHECK_EQ_INT(fm_reference_eval(&canon, R, in, o, &d), FM_OK);
  int bad = 0;
  for (int r = 0; r < R; r++)
    for (int j = 0; j < LD; j++) {
      const float want = j < C ? 2.0f * expf(fm_reference_bf16_to_f32(x[r * LD + j])) : 0.0f;
      const uint16_t got = out[r * LD + j];
      if (j >= C)
        bad += got != z[r * (LD - C) + j - C];
      else
        bad += fabsf(fm_reference_bf16_to_f32(got) - want) > 1e-2f * want;
    }
  CHECK_EQ_INT(bad, 0);
  char *src = NULL;
  fm_kernel_meta m;
  CHECK_EQ_INT(fm_codegen_pointwise(&canon, NULL, 132, &src, &m, &d), FM_OK);
  CHECK(src && tf_golden("pointwise_cat_units_unless_straddling", src));
  CHECK(src && strstr(src, "const bool straddles = c1 == 1000LL;"));
  CHECK(src && strstr(src, "reinterpret_cast<const uint4 *>(in0 + c0 * 1008LL + c1)"));
  CHECK(src && strstr(src, "const long long cl = b1 + q;")); /* z's branch starts at 1001 */
  CHECK(src && strstr(src, "const long long cl = c1 + q;")); /* the straddling unit */
  free(src);
  int compiled = 0;
  CHECK_EQ_INT(tf_compile_every(&canon, "cat units unless straddling", &compiled), 0);
  CHECK(compiled > 0);
}

/* A cat's operands are generated once more per branch, so they count again in the cost. */
/* A cat of rank 5 of three operands (a ViT's q, k, v gradients [-1, N, 1, H, D] into the QKV
 * projection's [-1, N, 3, H, D]; ATen copies each apart above rank 4): the reference against the
 * operands' elements placed by hand, and every candidate through NVRTC. */
static void test_rank5_qkv(void) {
  enum { Z = 2, N = 3, HEADS = 2, HD = 8 };
  int64_t sq[5] = {-1, N, 1, HEADS, HD}, so[5] = {-1, N, 3, HEADS, HD};
  tf_init(&raw);
  raw.vocab = 6;
  for (uint32_t i = 0; i < 3; i++) tf_input(&raw, i, FM_DT_F32, 5, sq, NULL, 16);
  tf_op(&raw, FM_OP_CAT, 3, 3, 0, 1, 2);
  set_dim(&raw, 2);
  tf_output(&raw, 3, FM_DT_F32, 5, so, NULL, 16);
  CHECK_EQ_INT(tf_finish(&raw, &canon), FM_OK);
  static float q[3][Z * N * HEADS * HD], out[Z * N * 3 * HEADS * HD];
  for (int t = 0; t < 3; t++)
    for (int i = 0; i < Z * N * HEADS * HD; i++) q[t][i] = (float)(t * 1000 + i);
  const void *in[3] = {q[0], q[1], q[2]};
  void *o[1] = {out};
  fm_diag d = {{0}};
  CHECK_EQ_INT(fm_reference_eval(&canon, Z, in, o, &d), FM_OK);
  int bad = 0;
  for (int zn = 0; zn < Z * N; zn++)
    for (int t = 0; t < 3; t++)
      for (int e = 0; e < HEADS * HD; e++) bad += out[(zn * 3 + t) * HEADS * HD + e] != q[t][zn * HEADS * HD + e];
  CHECK_EQ_INT(bad, 0);
  int compiled = 0;
  CHECK_EQ_INT(tf_compile_candidates(&canon, "cat rank 5 qkv", &compiled), 0);
  CHECK(compiled > 0);
}

static void test_cost(void) {
  rope(FM_DT_BF16);
  CHECK_EQ_INT(tf_finish(&raw, &canon), FM_OK);
  /* neg, cat, mul, mul, add, and the neg again in the cat's first branch */
  CHECK_EQ_INT(fm_codegen_cost(&canon), 6);
  three_middle();
  CHECK_EQ_INT(tf_finish(&raw, &canon), FM_OK);
  CHECK_EQ_INT(fm_codegen_cost(&canon), 2 + 1 + 2); /* exp (2), cat, exp again */
}

int main(void) {
  RUN(test_reference_rope);
  RUN(test_reference_three_middle);
  RUN(test_reference_computed);
  RUN(test_compiles);
  RUN(test_rope_units);
  RUN(test_pad_vectorised);
  RUN(test_units_unless_straddling);
  RUN(test_rank5_qkv);
  RUN(test_cost);
  return FM_TEST_DONE();
}
