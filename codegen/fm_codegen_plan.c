/* fm_codegen_plan.c: what the pointwise kernel must do, decided before any source is
 * written: which value each operand is, which values are live, how each tensor is
 * addressed (FLAT or STRIDED path), and how wide a vector every tensor allows.
 *
 * The fragment is expected to be canonical and valid, but the generator re-checks every
 * index it uses, so a malformed struct gives FM_EINVAL, never an out-of-bounds read. */
#include <string.h>

#include "fm_codegen_int.h"

#define FM_CG_WIDEST_BYTES  16u /* one uint4: the widest global access */
/* A vector is as wide as 16 bytes of the narrowest tensor; a wider tensor takes up to two
 * 16-byte accesses a vector (an f32 tensor beside bf16 ones: 8 elements, 32 bytes of f32). */
#define FM_CG_WIDEST_VECTOR 32u

/* Position of the value named id among positions [0, limit), latest definition first. */
static int find_value(const uint32_t *ids, uint32_t limit, uint32_t id) {
  for (uint32_t k = limit; k-- > 0;)
    if (ids[k] == id) return (int)k;
  return -1;
}

static int check_tensor(const fm_tensor *t, const fm_tensor *it, int is_output, const char *what, uint32_t k,
                        fm_diag *d) {
  if ((unsigned)t->dtype >= FM_DT__COUNT) return fm_diag_set(d, FM_EINVAL, "%s[%u]: invalid dtype", what, k);
  if (t->align == 0 || (t->align & (t->align - 1)) != 0)
    return fm_diag_set(d, FM_EINVAL, "%s[%u]: align %u is not a power of two", what, k, t->align);
  if (t->rank != it->rank)
    return fm_diag_set(d, FM_EINVAL, "%s[%u]: rank %u differs from the iteration rank %u", what, k, t->rank, it->rank);
  for (uint32_t j = 0; j < t->rank; j++) {
    int64_t n = it->shape[j], m = t->shape[j];
    if (m != n && (is_output || m != 1))
      return fm_diag_set(d, FM_EINVAL, "%s[%u]: dim %u is %lld, iteration dim is %lld", what, k, j, (long long)m,
                         (long long)n);
    if (t->strides[j] < 0 || t->strides[j] > FM_MAX_STRIDE)
      return fm_diag_set(d, FM_EINVAL, "%s[%u]: stride %u out of range", what, k, j);
  }
  return FM_OK;
}

/* Shapes: dim 0 may be symbolic, every other dim static and >= 1. */
static int check_iteration(const fm_tensor *it, fm_diag *d) {
  if (it->rank > FM_MAX_RANK) return fm_diag_set(d, FM_EINVAL, "rank %u exceeds %d", it->rank, FM_MAX_RANK);
  int64_t total = 1;
  for (uint32_t j = 0; j < it->rank; j++) {
    int64_t n = it->shape[j];
    if (n == FM_DIM_SYMBOLIC && j == 0) continue;
    if (n < 1 || n >= FM_MAX_DIM) return fm_diag_set(d, FM_EINVAL, "iteration dim %u is %lld", j, (long long)n);
    if (total > FM_MAX_ELEMENTS / n)
      return fm_diag_set(d, FM_EINVAL, "iteration shape exceeds %lld elements", (long long)FM_MAX_ELEMENTS);
    total *= n;
  }
  return FM_OK;
}

