/* fm_reference.c: the CPU reference evaluator (semantics in fm_reference.h).
 *
 * Written independently of the generator (no shared plan or op table), so that a planning
 * or table bug in codegen shows up as a mismatch instead of being reproduced here. */
#include "fm_reference.h"
#include "fm_reference_int.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

float fm_reference_bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

uint16_t fm_reference_f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

float fm_reference_f16_to_f32(uint16_t h) {
  int exp = (h >> 10) & 0x1f;
  int mant = h & 0x3ff;
  double v;
  if (exp == 0)
    v = ldexp((double)mant, -24);
  else if (exp == 31)
    v = mant ? NAN : INFINITY;
  else
    v = ldexp((double)(mant | 0x400), exp - 25);
  return (float)((h & 0x8000) ? -v : v);
}

uint16_t fm_reference_f32_to_f16(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu)); /* NaN */
  if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);                       /* >= 65520 rounds to inf */
  if (a >= 0x38800000u) {                                                        /* normal: >= 2^-14 */
    uint32_t h = (((a >> 23) - 112u) << 10) | ((a & 0x7fffffu) >> 13);
    uint32_t rem = a & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++; /* a carry bumps the exponent */
    return (uint16_t)(sign | h);
  }
  uint32_t e = a >> 23;      /* subnormal or zero */
  uint32_t shift = 126u - e; /* to units of 2^-24 */
  if (e == 0 || shift >= 25) return sign;
  uint32_t m = (a & 0x7fffffu) | 0x800000u;
  uint32_t h = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1);
  if (rem > half || (rem == half && (h & 1u))) h++;
  return (uint16_t)(sign | h);
}

float fm_reference_f64_to_f32(double x) {
  if (isnan(x)) return NAN;
  double mag = fabs(x);
  if (mag > (double)FLT_MAX) {
    /* beyond FLT_MAX + half an ulp rounds to inf; below it, to FLT_MAX */
    float r = mag >= (double)FLT_MAX + ldexp(1.0, FLT_MAX_EXP - FLT_MANT_DIG - 1) ? INFINITY : FLT_MAX;
    return x < 0 ? -r : r;
  }
  return (float)x;
}

static double round_to(fm_dtype dt, double x) {
  switch (dt) {
    case FM_DT_BOOL:
      return x != 0 ? 1.0 : 0.0;
    case FM_DT_F16:
      return fm_reference_f16_to_f32(fm_reference_f32_to_f16(fm_reference_f64_to_f32(x)));
    case FM_DT_BF16:
      return fm_reference_bf16_to_f32(fm_reference_f32_to_bf16(fm_reference_f64_to_f32(x)));
    case FM_DT_F32:
      return fm_reference_f64_to_f32(x);
    case FM_DT_I64: /* a cast of a bool or an i64 (vocab 10): already an integer */
    case FM_DT__COUNT:
      break;
  }
  return x;
}

double fm_ref_load(fm_dtype dt, const void *base, int64_t off) {
  switch (dt) {
    case FM_DT_BOOL:
      return ((const uint8_t *)base)[off] ? 1.0 : 0.0;
    case FM_DT_F16:
      return fm_reference_f16_to_f32(((const uint16_t *)base)[off]);
    case FM_DT_BF16:
      return fm_reference_bf16_to_f32(((const uint16_t *)base)[off]);
    case FM_DT_F32:
      return ((const float *)base)[off];
    case FM_DT_I64: /* exact below 2^53, and an index beyond R is refused before use */
      return (double)((const int64_t *)base)[off];
    case FM_DT__COUNT:
      break;
  }
  return 0;
}

void fm_ref_store(fm_dtype dt, void *base, int64_t off, double x) {
  switch (dt) {
    case FM_DT_BOOL:
      ((uint8_t *)base)[off] = x != 0 ? 1 : 0;
      return;
    case FM_DT_F16:
      ((uint16_t *)base)[off] = fm_reference_f32_to_f16(fm_reference_f64_to_f32(x));
      return;
    case FM_DT_BF16:
      ((uint16_t *)base)[off] = fm_reference_f32_to_bf16(fm_reference_f64_to_f32(x));
      return;
    case FM_DT_F32:
      ((float *)base)[off] = fm_reference_f64_to_f32(x);
      return;
    case FM_DT_I64:
      ((int64_t *)base)[off] = (int64_t)x;
      return;
    case FM_DT__COUNT:
      return;
  }
}

