/* fm_fragment_decode.c: the fragment wire form (a msgpack map) into an fm_fragment.
 *
 * Decoding checks types, key names and whatever the fixed-size struct cannot hold (counts,
 * rank, id range); every semantic rule is fm_fragment_validate's, so a fragment built in C
 * gets the same checks. Unknown keys are refused: a typo ("stride") must not silently mean
 * "contiguous". Every diag starts with where the problem is ("ops[3].args[1]: ..."). */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "fm_fragment.h"
#include "fm_msg.h"

#define PATH_MAX_  64
#define MAX_FIELDS 5

/* Copies a client string into a diag-safe form: printable ASCII only, bounded. */
static const char *shown(const char *s, size_t n, char out[52]) {
  size_t k = 0;
  for (size_t i = 0; i < n && k < 48; i++) {
    unsigned char c = (unsigned char)s[i];
    out[k++] = (c >= 0x20 && c < 0x7f) ? (char)c : '?';
  }
  if (n > 48) {
    memcpy(out + k, "...", 3);
    k += 3;
  }
  out[k] = '\0';
  return out;
}

static const char *kind_of(const msgpack_object *o) {
  switch (o->type) {
    case MSGPACK_OBJECT_NIL:
      return "nil";
    case MSGPACK_OBJECT_BOOLEAN:
      return "a bool";
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
      return "an integer";
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64:
      return "a float";
    case MSGPACK_OBJECT_STR:
      return "a str";
    case MSGPACK_OBJECT_ARRAY:
      return "an array";
    case MSGPACK_OBJECT_MAP:
      return "a map";
    case MSGPACK_OBJECT_BIN:
      return "a bin";
    case MSGPACK_OBJECT_EXT:
      return "an ext";
  }
  return "an unknown type";
}

/* Splits a map into the named fields (NULL when absent), refusing other keys, non-str keys
 * and duplicates. required is a bitmask over names. */
static int fields(const msgpack_object *obj, const char *path, const char *const *names, int n_names, unsigned required,
                  const msgpack_object **out, fm_diag *d) {
  char buf[52];
  if (obj->type != MSGPACK_OBJECT_MAP)
    return fm_diag_set(d, FM_ESCHEMA, "%s: expected a map, got %s", path, kind_of(obj));
  for (int i = 0; i < n_names; i++) out[i] = NULL;
  for (uint32_t k = 0; k < obj->via.map.size; k++) {
    const msgpack_object *key = &obj->via.map.ptr[k].key;
    if (key->type != MSGPACK_OBJECT_STR)
      return fm_diag_set(d, FM_ESCHEMA, "%s: keys must be str, got %s", path, kind_of(key));
    int i = 0;
    while (i < n_names && !fm_msg_str_eq(key, names[i])) i++;
    if (i == n_names)
      return fm_diag_set(d, FM_ESCHEMA, "%s: unknown key '%s'", path, shown(key->via.str.ptr, key->via.str.size, buf));
    if (out[i]) return fm_diag_set(d, FM_ESCHEMA, "%s: key '%s' appears twice", path, names[i]);
    out[i] = &obj->via.map.ptr[k].val;
  }
  for (int i = 0; i < n_names; i++)
    if ((required & (1u << i)) && !out[i]) return fm_diag_set(d, FM_ESCHEMA, "%s: missing key '%s'", path, names[i]);
  return FM_OK;
}

static int get_u64(const msgpack_object *o, const char *path, uint64_t *v, fm_diag *d) {
  if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
    return fm_diag_set(d, FM_ESCHEMA, "%s: expected a non-negative integer, got %" PRId64, path, o->via.i64);
  if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
    return fm_diag_set(d, FM_ESCHEMA, "%s: expected an integer, got %s", path, kind_of(o));
  *v = o->via.u64;
  return FM_OK;
}

