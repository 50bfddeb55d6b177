/* frag_builder.c: see frag_builder.h. */
#include "frag_builder.h"

#include <string.h>

void fb_init(fb *b) {
  memset(b, 0, sizeof *b);
  b->f.vocab = FM_VOCAB_VERSION;
  b->next_id = 100; /* deliberately not dense: the daemon canonicalizes */
}

static fm_dtype promote(fm_dtype a, fm_dtype c) {
  if (a == c) return a;
  if (a == FM_DT_BOOL) return c;
  if (c == FM_DT_BOOL) return a;
  return FM_DT_F32;
}

static void contiguous(uint32_t rank, const int64_t *shape, int64_t *strides) {
  int64_t s = 1;
  for (int d = (int)rank - 1; d >= 0; d--) {
    strides[d] = s;
    s *= shape[d] == FM_DIM_SYMBOLIC ? 1 : shape[d];
  }
}

uint32_t fb_input(fb *b, fm_dtype dt, uint32_t rank, const int64_t *shape, const int64_t *strides, uint32_t align) {
  fm_tensor *t = &b->f.inputs[b->f.n_inputs++];
  t->id = b->next_id++;
  t->dtype = dt;
  t->rank = rank;
  memcpy(t->shape, shape, rank * sizeof *shape);
  if (strides)
    memcpy(t->strides, strides, rank * sizeof *strides);
  else
    contiguous(rank, shape, t->strides);
  t->align = align;
  b->dt[t->id - 100] = dt;
  return t->id;
}

static fm_opnode *new_op(fb *b, fm_op op, fm_dtype dt) {
  fm_opnode *o = &b->f.ops[b->f.n_ops++];
  memset(o, 0, sizeof *o);
  o->op = op;
  o->out = b->next_id++;
  o->dtype = dt;
  b->dt[o->out - 100] = dt;
  return o;
}

uint32_t fb_const(fb *b, double v) {
  fm_opnode *o = new_op(b, FM_OP_CONST, FM_DT_F32);
  o->value = v;
  return o->out;
}

static fm_dtype dt_of(fb *b, uint32_t v) { return b->dt[v - 100]; }

static int is_const(fb *b, uint32_t v) {
  for (uint32_t i = 0; i < b->f.n_ops; i++)
    if (b->f.ops[i].out == v) return b->f.ops[i].op == FM_OP_CONST;
  return 0;
}

uint32_t fb_op1(fb *b, fm_op op, uint32_t a) {
  fm_opnode *o = new_op(b, op, dt_of(b, a));
  o->nargs = 1;
  o->args[0] = a;
  return o->out;
}

uint32_t fb_op2(fb *b, fm_op op, uint32_t a, uint32_t c) {
  fm_dtype dt;
  if (is_const(b, c))
    dt = dt_of(b, a);
  else if (is_const(b, a))
    dt = dt_of(b, c);
  else
    dt = promote(dt_of(b, a), dt_of(b, c));
  if (fm_op_kind(op) == FM_OPK_COMPARE) dt = FM_DT_BOOL;
  fm_opnode *o = new_op(b, op, dt);
  o->nargs = 2;
  o->args[0] = a;
  o->args[1] = c;
  return o->out;
}

uint32_t fb_where(fb *b, uint32_t cond, uint32_t a, uint32_t c) {
  fm_dtype dt = is_const(b, c) ? dt_of(b, a) : is_const(b, a) ? dt_of(b, c) : promote(dt_of(b, a), dt_of(b, c));
  fm_opnode *o = new_op(b, FM_OP_WHERE, dt);
  o->nargs = 3;
  o->args[0] = cond;
  o->args[1] = a;
  o->args[2] = c;
  return o->out;
}

uint32_t fb_catn(fb *b, const uint32_t *args, uint32_t n, int32_t dim) {
  fm_dtype dt = dt_of(b, args[0]);
  for (uint32_t i = 1; i < n; i++) dt = promote(dt, dt_of(b, args[i]));
  fm_opnode *o = new_op(b, FM_OP_CAT, dt);
  o->nargs = n;
  for (uint32_t i = 0; i < n; i++) o->args[i] = args[i];
  o->dim = dim;
  return o->out;
}

uint32_t fb_cat(fb *b, uint32_t a, uint32_t c, int32_t dim) {
  const uint32_t args[2] = {a, c};
  return fb_catn(b, args, 2, dim);
}

uint32_t fb_cast(fb *b, uint32_t a, fm_dtype dt) {
  fm_opnode *o = new_op(b, FM_OP_CAST, dt);
  o->nargs = 1;
  o->args[0] = a;
  return o->out;
}

uint32_t fb_iota(fb *b, fm_dtype dt) { return new_op(b, FM_OP_IOTA, dt)->out; }

void fb_output(fb *b, uint32_t v, uint32_t rank, const int64_t *shape) {
  fm_tensor *t = &b->f.outputs[b->f.n_outputs++];
  t->id = v;
  t->dtype = dt_of(b, v);
  t->rank = rank;
  memcpy(t->shape, shape, rank * sizeof *shape);
  contiguous(rank, shape, t->strides);
  t->align = 16;
}
