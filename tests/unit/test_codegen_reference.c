/* test_codegen_reference.c: the CPU reference evaluator against hand-computed values, and
 * its storage conversions (exhaustively for the 16-bit formats). */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "fm_reference.h"
#include "fm_test.h"
#include "test_codegen_frag.h"

static fm_fragment raw, canon;

static float from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static void test_bf16_conversions(void) {
  for (uint32_t h = 0; h < 65536; h++) {
    float f = fm_reference_bf16_to_f32((uint16_t)h);
    uint16_t back = fm_reference_f32_to_bf16(f);
    if (isnan(f))
      CHECK(isnan(fm_reference_bf16_to_f32(back)) && (back & 0x0040));
    else if (back != h)
      CHECK_EQ_INT(back, h);
  }
  CHECK_EQ_INT(fm_reference_f32_to_bf16(1.0f), 0x3f80);
  CHECK_EQ_INT(fm_reference_f32_to_bf16(from_bits(0x3f808000)), 0x3f80); /* tie -> even */
  CHECK_EQ_INT(fm_reference_f32_to_bf16(from_bits(0x3f818000)), 0x3f82); /* tie -> even */
  CHECK_EQ_INT(fm_reference_f32_to_bf16(from_bits(0x3f808001)), 0x3f81); /* above the tie */
  CHECK_EQ_INT(fm_reference_f32_to_bf16(from_bits(0x7f7fffff)), 0x7f80); /* FLT_MAX -> inf */
  /* a signalling NaN whose payload sits in the low bits stays a NaN (truncation would
   * make it inf) */
  CHECK_EQ_INT(fm_reference_f32_to_bf16(from_bits(0x7f800001)), 0x7fc0);
}

static void test_f16_conversions(void) {
  for (uint32_t h = 0; h < 65536; h++) {
    float f = fm_reference_f16_to_f32((uint16_t)h);
    uint16_t back = fm_reference_f32_to_f16(f);
    if (isnan(f))
      CHECK(isnan(fm_reference_f16_to_f32(back)));
    else if (back != h)
      CHECK_EQ_INT(back, h);
  }
  CHECK(fm_reference_f16_to_f32(0x3c00) == 1.0f);
  CHECK(fm_reference_f16_to_f32(0x7bff) == 65504.0f);
  CHECK(fm_reference_f16_to_f32(0x0001) == ldexpf(1.0f, -24));
  CHECK(fm_reference_f16_to_f32(0xc000) == -2.0f);
  CHECK_EQ_INT(fm_reference_f32_to_f16(65519.0f), 0x7bff);
  CHECK_EQ_INT(fm_reference_f32_to_f16(65520.0f), 0x7c00); /* tie at max -> inf */
  CHECK_EQ_INT(fm_reference_f32_to_f16(1e10f), 0x7c00);
  CHECK_EQ_INT(fm_reference_f32_to_f16(-1e10f), 0xfc00);
  CHECK_EQ_INT(fm_reference_f32_to_f16(ldexpf(1.0f, -25)), 0x0000); /* tie -> even 0 */
  CHECK_EQ_INT(fm_reference_f32_to_f16(ldexpf(1.5f, -25)), 0x0001);
  CHECK_EQ_INT(fm_reference_f32_to_f16(ldexpf(3.0f, -25)), 0x0002);        /* 1.5 ulp: tie -> 2 */
  CHECK_EQ_INT(fm_reference_f32_to_f16(1.0f + ldexpf(1.0f, -11)), 0x3c00); /* tie -> even */
  CHECK_EQ_INT(fm_reference_f32_to_f16(1.0f + 3 * ldexpf(1.0f, -11)), 0x3c02);
  CHECK_EQ_INT(fm_reference_f32_to_f16(ldexpf(1023.5f, -24)), 0x0400); /* rounds up to normal */
  CHECK_EQ_INT(fm_reference_f32_to_f16(-0.0f), 0x8000);
  CHECK(isinf(fm_reference_f64_to_f32(1e39)) && fm_reference_f64_to_f32(-1e39) < 0);
  CHECK(fm_reference_f64_to_f32((double)FLT_MAX * (1 + 1e-9)) == FLT_MAX);
  CHECK(isnan(fm_reference_f64_to_f32(NAN)));
}

