/* fm_fragment_validate.c: every rule of the fragment IR (fm_fragment.h), checked in one pass
 * over a decoded (or C-built) fragment, filling each op's result dtype.
 *
 * The order of the checks is the order a reader would look: counts, each tensor on its own,
 * the dataflow (ids defined once and before use, arity, operand dtypes), what the outputs
 * store, and last how the shapes relate. The first failure is reported, with its place. */
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "fm_fragment_int.h"

/* A defined value: inputs first, then op results in order. At most 32 + 256 entries, so a
 * linear search is fine and needs no allocation. */
typedef struct value {
  uint32_t id;
  fm_dtype dtype;
  bool weak;   /* a `const`: a Python scalar, which does not promote */
  double cval; /* a `const`'s value: whether it may meet an i64 value (fm_int_const_ok) */
  bool is_input;
  uint32_t index; /* into inputs[] or ops[] */
  uint8_t cls;    /* row fragments: CLS_ROW or CLS_PERROW (set by check_rows) */
} value;

enum { CLS_PERROW = 0, CLS_ROW = 1 };

typedef struct values {
  value v[FM_MAX_INPUTS + FM_MAX_OPS];
  uint32_t n;
} values;

static const value *lookup(const values *vs, uint32_t id) {
  for (uint32_t i = 0; i < vs->n; i++)
    if (vs->v[i].id == id) return &vs->v[i];
  return NULL;
}

static int define(values *vs, value v, const char *path, fm_diag *d) {
  const value *prev = lookup(vs, v.id);
  if (prev)
    return fm_diag_set(d, FM_ESCHEMA, "%s: value %u is already defined by %s[%u]", path, v.id,
                       prev->is_input ? "inputs" : "ops", prev->index);
  vs->v[vs->n++] = v;
  return FM_OK;
}

static void format_shape(const fm_tensor *t, char *out, size_t cap) {
  size_t k = (size_t)snprintf(out, cap, "[");
  for (uint32_t i = 0; i < t->rank && k < cap; i++)
    k += (size_t)snprintf(out + k, cap - k, "%s%" PRId64, i ? ", " : "", t->shape[i]);
  if (k < cap) snprintf(out + k, cap - k, "]");
}

/* Shape, strides, alignment and dtype of one tensor, on its own. */
static int check_tensor(const fm_tensor *t, const char *path, fm_diag *d) {
  if ((unsigned)t->dtype >= FM_DT__COUNT)
    return fm_diag_set(d, FM_ESCHEMA, "%s.dtype: %d is not a dtype", path, (int)t->dtype);
  if (t->id > FM_MAX_VALUE_ID)
    return fm_diag_set(d, FM_ELIMIT, "%s.id: value id %u exceeds the maximum %u", path, t->id, FM_MAX_VALUE_ID);
  if (t->rank > FM_MAX_RANK)
    return fm_diag_set(d, FM_ELIMIT, "%s.shape: rank %u exceeds the limit of %d", path, t->rank, FM_MAX_RANK);
  int64_t elements = 1;
  for (uint32_t i = 0; i < t->rank; i++) {
    int64_t dim = t->shape[i];
    if (dim == FM_DIM_SYMBOLIC) {
      if (i != 0) return fm_diag_set(d, FM_ESCHEMA, "%s.shape[%u]: only dim 0 may be symbolic (-1)", path, i);
      continue;
    }
    if (dim < 1)
      return fm_diag_set(d, FM_ESCHEMA,
                         "%s.shape[%u]: %" PRId64
                         " is not a size (dims are >= 1, or -1 for a "
                         "symbolic dim 0; empty tensors have nothing to fuse)",
                         path, i, dim);
    if (dim >= FM_MAX_DIM)
      return fm_diag_set(d, FM_ELIMIT, "%s.shape[%u]: %" PRId64 " exceeds the limit of 2^31-1", path, i, dim);
    if (elements > FM_MAX_ELEMENTS / dim) return fm_diag_set(d, FM_ELIMIT, "%s.shape: more than 2^40 elements", path);
    elements *= dim;
  }
  /* Bounding the reach of one tensor keeps every offset codegen computes inside 64 bits. */
  int64_t span = 0;
  for (uint32_t i = 0; i < t->rank; i++) {
    int64_t st = t->strides[i], term;
    if (st < 0)
      return fm_diag_set(d, FM_ESCHEMA, "%s.strides[%u]: negative strides are not supported (%" PRId64 ")", path, i,
                         st);
    if (st > FM_MAX_STRIDE)
      return fm_diag_set(d, FM_ELIMIT, "%s.strides[%u]: %" PRId64 " exceeds the limit of 2^40", path, i, st);
    if (t->shape[i] <= 1) continue;
    if (__builtin_mul_overflow(t->shape[i] - 1, st, &term) || __builtin_add_overflow(span, term, &span) ||
        span > FM_MAX_STRIDE)
      return fm_diag_set(d, FM_ELIMIT, "%s.strides: the layout spans more than 2^40 elements", path);
  }
  uint32_t a = t->align;
  if (a == 0 || a > FM_MAX_ALIGN || (a & (a - 1)))
    return fm_diag_set(d, FM_ESCHEMA, "%s.align: %u is not a power of two in 1..%u", path, a, FM_MAX_ALIGN);
  if (a < fm_dtype_size(t->dtype))
    return fm_diag_set(d, FM_ESCHEMA, "%s.align: %u is less than the %zu-byte size of %s", path, a,
                       fm_dtype_size(t->dtype), fm_dtype_name(t->dtype));
  return FM_OK;
}

static bool is_float(fm_dtype dt) { return dt == FM_DT_F16 || dt == FM_DT_BF16 || dt == FM_DT_F32; }

/* PyTorch's promotion for the dtypes we have: a weak scalar takes the other side's float
 * dtype; bool takes the other side's dtype; two different 16-bit floats meet at f32. */
static fm_dtype promote(const value *a, const value *b) {
  if (a->weak && b->weak) return FM_DT_F32;
  if (a->weak) return b->dtype == FM_DT_BOOL ? FM_DT_F32 : b->dtype;
  if (b->weak) return a->dtype == FM_DT_BOOL ? FM_DT_F32 : a->dtype;
  if (a->dtype == FM_DT_BOOL && b->dtype == FM_DT_BOOL) return FM_DT_F32;
  if (a->dtype == FM_DT_BOOL) return b->dtype;
  if (b->dtype == FM_DT_BOOL) return a->dtype;
  return a->dtype == b->dtype ? a->dtype : FM_DT_F32;
}

/* Integer values (vocab 10): what may meet an i64 value. */
static bool is_i64(const value *v) { return !v->weak && v->dtype == FM_DT_I64; }
static bool integer_operand(const value *v) {
  return v->weak ? fm_int_const_ok(v->cval) : (v->dtype == FM_DT_I64 || v->dtype == FM_DT_BOOL);
}

/* An op of n data operands (from first) that reads an i64 value: every operand an integer
 * one, or the error naming the first that is not. Returns 1 when an i64 operand is read. */
