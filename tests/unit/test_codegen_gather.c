/* test_codegen_gather.c: take_rows (vocabulary 9) in the pointwise template's extent form: the
 * CPU reference against rows picked by hand (negative rows, a broadcast row of one element, an
 * index outside the rows), the index the verifier fills in, the generated source (golden: the
 * MoE decoder's picks scaled and summed into the residual), and every candidate through NVRTC. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fm_codegen.h"
#include "fm_reference.h"
#include "fm_test.h"
#include "test_codegen_frag.h"

static fm_fragment raw, canon;

/* out [t, cols] f32 = take_rows(src [s, src_cols] f32, index [t, 1] i64) * 2. */
static int picked(int64_t s, int64_t src_cols, int64_t t, int64_t cols) {
  const int64_t src[2] = {s, src_cols}, index[2] = {t, 1}, out[2] = {t, cols};
  tf_init(&raw);
  raw.vocab = FM_VOCAB_GATHER;
  tf_input(&raw, 1, FM_DT_F32, 2, src, NULL, 16);
  tf_input(&raw, 2, FM_DT_I64, 2, index, NULL, 16);
  tf_op(&raw, FM_OP_TAKE_ROWS, 3, 2, 1, 2, 0);
  tf_const(&raw, 4, 2.0);
  tf_op(&raw, FM_OP_MUL, 5, 2, 3, 4, 0);
  tf_output(&raw, 5, FM_DT_F32, 2, out, NULL, 16);
  return tf_finish(&raw, &canon);
}

static void test_reference(void) {
  CHECK_EQ_INT(picked(3, 2, 4, 2), FM_OK);
  const float src[6] = {1, 2, 10, 20, 100, 200};
  const int64_t index[4] = {2, 0, -1, -3}; /* -1 is row 2, -3 row 0 */
  float out[8];
  const void *ins[2] = {src, index};
  void *outs[1] = {out};
  fm_diag d = {{0}};
  CHECK_EQ_INT(fm_reference_eval(&canon, 0, ins, outs, &d), FM_OK);
  const float want[8] = {200, 400, 2, 4, 200, 400, 2, 4};
  for (int i = 0; i < 8; i++) CHECK(out[i] == want[i]);
  /* outside [-S, S): NaN, which no comparison passes (the kernel traps there) */
  const int64_t bad[4] = {2, 3, 0, -4};
  ins[1] = bad;
  CHECK_EQ_INT(fm_reference_eval(&canon, 0, ins, outs, &d), FM_OK);
  CHECK(out[0] == 200 && isnan(out[2]) && isnan(out[3]) && out[4] == 2 && isnan(out[6]));
  /* rows of one element broadcast along the iteration's columns */
  CHECK_EQ_INT(picked(3, 1, 4, 5), FM_OK);
  const float col[3] = {1, 10, 100};
  float wide[20];
  ins[0] = col;
  ins[1] = index;
  outs[0] = wide;
  CHECK_EQ_INT(fm_reference_eval(&canon, 0, ins, outs, &d), FM_OK);
  for (int c = 0; c < 5; c++) CHECK(wide[c] == 200 && wide[5 + c] == 2 && wide[10 + c] == 200 && wide[15 + c] == 2);
}

/* An embedding's rows at ids of rank 2, as the client spells them: word rows [4, 1, 2] at ids
 * [2, 3, 1], position rows [3, 1, 2] at [1, 3, 1] (one index for the whole batch), summed:
 * out[b, s] = word[ids[b, s]] + position[s]; every candidate through NVRTC. */
static void test_rows_at_ids_of_rank_two(void) {
  const int64_t word[3] = {4, 1, 2}, ids[3] = {2, 3, 1}, pos[3] = {3, 1, 2}, pos_ids[3] = {1, 3, 1}, out[3] = {2, 3, 2};
  tf_init(&raw);
  raw.vocab = FM_VOCAB_GATHER;
  tf_input(&raw, 1, FM_DT_F32, 3, word, NULL, 16);
  tf_input(&raw, 2, FM_DT_I64, 3, ids, NULL, 16);
  tf_input(&raw, 3, FM_DT_F32, 3, pos, NULL, 16);
  tf_input(&raw, 4, FM_DT_I64, 3, pos_ids, NULL, 16);
  tf_op(&raw, FM_OP_TAKE_ROWS, 5, 2, 1, 2, 0);
  tf_op(&raw, FM_OP_TAKE_ROWS, 6, 2, 3, 4, 0);
  tf_op(&raw, FM_OP_ADD, 7, 2, 5, 6, 0);
  tf_output(&raw, 7, FM_DT_F32, 3, out, NULL, 16);
  CHECK_EQ_INT(tf_finish(&raw, &canon), FM_OK);
  const float w[8] = {1, 2, 10, 20, 100, 200, 1000, 2000}, p[6] = {0.25f, 0.5f, 3, 4, 30, 40};
  const int64_t at[6] = {3, 0, -2, 1, 1, 2}, pat[3] = {0, 1, 2};
  float got[12];
  const void *ins[4] = {w, at, p, pat};
  void *outs[1] = {got};
  fm_diag d = {{0}};
  CHECK_EQ_INT(fm_reference_eval(&canon, 0, ins, outs, &d), FM_OK);
  const float want[12] = {1000.25f, 2000.5f, 4, 6, 130, 240, 10.25f, 20.5f, 13, 24, 130, 240};
  for (int i = 0; i < 12; i++) CHECK(got[i] == want[i]);
  int compiled = 0;
  CHECK_EQ_INT(tf_compile_candidates(&canon, "take_rows at ids of rank 2", &compiled), 0);
  CHECK(compiled > 0);
}

