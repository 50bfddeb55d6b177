/* fm_fragment_scatter.c: the rules of scatter fragments (vocabulary 8: index_add;
 * fm_fragment.h): one op over two inputs and one output whose sizes agree, so that the only
 * address a kernel computes from data, out + index[m] * D, is checked against R at run time
 * and every other one lies inside a tensor whatever sizes a client sends. */
#include <inttypes.h>

#include "fm_fragment_int.h"

int fm_fragment_is_scatter(const fm_fragment *f) {
  for (uint32_t i = 0; i < f->n_ops; i++)
    if (fm_op_kind(f->ops[i].op) == FM_OPK_SCATTER) return 1;
  return 0;
}

int fm_fragment_scatter_inputs(const fm_fragment *f, uint32_t *src, uint32_t *index) {
  if (!fm_fragment_is_scatter(f) || f->n_ops != 1 || f->n_inputs != 2 || f->n_outputs != 1) return FM_EINVAL;
  const int s = fm_fragment_find_value(f, f->ops[0].args[0]), x = fm_fragment_find_value(f, f->ops[0].args[1]);
  if (s < 0 || x < 0 || s == x || s >= (int)f->n_inputs || x >= (int)f->n_inputs) return FM_EINVAL;
  *src = (uint32_t)s;
  *index = (uint32_t)x;
  return FM_OK;
}

static int is_static(const fm_tensor *t) {
  for (uint32_t i = 0; i < t->rank; i++)
    if (t->shape[i] == FM_DIM_SYMBOLIC) return 0;
  return 1;
}

int fm_fragment_check_scatter(const fm_fragment *f, fm_diag *d) {
  if (f->n_ops != 1 || f->n_inputs != 2 || f->n_outputs != 1)
    return fm_diag_set(d, FM_EUNSUPPORTED,
                       "index_add runs alone: one op over two inputs (src, index) and one output (got %u ops, %u "
                       "inputs, %u outputs)",
                       f->n_ops, f->n_inputs, f->n_outputs);
  const fm_opnode *op = &f->ops[0];
  const fm_tensor *out = &f->outputs[0];
  uint32_t s, x;
  if (fm_fragment_scatter_inputs(f, &s, &x))
    return fm_diag_set(d, FM_ESCHEMA, "ops[0].args: index_add's src and index are the two fragment inputs");
  const fm_tensor *src = &f->inputs[s], *index = &f->inputs[x];
  if (out->id != op->out) return fm_diag_set(d, FM_ESCHEMA, "outputs[0].id: stores %u, not index_add's value", out->id);
  if (!is_static(src) || !is_static(index) || !is_static(out))
    return fm_diag_set(d, FM_EUNSUPPORTED, "index_add: static sizes only (no symbolic dim)");
  if (src->rank != 2 || out->rank != 2)
    return fm_diag_set(d, FM_ESCHEMA, "index_add: src and the output are [M, D] and [R, D] (ranks %u and %u)",
                       src->rank, out->rank);
  if (index->rank != 1 || index->shape[0] != src->shape[0])
    return fm_diag_set(d, FM_ESCHEMA, "inputs[%u].shape: index_add's index is [M] = [%" PRId64 "], one row of src each",
                       x, src->shape[0]);
  if (out->shape[1] != src->shape[1])
    return fm_diag_set(d, FM_ESCHEMA, "outputs[0].shape: rows of %" PRId64 " where src's have %" PRId64, out->shape[1],
                       src->shape[1]);
  if (out->dtype != FM_DT_F32)
    return fm_diag_set(d, FM_EUNSUPPORTED, "outputs[0].dtype: index_add adds into f32, not %s",
                       fm_dtype_name(out->dtype));
  /* the kernel's one computed address is row index[m] of a dense output */
  if ((out->shape[1] > 1 && out->strides[1] != 1) || (out->shape[0] > 1 && out->strides[0] != out->shape[1]))
    return fm_diag_set(d, FM_EUNSUPPORTED,
                       "outputs[0].strides: index_add adds into a row-major [R, D] (strides [%" PRId64 ", 1])",
                       out->shape[1]);
  return FM_OK;
}
