/* test_codegen_window.c: the window ops (vocabulary 7: max_pool2d, its argmax and its
 * backward): the CPU reference against a brute force written here (the forward and the argmax
 * by the definition, the backward as PyTorch computes it: each window's gradient scattered to
 * its argmax) on
 * channels-last inputs holding NaN, ties, -inf, over padding, dilation 2, ceil_mode, strides 1
 * and 3 and a 2x3 kernel; the generated source (goldens: ResNet's stem max pool, channels-last
 * bf16 with its argmax, and its backward); NVRTC compiles of every candidate; the compile cost; the element
 * decomposition that follows the output's memory order; the sampled reference's cut. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fm_codegen.h"
#include "fm_reference.h"
#include "fm_reference_sample.h"
#include "fm_test.h"
#include "test_codegen_frag.h"

static fm_fragment raw, canon;

typedef struct pool_case {
  const char *name;
  int64_t nchw[4];
  int32_t window[8]; /* kh, kw, sh, sw, ph, pw, dh, dw */
  int ceil_mode, channels_last;
} pool_case;

static const pool_case cases[] = {
    {"3x3 s2 p1", {2, 3, 7, 7}, {3, 3, 2, 2, 1, 1, 1, 1}, 0, 1},
    {"2x3 s1x3 p1 d2x1 ceil", {2, 3, 9, 10}, {2, 3, 1, 3, 1, 1, 2, 1}, 1, 1},
    {"3x3 s3 p1 d2 ceil", {1, 4, 11, 8}, {3, 3, 3, 3, 1, 1, 2, 2}, 1, 1},
    {"2x2 s2 row-major", {2, 2, 5, 6}, {2, 2, 2, 2, 0, 0, 1, 1}, 0, 0},
    {"3x2 s1 p1x0 ceil", {1, 2, 6, 5}, {3, 2, 1, 1, 1, 0, 1, 1}, 1, 1},
};

/* Element (n, c, h, w) of x [N, C, H, W] channels-last or row-major. */
static int64_t at(const int64_t *s, int cl, int64_t n, int64_t c, int64_t h, int64_t w) {
  return cl ? ((n * s[2] + h) * s[3] + w) * s[1] + c : ((n * s[1] + c) * s[2] + h) * s[3] + w;
}

/* x's values: a small set, so windows tie; NaN and -inf sprinkled (a window of -inf only
 * included: its forward is -inf and its first in-bounds tap takes the gradient). */
static float x_value(int64_t i) {
  static const float v[] = {1.0f, -2.0f, 3.0f, 3.0f, 0.5f, -1.0f, 3.0f, 2.0f, -INFINITY, 0.0f, 1.0f, NAN, 2.5f};
  return i % 29 == 5 ? NAN : v[(i * 7 + i / 5) % 13];
}

/* Brute force of one case: y (the forward), each window's argmax tap index, and gx (the
 * backward: each window's gradient scattered to its argmax, as PyTorch does) over the shapes. */
static void brute(const pool_case *pc, const float *x, const float *gy, float *y, float *taps, double *gx, int64_t oh_n,
                  int64_t ow_n) {
  const int64_t *s = pc->nchw;
  const int32_t *w = pc->window;
  int64_t py[4] = {s[0], s[1], oh_n, ow_n};
  for (int64_t i = 0; i < s[0] * s[1] * s[2] * s[3]; i++) gx[i] = 0;
  for (int64_t n = 0; n < s[0]; n++)
    for (int64_t c = 0; c < s[1]; c++)
      for (int64_t oh = 0; oh < oh_n; oh++)
        for (int64_t ow = 0; ow < ow_n; ow++) {
          float m = -INFINITY;
          int64_t best = -1, tap = -1;
          for (int i = 0; i < w[0]; i++)
            for (int j = 0; j < w[1]; j++) {
              int64_t h = oh * w[2] - w[4] + i * w[6], ww = ow * w[3] - w[5] + j * w[7];
              if (h < 0 || h >= s[2] || ww < 0 || ww >= s[3]) continue;
              int64_t k = at(s, pc->channels_last, n, c, h, ww);
              if (best < 0) best = k, tap = i * w[1] + j;
              if (x[k] > m || isnan(x[k])) m = x[k], best = k, tap = i * w[1] + j;
            }
          const int64_t o = at(py, pc->channels_last, n, c, oh, ow);
          y[o] = m;
          taps[o] = (float)tap;
          if (best >= 0) gx[best] += gy[o]; /* ascending (oh, ow) per element */
        }
}

