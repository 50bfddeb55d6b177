/* The reference at a sample of blocks (fm_reference_sample.h): which fragments are sampled and
 * how, and that each block's reference is bit for bit what the whole evaluation computes
 * there, for pointwise fragments with broadcast inputs, row fragments (per-row and row-shaped
 * outputs, a padded row stride), cat fragments (cut before the cat's dim only) and a GEMM
 * whose B must not be offset (its rows are K, equal to M here). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fm_reference.h"
#include "fm_reference_sample.h"
#include "fm_test.h"
#include "test_codegen_frag.h"
#include "test_codegen_rows_frag.h"

static fm_fragment raw, canon;

static uint64_t rng_state = 88172645463325252ull;
static float next_value(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return (float)((double)(rng_state >> 11) / 9007199254740992.0 * 6.0 - 3.0);
}

/* Elements spanned by t (its last element plus one). */
static size_t span(const fm_tensor *t) {
  int64_t last = 0;
  for (uint32_t d = 0; d < t->rank; d++)
    if (t->shape[d] > 1) last += (t->shape[d] - 1) * t->strides[d];
  return (size_t)last + 1;
}

static void *random_tensor(const fm_tensor *t) {
  size_t n = span(t), es = fm_dtype_size(t->dtype);
  uint8_t *p = malloc(n * es);
  for (size_t i = 0; i < n; i++) {
    float v = next_value();
    if (t->dtype == FM_DT_BF16) {
      uint16_t h = fm_reference_f32_to_bf16(v);
      memcpy(p + 2 * i, &h, 2);
    } else {
      memcpy(p + 4 * i, &v, 4);
    }
  }
  return p;
}

/* Evaluates canon whole and at sample s (the GEMM's fixed inputs in `fixed`), then compares
 * every element of every block, bit for bit; the sampled outputs start as 0xAB bytes, and
 * an element outside every block must keep them (the blocks write only their own). Returns
 * how many elements were compared. */
static int64_t check_blocks(const fm_sample *s, uint32_t fixed) {
  const void *ins[FM_MAX_INPUTS];
  void *whole[FM_MAX_OUTPUTS], *part[FM_MAX_OUTPUTS];
  fm_diag d = {{0}};
  int64_t compared = 0;
  for (uint32_t k = 0; k < canon.n_inputs; k++) ins[k] = random_tensor(&canon.inputs[k]);
  for (uint32_t k = 0; k < canon.n_outputs; k++) {
    size_t bytes = span(&canon.outputs[k]) * fm_dtype_size(canon.outputs[k].dtype);
    whole[k] = calloc(1, bytes);
    part[k] = malloc(bytes);
    memset(part[k], 0xAB, bytes);
  }
  CHECK_EQ_INT(fm_reference_eval(&canon, 1, ins, whole, &d), FM_OK);
  CHECK_EQ_INT(fm_sample_reference(&canon, 1, s, fixed, ins, part, &d), FM_OK);
  for (uint32_t k = 0; k < canon.n_outputs; k++) {
    const fm_tensor *t = &canon.outputs[k];
    size_t es = fm_dtype_size(t->dtype), bytes = span(t) * es;
    uint8_t *seen = calloc(1, span(t));
    for (int b = 0; b < s->n; b++) {
      int64_t base = fm_sample_offset(&canon, 1, s, b, t), idx[FM_MAX_RANK] = {0}, n = 1;
      for (uint32_t dd = s->cut; dd < t->rank; dd++) n *= t->shape[dd];
      for (int64_t i = 0; i < n; i++) {
        int64_t off = base;
        for (uint32_t dd = s->cut; dd < t->rank; dd++) off += idx[dd] * t->strides[dd];
        seen[off] = 1;
        if (memcmp((uint8_t *)whole[k] + off * es, (uint8_t *)part[k] + off * es, es) != 0) {
          printf("  outputs[%u] block %d (lead %lld) element %lld differs\n", k, b, (long long)s->lead[b],
                 (long long)i);
          CHECK(0);
          b = s->n;
          break;
        }
        compared++;
        for (int dd = (int)t->rank - 1; dd >= (int)s->cut; dd--) {
          if (++idx[dd] < t->shape[dd]) break;
          idx[dd] = 0;
        }
      }
    }
    int untouched = 1;
    for (size_t e = 0; e < bytes / es && untouched; e++)
      if (!seen[e])
        for (size_t j = 0; j < es; j++) untouched &= ((uint8_t *)part[k])[e * es + j] == 0xAB;
    CHECK(untouched);
    free(seen);
    free(whole[k]);
    free(part[k]);
  }
  for (uint32_t k = 0; k < canon.n_inputs; k++) free((void *)ins[k]);
  return compared;
}

