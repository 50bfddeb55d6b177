/* fm_fragment_canon.c: the canonical form of a fragment and its packed bytes.
 *
 * Two clients describing the same computation with different value ids, a different order
 * of independent ops, dead ops, or strides on dims that never move must hit the same cache
 * entry, so those differences are erased here; what stays (the input order, dtypes, shapes,
 * strides that matter) changes the kernel. The packed canonical bytes are what the
 * fingerprint hashes and what the store keeps beside each kernel. */
#include <stdlib.h>
#include <string.h>

#include "fm_fragment.h"
#include "fm_msg.h"

/* Clamp: codegen never issues an access wider than 16 bytes, so 32/64/256 mean the same. */
#define CANON_MAX_ALIGN 16u

static int find_op(const fm_fragment *f, uint32_t id) {
  for (uint32_t j = 0; j < f->n_ops; j++)
    if (f->ops[j].out == id) return (int)j;
  return -1;
}

static int find_input(const fm_fragment *f, uint32_t id) {
  for (uint32_t k = 0; k < f->n_inputs; k++)
    if (f->inputs[k].id == id) return (int)k;
  return -1;
}

/* Post-order from each output in turn, args in order, with an explicit stack (a chain of
 * 256 ops is 256 frames deep otherwise). Fills order[] and returns how many ops are live. */
static uint32_t live_order(const fm_fragment *f, uint32_t order[FM_MAX_OPS]) {
  struct frame {
    uint32_t op, next_arg;
  } stack[FM_MAX_OPS];
  uint8_t seen[FM_MAX_OPS] = {0};
  uint32_t n = 0;
  for (uint32_t k = 0; k < f->n_outputs; k++) {
    int root = find_op(f, f->outputs[k].id);
    if (root < 0 || seen[root]) continue;
    uint32_t sp = 0;
    seen[root] = 1;
    stack[sp++] = (struct frame){(uint32_t)root, 0};
    while (sp) {
      struct frame *top = &stack[sp - 1];
      const fm_opnode *op = &f->ops[top->op];
      if (top->next_arg < op->nargs) {
        int j = find_op(f, op->args[top->next_arg++]);
        if (j >= 0 && !seen[j]) { /* ops are SSA and acyclic, so sp stays <= n_ops */
          seen[j] = 1;
          stack[sp++] = (struct frame){(uint32_t)j, 0};
        }
      } else {
        order[n++] = top->op;
        sp--;
      }
    }
  }
  return n;
}

static void canon_tensor(fm_tensor *t) {
  for (uint32_t i = 0; i < t->rank; i++)
    if (t->shape[i] == 1) t->strides[i] = 0;
  for (uint32_t i = t->rank; i < FM_MAX_RANK; i++) t->shape[i] = t->strides[i] = 0;
  if (t->align > CANON_MAX_ALIGN) t->align = CANON_MAX_ALIGN;
}

/* The new id of an old one: inputs keep their position, live ops follow in walk order. */
static int renumber(const fm_fragment *in, const uint32_t newpos[FM_MAX_OPS], uint32_t id, uint32_t *out) {
  int k = find_input(in, id);
  if (k >= 0) {
    *out = (uint32_t)k;
    return FM_OK;
  }
  int j = find_op(in, id);
  if (j < 0 || newpos[j] == UINT32_MAX) return FM_EINVAL;
  *out = in->n_inputs + newpos[j];
  return FM_OK;
}

/* The power of two at or above hint (0 stays 0): the M bucket. */
static uint64_t bucket_of(uint64_t hint) {
  uint64_t b = 1;
  if (!hint) return 0;
  while (b < hint) b <<= 1;
  return b;
}