static int integer_operands(const value *arg[FM_MAX_ARGS], uint32_t first, uint32_t n, const char *path,
                            const char *name, int *rc, fm_diag *d) {
  bool any = false;
  for (uint32_t k = first; k < n; k++) any = any || is_i64(arg[k]);
  if (!any) return 0;
  for (uint32_t k = first; k < n; k++) {
    if (integer_operand(arg[k])) continue;
    if (arg[k]->weak)
      *rc = fm_diag_set(d, FM_ESCHEMA,
                        "%s.args[%u]: '%s' of an i64 value and the const %g: an integer const of magnitude at most "
                        "2^24 (cast the i64 value to a float first)",
                        path, k, name, arg[k]->cval);
    else
      *rc = fm_diag_set(d, FM_ESCHEMA,
                        "%s.args[%u]: '%s' mixes an i64 value with value %u, which is %s (cast the i64 value "
                        "to %s first, as torch promotes)",
                        path, k, name, arg[k]->id, fm_dtype_name(arg[k]->dtype), fm_dtype_name(arg[k]->dtype));
    return 1;
  }
  return 1;
}

/* Result dtype of op (args already resolved) or an error naming the operand at fault. */
static int infer(fm_opnode *op, const value *arg[FM_MAX_ARGS], bool *weak, const char *path, fm_diag *d) {
  const char *name = fm_op_name(op->op);
  *weak = false;
  switch (fm_op_kind(op->op)) {
    case FM_OPK_CONST:
      if (isnan(op->value)) return fm_diag_set(d, FM_ESCHEMA, "%s.value: NaN is not a valid constant", path);
      op->dtype = FM_DT_F32;
      *weak = true;
      return FM_OK;
    case FM_OPK_UNARY:
      if (is_i64(arg[0]) && (op->op == FM_OP_NEG || op->op == FM_OP_ABS)) {
        op->dtype = FM_DT_I64; /* wrapping, as torch's int64 */
        return FM_OK;
      }
      if (!arg[0]->weak && !is_float(arg[0]->dtype))
        return fm_diag_set(d, FM_ESCHEMA,
                           "%s.args[0]: '%s' needs a floating-point operand, value %u is %s "
                           "(cast it first)",
                           path, name, arg[0]->id, fm_dtype_name(arg[0]->dtype));
      op->dtype = arg[0]->weak ? FM_DT_F32 : arg[0]->dtype;
      return FM_OK;
    case FM_OPK_BINARY: {
      int rc = FM_OK;
      if (integer_operands(arg, 0, 2, path, name, &rc, d)) {
        if (rc) return rc;
        if (op->op == FM_OP_FLOOR_DIV && (!arg[1]->weak || arg[1]->cval == 0))
          return fm_diag_set(d, FM_ESCHEMA, "%s.args[1]: floor_div divides by a nonzero integer const", path);
        op->dtype = op->op == FM_OP_DIV ? FM_DT_F32 : FM_DT_I64; /* div: true division, as torch */
        return FM_OK;
      }
      if (op->op == FM_OP_FLOOR_DIV)
        return fm_diag_set(d, FM_ESCHEMA, "%s.args[0]: floor_div divides an i64 value, value %u is %s", path,
                           arg[0]->id, arg[0]->weak ? "a const" : fm_dtype_name(arg[0]->dtype));
      op->dtype = promote(arg[0], arg[1]);
      return FM_OK;
    }
    case FM_OPK_COMPARE: {
      int rc = FM_OK;
      if (integer_operands(arg, 0, 2, path, name, &rc, d) && rc) return rc;
      op->dtype = FM_DT_BOOL;
      return FM_OK;
    }
    case FM_OPK_WHERE: {
      if (arg[0]->weak || arg[0]->dtype != FM_DT_BOOL)
        return fm_diag_set(d, FM_ESCHEMA, "%s.args[0]: where's condition must be bool, value %u is %s", path,
                           arg[0]->id, arg[0]->weak ? "a const" : fm_dtype_name(arg[0]->dtype));
      int rc = FM_OK;
      if (integer_operands(arg, 1, 3, path, name, &rc, d)) {
        op->dtype = FM_DT_I64;
        return rc;
      }
      op->dtype = promote(arg[1], arg[2]);
      return FM_OK;
    }
    case FM_OPK_IOTA:
      if (op->dtype != FM_DT_F32 && op->dtype != FM_DT_I64)
        return fm_diag_set(d, FM_ESCHEMA, "%s.dtype: iota gives f32 or i64, not %s", path,
                           (unsigned)op->dtype < FM_DT__COUNT ? fm_dtype_name(op->dtype) : "an unknown dtype");
      return FM_OK; /* an i64 one is an integer value (vocab 10, older than iota's) */
    case FM_OPK_CAST:
      if ((unsigned)op->dtype >= FM_DT__COUNT)
        return fm_diag_set(d, FM_ESCHEMA, "%s.dtype: %d is not a dtype", path, (int)op->dtype);
      if (op->dtype == FM_DT_I64 && (arg[0]->weak || (arg[0]->dtype != FM_DT_BOOL && arg[0]->dtype != FM_DT_I64)))
        return fm_diag_set(d, FM_ESCHEMA,
                           "%s.args[0]: a cast to i64 takes a bool or an i64 value (a float's truncation is not in "
                           "the vocabulary), value %u is %s",
                           path, arg[0]->id, arg[0]->weak ? "a const" : fm_dtype_name(arg[0]->dtype));
      return FM_OK;
    case FM_OPK_POW:
      if (is_i64(arg[0]))
        return fm_diag_set(d, FM_ESCHEMA, "%s.args[0]: pow of an i64 value (cast it to a float first)", path);
      if (!arg[1]->weak)
        return fm_diag_set(d, FM_ESCHEMA, "%s.args[1]: pow's exponent must be a const value, value %u is not", path,
                           arg[1]->id);
      op->dtype = promote(arg[0], arg[1]);
      return FM_OK;
    case FM_OPK_REDUCE:
      if (arg[0]->weak || !is_float(arg[0]->dtype))
        return fm_diag_set(d, FM_ESCHEMA, "%s.args[0]: '%s' reduces a floating-point tensor, value %u is %s", path,
                           name, arg[0]->id, arg[0]->weak ? "a const" : fm_dtype_name(arg[0]->dtype));
      if (op->op == FM_OP_VAR && op->correction > 1)
        return fm_diag_set(d, FM_ESCHEMA, "%s.correction: %u is not 0 or 1", path, op->correction);
      op->dtype = arg[0]->dtype;
      return FM_OK;
    case FM_OPK_MATMUL: {
      /* A and B are the last two args; like torch, both operands (and addmm's bias) share
       * one 16-bit float dtype, which the product keeps */
      const value *a = arg[op->nargs - 2], *b = arg[op->nargs - 1];
      if (a->weak || b->weak || (a->dtype != FM_DT_BF16 && a->dtype != FM_DT_F16))
        return fm_diag_set(d, FM_EUNSUPPORTED, "%s.args: '%s' multiplies bf16 or f16 tensors, got %s and %s", path,
                           name, a->weak ? "a const" : fm_dtype_name(a->dtype),
                           b->weak ? "a const" : fm_dtype_name(b->dtype));
      if (a->dtype != b->dtype)
        return fm_diag_set(d, FM_ESCHEMA, "%s.args: '%s' operands differ in dtype (%s and %s)", path, name,
                           fm_dtype_name(a->dtype), fm_dtype_name(b->dtype));
      if (op->op == FM_OP_ADDMM && !arg[0]->weak && arg[0]->dtype != a->dtype)
        return fm_diag_set(d, FM_ESCHEMA, "%s.args[0]: addmm's bias is %s, its operands %s", path,
                           fm_dtype_name(arg[0]->dtype), fm_dtype_name(a->dtype));
      op->dtype = a->dtype;
      return FM_OK;
    }
    case FM_OPK_CAT: {
      /* torch.cat's result_type: one dtype stays (bool too); mixed ones promote as a chain
       * of binary ops would */
      value acc = *arg[0];
      bool same = !acc.weak;
      for (uint32_t k = 1; k < op->nargs; k++) same = same && !arg[k]->weak && arg[k]->dtype == acc.dtype;
      for (uint32_t k = 1; k < op->nargs && !same; k++) {
        acc.dtype = promote(&acc, arg[k]);
        acc.weak = false;
      }
      op->dtype = acc.dtype;
      return FM_OK;
    }
    case FM_OPK_WINDOW: {
      /* the kernel loads its inputs itself, at the window's taps: nothing runs before it */
      for (uint32_t k = 0; k < op->nargs; k++)
        if (!arg[k]->is_input)
          return fm_diag_set(d, FM_EUNSUPPORTED, "%s.args[%u]: a %s reads fragment inputs only", path, k, name);
      /* [x] or the backward's [gy, argmax]: floating-point tensors */
      for (uint32_t k = 0; k < op->nargs; k++)
        if (!is_float(arg[k]->dtype))
          return fm_diag_set(d, FM_ESCHEMA, "%s.args: '%s' pools a floating-point tensor, value %u is %s", path, name,
                             arg[k]->id, fm_dtype_name(arg[k]->dtype));
      /* the tap indices: exact integers in fp32 registers; stored, in a dtype that holds the
         largest (kh * kw - 1) exactly */
      op->dtype = op->op == FM_OP_MAX_POOL2D_ARGMAX ? FM_DT_F32 : arg[0]->dtype;
      int rc = fm_fragment_check_window(op, path, d);
      if (rc || op->op != FM_OP_MAX_POOL2D_BACKWARD) return rc;
      const int64_t taps = (int64_t)op->window[FM_WIN_KH] * op->window[FM_WIN_KW];
      const int64_t exact = arg[1]->dtype == FM_DT_BF16 ? 256 : arg[1]->dtype == FM_DT_F16 ? 2048 : (int64_t)1 << 24;
      if (taps - 1 > exact)
        return fm_diag_set(d, FM_ESCHEMA,
                           "%s.args[1]: '%s' reads tap indices up to %" PRId64 ", which %s does not hold exactly", path,
                           name, taps - 1, fm_dtype_name(arg[1]->dtype));
      return FM_OK;
    }
    case FM_OPK_SCATTER:
      /* the kernel loads its rows itself, at the rows the index names: nothing runs before it */
      for (uint32_t k = 0; k < op->nargs; k++)
        if (!arg[k]->is_input)
          return fm_diag_set(d, FM_EUNSUPPORTED, "%s.args[%u]: '%s' reads fragment inputs only", path, k, name);
      if (!is_float(arg[0]->dtype))
        return fm_diag_set(d, FM_ESCHEMA, "%s.args[0]: '%s' adds floating-point rows, value %u is %s", path, name,
                           arg[0]->id, fm_dtype_name(arg[0]->dtype));
      if (arg[1]->dtype != FM_DT_I64)
        return fm_diag_set(d, FM_ESCHEMA, "%s.args[1]: '%s' takes an i64 index, value %u is %s", path, name, arg[1]->id,
                           fm_dtype_name(arg[1]->dtype));
      op->dtype = FM_DT_F32; /* the sums, added in fp32 */
      return FM_OK;
    case FM_OPK_GATHER:
      /* the kernel loads src itself, at the rows the index names: src is no computed value */
      for (uint32_t k = 0; k < op->nargs; k++)
        if (!arg[k]->is_input)
          return fm_diag_set(d, FM_EUNSUPPORTED, "%s.args[%u]: '%s' reads fragment inputs only", path, k, name);
      if (arg[1]->dtype != FM_DT_I64)
        return fm_diag_set(d, FM_ESCHEMA, "%s.args[1]: '%s' takes an i64 index, value %u is %s", path, name, arg[1]->id,
                           fm_dtype_name(arg[1]->dtype));
      op->dtype = arg[0]->dtype;
      return FM_OK;
    case FM_OPK_COMPOSITE:
      return fm_diag_set(d, FM_ESCHEMA, "%s.op: composite op '%s' must be expanded first (fm_fragment_expand)", path,
                         name);
    case FM_OPK_RESERVED:
      break;
  }
  return fm_diag_set(d, FM_EUNSUPPORTED, "%s.op: op '%s' is reserved for a later vocabulary version", path, name);
}

