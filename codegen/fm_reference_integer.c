/* fm_reference_integer.c: verification inputs for integer values (vocab 10). Random bits make
 * no labels: an i64 input read as data gets small integers, half of them at the fragment's
 * own integer constants and one either side (-100 and its neighbours for a loss's
 * ignore_index, 0 and V - 1 and V for its range check), so every comparison and every
 * where is seen taking both sides at its boundary. Likewise an input compared with an iota
 * (vocab 11: a loss's target as f32 against the column) gets columns, so that the compare
 * holds somewhere in every row and a kernel whose column is off by one is caught. */
#include <math.h>

#include "fm_reference.h"

enum { MAX_MARKS = 96, UNIFORM_SPAN = 1024 };

static uint64_t next(uint64_t *x) {
  *x ^= *x << 13, *x ^= *x >> 7, *x ^= *x << 17; /* xorshift64 */
  return *x;
}

/* Whether input k is read as data by some op (not only as index_add's or take_rows' index). */
static int read_as_data(const fm_fragment *f, uint32_t k) {
  for (uint32_t i = 0; i < f->n_ops; i++) {
    const uint32_t data_args = fm_op_data_args(f->ops[i].op, f->ops[i].nargs);
    for (uint32_t a = 0; a < data_args && a < FM_MAX_ARGS; a++)
      if (f->ops[i].args[a] == f->inputs[k].id) return 1;
  }
  return 0;
}

static size_t marks_of(const fm_fragment *f, int64_t *marks) {
  size_t n = 0;
  marks[n++] = 0;
  for (uint32_t i = 0; i < f->n_ops && n + 3 <= MAX_MARKS; i++) {
    const double c = f->ops[i].value;
    if (f->ops[i].op != FM_OP_CONST || !fm_int_const_ok(c)) continue;
    for (int d = -1; d <= 1; d++) marks[n++] = (int64_t)c + d;
  }
  return n;
}

/* The op defining value id (NULL for an input). */
static const fm_opnode *op_of(const fm_fragment *f, uint32_t id) {
  for (uint32_t i = 0; i < f->n_ops; i++)
    if (f->ops[i].out == id) return &f->ops[i];
  return NULL;
}

/* id, or the value a cast of id reads. */
static uint32_t through_cast(const fm_fragment *f, uint32_t id) {
  const fm_opnode *op = op_of(f, id);
  return op && op->op == FM_OP_CAST && op->nargs == 1 ? op->args[0] : id;
}

/* Whether input k meets an iota in a comparison (directly or through a cast). */
static int compared_with_iota(const fm_fragment *f, uint32_t k) {
  for (uint32_t i = 0; i < f->n_ops; i++) {
    const fm_opnode *op = &f->ops[i];
    if (fm_op_kind(op->op) != FM_OPK_COMPARE || op->nargs != 2) continue;
    for (int a = 0; a < 2; a++) {
      const fm_opnode *other = op_of(f, op->args[1 - a]);
      if (through_cast(f, op->args[a]) == f->inputs[k].id && other && other->op == FM_OP_IOTA) return 1;
    }
  }
  return 0;
}

/* The iteration's last dim (a row fragment's: its rows' length, the longest last dim). */
static int64_t columns_of(const fm_fragment *f) {
  const uint32_t r = f->outputs[0].rank;
  int64_t n = r ? f->outputs[0].shape[r - 1] : 1;
  for (uint32_t k = 0; r && k < f->n_inputs; k++)
    if (f->inputs[k].rank == r && f->inputs[k].shape[r - 1] > n) n = f->inputs[k].shape[r - 1];
  return n;
}

/* Value v stored into element off of a tensor of dtype dt (floats rounded as stored). */
static void store_int(fm_dtype dt, void *base, int64_t off, int64_t v) {
  if (dt == FM_DT_I64)
    ((int64_t *)base)[off] = v;
  else if (dt == FM_DT_F32)
    ((float *)base)[off] = (float)v;
  else if (dt == FM_DT_BF16)
    ((uint16_t *)base)[off] = fm_reference_f32_to_bf16((float)v);
  else if (dt == FM_DT_F16)
    ((uint16_t *)base)[off] = fm_reference_f32_to_f16((float)v);
}

void fm_reference_integer_inputs(const fm_fragment *canon, int64_t outer, uint64_t seed, void *const *inputs) {
  int64_t marks[MAX_MARKS];
  const size_t n_marks = marks_of(canon, marks);
  const int64_t cols = columns_of(canon), edges[4] = {-1, 0, cols - 1, cols};
  uint64_t x = seed | 1;
  for (uint32_t k = 0; k < canon->n_inputs; k++) {
    const fm_tensor *t = &canon->inputs[k];
    const int column = fm_fragment_has_iota(canon) && t->dtype != FM_DT_BOOL && compared_with_iota(canon, k);
    if (!inputs[k] || !(column || (t->dtype == FM_DT_I64 && read_as_data(canon, k)))) continue;
    int64_t size[FM_MAX_RANK], idx[FM_MAX_RANK] = {0};
    for (uint32_t j = 0; j < t->rank; j++) size[j] = t->shape[j] == FM_DIM_SYMBOLIC ? outer : t->shape[j];
    for (;;) { /* every element of the tensor's shape, last dim fastest */
      int64_t off = 0;
      for (uint32_t j = 0; j < t->rank; j++) off += idx[j] * t->strides[j];
      const uint64_t r = next(&x);
      if (column) /* a column in [-1, C]: a quarter at the ends or one outside each */
        store_int(t->dtype, inputs[k], off, (r & 3) ? (int64_t)((r >> 2) % (uint64_t)cols) : edges[(r >> 2) % 4]);
      else
        ((int64_t *)inputs[k])[off] =
            (r & 1) ? marks[(r >> 1) % n_marks] : (int64_t)((r >> 1) % (2 * UNIFORM_SPAN + 1)) - UNIFORM_SPAN;
      uint32_t j = t->rank;
      while (j-- > 0 && ++idx[j] >= size[j]) idx[j] = 0;
      if (j == UINT32_MAX) break;
    }
  }
}
