/* fm_codegen_rows_plan.c: what a row kernel must do, decided before any source is written:
 * value numbering and liveness, which values are whole rows (register arrays) and which
 * one per row (scalars), the row shape, how each tensor's rows are addressed, and the
 * widest vector every row tensor allows.
 *
 * The fragment is expected to be canonical and valid (fm_fragment_validate normalised its
 * per-row outputs to [..., 1]); every index used is re-checked, so a malformed struct gives
 * FM_EINVAL, never an out-of-bounds read. */
#include <string.h>

#include "fm_codegen_rows.h"

#define WIDEST_BYTES 16u /* one access: a uint4 */
#define MOST_PIECES  2u  /* accesses a tensor may take for one vector (an f32 row beside bf16 ones) */

static int find_value(const uint32_t *ids, uint32_t limit, uint32_t id) {
  for (uint32_t k = limit; k-- > 0;)
    if (ids[k] == id) return (int)k;
  return -1;
}

static const fm_tensor *tensor_of(const fm_fragment *f, uint32_t n_in, uint32_t k) {
  return k < n_in ? &f->inputs[k] : &f->outputs[k - n_in];
}

/* Operands -> positions, dtypes, liveness and the row/per-row class of every value. */
static int plan_values(const fm_fragment *f, fm_cg_rows_plan *rp, fm_diag *d) {
  fm_cg_plan *p = &rp->base;
  uint32_t ids[FM_CG_MAX_VALUES];
  for (uint32_t k = 0; k < p->n_in; k++) {
    const fm_tensor *t = &f->inputs[k];
    ids[k] = t->id;
    p->vdt[k] = t->dtype;
    p->rowval[k] = t->rank == rp->rank && t->shape[rp->rank - 1] == rp->n;
  }
  for (uint32_t i = 0; i < p->n_ops; i++) {
    const fm_opnode *op = &f->ops[i];
    uint32_t pos = p->n_in + i;
    if ((unsigned)op->op >= FM_OP__COUNT) return fm_diag_set(d, FM_EINVAL, "ops[%u]: invalid op", i);
    fm_opkind kind = fm_op_kind(op->op);
    if (kind == FM_OPK_RESERVED || kind == FM_OPK_COMPOSITE)
      return fm_diag_set(d, FM_EUNSUPPORTED, "ops[%u]: the rows template cannot run '%s'", i, fm_op_name(op->op));
    int arity = fm_op_arity(op->op);
    if (arity < 0 || op->nargs != (uint32_t)arity)
      return fm_diag_set(d, FM_EINVAL, "ops[%u]: '%s' takes %d args, has %u", i, fm_op_name(op->op), arity, op->nargs);
    if ((unsigned)op->dtype >= FM_DT__COUNT) return fm_diag_set(d, FM_EINVAL, "ops[%u]: invalid result dtype", i);
    p->rowval[pos] = op->op == FM_OP_IOTA; /* a column index: one per element of the row */
    for (uint32_t a = 0; a < op->nargs; a++) {
      int at = find_value(ids, pos, op->args[a]);
      if (at < 0) return fm_diag_set(d, FM_EINVAL, "ops[%u].args[%u]: value not defined before use", i, a);
      p->args[i][a] = (uint16_t)at;
      if (p->rowval[at]) p->rowval[pos] = 1;
    }
    if (kind == FM_OPK_REDUCE) {
      if (!p->rowval[pos]) return fm_diag_set(d, FM_EUNSUPPORTED, "ops[%u]: nested reduction of a per-row value", i);
      p->rowval[pos] = 0;
    }
    ids[pos] = op->out;
    p->vdt[pos] = op->dtype;
  }
  uint32_t n_values = p->n_in + p->n_ops;
  for (uint32_t k = 0; k < p->n_out; k++) {
    int pos = find_value(ids, n_values, f->outputs[k].id);
    if (pos < 0) return fm_diag_set(d, FM_EINVAL, "outputs[%u]: value is not defined", k);
    p->t[p->n_in + k].value = (uint32_t)pos;
    p->live[pos] = 1;
  }
  for (uint32_t i = p->n_ops; i-- > 0;)
    if (p->live[p->n_in + i])
      for (uint32_t a = 0; a < f->ops[i].nargs; a++) p->live[p->args[i][a]] = 1;
  return FM_OK;
}

