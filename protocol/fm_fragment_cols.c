/* fm_fragment_cols.c: column fragments (vocab 5, fm_fragment.h): reductions over dim 0 of a
 * rank-2 value, `grad.sum(0)` of a bias gradient. The one place that says what a column
 * fragment is, which value lives in the [M, N] space and which one per column, and what
 * validation refuses. Validation, the CPU reference and the cols template all read the
 * classes from fm_fragment_cols_info, so they cannot disagree about what a fragment means. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "fm_fragment_int.h"

static int is_dim0(int32_t dim) { return dim == 0 || dim == -2; }

int fm_fragment_is_cols(const fm_fragment *f) {
  if (!f || f->n_inputs > FM_MAX_INPUTS || f->n_ops > FM_MAX_OPS || f->n_outputs > FM_MAX_OUTPUTS) return 0;
  uint32_t r = 0;
  for (uint32_t k = 0; k < f->n_inputs; k++) r = f->inputs[k].rank > r ? f->inputs[k].rank : r;
  for (uint32_t k = 0; k < f->n_outputs; k++) r = f->outputs[k].rank > r ? f->outputs[k].rank : r;
  if (r != 2) return 0; /* rank 1: dim 0 is the last dim (a row); rank > 2: refused as rows */
  int cols = 0;
  for (uint32_t i = 0; i < f->n_ops; i++) {
    fm_opkind kind = fm_op_kind(f->ops[i].op);
    if (kind == FM_OPK_MATMUL) return 0; /* a GEMM fragment, which refuses any reduction */
    if (kind == FM_OPK_REDUCE && is_dim0(f->ops[i].dim)) cols = 1;
  }
  return cols;
}

int fm_fragment_cols_info(const fm_fragment *f, fm_cols_info *ci, fm_diag *d) {
  memset(ci, 0, sizeof *ci);
  if (!fm_fragment_is_cols(f)) return fm_diag_set(d, FM_EINVAL, "not a column fragment");
  ci->m = 1;
  ci->n = 1;
  for (uint32_t k = 0; k < f->n_inputs + f->n_outputs; k++) {
    const fm_tensor *t = k < f->n_inputs ? &f->inputs[k] : &f->outputs[k - f->n_inputs];
    if (t->rank != 2) return fm_diag_set(d, FM_EINVAL, "tensor %u: rank %u, not 2", k, t->rank);
    if (k < f->n_inputs && t->shape[0] != 1 && ci->m == 1) ci->m = t->shape[0];
    if (t->shape[1] > ci->n) ci->n = t->shape[1];
  }
  /* with M == 1 every input is in the column space (a [1, N] input is then both) */
  for (uint32_t k = 0; k < f->n_inputs; k++)
    ci->in_cls[k] = f->inputs[k].shape[0] == ci->m ? FM_COLS_SPACE : FM_COLS_PRE;
  for (uint32_t i = 0; i < f->n_ops; i++) {
    const fm_opnode *op = &f->ops[i];
    int space = 0, post = -1; /* post: the reduction-derived arg, if any */
    for (uint32_t a = 0; a < op->nargs && a < 3; a++) {
      int pos = fm_fragment_find_value(f, op->args[a]);
      if (pos < 0 || pos >= (int)(f->n_inputs + i))
        return fm_diag_set(d, FM_EINVAL, "ops[%u].args[%u]: undefined value", i, a);
      uint8_t c = pos < (int)f->n_inputs ? ci->in_cls[pos] : ci->op_cls[pos - (int)f->n_inputs];
      if (c == FM_COLS_SPACE) space = 1;
      if (c == FM_COLS_POST) post = (int)a;
    }
    if (fm_op_kind(op->op) == FM_OPK_REDUCE) {
      if (!space)
        return fm_diag_set(d, FM_EUNSUPPORTED,
                           "ops[%u].args[0]: nested reduction: value %u is already one value per column", i,
                           op->args[0]);
      ci->op_cls[i] = FM_COLS_POST;
    } else if (space && post >= 0) {
      return fm_diag_set(d, FM_EUNSUPPORTED,
                         "ops[%u].args[%d]: value %u comes from a column reduction and is read in the "
                         "[M, N] space; that needs a second pass over the rows",
                         i, post, op->args[post]);
    } else {
      ci->op_cls[i] = space ? FM_COLS_SPACE : post >= 0 ? FM_COLS_POST : FM_COLS_PRE;
    }
  }
  return FM_OK;
}