/* out[i] = op(x[i]) for an f32 vector. */
static int eval_unary(fm_op op, const float *x, float *out, int n) {
  int64_t s[1] = {n};
  tf_init(&raw);
  tf_input(&raw, 1, FM_DT_F32, 1, s, NULL, 4);
  tf_op(&raw, op, 2, 1, 1, 0, 0);
  tf_output(&raw, 2, FM_DT_F32, 1, s, NULL, 4);
  if (tf_finish(&raw, &canon)) return -1;
  const void *in[1] = {x};
  void *o[1] = {out};
  fm_diag d;
  return fm_reference_eval(&canon, 0, in, o, &d);
}

static void test_unary_values(void) {
  static const struct {
    fm_op op;
    float x;
    double want;
  } cases[] = {
      {FM_OP_GELU, 1.0f, 0.8413447460685429},
      {FM_OP_GELU, -1.0f, -0.15865525393145707},
      {FM_OP_GELU_TANH, 1.0f, 0.8411919906082768},
      {FM_OP_SILU, 1.0f, 0.7310585786300049},
      {FM_OP_SIGMOID, 0.0f, 0.5},
      {FM_OP_SIGMOID, 2.0f, 0.8807970779778823},
      {FM_OP_TANH, 0.5f, 0.46211715726000974},
      {FM_OP_EXP, 1.0f, 2.718281828459045},
      {FM_OP_LOG, 2.0f, 0.6931471805599453},
      {FM_OP_SQRT, 2.0f, 1.4142135623730951},
      {FM_OP_RSQRT, 4.0f, 0.5},
      {FM_OP_RELU, -2.0f, 0.0},
      {FM_OP_RELU, 3.5f, 3.5},
      {FM_OP_NEG, 1.5f, -1.5},
      {FM_OP_ABS, -7.25f, 7.25},
      {FM_OP_EXP, 100.0f, INFINITY},
      {FM_OP_COS, 1.0f, 0.5403023058681398},
      {FM_OP_SIN, 1.0f, 0.8414709848078965},
      {FM_OP_COS, 1000.0f, 0.5623790762907029}, /* a rotary angle: range reduction */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    float out = -12345.0f;
    CHECK_EQ_INT(eval_unary(cases[i].op, &cases[i].x, &out, 1), FM_OK);
    if (out != (float)cases[i].want) {
      fprintf(stderr, "  %s(%g) = %.9g, want %.17g\n", fm_op_name(cases[i].op), cases[i].x, out, cases[i].want);
      CHECK(out == (float)cases[i].want);
    }
  }
  float nan = NAN, out = 0;
  CHECK_EQ_INT(eval_unary(FM_OP_RELU, &nan, &out, 1), FM_OK);
  CHECK(isnan(out)); /* relu propagates NaN like torch */
}

static void test_binary_nan_and_pow(void) {
  int64_t s[1] = {3};
  float a[3] = {NAN, 1.0f, 2.0f}, b[3] = {1.0f, NAN, 3.0f}, mx[3], mn[3], p[3];
  tf_init(&raw);
  tf_input(&raw, 1, FM_DT_F32, 1, s, NULL, 4);
  tf_input(&raw, 2, FM_DT_F32, 1, s, NULL, 4);
  tf_op(&raw, FM_OP_MAXIMUM, 3, 2, 1, 2, 0);
  tf_op(&raw, FM_OP_MINIMUM, 4, 2, 1, 2, 0);
  tf_const(&raw, 5, 1.5);
  tf_op(&raw, FM_OP_POW, 6, 2, 2, 5, 0);
  tf_output(&raw, 3, FM_DT_F32, 1, s, NULL, 4);
  tf_output(&raw, 4, FM_DT_F32, 1, s, NULL, 4);
  tf_output(&raw, 6, FM_DT_F32, 1, s, NULL, 4);
  CHECK_EQ_INT(tf_finish(&raw, &canon), FM_OK);
  const void *in[2] = {a, b};
  void *o[3] = {mx, mn, p};
  CHECK_EQ_INT(fm_reference_eval(&canon, 0, in, o, NULL), FM_OK);
  CHECK(isnan(mx[0]) && isnan(mx[1]) && mx[2] == 3.0f);
  CHECK(isnan(mn[0]) && isnan(mn[1]) && mn[2] == 2.0f);
  CHECK(p[0] == 1.0f && isnan(p[1]) && p[2] == (float)pow(3.0, 1.5));
  /* the special-cased exponents */
  static const double e[] = {0.5, -0.5, 3.0, -2.0};
  static const float want[] = {2.0f, 0.5f, 64.0f, 0.0625f};
  for (int i = 0; i < 4; i++) {
    int64_t one[1] = {1};
    float x = 4.0f, y = 0;
    tf_init(&raw);
    tf_input(&raw, 1, FM_DT_F32, 1, one, NULL, 4);
    tf_const(&raw, 2, e[i]);
    tf_op(&raw, FM_OP_POW, 3, 2, 1, 2, 0);
    tf_output(&raw, 3, FM_DT_F32, 1, one, NULL, 4);
    CHECK_EQ_INT(tf_finish(&raw, &canon), FM_OK);
    const void *xi[1] = {&x};
    void *yo[1] = {&y};
    CHECK_EQ_INT(fm_reference_eval(&canon, 0, xi, yo, NULL), FM_OK);
    CHECK(y == want[i]);
  }
}