static int canonicalize(const fm_fragment *in, fm_fragment *out) {
  uint32_t order[FM_MAX_OPS], newpos[FM_MAX_OPS];
  if (in->n_inputs > FM_MAX_INPUTS || in->n_ops > FM_MAX_OPS || in->n_outputs > FM_MAX_OUTPUTS) return FM_EINVAL;
  uint32_t n = live_order(in, order);
  for (uint32_t j = 0; j < FM_MAX_OPS; j++) newpos[j] = UINT32_MAX;
  for (uint32_t p = 0; p < n; p++) newpos[order[p]] = p;

  /* a column fragment's reductions stay live (validation wants an output that needs one) */
  const int cols = fm_fragment_is_cols(in);
  memset(out, 0, sizeof *out);
  /* the lowest vocabulary that covers the live ops: a fragment without reductions keeps the
   * vocab-1 bytes (and key) it had before vocab 2 existed; columns need vocab 5 */
  out->vocab = cols ? FM_VOCAB_COLS : FM_VOCAB_MIN;
  for (uint32_t p = 0; p < n; p++) {
    uint32_t v = fm_op_vocab(in->ops[order[p]].op);
    if (v > out->vocab) out->vocab = v;
  }
  if (fm_fragment_has_integers(in) && out->vocab < FM_VOCAB_INTEGER) out->vocab = FM_VOCAB_INTEGER;
  out->n_inputs = in->n_inputs;
  out->n_ops = n;
  out->m_hint = bucket_of(in->m_hint);
  out->n_outputs = in->n_outputs;
  for (uint32_t k = 0; k < in->n_inputs; k++) {
    out->inputs[k] = in->inputs[k];
    out->inputs[k].id = k;
    canon_tensor(&out->inputs[k]);
  }
  for (uint32_t p = 0; p < n; p++) {
    const fm_opnode *src = &in->ops[order[p]];
    fm_opnode *dst = &out->ops[p];
    dst->op = src->op;
    dst->out = in->n_inputs + p;
    dst->nargs = src->nargs > FM_MAX_ARGS ? FM_MAX_ARGS : src->nargs;
    for (uint32_t a = 0; a < dst->nargs; a++)
      if (renumber(in, newpos, src->args[a], &dst->args[a])) return FM_EINVAL;
    dst->value = fm_op_kind(src->op) == FM_OPK_CONST ? src->value : 0.0;
    dst->dtype = src->dtype;
    /* the last dim, or dim 0 of a column fragment: the only dim ever packed */
    dst->dim = cols && fm_op_kind(src->op) == FM_OPK_REDUCE ? 0 : -1;
    /* a cat's dim, non-negative (validation made it so) */
    if (fm_op_kind(src->op) == FM_OPK_CAT) dst->dim = src->dim < 0 ? src->dim + (int32_t)in->outputs[0].rank : src->dim;
    dst->keepdim = 0; /* the output shapes say it */
    dst->correction = src->op == FM_OP_VAR ? src->correction : 0;
    if (fm_op_kind(src->op) == FM_OPK_WINDOW) { /* zero on every other op (memset above) */
      memcpy(dst->window, src->window, sizeof dst->window);
      dst->ceil_mode = src->ceil_mode ? 1 : 0;
    }
  }
  for (uint32_t k = 0; k < in->n_outputs; k++) {
    out->outputs[k] = in->outputs[k];
    if (renumber(in, newpos, in->outputs[k].id, &out->outputs[k].id)) return FM_EINVAL;
    canon_tensor(&out->outputs[k]);
  }
  /* Cheap next to what follows (codegen, NVRTC), and it re-infers every op's dtype, so a
   * fragment that was never validated cannot produce a canonical form. */
  if (fm_fragment_validate(out, NULL)) return FM_EINVAL;
  /* Only a symbolic GEMM or column fragment is tuned per M bucket (the candidates that win
   * depend on M: tiles, or a column strip's cluster); anywhere else the hint would split
   * keys for nothing. */
  if (!(fm_fragment_is_gemm(out) || fm_fragment_is_cols(out)) || !fm_fragment_is_symbolic(out)) out->m_hint = 0;
  return FM_OK;
}

int fm_fragment_canonicalize(const fm_fragment *in, fm_fragment *out) {
  if (!in || !out) return FM_EINVAL;
  if (in != out) return canonicalize(in, out);
  fm_fragment *copy = malloc(sizeof *copy);
  if (!copy) return FM_ENOMEM;
  memcpy(copy, in, sizeof *copy);
  int rc = canonicalize(copy, out);
  free(copy);
  return rc;
}

static int pack_tensor(const fm_tensor *t, msgpack_packer *pk) {
  int rc = msgpack_pack_map(pk, 5);
  fm_pack_kv_u64(pk, "id", t->id);
  fm_pack_kv_cstr(pk, "dtype", fm_dtype_name(t->dtype));
  fm_pack_cstr(pk, "shape");
  rc |= msgpack_pack_array(pk, t->rank);
  for (uint32_t i = 0; i < t->rank; i++) rc |= msgpack_pack_int64(pk, t->shape[i]);
  fm_pack_cstr(pk, "strides");
  rc |= msgpack_pack_array(pk, t->rank);
  for (uint32_t i = 0; i < t->rank; i++) rc |= msgpack_pack_int64(pk, t->strides[i]);
  fm_pack_kv_u64(pk, "align", t->align);
  return rc;
}