int fm_cg_plan_values(const fm_fragment *f, fm_cg_plan *p, int allow, fm_diag *d) {
  const int reduce = allow & FM_CG_ALLOW_REDUCE, extent = allow & FM_CG_ALLOW_EXTENT;
  uint32_t ids[FM_CG_MAX_VALUES];
  for (uint32_t k = 0; k < p->n_in; k++) {
    ids[k] = f->inputs[k].id;
    p->vdt[k] = f->inputs[k].dtype;
  }
  for (uint32_t i = 0; i < p->n_ops; i++) {
    const fm_opnode *op = &f->ops[i];
    if ((unsigned)op->op >= FM_OP__COUNT) return fm_diag_set(d, FM_EINVAL, "ops[%u]: invalid op", i);
    /* reserved, composites, products; reductions where the template runs none (floor_div:
       elementwise, of vocab 10; iota: the plain pointwise template's, which passes fm_col) */
    const int plain_iota = op->op == FM_OP_IOTA && !allow;
    if (fm_op_vocab(op->op) != 1 && op->op != FM_OP_FLOOR_DIV && !plain_iota &&
        !(reduce && fm_op_kind(op->op) == FM_OPK_REDUCE) &&
        !(extent && (fm_op_kind(op->op) == FM_OPK_CAT || fm_op_kind(op->op) == FM_OPK_WINDOW ||
                     fm_op_kind(op->op) == FM_OPK_GATHER)))
      return fm_diag_set(d, FM_EUNSUPPORTED, "ops[%u]: '%s' is not elementwise; the %s template cannot run it", i,
                         fm_op_name(op->op), reduce ? "cols" : "pointwise");
    int arity = fm_op_arity(op->op);
    if (!fm_op_nargs_ok(op->op, op->nargs))
      return fm_diag_set(d, FM_EINVAL, "ops[%u]: '%s' takes %d args, has %u", i, fm_op_name(op->op), arity, op->nargs);
    if ((unsigned)op->dtype >= FM_DT__COUNT) return fm_diag_set(d, FM_EINVAL, "ops[%u]: invalid result dtype", i);
    for (uint32_t a = 0; a < op->nargs; a++) {
      int pos = find_value(ids, p->n_in + i, op->args[a]);
      if (pos < 0) return fm_diag_set(d, FM_EINVAL, "ops[%u].args[%u]: value not defined before use", i, a);
      p->args[i][a] = (uint16_t)pos;
    }
    ids[p->n_in + i] = op->out;
    p->vdt[p->n_in + i] = op->dtype;
  }
  uint32_t n_values = p->n_in + p->n_ops;
  for (uint32_t k = 0; k < p->n_out; k++) {
    int pos = find_value(ids, n_values, f->outputs[k].id);
    if (pos < 0) return fm_diag_set(d, FM_EINVAL, "outputs[%u]: value is not defined", k);
    p->t[p->n_in + k].value = (uint32_t)pos;
    p->live[pos] = 1;
  }
  /* Backwards over ops: a live op makes its operands live. A pow exponent that is a const
   * is read at generation time (x*x for 2, ...) and needs no variable of its own. */
  for (uint32_t i = p->n_ops; i-- > 0;) {
    if (!p->live[p->n_in + i]) continue;
    const fm_opnode *op = &f->ops[i];
    for (uint32_t a = 0; a < op->nargs; a++) {
      uint32_t pos = p->args[i][a];
      if (op->op == FM_OP_POW && a == 1 && pos >= p->n_in && f->ops[pos - p->n_in].op == FM_OP_CONST) continue;
      p->live[pos] = 1;
    }
  }
  return FM_OK;
}

/* Whether a live value is an iota (vocab 11); liveness from fm_cg_plan_values. */
static int has_live_iota(const fm_fragment *f, const fm_cg_plan *p) {
  for (uint32_t i = 0; i < p->n_ops && i < FM_MAX_OPS; i++)
    if (f->ops[i].op == FM_OP_IOTA && p->live[p->n_in + i]) return 1;
  return 0;
}

/* Stride of tensor t along dim j as the kernel sees it: 0 where t is broadcast. */
static int64_t eff_stride(const fm_tensor *t, const fm_tensor *it, uint32_t j) {
  return (t->shape[j] == 1 && it->shape[j] != 1) ? 0 : t->strides[j];
}

