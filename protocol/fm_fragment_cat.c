/* fm_fragment_cat.c: the rules of extent fragments (cat, vocabulary 6; the window ops,
 * vocabulary 7: fm_fragment_window.c; fm_fragment.h): every value's extent, so that a cat's
 * operands are evaluated only inside their own sizes and no input is ever read outside its
 * shape, whatever sizes a client sends. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "fm_fragment_int.h"

int fm_fragment_is_cat(const fm_fragment *f) {
  if (!f || f->n_ops > FM_MAX_OPS) return 0;
  for (uint32_t i = 0; i < f->n_ops; i++)
    if (fm_op_kind(f->ops[i].op) == FM_OPK_CAT) return 1;
  return 0;
}

int fm_fragment_is_extent(const fm_fragment *f) {
  if (!f || f->n_ops > FM_MAX_OPS) return 0;
  for (uint32_t i = 0; i < f->n_ops; i++) {
    const fm_opkind kind = fm_op_kind(f->ops[i].op);
    if (kind == FM_OPK_CAT || kind == FM_OPK_WINDOW || kind == FM_OPK_GATHER) return 1;
  }
  return 0;
}

void fm_fragment_format_extent(const int64_t *e, uint32_t r, char *out, size_t cap) {
  size_t k = (size_t)snprintf(out, cap, "[");
  for (uint32_t i = 0; i < r && k < cap; i++)
    k += (size_t)snprintf(out + k, cap - k, "%s%" PRId64, i ? ", " : "", e[i]);
  if (k < cap) snprintf(out + k, cap - k, "]");
}

/* A cat's dim as a non-negative one, or -1 when it is no dim of a rank-r value. */
static int cat_dim(const fm_opnode *op, uint32_t r) {
  int dim = op->dim < 0 ? op->dim + (int)r : op->dim;
  return dim >= 0 && dim < (int)r ? dim : -1;
}

/* take_rows' extent: the index's along dim 0 (src's rows are read where the index points,
 * all S of them), the broadcast of src and the index along the others. */
static int gather_extent(const fm_fragment *f, const fm_cat_info *ci, uint32_t i, int64_t *e, fm_diag *d) {
  const fm_opnode *op = &f->ops[i];
  const uint32_t r = ci->rank;
  const int src = fm_fragment_find_value(f, op->args[0]), index = fm_fragment_find_value(f, op->args[1]);
  char a_s[160], b_s[160];
  if (src < 0 || index < 0 || src >= (int)f->n_inputs || index >= (int)f->n_inputs)
    return fm_diag_set(d, FM_EINVAL, "ops[%u]: take_rows' operands are no fragment inputs", i);
  if (r == 0) return fm_diag_set(d, FM_ESCHEMA, "ops[%u]: take_rows needs rows: the iteration shape is a scalar", i);
  const int64_t *x = ci->ext[src], *ix = ci->ext[index];
  if (x[0] == FM_DIM_SYMBOLIC || ix[0] == FM_DIM_SYMBOLIC)
    return fm_diag_set(d, FM_EUNSUPPORTED, "ops[%u]: take_rows takes static sizes only (dim 0 is symbolic)", i);
  e[0] = ix[0];
  for (uint32_t j = 1; j < r; j++) {
    if (x[j] == ix[j] || ix[j] == 1) {
      e[j] = x[j];
    } else if (x[j] == 1) {
      e[j] = ix[j];
    } else {
      fm_fragment_format_extent(x, r, a_s, sizeof a_s);
      fm_fragment_format_extent(ix, r, b_s, sizeof b_s);
      return fm_diag_set(d, FM_ESCHEMA,
                         "ops[%u]: take_rows' rows %s and index %s do not broadcast along dim %u (only dim 0, the "
                         "rows, may differ)",
                         i, a_s, b_s, j);
    }
  }
  return FM_OK;
}

/* Extent of op i (at position pos) from its operands', into e. */
static int op_extent(const fm_fragment *f, fm_cat_info *ci, uint8_t *has_cat, uint32_t i, fm_diag *d) {
  const fm_opnode *op = &f->ops[i];
  const uint32_t r = ci->rank, pos = f->n_inputs + i;
  const int is_cat = fm_op_kind(op->op) == FM_OPK_CAT;
  const int c = is_cat ? cat_dim(op, r) : -1;
  int64_t *e = ci->ext[pos];
  char a_s[160], b_s[160];
  /* a window op reads its inputs whole at pooled coordinates: no broadcast between them */
  if (fm_op_kind(op->op) == FM_OPK_WINDOW) return fm_fragment_window_extent(f, ci, i, e, d);
  if (fm_op_kind(op->op) == FM_OPK_GATHER) return gather_extent(f, ci, i, e, d);
  if (is_cat && c < 0)
    return fm_diag_set(d, FM_ESCHEMA, "ops[%u].dim: %d is not a dim of the rank-%u iteration space", i, op->dim, r);
  for (uint32_t j = 0; j < r; j++) e[j] = (int)j == c ? 0 : 1;
  for (uint32_t a = 0; a < op->nargs; a++) {
    int q = fm_fragment_find_value(f, op->args[a]);
    if (q < 0 || q >= (int)pos) return fm_diag_set(d, FM_EINVAL, "ops[%u].args[%u]: undefined value", i, a);
    if (has_cat[q] && is_cat)
      return fm_diag_set(d, FM_EUNSUPPORTED,
                         "ops[%u].args[%u]: value %u is computed from a cat; a cat of a cat is not "
                         "supported",
                         i, a, op->args[a]);
    has_cat[pos] |= has_cat[q];
    const int64_t *x = ci->ext[q];
    for (uint32_t j = 0; j < r; j++) {
      if ((int)j == c) {
        if (x[j] == FM_DIM_SYMBOLIC)
          return fm_diag_set(d, FM_ESCHEMA,
                             "ops[%u].args[%u]: cat along dim 0, which is symbolic (its operands' "
                             "sizes must be static)",
                             i, a);
        e[j] += x[j]; /* each < 2^31, at most FM_MAX_ARGS of them: no overflow */
        if (e[j] >= FM_MAX_DIM)
          return fm_diag_set(d, FM_ELIMIT, "ops[%u]: the cat is %" PRId64 " long along dim %d, above 2^31-1", i, e[j],
                             c);
        continue;
      }
      if (x[j] == 1 || x[j] == e[j]) continue;
      if (e[j] == 1) {
        e[j] = x[j];
        continue;
      }
      fm_fragment_format_extent(x, r, a_s, sizeof a_s);
      fm_fragment_format_extent(e, r, b_s, sizeof b_s);
      return fm_diag_set(d, FM_ESCHEMA,
                         "ops[%u].args[%u]: value %u is %s, which does not broadcast with the other "
                         "operands (%s so far) along dim %u",
                         i, a, op->args[a], a_s, b_s, j);
    }
  }
  if (is_cat) has_cat[pos] = 1;
  return FM_OK;
}

