/* fm_codegen_gemm_plan.c: a GEMM fragment -> its plan (fm_cg_gemm_plan): which op is the
 * product and which inputs are A, B (and a sibling's B2), their layouts and leading dims, the
 * batch strides of a bmm, the epilogue tensors' strides and which inputs the epilogue reads;
 * refused with the reason where the generated templates cannot run it. Shared by the gemm,
 * skinny and cuBLASLt templates (b2b uses fm_cg_gemm_values). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fm_codegen_gemm.h"

int fm_cg_value_position(const fm_fragment *f, uint32_t limit, uint32_t id) {
  for (uint32_t k = limit; k-- > 0;) {
    uint32_t have = k < f->n_inputs ? f->inputs[k].id : f->ops[k - f->n_inputs].out;
    if (have == id) return (int)k;
  }
  return -1;
}

int fm_cg_gemm_values(const fm_fragment *f, int op1, int op2, const char *who, fm_cg_plan *p, fm_diag *d) {
  p->n_in = f->n_inputs;
  p->n_out = f->n_outputs;
  p->n_ops = f->n_ops;
  for (uint32_t k = 0; k < p->n_in; k++) p->vdt[k] = f->inputs[k].dtype;
  for (uint32_t i = 0; i < p->n_ops; i++) {
    const fm_opnode *op = &f->ops[i];
    fm_opkind kind = fm_op_kind(op->op);
    if ((unsigned)op->op >= FM_OP__COUNT || kind == FM_OPK_RESERVED || kind == FM_OPK_COMPOSITE ||
        kind == FM_OPK_REDUCE || (kind == FM_OPK_MATMUL && (int)i != op1 && (int)i != op2))
      return fm_diag_set(d, FM_EUNSUPPORTED, "ops[%u]: the %s cannot run '%s'", i, who, fm_op_name(op->op));
    if (op->nargs > 3 || fm_op_arity(op->op) != (int)op->nargs)
      return fm_diag_set(d, FM_EINVAL, "ops[%u]: wrong number of args", i);
    for (uint32_t a = 0; a < op->nargs; a++) {
      int pos = fm_cg_value_position(f, p->n_in + i, op->args[a]);
      if (pos < 0) return fm_diag_set(d, FM_EINVAL, "ops[%u].args[%u]: undefined value", i, a);
      p->args[i][a] = (uint16_t)pos;
    }
    p->vdt[p->n_in + i] = op->dtype;
    p->live[p->n_in + i] = 1;
  }
  return FM_OK;
}

/* One operand's layout: K-major when the K dim has stride 1 (a size-1 dim counts as
 * contiguous), else the other dim must; its stride (the leading dim) then steps by 16-byte
 * chunks, and so must the base. */
static int operand(const fm_tensor *t, uint32_t kdim, char name, int strict, int *kmajor, int64_t *ld, fm_diag *d) {
  uint32_t odim = 1 - kdim;
  int k_unit = t->shape[kdim] == 1 || t->strides[kdim] == 1;
  int o_unit = t->shape[odim] == 1 || t->strides[odim] == 1;
  if (!k_unit && !o_unit) return fm_diag_set(d, FM_EUNSUPPORTED, "%c is neither row- nor column-major", name);
  *kmajor = k_unit;
  *ld = k_unit ? t->strides[odim] : t->strides[kdim];
  if (t->shape[*kmajor ? odim : kdim] == 1) *ld = 0; /* never stepped */
  if (!strict) return FM_OK;
  if (*ld % 8)
    return fm_diag_set(d, FM_EUNSUPPORTED, "%c's leading dimension %" PRId64 " is not a multiple of 8 (16-byte chunks)",
                       name, *ld);
  if (t->align < 16)
    return fm_diag_set(d, FM_EUNSUPPORTED, "%c is only %u-byte aligned; the gemm template needs 16", name, t->align);
  return FM_OK;
}

/* strict: the generated templates' limits (K a multiple of 8, 16-byte chunks of A and B);
 * cuBLASLt's plans take any K, leading dim and alignment. */