static int get_i64(const msgpack_object *o, const char *path, int64_t *v, fm_diag *d) {
  if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
    *v = o->via.i64;
    return FM_OK;
  }
  if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
    return fm_diag_set(d, FM_ESCHEMA, "%s: expected an integer, got %s", path, kind_of(o));
  if (o->via.u64 > (uint64_t)INT64_MAX)
    return fm_diag_set(d, FM_ELIMIT, "%s: %" PRIu64 " is out of range", path, o->via.u64);
  *v = (int64_t)o->via.u64;
  return FM_OK;
}

static int get_id(const msgpack_object *o, const char *path, uint32_t *id, fm_diag *d) {
  uint64_t v = 0;
  int rc = get_u64(o, path, &v, d);
  if (rc) return rc;
  if (v > FM_MAX_VALUE_ID)
    return fm_diag_set(d, FM_ELIMIT, "%s: value id %" PRIu64 " exceeds the maximum %u", path, v, FM_MAX_VALUE_ID);
  *id = (uint32_t)v;
  return FM_OK;
}

static int get_dtype(const msgpack_object *o, const char *path, fm_dtype *dt, fm_diag *d) {
  char buf[52];
  if (o->type != MSGPACK_OBJECT_STR)
    return fm_diag_set(d, FM_ESCHEMA, "%s: expected a dtype name (str), got %s", path, kind_of(o));
  if (fm_dtype_parse(o->via.str.ptr, o->via.str.size, dt))
    return fm_diag_set(d, FM_ESCHEMA, "%s: unknown dtype '%s' (expected bool, f16, bf16 or f32)", path,
                       shown(o->via.str.ptr, o->via.str.size, buf));
  return FM_OK;
}

/* The default layout: contiguous row-major. Dim 0's stride is the product of the other dims
 * even when dim 0 is symbolic (dim 0 is outermost, so no stride depends on its size). A
 * product that overflows saturates; validation refuses such shapes before strides matter. */
static void contiguous_strides(fm_tensor *t) {
  int64_t s = 1;
  for (uint32_t i = t->rank; i-- > 0;) {
    t->strides[i] = s;
    int64_t dim = t->shape[i] > 0 ? t->shape[i] : 1;
    if (__builtin_mul_overflow(s, dim, &s)) s = INT64_MAX;
  }
}

enum { T_ID, T_DTYPE, T_SHAPE, T_STRIDES, T_ALIGN, T__N };
static const char *const tensor_keys[T__N] = {"id", "dtype", "shape", "strides", "align"};

static int decode_tensor(const msgpack_object *obj, const char *path, fm_tensor *t, fm_diag *d) {
  const msgpack_object *f[T__N];
  char p[PATH_MAX_ + 32];
  int rc = fields(obj, path, tensor_keys, T__N, 1u << T_ID | 1u << T_DTYPE | 1u << T_SHAPE, f, d);
  if (rc) return rc;

  snprintf(p, sizeof p, "%s.id", path);
  if ((rc = get_id(f[T_ID], p, &t->id, d))) return rc;
  snprintf(p, sizeof p, "%s.dtype", path);
  if ((rc = get_dtype(f[T_DTYPE], p, &t->dtype, d))) return rc;

  const msgpack_object *shape = f[T_SHAPE];
  if (shape->type != MSGPACK_OBJECT_ARRAY)
    return fm_diag_set(d, FM_ESCHEMA, "%s.shape: expected an array, got %s", path, kind_of(shape));
  if (shape->via.array.size > FM_MAX_RANK)
    return fm_diag_set(d, FM_ELIMIT, "%s.shape: rank %u exceeds the limit of %d", path, shape->via.array.size,
                       FM_MAX_RANK);
  t->rank = shape->via.array.size;
  for (uint32_t i = 0; i < t->rank; i++) {
    snprintf(p, sizeof p, "%s.shape[%u]", path, i);
    if ((rc = get_i64(&shape->via.array.ptr[i], p, &t->shape[i], d))) return rc;
  }

  const msgpack_object *strides = f[T_STRIDES];
  if (strides) {
    if (strides->type != MSGPACK_OBJECT_ARRAY)
      return fm_diag_set(d, FM_ESCHEMA, "%s.strides: expected an array, got %s", path, kind_of(strides));
    if (strides->via.array.size != t->rank)
      return fm_diag_set(d, FM_ESCHEMA, "%s.strides: %u entries for a shape of rank %u", path, strides->via.array.size,
                         t->rank);
    for (uint32_t i = 0; i < t->rank; i++) {
      snprintf(p, sizeof p, "%s.strides[%u]", path, i);
      if ((rc = get_i64(&strides->via.array.ptr[i], p, &t->strides[i], d))) return rc;
    }
  } else {
    contiguous_strides(t);
  }

  t->align = 16;
  if (f[T_ALIGN]) {
    uint64_t a = 0;
    snprintf(p, sizeof p, "%s.align", path);
    if ((rc = get_u64(f[T_ALIGN], p, &a, d))) return rc;
    if (a > FM_MAX_ALIGN)
      return fm_diag_set(d, FM_ESCHEMA, "%s: %" PRIu64 " is not a power of two in 1..%u", p, a, FM_MAX_ALIGN);
    t->align = (uint32_t)a;
  }
  return FM_OK;
}