/* The row shape from outputs[0] and the longest last dim; leading strides per tensor. */
static int plan_shape(const fm_fragment *f, fm_cg_rows_plan *rp, fm_diag *d) {
  fm_cg_plan *p = &rp->base;
  const fm_tensor *it = &f->outputs[0];
  rp->rank = it->rank;
  if (rp->rank < 1 || rp->rank > FM_MAX_RANK)
    return fm_diag_set(d, FM_EINVAL, "row rank %u is not in 1..%d", rp->rank, FM_MAX_RANK);
  uint32_t r = rp->rank, last = r - 1;
  rp->n = 1;
  for (uint32_t k = 0; k < p->n_in + p->n_out; k++) {
    const fm_tensor *t = tensor_of(f, p->n_in, k);
    if (t->rank != r)
      return fm_diag_set(d, FM_EINVAL, "tensor %u: rank %u differs from the row rank %u", k, t->rank, r);
    if (t->shape[last] > rp->n) rp->n = t->shape[last];
  }
  if (rp->n < 1 || rp->n > FM_MAX_ROW)
    return fm_diag_set(d, FM_EUNSUPPORTED, "rows of %lld elements (the limit is %d)", (long long)rp->n, FM_MAX_ROW);
  rp->symbolic = r >= 2 && it->shape[0] == FM_DIM_SYMBOLIC;
  rp->rows_per_outer = 1;
  for (uint32_t g = 0; g + 1 < r; g++) {
    int64_t dim = it->shape[g];
    if (g == 0 && dim == FM_DIM_SYMBOLIC) continue;
    if (dim < 1 || dim >= FM_MAX_DIM) return fm_diag_set(d, FM_EINVAL, "row dim %u is %lld", g, (long long)dim);
    if (g > 0) rp->rows_per_outer *= dim;
    if (rp->rows_per_outer > FM_MAX_ELEMENTS) return fm_diag_set(d, FM_EINVAL, "too many rows");
  }
  rp->outer = r == 1 ? 1 : rp->symbolic ? -1 : it->shape[0];
  for (uint32_t k = 0; k < p->n_in + p->n_out; k++) {
    const fm_tensor *t = tensor_of(f, p->n_in, k);
    fm_cg_tensor *ct = &p->t[k];
    ct->dtype = t->dtype;
    ct->align = t->align;
    if ((unsigned)t->dtype >= FM_DT__COUNT || !t->align || (t->align & (t->align - 1)))
      return fm_diag_set(d, FM_EINVAL, "tensor %u: invalid dtype or align", k);
    if (k < p->n_in) ct->value = k;
    for (uint32_t g = 0; g < r; g++) {
      int64_t want = g == last ? rp->n : it->shape[g], have = t->shape[g];
      if (have != want && have != 1)
        return fm_diag_set(d, FM_EINVAL, "tensor %u: dim %u is %lld, the row dim is %lld", k, g, (long long)have,
                           (long long)want);
      if (t->strides[g] < 0 || t->strides[g] > FM_MAX_STRIDE)
        return fm_diag_set(d, FM_EINVAL, "tensor %u: stride %u out of range", k, g);
      ct->es[g] = (have == 1 && want != 1) ? 0 : t->strides[g];
    }
    rp->row_t[k] = t->shape[last] == rp->n && rp->n > 1;
    if (!rp->row_t[k]) ct->es[last] = 0;
  }
  return FM_OK;
}

/* The widest V (elements) every live row tensor allows: V * size <= 16 bytes for the narrowest
 * (one uint4) and at most two of them for any other (an f32 row beside bf16 ones: cross-
 * entropy's column indices beside its logits read 16 bytes of logits a load where they read 8),
 * the base alignment and every leading stride keep each access aligned, and the row is
 * contiguous. V need not divide N: the kernel reads and writes the chunk a row ends in element
 * by element (fm_cg_rows_shape.ragged). */
static uint32_t plan_vec(const fm_cg_rows_plan *rp) {
  const fm_cg_plan *p = &rp->base;
  uint32_t v = 16, narrowest = 8;
  if (rp->n == 1) return 1; /* no tensor has a row to vectorize */
  for (uint32_t k = 0; k < p->n_in + p->n_out; k++) {
    const fm_cg_tensor *t = &p->t[k];
    if (!rp->row_t[k] || (k < p->n_in && !p->live[k])) continue;
    uint32_t size = (uint32_t)fm_dtype_size(t->dtype);
    if (size < narrowest) narrowest = size;
  }
  for (uint32_t k = 0; k < p->n_in + p->n_out; k++) {
    const fm_cg_tensor *t = &p->t[k];
    if (!rp->row_t[k] || (k < p->n_in && !p->live[k])) continue;
    uint32_t size = (uint32_t)fm_dtype_size(t->dtype);
    if (t->es[rp->rank - 1] != 1) return 1;
    while (v > 1) {
      uint32_t bytes = v * size, access = bytes < WIDEST_BYTES ? bytes : WIDEST_BYTES;
      /* a row whose length is no multiple of v still takes vectors where every row starts
         aligned (a padded row stride): the chunk it ends in is read element by element */
      int ok = v * narrowest <= WIDEST_BYTES && bytes <= MOST_PIECES * WIDEST_BYTES && t->align >= access;
      for (uint32_t g = 0; ok && g + 1 < rp->rank; g++) ok = t->es[g] % v == 0;
      if (ok) break;
      v >>= 1;
    }
  }
  return v;
}

int fm_cg_rows_plan_build(const fm_fragment *f, fm_cg_rows_plan *rp, fm_diag *d) {
  int rc;
  memset(rp, 0, sizeof *rp);
  fm_cg_plan *p = &rp->base;
  if (f->n_inputs > FM_MAX_INPUTS || f->n_ops > FM_MAX_OPS || f->n_outputs > FM_MAX_OUTPUTS || f->n_outputs == 0)
    return fm_diag_set(d, FM_EINVAL, "fragment counts out of range");
  p->n_in = f->n_inputs;
  p->n_out = f->n_outputs;
  p->n_ops = f->n_ops;
  if ((rc = plan_shape(f, rp, d))) return rc;
  if ((rc = plan_values(f, rp, d))) return rc;
  for (uint32_t k = 0; k < p->n_out; k++) {
    uint32_t pos = p->t[p->n_in + k].value;
    if (p->rowval[pos] != rp->row_t[p->n_in + k] && rp->n > 1)
      return fm_diag_set(d, FM_EINVAL, "outputs[%u]: shape does not match its value's class", k);
  }
  for (uint32_t k = 0; k < p->n_in; k++)
    if (p->live[k]) p->t[k].access = p->rowval[k] ? FM_CG_VECTOR : FM_CG_SCALAR;
  rp->max_vec = plan_vec(rp);
  return FM_OK;
}
