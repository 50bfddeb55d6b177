/* fm_reference_scatter.c: scatter fragments (vocabulary 8, index_add; fm_fragment.h) on the
 * CPU: every src row added, in fp64 and in row order, to the output row its index names,
 * on top of what the output holds; and the index rows the verification inputs hold (index_add's
 * and take_rows'). */
#include <stdlib.h>

#include "fm_reference_int.h"

typedef struct scatter_ref {
  const fm_tensor *src, *index, *out;
  uint32_t is, ix;
} scatter_ref;

static int operands(const fm_fragment *f, scatter_ref *s) {
  if (fm_fragment_scatter_inputs(f, &s->is, &s->ix)) return FM_EINVAL;
  s->src = &f->inputs[s->is];
  s->index = &f->inputs[s->ix];
  s->out = &f->outputs[0];
  return s->src->rank == 2 && s->index->rank == 1 && s->out->rank == 2 ? FM_OK : FM_EINVAL;
}

static int64_t stride_of(const fm_tensor *t, uint32_t j) { return t->shape[j] > 1 ? t->strides[j] : 0; }

int fm_ref_eval_scatter(const fm_fragment *f, const void *const *inputs, void *const *outputs, fm_diag *d) {
  scatter_ref s;
  if (operands(f, &s)) return fm_diag_set(d, FM_EINVAL, "reference: not a scatter fragment");
  if (!inputs[s.is] || !inputs[s.ix]) return fm_diag_set(d, FM_EINVAL, "reference: index_add's inputs are NULL");
  const int64_t m_rows = s.src->shape[0], cols = s.src->shape[1], r_rows = s.out->shape[0];
  /* the sums in fp64, rounded to f32 once each: the kernel's atomics add in f32, in any
     order, which the tolerance covers */
  double *acc = malloc((size_t)r_rows * (size_t)cols * sizeof *acc);
  if (!acc) return fm_diag_set(d, FM_ENOMEM, "reference: out of memory");
  for (int64_t r = 0; r < r_rows; r++)
    for (int64_t c = 0; c < cols; c++)
      acc[r * cols + c] = fm_ref_load(FM_DT_F32, outputs[0], r * stride_of(s.out, 0) + c * stride_of(s.out, 1));
  for (int64_t m = 0; m < m_rows; m++) {
    const double r = fm_ref_load(FM_DT_I64, inputs[s.ix], m * stride_of(s.index, 0));
    if (!(r >= 0 && r < (double)r_rows)) {
      free(acc);
      return fm_diag_set(d, FM_EINVAL, "reference: index[%lld] = %.0f is outside [0, %lld)", (long long)m, r,
                         (long long)r_rows);
    }
    for (int64_t c = 0; c < cols; c++)
      acc[(int64_t)r * cols + c] +=
          fm_ref_load(s.src->dtype, inputs[s.is], m * stride_of(s.src, 0) + c * stride_of(s.src, 1));
  }
  for (int64_t r = 0; r < r_rows; r++)
    for (int64_t c = 0; c < cols; c++)
      fm_ref_store(FM_DT_F32, outputs[0], r * stride_of(s.out, 0) + c * stride_of(s.out, 1), acc[r * cols + c]);
  free(acc);
  return FM_OK;
}

/* The input position of value id, or -1. */
static int input_of(const fm_fragment *f, uint32_t id) {
  for (uint32_t k = 0; k < f->n_inputs; k++)
    if (f->inputs[k].id == id) return (int)k;
  return -1;
}

/* take_rows' index (its op's second operand): each element of the index's extent a row of src,
 * the two ends and their negative spellings (-1, -S) first, then uniform rows. */
static void take_rows_index(const fm_fragment *f, const fm_opnode *op, uint64_t *x, void *const *inputs) {
  const int s = input_of(f, op->args[0]), ix = input_of(f, op->args[1]);
  if (s < 0 || ix < 0 || s >= (int)f->n_inputs || ix >= (int)f->n_inputs || !inputs[ix]) return;
  const fm_tensor *index = &f->inputs[ix];
  const int64_t rows = f->inputs[s].shape[0], ends[4] = {0, rows - 1, -1, -rows};
  int64_t idx[FM_MAX_RANK] = {0}, n = 0;
  for (;;) {
    int64_t off = 0;
    for (uint32_t j = 0; j < index->rank; j++) off += idx[j] * stride_of(index, j);
    *x ^= *x << 13, *x ^= *x >> 7, *x ^= *x << 17; /* xorshift64 */
    const int64_t r = n < 4 ? ends[n] : (int64_t)(*x % (uint64_t)rows);
    ((int64_t *)inputs[ix])[off] = r;
    n++;
    uint32_t j = index->rank;
    while (j-- > 0 && ++idx[j] >= index->shape[j]) idx[j] = 0; /* odometer, last dim fastest */
    if (j == UINT32_MAX) return;
  }
}

int fm_reference_index_rows(const fm_fragment *canon, uint64_t seed, void *const *inputs) {
  scatter_ref s;
  uint64_t x = seed | 1;
  for (uint32_t i = 0; i < canon->n_ops; i++)
    if (fm_op_kind(canon->ops[i].op) == FM_OPK_GATHER) take_rows_index(canon, &canon->ops[i], &x, inputs);
  if (!fm_fragment_is_scatter(canon)) return FM_OK;
  if (operands(canon, &s) || !inputs[s.ix]) return FM_EINVAL;
  const int64_t m_rows = s.index->shape[0], r_rows = s.out->shape[0];
  for (int64_t m = 0; m < m_rows; m++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17; /* xorshift64 */
    /* the range's two ends first, then uniform rows (with M > R, rows taking several) */
    const int64_t r = m == 0 ? 0 : m == 1 ? r_rows - 1 : (int64_t)(x % (uint64_t)r_rows);
    fm_ref_store(FM_DT_I64, inputs[s.ix], m * stride_of(s.index, 0), (double)r);
  }
  return FM_OK;
}