/* The properties every chosen sample has: ascending distinct blocks inside the leading
 * space, the first and last among them. */
static void check_shape_of(const fm_sample *s) {
  int64_t lead = 1;
  for (uint32_t d = 0; d < s->cut; d++) lead *= fm_sample_dim(&canon, 1, d);
  CHECK(s->n > 0 && s->n <= FM_SAMPLE_MAX_BLOCKS);
  CHECK(s->lead[0] == 0);
  CHECK(s->lead[s->n - 1] == lead - 1);
  for (int b = 1; b < s->n; b++) CHECK(s->lead[b] > s->lead[b - 1]);
}

/* y = x * g + b; z = cast(y, f32): x [8, 8, 256, 256] bf16 (4M elements, the threshold),
 * g [1, 8, 1, 256] and b [8, 1, 256, 256] broadcast along some cut dims and not others. */
static void build_pointwise(int64_t d0) {
  int64_t xs[4] = {d0, 8, 256, 256}, gs[4] = {1, 8, 1, 256}, bs[4] = {d0, 1, 256, 256};
  tf_init(&raw);
  tf_input(&raw, 0, FM_DT_BF16, 4, xs, NULL, 16);
  tf_input(&raw, 1, FM_DT_BF16, 4, gs, NULL, 16);
  tf_input(&raw, 2, FM_DT_BF16, 4, bs, NULL, 16);
  tf_op(&raw, FM_OP_MUL, 3, 2, 0, 1, 0);
  tf_op(&raw, FM_OP_ADD, 4, 2, 3, 2, 0);
  tf_cast(&raw, 5, 4, FM_DT_F32);
  tf_output(&raw, 4, FM_DT_BF16, 4, xs, NULL, 16);
  tf_output(&raw, 5, FM_DT_F32, 4, xs, NULL, 16);
}

static void test_pointwise_blocks(void) {
  fm_sample s;
  build_pointwise(8);
  CHECK_EQ_INT(tf_finish(&raw, &canon), FM_OK);
  fm_sample_choose(&canon, 1, 7, &s);
  /* one dim leaves 512K-element blocks, two leave 64K */
  CHECK_EQ_INT((int)s.cut, 2);
  CHECK(s.n >= 16 && s.n <= 24); /* a random block may fall in a strip */
  check_shape_of(&s);
  int64_t n = check_blocks(&s, 0);
  CHECK(n == 2 * (int64_t)s.n * 65536);
  printf("  pointwise: %d blocks of 64K elements, %lld compared\n", s.n, (long long)n);
}

/* Evaluates canon whole at outer, then through fm_sample_reference with no sample (on
 * threads once large enough), and compares every output byte; the second outputs start as
 * 0xAB bytes, so an element no band wrote shows. */
static void check_whole(int64_t outer) {
  const void *ins[FM_MAX_INPUTS];
  void *a[FM_MAX_OUTPUTS], *b[FM_MAX_OUTPUTS];
  size_t bytes[FM_MAX_OUTPUTS];
  fm_diag d = {{0}};
  fm_sample none = {0};
  fm_fragment at = canon; /* spans at outer: a symbolic dim 0 sized */
  for (uint32_t k = 0; k < canon.n_inputs; k++) {
    if (at.inputs[k].shape[0] == FM_DIM_SYMBOLIC) at.inputs[k].shape[0] = outer;
    ins[k] = random_tensor(&at.inputs[k]);
  }
  for (uint32_t k = 0; k < canon.n_outputs; k++) {
    if (at.outputs[k].shape[0] == FM_DIM_SYMBOLIC) at.outputs[k].shape[0] = outer;
    bytes[k] = span(&at.outputs[k]) * fm_dtype_size(canon.outputs[k].dtype);
    a[k] = calloc(1, bytes[k]);
    b[k] = malloc(bytes[k]);
    memset(b[k], 0xAB, bytes[k]);
  }
  CHECK_EQ_INT(fm_reference_eval(&canon, outer, ins, a, &d), FM_OK);
  CHECK_EQ_INT(fm_sample_reference(&canon, outer, &none, 0, ins, b, &d), FM_OK);
  for (uint32_t k = 0; k < canon.n_outputs; k++) {
    /* a padded row's gap is written by neither: compare the elements of the layout only */
    const fm_tensor *t = &at.outputs[k];
    size_t es = fm_dtype_size(t->dtype), n = 1, bad = 0;
    for (uint32_t i = 0; i < t->rank; i++) n *= (size_t)t->shape[i];
    for (size_t e = 0; e < n; e++) {
      size_t rest = e, off = 0;
      for (int i = (int)t->rank - 1; i >= 0; i--) {
        off += rest % (size_t)t->shape[i] * (size_t)t->strides[i];
        rest /= (size_t)t->shape[i];
      }
      bad += memcmp((uint8_t *)a[k] + off * es, (uint8_t *)b[k] + off * es, es) != 0;
    }
    CHECK_EQ_INT((int)bad, 0);
    free(a[k]);
    free(b[k]);
  }
  for (uint32_t k = 0; k < canon.n_inputs; k++) free((void *)ins[k]);
}