static int check_op(fm_opnode *op, uint32_t i, uint32_t vocab, values *vs, fm_diag *d) {
  char path[32];
  snprintf(path, sizeof path, "ops[%u]", i);
  if ((unsigned)op->op >= FM_OP__COUNT)
    return fm_diag_set(d, FM_EUNKNOWN_OP, "%s.op: unknown op number %d", path, (int)op->op);
  if (fm_op_kind(op->op) == FM_OPK_RESERVED)
    return fm_diag_set(d, FM_EUNSUPPORTED,
                       "%s.op: op '%s' is reserved for a later vocabulary version (this daemon "
                       "speaks vocab %d)",
                       path, fm_op_name(op->op), FM_VOCAB_VERSION);
  if (fm_op_vocab(op->op) > vocab)
    return fm_diag_set(d, FM_ESCHEMA, "%s.op: '%s' needs vocab %u (the fragment says vocab %u)", path,
                       fm_op_name(op->op), fm_op_vocab(op->op), vocab);
  /* ids above FM_MAX_VALUE_ID are the expansion's own (fm_fragment_expand) */
  if (op->out > FM_MAX_VALUE_ID + FM_MAX_OPS)
    return fm_diag_set(d, FM_ELIMIT, "%s.out: value id %u exceeds the maximum %u", path, op->out, FM_MAX_VALUE_ID);
  int arity = fm_op_arity(op->op);
  if (!fm_op_nargs_ok(op->op, op->nargs)) {
    if (fm_op_kind(op->op) == FM_OPK_CAT)
      return fm_diag_set(d, op->nargs > FM_MAX_ARGS ? FM_ELIMIT : FM_ESCHEMA,
                         "%s.args: 'cat' takes %d to %d args, got %u", path, FM_MIN_CAT_ARGS, FM_MAX_ARGS, op->nargs);
    return fm_diag_set(d, FM_ESCHEMA, "%s.args: '%s' takes %d arg%s, got %u", path, fm_op_name(op->op), arity,
                       arity == 1 ? "" : "s", op->nargs);
  }
  const value *arg[FM_MAX_ARGS] = {NULL};
  for (uint32_t k = 0; k < op->nargs; k++) {
    arg[k] = lookup(vs, op->args[k]);
    if (!arg[k])
      return fm_diag_set(d, FM_ESCHEMA, "%s.args[%u]: value %u is not defined before use", path, k, op->args[k]);
    /* before vocabulary 10 an i64 value is an index, which names rows: computing with it
       (or reading it as data) has no meaning there */
    const int index_arg = k >= fm_op_data_args(op->op, op->nargs);
    if (arg[k]->dtype == FM_DT_I64 && !arg[k]->weak && !index_arg && vocab < FM_VOCAB_INTEGER)
      return fm_diag_set(d, FM_ESCHEMA,
                         "%s.args[%u]: value %u is i64, an index: only index_add's and take_rows' index reads one "
                         "(integer values need vocab %d)",
                         path, k, op->args[k], FM_VOCAB_INTEGER);
  }
  if (fm_op_kind(op->op) == FM_OPK_CAST && op->dtype == FM_DT_I64 && vocab < FM_VOCAB_INTEGER)
    return fm_diag_set(d, FM_ESCHEMA, "%s.dtype: i64 is an index dtype; no value is cast to it before vocab %d", path,
                       FM_VOCAB_INTEGER);
  bool weak;
  int rc = infer(op, arg, &weak, path, d);
  if (rc) return rc;
  char opath[40];
  snprintf(opath, sizeof opath, "%s.out", path);
  return define(
      vs, (value){.id = op->out, .dtype = op->dtype, .weak = weak, .cval = op->value, .is_input = false, .index = i},
      opath, d);
}