enum { O_OP, O_OUT, O_ARGS, O_VALUE, O_DTYPE, O_DIM, O_KEEPDIM, O_CORRECTION, O_WINDOW, O_CEIL_MODE, O__N };
static const char *const op_keys[O__N] = {"op",  "out",     "args",       "value",  "dtype",
                                          "dim", "keepdim", "correction", "window", "ceil_mode"};

/* The vocabulary-7 attributes of the window ops: window (required there, 8 integers; their
 * ranges are validation's) and ceil_mode (a bool, default false); refused on every other op. */
static int decode_window_attrs(const msgpack_object *const *f, const char *path, fm_opnode *op, fm_diag *d) {
  char p[PATH_MAX_ + 32];
  const char *opname = fm_op_name(op->op);
  const msgpack_object *w = f[O_WINDOW], *c = f[O_CEIL_MODE];
  int rc;
  memset(op->window, 0, sizeof op->window);
  op->ceil_mode = 0;
  if (fm_op_kind(op->op) != FM_OPK_WINDOW) {
    if (w || c)
      return fm_diag_set(d, FM_ESCHEMA,
                         "%s.%s: only the window ops (max_pool2d, its argmax and backward) take a %s, not '%s'", path,
                         w ? "window" : "ceil_mode", w ? "window" : "ceil_mode", opname);
    return FM_OK;
  }
  if (!w) return fm_diag_set(d, FM_ESCHEMA, "%s: %s needs a 'window' [kh, kw, sh, sw, ph, pw, dh, dw]", path, opname);
  if (w->type != MSGPACK_OBJECT_ARRAY)
    return fm_diag_set(d, FM_ESCHEMA, "%s.window: expected an array of 8 integers, got %s", path, kind_of(w));
  if (w->via.array.size != FM_WIN__N)
    return fm_diag_set(d, FM_ESCHEMA, "%s.window: expected 8 integers [kh, kw, sh, sw, ph, pw, dh, dw], got %u", path,
                       w->via.array.size);
  for (uint32_t k = 0; k < FM_WIN__N; k++) {
    int64_t v = 0;
    snprintf(p, sizeof p, "%s.window[%u]", path, k);
    if ((rc = get_i64(&w->via.array.ptr[k], p, &v, d))) return rc;
    if (v < INT32_MIN || v > INT32_MAX) return fm_diag_set(d, FM_ELIMIT, "%s: %" PRId64 " is out of range", p, v);
    op->window[k] = (int32_t)v;
  }
  if (c) {
    if (c->type != MSGPACK_OBJECT_BOOLEAN)
      return fm_diag_set(d, FM_ESCHEMA, "%s.ceil_mode: expected a bool, got %s", path, kind_of(c));
    op->ceil_mode = c->via.boolean ? 1 : 0;
  }
  return FM_OK;
}

