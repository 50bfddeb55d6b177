/* fm_reference_integer.c: verification inputs for integer values (vocab 10). Random bits make
 * no labels: an i64 input read as data gets small integers, half of them at the fragment's
 * own integer constants and one either side (-100 and its neighbours for a loss's
 * ignore_index, 0 and V - 1 and V for its range check), so every comparison and every
 * where is seen taking both sides at its boundary. */
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

void fm_reference_integer_inputs(const fm_fragment *canon, int64_t outer, uint64_t seed, void *const *inputs) {
  int64_t marks[MAX_MARKS];
  const size_t n_marks = marks_of(canon, marks);
  uint64_t x = seed | 1;
  for (uint32_t k = 0; k < canon->n_inputs; k++) {
    const fm_tensor *t = &canon->inputs[k];
    if (t->dtype != FM_DT_I64 || !inputs[k] || !read_as_data(canon, k)) continue;
    int64_t size[FM_MAX_RANK], idx[FM_MAX_RANK] = {0};
    for (uint32_t j = 0; j < t->rank; j++) size[j] = t->shape[j] == FM_DIM_SYMBOLIC ? outer : t->shape[j];
    for (;;) { /* every element of the tensor's shape, last dim fastest */
      int64_t off = 0;
      for (uint32_t j = 0; j < t->rank; j++) off += idx[j] * t->strides[j];
      const uint64_t r = next(&x);
      ((int64_t *)inputs[k])[off] =
          (r & 1) ? marks[(r >> 1) % n_marks] : (int64_t)((r >> 1) % (2 * UNIFORM_SPAN + 1)) - UNIFORM_SPAN;
      uint32_t j = t->rank;
      while (j-- > 0 && ++idx[j] >= size[j]) idx[j] = 0;
      if (j == UINT32_MAX) break;
    }
  }
}
