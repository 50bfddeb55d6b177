/* fm_ops.c: the dtype and op tables, generated from FM_DTYPE_MAP and FM_OP_MAP. */
#include <string.h>

#include "fm_fragment.h"

static const struct {
  const char *name;
  size_t size;
} dtypes[FM_DT__COUNT] = {
#define FM_DTYPE_ROW_(name, str, size) {str, size},
    FM_DTYPE_MAP(FM_DTYPE_ROW_)
#undef FM_DTYPE_ROW_
};

static const struct {
  const char *name;
  fm_opkind kind;
} ops[FM_OP__COUNT] = {
#define FM_OP_ROW_(name, str, kind) {str, kind},
    FM_OP_MAP(FM_OP_ROW_)
#undef FM_OP_ROW_
};

const char *fm_dtype_name(fm_dtype dt) { return (unsigned)dt < FM_DT__COUNT ? dtypes[dt].name : "?"; }

size_t fm_dtype_size(fm_dtype dt) { return (unsigned)dt < FM_DT__COUNT ? dtypes[dt].size : 0; }

static int name_eq(const char *name, const char *s, size_t len) {
  return strlen(name) == len && memcmp(name, s, len) == 0;
}

int fm_dtype_parse(const char *s, size_t len, fm_dtype *out) {
  for (int i = 0; i < FM_DT__COUNT; i++) {
    if (name_eq(dtypes[i].name, s, len)) {
      *out = (fm_dtype)i;
      return FM_OK;
    }
  }
  return FM_ESCHEMA;
}

const char *fm_op_name(fm_op op) { return (unsigned)op < FM_OP__COUNT ? ops[op].name : "?"; }

fm_opkind fm_op_kind(fm_op op) { return (unsigned)op < FM_OP__COUNT ? ops[op].kind : FM_OPK_RESERVED; }

int fm_op_arity(fm_op op) {
  switch (fm_op_kind(op)) {
    case FM_OPK_CONST:
    case FM_OPK_IOTA:
      return 0;
    case FM_OPK_UNARY:
    case FM_OPK_CAST:
      return 1;
    case FM_OPK_BINARY:
    case FM_OPK_COMPARE:
    case FM_OPK_POW:
      return 2;
    case FM_OPK_WHERE:
      return 3;
    case FM_OPK_REDUCE:
      return 1;
    case FM_OPK_COMPOSITE:
      return op == FM_OP_LAYER_NORM ? 3 : op == FM_OP_RMS_NORM ? 2 : 1;
    case FM_OPK_MATMUL:
      return op == FM_OP_ADDMM ? 3 : 2;
    case FM_OPK_CAT:
      return FM_MAX_ARGS;
    case FM_OPK_WINDOW:
      return op == FM_OP_MAX_POOL2D_BACKWARD ? 2 : 1; /* [gy, argmax] : [x] */
    case FM_OPK_SCATTER:
    case FM_OPK_GATHER:
      return 2; /* [src, index] */
    case FM_OPK_RESERVED:
      return -1;
  }
  return -1;
}

int fm_op_nargs_ok(fm_op op, uint32_t n) {
  if (fm_op_kind(op) == FM_OPK_CAT) return n >= FM_MIN_CAT_ARGS && n <= FM_MAX_ARGS;
  int arity = fm_op_arity(op);
  return arity >= 0 && n == (uint32_t)arity;
}

uint32_t fm_op_data_args(fm_op op, uint32_t nargs) {
  const fm_opkind kind = fm_op_kind(op);
  return (kind == FM_OPK_SCATTER || kind == FM_OPK_GATHER) && nargs > 0 ? nargs - 1 : nargs;
}

uint32_t fm_op_vocab(fm_op op) {
  switch (fm_op_kind(op)) {
    case FM_OPK_RESERVED:
      return 0;
    case FM_OPK_REDUCE:
    case FM_OPK_COMPOSITE:
      return 2;
    case FM_OPK_MATMUL:
      return op == FM_OP_BMM ? 4 : 3;
    case FM_OPK_CAT:
      return FM_VOCAB_CAT;
    case FM_OPK_WINDOW:
      return FM_VOCAB_WINDOW;
    case FM_OPK_SCATTER:
      return FM_VOCAB_SCATTER;
    case FM_OPK_GATHER:
      return FM_VOCAB_GATHER;
    case FM_OPK_IOTA:
      return FM_VOCAB_IOTA;
    default:
      return op == FM_OP_FLOOR_DIV ? FM_VOCAB_INTEGER : 1;
  }
}

int fm_op_parse(const char *s, size_t len, fm_op *out) {
  for (int i = 0; i < FM_OP__COUNT; i++) {
    if (name_eq(ops[i].name, s, len)) {
      *out = (fm_op)i;
      return FM_OK;
    }
  }
  return FM_EUNKNOWN_OP;
}