/* The vocabulary-2 attributes: dim (reductions, softmax; cat, vocab 6, where it is required),
 * keepdim (reductions), correction (var). Absent: dim -1, keepdim false, correction 1, as in
 * torch. */
static int decode_row_attrs(const msgpack_object *const *f, const char *path, fm_opnode *op, fm_diag *d) {
  char p[PATH_MAX_ + 32];
  const char *opname = fm_op_name(op->op);
  fm_opkind kind = fm_op_kind(op->op);
  int rc;
  op->dim = -1;
  op->keepdim = 0;
  op->correction = 1;
  if (kind == FM_OPK_CAT && !f[O_DIM]) return fm_diag_set(d, FM_ESCHEMA, "%s: cat needs a 'dim'", path);
  if (f[O_DIM]) {
    int64_t dim = 0;
    if (kind != FM_OPK_REDUCE && kind != FM_OPK_CAT && op->op != FM_OP_SOFTMAX)
      return fm_diag_set(d, FM_ESCHEMA, "%s.dim: only reductions, softmax and cat take a dim, not '%s'", path, opname);
    snprintf(p, sizeof p, "%s.dim", path);
    if ((rc = get_i64(f[O_DIM], p, &dim, d))) return rc;
    if (dim < -FM_MAX_RANK || dim >= FM_MAX_RANK)
      return fm_diag_set(d, FM_ESCHEMA, "%s: %" PRId64 " is not a dim of a rank <= %d tensor", p, dim, FM_MAX_RANK);
    op->dim = (int32_t)dim;
  }
  if (f[O_KEEPDIM]) {
    if (kind != FM_OPK_REDUCE)
      return fm_diag_set(d, FM_ESCHEMA, "%s.keepdim: only reductions take keepdim, not '%s'", path, opname);
    if (f[O_KEEPDIM]->type != MSGPACK_OBJECT_BOOLEAN)
      return fm_diag_set(d, FM_ESCHEMA, "%s.keepdim: expected a bool, got %s", path, kind_of(f[O_KEEPDIM]));
    op->keepdim = f[O_KEEPDIM]->via.boolean ? 1 : 0;
  }
  if (f[O_CORRECTION]) {
    uint64_t c = 0;
    if (op->op != FM_OP_VAR)
      return fm_diag_set(d, FM_ESCHEMA, "%s.correction: only var takes a correction, not '%s'", path, opname);
    snprintf(p, sizeof p, "%s.correction", path);
    if ((rc = get_u64(f[O_CORRECTION], p, &c, d))) return rc;
    if (c > 1) return fm_diag_set(d, FM_ESCHEMA, "%s: %" PRIu64 " is not 0 or 1", p, c);
    op->correction = (uint8_t)c;
  }
  return FM_OK;
}

