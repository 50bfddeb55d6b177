/* test_codegen_rows_ref.c: the CPU reference on row fragments against values computed by
 * hand: softmax of [1, 2, 3], layer_norm and rms_norm of known rows, every statistic with
 * var's correction 0 and 1, per-row broadcast, keepdim=false outputs and a symbolic dim 0. */
#include <math.h>
#include <string.h>

#include "fm_reference.h"
#include "fm_test.h"
#include "test_codegen_frag.h"
#include "test_codegen_rows_frag.h"

static fm_fragment raw, canon;

static int close_to(double got, double want) { return fabs(got - want) <= 1e-6 * (1 + fabs(want)); }

#define CHECK_ROW(got, ...)                                                                               \
  do {                                                                                                    \
    const double want_[] = {__VA_ARGS__};                                                                 \
    for (size_t i_ = 0; i_ < sizeof want_ / sizeof want_[0]; i_++) CHECK(close_to((got)[i_], want_[i_])); \
  } while (0)

static void test_softmax_123(void) {
  int64_t x[2] = {2, 3};
  float in[6] = {1, 2, 3, 1, 1, 1}, out[6];
  tf_init(&raw);
  tf_input(&raw, 0, FM_DT_F32, 2, x, NULL, 4);
  rf_composite(&raw, FM_OP_SOFTMAX, 1, 1, 0, 0, 0, 0);
  tf_output(&raw, 1, FM_DT_F32, 2, x, NULL, 4);
  CHECK_EQ_INT(rf_finish(&raw, &canon), FM_OK);
  const void *ins[1] = {in};
  void *outs[1] = {out};
  fm_diag d = {{0}};
  CHECK_EQ_INT(fm_reference_eval(&canon, 0, ins, outs, &d), FM_OK);
  /* e^(x - 3) / (e^-2 + e^-1 + 1) */
  CHECK_ROW(out, 0.0900305732, 0.2447284711, 0.6652409558, 1 / 3.0, 1 / 3.0, 1 / 3.0);
}

static void test_layer_norm_known_row(void) {
  int64_t x[2] = {-1, 4}, w[2] = {1, 4};
  float in[8] = {1, 2, 3, 4, 4, 3, 2, 1}, wt[4] = {1, 1, 2, 2}, bs[4] = {0, 0, 0, 1}, out[8];
  tf_init(&raw);
  tf_input(&raw, 0, FM_DT_F32, 2, x, NULL, 4);
  tf_input(&raw, 1, FM_DT_F32, 2, w, NULL, 4);
  tf_input(&raw, 2, FM_DT_F32, 2, w, NULL, 4);
  rf_composite(&raw, FM_OP_LAYER_NORM, 3, 3, 0, 1, 2, 0.0);
  tf_output(&raw, 3, FM_DT_F32, 2, x, NULL, 4);
  CHECK_EQ_INT(rf_finish(&raw, &canon), FM_OK);
  const void *ins[3] = {in, wt, bs};
  void *outs[1] = {out};
  fm_diag d = {{0}};
  CHECK_EQ_INT(fm_reference_eval(&canon, 2, ins, outs, &d), FM_OK);
  /* mean 2.5, population var 1.25: (x - 2.5) / sqrt(1.25) * w + b */
  CHECK_ROW(out, -1.3416407865, -0.4472135955, 0.8944271910, 3.6832815730, 1.3416407865, 0.4472135955, -0.8944271910,
            -1.6832815730);
}

static void test_rms_norm_known_row(void) {
  int64_t x[1] = {2};
  float in[2] = {3, 4}, out[2];
  tf_init(&raw);
  tf_input(&raw, 0, FM_DT_F32, 1, x, NULL, 4);
  rf_composite(&raw, FM_OP_RMS_NORM, 1, 1, 0, 0, 0, 0.0);
  tf_output(&raw, 1, FM_DT_F32, 1, x, NULL, 4);
  CHECK_EQ_INT(rf_finish(&raw, &canon), FM_OK);
  const void *ins[1] = {in};
  void *outs[1] = {out};
  CHECK_EQ_INT(fm_reference_eval(&canon, 0, ins, outs, NULL), FM_OK);
  CHECK_ROW(out, 3 / sqrt(12.5), 4 / sqrt(12.5)); /* mean of squares 12.5 */
}

/* sum, mean, amax, var c=0, var c=1 of [1, 2, 3, 4] and of a one-element row; mean also
 * through a keepdim=false output; and a per-row value broadcast back along the row. */