/* x [-1, 3] with a padded row stride of 4, plus a bias [1, 3], into a dense output. */
static void test_broadcast_strides_symbolic(void) {
  int64_t xs[2] = {-1, 3}, xst[2] = {4, 1}, bs[2] = {1, 3};
  tf_init(&raw);
  tf_input(&raw, 1, FM_DT_F32, 2, xs, xst, 4);
  tf_input(&raw, 2, FM_DT_BF16, 2, bs, NULL, 2);
  tf_op(&raw, FM_OP_ADD, 3, 2, 1, 2, 0);
  tf_output(&raw, 3, FM_DT_F32, 2, xs, (int64_t[]){3, 1}, 4);
  CHECK_EQ_INT(tf_finish(&raw, &canon), FM_OK);
  float x[8] = {1, 2, 3, -999, 4, 5, 6, -999};
  uint16_t bias[3] = {fm_reference_f32_to_bf16(10), fm_reference_f32_to_bf16(20), fm_reference_f32_to_bf16(30)};
  float out[7];
  for (int i = 0; i < 7; i++) out[i] = -1;
  const void *in[2] = {x, bias};
  void *o[1] = {out};
  CHECK_EQ_INT(fm_reference_eval(&canon, 2, in, o, NULL), FM_OK);
  static const float want[6] = {11, 22, 33, 14, 25, 36};
  for (int i = 0; i < 6; i++) CHECK(out[i] == want[i]);
  CHECK(out[6] == -1); /* nothing past n = outer * inner */
  for (int i = 0; i < 7; i++) out[i] = -1;
  CHECK_EQ_INT(fm_reference_eval(&canon, 0, in, o, NULL), FM_OK); /* outer 0: nothing */
  CHECK(out[0] == -1);
  fm_diag d = {{0}};
  CHECK_EQ_INT(fm_reference_eval(&canon, -1, in, o, &d), FM_EINVAL);
  /* a transposed input: out[i][j] = x[j][i] */
  int64_t sq[2] = {2, 3};
  tf_init(&raw);
  tf_input(&raw, 1, FM_DT_F32, 2, sq, (int64_t[]){1, 2}, 4);
  tf_op(&raw, FM_OP_NEG, 2, 1, 1, 0, 0);
  tf_output(&raw, 2, FM_DT_F32, 2, sq, NULL, 4);
  CHECK_EQ_INT(tf_finish(&raw, &canon), FM_OK);
  float t[6] = {1, 2, 3, 4, 5, 6}; /* stored as a [3, 2] row-major matrix */
  const void *ti[1] = {t};
  CHECK_EQ_INT(fm_reference_eval(&canon, 0, ti, o, NULL), FM_OK);
  static const float want_t[6] = {-1, -3, -5, -2, -4, -6};
  for (int i = 0; i < 6; i++) CHECK(out[i] == want_t[i]);
}