static const fm_tensor *tensor_of(const fm_fragment *f, const fm_cg_plan *p, uint32_t k) {
  return k < p->n_in ? &f->inputs[k] : &f->outputs[k - p->n_in];
}

/* FLAT if every input is dense (contiguous strides of the iteration shape, size-1 dims
 * ignored) or a broadcast scalar and every output is dense. */
static int plan_flat(const fm_fragment *f, fm_cg_plan *p) {
  const fm_tensor *it = &f->outputs[0];
  int64_t cs[FM_MAX_RANK];
  int64_t c = 1;
  for (uint32_t j = it->rank; j-- > 0;) {
    cs[j] = c;
    if (j > 0) c *= it->shape[j];
  }
  uint32_t n_t = p->n_in + p->n_out;
  fm_cg_access acc[FM_CG_MAX_TENSORS];
  for (uint32_t k = 0; k < n_t; k++) {
    const fm_tensor *t = tensor_of(f, p, k);
    int dense = 1, scalar = 1;
    for (uint32_t j = 0; j < it->rank; j++) {
      if (it->shape[j] == 1) continue;
      int64_t es = eff_stride(t, it, j);
      if (es != 0) scalar = 0;
      if (t->shape[j] != it->shape[j] || es != cs[j]) dense = 0;
    }
    int is_out = k >= p->n_in;
    if (!is_out && !p->live[k])
      acc[k] = FM_CG_UNUSED;
    else if (!is_out && scalar)
      acc[k] = FM_CG_SCALAR;
    else if (dense)
      acc[k] = FM_CG_VECTOR;
    else
      return 0;
  }
  for (uint32_t k = 0; k < n_t; k++) p->t[k].access = acc[k];
  p->flat = 1;
  return 1;
}

/* STRIDED: drop size-1 dims, then merge an outer dim into the group inside it whenever
 * every tensor steps over that group contiguously (es[outer] == es[group] * size[group]),
 * so the per-element index arithmetic has as few divisions as possible. */
static void plan_strided(const fm_fragment *f, fm_cg_plan *p) {
  const fm_tensor *it = &f->outputs[0];
  uint32_t n_t = p->n_in + p->n_out;
  int64_t gdim[FM_MAX_RANK], ges[FM_MAX_RANK][FM_CG_MAX_TENSORS];
  uint32_t ng = 0; /* groups, innermost first */
  for (uint32_t j = it->rank; j-- > 0;) {
    int64_t n = it->shape[j];
    if (n == 1) continue;
    int64_t size = n == FM_DIM_SYMBOLIC ? 1 : n;
    int merge = ng > 0;
    for (uint32_t k = 0; merge && k < n_t; k++)
      if (eff_stride(tensor_of(f, p, k), it, j) != ges[ng - 1][k] * gdim[ng - 1]) merge = 0;
    if (merge) {
      gdim[ng - 1] *= size;
      continue;
    }
    gdim[ng] = size;
    for (uint32_t k = 0; k < n_t; k++) ges[ng][k] = eff_stride(tensor_of(f, p, k), it, j);
    ng++;
  }
  p->rank = ng;
  for (uint32_t g = 0; g < ng; g++) {
    p->dims[g] = gdim[ng - 1 - g];
    for (uint32_t k = 0; k < n_t; k++) p->t[k].es[g] = ges[ng - 1 - g][k];
  }
  for (uint32_t k = 0; k < n_t; k++) {
    fm_cg_tensor *t = &p->t[k];
    int all_zero = 1;
    for (uint32_t g = 0; g < ng; g++)
      if (t->es[g]) all_zero = 0;
    if (k >= p->n_in)
      t->access = FM_CG_VECTOR;
    else if (!p->live[k])
      t->access = FM_CG_UNUSED;
    else if (all_zero)
      t->access = FM_CG_SCALAR;
    else if (t->es[ng - 1] == 0)
      t->access = FM_CG_SPLAT;
    else
      t->access = FM_CG_VECTOR;
  }
}