static int pack_op(const fm_opnode *op, msgpack_packer *pk) {
  fm_opkind kind = fm_op_kind(op->op);
  /* dim only on a column reduction (0): row reductions are over the last dim, and packing
     their -1 would change every vocab-2 key */
  int dim0 = kind == FM_OPK_REDUCE && op->dim == 0;
  int cat = kind == FM_OPK_CAT;                                 /* always packs its dim */
  int window = kind == FM_OPK_WINDOW;                           /* always packs window and ceil_mode */
  const int typed = kind == FM_OPK_CAST || kind == FM_OPK_IOTA; /* a dtype of their own */
  size_t n = 3 + (kind == FM_OPK_CONST) + typed + dim0 + cat + (op->op == FM_OP_VAR) + 2 * window;
  int rc = msgpack_pack_map(pk, n);
  fm_pack_kv_cstr(pk, "op", fm_op_name(op->op));
  fm_pack_kv_u64(pk, "out", op->out);
  fm_pack_cstr(pk, "args");
  uint32_t nargs = op->nargs > FM_MAX_ARGS ? FM_MAX_ARGS : op->nargs;
  rc |= msgpack_pack_array(pk, nargs);
  for (uint32_t a = 0; a < nargs; a++) rc |= msgpack_pack_uint32(pk, op->args[a]);
  /* Always float64, so 2 and 2.0 from two clients are the same bytes. */
  if (kind == FM_OPK_CONST) fm_pack_kv_f64(pk, "value", op->value);
  if (typed) fm_pack_kv_cstr(pk, "dtype", fm_dtype_name(op->dtype));
  if (dim0) fm_pack_kv_i64(pk, "dim", 0);
  if (cat) fm_pack_kv_i64(pk, "dim", op->dim);
  if (op->op == FM_OP_VAR) fm_pack_kv_u64(pk, "correction", op->correction);
  if (window) {
    fm_pack_cstr(pk, "window");
    rc |= msgpack_pack_array(pk, FM_WIN__N);
    for (int k = 0; k < FM_WIN__N; k++) rc |= msgpack_pack_int64(pk, op->window[k]);
    fm_pack_kv_bool(pk, "ceil_mode", op->ceil_mode != 0);
  }
  return rc;
}

int fm_fragment_pack(const fm_fragment *f, msgpack_packer *pk) {
  if (!f || !pk || f->n_inputs > FM_MAX_INPUTS || f->n_ops > FM_MAX_OPS || f->n_outputs > FM_MAX_OUTPUTS)
    return FM_EINVAL;
  int rc = msgpack_pack_map(pk, f->m_hint ? 5 : 4);
  fm_pack_kv_u64(pk, "vocab", f->vocab);
  if (f->m_hint) fm_pack_kv_u64(pk, "m_hint", f->m_hint);
  fm_pack_cstr(pk, "inputs");
  rc |= msgpack_pack_array(pk, f->n_inputs);
  for (uint32_t k = 0; k < f->n_inputs; k++) rc |= pack_tensor(&f->inputs[k], pk);
  fm_pack_cstr(pk, "ops");
  rc |= msgpack_pack_array(pk, f->n_ops);
  for (uint32_t j = 0; j < f->n_ops; j++) rc |= pack_op(&f->ops[j], pk);
  fm_pack_cstr(pk, "outputs");
  rc |= msgpack_pack_array(pk, f->n_outputs);
  for (uint32_t k = 0; k < f->n_outputs; k++) rc |= pack_tensor(&f->outputs[k], pk);
  return rc ? FM_ENOMEM : FM_OK;
}

/* An sbuffer that remembers a failed write: the pack helpers return nothing, and a lost
 * piece in the middle of the canonical bytes must not go unnoticed. */
typedef struct sticky_buf {
  msgpack_sbuffer sb;
  int failed;
} sticky_buf;

static int sticky_write(void *data, const char *buf, size_t len) {
  sticky_buf *b = data;
  if (!b->failed && msgpack_sbuffer_write(&b->sb, buf, len)) b->failed = 1;
  return b->failed ? -1 : 0;
}

int fm_fragment_canonical_bytes(const fm_fragment *f, uint8_t **out, size_t *len) {
  if (!f || !out || !len) return FM_EINVAL;
  *out = NULL;
  *len = 0;
  sticky_buf b = {.failed = 0};
  msgpack_packer pk;
  msgpack_sbuffer_init(&b.sb);
  msgpack_packer_init(&pk, &b, sticky_write);
  fm_fragment *canon = malloc(sizeof *canon);
  int rc = canon ? fm_fragment_canonicalize(f, canon) : FM_ENOMEM;
  if (rc) goto done;
  rc = fm_fragment_pack(canon, &pk);
  if (!rc && b.failed) rc = FM_ENOMEM;
  if (rc) goto done;
  *out = (uint8_t *)b.sb.data;
  *len = b.sb.size;
  b.sb.data = NULL; /* handed to the caller */
done:
  msgpack_sbuffer_destroy(&b.sb);
  free(canon);
  return rc;
}

int fm_fragment_is_symbolic(const fm_fragment *f) {
  if (fm_fragment_is_cols(f)) { /* the outputs are [1, N]: M is the inputs' */
    for (uint32_t k = 0; k < f->n_inputs; k++)
      if (f->inputs[k].rank > 0 && f->inputs[k].shape[0] == FM_DIM_SYMBOLIC) return 1;
    return 0;
  }
  return f && f->n_outputs > 0 && f->outputs[0].rank > 0 && f->outputs[0].shape[0] == FM_DIM_SYMBOLIC;
}