static int decode_op(const msgpack_object *obj, const char *path, fm_opnode *op, fm_diag *d) {
  const msgpack_object *f[O__N];
  char p[PATH_MAX_ + 32], buf[52];
  int rc = fields(obj, path, op_keys, O__N, 1u << O_OP | 1u << O_OUT, f, d);
  if (rc) return rc;

  const msgpack_object *name = f[O_OP];
  if (name->type != MSGPACK_OBJECT_STR)
    return fm_diag_set(d, FM_ESCHEMA, "%s.op: expected an op name (str), got %s", path, kind_of(name));
  if (fm_op_parse(name->via.str.ptr, name->via.str.size, &op->op))
    return fm_diag_set(d, FM_EUNKNOWN_OP, "%s.op: unknown op '%s'", path,
                       shown(name->via.str.ptr, name->via.str.size, buf));
  const char *opname = fm_op_name(op->op);
  fm_opkind kind = fm_op_kind(op->op);
  if (kind == FM_OPK_RESERVED)
    return fm_diag_set(d, FM_EUNSUPPORTED,
                       "%s.op: op '%s' is reserved for a later vocabulary version (this daemon "
                       "speaks vocab %d)",
                       path, opname, FM_VOCAB_VERSION);

  snprintf(p, sizeof p, "%s.out", path);
  if ((rc = get_id(f[O_OUT], p, &op->out, d))) return rc;

  int arity = fm_op_arity(op->op);
  const msgpack_object *args = f[O_ARGS];
  if (args && args->type != MSGPACK_OBJECT_ARRAY)
    return fm_diag_set(d, FM_ESCHEMA, "%s.args: expected an array, got %s", path, kind_of(args));
  uint32_t nargs = args ? args->via.array.size : 0;
  /* composites take optional trailing args (weight, bias); cat 2 to FM_MAX_ARGS values */
  if (kind == FM_OPK_COMPOSITE ? (nargs < 1 || nargs > (uint32_t)arity) : !fm_op_nargs_ok(op->op, nargs)) {
    if (kind == FM_OPK_COMPOSITE || kind == FM_OPK_CAT)
      return fm_diag_set(d, kind == FM_OPK_CAT && nargs > FM_MAX_ARGS ? FM_ELIMIT : FM_ESCHEMA,
                         "%s.args: '%s' takes %d to %d args, got %u", path, opname,
                         kind == FM_OPK_CAT ? FM_MIN_CAT_ARGS : 1, arity, nargs);
    return fm_diag_set(d, FM_ESCHEMA, "%s.args: '%s' takes %d arg%s, got %u", path, opname, arity,
                       arity == 1 ? "" : "s", nargs);
  }
  op->nargs = nargs;
  for (uint32_t i = 0; i < nargs; i++) {
    snprintf(p, sizeof p, "%s.args[%u]", path, i);
    if ((rc = get_id(&args->via.array.ptr[i], p, &op->args[i], d))) return rc;
  }

  /* const's value; layer_norm's and rms_norm's eps */
  const msgpack_object *value = f[O_VALUE];
  int takes_value = kind == FM_OPK_CONST || op->op == FM_OP_LAYER_NORM || op->op == FM_OP_RMS_NORM;
  if (takes_value) {
    if (!value)
      return fm_diag_set(d, FM_ESCHEMA, "%s: %s needs a 'value'%s", path, opname,
                         kind == FM_OPK_CONST ? "" : " (its eps)");
    switch (value->type) {
      case MSGPACK_OBJECT_FLOAT32:
      case MSGPACK_OBJECT_FLOAT64:
        op->value = value->via.f64;
        break;
      case MSGPACK_OBJECT_POSITIVE_INTEGER:
        op->value = (double)value->via.u64;
        break;
      case MSGPACK_OBJECT_NEGATIVE_INTEGER:
        op->value = (double)value->via.i64;
        break;
      default:
        return fm_diag_set(d, FM_ESCHEMA, "%s.value: expected a number, got %s", path, kind_of(value));
    }
  } else if (value) {
    return fm_diag_set(d, FM_ESCHEMA, "%s.value: only const takes a value (and layer_norm/rms_norm an eps), not '%s'",
                       path, opname);
  }

  const msgpack_object *dtype = f[O_DTYPE];
  if (kind == FM_OPK_CAST || kind == FM_OPK_IOTA) {
    if (!dtype) return fm_diag_set(d, FM_ESCHEMA, "%s: %s needs a 'dtype'", path, opname);
    snprintf(p, sizeof p, "%s.dtype", path);
    if ((rc = get_dtype(dtype, p, &op->dtype, d))) return rc;
  } else if (dtype) {
    return fm_diag_set(d, FM_ESCHEMA, "%s.dtype: only cast and iota take a dtype ('%s' infers its result dtype)", path,
                       opname);
  }
  if ((rc = decode_row_attrs(f, path, op, d))) return rc;
  return decode_window_attrs(f, path, op, d);
}

