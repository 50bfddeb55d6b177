/* test_codegen_iota.c: iota (vocabulary 11), the column index computed in the kernel: the CPU
 * reference against indices written by hand (a pointwise fragment at a padded stride, an i64
 * iota, a row fragment's picked logit), the verifier's columns for the targets, the reference sample that never cuts the last dim,
 * the generated source (golden: cross-entropy's gradient at GPT-2's odd vocabulary, its
 * column from one division a vector), and every candidate through NVRTC (pointwise by vectors
 * and by units, rows held and streamed). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fm_codegen.h"
#include "fm_reference.h"
#include "fm_reference_sample.h"
#include "fm_test.h"
#include "test_codegen_frag.h"

static fm_fragment raw, canon;

/* Cross-entropy's logits gradient, x [rows, cols] at row stride `stride`, t the target
 * column as f32 [rows, 1], w the row's weight: (exp(x) - [iota == t]) * w, in x's dtype
 * (lse folded into x here; the client's subtracts it first). */
static int ce_grad(fm_dtype dt, int64_t rows, int64_t cols, int64_t stride) {
  const int64_t shape[2] = {rows, cols}, padded[2] = {stride, 1}, per_row[2] = {rows, 1};
  tf_init(&raw);
  tf_input(&raw, 1, dt, 2, shape, padded, 16);
  tf_input(&raw, 2, FM_DT_F32, 2, per_row, NULL, 4);
  tf_input(&raw, 3, FM_DT_F32, 2, per_row, NULL, 4);
  tf_iota(&raw, 4, FM_DT_F32);
  tf_op(&raw, FM_OP_EQ, 5, 2, 4, 2, 0);
  tf_op(&raw, FM_OP_EXP, 6, 1, 1, 0, 0);
  tf_const(&raw, 7, 1.0);
  tf_op(&raw, FM_OP_SUB, 8, 2, 6, 7, 0);
  tf_op(&raw, FM_OP_WHERE, 9, 3, 5, 8, 6);
  tf_op(&raw, FM_OP_MUL, 10, 2, 9, 3, 0);
  tf_cast(&raw, 11, 10, dt);
  tf_output(&raw, 11, dt, 2, shape, NULL, 16);
  return tf_finish(&raw, &canon);
}

/* Cross-entropy's forward statistics over rows of `cols` (f32 logits [-1, cols]): the row's
 * max and the logit at the target column, sum(where(iota == t, x, 0)). */
static int ce_rows_at(int64_t cols, int64_t ld) {
  const int64_t shape[2] = {-1, cols}, per_row[2] = {-1, 1}, padded[2] = {ld, 1};
  tf_init(&raw);
  tf_input(&raw, 1, FM_DT_BF16, 2, shape, padded, 16);
  tf_input(&raw, 2, FM_DT_F32, 2, per_row, NULL, 4);
  tf_cast(&raw, 3, 1, FM_DT_F32);
  tf_op(&raw, FM_OP_AMAX, 4, 1, 3, 0, 0);
  raw.ops[raw.n_ops - 1].dim = -1;
  tf_iota(&raw, 5, FM_DT_F32);
  tf_op(&raw, FM_OP_EQ, 6, 2, 5, 2, 0);
  tf_const(&raw, 7, 0.0);
  tf_op(&raw, FM_OP_WHERE, 8, 3, 6, 3, 7);
  tf_op(&raw, FM_OP_SUM, 9, 1, 8, 0, 0);
  raw.ops[raw.n_ops - 1].dim = -1;
  tf_output(&raw, 4, FM_DT_F32, 2, per_row, NULL, 4);
  tf_output(&raw, 9, FM_DT_F32, 2, per_row, NULL, 4);
  return tf_finish(&raw, &canon);
}

static int ce_rows(int64_t cols) { return ce_rows_at(cols, cols); }