static int same(double got, double want) {
  if (isnan(want)) return isnan(got);
  if (isinf(want)) return got == want;
  return fabs(got - want) <= 1e-6 * fabs(want) + 1e-7;
}

static void test_reference(void) {
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    const pool_case *pc = &cases[k];
    const int64_t *s = pc->nchw, nx = s[0] * s[1] * s[2] * s[3];
    const int64_t oh = fm_window_pooled(s[2], pc->window, 0, pc->ceil_mode);
    const int64_t ow = fm_window_pooled(s[3], pc->window, 1, pc->ceil_mode), ny = s[0] * s[1] * oh * ow;
    float *x = malloc((size_t)nx * sizeof *x), *gy = malloc((size_t)ny * sizeof *gy);
    float *y = malloc((size_t)ny * sizeof *y), *want_y = malloc((size_t)ny * sizeof *y);
    float *want_taps = malloc((size_t)ny * sizeof *want_taps), *gx = malloc((size_t)nx * sizeof *gx);
    uint16_t *taps = malloc((size_t)ny * sizeof *taps); /* f16, as the client stores them */
    double *want_gx = malloc((size_t)nx * sizeof *want_gx);
    for (int64_t i = 0; i < nx; i++) x[i] = x_value(i);
    for (int64_t i = 0; i < ny; i++) gy[i] = 0.25f * (float)(i % 9) - 1.0f;
    brute(pc, x, gy, want_y, want_taps, want_gx, oh, ow);
    fm_diag d = {{0}};
    CHECK_EQ_INT(tf_max_pool(&raw, &canon, FM_DT_F32, s, pc->window, pc->ceil_mode, pc->channels_last, TF_POOL_ARGMAX),
                 FM_OK);
    const void *in1[1] = {x};
    void *o1[2] = {y, taps};
    CHECK_EQ_INT(fm_reference_eval(&canon, 0, in1, o1, &d), FM_OK);
    CHECK_EQ_INT(
        tf_max_pool(&raw, &canon, FM_DT_F32, s, pc->window, pc->ceil_mode, pc->channels_last, TF_POOL_BACKWARD), FM_OK);
    const void *in2[2] = {gy, taps};
    void *o2[1] = {gx};
    CHECK_EQ_INT(fm_reference_eval(&canon, 0, in2, o2, &d), FM_OK);
    int bad = 0, nan_y = 0, inf_y = 0, hit = 0;
    for (int64_t i = 0; i < ny; i++) {
      bad += !same(y[i], want_y[i]) + !same(fm_reference_f16_to_f32(taps[i]), want_taps[i]);
      nan_y += isnan(want_y[i]);
      inf_y += isinf(want_y[i]);
    }
    for (int64_t i = 0; i < nx; i++) {
      bad += !same(gx[i], (float)want_gx[i]);
      hit += want_gx[i] != 0;
    }
    if (bad) fprintf(stderr, "  %s: %d mismatches\n", pc->name, bad);
    CHECK_EQ_INT(bad, 0);
    CHECK(nan_y > 0 && hit > 0); /* the data reach NaN windows and argmaxes */
    if (k == 0) CHECK(inf_y == 0);
    /* the verification inputs' tap indices: each in [0, kh * kw), several distinct */
    void *in3[2] = {gy, taps};
    CHECK_EQ_INT(fm_reference_window_taps(&canon, 0, 7, in3), FM_OK);
    int out_of_range = 0, zeros = 0;
    for (int64_t i = 0; i < ny; i++) {
      const float t = fm_reference_f16_to_f32(taps[i]);
      out_of_range += t < 0 || t >= (float)(pc->window[0] * pc->window[1]) || t != (float)(int)t;
      zeros += t == 0;
    }
    CHECK(out_of_range == 0 && zeros < ny);
    free(x), free(gy), free(y), free(want_y), free(want_taps), free(gx), free(taps), free(want_gx);
  }
}

/* A window of -inf only: the forward is -inf and the first in-bounds tap (not padding) is its
 * argmax; 2x2 s2 p1 over a 2x2 input of -inf with one finite value. */