static double ref_pow(double x, double c) {
  if (c == 2.0) return x * x;
  if (c == 3.0) return x * x * x;
  if (c == 1.0) return x;
  if (c == 0.5) return sqrt(x);
  if (c == -0.5) return 1.0 / sqrt(x);
  if (c == -1.0) return 1.0 / x;
  if (c == -2.0) return 1.0 / (x * x);
  return pow(x, c);
}

double fm_ref_nan_max(double a, double b) {
  if (isnan(a)) return a;
  if (isnan(b)) return b;
  return a > b ? a : b;
}

static double nan_min(double a, double b) {
  if (isnan(a)) return a;
  if (isnan(b)) return b;
  return a < b ? a : b;
}

/* One op on fp64 operands a, b, c (bools as 0/1). */
double fm_ref_op(const fm_opnode *op, double a, double b, double c) {
  switch (op->op) {
    case FM_OP_CONST:
      return op->dtype == FM_DT_BOOL ? (op->value != 0) : (double)fm_reference_f64_to_f32(op->value);
    case FM_OP_ADD:
      return a + b;
    case FM_OP_SUB:
      return a - b;
    case FM_OP_MUL:
      return a * b;
    case FM_OP_DIV:
      return a / b;
    case FM_OP_MAXIMUM:
      return fm_ref_nan_max(a, b);
    case FM_OP_MINIMUM:
      return nan_min(a, b);
    case FM_OP_POW:
      return ref_pow(a, b); /* b: the const exponent, fp32-rounded */
    case FM_OP_NEG:
      return -a;
    case FM_OP_ABS:
      return fabs(a);
    case FM_OP_RELU:
      return isnan(a) ? a : (a > 0 ? a : 0.0);
    case FM_OP_GELU:
      return 0.5 * a * (1.0 + erf(a * M_SQRT1_2));
    case FM_OP_GELU_TANH: {
      double k = sqrt(2.0 / M_PI);
      return 0.5 * a * (1.0 + tanh(k * (a + 0.044715 * a * a * a)));
    }
    case FM_OP_SILU:
      return a / (1.0 + exp(-a));
    case FM_OP_SIGMOID:
      return 1.0 / (1.0 + exp(-a));
    case FM_OP_TANH:
      return tanh(a);
    case FM_OP_EXP:
      return exp(a);
    case FM_OP_LOG:
      return log(a);
    case FM_OP_SQRT:
      return sqrt(a);
    case FM_OP_RSQRT:
      return 1.0 / sqrt(a);
    case FM_OP_ERF:
      return erf(a);
    case FM_OP_COS:
      return cos(a);
    case FM_OP_SIN:
      return sin(a);
    case FM_OP_GT:
      return a > b;
    case FM_OP_GE:
      return a >= b;
    case FM_OP_LT:
      return a < b;
    case FM_OP_LE:
      return a <= b;
    case FM_OP_EQ:
      return a == b;
    case FM_OP_NE:
      return a != b;
    case FM_OP_WHERE:
      return a != 0 ? b : c;
    case FM_OP_CAST:
      return round_to(op->dtype, a);
    case FM_OP_FLOOR_DIV: /* of integers (vocab 10): exact in fp64 below 2^53 */
      return floor(a / b);
    default:
      return NAN; /* reserved ops are refused before evaluation */
  }
}

static int find_id(const fm_fragment *f, uint32_t limit, uint32_t id) {
  for (uint32_t k = limit; k-- > 0;) {
    uint32_t have = k < f->n_inputs ? f->inputs[k].id : f->ops[k - f->n_inputs].out;
    if (have == id) return (int)k;
  }
  return -1;
}