/* The verifier's index: every element a row in [-S, S), the ends and their negative
 * spellings among them; the rows themselves untouched. */
static void test_index_rows(void) {
  CHECK_EQ_INT(picked(37, 8, 1000, 8), FM_OK);
  int64_t *index = malloc(1000 * sizeof *index);
  float *src = calloc(37 * 8, sizeof *src);
  void *ins[2] = {src, index};
  CHECK_EQ_INT(fm_reference_index_rows(&canon, 42, ins), FM_OK);
  int inside = 1, seen[4] = {0};
  for (int m = 0; m < 1000; m++) {
    inside = inside && index[m] >= -37 && index[m] < 37;
    seen[0] |= index[m] == 0, seen[1] |= index[m] == 36, seen[2] |= index[m] == -1, seen[3] |= index[m] == -37;
  }
  CHECK(inside && seen[0] && seen[1] && seen[2] && seen[3]);
  for (int i = 0; i < 37 * 8; i++) CHECK(src[i] == 0);
  free(index);
  free(src);
}

/* The MoE decoder's combine: the experts' bf16 product [8192, 1024] read at each token's two
 * picks (a strided view of the inverse permutation), scaled by the picks' f32 weights, summed,
 * cast and added to the residual: golden, NVRTC. */
static void test_goldens(void) {
  const int64_t prod[2] = {8192, 1024}, pick[2] = {4096, 1}, every_other[2] = {2, 0}, out[2] = {4096, 1024};
  tf_init(&raw);
  raw.vocab = FM_VOCAB_GATHER;
  tf_input(&raw, 1, FM_DT_BF16, 2, prod, NULL, 16);
  tf_input(&raw, 2, FM_DT_I64, 2, pick, every_other, 16);
  tf_input(&raw, 3, FM_DT_I64, 2, pick, every_other, 8);
  tf_input(&raw, 4, FM_DT_F32, 2, pick, every_other, 16);
  tf_input(&raw, 5, FM_DT_F32, 2, pick, every_other, 4);
  tf_input(&raw, 6, FM_DT_BF16, 2, out, NULL, 16);
  tf_op(&raw, FM_OP_TAKE_ROWS, 10, 2, 1, 2, 0);
  tf_op(&raw, FM_OP_TAKE_ROWS, 11, 2, 1, 3, 0);
  tf_op(&raw, FM_OP_MUL, 12, 2, 10, 4, 0);
  tf_op(&raw, FM_OP_MUL, 13, 2, 11, 5, 0);
  tf_op(&raw, FM_OP_ADD, 14, 2, 12, 13, 0);
  tf_cast(&raw, 15, 14, FM_DT_BF16);
  tf_op(&raw, FM_OP_ADD, 16, 2, 6, 15, 0);
  tf_output(&raw, 16, FM_DT_BF16, 2, out, NULL, 16);
  CHECK_EQ_INT(tf_finish(&raw, &canon), FM_OK);
  CHECK_EQ_INT(canon.vocab, 9);
  fm_candidate def;
  fm_diag d = {{0}};
  CHECK_EQ_INT(fm_codegen_default(&canon, &def, &d), FM_OK);
  char *src = NULL;
  fm_kernel_meta m;
  CHECK_EQ_INT(fm_codegen_generate(&canon, &def, 132, &src, &m, &d), FM_OK);
  CHECK(src && tf_golden("gather_moe_combine", src));
  CHECK(src && strstr(src, "__trap()") && strstr(src, "+= 8192LL"));
  CHECK(strcmp(m.kind, "pointwise") == 0 && m.n_inputs == 6 && m.n_outputs == 1);
  free(src);
  int compiled = 0;
  CHECK_EQ_INT(tf_compile_candidates(&canon, "take_rows moe combine", &compiled), 0);
  CHECK(compiled > 0);
}

int main(void) {
  RUN(test_reference);
  RUN(test_index_rows);
  RUN(test_rows_at_ids_of_rank_two);
  RUN(test_goldens);
  return FM_TEST_DONE();
}
