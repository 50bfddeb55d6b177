/* fm_fragment_integer.c: integer values (vocab 10, fm_fragment.h): which fragments hold them,
 * and which constants may meet them. The per-op rules live with the other dtype rules in
 * fm_fragment_validate.c; this is what the canonical form and validation ask of a whole
 * fragment. */
#include "fm_fragment_int.h"

/* Comparisons only (the protocol library links no libm): NaN fails both bounds. */
int fm_int_const_ok(double c) {
  return c >= -(double)FM_MAX_INT_CONST && c <= (double)FM_MAX_INT_CONST && c == (double)(int64_t)c;
}

/* The dtype of value id among the inputs and ops[0, limit). */
static fm_dtype dtype_of(const fm_fragment *f, uint32_t limit, uint32_t id) {
  for (uint32_t j = limit; j-- > 0;)
    if (f->ops[j].out == id) return f->ops[j].dtype;
  for (uint32_t k = 0; k < f->n_inputs; k++)
    if (f->inputs[k].id == id) return f->inputs[k].dtype;
  return FM_DT__COUNT;
}

int fm_fragment_has_integers(const fm_fragment *f) {
  for (uint32_t k = 0; k < f->n_outputs; k++)
    if (f->outputs[k].dtype == FM_DT_I64) return 1;
  for (uint32_t i = 0; i < f->n_ops && i < FM_MAX_OPS; i++) {
    const fm_opnode *op = &f->ops[i];
    if (op->op == FM_OP_CONST) continue;
    if (op->dtype == FM_DT_I64) return 1;
    const uint32_t data_args = fm_op_data_args(op->op, op->nargs); /* an index names rows */
    for (uint32_t a = 0; a < data_args && a < FM_MAX_ARGS; a++)
      if (dtype_of(f, i, op->args[a]) == FM_DT_I64) return 1;
  }
  return 0;
}