int fm_ref_compile(const fm_fragment *f, ref_prog *pr, fm_diag *d) {
  pr->n_in = f->n_inputs;
  pr->n_ops = f->n_ops;
  pr->n_out = f->n_outputs;
  for (uint32_t i = 0; i < f->n_ops; i++) {
    const fm_opnode *op = &f->ops[i];
    if ((unsigned)op->op >= FM_OP__COUNT || !fm_op_nargs_ok(op->op, op->nargs) ||
        fm_op_kind(op->op) == FM_OPK_COMPOSITE)
      return fm_diag_set(d, FM_EINVAL, "reference: ops[%u] is not a primitive op", i);
    for (uint32_t a = 0; a < op->nargs; a++) {
      int pos = find_id(f, f->n_inputs + i, op->args[a]);
      if (pos < 0) return fm_diag_set(d, FM_EINVAL, "reference: ops[%u].args[%u] undefined", i, a);
      pr->args[i][a] = (uint16_t)pos;
    }
  }
  for (uint32_t k = 0; k < f->n_outputs; k++) {
    int pos = find_id(f, f->n_inputs + f->n_ops, f->outputs[k].id);
    if (pos < 0) return fm_diag_set(d, FM_EINVAL, "reference: outputs[%u] undefined", k);
    pr->out_value[k] = (uint16_t)pos;
  }
  return FM_OK;
}

/* One reduction over a whole row x[0..n): fp64, two-pass var, NaN-propagating amax. */
static double reduce_row(const fm_opnode *op, const double *x, int64_t n) {
  double acc = op->op == FM_OP_AMAX ? -INFINITY : 0.0;
  for (int64_t j = 0; j < n; j++) acc = op->op == FM_OP_AMAX ? fm_ref_nan_max(acc, x[j]) : acc + x[j];
  if (op->op == FM_OP_SUM || op->op == FM_OP_AMAX) return acc;
  double mean = acc / (double)n;
  if (op->op == FM_OP_MEAN) return mean;
  double q = 0.0;
  for (int64_t j = 0; j < n; j++) q += (x[j] - mean) * (x[j] - mean);
  return q / (double)(n - op->correction); /* n == correction: 0/0 = NaN, as torch */
}

/* Row fragments (fm_fragment.h): the row shape is outputs[0]'s with the last dim replaced by
 * N, the longest last dim; each value is a whole row (N numbers) or one per row. */
