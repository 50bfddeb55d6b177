/* fm_fragment_iota.c: iota (vocab 11, fm_fragment.h): which fragments hold one, and where
 * one may run. The op's own rules (no args, an f32 or i64 dtype) live with the other ops' in
 * fm_fragment_validate.c; this is what validation asks of the whole fragment. */
#include "fm_fragment_int.h"

int fm_fragment_has_iota(const fm_fragment *f) {
  for (uint32_t i = 0; i < f->n_ops && i < FM_MAX_OPS; i++)
    if (f->ops[i].op == FM_OP_IOTA) return 1;
  return 0;
}

int fm_fragment_check_iota(const fm_fragment *f, fm_diag *d) {
  if (!fm_fragment_has_iota(f)) return FM_OK;
  /* the templates of the other kinds index their values otherwise (a product's tiles, a
     column's rows, a cat's branches): the client reads an arange there instead */
  if (fm_fragment_is_scatter(f) || fm_fragment_is_extent(f) || fm_fragment_is_gemm(f) || fm_fragment_is_cols(f))
    return fm_diag_set(d, FM_EUNSUPPORTED,
                       "iota runs in a pointwise or row fragment only (not with a product, a column reduction, a "
                       "cat, a window op, index_add or take_rows)");
  /* a row's length is static and at most FM_MAX_ROW: every column is exact in f32 */
  if (fm_fragment_is_rows(f)) return FM_OK;
  const fm_tensor *it = &f->outputs[0];
  const int64_t last = it->rank ? it->shape[it->rank - 1] : 1;
  for (uint32_t i = 0; i < f->n_ops; i++) {
    if (f->ops[i].op != FM_OP_IOTA || f->ops[i].dtype != FM_DT_F32) continue;
    if (last == FM_DIM_SYMBOLIC || last > FM_MAX_INT_CONST)
      return fm_diag_set(d, FM_EUNSUPPORTED,
                         "ops[%u]: an f32 iota along a last dim of %s: f32 holds every index up to 2^24 exactly "
                         "(an i64 iota holds any)",
                         i, last == FM_DIM_SYMBOLIC ? "symbolic size" : "more than 2^24");
  }
  return FM_OK;
}