/* t = x > 0; y = where(t, x, x * 0.01); z = cast(y, bf16); outputs y (f32), z (bf16), t. */
static void test_where_compare_cast_multi_output(void) {
  int64_t s[1] = {4};
  tf_init(&raw);
  tf_input(&raw, 1, FM_DT_F32, 1, s, NULL, 4);
  tf_const(&raw, 2, 0.0);
  tf_op(&raw, FM_OP_GT, 3, 2, 1, 2, 0);
  tf_const(&raw, 4, 0.01);
  tf_op(&raw, FM_OP_MUL, 5, 2, 1, 4, 0);
  tf_op(&raw, FM_OP_WHERE, 6, 3, 3, 1, 5);
  tf_cast(&raw, 7, 6, FM_DT_BF16);
  tf_output(&raw, 6, FM_DT_F32, 1, s, NULL, 4);
  tf_output(&raw, 7, FM_DT_BF16, 1, s, NULL, 2);
  tf_output(&raw, 3, FM_DT_BOOL, 1, s, NULL, 1);
  CHECK_EQ_INT(tf_finish(&raw, &canon), FM_OK);
  float x[4] = {-2.0f, 0.0f, 3.0f, from_bits(0x3f808000)}, y[4];
  uint16_t z[4];
  uint8_t t[4] = {7, 7, 7, 7};
  const void *in[1] = {x};
  void *o[3] = {y, z, t};
  CHECK_EQ_INT(fm_reference_eval(&canon, 0, in, o, NULL), FM_OK);
  CHECK(y[0] == (float)(-2.0 * (double)0.01f)); /* the const meets fp32 math as 0.01f */
  CHECK(y[1] == 0.0f && y[2] == 3.0f && y[3] == x[3]);
  CHECK_EQ_INT(t[0], 0);
  CHECK_EQ_INT(t[1], 0);
  CHECK_EQ_INT(t[2], 1);
  CHECK_EQ_INT(t[3], 1);
  CHECK_EQ_INT(z[2], 0x4040); /* 3.0 */
  CHECK_EQ_INT(z[3], 0x3f80); /* 1 + 2^-8 is a tie: to even */
  /* a cast rounds mid-chain: cast(x, f16) * 1 stored as f32 keeps the f16 rounding */
  tf_init(&raw);
  tf_input(&raw, 1, FM_DT_F32, 1, s, NULL, 4);
  tf_cast(&raw, 2, 1, FM_DT_F16);
  tf_cast(&raw, 3, 2, FM_DT_F32);
  tf_output(&raw, 3, FM_DT_F32, 1, s, NULL, 4);
  tf_output(&raw, 2, FM_DT_F16, 1, s, NULL, 2);
  CHECK_EQ_INT(tf_finish(&raw, &canon), FM_OK);
  float x2[4] = {1.0f + ldexpf(1.0f, -11), 65520.0f, 0.1f, -3.0f}, y2[4];
  uint16_t h[4];
  const void *in2[1] = {x2};
  void *o2[2] = {y2, h};
  CHECK_EQ_INT(fm_reference_eval(&canon, 0, in2, o2, NULL), FM_OK);
  CHECK(y2[0] == 1.0f);
  CHECK(isinf(y2[1]));
  CHECK(y2[2] == fm_reference_f16_to_f32(0x2e66)); /* 0.1 in f16 */
  CHECK(y2[3] == -3.0f);
  CHECK_EQ_INT(h[1], 0x7c00);
  CHECK_EQ_INT(h[2], 0x2e66);
}

/* An output's tolerance is its dtype's, or the coarsest cast behind it: the norm's backward
 * after a GEMM (f32 sum -> bf16 gradient -> f32 products) compares its f32 output at bf16's
 * 1e-2; an f32 chain with no cast keeps 1e-4, an f16 output behind a bf16 cast gets bf16's,
 * a cast that rounds finer than the output changes nothing, a bool stays exact. */