static void test_reference_pointwise(void) {
  /* x [3, 5] f32 at row stride 6 (the pad never read); iota stored too, and iota + x */
  const int64_t shape[2] = {3, 5}, padded[2] = {6, 1};
  tf_init(&raw);
  tf_input(&raw, 1, FM_DT_F32, 2, shape, padded, 4);
  tf_iota(&raw, 2, FM_DT_F32);
  tf_op(&raw, FM_OP_ADD, 3, 2, 1, 2, 0);
  tf_output(&raw, 2, FM_DT_F32, 2, shape, NULL, 4);
  tf_output(&raw, 3, FM_DT_F32, 2, shape, NULL, 4);
  CHECK_EQ_INT(tf_finish(&raw, &canon), FM_OK);
  CHECK_EQ_INT(canon.vocab, FM_VOCAB_IOTA);
  float x[18], col[15], sum[15];
  for (int i = 0; i < 18; i++) x[i] = (float)(100 * i);
  const void *ins[1] = {x};
  void *outs[2] = {col, sum};
  fm_diag d = {{0}};
  CHECK_EQ_INT(fm_reference_eval(&canon, 0, ins, outs, &d), FM_OK);
  for (int r = 0; r < 3; r++)
    for (int c = 0; c < 5; c++) {
      CHECK(col[r * 5 + c] == (float)c);
      CHECK(sum[r * 5 + c] == (float)(c + 100 * (r * 6 + c)));
    }
  /* an i64 iota, stored as i64 (an integer fragment) over [2, 3, 4] */
  const int64_t cube[3] = {2, 3, 4};
  tf_init(&raw);
  tf_iota(&raw, 1, FM_DT_I64);
  tf_output(&raw, 1, FM_DT_I64, 3, cube, NULL, 8);
  CHECK_EQ_INT(tf_finish(&raw, &canon), FM_OK);
  int64_t got[24];
  void *outs1[1] = {got};
  CHECK_EQ_INT(fm_reference_eval(&canon, 0, NULL, outs1, &d), FM_OK);
  for (int i = 0; i < 24; i++) CHECK(got[i] == i % 4);
  /* the gradient: the one-hot at each row's target, none where the target is -1 */
  CHECK_EQ_INT(ce_grad(FM_DT_F32, 3, 5, 6), FM_OK);
  const float t[3] = {2, -1, 4}, w[3] = {1, 1, 2};
  float logits[18] = {0}, g[15];
  const void *ins2[3] = {logits, t, w};
  void *outs2[1] = {g};
  CHECK_EQ_INT(fm_reference_eval(&canon, 0, ins2, outs2, &d), FM_OK);
  for (int r = 0; r < 3; r++)
    for (int c = 0; c < 5; c++) CHECK(g[r * 5 + c] == ((float)c == t[r] ? 0.0f : w[r]));
}

static void test_reference_rows(void) {
  CHECK_EQ_INT(ce_rows(37), FM_OK);
  CHECK(fm_fragment_is_rows(&canon));
  uint16_t x[4 * 37];
  for (int i = 0; i < 4 * 37; i++) x[i] = fm_reference_f32_to_bf16((float)(i % 37) - 10.0f);
  const float t[4] = {0, 36, 17, -1};
  float top[4], picked[4];
  const void *ins[2] = {x, t};
  void *outs[2] = {top, picked};
  fm_diag d = {{0}};
  CHECK_EQ_INT(fm_reference_eval(&canon, 4, ins, outs, &d), FM_OK);
  for (int r = 0; r < 4; r++) {
    CHECK(top[r] == 26.0f);
    CHECK(picked[r] == (t[r] < 0 ? 0.0f : t[r] - 10.0f));
  }
}

/* The verifier's targets: each input compared with an iota gets columns in [-1, C], the ends
 * and the values just outside among them; the logits keep their random values. */
static void test_verifier_columns(void) {
  CHECK_EQ_INT(ce_grad(FM_DT_F32, 256, 37, 40), FM_OK);
  static float x[256 * 40], t[256], w[256];
  for (int i = 0; i < 256 * 40; i++) x[i] = 0.5f;
  void *ins[3] = {x, t, w};
  fm_reference_integer_inputs(&canon, 0, 11, ins);
  int seen[4] = {0}, inside = 1, whole = 1;
  for (int r = 0; r < 256; r++) {
    inside = inside && t[r] >= -1 && t[r] <= 37 && t[r] == (float)(int)t[r];
    seen[0] |= t[r] == -1, seen[1] |= t[r] == 0, seen[2] |= t[r] == 36, seen[3] |= t[r] == 37;
  }
  for (int i = 0; i < 256 * 40; i++) whole = whole && x[i] == 0.5f;
  CHECK(inside && whole && seen[0] && seen[1] && seen[2] && seen[3]);
}

/* A block of the reference sample fixes leading dims only: the last dim, the iota's, is whole. */
static void test_sample_keeps_columns(void) {
  CHECK_EQ_INT(ce_grad(FM_DT_BF16, 4096, 50257, 50304), FM_OK);
  fm_sample s;
  fm_sample_choose(&canon, 0, 1, &s);
  CHECK(s.n > 0 && s.cut == 1);
  const int64_t flat[1] = {1 << 24};
  tf_init(&raw);
  tf_iota(&raw, 1, FM_DT_F32);
  tf_output(&raw, 1, FM_DT_F32, 1, flat, NULL, 16);
  CHECK_EQ_INT(tf_finish(&raw, &canon), FM_OK);
  fm_sample_choose(&canon, 0, 1, &s);
  CHECK_EQ_INT(s.n, 0); /* rank 1: nothing to cut but the column itself */
}