/* Whether a base aligned to `align` bytes takes accesses of `bytes` (at most 16 at a time). */
static int aligned_for(uint32_t align, uint32_t bytes) {
  return align >= (bytes < FM_CG_WIDEST_BYTES ? bytes : FM_CG_WIDEST_BYTES);
}

static int vec_legal(const fm_cg_plan *p, uint32_t w) {
  for (uint32_t k = 0; k < p->n_in + p->n_out; k++) {
    const fm_cg_tensor *t = &p->t[k];
    if (t->access != FM_CG_VECTOR) continue;
    const uint32_t bytes = w * (uint32_t)fm_dtype_size(t->dtype);
    /* each access is at most 16 bytes, at offsets that are multiples of the vector's bytes */
    if (!aligned_for(t->align, bytes)) return 0;
    if (p->flat) continue;
    if (t->es[p->rank - 1] != 1) return 0;
    for (uint32_t g = 0; g + 1 < p->rank; g++)
      if (t->es[g] % w) return 0;
  }
  /* The innermost group must hold whole vectors (rank 1 + symbolic: for any outer). */
  if (!p->flat && p->dims[p->rank - 1] % w) return 0;
  return 1;
}

static uint32_t widest_vec(const fm_cg_plan *p) {
  size_t widest = 1, narrowest = 0;
  for (uint32_t k = 0; k < p->n_in + p->n_out; k++) {
    if (p->t[k].access != FM_CG_VECTOR) continue;
    /* integer tensors (vocab 10) are a batch's labels or token numbers, a few thousand
       elements: moved one at a time, which no template's word access needs to know of */
    if (p->t[k].dtype == FM_DT_I64) return 1;
    const size_t size = fm_dtype_size(p->t[k].dtype);
    if (size > widest) widest = size;
    if (!narrowest || size < narrowest) narrowest = size;
  }
  uint32_t w = FM_CG_WIDEST_BYTES / (uint32_t)(narrowest ? narrowest : 1);
  while (w * widest > FM_CG_WIDEST_VECTOR) w /= 2;
  while (w > 1 && !vec_legal(p, w)) w /= 2;
  return w;
}

/* STRIDED where the innermost group holds no whole vectors (GPT-2's logits gradient: rows of
 * 50 257, read at the padded row stride 50 304 and written contiguous) or some input is not
 * contiguous along it: the outputs may still be row-major over the iteration shape, so that
 * VEC consecutive elements of the iteration are VEC consecutive elements of each output
 * whatever rows they fall in. Such a unit is stored as one vector; each input that is laid
 * out as the outputs are (and aligned for it) is loaded as one too, every other input an
 * element at a time at the element's own coordinates (`gathered`). 16 bytes of the narrowest
 * output, at most 32 of the widest (fm_uint4x2); 1 where an output is not row-major, is
 * 64-bit or is not aligned for it. */
static int row_major(const fm_cg_plan *p, const fm_cg_tensor *t, const int64_t *rm) {
  for (uint32_t g = 0; g < p->rank; g++)
    if (t->es[g] != rm[g]) return 0;
  return 1;
}