/* Outputs are written, so two elements of one output must never share an address: sorted by
 * stride, each dim must step past everything the smaller dims reach. A symbolic dim 0 has no
 * static extent and so must be the outermost. Size-1 dims never move. */
static int check_no_overlap(const fm_tensor *t, const char *path, fm_diag *d) {
  uint32_t order[FM_MAX_RANK], n = 0;
  for (uint32_t i = 0; i < t->rank; i++)
    if (t->shape[i] != 1) order[n++] = i;
  for (uint32_t a = 1; a < n; a++) { /* insertion sort by stride, symbolic last among ties */
    uint32_t x = order[a], b = a;
    while (b > 0) {
      uint32_t y = order[b - 1];
      bool after = t->strides[y] > t->strides[x] || (t->strides[y] == t->strides[x] && t->shape[y] == FM_DIM_SYMBOLIC);
      if (!after) break;
      order[b] = y;
      b--;
    }
    order[b] = x;
  }
  int64_t reach = 0; /* the largest offset the dims so far can produce */
  for (uint32_t k = 0; k < n; k++) {
    uint32_t i = order[k];
    if (t->strides[i] <= reach)
      return fm_diag_set(d, FM_ESCHEMA,
                         "%s.strides: elements would overlap (dim %u, stride %" PRId64
                         ", lands on "
                         "offsets the smaller dims already reach)",
                         path, i, t->strides[i]);
    if (t->shape[i] == FM_DIM_SYMBOLIC) {
      if (k != n - 1)
        return fm_diag_set(d, FM_ESCHEMA, "%s.strides[0]: the symbolic dim must have the largest stride", path);
      break;
    }
    reach += (t->shape[i] - 1) * t->strides[i]; /* bounded by check_tensor's span limit */
  }
  return FM_OK;
}

/* Inputs broadcast to the iteration shape; outputs have it exactly. */
static int check_shapes(const fm_fragment *f, fm_diag *d) {
  const fm_tensor *it = &f->outputs[0];
  char want[160], got[160];
  format_shape(it, want, sizeof want);
  for (uint32_t k = 1; k < f->n_outputs; k++) {
    const fm_tensor *t = &f->outputs[k];
    bool same = t->rank == it->rank;
    for (uint32_t i = 0; same && i < t->rank; i++) same = t->shape[i] == it->shape[i];
    if (!same) {
      format_shape(t, got, sizeof got);
      return fm_diag_set(d, FM_ESCHEMA, "outputs[%u].shape: %s differs from the iteration shape %s (outputs[0])", k,
                         got, want);
    }
  }
  for (uint32_t k = 0; k < f->n_inputs; k++) {
    const fm_tensor *t = &f->inputs[k];
    if (t->rank != it->rank)
      return fm_diag_set(d, FM_ESCHEMA,
                         "inputs[%u].shape: rank %u differs from the iteration rank %u (broadcast "
                         "with size-1 dims)",
                         k, t->rank, it->rank);
    for (uint32_t i = 0; i < t->rank; i++) {
      int64_t dim = t->shape[i], want_dim = it->shape[i];
      if (dim == want_dim || dim == 1) continue;
      if (want_dim == FM_DIM_SYMBOLIC)
        return fm_diag_set(d, FM_ESCHEMA,
                           "inputs[%u].shape[%u]: %" PRId64
                           " must be -1 (symbolic) or 1 "
                           "(broadcast): the iteration dim 0 is symbolic",
                           k, i, dim);
      if (dim == FM_DIM_SYMBOLIC)
        return fm_diag_set(d, FM_ESCHEMA,
                           "inputs[%u].shape[%u]: symbolic, but the iteration dim is static (%" PRId64 ")", k, i,
                           want_dim);
      return fm_diag_set(d, FM_ESCHEMA,
                         "inputs[%u].shape[%u]: %" PRId64 " does not broadcast to %" PRId64
                         " (the iteration shape is %s)",
                         k, i, dim, want_dim, want);
    }
  }
  return FM_OK;
}

int fm_fragment_is_rows(const fm_fragment *f) {
  if (!f || f->n_ops > FM_MAX_OPS) return 0;
  for (uint32_t i = 0; i < f->n_ops; i++)
    if (fm_op_kind(f->ops[i].op) == FM_OPK_REDUCE) return !fm_fragment_is_cols(f);
  return 0;
}

int fm_fragment_is_gemm(const fm_fragment *f) { return fm_fragment_gemm_op(f) >= 0; }

int fm_fragment_is_bmm(const fm_fragment *f) {
  int g = fm_fragment_gemm_op(f);
  return g >= 0 && f->ops[g].op == FM_OP_BMM;
}

int fm_fragment_gemm_op2(const fm_fragment *f) {
  int g = fm_fragment_gemm_op(f);
  for (uint32_t i = g >= 0 ? (uint32_t)g + 1 : f->n_ops; i < f->n_ops; i++)
    if (fm_op_kind(f->ops[i].op) == FM_OPK_MATMUL) return (int)i;
  return -1;
}

int fm_fragment_gemm_op(const fm_fragment *f) {
  if (!f || f->n_ops > FM_MAX_OPS) return -1;
  for (uint32_t i = 0; i < f->n_ops; i++)
    if (fm_op_kind(f->ops[i].op) == FM_OPK_MATMUL) return (int)i;
  return -1;
}