static int eval_rows(const fm_fragment *f, const ref_prog *pr, int64_t outer, const void *const *inputs,
                     void *const *outputs, fm_diag *d) {
  const fm_tensor *it = &f->outputs[0];
  uint32_t r = it->rank, last = r - 1, n_val = f->n_inputs + f->n_ops;
  if (r < 1) return fm_diag_set(d, FM_EINVAL, "reference: a row fragment has rank >= 1");
  int64_t n = 1, lead[FM_MAX_RANK], rows = 1;
  int64_t es[FM_MAX_INPUTS + FM_MAX_OUTPUTS][FM_MAX_RANK];
  uint8_t is_row[REF_MAX_VALUES];
  for (uint32_t k = 0; k < f->n_inputs + f->n_outputs; k++) {
    const fm_tensor *t = k < f->n_inputs ? &f->inputs[k] : &f->outputs[k - f->n_inputs];
    if (t->rank != r || (unsigned)t->dtype >= FM_DT__COUNT)
      return fm_diag_set(d, FM_EINVAL, "reference: tensor %u does not match the row rank", k);
    if (t->shape[last] > n) n = t->shape[last];
    for (uint32_t j = 0; j < r; j++) es[k][j] = t->shape[j] == 1 ? 0 : t->strides[j];
  }
  if (n > FM_MAX_ROW) return fm_diag_set(d, FM_EINVAL, "reference: rows of %lld", (long long)n);
  for (uint32_t j = 0; j < last; j++) {
    lead[j] = (j == 0 && it->shape[0] == FM_DIM_SYMBOLIC) ? outer : it->shape[j];
    if (lead[j] < 0) return fm_diag_set(d, FM_EINVAL, "reference: outer %lld < 0", (long long)outer);
    rows *= lead[j];
  }
  for (uint32_t k = 0; k < f->n_inputs; k++) is_row[k] = f->inputs[k].shape[last] == n;
  for (uint32_t o = 0; o < f->n_ops; o++) {
    uint32_t pos = f->n_inputs + o;
    is_row[pos] = f->ops[o].op == FM_OP_IOTA; /* the column: one per element of the row */
    for (uint32_t a = 0; a < f->ops[o].nargs; a++) is_row[pos] |= is_row[pr->args[o][a]];
    if (fm_op_kind(f->ops[o].op) == FM_OPK_REDUCE) {
      if (!is_row[pos]) return fm_diag_set(d, FM_EINVAL, "reference: ops[%u] reduces a per-row value", o);
      is_row[pos] = 0;
    }
  }
  /* one row of every value in fp64: 288 values of a 2^20-element row would be 2.4 GB, so
     streamed rows are bounded by bytes too (1 GiB: GPT-2's log_softmax needs 4 MB) */
  if ((uint64_t)n_val * (uint64_t)n * sizeof(double) > ((uint64_t)1 << 30))
    return fm_diag_set(d, FM_ELIMIT, "reference: %u values of rows of %lld exceed 1 GiB", n_val, (long long)n);
  double *v = malloc((size_t)n_val * (size_t)n * sizeof *v);
  if (!v) return fm_diag_set(d, FM_ENOMEM, "reference: out of memory");
  int64_t idx[FM_MAX_RANK] = {0};
  for (int64_t row = 0; row < rows; row++) {
    int64_t base[FM_MAX_INPUTS + FM_MAX_OUTPUTS];
    for (uint32_t k = 0; k < f->n_inputs + f->n_outputs; k++) {
      base[k] = 0;
      for (uint32_t j = 0; j < last; j++) base[k] += idx[j] * es[k][j];
    }
    for (uint32_t k = 0; k < f->n_inputs; k++) {
      double *x = v + (size_t)k * (size_t)n;
      for (int64_t j = 0; j < (is_row[k] ? n : 1); j++)
        x[j] = inputs[k] ? fm_ref_load(f->inputs[k].dtype, inputs[k], base[k] + j * es[k][last]) : NAN;
    }
    for (uint32_t o = 0; o < f->n_ops; o++) {
      const fm_opnode *op = &f->ops[o];
      const uint16_t *a = pr->args[o];
      double *x = v + (size_t)(f->n_inputs + o) * (size_t)n;
      if (fm_op_kind(op->op) == FM_OPK_REDUCE) {
        x[0] = reduce_row(op, v + (size_t)a[0] * (size_t)n, n);
        continue;
      }
      for (int64_t j = 0; j < (is_row[f->n_inputs + o] ? n : 1); j++) {
        if (op->op == FM_OP_IOTA) {
          x[j] = (double)j;
          continue;
        }
        double arg[3] = {0, 0, 0};
        for (uint32_t q = 0; q < op->nargs; q++) arg[q] = v[(size_t)a[q] * (size_t)n + (size_t)(is_row[a[q]] ? j : 0)];
        x[j] = fm_ref_op(op, arg[0], arg[1], arg[2]);
      }
    }
    for (uint32_t k = 0; k < f->n_outputs; k++) {
      uint32_t pos = pr->out_value[k], t = f->n_inputs + k;
      for (int64_t j = 0; j < (is_row[pos] ? n : 1); j++)
        fm_ref_store(f->outputs[k].dtype, outputs[k], base[t] + j * es[t][last],
                     v[(size_t)pos * (size_t)n + (size_t)j]);
    }
    for (uint32_t j = last; j-- > 0;) { /* odometer over the leading dims */
      if (++idx[j] < lead[j]) break;
      idx[j] = 0;
    }
  }
  free(v);
  return FM_OK;
}

/* One element of a GEMM's product: fp64 sum over k of A[m, k] * B[k, n]; for bmm (rank-3
 * operands) those of product z: A[z, m, k] * B[z, k, n]. */
static double gemm_dot(const fm_fragment *f, uint32_t ia, uint32_t ib, const void *a, const void *b, int64_t z,
                       int64_t m, int64_t n) {
  const fm_tensor *ta = &f->inputs[ia], *tb = &f->inputs[ib];
  const uint32_t r = ta->rank, md = r - 2, nd = r - 1; /* the matrix dims: the last two */
  int64_t K = tb->shape[md];
  int64_t sa0 = ta->shape[md] == 1 ? 0 : ta->strides[md], sa1 = ta->strides[nd];
  int64_t sb0 = tb->strides[md], sb1 = tb->shape[nd] == 1 ? 0 : tb->strides[nd];
  int64_t za = r == 3 && ta->shape[0] != 1 ? z * ta->strides[0] : 0;
  int64_t zb = r == 3 && tb->shape[0] != 1 ? z * tb->strides[0] : 0;
  double acc = 0.0;
  for (int64_t k = 0; k < K; k++)
    acc += fm_ref_load(ta->dtype, a, za + m * sa0 + k * sa1) * fm_ref_load(tb->dtype, b, zb + k * sb0 + n * sb1);
  return acc;
}

