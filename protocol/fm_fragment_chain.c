/* fm_fragment_chain.c: the two stages of a chained GEMM fragment (fm_fragment.h, "Chains"),
 * the one place that says which op runs over [M, N1] and which over [M, N2]. Validation,
 * the CPU reference and the b2b template all read the stages from here, so they cannot
 * disagree about what a chain means. */
#include <string.h>

#include "fm_fragment_int.h"

int fm_fragment_find_value(const fm_fragment *f, uint32_t id) {
  for (uint32_t k = 0; k < f->n_inputs; k++)
    if (f->inputs[k].id == id) return (int)k;
  for (uint32_t i = 0; i < f->n_ops; i++)
    if (f->ops[i].out == id) return (int)(f->n_inputs + i);
  return -1;
}

int fm_fragment_is_chain(const fm_fragment *f) {
  int g2 = fm_fragment_gemm_op2(f);
  if (g2 < 0) return 0;
  const fm_opnode *m2 = &f->ops[g2];
  if (m2->nargs < 2) return 0;
  int a2 = fm_fragment_find_value(f, m2->args[m2->nargs - 2]);
  return a2 >= (int)f->n_inputs; /* the second A is computed, not read: a chain */
}

int fm_fragment_chain_info(const fm_fragment *f, fm_chain_info *ci, fm_diag *d) {
  memset(ci, 0, sizeof *ci);
  ci->op1 = fm_fragment_gemm_op(f);
  ci->op2 = fm_fragment_gemm_op2(f);
  if (ci->op1 < 0 || ci->op2 < 0 || !fm_fragment_is_chain(f))
    return fm_diag_set(d, FM_EINVAL, "not a chained GEMM fragment");
  const uint32_t n_in = f->n_inputs;
  /* forward: an op's stage is the highest of its args' (the products start theirs) */
  for (uint32_t i = 0; i < f->n_ops; i++) {
    const fm_opnode *op = &f->ops[i];
    uint8_t s = 0, reads1 = 0;
    for (uint32_t a = 0; a < op->nargs; a++) {
      int pos = fm_fragment_find_value(f, op->args[a]);
      if (pos < 0 || pos >= (int)(n_in + i))
        return fm_diag_set(d, FM_EINVAL, "ops[%u].args[%u]: undefined value", i, a);
      if (pos < (int)n_in) continue;
      uint8_t sa = ci->stage[pos - n_in];
      if (sa == 1 && !((int)i == ci->op2 && a + 2 == op->nargs)) reads1 = 1;
      if (sa > s) s = sa;
    }
    if ((int)i == ci->op1)
      s = 1;
    else if ((int)i == ci->op2)
      s = 2;
    else if (s == 2 && reads1)
      return fm_diag_set(d, FM_EUNSUPPORTED,
                         "ops[%u]: reads a value of both stages of the chain (the [M, N1] values "
                         "reach the second stage only through the second product)",
                         i);
    if ((int)i == ci->op2 && reads1)
      return fm_diag_set(d, FM_EUNSUPPORTED, "ops[%u]: the second product's bias reads a first-stage value", i);
    ci->stage[i] = s;
  }
  const fm_opnode *m2 = &f->ops[ci->op2];
  int a2 = fm_fragment_find_value(f, m2->args[m2->nargs - 2]);
  if (ci->stage[a2 - (int)n_in] != 1)
    return fm_diag_set(d, FM_EUNSUPPORTED,
                       "ops[%d].args[%u]: the second product's A must be computed from the first "
                       "product",
                       ci->op2, m2->nargs - 2);
  ci->a2 = a2;
  /* backward: which stage needs each value (outputs are stage 2; an op of stage s needs
     its args at s; an op of neither stage needs them wherever it is needed) */
  for (uint32_t k = 0; k < f->n_outputs; k++) {
    int pos = fm_fragment_find_value(f, f->outputs[k].id);
    if (pos < (int)n_in || ci->stage[pos - n_in] != 2)
      return fm_diag_set(d, FM_EUNSUPPORTED,
                         "outputs[%u]: a chain stores only values of its second stage ([M, N2]); "
                         "the [M, N1] intermediate stays on chip",
                         k);
    ci->need[pos - n_in] |= 2;
  }
  ci->need[a2 - n_in] |= 1;
  for (uint32_t i = f->n_ops; i-- > 0;) {
    const fm_opnode *op = &f->ops[i];
    uint8_t want = ci->stage[i] ? (uint8_t)(1u << (ci->stage[i] - 1)) : ci->need[i];
    if (!ci->need[i]) continue; /* dead: canonical form drops it */
    for (uint32_t a = 0; a < op->nargs; a++) {
      if (((int)i == ci->op1 || (int)i == ci->op2) && a + 2 >= op->nargs) continue; /* A, B */
      int pos = fm_fragment_find_value(f, op->args[a]);
      if (pos < (int)n_in)
        ci->in_need[pos] |= want;
      else
        ci->need[pos - n_in] |= want;
    }
  }
  return FM_OK;
}
