/* fm_fragment_expand.c: composite ops (softmax, layer_norm, rms_norm) into the primitives of
 * vocabulary 2, exactly as PROTOCOL.md ("Composite ops") spells them out, so that a client
 * sending `layer_norm` and one sending its expansion hit the same cache entry: the canonical
 * form holds primitives only. */
#include <stdio.h>
#include <string.h>

#include "fm_fragment.h"

typedef struct emitter {
  fm_opnode *ops; /* the new op list */
  uint32_t n;
  uint32_t next_id; /* fresh ids, above every id a client may choose */
  int overflow;
} emitter;

static uint32_t emit(emitter *e, fm_op op, uint32_t out, uint32_t nargs, uint32_t a0, uint32_t a1, int32_t dim) {
  if (e->n == FM_MAX_OPS) {
    e->overflow = 1;
    return out;
  }
  fm_opnode *o = &e->ops[e->n++];
  memset(o, 0, sizeof *o);
  o->op = op;
  o->out = out == UINT32_MAX ? e->next_id++ : out;
  o->nargs = nargs;
  o->args[0] = a0;
  o->args[1] = a1;
  o->dim = dim;
  o->correction = 1;
  return o->out;
}

static uint32_t emit_const(emitter *e, double v) {
  uint32_t id = emit(e, FM_OP_CONST, UINT32_MAX, 0, 0, 0, -1);
  if (!e->overflow) e->ops[e->n - 1].value = v;
  return id;
}

#define FRESH UINT32_MAX

/* softmax(x) = exp(x - amax(x)) / sum(exp(x - amax(x))) */
static void expand_softmax(emitter *e, const fm_opnode *c) {
  uint32_t x = c->args[0];
  uint32_t m = emit(e, FM_OP_AMAX, FRESH, 1, x, 0, c->dim);
  uint32_t s = emit(e, FM_OP_SUB, FRESH, 2, x, m, -1);
  uint32_t ex = emit(e, FM_OP_EXP, FRESH, 1, s, 0, -1);
  uint32_t t = emit(e, FM_OP_SUM, FRESH, 1, ex, 0, c->dim);
  emit(e, FM_OP_DIV, c->out, 2, ex, t, -1);
}

/* layer_norm(x, w, b; eps) = (x - mean(x)) * rsqrt(var(x, correction=0) + eps) * w + b */
static void expand_layer_norm(emitter *e, const fm_opnode *c) {
  uint32_t x = c->args[0];
  uint32_t mu = emit(e, FM_OP_MEAN, FRESH, 1, x, 0, -1);
  uint32_t xc = emit(e, FM_OP_SUB, FRESH, 2, x, mu, -1);
  uint32_t v = emit(e, FM_OP_VAR, FRESH, 1, x, 0, -1);
  if (!e->overflow) e->ops[e->n - 1].correction = 0;
  uint32_t eps = emit_const(e, c->value);
  uint32_t ve = emit(e, FM_OP_ADD, FRESH, 2, v, eps, -1);
  uint32_t r = emit(e, FM_OP_RSQRT, FRESH, 1, ve, 0, -1);
  uint32_t n = emit(e, FM_OP_MUL, c->nargs == 1 ? c->out : FRESH, 2, xc, r, -1);
  if (c->nargs == 1) return;
  uint32_t y = emit(e, FM_OP_MUL, c->nargs == 2 ? c->out : FRESH, 2, n, c->args[1], -1);
  if (c->nargs == 2) return;
  emit(e, FM_OP_ADD, c->out, 2, y, c->args[2], -1);
}

/* rms_norm(x, w; eps) = x * rsqrt(mean(x * x) + eps) * w */
static void expand_rms_norm(emitter *e, const fm_opnode *c) {
  uint32_t x = c->args[0];
  uint32_t sq = emit(e, FM_OP_MUL, FRESH, 2, x, x, -1);
  uint32_t ms = emit(e, FM_OP_MEAN, FRESH, 1, sq, 0, -1);
  uint32_t eps = emit_const(e, c->value);
  uint32_t a = emit(e, FM_OP_ADD, FRESH, 2, ms, eps, -1);
  uint32_t r = emit(e, FM_OP_RSQRT, FRESH, 1, a, 0, -1);
  uint32_t n = emit(e, FM_OP_MUL, c->nargs == 1 ? c->out : FRESH, 2, x, r, -1);
  if (c->nargs == 1) return;
  emit(e, FM_OP_MUL, c->out, 2, n, c->args[1], -1);
}

int fm_fragment_expand(fm_fragment *f, fm_diag *d) {
  if (!f || f->n_ops > FM_MAX_OPS) return fm_diag_set(d, FM_EINVAL, "fm_fragment_expand: bad fragment");
  uint32_t j;
  for (j = 0; j < f->n_ops; j++)
    if (fm_op_kind(f->ops[j].op) == FM_OPK_COMPOSITE) break;
  if (j == f->n_ops) return FM_OK; /* the common case: nothing to do, nothing copied */

  fm_opnode ops[FM_MAX_OPS]; /* ~12 KiB of stack, like validation's value table */
  emitter e = {.ops = ops, .n = 0, .next_id = FM_MAX_VALUE_ID + 1, .overflow = 0};
  for (j = 0; j < f->n_ops; j++) {
    const fm_opnode *c = &f->ops[j];
    if (fm_op_kind(c->op) != FM_OPK_COMPOSITE) {
      if (e.n == FM_MAX_OPS) {
        e.overflow = 1;
        break;
      }
      ops[e.n++] = *c;
      continue;
    }
    if (f->vocab < 2)
      return fm_diag_set(d, FM_ESCHEMA, "ops[%u].op: '%s' needs vocab 2 (the fragment says vocab %u)", j,
                         fm_op_name(c->op), f->vocab);
    uint32_t arity = (uint32_t)fm_op_arity(c->op);
    if (c->nargs < 1 || c->nargs > arity)
      return fm_diag_set(d, FM_ESCHEMA, "ops[%u].args: '%s' takes 1 to %u args, got %u", j, fm_op_name(c->op), arity,
                         c->nargs);
    switch (c->op) {
      case FM_OP_SOFTMAX:
        expand_softmax(&e, c);
        break;
      case FM_OP_LAYER_NORM:
        expand_layer_norm(&e, c);
        break;
      case FM_OP_RMS_NORM:
        expand_rms_norm(&e, c);
        break;
      default:
        return fm_diag_set(d, FM_EINVAL, "ops[%u]: unknown composite op", j);
    }
    if (e.overflow) break;
  }
  if (e.overflow)
    return fm_diag_set(d, FM_ELIMIT, "ops: expanding the composite ops exceeds the limit of %d ops", FM_MAX_OPS);
  memcpy(f->ops, ops, e.n * sizeof ops[0]);
  f->n_ops = e.n;
  return FM_OK;
}