static void test_reference_neg_inf(void) {
  static const int64_t s[4] = {1, 1, 2, 2};
  static const int32_t w[8] = {2, 2, 2, 2, 1, 1, 1, 1};
  float x[4] = {-INFINITY, -INFINITY, -INFINITY, 5.0f}, y[4];
  uint16_t taps[4];
  fm_diag d = {{0}};
  CHECK_EQ_INT(tf_max_pool(&raw, &canon, FM_DT_F32, s, w, 0, 0, TF_POOL_ARGMAX), FM_OK);
  const void *in1[1] = {x};
  void *o1[2] = {y, taps};
  CHECK_EQ_INT(fm_reference_eval(&canon, 0, in1, o1, &d), FM_OK);
  /* windows: (0,0) taps x[0] at its tap 3; (0,1) x[1] at tap 2; (1,0) x[2] at 1; (1,1) x[3] at 0 */
  CHECK(isinf(y[0]) && y[0] < 0 && isinf(y[1]) && isinf(y[2]) && y[3] == 5.0f);
  CHECK(fm_reference_f16_to_f32(taps[0]) == 3 && fm_reference_f16_to_f32(taps[1]) == 2 &&
        fm_reference_f16_to_f32(taps[2]) == 1 && fm_reference_f16_to_f32(taps[3]) == 0);
}

/* The backward routes a window's gradient to the tap its argmax names, and nowhere when that
 * tap is padding or no tap: one 2x2 s2 p1 window row over x [1, 1, 2, 2]. */
static void test_reference_routes_by_tap(void) {
  static const int64_t s[4] = {1, 1, 2, 2};
  static const int32_t w[8] = {2, 2, 2, 2, 1, 1, 1, 1};
  /* window (0, 0) covers x[0] only, at tap 3; (1, 1) covers x[3] only, at tap 0 */
  static const float names[4][4] = {{3, 0, 0, 0}, {0, 0, 0, 0}, {9, 2, 1, 0}, {-1, 2, 1, 5}};
  static const float want[4][4] = {{1, 0, 0, 8}, {0, 0, 0, 8}, {0, 2, 4, 8}, {0, 2, 4, 0}};
  float gy[4] = {1, 2, 4, 8}, gx[4];
  fm_diag d = {{0}};
  CHECK_EQ_INT(tf_max_pool(&raw, &canon, FM_DT_F32, s, w, 0, 0, TF_POOL_BACKWARD), FM_OK);
  for (int k = 0; k < 4; k++) {
    uint16_t taps[4];
    for (int i = 0; i < 4; i++) taps[i] = fm_reference_f32_to_f16(names[k][i]);
    const void *in[2] = {gy, taps};
    void *o[1] = {gx};
    CHECK_EQ_INT(fm_reference_eval(&canon, 0, in, o, &d), FM_OK);
    for (int i = 0; i < 4; i++) CHECK(gx[i] == want[k][i]);
  }
}

/* ResNet's stem (channels-last bf16 [-1, 64, 12, 12], 3x3 s2 p1): golden sources, every
 * candidate through NVRTC, the metadata; one element a thread a step. */
static void test_goldens(void) {
  static const int64_t stem[4] = {-1, 64, 12, 12};
  static const int32_t window[8] = {3, 3, 2, 2, 1, 1, 1, 1};
  static const char *const names[2] = {"pointwise_max_pool_stem", "pointwise_max_pool_stem_backward"};
  for (int b = 0; b < 2; b++) {
    CHECK_EQ_INT(tf_max_pool(&raw, &canon, FM_DT_BF16, stem, window, 0, 1, b ? TF_POOL_BACKWARD : TF_POOL_ARGMAX),
                 FM_OK);
    CHECK_EQ_INT(canon.vocab, 7);
    char *src = NULL;
    fm_kernel_meta m;
    fm_diag d = {{0}};
    CHECK_EQ_INT(fm_codegen_pointwise(&canon, NULL, 132, &src, &m, &d), FM_OK);
    CHECK(src && tf_golden(names[b], src));
    /* channels-last: the channel (stride 1) is the fastest coordinate */
    CHECK(src && strstr(src, "const long long c1 = (long long)(r % 64u);"));
    CHECK(src && strstr(src, "const long long c1") < strstr(src, "const long long c3"));
    CHECK(strcmp(m.kind, "pointwise") == 0 && strcmp(m.grid_rule, "elementwise") == 0);
    CHECK_EQ_INT((int)m.inner, b ? 64 * 12 * 12 : 64 * 6 * 6);
    CHECK(m.outer == -1 && m.n_inputs == (uint32_t)(1 + b) && m.n_outputs == (uint32_t)(2 - b));
    free(src);
    int compiled = 0;
    CHECK_EQ_INT(tf_compile_candidates(&canon, names[b], &compiled), 0);
    CHECK(compiled > 0);
  }
}