double fm_ref_load_mn(const fm_fragment *f, const void *const *inputs, uint32_t k, int64_t m, int64_t n) {
  const fm_tensor *t = &f->inputs[k];
  if (!inputs[k]) return NAN; /* promised unused: poison, so a wrong promise shows */
  int64_t off = (t->shape[0] == 1 ? 0 : m * t->strides[0]) + (t->shape[1] == 1 ? 0 : n * t->strides[1]);
  return fm_ref_load(t->dtype, inputs[k], off);
}

/* A chain (fm_fragment.h): per row m, stage 1 over the N1 columns gives the second product's
 * A row, rounded to its dtype; stage 2 over the N2 columns multiplies it by B2 and runs the
 * rest. Ops of neither stage are evaluated wherever they are needed. */
static int eval_chain(const fm_fragment *f, const ref_prog *pr, int64_t outer, const void *const *inputs,
                      void *const *outputs, fm_diag *d) {
  const int64_t M = f->outputs[0].shape[0] == FM_DIM_SYMBOLIC ? outer : f->outputs[0].shape[0];
  if (M < 0 || f->outputs[0].rank != 2)
    return fm_diag_set(d, FM_EINVAL, "reference: a chain of %lld rows", (long long)M);
  fm_chain_info ci;
  int rc = fm_fragment_chain_info(f, &ci, d);
  if (rc) return rc;
  const fm_opnode *m1 = &f->ops[ci.op1], *m2 = &f->ops[ci.op2];
  uint32_t ia = pr->args[ci.op1][m1->nargs - 2], ib = pr->args[ci.op1][m1->nargs - 1];
  uint32_t ib2 = pr->args[ci.op2][m2->nargs - 1];
  if (ia >= f->n_inputs || ib >= f->n_inputs || ib2 >= f->n_inputs || !inputs[ia] || !inputs[ib] || !inputs[ib2] ||
      f->inputs[ib].rank != 2 || f->inputs[ib2].rank != 2)
    return fm_diag_set(d, FM_EINVAL, "reference: malformed chain");
  const fm_tensor *tb2 = &f->inputs[ib2];
  const int64_t N1 = f->inputs[ib].shape[1], N2 = tb2->shape[1];
  const fm_dtype adt = f->ops[ci.a2 - f->n_inputs].dtype;
  double *h = malloc((size_t)N1 * sizeof *h);
  if (!h) return fm_diag_set(d, FM_ENOMEM, "reference: out of memory");
  double v[REF_MAX_VALUES];
  for (int64_t m = 0; m < M; m++) {
    for (int s = 1; s <= 2; s++) {
      const int64_t cols = s == 1 ? N1 : N2;
      const uint8_t bit = (uint8_t)(1u << (s - 1));
      for (int64_t n = 0; n < cols; n++) {
        for (uint32_t k = 0; k < f->n_inputs; k++)
          v[k] = ci.in_need[k] & bit ? fm_ref_load_mn(f, inputs, k, m, n) : NAN;
        for (uint32_t o = 0; o < pr->n_ops; o++) {
          const uint16_t *a = pr->args[o];
          uint32_t na = f->ops[o].nargs;
          double *out = &v[f->n_inputs + o];
          if (!(ci.need[o] & bit) || (ci.stage[o] && ci.stage[o] != s)) {
            *out = NAN;
          } else if ((int)o == ci.op1) {
            *out = gemm_dot(f, ia, ib, inputs[ia], inputs[ib], 0, m, n) + (na == 3 ? v[a[0]] : 0.0);
          } else if ((int)o == ci.op2) {
            const int64_t s0 = tb2->strides[0], s1 = tb2->shape[1] == 1 ? 0 : tb2->strides[1];
            double acc = 0.0;
            for (int64_t k = 0; k < N1; k++) acc += h[k] * fm_ref_load(tb2->dtype, inputs[ib2], k * s0 + n * s1);
            *out = acc + (na == 3 ? v[a[0]] : 0.0);
          } else {
            *out = fm_ref_op(&f->ops[o], na > 0 ? v[a[0]] : 0, na > 1 ? v[a[1]] : 0, na > 2 ? v[a[2]] : 0);
          }
        }
        if (s == 1) {
          h[n] = round_to(adt, v[ci.a2]);
          continue;
        }
        for (uint32_t k = 0; k < f->n_outputs; k++) {
          const fm_tensor *t = &f->outputs[k];
          fm_ref_store(t->dtype, outputs[k], m * t->strides[0] + n * t->strides[1], v[pr->out_value[k]]);
        }
      }
    }
  }
  free(h);
  return FM_OK;
}