static void test_small_is_whole(void) {
  fm_sample s;
  build_pointwise(4); /* 2M elements: under the threshold */
  CHECK_EQ_INT(tf_finish(&raw, &canon), FM_OK);
  fm_sample_choose(&canon, 1, 7, &s);
  CHECK_EQ_INT(s.n, 0);
  check_whole(1); /* n == 0 is the whole evaluation (in bands: 4 along dim 0) */
}

static void test_seed_picks_random_blocks(void) {
  fm_sample a, b, c;
  build_pointwise(8);
  CHECK_EQ_INT(tf_finish(&raw, &canon), FM_OK);
  fm_sample_choose(&canon, 1, 7, &a);
  fm_sample_choose(&canon, 1, 7, &b);
  fm_sample_choose(&canon, 1, 8, &c);
  CHECK(a.n == b.n && memcmp(a.lead, b.lead, sizeof a.lead[0] * (size_t)a.n) == 0);
  CHECK(a.n != c.n || memcmp(a.lead, c.lead, sizeof a.lead[0] * (size_t)a.n) != 0);
}

/* Log-sum-exp pieces over padded rows: m = amax(x); y = x - m (row-shaped, f32); s = sum(exp(y))
 * (per row): x [rows, 1000] bf16 at row stride 1024. */
static void build_lse(int64_t rows) {
  int64_t xs[2] = {rows, 1000}, xst[2] = {1024, 1}, ss[2] = {rows, 1};
  tf_init(&raw);
  tf_input(&raw, 0, FM_DT_BF16, 2, xs, xst, 16);
  rf_reduce(&raw, FM_OP_AMAX, 1, 0, 0);
  tf_op(&raw, FM_OP_SUB, 2, 2, 0, 1, 0);
  tf_cast(&raw, 3, 2, FM_DT_F32);
  tf_op(&raw, FM_OP_EXP, 4, 1, 3, 0, 0);
  rf_reduce(&raw, FM_OP_SUM, 5, 4, 0);
  tf_output(&raw, 3, FM_DT_F32, 2, xs, NULL, 16);
  tf_output(&raw, 5, FM_DT_F32, 2, ss, NULL, 16);
}

static void test_rows_blocks(void) {
  fm_sample s;
  build_lse(4096);
  CHECK_EQ_INT(rf_finish(&raw, &canon), FM_OK);
  fm_sample_choose(&canon, 1, 3, &s);
  CHECK(s.n == 0); /* 4096 x 1000 = 4.1M elements (the padding not counted): under the threshold */
  build_lse(4400);
  CHECK_EQ_INT(rf_finish(&raw, &canon), FM_OK);
  fm_sample_choose(&canon, 1, 3, &s);
  CHECK_EQ_INT((int)s.cut, 1); /* never the reduced dim */
  CHECK(s.n >= 16 && s.n <= 24);
  check_shape_of(&s);
  int64_t n = check_blocks(&s, 0);
  CHECK(n == (int64_t)s.n * 1001);
}

/* Under the sample's threshold the reference is whole, on threads in bands: along dim 0 for
 * rows of a padded stride; along the longest dim when dim 0 has size 1 (inputs broadcast
 * there and along the band's dim are left whole); a symbolic dim 0 evaluated at outer. */
static void test_whole_in_bands(void) {
  build_lse(4096); /* 4.1M elements, 16 bands of 256 rows */
  CHECK_EQ_INT(rf_finish(&raw, &canon), FM_OK);
  check_whole(1);
  build_lse(37); /* 37K elements: one thread */
  CHECK_EQ_INT(rf_finish(&raw, &canon), FM_OK);
  check_whole(1);
  build_pointwise(1); /* [1, 8, 256, 256]: bands along dim 2 */
  CHECK_EQ_INT(tf_finish(&raw, &canon), FM_OK);
  check_whole(1);
  int64_t xs[2] = {-1, 1000}, gs[2] = {1, 1000};
  tf_init(&raw);
  tf_input(&raw, 0, FM_DT_BF16, 2, xs, NULL, 16);
  tf_input(&raw, 1, FM_DT_BF16, 2, gs, NULL, 16);
  tf_op(&raw, FM_OP_MUL, 2, 2, 0, 1, 0);
  tf_op(&raw, FM_OP_SILU, 3, 1, 2, 0, 0);
  tf_output(&raw, 3, FM_DT_BF16, 2, xs, NULL, 16);
  CHECK_EQ_INT(tf_finish(&raw, &canon), FM_OK);
  check_whole(1001); /* 1M elements: 16 bands of 63 rows, the last of 56 */
}