static uint32_t widest_unit(fm_cg_plan *p) {
  if (p->flat) return 1;
  int64_t rm[FM_MAX_RANK]; /* row-major strides of the coalesced dims */
  int64_t c = 1;
  for (uint32_t g = p->rank; g-- > 0;) {
    rm[g] = c;
    c *= p->dims[g];
  }
  size_t widest = 1, narrowest = 16;
  for (uint32_t k = p->n_in; k < p->n_in + p->n_out; k++) {
    const fm_cg_tensor *t = &p->t[k];
    if (t->dtype == FM_DT_I64 || !row_major(p, t, rm)) return 1;
    const size_t size = fm_dtype_size(t->dtype);
    if (size > widest) widest = size;
    if (size < narrowest) narrowest = size;
  }
  uint32_t w = FM_CG_WIDEST_BYTES / (uint32_t)narrowest;
  while (w * widest > FM_CG_WIDEST_VECTOR) w /= 2;
  for (uint32_t k = p->n_in; k < p->n_in + p->n_out; k++)
    while (w > 1 && !aligned_for(p->t[k].align, w * (uint32_t)fm_dtype_size(p->t[k].dtype))) w /= 2;
  if (w <= p->max_vec) return 1;
  for (uint32_t k = 0; k < p->n_in; k++) {
    fm_cg_tensor *t = &p->t[k];
    if (t->access != FM_CG_VECTOR && t->access != FM_CG_SPLAT) continue;
    const uint32_t bytes = w * (uint32_t)fm_dtype_size(t->dtype);
    const int linear = t->access == FM_CG_VECTOR && t->dtype != FM_DT_I64 && bytes <= FM_CG_WIDEST_VECTOR &&
                       aligned_for(t->align, bytes) && row_major(p, t, rm);
    t->gathered = (uint8_t)!linear;
  }
  return w;
}

uint32_t fm_cg_plan_vec(const fm_cg_plan *p, uint32_t want) {
  /* by default units only where the rows take no vectors at all (odd rows): a unit's inputs
     loaded element by element may lose to narrower vectors along the rows (the tuner times
     the other form too) */
  uint32_t w = p->unit_vec > p->max_vec && (want || p->max_vec == 1) ? p->unit_vec : p->max_vec;
  if (want) {
    while (w > want) w /= 2;
  }
  return w;
}

int fm_cg_plan_build(const fm_fragment *f, fm_cg_plan *p, fm_diag *d) {
  memset(p, 0, sizeof *p);
  if (f->n_inputs > FM_MAX_INPUTS || f->n_ops > FM_MAX_OPS || f->n_outputs > FM_MAX_OUTPUTS)
    return fm_diag_set(d, FM_EINVAL, "fragment exceeds the limits");
  if (f->n_outputs == 0) return fm_diag_set(d, FM_EINVAL, "fragment has no outputs");
  if (fm_fragment_is_gemm(f)) /* its operands are not pointwise over the output shape */
    return fm_diag_set(d, FM_EUNSUPPORTED, "a GEMM fragment is served by the gemm template");
  p->n_in = f->n_inputs;
  p->n_out = f->n_outputs;
  p->n_ops = f->n_ops;
  const fm_tensor *it = &f->outputs[0];
  int rc = check_iteration(it, d);
  if (rc) return rc;
  for (uint32_t k = 0; k < p->n_in; k++)
    if ((rc = check_tensor(&f->inputs[k], it, 0, "inputs", k, d))) return rc;
  for (uint32_t k = 0; k < p->n_out; k++)
    if ((rc = check_tensor(&f->outputs[k], it, 1, "outputs", k, d))) return rc;
  if ((rc = fm_cg_plan_values(f, p, 0, d))) return rc;
  for (uint32_t k = 0; k < p->n_in + p->n_out; k++) {
    const fm_tensor *t = tensor_of(f, p, k);
    p->t[k].dtype = t->dtype;
    p->t[k].align = t->align;
    if (k < p->n_in) p->t[k].value = k;
  }
  if (has_live_iota(f, p)) p->iota_cols = it->rank > 1 ? it->shape[it->rank - 1] : -1;
  p->symbolic = it->rank > 0 && it->shape[0] == FM_DIM_SYMBOLIC;
  p->inner = 1;
  for (uint32_t j = 1; j < it->rank; j++) p->inner *= it->shape[j];
  p->outer = it->rank == 0 ? 1 : it->shape[0];
  if (!plan_flat(f, p)) plan_strided(f, p);
  p->max_vec = widest_vec(p);
  p->unit_vec = widest_unit(p);
  return FM_OK;
}