void fm_fragment_prepend_ones(fm_tensor *t, uint32_t rank) {
  while (t->rank < rank) {
    memmove(&t->shape[1], &t->shape[0], sizeof t->shape[0] * t->rank);
    memmove(&t->strides[1], &t->strides[0], sizeof t->strides[0] * t->rank);
    t->shape[0] = 1;
    t->strides[0] = 0;
    t->rank++;
  }
}

/* A matrix operand is row- or column-major: stride 1 in one of its two dims (a size-1 dim
 * never moves, so its stride does not matter). */
static bool unit_dim(const fm_tensor *t, uint32_t j) { return t->shape[j] == 1 || t->strides[j] == 1; }

/* The second product's B (value b2, read by ops[g2]) is a matrix operand: no other op reads
 * it and no output stores it (siblings and chains alike). */
static int second_b_private(const fm_fragment *f, int g2, uint32_t b2, fm_diag *d) {
  for (uint32_t i = 0; i < f->n_ops; i++)
    for (uint32_t k = 0; k < f->ops[i].nargs; k++)
      if ((int)i != g2 && f->ops[i].args[k] == b2)
        return fm_diag_set(d, FM_EUNSUPPORTED,
                           "ops[%u].args[%u]: value %u is a matrix operand; the epilogue cannot read it", i, k, b2);
  for (uint32_t k = 0; k < f->n_outputs; k++)
    if (f->outputs[k].id == b2)
      return fm_diag_set(d, FM_EUNSUPPORTED, "outputs[%u].id: a matrix operand cannot be an output", k);
  return FM_OK;
}

/* Chains (fm_fragment.h): the second product's operands and dtypes, and the stage rules
 * (fm_fragment_chain_info). The first product's A and B are checked as for any GEMM. */
static int check_chain(const fm_fragment *f, const values *vs, int g, int g2, fm_diag *d) {
  const fm_opnode *mm = &f->ops[g], *m2 = &f->ops[g2];
  if (mm->op == FM_OP_BMM || m2->op == FM_OP_BMM)
    return fm_diag_set(d, FM_EUNSUPPORTED, "ops[%d]: a batched GEMM fragment has exactly one bmm", g2);
  fm_chain_info ci;
  int rc = fm_fragment_chain_info(f, &ci, d);
  if (rc) return rc;
  const value *a2 = lookup(vs, m2->args[m2->nargs - 2]), *b2 = lookup(vs, m2->args[m2->nargs - 1]);
  const value *a1 = lookup(vs, mm->args[mm->nargs - 2]);
  if (!b2->is_input)
    return fm_diag_set(d, FM_EUNSUPPORTED, "ops[%d].args[%u]: the second product's B must be a fragment input", g2,
                       m2->nargs - 1);
  if (a2->dtype != a1->dtype || b2->dtype != a1->dtype)
    return fm_diag_set(d, FM_EUNSUPPORTED,
                       "ops[%d]: the second product multiplies %s by %s; a chain keeps the first "
                       "product's dtype (%s) for both operands (cast the intermediate)",
                       g2, fm_dtype_name(a2->dtype), fm_dtype_name(b2->dtype), fm_dtype_name(a1->dtype));
  return second_b_private(f, g2, b2->id, d);
}

/* A chain's shapes: B2 is [N1, N2], outputs [M, N2], each other input broadcasts to the
 * iteration of every stage that reads it (it1 is the first product's [M, N1]). */
static int check_chain_shapes(fm_fragment *f, const values *vs, int g2, const int64_t it1[2], fm_diag *d) {
  const fm_opnode *m2 = &f->ops[g2];
  const value *vb2 = lookup(vs, m2->args[m2->nargs - 1]);
  const fm_tensor *b2 = &f->inputs[vb2->index];
  if (b2->rank != 2)
    return fm_diag_set(d, FM_ESCHEMA, "inputs[%u].shape: 'mm' operands are rank 2, this one is rank %u", vb2->index,
                       b2->rank);
  if (b2->shape[0] != it1[1])
    return fm_diag_set(d, FM_ESCHEMA,
                       "inputs[%u].shape[0]: the second product's B has %" PRId64
                       " rows; the first "
                       "product has %" PRId64 " columns",
                       vb2->index, b2->shape[0], it1[1]);
  if (!unit_dim(b2, 0) && !unit_dim(b2, 1))
    return fm_diag_set(d, FM_EUNSUPPORTED,
                       "inputs[%u].strides: B is neither row- nor column-major (no dim has stride 1)", vb2->index);
  const int64_t it2[2] = {it1[0], b2->shape[1]};
  for (uint32_t k = 0; k < f->n_outputs; k++) {
    const fm_tensor *t = &f->outputs[k];
    if (t->rank != 2 || t->shape[0] != it2[0] || t->shape[1] != it2[1])
      return fm_diag_set(d, FM_ESCHEMA,
                         "outputs[%u].shape: a chain's outputs are [M, N2] = "
                         "[%" PRId64 ", %" PRId64 "]",
                         k, it2[0], it2[1]);
  }
  fm_chain_info ci;
  int rc = fm_fragment_chain_info(f, &ci, d);
  if (rc) return rc;
  for (uint32_t k = 0; k < f->n_inputs; k++) {
    fm_tensor *t = &f->inputs[k];
    if (!ci.in_need[k]) continue; /* a matrix operand, or unread */
    if (t->rank > 2)
      return fm_diag_set(d, FM_ESCHEMA, "inputs[%u].shape: rank %u; epilogue inputs broadcast to [M, N]", k, t->rank);
    fm_fragment_prepend_ones(t, 2);
    for (int s = 0; s < 2; s++) {
      if (!(ci.in_need[k] & (1u << s))) continue;
      const int64_t *it = s ? it2 : it1;
      for (uint32_t i = 0; i < 2; i++)
        if (t->shape[i] != it[i] && t->shape[i] != 1)
          return fm_diag_set(d, FM_ESCHEMA,
                             "inputs[%u].shape[%u]: %" PRId64 " does not broadcast to %" PRId64
                             " (read in stage %d of the chain: [M, %s])",
                             k, i, t->shape[i], it[i], s + 1, s ? "N2" : "N1");
    }
  }
  return FM_OK;
}

/* GEMM fragments (fm_fragment.h): one product of two rank-2 inputs (rank 3 for bmm: a batch
 * of products) read by nothing else, an epilogue over [M, N] ([Bt, M, N]). Low-rank epilogue
 * inputs get their leading 1s here (canonical). */
