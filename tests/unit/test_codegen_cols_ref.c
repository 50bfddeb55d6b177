/* test_codegen_cols_ref.c: the CPU reference on column fragments against values computed by
 * hand: sum, mean and amax over dim 0, a prologue with per-column and per-row inputs, an
 * epilogue after the reductions, a symbolic M, M = 0, NaN through amax, and a padded,
 * column-major layout. */
#include <math.h>
#include <string.h>

#include "fm_reference.h"
#include "fm_test.h"
#include "test_codegen_cols_frag.h"
#include "test_codegen_frag.h"

static fm_fragment raw, canon;

static int close_to(double got, double want) {
  return (isnan(want) && isnan(got)) || got == want || fabs(got - want) <= 1e-6 * (1 + fabs(want));
}

#define CHECK_COLS(got, ...)                                                                              \
  do {                                                                                                    \
    const double want_[] = {__VA_ARGS__};                                                                 \
    for (size_t i_ = 0; i_ < sizeof want_ / sizeof want_[0]; i_++) CHECK(close_to((got)[i_], want_[i_])); \
  } while (0)

/* x [M, 2] f32 (symbolic M): sum, mean, amax, each to an output of its own. */
static void statistics(int64_t m, const float *x, float out[3][2]) {
  static const fm_op ops[3] = {FM_OP_SUM, FM_OP_MEAN, FM_OP_AMAX};
  int64_t xs[2] = {-1, 2}, o[2] = {1, 2};
  tf_init(&raw);
  tf_input(&raw, 0, FM_DT_F32, 2, xs, NULL, 4);
  for (uint32_t i = 0; i < 3; i++) {
    cf_reduce(&raw, ops[i], 1 + i, 0);
    tf_output(&raw, 1 + i, FM_DT_F32, 2, o, NULL, 4);
  }
  CHECK_EQ_INT(tf_finish(&raw, &canon), FM_OK);
  const void *ins[1] = {x};
  void *outs[3] = {out[0], out[1], out[2]};
  fm_diag d = {{0}};
  CHECK_EQ_INT(fm_reference_eval(&canon, m, ins, outs, &d), FM_OK);
}

static void test_statistics(void) {
  const float x[6] = {1, 2, 3, 4, 5, -6}; /* [[1, 2], [3, 4], [5, -6]] */
  float out[3][2];
  statistics(3, x, out);
  CHECK_COLS(out[0], 9, 0);
  CHECK_COLS(out[1], 3, 0);
  CHECK_COLS(out[2], 5, 4);
  statistics(1, x, out); /* the first row alone */
  CHECK_COLS(out[0], 1, 2);
  CHECK_COLS(out[2], 1, 2);
  const float nan_row[4] = {1, NAN, 7, 3};
  statistics(2, nan_row, out);
  CHECK_COLS(out[2], 7, NAN); /* amax propagates NaN, as torch.amax */
  CHECK_COLS(out[0], 8, NAN);
  /* M = 0: sum 0, mean 0 / 0 (NaN, as torch), amax -inf */
  statistics(0, x, out);
  CHECK_COLS(out[0], 0, 0);
  CHECK_COLS(out[1], NAN, NAN);
  CHECK_COLS(out[2], -INFINITY, -INFINITY);
}

/* (g * s * r).sum(0) with a per-column s [3] and a per-row r [M, 1], then + b and a cast;
 * the f32 sum a second output. */
static void test_prologue_epilogue(void) {
  int64_t g[2] = {-1, 3}, s[1] = {3}, r[2] = {-1, 1}, o[2] = {1, 3};
  const float gv[6] = {1, 2, 3, 4, 5, 6}, sv[3] = {1, 10, 100}, rv[2] = {2, -1}, bv[3] = {0.5f, 0, -1};
  float sum[3];
  uint16_t cast[3];
  tf_init(&raw);
  tf_input(&raw, 0, FM_DT_F32, 2, g, NULL, 4);
  tf_input(&raw, 1, FM_DT_F32, 1, s, NULL, 4);
  tf_input(&raw, 2, FM_DT_F32, 2, r, NULL, 4);
  tf_input(&raw, 3, FM_DT_F32, 1, s, NULL, 4); /* b */
  tf_op(&raw, FM_OP_MUL, 4, 2, 0, 1, 0);
  tf_op(&raw, FM_OP_MUL, 5, 2, 4, 2, 0);
  cf_reduce(&raw, FM_OP_SUM, 6, 5);
  tf_op(&raw, FM_OP_ADD, 7, 2, 6, 3, 0);
  tf_cast(&raw, 8, 7, FM_DT_BF16);
  tf_output(&raw, 8, FM_DT_BF16, 2, o, NULL, 2);
  tf_output(&raw, 6, FM_DT_F32, 1, s, NULL, 4);
  CHECK_EQ_INT(tf_finish(&raw, &canon), FM_OK);
  const void *ins[4] = {gv, sv, rv, bv};
  void *outs[2] = {cast, sum};
  fm_diag d = {{0}};
  CHECK_EQ_INT(fm_reference_eval(&canon, 2, ins, outs, &d), FM_OK);
  /* column n: s[n] * (2 * g[0][n] - g[1][n]) */
  CHECK_COLS(sum, -2, -10, 0);
  CHECK_EQ_INT(cast[0], fm_reference_f32_to_bf16(-1.5f));
  CHECK_EQ_INT(cast[1], fm_reference_f32_to_bf16(-10.0f));
  CHECK_EQ_INT(cast[2], fm_reference_f32_to_bf16(-1.0f));
}

/* A static, padded, column-major x [3, 2] (strides [1, 4]): the layout does not change the
 * sums; the mean divides by the static M. */
static void test_layout_static(void) {
  int64_t xs[2] = {3, 2}, st[2] = {1, 4}, o[2] = {1, 2};
  const float x[8] = {1, 3, 5, 99, 2, 4, -6, 99}; /* columns [1, 3, 5] and [2, 4, -6] */
  float mean[2];
  tf_init(&raw);
  tf_input(&raw, 0, FM_DT_F32, 2, xs, st, 4);
  cf_reduce(&raw, FM_OP_MEAN, 1, 0);
  tf_output(&raw, 1, FM_DT_F32, 2, o, NULL, 4);
  CHECK_EQ_INT(tf_finish(&raw, &canon), FM_OK);
  const void *ins[1] = {x};
  void *outs[1] = {mean};
  CHECK_EQ_INT(fm_reference_eval(&canon, 12345, ins, outs, NULL), FM_OK); /* outer ignored */
  CHECK_COLS(mean, 3, 0);
}

int main(void) {
  RUN(test_statistics);
  RUN(test_prologue_epilogue);
  RUN(test_layout_static);
  return FM_TEST_DONE();
}