int fm_fragment_cat_info(const fm_fragment *f, fm_cat_info *ci, fm_diag *d) {
  const fm_tensor *it = &f->outputs[0];
  const uint32_t r = it->rank;
  char want[160], got[160];
  uint8_t has_cat[FM_MAX_INPUTS + FM_MAX_OPS] = {0};
  uint8_t read[FM_MAX_INPUTS] = {0};
  if (f->n_inputs > FM_MAX_INPUTS || f->n_ops > FM_MAX_OPS || f->n_outputs < 1 || f->n_outputs > FM_MAX_OUTPUTS ||
      r > FM_MAX_RANK)
    return fm_diag_set(d, FM_EINVAL, "cat fragment exceeds the limits");
  ci->rank = r;
  fm_fragment_format_extent(it->shape, r, want, sizeof want);
  for (uint32_t k = 0; k < f->n_outputs; k++) {
    const fm_tensor *t = &f->outputs[k];
    int same = t->rank == r;
    for (uint32_t j = 0; same && j < r; j++) same = t->shape[j] == it->shape[j];
    if (!same) {
      fm_fragment_format_extent(t->shape, t->rank, got, sizeof got);
      return fm_diag_set(d, FM_ESCHEMA, "outputs[%u].shape: %s differs from the iteration shape %s (outputs[0])", k,
                         got, want);
    }
  }
  for (uint32_t k = 0; k < f->n_inputs; k++) {
    const fm_tensor *t = &f->inputs[k];
    if (t->rank != r)
      return fm_diag_set(d, FM_ESCHEMA,
                         "inputs[%u].shape: rank %u differs from the iteration rank %u (broadcast "
                         "with size-1 dims)",
                         k, t->rank, r);
    for (uint32_t j = 0; j < r; j++) ci->ext[k][j] = t->shape[j];
  }
  for (uint32_t i = 0; i < f->n_ops; i++) {
    int rc = op_extent(f, ci, has_cat, i, d);
    if (rc) return rc;
    for (uint32_t a = 0; a < f->ops[i].nargs; a++) {
      int q = fm_fragment_find_value(f, f->ops[i].args[a]);
      if (q >= 0 && q < (int)f->n_inputs) read[q] = 1;
    }
  }
  /* what is stored, and an input nothing reads, spans the iteration shape (or broadcasts) */
  for (uint32_t k = 0; k < f->n_outputs + f->n_inputs; k++) {
    int out = k < f->n_outputs;
    uint32_t idx = out ? k : k - f->n_outputs;
    int q = out ? fm_fragment_find_value(f, f->outputs[idx].id) : (int)idx;
    if (q < 0) return fm_diag_set(d, FM_EINVAL, "outputs[%u]: undefined value", idx);
    if (!out && read[idx]) continue;
    const int64_t *x = ci->ext[q];
    for (uint32_t j = 0; j < r; j++) {
      if (x[j] == it->shape[j] || x[j] == 1) continue;
      fm_fragment_format_extent(x, r, got, sizeof got);
      if (out)
        return fm_diag_set(d, FM_ESCHEMA,
                           "outputs[%u]: value %u is %s, which does not broadcast to the iteration "
                           "shape %s along dim %u (a cat's operand sizes must add up to the output's)",
                           idx, f->outputs[idx].id, got, want, j);
      return fm_diag_set(d, FM_ESCHEMA, "inputs[%u].shape: %s does not broadcast to the iteration shape %s", idx, got,
                         want);
    }
  }
  return FM_OK;
}

int fm_fragment_check_cat(fm_fragment *f, fm_diag *d) {
  fm_cat_info *ci = malloc(sizeof *ci);
  if (!ci) return fm_diag_set(d, FM_ENOMEM, "validation: out of memory");
  int rc = fm_fragment_cat_info(f, ci, d);
  free(ci);
  if (rc) return rc;
  const uint32_t r = f->outputs[0].rank;
  for (uint32_t i = 0; i < f->n_ops; i++)
    if (fm_op_kind(f->ops[i].op) == FM_OPK_CAT) f->ops[i].dim = cat_dim(&f->ops[i], r);
  return FM_OK;
}