/* An array field of at most max elements. */
static int get_array(const msgpack_object *o, const char *name, uint32_t max, const char *what, fm_diag *d) {
  if (o->type != MSGPACK_OBJECT_ARRAY)
    return fm_diag_set(d, FM_ESCHEMA, "%s: expected an array, got %s", name, kind_of(o));
  if (o->via.array.size > max)
    return fm_diag_set(d, FM_ELIMIT, "%s: %u %s exceed the limit of %u", name, o->via.array.size, what, max);
  return FM_OK;
}

enum { F_VOCAB, F_INPUTS, F_OPS, F_OUTPUTS, F_M_HINT, F__N };
static const char *const fragment_keys[F__N] = {"vocab", "inputs", "ops", "outputs", "m_hint"};
#define F_REQUIRED ((1u << F_VOCAB) | (1u << F_INPUTS) | (1u << F_OPS) | (1u << F_OUTPUTS))

int fm_fragment_decode(const msgpack_object *obj, fm_fragment *out, fm_diag *d) {
  const msgpack_object *f[F__N];
  char p[PATH_MAX_];
  int rc;
  if (!obj || !out) return fm_diag_set(d, FM_EINVAL, "fm_fragment_decode: NULL argument");
  memset(out, 0, sizeof *out);
  if ((rc = fields(obj, "fragment", fragment_keys, F__N, F_REQUIRED, f, d))) return rc;

  /* The vocabulary first: a newer client's fragment fails here, with the reason that
   * matters, rather than at its first new op. */
  uint64_t vocab = 0;
  if ((rc = get_u64(f[F_VOCAB], "vocab", &vocab, d))) return rc;
  if (vocab < FM_VOCAB_MIN || vocab > FM_VOCAB_VERSION)
    return fm_diag_set(d, FM_ESCHEMA, "vocab %" PRIu64 " not supported, this daemon speaks %d to %d", vocab,
                       FM_VOCAB_MIN, FM_VOCAB_VERSION);
  out->vocab = (uint32_t)vocab;
  if (f[F_M_HINT]) {
    uint64_t hint = 0;
    if ((rc = get_u64(f[F_M_HINT], "m_hint", &hint, d))) return rc;
    if (hint < 1 || hint >= (uint64_t)FM_MAX_DIM)
      return fm_diag_set(d, FM_ELIMIT, "m_hint: %" PRIu64 " is outside 1..%" PRId64, hint, FM_MAX_DIM - 1);
    out->m_hint = hint;
  }

  if ((rc = get_array(f[F_INPUTS], "inputs", FM_MAX_INPUTS, "inputs", d))) return rc;
  if ((rc = get_array(f[F_OPS], "ops", FM_MAX_OPS, "ops", d))) return rc;
  if ((rc = get_array(f[F_OUTPUTS], "outputs", FM_MAX_OUTPUTS, "outputs", d))) return rc;

  out->n_inputs = f[F_INPUTS]->via.array.size;
  for (uint32_t i = 0; i < out->n_inputs; i++) {
    snprintf(p, sizeof p, "inputs[%u]", i);
    if ((rc = decode_tensor(&f[F_INPUTS]->via.array.ptr[i], p, &out->inputs[i], d))) return rc;
  }
  out->n_ops = f[F_OPS]->via.array.size;
  for (uint32_t i = 0; i < out->n_ops; i++) {
    snprintf(p, sizeof p, "ops[%u]", i);
    if ((rc = decode_op(&f[F_OPS]->via.array.ptr[i], p, &out->ops[i], d))) return rc;
  }
  out->n_outputs = f[F_OUTPUTS]->via.array.size;
  for (uint32_t i = 0; i < out->n_outputs; i++) {
    snprintf(p, sizeof p, "outputs[%u]", i);
    if ((rc = decode_tensor(&f[F_OUTPUTS]->via.array.ptr[i], p, &out->outputs[i], d))) return rc;
  }
  if ((rc = fm_fragment_expand(out, d))) return rc;
  return fm_fragment_validate(out, d);
}