static int check_gemm(fm_fragment *f, values *vs, fm_diag *d) {
  int g = -1, g2 = -1;
  for (uint32_t i = 0; i < f->n_ops; i++) {
    fm_opkind kind = fm_op_kind(f->ops[i].op);
    if (kind == FM_OPK_REDUCE) return fm_diag_set(d, FM_EUNSUPPORTED, "ops[%u]: a GEMM fragment cannot also reduce", i);
    if (kind != FM_OPK_MATMUL) continue;
    if (g2 >= 0)
      return fm_diag_set(d, FM_EUNSUPPORTED,
                         "ops[%u]: a GEMM fragment has one matrix product, or two that share A "
                         "(ops[%d] and ops[%d] are two already)",
                         i, g, g2);
    if (g >= 0)
      g2 = (int)i;
    else
      g = (int)i;
  }
  const fm_opnode *mm = &f->ops[g];
  const bool chain = g2 >= 0 && fm_fragment_is_chain(f);
  if (chain) {
    int rc = check_chain(f, vs, g, g2, d);
    if (rc) return rc;
  } else if (g2 >= 0) {
    /* siblings: two products of one A by two B's of one shape (SwiGLU's gate and up), both
       results [M, N] values of the epilogue */
    const fm_opnode *m2 = &f->ops[g2];
    if (mm->op == FM_OP_BMM || m2->op == FM_OP_BMM)
      return fm_diag_set(d, FM_EUNSUPPORTED, "ops[%d]: a batched GEMM fragment has exactly one bmm", g2);
    if (m2->args[m2->nargs - 2] != mm->args[mm->nargs - 2])
      return fm_diag_set(d, FM_EUNSUPPORTED, "ops[%d]: a second matrix product must share A (value %u) with ops[%d]",
                         g2, mm->args[mm->nargs - 2], g);
    const value *b1 = lookup(vs, mm->args[mm->nargs - 1]), *b2 = lookup(vs, m2->args[m2->nargs - 1]);
    if (b1 == b2)
      return fm_diag_set(d, FM_EUNSUPPORTED, "ops[%d]: the two products have the same B (compute it once)", g2);
    if (b2 && b2 == lookup(vs, mm->args[mm->nargs - 2]))
      return fm_diag_set(d, FM_EUNSUPPORTED, "ops[%d].args: A and B are the same tensor", g2);
    if (!b2->is_input)
      return fm_diag_set(d, FM_EUNSUPPORTED,
                         "ops[%d].args[%u]: the matrix operands must be fragment inputs (nothing runs "
                         "before the GEMM)",
                         g2, m2->nargs - 1);
    int rc = second_b_private(f, g2, b2->id, d);
    if (rc) return rc;
    if (b1->is_input) {
      const fm_tensor *t1 = &f->inputs[b1->index], *t2 = &f->inputs[b2->index];
      if (t2->rank != 2 || t1->rank != 2 || t1->shape[0] != t2->shape[0] || t1->shape[1] != t2->shape[1])
        return fm_diag_set(d, FM_ESCHEMA, "inputs[%u].shape: the two products' B's differ in shape", b2->index);
      if (t2->dtype != t1->dtype)
        return fm_diag_set(d, FM_ESCHEMA, "inputs[%u].dtype: the two products' B's differ in dtype", b2->index);
      if (!unit_dim(t2, 0) && !unit_dim(t2, 1))
        return fm_diag_set(d, FM_EUNSUPPORTED,
                           "inputs[%u].strides: B is neither row- nor column-major (no dim has stride 1)", b2->index);
    }
  }
  /* r: the rank of every GEMM tensor; the matrix dims are the last two, bmm's batch dim 0 */
  const uint32_t r = mm->op == FM_OP_BMM ? 3 : 2, mdim = r - 2, ndim = r - 1;
  uint32_t ia = mm->nargs - 2, ib = mm->nargs - 1;
  const value *va = lookup(vs, mm->args[ia]), *vb = lookup(vs, mm->args[ib]);
  if (!va->is_input || !vb->is_input)
    return fm_diag_set(d, FM_EUNSUPPORTED,
                       "ops[%d].args[%u]: the matrix operands must be fragment inputs (nothing runs "
                       "before the GEMM)",
                       g, va->is_input ? ib : ia);
  if (va == vb) return fm_diag_set(d, FM_EUNSUPPORTED, "ops[%d].args: A and B are the same tensor", g);
  for (uint32_t i = 0; i < f->n_ops; i++)
    for (uint32_t k = 0; k < f->ops[i].nargs; k++)
      if ((int)i != g && (int)i != g2 && (f->ops[i].args[k] == va->id || f->ops[i].args[k] == vb->id))
        return fm_diag_set(d, FM_EUNSUPPORTED,
                           "ops[%u].args[%u]: value %u is a matrix operand; the epilogue cannot read it", i, k,
                           f->ops[i].args[k]);
  for (uint32_t k = 0; k < f->n_outputs; k++)
    if (f->outputs[k].id == va->id || f->outputs[k].id == vb->id)
      return fm_diag_set(d, FM_EUNSUPPORTED, "outputs[%u].id: a matrix operand cannot be an output", k);
  const fm_tensor *a = &f->inputs[va->index], *b = &f->inputs[vb->index];
  if (a->rank != r || b->rank != r)
    return fm_diag_set(d, FM_ESCHEMA, "inputs[%u].shape: '%s' operands are rank %u, this one is rank %u",
                       a->rank != r ? va->index : vb->index, fm_op_name(mm->op), r, a->rank != r ? a->rank : b->rank);
  /* only dim 0 may be symbolic (check_tensor): mm's M, or bmm's batch */
  if (r == 2 && b->shape[0] == FM_DIM_SYMBOLIC)
    return fm_diag_set(d, FM_ESCHEMA, "inputs[%u].shape[0]: K must be static", vb->index);
  /* bmm pairs the batches; a batch dim of 1 is one matrix for every batch (broadcast) */
  int64_t batch = r == 3 ? (a->shape[0] == 1 ? b->shape[0] : a->shape[0]) : 1;
  if (r == 3 && ((a->shape[0] != batch && a->shape[0] != 1) || (b->shape[0] != batch && b->shape[0] != 1)))
    return fm_diag_set(d, FM_ESCHEMA,
                       "ops[%d]: A has %" PRId64 " matrices and B %" PRId64
                       " (bmm pairs them; -1: the symbolic batch, 1: one for all)",
                       g, a->shape[0], b->shape[0]);
  if (a->shape[ndim] != b->shape[mdim])
    return fm_diag_set(d, FM_ESCHEMA,
                       "ops[%d]: A is [.., %" PRId64 ", %" PRId64 "] and B [.., %" PRId64 ", %" PRId64
                       "]: the inner dims differ",
                       g, a->shape[mdim], a->shape[ndim], b->shape[mdim], b->shape[ndim]);
  for (int w = 0; w < 2; w++) {
    const fm_tensor *t = w ? b : a;
    if (!unit_dim(t, mdim) && !unit_dim(t, ndim))
      return fm_diag_set(d, FM_EUNSUPPORTED,
                         "inputs[%u].strides: %c is neither row- nor column-major (no dim has stride 1)",
                         w ? vb->index : va->index, w ? 'B' : 'A');
  }
  int64_t it[3] = {batch, a->shape[mdim], b->shape[ndim]}; /* [Bt, M, N], or [M, N] */
  if (r == 2) it[0] = a->shape[0], it[1] = b->shape[1];
  if (chain) return check_chain_shapes(f, vs, g2, it, d);
  for (uint32_t k = 0; k < f->n_outputs; k++) {
    const fm_tensor *t = &f->outputs[k];
    bool same = t->rank == r;
    for (uint32_t i = 0; same && i < r; i++) same = t->shape[i] == it[i];
    if (!same) {
      if (r == 3)
        return fm_diag_set(d, FM_ESCHEMA,
                           "outputs[%u].shape: a batched GEMM fragment's outputs are "
                           "[Bt, M, N] = [%" PRId64 ", %" PRId64 ", %" PRId64 "]",
                           k, it[0], it[1], it[2]);
      return fm_diag_set(d, FM_ESCHEMA,
                         "outputs[%u].shape: a GEMM fragment's outputs are [M, N] = "
                         "[%" PRId64 ", %" PRId64 "]",
                         k, it[0], it[1]);
    }
  }
  int b2_index = g2 >= 0 ? (int)lookup(vs, f->ops[g2].args[f->ops[g2].nargs - 1])->index : -1;
  for (uint32_t k = 0; k < f->n_inputs; k++) {
    fm_tensor *t = &f->inputs[k];
    if (k == va->index || k == vb->index || (int)k == b2_index) continue;
    if (t->rank > r)
      return fm_diag_set(d, FM_ESCHEMA, "inputs[%u].shape: rank %u; epilogue inputs broadcast to %s", k, t->rank,
                         r == 3 ? "[Bt, M, N]" : "[M, N]");
    fm_fragment_prepend_ones(t, r);
    for (uint32_t i = 0; i < r; i++) {
      int64_t dim = t->shape[i];
      if (dim == it[i] || dim == 1) continue;
      return fm_diag_set(d, FM_ESCHEMA,
                         "inputs[%u].shape[%u]: %" PRId64 " does not broadcast to %" PRId64 " (the GEMM's %s)", k, i,
                         dim, it[i], r == 3 ? "[Bt, M, N]" : "[M, N]");
    }
  }
  return FM_OK;
}

