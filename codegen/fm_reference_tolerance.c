/* fm_reference_tolerance.c: how close a kernel's output must come to fm_reference_eval's: its
 * dtype's tolerance, or that of the coarsest rounding behind it (a cast, or a 16-bit product). */
#include "fm_reference.h"

static double dtype_tolerance(fm_dtype dt) {
  switch (dt) {
    case FM_DT_BF16:
      return 1e-2;
    case FM_DT_F16:
      return 2e-3;
    case FM_DT_F32:
      return 1e-4;
    default:
      return 0; /* bool: exact */
  }
}

/* The loosest rounding behind value id among the first n ops (0: computed without a cast,
 * or an input, which both sides read exactly). */
static double rounding_of(const fm_fragment *f, const double *op_rounding, uint32_t n, uint32_t id) {
  for (uint32_t j = 0; j < n; j++)
    if (f->ops[j].out == id) return op_rounding[j];
  return 0;
}

double fm_reference_tolerance(const fm_fragment *f, uint32_t k) {
  double own = dtype_tolerance(f->outputs[k].dtype);
  if (f->outputs[k].dtype == FM_DT_BOOL) return own;
  double op_rounding[FM_MAX_OPS];
  for (uint32_t j = 0; j < f->n_ops; j++) {
    const fm_opnode *o = &f->ops[j];
    double r = 0;
    for (uint32_t a = 0; a < o->nargs; a++) {
      double u = rounding_of(f, op_rounding, j, o->args[a]);
      if (u > r) r = u;
    }
    /* a cast rounds; so may a product, to its operands' 16-bit dtype: the cuBLASLt split form
       writes A@B to a scratch in that dtype before the epilogue, as eager's mm does */
    const int rounds = o->op == FM_OP_CAST || fm_op_kind(o->op) == FM_OPK_MATMUL;
    if (rounds && dtype_tolerance(o->dtype) > r) r = dtype_tolerance(o->dtype);
    op_rounding[j] = r;
  }
  double behind = rounding_of(f, op_rounding, f->n_ops, f->outputs[k].id);
  return behind > own ? behind : own;
}