static void test_tolerance_follows_casts(void) {
  int64_t s[1] = {4};
  tf_init(&raw);
  tf_input(&raw, 1, FM_DT_F32, 1, s, NULL, 4);
  tf_input(&raw, 2, FM_DT_F32, 1, s, NULL, 4);
  tf_op(&raw, FM_OP_ADD, 3, 2, 1, 2, 0);         /* f32, no cast */
  tf_cast(&raw, 4, 3, FM_DT_BF16);               /* rounds to bf16 */
  tf_op(&raw, FM_OP_MUL, 5, 2, 4, 2, 0);         /* computed from it */
  tf_cast(&raw, 6, 3, FM_DT_F16);                /* rounds to f16, off the bf16 path */
  tf_op(&raw, FM_OP_GT, 7, 2, 4, 1, 0);          /* bool from the bf16 value */
  tf_cast(&raw, 8, 5, FM_DT_F16);                /* f16 behind bf16 */
  tf_cast(&raw, 9, 6, FM_DT_BF16);               /* bf16 behind f16 */
  tf_output(&raw, 3, FM_DT_F32, 1, s, NULL, 4);  /* 0: f32 without a cast */
  tf_output(&raw, 5, FM_DT_F32, 1, s, NULL, 4);  /* 1: f32 behind bf16 */
  tf_output(&raw, 8, FM_DT_F16, 1, s, NULL, 2);  /* 2: f16 behind bf16 */
  tf_output(&raw, 9, FM_DT_BF16, 1, s, NULL, 2); /* 3: bf16 behind f16 */
  tf_output(&raw, 7, FM_DT_BOOL, 1, s, NULL, 1); /* 4: bool */
  CHECK_EQ_INT(tf_finish(&raw, &canon), FM_OK);
  CHECK(fm_reference_tolerance(&canon, 0) == 1e-4);
  CHECK(fm_reference_tolerance(&canon, 1) == 1e-2);
  CHECK(fm_reference_tolerance(&canon, 2) == 1e-2);
  CHECK(fm_reference_tolerance(&canon, 3) == 1e-2);
  CHECK(fm_reference_tolerance(&canon, 4) == 0);
}

/* A GEMM's f32 output behind its bf16 product (GPT-2's hidden-state gradient: the padded
 * logits' gradient times the tied weight, plus the residual's gradient, cast to f32 for the
 * embedding's accumulation) compares at bf16's tolerance: the cuBLASLt split form rounds the
 * product to bf16 in its scratch, as eager's mm does, and was refused at f32's. The product's
 * own bf16 output keeps bf16's. */
static void test_tolerance_behind_a_product(void) {
  const int64_t a[2] = {32, 64}, b[2] = {64, 16}, mn[2] = {32, 16};
  tf_init(&raw);
  raw.vocab = 3; /* GEMM fragments */
  tf_input(&raw, 1, FM_DT_BF16, 2, a, NULL, 16);
  tf_input(&raw, 2, FM_DT_BF16, 2, b, NULL, 16);
  tf_input(&raw, 3, FM_DT_BF16, 2, mn, NULL, 16);
  tf_op(&raw, FM_OP_MM, 4, 2, 1, 2, 0);
  tf_op(&raw, FM_OP_ADD, 5, 2, 3, 4, 0);
  tf_cast(&raw, 6, 5, FM_DT_F32);
  tf_output(&raw, 6, FM_DT_F32, 2, mn, NULL, 16);
  CHECK_EQ_INT(tf_finish(&raw, &canon), FM_OK);
  CHECK(fm_reference_tolerance(&canon, 0) == 1e-2);
}

static void test_rank0_and_errors(void) {
  tf_init(&raw);
  tf_input(&raw, 1, FM_DT_F32, 0, NULL, NULL, 4);
  tf_op(&raw, FM_OP_EXP, 2, 1, 1, 0, 0);
  tf_output(&raw, 2, FM_DT_F32, 0, NULL, NULL, 4);
  CHECK_EQ_INT(tf_finish(&raw, &canon), FM_OK);
  float x = 2.0f, y = 0;
  const void *in[1] = {&x};
  void *o[1] = {&y};
  CHECK_EQ_INT(fm_reference_eval(&canon, 0, in, o, NULL), FM_OK);
  CHECK(y == (float)exp(2.0));
  void *none[1] = {NULL};
  fm_diag d = {{0}};
  CHECK_EQ_INT(fm_reference_eval(&canon, 0, in, none, &d), FM_EINVAL);
  CHECK_STR_CONTAINS(d.text, "outputs[0]");
  CHECK_EQ_INT(fm_reference_eval(NULL, 0, in, o, NULL), FM_EINVAL);
}

int main(void) {
  RUN(test_bf16_conversions);
  RUN(test_f16_conversions);
  RUN(test_unary_values);
  RUN(test_binary_nan_and_pow);
  RUN(test_broadcast_strides_symbolic);
  RUN(test_where_compare_cast_multi_output);
  RUN(test_tolerance_follows_casts);
  RUN(test_tolerance_behind_a_product);
  RUN(test_rank0_and_errors);
  return FM_TEST_DONE();
}