/* Row fragments (fm_fragment.h): the row shape R, each value's class, the reductions' dims,
 * and how every tensor relates to R. Outputs of per-row values written without the kept dim
 * (keepdim=false) get it appended here: that is the canonical shape. */
static int check_rows(fm_fragment *f, values *vs, fm_diag *d) {
  uint32_t r = 0;
  for (uint32_t k = 0; k < f->n_inputs; k++) r = f->inputs[k].rank > r ? f->inputs[k].rank : r;
  for (uint32_t k = 0; k < f->n_outputs; k++) r = f->outputs[k].rank > r ? f->outputs[k].rank : r;
  if (r == 0) return fm_diag_set(d, FM_ESCHEMA, "a reduction needs a dim to reduce: every tensor is rank 0");
  int64_t n = 1;
  for (uint32_t k = 0; k < f->n_inputs + f->n_outputs; k++) {
    const fm_tensor *t = k < f->n_inputs ? &f->inputs[k] : &f->outputs[k - f->n_inputs];
    if (t->rank == r && t->shape[r - 1] > n) n = t->shape[r - 1];
    if (t->rank == r && t->shape[r - 1] == FM_DIM_SYMBOLIC)
      return fm_diag_set(d, FM_EUNSUPPORTED, "%s[%u].shape: the reduced (last) dim must be static, not symbolic",
                         k < f->n_inputs ? "inputs" : "outputs", k < f->n_inputs ? k : k - f->n_inputs);
  }
  if (n > FM_MAX_ROW)
    return fm_diag_set(d, FM_EUNSUPPORTED, "rows of %" PRId64 " elements exceed the limit of %d", n, FM_MAX_ROW);
  for (uint32_t i = 0; n > FM_MAX_ROW_HELD && i < f->n_ops; i++)
    if (f->ops[i].op == FM_OP_VAR)
      return fm_diag_set(d, FM_EUNSUPPORTED,
                         "ops[%u]: var over rows of %" PRId64
                         " elements: a row longer than the "
                         "%d a kernel holds in registers is streamed, and var needs it held",
                         i, n, FM_MAX_ROW_HELD);
  /* classes: inputs by their last dim, ops by their operands */
  for (uint32_t v = 0; v < vs->n; v++) {
    value *x = &vs->v[v];
    if (x->is_input) {
      const fm_tensor *t = &f->inputs[x->index];
      x->cls = (t->rank == r && t->shape[r - 1] == n) ? CLS_ROW : CLS_PERROW;
      continue;
    }
    const fm_opnode *op = &f->ops[x->index];
    x->cls = op->op == FM_OP_IOTA ? CLS_ROW : CLS_PERROW; /* a column index: one per element */
    for (uint32_t a = 0; a < op->nargs; a++)
      if (lookup(vs, op->args[a])->cls == CLS_ROW) x->cls = CLS_ROW;
    if (fm_op_kind(op->op) != FM_OPK_REDUCE) continue;
    if (op->dim != -1 && op->dim != (int32_t)r - 1)
      return fm_diag_set(d, FM_EUNSUPPORTED,
                         "ops[%u].dim: '%s' over dim %d of a rank-%u row; only the last dim "
                         "(-1) can be reduced",
                         x->index, fm_op_name(op->op), op->dim, r);
    if (x->cls != CLS_ROW)
      return fm_diag_set(d, FM_EUNSUPPORTED,
                         "ops[%u].args[0]: nested reduction: value %u is already one value per "
                         "row",
                         x->index, op->args[0]);
    x->cls = CLS_PERROW;
  }
  /* outputs: keepdim=false shapes get their 1 back; the row shape comes from outputs[0] */
  for (uint32_t k = 0; k < f->n_outputs; k++) {
    fm_tensor *t = &f->outputs[k];
    if (lookup(vs, t->id)->cls == CLS_PERROW && t->rank + 1 == r) {
      t->shape[r - 1] = 1;
      t->strides[r - 1] = 0;
      t->rank = r;
    }
    if (t->rank != r)
      return fm_diag_set(d, FM_ESCHEMA, "outputs[%u].shape: rank %u, the row rank is %u", k, t->rank, r);
  }
  fm_tensor it = f->outputs[0];
  it.shape[r - 1] = n;
  char want[160], got[160];
  format_shape(&it, want, sizeof want);
  for (uint32_t k = 0; k < f->n_outputs; k++) {
    const fm_tensor *t = &f->outputs[k];
    int per_row = lookup(vs, t->id)->cls == CLS_PERROW;
    bool same = true;
    for (uint32_t i = 0; i + 1 < r; i++) same = same && t->shape[i] == it.shape[i];
    same = same && t->shape[r - 1] == (per_row ? 1 : n);
    if (!same) {
      format_shape(t, got, sizeof got);
      return fm_diag_set(d, FM_ESCHEMA, "outputs[%u].shape: %s, but its value is %s of the row shape %s", k, got,
                         per_row ? "one per row (last dim 1)" : "a full row", want);
    }
  }
  for (uint32_t k = 0; k < f->n_inputs; k++) {
    const fm_tensor *t = &f->inputs[k];
    if (t->rank != r)
      return fm_diag_set(d, FM_ESCHEMA,
                         "inputs[%u].shape: rank %u differs from the row rank %u (broadcast with "
                         "size-1 dims)",
                         k, t->rank, r);
    for (uint32_t i = 0; i < r; i++) {
      int64_t dim = t->shape[i], want_dim = it.shape[i];
      if (dim == want_dim || dim == 1) continue;
      if (want_dim == FM_DIM_SYMBOLIC)
        return fm_diag_set(d, FM_ESCHEMA,
                           "inputs[%u].shape[%u]: %" PRId64
                           " must be -1 (symbolic) or 1 "
                           "(broadcast): the row dim 0 is symbolic",
                           k, i, dim);
      return fm_diag_set(d, FM_ESCHEMA,
                         "inputs[%u].shape[%u]: %" PRId64 " does not broadcast to %" PRId64 " (the row shape is %s)", k,
                         i, dim, want_dim, want);
    }
  }
  return FM_OK;
}