static int plan_build(const fm_fragment *f, fm_cg_gemm_plan *gp, int strict, fm_diag *d) {
  fm_cg_plan *p = &gp->base;
  memset(gp, 0, sizeof *gp);
  if (f->n_inputs > FM_MAX_INPUTS || f->n_ops > FM_MAX_OPS || f->n_outputs > FM_MAX_OUTPUTS || f->n_outputs == 0)
    return fm_diag_set(d, FM_EINVAL, "fragment exceeds the limits");
  gp->op = fm_fragment_gemm_op(f);
  gp->op2 = fm_fragment_gemm_op2(f);
  if (gp->op < 0) return fm_diag_set(d, FM_EUNSUPPORTED, "not a GEMM fragment (no mm or addmm)");
  if (fm_fragment_is_chain(f)) /* fm_codegen_b2b.c keeps the intermediate on chip */
    return fm_diag_set(d, FM_EUNSUPPORTED, "a chain of two products: only the b2b template serves it");
  int rc = fm_cg_gemm_values(f, gp->op, gp->op2, "gemm epilogue", p, d);
  if (rc) return rc;
  const fm_opnode *mm = &f->ops[gp->op];
  gp->ia = p->args[gp->op][mm->nargs - 2];
  gp->ib = p->args[gp->op][mm->nargs - 1];
  if (gp->ia >= p->n_in || gp->ib >= p->n_in) return fm_diag_set(d, FM_EINVAL, "the matrix operands are not inputs");
  /* bmm: rank-3 tensors whose dim 0 is the batch; the matrix code below sees each one's
     last two dims (views of rank 2) and the batch strides go to ez */
  const uint32_t r = f->ops[gp->op].op == FM_OP_BMM ? 3 : 2;
  fm_tensor av, bv;
  const fm_tensor *a = &f->inputs[gp->ia], *b = &f->inputs[gp->ib];
  if (a->rank != r || b->rank != r || f->outputs[0].rank != r)
    return fm_diag_set(d, FM_EINVAL, "GEMM tensors are rank %u", r);
  gp->batched = r == 3;
  if (gp->batched) {
    gp->batch = f->outputs[0].shape[0];
    gp->ez[gp->ia] = a->shape[0] == 1 ? 0 : a->strides[0];
    gp->ez[gp->ib] = b->shape[0] == 1 ? 0 : b->strides[0];
    av = *a;
    bv = *b;
    for (int w = 0; w < 2; w++) {
      fm_tensor *v = w ? &bv : &av;
      v->rank = 2;
      memmove(&v->shape[0], &v->shape[1], 2 * sizeof v->shape[0]);
      memmove(&v->strides[0], &v->strides[1], 2 * sizeof v->strides[0]);
    }
    a = &av;
    b = &bv;
  }
  gp->dt = a->dtype;
  if (gp->dt != FM_DT_BF16 && gp->dt != FM_DT_F16)
    return fm_diag_set(d, FM_EUNSUPPORTED, "the gemm template multiplies bf16 or f16");
  gp->m = a->shape[0];
  gp->k = a->shape[1];
  gp->n = b->shape[1];
  if (strict && gp->k % 8) return fm_diag_set(d, FM_EUNSUPPORTED, "K not a multiple of 8 (K = %" PRId64 ")", gp->k);
  rc = operand(a, 1, 'A', strict, &gp->a_kmajor, &gp->lda, d);
  if (!rc) rc = operand(b, 0, 'B', strict, &gp->b_kmajor, &gp->ldb, d);
  if (rc) return rc;
  if (gp->op2 >= 0) {
    const fm_opnode *m2 = &f->ops[gp->op2];
    gp->ib2 = p->args[gp->op2][m2->nargs - 1];
    if (gp->ib2 >= p->n_in || p->args[gp->op2][m2->nargs - 2] != gp->ia)
      return fm_diag_set(d, FM_EINVAL, "the sibling product's operands are not inputs");
    int kmajor2;
    int64_t ldb2;
    if ((rc = operand(&f->inputs[gp->ib2], 0, 'B', strict, &kmajor2, &ldb2, d))) return rc;
    /* one layout for both: the templates load them alike, a plan runs both matmuls on one set
       of cuBLASLt layouts */
    if (kmajor2 != gp->b_kmajor || ldb2 != gp->ldb)
      return fm_diag_set(d, FM_EUNSUPPORTED,
                         "the sibling B's differ in layout (leading dims %" PRId64 " and %" PRId64 ")", gp->ldb, ldb2);
  }
  if (strict && gp->batched && (gp->ez[gp->ia] % 8 || gp->ez[gp->ib] % 8))
    return fm_diag_set(d, FM_EUNSUPPORTED,
                       "a batch stride of A or B (%" PRId64 ", %" PRId64
                       ") is not a multiple of 8 "
                       "(16-byte chunks)",
                       gp->ez[gp->ia], gp->ez[gp->ib]);
  for (uint32_t i = 0; i < p->n_ops; i++)
    for (uint32_t x = 0; x < f->ops[i].nargs; x++)
      if (((int)i != gp->op && (int)i != gp->op2) || x + 2 < f->ops[i].nargs)
        if (p->args[i][x] < p->n_in) gp->used[p->args[i][x]] = 1;
  for (uint32_t k = 0; k < p->n_out; k++) {
    int pos = fm_cg_value_position(f, p->n_in + p->n_ops, f->outputs[k].id);
    if (pos < 0 || (uint32_t)pos == gp->ia || (uint32_t)pos == gp->ib || (gp->op2 >= 0 && (uint32_t)pos == gp->ib2))
      return fm_diag_set(d, FM_EINVAL, "outputs[%u]: bad value", k);
    p->t[p->n_in + k].value = (uint32_t)pos;
    p->t[p->n_in + k].dtype = f->outputs[k].dtype;
    if ((uint32_t)pos < p->n_in) gp->used[pos] = 1;
  }
  for (uint32_t k = 0; k < p->n_in + p->n_out; k++) {
    const fm_tensor *t = k < p->n_in ? &f->inputs[k] : &f->outputs[k - p->n_in];
    if (k == gp->ia || k == gp->ib || (gp->op2 >= 0 && k == gp->ib2)) continue;
    if (t->rank != r) return fm_diag_set(d, FM_EINVAL, "epilogue tensor %u is not rank %u", k, r);
    for (uint32_t j = 0; j < 2; j++) gp->es[k][j] = t->shape[r - 2 + j] == 1 ? 0 : t->strides[r - 2 + j];
    if (gp->batched) gp->ez[k] = t->shape[0] == 1 ? 0 : t->strides[0];
    p->t[k].dtype = t->dtype;
    p->t[k].align = t->align;
  }
  return FM_OK;
}

int fm_cg_gemm_plan_build(const fm_fragment *f, fm_cg_gemm_plan *gp, fm_diag *d) { return plan_build(f, gp, 1, d); }

int fm_cg_gemm_plan_build_any(const fm_fragment *f, fm_cg_gemm_plan *gp, fm_diag *d) { return plan_build(f, gp, 0, d); }