static void test_goldens(void) {
  CHECK_EQ_INT(ce_grad(FM_DT_BF16, 64, 50257, 50304), FM_OK);
  fm_candidate def;
  fm_diag d = {{0}};
  CHECK_EQ_INT(fm_codegen_default(&canon, &def, &d), FM_OK);
  char *src = NULL;
  fm_kernel_meta m;
  CHECK_EQ_INT(fm_codegen_generate(&canon, &def, 132, &src, &m, &d), FM_OK);
  CHECK(src && tf_golden("iota_cross_entropy", src));
  CHECK(src && strstr(src, "const long long fm_col") && strstr(src, "fm_cb = v * 8LL % 50257LL") &&
        strstr(src, "(float)fm_col"));
  CHECK(strcmp(m.kind, "pointwise") == 0 && m.n_inputs == 3 && m.n_outputs == 1);
  free(src);
  int compiled = 0;
  CHECK_EQ_INT(tf_compile_every(&canon, "iota: the gradient, units", &compiled), 0);
  CHECK(compiled > 0);
  /* whole vectors along the rows (strided), and a rank-1 column (the index itself) */
  CHECK_EQ_INT(ce_grad(FM_DT_BF16, 64, 32000, 32000), FM_OK);
  CHECK_EQ_INT(tf_compile_candidates(&canon, "iota: the gradient, vectors", &compiled), 0);
  const int64_t flat[1] = {1000};
  tf_init(&raw);
  tf_input(&raw, 1, FM_DT_F16, 1, flat, NULL, 16);
  tf_iota(&raw, 2, FM_DT_F32);
  tf_op(&raw, FM_OP_MUL, 3, 2, 1, 2, 0);
  tf_output(&raw, 3, FM_DT_F32, 1, flat, NULL, 16);
  CHECK_EQ_INT(tf_finish(&raw, &canon), FM_OK);
  CHECK_EQ_INT(tf_compile_candidates(&canon, "iota: rank 1, a tail", &compiled), 0);
  /* rows: held (short rows) and streamed (Llama's vocabulary) */
  CHECK_EQ_INT(ce_rows(1000), FM_OK);
  CHECK_EQ_INT(tf_compile_candidates(&canon, "iota: rows held", &compiled), 0);
  CHECK_EQ_INT(ce_rows(32000), FM_OK);
  CHECK_EQ_INT(fm_codegen_default(&canon, &def, &d), FM_OK);
  CHECK_EQ_INT(fm_codegen_generate(&canon, &def, 132, &src, &m, &d), FM_OK);
  CHECK(src && strstr(src, "fm_t0 + ((long long)(i / ") && strstr(src, "/* iota */"));
  free(src);
  CHECK_EQ_INT(tf_compile_candidates(&canon, "iota: rows streamed", &compiled), 0);
  /* GPT-2's logits at their padded stride: 16-byte vectors though 50257 is odd, the chunk a
     row ends in read element by element (ragged), and the whole-vector form a candidate */
  CHECK_EQ_INT(ce_rows_at(50257, 50304), FM_OK);
  CHECK_EQ_INT(fm_codegen_default(&canon, &def, &d), FM_OK);
  CHECK_EQ_INT(fm_codegen_generate(&canon, &def, 132, &src, &m, &d), FM_OK);
  CHECK(src && tf_golden("rows_cross_entropy_ragged", src));
  CHECK(src && strstr(src, "vec 8,") && strstr(src, "if (j + 8 > 50257LL)") && strstr(src, "+ i % 8 < 50257)"));
  free(src);
  fm_rows_config all[32];
  size_t n = fm_codegen_rows_candidates(&canon, all, 32), narrow = 0;
  for (size_t i = 0; i < n; i++) narrow += all[i].vec == 1;
  CHECK_EQ_INT(narrow, 1);
  CHECK_EQ_INT(tf_compile_candidates(&canon, "iota: ragged rows", &compiled), 0);
}

int main(void) {
  RUN(test_reference_pointwise);
  RUN(test_reference_rows);
  RUN(test_verifier_columns);
  RUN(test_sample_keeps_columns);
  RUN(test_goldens);
  return FM_TEST_DONE();
}