/* Whether value id is the index some take_rows reads. */
static int is_take_rows_index(const fm_fragment *f, uint32_t id) {
  for (uint32_t i = 0; i < f->n_ops; i++)
    if (fm_op_kind(f->ops[i].op) == FM_OPK_GATHER && f->ops[i].nargs == 2 && f->ops[i].args[1] == id) return 1;
  return 0;
}

/* A cat, a window op or take_rows beside a reduction or a product: the templates that run
 * those have no extent form. Names the first such op (a cat keeps the words vocabulary 6
 * answered). */
static int extent_op_elsewhere(const fm_fragment *f, fm_diag *d) {
  for (uint32_t i = 0; i < f->n_ops; i++)
    if (fm_op_kind(f->ops[i].op) == FM_OPK_WINDOW || fm_op_kind(f->ops[i].op) == FM_OPK_GATHER)
      return fm_diag_set(d, FM_EUNSUPPORTED,
                         "ops[%u]: a %s runs in a pointwise fragment only (not with a reduction or a matrix product)",
                         i, fm_op_name(f->ops[i].op));
  return fm_diag_set(d, FM_EUNSUPPORTED,
                     "ops: a cat runs in a pointwise fragment only (not with a reduction or a matrix product)");
}

int fm_fragment_validate(fm_fragment *f, fm_diag *d) {
  char path[32];
  int rc;
  if (!f) return fm_diag_set(d, FM_EINVAL, "fm_fragment_validate: NULL fragment");
  if (f->vocab < FM_VOCAB_MIN || f->vocab > FM_VOCAB_VERSION)
    return fm_diag_set(d, FM_ESCHEMA, "vocab %u not supported, this daemon speaks %d to %d", f->vocab, FM_VOCAB_MIN,
                       FM_VOCAB_VERSION);
  if (f->n_inputs > FM_MAX_INPUTS)
    return fm_diag_set(d, FM_ELIMIT, "inputs: %u inputs exceed the limit of %d", f->n_inputs, FM_MAX_INPUTS);
  if (f->n_ops > FM_MAX_OPS)
    return fm_diag_set(d, FM_ELIMIT, "ops: %u ops exceed the limit of %d", f->n_ops, FM_MAX_OPS);
  if (f->n_outputs > FM_MAX_OUTPUTS)
    return fm_diag_set(d, FM_ELIMIT, "outputs: %u outputs exceed the limit of %d", f->n_outputs, FM_MAX_OUTPUTS);
  if (f->n_outputs == 0) return fm_diag_set(d, FM_ESCHEMA, "outputs: at least one output is required");

  for (uint32_t k = 0; k < f->n_inputs; k++) {
    snprintf(path, sizeof path, "inputs[%u]", k);
    if ((rc = check_tensor(&f->inputs[k], path, d))) return rc;
  }
  for (uint32_t k = 0; k < f->n_outputs; k++) {
    snprintf(path, sizeof path, "outputs[%u]", k);
    if ((rc = check_tensor(&f->outputs[k], path, d))) return rc;
  }

  values vs; /* ~6 KB of stack */
  vs.n = 0;
  for (uint32_t k = 0; k < f->n_inputs; k++) {
    snprintf(path, sizeof path, "inputs[%u].id", k);
    const fm_tensor *t = &f->inputs[k];
    value v = {.id = t->id, .dtype = t->dtype, .weak = false, .is_input = true, .index = k};
    if ((rc = define(&vs, v, path, d))) return rc;
  }
  for (uint32_t i = 0; i < f->n_ops; i++)
    if ((rc = check_op(&f->ops[i], i, f->vocab, &vs, d))) return rc;

  for (uint32_t k = 0; k < f->n_outputs; k++) {
    const fm_tensor *t = &f->outputs[k];
    const value *v = lookup(&vs, t->id);
    if (!v) return fm_diag_set(d, FM_ESCHEMA, "outputs[%u].id: value %u is not defined by any input or op", k, t->id);
    if (t->dtype == FM_DT_I64 && f->vocab < FM_VOCAB_INTEGER)
      return fm_diag_set(d, FM_ESCHEMA,
                         "outputs[%u].dtype: i64 is an index dtype; no output stores one before vocab %d", k,
                         FM_VOCAB_INTEGER);
    if (v->dtype != t->dtype)
      return fm_diag_set(d, FM_ESCHEMA, "outputs[%u].dtype: %s does not match value %u, which is %s (add a cast)", k,
                         fm_dtype_name(t->dtype), t->id, fm_dtype_name(v->dtype));
  }
  if (fm_fragment_has_integers(f) && (fm_fragment_is_scatter(f) || fm_fragment_is_extent(f) || fm_fragment_is_gemm(f) ||
                                      fm_fragment_is_rows(f) || fm_fragment_is_cols(f)))
    return fm_diag_set(d, FM_EUNSUPPORTED,
                       "integer values run in a pointwise fragment only (not with a reduction, a product, a cat, a "
                       "window op, index_add or take_rows)");
  if ((rc = fm_fragment_check_iota(f, d))) return rc;
  if (fm_fragment_is_scatter(f)) return fm_fragment_check_scatter(f, d);
  for (uint32_t k = 0; k < f->n_inputs; k++)
    if (f->inputs[k].dtype == FM_DT_I64 && f->vocab < FM_VOCAB_INTEGER && !is_take_rows_index(f, f->inputs[k].id))
      return fm_diag_set(d, FM_ESCHEMA,
                         "inputs[%u].dtype: i64 is an index dtype: only index_add's and take_rows' index may be i64",
                         k);
  if (fm_fragment_is_extent(f) && (fm_fragment_is_gemm(f) || fm_fragment_is_rows(f) || fm_fragment_is_cols(f)))
    return extent_op_elsewhere(f, d);
  rc = fm_fragment_is_gemm(f)     ? check_gemm(f, &vs, d)
       : fm_fragment_is_cols(f)   ? fm_fragment_check_cols(f, d)
       : fm_fragment_is_rows(f)   ? check_rows(f, &vs, d)
       : fm_fragment_is_extent(f) ? fm_fragment_check_cat(f, d)
                                  : check_shapes(f, d);
  if (rc) return rc;
  for (uint32_t k = 0; k < f->n_outputs; k++) {
    snprintf(path, sizeof path, "outputs[%u]", k);
    if ((rc = check_no_overlap(&f->outputs[k], path, d))) return rc;
  }
  return FM_OK;
}
