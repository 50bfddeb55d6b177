/* fm_reference_cat.c: the CPU reference for extent fragments (cat, window ops and take_rows;
 * semantics in fm_reference.h): element by element over the iteration shape; a cat evaluates
 * the operand whose range holds the element's index along its dim, at the index shifted into
 * that operand's range; a window op reads its inputs at its taps (fm_reference_window.c);
 * take_rows reads src at the row its index holds. Its own walk of what each operand needs,
 * not the generator's. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fm_reference.h"
#include "fm_reference_int.h"

typedef struct cat_ref {
  const fm_fragment *f;
  const ref_prog *pr;
  const void *const *inputs;
  uint32_t rank, n_val;
  fm_cat_info ci;
  uint8_t *need; /* [op * FM_MAX_ARGS + a][value]: what operand a of cat op `op` reads */
} cat_ref;

/* Whether op's operands are read at other indices than its own: a cat's (in its branches), a
 * window op's (at its taps, by fm_ref_window). */
static int reads_elsewhere(const fm_opnode *op) {
  const fm_opkind kind = fm_op_kind(op->op);
  return kind == FM_OPK_CAT || kind == FM_OPK_WINDOW || kind == FM_OPK_GATHER;
}

/* take_rows at index idx: src at the row the index holds there (wrapped once when negative),
 * NaN outside src's rows (validation cannot know an index's values; the kernel traps there,
 * and a NaN reference fails any comparison). */
static double take_rows_at(const cat_ref *c, const uint16_t *a, const int64_t *idx) {
  const fm_tensor *src = &c->f->inputs[a[0]], *index = &c->f->inputs[a[1]];
  if (!c->inputs[a[0]] || !c->inputs[a[1]]) return NAN;
  int64_t off = 0;
  for (uint32_t j = 0; j < c->rank; j++)
    if (index->shape[j] != 1) off += idx[j] * index->strides[j];
  int64_t row = ((const int64_t *)c->inputs[a[1]])[off]; /* exact: no double on the way */
  if (row < 0) row += src->shape[0];
  if (row < 0 || row >= src->shape[0]) return NAN;
  off = row * (src->shape[0] != 1 ? src->strides[0] : 0);
  for (uint32_t j = 1; j < c->rank; j++)
    if (src->shape[j] != 1) off += idx[j] * src->strides[j];
  return fm_ref_load(src->dtype, c->inputs[a[0]], off);
}

/* need[] of what value `root` reads (a cat's operands left to its branches, a window op's to
 * the op); root < 0: the outputs' values. */
static void mark(const cat_ref *c, int root, uint8_t *need) {
  memset(need, 0, c->n_val);
  if (root >= 0)
    need[root] = 1;
  else
    for (uint32_t k = 0; k < c->pr->n_out; k++) need[c->pr->out_value[k]] = 1;
  for (uint32_t pos = c->n_val; pos-- > c->f->n_inputs;) {
    const uint32_t o = pos - c->f->n_inputs;
    if (!need[pos] || reads_elsewhere(&c->f->ops[o])) continue;
    for (uint32_t a = 0; a < c->f->ops[o].nargs; a++) need[c->pr->args[o][a]] = 1;
  }
}