int fm_reference_eval(const fm_fragment *f, int64_t outer, const void *const *inputs, void *const *outputs,
                      fm_diag *d) {
  ref_prog *pr = NULL;
  int rc = FM_OK;
  if (!f || !outputs || (f->n_inputs && !inputs)) return fm_diag_set(d, FM_EINVAL, "reference: NULL argument");
  if (f->n_outputs < 1 || f->n_outputs > FM_MAX_OUTPUTS || f->n_inputs > FM_MAX_INPUTS || f->n_ops > FM_MAX_OPS ||
      f->outputs[0].rank > FM_MAX_RANK)
    return fm_diag_set(d, FM_EINVAL, "reference: fragment exceeds the limits");
  for (uint32_t k = 0; k < f->n_outputs; k++)
    if (!outputs[k]) return fm_diag_set(d, FM_EINVAL, "reference: outputs[%u] is NULL", k);
  if (fm_fragment_is_scatter(f)) return fm_ref_eval_scatter(f, inputs, outputs, d);
  int rows = fm_fragment_is_rows(f), cols = !rows && fm_fragment_is_cols(f);
  int chain = !rows && !cols && fm_fragment_is_chain(f);
  int cat = !rows && !cols && !chain && fm_fragment_is_extent(f);
  if (rows || cols || chain || cat) { /* they walk rows (columns, branches) themselves */
    pr = malloc(sizeof *pr);
    if (!pr) return fm_diag_set(d, FM_ENOMEM, "reference: out of memory");
    rc = fm_ref_compile(f, pr, d);
    if (!rc)
      rc = (rows    ? eval_rows
            : cols  ? fm_ref_eval_cols
            : chain ? eval_chain
                    : fm_ref_eval_cat)(f, pr, outer, inputs, outputs, d);
    free(pr);
    return rc;
  }
  const fm_tensor *it = &f->outputs[0];
  uint32_t rank = it->rank;
  int64_t shape[FM_MAX_RANK];
  int64_t n = 1;
  for (uint32_t j = 0; j < rank; j++) {
    shape[j] = it->shape[j];
    if (j == 0 && shape[0] == FM_DIM_SYMBOLIC) {
      if (outer < 0) return fm_diag_set(d, FM_EINVAL, "reference: outer %lld < 0", (long long)outer);
      shape[0] = outer;
    } else if (shape[j] < 1) {
      return fm_diag_set(d, FM_EINVAL, "reference: dim %u is %lld", j, (long long)shape[j]);
    }
    n *= shape[j];
  }
  for (uint32_t k = 0; k < f->n_inputs + f->n_outputs; k++) {
    const fm_tensor *t = k < f->n_inputs ? &f->inputs[k] : &f->outputs[k - f->n_inputs];
    if (t->rank != rank || (unsigned)t->dtype >= FM_DT__COUNT)
      return fm_diag_set(d, FM_EINVAL, "reference: tensor %u does not match the iteration shape", k);
    if (k >= f->n_inputs && !outputs[k - f->n_inputs])
      return fm_diag_set(d, FM_EINVAL, "reference: outputs[%u] is NULL", k - f->n_inputs);
  }
  pr = malloc(sizeof *pr);
  if (!pr) return fm_diag_set(d, FM_ENOMEM, "reference: out of memory");
  if ((rc = fm_ref_compile(f, pr, d))) goto out;

  /* Effective strides: a broadcast dim (size 1 in the tensor) contributes nothing. */
  int64_t es[FM_MAX_INPUTS + FM_MAX_OUTPUTS][FM_MAX_RANK];
  for (uint32_t k = 0; k < f->n_inputs + f->n_outputs; k++) {
    const fm_tensor *t = k < f->n_inputs ? &f->inputs[k] : &f->outputs[k - f->n_inputs];
    for (uint32_t j = 0; j < rank; j++) es[k][j] = t->shape[j] == 1 ? 0 : t->strides[j];
  }
  /* GEMM fragments: the matrix operands are not indexed by the [(Bt,) M, N] iteration; the
   * product reads them over k instead. */
  int g = fm_fragment_gemm_op(f), g2 = fm_fragment_gemm_op2(f);
  uint32_t ia = UINT32_MAX, ib = UINT32_MAX, ib2 = UINT32_MAX;
  if (g >= 0) {
    ia = pr->args[g][f->ops[g].nargs - 2];
    ib = pr->args[g][f->ops[g].nargs - 1];
    if (rank != (f->ops[g].op == FM_OP_BMM ? 3u : 2u) || ia >= f->n_inputs || ib >= f->n_inputs || !inputs[ia] ||
        !inputs[ib]) {
      rc = fm_diag_set(d, FM_EINVAL, "reference: malformed GEMM fragment");
      goto out;
    }
  }
  if (g2 >= 0) { /* siblings: the same A by a second B */
    ib2 = pr->args[g2][f->ops[g2].nargs - 1];
    if (pr->args[g2][f->ops[g2].nargs - 2] != ia || ib2 >= f->n_inputs || !inputs[ib2]) {
      rc = fm_diag_set(d, FM_EINVAL, "reference: malformed sibling GEMM");
      goto out;
    }
  }
  int64_t idx[FM_MAX_RANK] = {0};
  double v[REF_MAX_VALUES];
  for (int64_t i = 0; i < n; i++) {
    for (uint32_t k = 0; k < f->n_inputs; k++) {
      if (k == ia || k == ib || k == ib2) {
        v[k] = NAN;
        continue;
      }
      if (!inputs[k]) {
        v[k] = NAN; /* promised unused: poison, so a wrong promise shows */
        continue;
      }
      int64_t off = 0;
      for (uint32_t j = 0; j < rank; j++) off += idx[j] * es[k][j];
      v[k] = fm_ref_load(f->inputs[k].dtype, inputs[k], off);
    }
    for (uint32_t o = 0; o < pr->n_ops; o++) {
      const uint16_t *a = pr->args[o];
      uint32_t na = f->ops[o].nargs;
      if ((int)o == g || (int)o == g2) {
        const uint32_t b = (int)o == g ? ib : ib2;
        v[f->n_inputs + o] = (rank == 3 ? gemm_dot(f, ia, b, inputs[ia], inputs[b], idx[0], idx[1], idx[2])
                                        : gemm_dot(f, ia, b, inputs[ia], inputs[b], 0, idx[0], idx[1])) +
                             (na == 3 ? v[a[0]] : 0.0);
        continue;
      }
      if (f->ops[o].op == FM_OP_IOTA) { /* the element's index along the last dim */
        v[f->n_inputs + o] = rank ? (double)idx[rank - 1] : 0.0;
        continue;
      }
      v[f->n_inputs + o] = fm_ref_op(&f->ops[o], na > 0 ? v[a[0]] : 0, na > 1 ? v[a[1]] : 0, na > 2 ? v[a[2]] : 0);
    }
    for (uint32_t k = 0; k < f->n_outputs; k++) {
      int64_t off = 0;
      for (uint32_t j = 0; j < rank; j++) off += idx[j] * es[f->n_inputs + k][j];
      fm_ref_store(f->outputs[k].dtype, outputs[k], off, v[pr->out_value[k]]);
    }
    for (uint32_t j = rank; j-- > 0;) { /* odometer: next multi-index, last dim fastest */
      if (++idx[j] < shape[j]) break;
      idx[j] = 0;
    }
  }
out:
  free(pr);
  return rc;
}