/* A row of 2^20 elements is one block: the cut stops before the reduced dim. */
static void test_rows_long_row(void) {
  fm_sample s;
  int64_t xs[2] = {6, 1 << 20}, ss[2] = {6, 1};
  tf_init(&raw);
  tf_input(&raw, 0, FM_DT_BF16, 2, xs, NULL, 16);
  rf_reduce(&raw, FM_OP_SUM, 1, 0, 0);
  tf_output(&raw, 1, FM_DT_BF16, 2, ss, NULL, 16);
  CHECK_EQ_INT(rf_finish(&raw, &canon), FM_OK);
  fm_sample_choose(&canon, 1, 3, &s);
  CHECK_EQ_INT((int)s.cut, 1);
  CHECK_EQ_INT(s.n, 6); /* fewer rows than a sample takes: all of them, in parallel */
  CHECK(check_blocks(&s, 0) == 6);
}

/* cat along dim 1 of [2048, 2048]: cut 1; along dim 0: no cut. */
static void build_cat(int32_t dim) {
  int64_t hs[2] = {dim == 0 ? 1024 : 2048, dim == 0 ? 2048 : 1024}, os[2] = {2048, 2048};
  tf_init(&raw);
  raw.vocab = 6;
  tf_input(&raw, 0, FM_DT_BF16, 2, hs, NULL, 16);
  tf_input(&raw, 1, FM_DT_BF16, 2, hs, NULL, 16);
  tf_op(&raw, FM_OP_NEG, 2, 1, 1, 0, 0);
  tf_op(&raw, FM_OP_CAT, 3, 2, 2, 0, 0);
  raw.ops[raw.n_ops - 1].dim = dim;
  tf_output(&raw, 3, FM_DT_BF16, 2, os, NULL, 16);
}

static void test_cat_blocks(void) {
  fm_sample s;
  build_cat(1);
  CHECK_EQ_INT(tf_finish(&raw, &canon), FM_OK);
  fm_sample_choose(&canon, 1, 5, &s);
  CHECK_EQ_INT((int)s.cut, 1);
  CHECK(s.n >= 16 && s.n <= 24);
  CHECK(check_blocks(&s, 0) == (int64_t)s.n * 2048);
  build_cat(0);
  CHECK_EQ_INT(tf_finish(&raw, &canon), FM_OK);
  fm_sample_choose(&canon, 1, 5, &s);
  CHECK_EQ_INT(s.n, 0);
}

/* A column fragment (sum over dim 0) and a GEMM are never chosen for a sample. */
static void test_not_sampled(void) {
  fm_sample s;
  int64_t xs[2] = {8192, 1024}, os[2] = {1, 1024};
  tf_init(&raw);
  tf_input(&raw, 0, FM_DT_BF16, 2, xs, NULL, 16);
  tf_op(&raw, FM_OP_SUM, 1, 1, 0, 0, 0);
  raw.ops[0].dim = 0;
  raw.ops[0].keepdim = 1;
  tf_output(&raw, 1, FM_DT_BF16, 2, os, NULL, 16);
  CHECK_EQ_INT(tf_finish(&raw, &canon), FM_OK);
  CHECK(fm_fragment_is_cols(&canon));
  fm_sample_choose(&canon, 1, 5, &s);
  CHECK_EQ_INT(s.n, 0);
}

/* A column fragment over [65536, 83] (5.4M elements: evaluated whole, in stripes of columns
 * on threads): sum((x - r) * g) and mean(x * x) + g, with a per-row r [M, 1] (left whole in
 * every stripe) and a per-column g [1, 83] (cut with the columns); 83 columns make stripes of
 * 6 and a last one of 5. Every output element is bit for bit the whole evaluation's. */
