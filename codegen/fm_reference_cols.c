/* fm_reference_cols.c: the CPU reference of column fragments (fm_fragment.h, vocab 5), column
 * by column: the per-column values before any reduction, then every row's column-space ops
 * with the reductions accumulated in fp64 (sum; mean = sum / M; amax propagating NaN), then
 * the per-column values after them and the stores. The classes come from
 * fm_fragment_cols_info, the arithmetic from fm_reference.c's op table (not codegen's). */
#include <math.h>

#include "fm_reference_int.h"

int fm_ref_eval_cols(const fm_fragment *f, const ref_prog *pr, int64_t outer, const void *const *inputs,
                     void *const *outputs, fm_diag *d) {
  fm_cols_info ci;
  int rc = fm_fragment_cols_info(f, &ci, d);
  if (rc) return rc;
  const int64_t M = ci.m == FM_DIM_SYMBOLIC ? outer : ci.m;
  if (M < 0) return fm_diag_set(d, FM_EINVAL, "reference: outer %lld < 0", (long long)outer);
  const uint32_t n_in = f->n_inputs;
  uint8_t cls[REF_MAX_VALUES];
  for (uint32_t k = 0; k < n_in; k++) cls[k] = ci.in_cls[k];
  for (uint32_t o = 0; o < f->n_ops; o++) cls[n_in + o] = ci.op_cls[o];
  double v[REF_MAX_VALUES];
  for (int64_t n = 0; n < ci.n; n++) {
    for (uint32_t k = 0; k < n_in; k++) v[k] = cls[k] == FM_COLS_PRE ? fm_ref_load_mn(f, inputs, k, 0, n) : NAN;
    /* the phases: per-column values before the rows, the rows, those after (the reductions'
       results and what reads them) */
    for (int phase = 0; phase < 3; phase++) {
      const uint8_t want = phase == 0 ? FM_COLS_PRE : phase == 1 ? FM_COLS_SPACE : FM_COLS_POST;
      for (uint32_t o = 0; o < f->n_ops; o++) {
        const fm_opnode *op = &f->ops[o];
        if (fm_op_kind(op->op) == FM_OPK_REDUCE && phase == 1)
          v[n_in + o] = op->op == FM_OP_AMAX ? -INFINITY : 0.0; /* the accumulator */
        if (fm_op_kind(op->op) == FM_OPK_REDUCE && phase == 2 && op->op == FM_OP_MEAN)
          v[n_in + o] /= (double)M; /* M = 0: 0 / 0, NaN as torch */
      }
      for (int64_t m = 0; m < (phase == 1 ? M : 1); m++) {
        if (phase == 1)
          for (uint32_t k = 0; k < n_in; k++)
            if (cls[k] == FM_COLS_SPACE) v[k] = fm_ref_load_mn(f, inputs, k, m, n);
        for (uint32_t o = 0; o < f->n_ops; o++) {
          const fm_opnode *op = &f->ops[o];
          const uint16_t *a = pr->args[o];
          uint32_t na = op->nargs;
          if (fm_op_kind(op->op) == FM_OPK_REDUCE) {
            if (phase == 1)
              v[n_in + o] = op->op == FM_OP_AMAX ? fm_ref_nan_max(v[n_in + o], v[a[0]]) : v[n_in + o] + v[a[0]];
            continue;
          }
          if (cls[n_in + o] != want) continue;
          v[n_in + o] = fm_ref_op(op, na > 0 ? v[a[0]] : 0, na > 1 ? v[a[1]] : 0, na > 2 ? v[a[2]] : 0);
        }
      }
    }
    for (uint32_t k = 0; k < f->n_outputs; k++) {
      const fm_tensor *t = &f->outputs[k];
      fm_ref_store(t->dtype, outputs[k], t->shape[1] == 1 ? 0 : n * t->strides[1], v[pr->out_value[k]]);
    }
  }
  return FM_OK;
}
