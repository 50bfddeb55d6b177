/* fm_codegen_cols_plan.c: what a column kernel must do, decided before any source is
 * written: value numbering and liveness, each value's class (column-space, per column before
 * or after the reductions: fm_fragment_cols_info), which values vary along the columns
 * (register arrays over a thread's columns) and which are one number (a [M, 1] or [1, 1]
 * input, a const), how each tensor is addressed, and whether 8-column vector loads are legal.
 *
 * The fragment is expected to be canonical and valid (fm_fragment_validate gave every tensor
 * rank 2); every index used is re-checked, so a malformed struct gives FM_EINVAL, never an
 * out-of-bounds read. */
#include <string.h>

#include "fm_codegen_cols.h"

#define WIDEST_BYTES 16u

static const fm_tensor *tensor_of(const fm_fragment *f, uint32_t n_in, uint32_t k) {
  return k < n_in ? &f->inputs[k] : &f->outputs[k - n_in];
}

/* Per tensor: dtype, alignment, strides as the kernel uses them (0 where broadcast). */
static int plan_tensors(const fm_fragment *f, fm_cg_cols_plan *cp, fm_diag *d) {
  fm_cg_plan *p = &cp->base;
  for (uint32_t k = 0; k < p->n_in + p->n_out; k++) {
    const fm_tensor *t = tensor_of(f, p->n_in, k);
    fm_cg_tensor *ct = &p->t[k];
    if (t->rank != 2 || (unsigned)t->dtype >= FM_DT__COUNT || !t->align || (t->align & (t->align - 1)))
      return fm_diag_set(d, FM_EINVAL, "tensor %u: not a rank-2 tensor of a valid dtype and align", k);
    ct->dtype = t->dtype;
    ct->align = t->align;
    if (k < p->n_in) ct->value = k;
    for (uint32_t g = 0; g < 2; g++) {
      if (t->strides[g] < 0 || t->strides[g] > FM_MAX_STRIDE)
        return fm_diag_set(d, FM_EINVAL, "tensor %u: stride %u out of range", k, g);
      ct->es[g] = t->shape[g] == 1 ? 0 : t->strides[g];
    }
  }
  return FM_OK;
}

/* Classes by position, and which values vary along the columns: an input with N columns, an
 * op with such an operand (a reduction of one too: one result per column). */
static void plan_classes(const fm_fragment *f, fm_cg_cols_plan *cp) {
  fm_cg_plan *p = &cp->base;
  for (uint32_t k = 0; k < p->n_in; k++) {
    cp->cls[k] = cp->info.in_cls[k];
    p->rowval[k] = f->inputs[k].shape[1] != 1;
  }
  for (uint32_t i = 0; i < p->n_ops; i++) {
    uint32_t pos = p->n_in + i;
    cp->cls[pos] = cp->info.op_cls[i];
    p->rowval[pos] = 0;
    for (uint32_t a = 0; a < f->ops[i].nargs; a++) p->rowval[pos] |= p->rowval[p->args[i][a]];
    if (fm_op_kind(f->ops[i].op) == FM_OPK_REDUCE && p->live[pos]) cp->n_red++;
  }
  for (uint32_t k = 0; k < p->n_in; k++)
    if (p->live[k] && cp->cls[k] == FM_COLS_SPACE)
      *(p->rowval[k] ? &cp->col_bytes : &cp->row_bytes) += (uint32_t)fm_dtype_size(p->t[k].dtype);
}

/* Where each live value is needed: over the rows (the column-space ops and reductions read
 * it), in the epilogue (an output stores it, or a per-column op after the reductions reads
 * it; a reduction hands over its result, not its operand), or both (a per-column value). */
static void plan_needs(const fm_fragment *f, fm_cg_cols_plan *cp) {
  fm_cg_plan *p = &cp->base;
  for (uint32_t k = 0; k < p->n_out; k++) cp->epi[p->t[p->n_in + k].value] = 1;
  for (uint32_t i = p->n_ops; i-- > 0;) {
    uint32_t pos = p->n_in + i;
    if (!p->live[pos]) continue;
    int reduce = fm_op_kind(f->ops[i].op) == FM_OPK_REDUCE;
    if (cp->cls[pos] == FM_COLS_SPACE || reduce) cp->loop[pos] = 1;
    for (uint32_t a = 0; a < f->ops[i].nargs; a++) {
      uint32_t x = p->args[i][a];
      if (cp->loop[pos]) cp->loop[x] = 1;
      if (cp->epi[pos] && !reduce) cp->epi[x] = 1;
    }
  }
}

/* 8 columns a thread, one access per row of each live column-space input with N columns: N a
 * multiple of 8, stride 1 along the columns, and every row's start aligned to the access
 * (min(16, 8 * size) bytes: one uint4 for 16-bit, two for f32, a uint2 for bool). */
static int plan_vec(const fm_cg_cols_plan *cp) {
  const fm_cg_plan *p = &cp->base;
  if (cp->info.n % FM_COLS_VEC) return 0;
  for (uint32_t k = 0; k < p->n_in; k++) {
    if (!p->live[k] || cp->cls[k] != FM_COLS_SPACE || !p->rowval[k]) continue;
    const fm_cg_tensor *t = &p->t[k];
    uint64_t size = fm_dtype_size(t->dtype), w = FM_COLS_VEC * size < WIDEST_BYTES ? FM_COLS_VEC * size : WIDEST_BYTES;
    if (t->es[1] != 1 || t->align < w || ((uint64_t)t->es[0] * size) % w) return 0;
  }
  return 1;
}

int fm_cg_cols_plan_build(const fm_fragment *f, fm_cg_cols_plan *cp, fm_diag *d) {
  int rc;
  memset(cp, 0, sizeof *cp);
  fm_cg_plan *p = &cp->base;
  if (f->n_inputs > FM_MAX_INPUTS || f->n_ops > FM_MAX_OPS || f->n_outputs > FM_MAX_OUTPUTS || f->n_outputs == 0)
    return fm_diag_set(d, FM_EINVAL, "fragment counts out of range");
  if ((rc = fm_fragment_cols_info(f, &cp->info, d))) return rc;
  if (cp->info.n < 1 || cp->info.n >= FM_MAX_DIM || (cp->info.m < 1 && cp->info.m != FM_DIM_SYMBOLIC))
    return fm_diag_set(d, FM_EINVAL, "a column space of [%lld, %lld]", (long long)cp->info.m, (long long)cp->info.n);
  p->n_in = f->n_inputs;
  p->n_out = f->n_outputs;
  p->n_ops = f->n_ops;
  p->symbolic = cp->info.m == FM_DIM_SYMBOLIC;
  p->outer = cp->info.m;
  p->inner = cp->info.n;
  if ((rc = plan_tensors(f, cp, d))) return rc;
  if ((rc = fm_cg_plan_values(f, p, 1, d))) return rc;
  plan_classes(f, cp);
  plan_needs(f, cp);
  for (uint32_t k = 0; k < p->n_out; k++)
    if (cp->cls[p->t[p->n_in + k].value] == FM_COLS_SPACE)
      return fm_diag_set(d, FM_EINVAL, "outputs[%u] stores a column-space value", k);
  if (cp->n_red == 0) return fm_diag_set(d, FM_EINVAL, "no live reduction");
  cp->vec_ok = plan_vec(cp);
  return FM_OK;
}