/* v[] of every value in need[] at index idx. */
static void eval_at(const cat_ref *c, const uint8_t *need, const int64_t *idx, double *v) {
  const fm_fragment *f = c->f;
  for (uint32_t pos = 0; pos < c->n_val; pos++) {
    if (!need[pos]) continue;
    if (pos < f->n_inputs) {
      const fm_tensor *t = &f->inputs[pos];
      int64_t off = 0;
      for (uint32_t j = 0; j < c->rank; j++)
        if (t->shape[j] != 1) off += idx[j] * t->strides[j];
      v[pos] = c->inputs[pos] ? fm_ref_load(t->dtype, c->inputs[pos], off) : NAN;
      continue;
    }
    const uint32_t o = pos - f->n_inputs;
    const fm_opnode *op = &f->ops[o];
    const uint16_t *a = c->pr->args[o];
    if (fm_op_kind(op->op) == FM_OPK_WINDOW) {
      v[pos] = fm_ref_window(f, o, a, c->inputs, idx);
      continue;
    }
    if (fm_op_kind(op->op) == FM_OPK_GATHER) {
      v[pos] = take_rows_at(c, a, idx);
      continue;
    }
    if (fm_op_kind(op->op) != FM_OPK_CAT) {
      v[pos] = fm_ref_op(op, op->nargs > 0 ? v[a[0]] : 0, op->nargs > 1 ? v[a[1]] : 0, op->nargs > 2 ? v[a[2]] : 0);
      continue;
    }
    const uint32_t dim = (uint32_t)(op->dim < 0 ? op->dim + (int32_t)c->rank : op->dim);
    int64_t shifted[FM_MAX_RANK], start = 0;
    memcpy(shifted, idx, sizeof shifted);
    uint32_t k = 0;
    while (k + 1 < op->nargs && idx[dim] >= start + c->ci.ext[a[k]][dim]) start += c->ci.ext[a[k++]][dim];
    shifted[dim] = idx[dim] - start;
    double w[REF_MAX_VALUES];
    eval_at(c, c->need + ((size_t)o * FM_MAX_ARGS + k) * c->n_val, shifted, w);
    v[pos] = w[a[k]];
  }
}

int fm_ref_eval_cat(const fm_fragment *f, const ref_prog *pr, int64_t outer, const void *const *inputs,
                    void *const *outputs, fm_diag *d) {
  cat_ref *c = malloc(sizeof *c);
  if (!c) return fm_diag_set(d, FM_ENOMEM, "reference: out of memory");
  *c = (cat_ref){.f = f, .pr = pr, .inputs = inputs, .rank = f->outputs[0].rank, .n_val = f->n_inputs + f->n_ops};
  int rc = fm_fragment_cat_info(f, &c->ci, d);
  const fm_tensor *it = &f->outputs[0];
  int64_t shape[FM_MAX_RANK], n = 1;
  for (uint32_t j = 0; !rc && j < c->rank; j++) {
    shape[j] = j == 0 && it->shape[0] == FM_DIM_SYMBOLIC ? outer : it->shape[j];
    if (shape[j] < 0) rc = fm_diag_set(d, FM_EINVAL, "reference: outer %lld < 0", (long long)outer);
    n *= shape[j];
  }
  if (!rc && !(c->need = malloc((size_t)f->n_ops * FM_MAX_ARGS * c->n_val + c->n_val)))
    rc = fm_diag_set(d, FM_ENOMEM, "reference: out of memory");
  if (rc) goto out;
  for (uint32_t o = 0; o < f->n_ops; o++)
    for (uint32_t a = 0; fm_op_kind(f->ops[o].op) == FM_OPK_CAT && a < f->ops[o].nargs; a++)
      mark(c, pr->args[o][a], c->need + ((size_t)o * FM_MAX_ARGS + a) * c->n_val);
  uint8_t *root = c->need + (size_t)f->n_ops * FM_MAX_ARGS * c->n_val;
  mark(c, -1, root);
  int64_t idx[FM_MAX_RANK] = {0};
  double v[REF_MAX_VALUES];
  for (int64_t i = 0; i < n; i++) {
    eval_at(c, root, idx, v);
    for (uint32_t k = 0; k < f->n_outputs; k++) {
      const fm_tensor *t = &f->outputs[k];
      int64_t off = 0;
      for (uint32_t j = 0; j < c->rank; j++)
        if (t->shape[j] != 1) off += idx[j] * t->strides[j];
      fm_ref_store(t->dtype, outputs[k], off, v[pr->out_value[k]]);
    }
    for (uint32_t j = c->rank; j-- > 0;) { /* odometer: next multi-index, last dim fastest */
      if (++idx[j] < shape[j]) break;
      idx[j] = 0;
    }
  }
out:
  free(c->need);
  free(c);
  return rc;
}