static void test_statistics(void) {
  static const fm_op ops[5] = {FM_OP_SUM, FM_OP_MEAN, FM_OP_AMAX, FM_OP_VAR, FM_OP_VAR};
  int64_t x[2] = {1, 4}, s[2] = {1, 1}, flat[1] = {1};
  float in[4] = {1, 2, 3, 4}, st[5], mean_flat, centred[4];
  tf_init(&raw);
  tf_input(&raw, 0, FM_DT_F32, 2, x, NULL, 4);
  for (uint32_t i = 0; i < 5; i++) {
    rf_reduce(&raw, ops[i], 10 + i, 0, i == 4);
    tf_output(&raw, 10 + i, FM_DT_F32, 2, s, NULL, 4);
  }
  tf_output(&raw, 11, FM_DT_F32, 1, flat, NULL, 4);
  tf_op(&raw, FM_OP_SUB, 20, 2, 0, 11, 0);
  tf_output(&raw, 20, FM_DT_F32, 2, x, NULL, 4);
  CHECK_EQ_INT(rf_finish(&raw, &canon), FM_OK);
  CHECK_EQ_INT(canon.vocab, 2);
  CHECK_EQ_INT(canon.outputs[5].rank, 2); /* keepdim=false got its 1 back */
  const void *ins[1] = {in};
  void *outs[7] = {&st[0], &st[1], &st[2], &st[3], &st[4], &mean_flat, centred};
  fm_diag d = {{0}};
  CHECK_EQ_INT(fm_reference_eval(&canon, 0, ins, outs, &d), FM_OK);
  CHECK_ROW(st, 10, 2.5, 4, 1.25, 5 / 3.0);
  CHECK(mean_flat == 2.5f);
  CHECK_ROW(centred, -1.5, -0.5, 0.5, 1.5);

  /* N = 1: var with correction 1 divides 0 by 0 (NaN, as torch); correction 0 gives 0 */
  int64_t one[2] = {1, 1};
  float x1 = 7, v0 = -1, v1 = -1;
  tf_init(&raw);
  tf_input(&raw, 0, FM_DT_F32, 2, one, NULL, 4);
  rf_reduce(&raw, FM_OP_VAR, 1, 0, 0);
  rf_reduce(&raw, FM_OP_VAR, 2, 0, 1);
  tf_output(&raw, 1, FM_DT_F32, 2, one, NULL, 4);
  tf_output(&raw, 2, FM_DT_F32, 2, one, NULL, 4);
  CHECK_EQ_INT(rf_finish(&raw, &canon), FM_OK);
  const void *ins1[1] = {&x1};
  void *outs1[2] = {&v0, &v1};
  CHECK_EQ_INT(fm_reference_eval(&canon, 0, ins1, outs1, &d), FM_OK);
  CHECK(v0 == 0.0f);
  CHECK(isnan(v1));
}

/* amax propagates NaN; a per-row [-1, 1] input scales its own row. */
static void test_nan_and_per_row_input(void) {
  int64_t x[2] = {-1, 3}, s[2] = {-1, 1};
  float in[6] = {1, NAN, 3, 1, 5, 2}, sc[2] = {10, 100}, out[2], scaled[6];
  tf_init(&raw);
  tf_input(&raw, 0, FM_DT_F32, 2, x, NULL, 4);
  tf_input(&raw, 1, FM_DT_F32, 2, s, NULL, 4);
  rf_reduce(&raw, FM_OP_AMAX, 2, 0, 0);
  tf_op(&raw, FM_OP_MUL, 3, 2, 0, 1, 0);
  tf_output(&raw, 2, FM_DT_F32, 2, s, NULL, 4);
  tf_output(&raw, 3, FM_DT_F32, 2, x, NULL, 4);
  CHECK_EQ_INT(rf_finish(&raw, &canon), FM_OK);
  const void *ins[2] = {in, sc};
  void *outs[2] = {out, scaled};
  CHECK_EQ_INT(fm_reference_eval(&canon, 2, ins, outs, NULL), FM_OK);
  CHECK(isnan(out[0]));
  CHECK(out[1] == 5.0f);
  CHECK(scaled[0] == 10.0f && scaled[3] == 100.0f && scaled[4] == 500.0f);
}

/* A streamed row (longer than registers hold): log_softmax of the padded-logits fragment on
 * a row of 50257 equal values is -log(50257) everywhere, and the padding is never read. */
static void test_long_row(void) {
  enum { N = 50257, STRIDE = 50304 };
  static uint16_t in[2 * STRIDE];
  static float out[2 * N];
  for (int i = 0; i < 2 * STRIDE; i++) in[i] = fm_reference_f32_to_bf16(i % STRIDE < N ? (float)(i / STRIDE) : NAN);
  CHECK_EQ_INT(rf_fragment(7, &canon), FM_OK);
  const void *ins[1] = {in};
  void *outs[1] = {out};
  CHECK_EQ_INT(fm_reference_eval(&canon, 2, ins, outs, NULL), FM_OK);
  CHECK(close_to(out[0], -log(50257.0)) && close_to(out[N - 1], -log(50257.0)));
  CHECK(close_to(out[N], -log(50257.0)) && close_to(out[2 * N - 1], -log(50257.0)));
}

/* The reference holds one row of every value in fp64: a fragment whose row set would pass
 * 1 GiB (140 values of a 2^20-element row) is refused before anything is allocated or read. */
static void test_row_set_cap(void) {
  int64_t x[2] = {1, 1 << 20}, s1[2] = {1, 1};
  tf_init(&raw);
  tf_input(&raw, 0, FM_DT_F32, 2, x, NULL, 4);
  uint32_t last = 0;
  for (uint32_t i = 0; i < 138; i++, last = 10 + i - 1) tf_op(&raw, FM_OP_ADD, 10 + i, 2, last, 0, 0);
  rf_reduce(&raw, FM_OP_SUM, 500, last, 0);
  tf_output(&raw, 500, FM_DT_F32, 2, s1, NULL, 4);
  CHECK_EQ_INT(rf_finish(&raw, &canon), FM_OK);
  float in = 0, out = 0;
  const void *ins[1] = {&in};
  void *outs[1] = {&out};
  fm_diag d = {{0}};
  CHECK_EQ_INT(fm_reference_eval(&canon, 1, ins, outs, &d), FM_ELIMIT);
  CHECK_STR_CONTAINS(d.text, "exceed 1 GiB");
}

int main(void) {
  RUN(test_softmax_123);
  RUN(test_row_set_cap);
  RUN(test_long_row);
  RUN(test_layer_norm_known_row);
  RUN(test_rms_norm_known_row);
  RUN(test_statistics);
  RUN(test_nan_and_per_row_input);
  return FM_TEST_DONE();
}