/* Every case above (f32, f16) compiles too: dilation, ceil_mode, row-major. */
static void test_cases_compile(void) {
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
    for (int b = 0; b < 2; b++) {
      const pool_case *pc = &cases[k];
      CHECK_EQ_INT(tf_max_pool(&raw, &canon, b ? FM_DT_F16 : FM_DT_F32, pc->nchw, pc->window, pc->ceil_mode,
                               pc->channels_last, b ? TF_POOL_BACKWARD : TF_POOL_ARGMAX),
                   FM_OK);
      char *src = NULL;
      fm_kernel_meta m;
      fm_diag d = {{0}};
      CHECK_EQ_INT(fm_codegen_pointwise(&canon, NULL, 132, &src, &m, &d), FM_OK);
      free(src);
    }
  const pool_case *pc = &cases[1];
  CHECK_EQ_INT(tf_max_pool(&raw, &canon, FM_DT_F32, pc->nchw, pc->window, 1, 1, TF_POOL_BACKWARD), FM_OK);
  CHECK_EQ_INT(tf_compile_candidates(&canon, "max_pool2d_backward dilated ceil", NULL), 0);
}

/* A window op costs a unit per tap; the backward one per window covering an element. */
static void test_cost(void) {
  static const int64_t s[4] = {2, 8, 16, 16};
  static const int32_t stem[8] = {3, 3, 2, 2, 1, 1, 1, 1}, big[8] = {64, 64, 1, 1, 0, 0, 1, 1};
  CHECK_EQ_INT(tf_max_pool(&raw, &canon, FM_DT_BF16, s, stem, 0, 1, TF_POOL_FORWARD), FM_OK);
  const uint32_t pool = fm_codegen_cost(&canon);
  CHECK(pool >= 9);
  CHECK_EQ_INT(tf_max_pool(&raw, &canon, FM_DT_BF16, s, stem, 0, 1, TF_POOL_ARGMAX), FM_OK);
  CHECK(fm_codegen_cost(&canon) >= pool + 9); /* the argmax's taps too */
  CHECK_EQ_INT(tf_max_pool(&raw, &canon, FM_DT_BF16, s, stem, 0, 1, TF_POOL_BACKWARD), FM_OK);
  CHECK(fm_codegen_cost(&canon) >= 2 * 2 && fm_codegen_cost(&canon) < pool); /* ceil(3 / 2) windows per dim */
  static const int64_t wide[4] = {1, 1, 64, 64};
  CHECK_EQ_INT(tf_max_pool(&raw, &canon, FM_DT_F32, wide, big, 0, 0, TF_POOL_FORWARD), FM_OK);
  CHECK(fm_codegen_cost(&canon) >= 64 * 64);
}

/* The tuner's sampled reference cuts only the dims before the pooled two (a block keeps whole
 * planes, so every tap of its windows is in it). */
static void test_sample_cut(void) {
  static const int64_t resnet[4] = {-1, 64, 112, 112};
  static const int32_t stem[8] = {3, 3, 2, 2, 1, 1, 1, 1};
  for (int b = 0; b < 2; b++) {
    CHECK_EQ_INT(tf_max_pool(&raw, &canon, FM_DT_BF16, resnet, stem, 0, 1, b ? TF_POOL_BACKWARD : TF_POOL_ARGMAX),
                 FM_OK);
    fm_sample s;
    fm_sample_choose(&canon, 64, 1, &s);
    CHECK(s.n > 0 && s.cut >= 1 && s.cut <= 2);
  }
}

int main(void) {
  RUN(test_reference);
  RUN(test_reference_neg_inf);
  RUN(test_reference_routes_by_tap);
  RUN(test_goldens);
  RUN(test_cases_compile);
  RUN(test_cost);
  RUN(test_sample_cut);
  return FM_TEST_DONE();
}