static void test_cols_stripes(void) {
  enum { M = 65536, N = 83 };
  int64_t xs[2] = {M, N}, rs[2] = {M, 1}, gs[2] = {1, N};
  tf_init(&raw);
  tf_input(&raw, 0, FM_DT_BF16, 2, xs, NULL, 16);
  tf_input(&raw, 1, FM_DT_F32, 2, rs, NULL, 16);
  tf_input(&raw, 2, FM_DT_F32, 2, gs, NULL, 16);
  tf_op(&raw, FM_OP_SUB, 3, 2, 0, 1, 0);
  tf_op(&raw, FM_OP_MUL, 4, 2, 3, 2, 0);
  tf_op(&raw, FM_OP_SUM, 5, 1, 4, 0, 0);
  raw.ops[raw.n_ops - 1].dim = 0;
  raw.ops[raw.n_ops - 1].keepdim = 1;
  tf_op(&raw, FM_OP_MUL, 6, 2, 0, 0, 0);
  tf_op(&raw, FM_OP_MEAN, 7, 1, 6, 0, 0);
  raw.ops[raw.n_ops - 1].dim = 0;
  raw.ops[raw.n_ops - 1].keepdim = 1;
  tf_op(&raw, FM_OP_ADD, 8, 2, 7, 2, 0);
  tf_output(&raw, 5, FM_DT_F32, 2, gs, NULL, 16);
  tf_output(&raw, 8, FM_DT_F32, 2, gs, NULL, 16);
  CHECK_EQ_INT(tf_finish(&raw, &canon), FM_OK);
  CHECK(fm_fragment_is_cols(&canon));
  const void *ins[3];
  void *whole[2], *part[2];
  fm_diag d = {{0}};
  for (uint32_t k = 0; k < 3; k++) ins[k] = random_tensor(&canon.inputs[k]);
  for (uint32_t k = 0; k < 2; k++) {
    whole[k] = calloc(N, 4);
    part[k] = malloc(N * 4);
    memset(part[k], 0xAB, N * 4);
  }
  fm_sample none = {0};
  CHECK_EQ_INT(fm_reference_eval(&canon, 1, ins, whole, &d), FM_OK);
  CHECK_EQ_INT(fm_sample_reference(&canon, 1, &none, 0, ins, part, &d), FM_OK);
  for (uint32_t k = 0; k < 2; k++) {
    CHECK(memcmp(whole[k], part[k], N * 4) == 0);
    free(whole[k]);
    free(part[k]);
  }
  for (uint32_t k = 0; k < 3; k++) free((void *)ins[k]);
}

/* out = relu(A @ B + r), A [512, 512], B [512, 256] (K = M: B must stay fixed), r [512, 256];
 * rows 0..3, 300 and 508..511 as the tuner's GEMM strips would take them. */
static void test_gemm_fixed_operand(void) {
  fm_sample s;
  int64_t as[2] = {512, 512}, bs[2] = {512, 256}, rs[2] = {512, 256};
  tf_init(&raw);
  tf_input(&raw, 0, FM_DT_BF16, 2, as, NULL, 16);
  tf_input(&raw, 1, FM_DT_BF16, 2, bs, NULL, 16);
  tf_input(&raw, 2, FM_DT_BF16, 2, rs, NULL, 16);
  tf_op(&raw, FM_OP_MM, 3, 2, 0, 1, 0);
  tf_op(&raw, FM_OP_ADD, 4, 2, 3, 2, 0);
  tf_op(&raw, FM_OP_RELU, 5, 1, 4, 0, 0);
  tf_output(&raw, 5, FM_DT_BF16, 2, rs, NULL, 16);
  CHECK_EQ_INT(tf_finish(&raw, &canon), FM_OK);
  fm_sample_choose(&canon, 1, 5, &s);
  CHECK_EQ_INT(s.n, 0);
  memset(&s, 0, sizeof s);
  s.cut = 1;
  const int64_t rows[] = {0, 1, 2, 3, 300, 508, 509, 510, 511};
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) CHECK_EQ_INT(fm_sample_add(&s, rows[i]), 0);
  CHECK_EQ_INT(fm_sample_add(&s, 300), 0); /* a block already there is not added twice */
  CHECK_EQ_INT(s.n, 9);
  CHECK(check_blocks(&s, 1u << 1) == 9 * 256);
}

int main(void) {
  RUN(test_pointwise_blocks);
  RUN(test_small_is_whole);
  RUN(test_seed_picks_random_blocks);
  RUN(test_rows_blocks);
  RUN(test_rows_long_row);
  RUN(test_whole_in_bands);
  RUN(test_cat_blocks);
  RUN(test_not_sampled);
  RUN(test_cols_stripes);
  RUN(test_gemm_fixed_operand);
  return FM_TEST_DONE();
}