/* The reductions: all over dim 0, sum / mean / amax, in a fragment that says vocab 5. */
static int check_reductions(const fm_fragment *f, fm_diag *d) {
  for (uint32_t i = 0; i < f->n_ops && f->vocab < FM_VOCAB_COLS; i++) {
    const fm_opnode *op = &f->ops[i];
    if (fm_op_kind(op->op) == FM_OPK_REDUCE && is_dim0(op->dim)) /* what a vocab-4 daemon says */
      return fm_diag_set(d, FM_EUNSUPPORTED,
                         "ops[%u].dim: '%s' over dim %d of a rank-2 row; only the last dim (-1) can be "
                         "reduced (a reduction over dim 0 is a column fragment: vocab %d)",
                         i, fm_op_name(op->op), op->dim, FM_VOCAB_COLS);
  }
  for (uint32_t i = 0; i < f->n_ops; i++) {
    const fm_opnode *op = &f->ops[i];
    if (fm_op_kind(op->op) != FM_OPK_REDUCE) continue;
    if (!is_dim0(op->dim))
      return fm_diag_set(d, FM_EUNSUPPORTED,
                         "ops[%u].dim: '%s' over dim %d; a fragment reduces over dim 0 (columns) or over the "
                         "last dim (rows), not both",
                         i, fm_op_name(op->op), op->dim);
    if (op->op == FM_OP_VAR)
      return fm_diag_set(d, FM_EUNSUPPORTED,
                         "ops[%u]: 'var' over dim 0 is not supported (columns reduce "
                         "by sum, mean and amax)",
                         i);
  }
  return FM_OK;
}

/* Every input broadcasts to [M, N]: dim 0 is M or 1, dim 1 is N or 1. */
static int check_inputs(const fm_fragment *f, fm_diag *d) {
  int64_t m = 1, n = 1;
  for (uint32_t k = 0; k < f->n_inputs + f->n_outputs; k++) {
    const fm_tensor *t = k < f->n_inputs ? &f->inputs[k] : &f->outputs[k - f->n_inputs];
    if (t->shape[1] > n) n = t->shape[1];
  }
  for (uint32_t k = 0; k < f->n_inputs; k++) {
    const int64_t *s = f->inputs[k].shape;
    if (s[0] != 1 && m != 1 && s[0] != m) {
      if (m == FM_DIM_SYMBOLIC)
        return fm_diag_set(d, FM_ESCHEMA,
                           "inputs[%u].shape[0]: %" PRId64
                           " must be -1 (symbolic) or 1 "
                           "(broadcast): the columns' M is symbolic",
                           k, s[0]);
      if (s[0] == FM_DIM_SYMBOLIC)
        return fm_diag_set(d, FM_ESCHEMA, "inputs[%u].shape[0]: symbolic, but M is static (%" PRId64 ")", k, m);
      return fm_diag_set(d, FM_ESCHEMA, "inputs[%u].shape[0]: %" PRId64 " does not broadcast to M = %" PRId64, k, s[0],
                         m);
    }
    if (s[0] != 1) m = s[0];
    if (s[1] != 1 && s[1] != n)
      return fm_diag_set(d, FM_ESCHEMA, "inputs[%u].shape[1]: %" PRId64 " does not broadcast to N = %" PRId64, k, s[1],
                         n);
  }
  return FM_OK;
}

int fm_fragment_check_cols(fm_fragment *f, fm_diag *d) {
  int rc = check_reductions(f, d);
  if (rc) return rc;
  for (uint32_t k = 0; k < f->n_inputs; k++) fm_fragment_prepend_ones(&f->inputs[k], 2);
  for (uint32_t k = 0; k < f->n_outputs; k++) {
    if (f->outputs[k].rank == 0)
      return fm_diag_set(d, FM_ESCHEMA,
                         "outputs[%u].shape: rank 0; a column fragment's outputs are "
                         "[1, N] or [N]",
                         k);
    fm_fragment_prepend_ones(&f->outputs[k], 2); /* keepdim=false */
  }
  if ((rc = check_inputs(f, d))) return rc;
  fm_cols_info ci;
  if ((rc = fm_fragment_cols_info(f, &ci, d))) return rc;
  int reduced = 0;
  for (uint32_t k = 0; k < f->n_outputs; k++) {
    const fm_tensor *t = &f->outputs[k];
    int pos = fm_fragment_find_value(f, t->id);
    uint8_t c = pos < 0 ? 0 : pos < (int)f->n_inputs ? ci.in_cls[pos] : ci.op_cls[pos - (int)f->n_inputs];
    if (c == FM_COLS_SPACE)
      return fm_diag_set(d, FM_EUNSUPPORTED,
                         "outputs[%u]: value %u is in the [M, N] space; a column fragment writes per-column "
                         "values only ([1, N])",
                         k, t->id);
    if (t->shape[0] != 1 || t->shape[1] != ci.n)
      return fm_diag_set(d, FM_ESCHEMA,
                         "outputs[%u].shape: [%" PRId64 ", %" PRId64
                         "]; a column fragment's outputs are "
                         "[1, N] = [1, %" PRId64 "] (or [N])",
                         k, t->shape[0], t->shape[1], ci.n);
    reduced |= c == FM_COLS_POST;
  }
  /* the canonical form keeps what the outputs need: without a reduction among it, it would
     be a pointwise fragment over inputs that do not fit it */
  if (!reduced)
    return fm_diag_set(d, FM_EUNSUPPORTED, "outputs: none depends on a column reduction (nothing to reduce)");
  return FM_OK;
}
