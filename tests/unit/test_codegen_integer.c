/* test_codegen_integer.c: integer values (vocabulary 10) in the pointwise template: the CPU
 * reference against labels prepared by hand (the ignore_index test, floor division of
 * negative numbers, true division), the labels the verifier fills in, the generated source
 * (golden: a language model's label preparation), and every candidate through NVRTC. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fm_codegen.h"
#include "fm_reference.h"
#include "fm_test.h"
#include "test_codegen_frag.h"

static fm_fragment raw, canon;

/* A causal language model's labels [b, s] (a view of the padded [b, s + 1]): keep = y !=
 * -100, in = 0 <= y < vocab (the range check's operand), the labels as f32 with the ignored
 * ones 0 (what the loss reads), and y // 3 as i64. */
static int labels(int64_t b, int64_t s, double vocab) {
  const int64_t shape[2] = {b, s}, padded[2] = {s + 1, 1};
  tf_init(&raw);
  raw.vocab = FM_VOCAB_INTEGER;
  tf_input(&raw, 1, FM_DT_I64, 2, shape, padded, 8);
  tf_const(&raw, 2, -100);
  tf_op(&raw, FM_OP_NE, 3, 2, 1, 2, 0);
  tf_const(&raw, 4, 0);
  tf_op(&raw, FM_OP_GE, 5, 2, 1, 4, 0);
  tf_const(&raw, 6, vocab);
  tf_op(&raw, FM_OP_LT, 7, 2, 1, 6, 0);
  tf_op(&raw, FM_OP_MUL, 8, 2, 5, 7, 0);
  tf_cast(&raw, 9, 8, FM_DT_BOOL);
  tf_op(&raw, FM_OP_WHERE, 10, 3, 3, 1, 4);
  tf_cast(&raw, 11, 10, FM_DT_F32);
  tf_const(&raw, 12, 3);
  tf_op(&raw, FM_OP_FLOOR_DIV, 13, 2, 1, 12, 0);
  tf_output(&raw, 3, FM_DT_BOOL, 2, shape, NULL, 1);
  tf_output(&raw, 9, FM_DT_BOOL, 2, shape, NULL, 1);
  tf_output(&raw, 11, FM_DT_F32, 2, shape, NULL, 4);
  tf_output(&raw, 13, FM_DT_I64, 2, shape, NULL, 8);
  return tf_finish(&raw, &canon);
}

static void test_reference(void) {
  CHECK_EQ_INT(labels(2, 3, 5), FM_OK);
  CHECK_EQ_INT(canon.vocab, FM_VOCAB_INTEGER);
  /* [2, 4] padded rows, the last element of each the pad */
  const int64_t y[8] = {4, -100, 0, -100, 7, -7, -3, -100};
  uint8_t keep[6], in[6];
  float as_f32[6];
  int64_t third[6];
  const void *ins[1] = {y};
  void *outs[4] = {keep, in, as_f32, third};
  fm_diag d = {{0}};
  CHECK_EQ_INT(fm_reference_eval(&canon, 0, ins, outs, &d), FM_OK);
  const uint8_t want_keep[6] = {1, 0, 1, 1, 1, 1}, want_in[6] = {1, 0, 1, 0, 0, 0};
  const float want_f32[6] = {4, 0, 0, 7, -7, -3};
  const int64_t want_third[6] = {1, -34, 0, 2, -3, -1}; /* toward -inf, as torch's floor_divide */
  for (int i = 0; i < 6; i++) {
    CHECK(keep[i] == want_keep[i] && in[i] == want_in[i]);
    CHECK(as_f32[i] == want_f32[i]);
    CHECK(third[i] == want_third[i]);
  }
}

/* The verifier's labels: small integers, each of the fragment's constants and a neighbour among
 * them, the padding element (outside the view) untouched. */
static void test_integer_inputs(void) {
  CHECK_EQ_INT(labels(4, 255, 32000), FM_OK);
  int64_t *y = calloc(4 * 256, sizeof *y);
  void *ins[1] = {y};
  fm_reference_integer_inputs(&canon, 0, 7, ins);
  int small = 1, seen[6] = {0};
  for (int r = 0; r < 4; r++) {
    CHECK(y[r * 256 + 255] == 0);
    for (int c = 0; c < 255; c++) {
      const int64_t v = y[r * 256 + c];
      small = small && ((v >= -1024 && v <= 1024) || (v >= 31999 && v <= 32001));
      seen[0] |= v == -100, seen[1] |= v == -101, seen[2] |= v == 0, seen[3] |= v == 31999, seen[4] |= v == 32000;
      seen[5] |= v < -200;
    }
  }
  CHECK(small && seen[0] && seen[1] && seen[2] && seen[3] && seen[4] && seen[5]);
  free(y);
}

static void test_goldens(void) {
  CHECK_EQ_INT(labels(8, 512, 32000), FM_OK);
  fm_candidate def;
  fm_diag d = {{0}};
  CHECK_EQ_INT(fm_codegen_default(&canon, &def, &d), FM_OK);
  char *src = NULL;
  fm_kernel_meta m;
  CHECK_EQ_INT(fm_codegen_generate(&canon, &def, 132, &src, &m, &d), FM_OK);
  CHECK(src && tf_golden("integer_labels", src));
  CHECK(src && strstr(src, "const long long v0 = i0;") && strstr(src, "(-100LL)") && strstr(src, "vec 1,"));
  CHECK(strcmp(m.kind, "pointwise") == 0 && m.n_inputs == 1 && m.n_outputs == 4);
  free(src);
  int compiled = 0;
  CHECK_EQ_INT(tf_compile_candidates(&canon, "integer labels", &compiled), 0);
  CHECK(compiled > 0);
}

int main(void) {
  RUN(test_reference);
  RUN(test_integer_inputs);
  RUN(test_goldens);
  return FM_TEST_DONE();
}
