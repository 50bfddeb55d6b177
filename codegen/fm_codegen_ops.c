/* fm_codegen_ops.c: the per-op CUDA code, from ONE table (after tinygrad's code_for_op),
 * the fixed prelude the table's helpers live in, and fm_compute(): the op chain for one
 * element, from raw input elements to raw output elements.
 *
 * All math is fp32 (bool values are C++ bool); 16-bit floats live in memory as unsigned
 * short and are converted by our own prelude functions, because the source must be one
 * self-contained translation unit (NVRTC runs with no include path). Rounding happens
 * only when an output is stored or at an explicit cast, as the fragment IR specifies. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "fm_codegen_int.h"

/* How operands are presented to an op's format. */
typedef enum {
  ARGS_FLOAT,   /* every operand as float (bool -> 0/1) */
  ARGS_COMPARE, /* float, unless every operand is bool */
  ARGS_WHERE,   /* operand 0 as bool, the others as the result's kind */
  ARGS_SPECIAL, /* const, pow, cast, iota: formatted by code below */
} args_mode;

/* "$0".."$2" stand for the operands. NaN-propagating and composite ops are prelude
 * functions so that each operand is evaluated once and the table stays one line per op. */
static const struct {
  const char *fmt;
  args_mode mode;
} op_code[FM_OP__COUNT] = {
    [FM_OP_CONST] = {NULL, ARGS_SPECIAL},
    [FM_OP_ADD] = {"($0 + $1)", ARGS_FLOAT},
    [FM_OP_SUB] = {"($0 - $1)", ARGS_FLOAT},
    [FM_OP_MUL] = {"($0 * $1)", ARGS_FLOAT},
    [FM_OP_DIV] = {"fm_div($0, $1)", ARGS_FLOAT},
    [FM_OP_MAXIMUM] = {"fm_maximum($0, $1)", ARGS_FLOAT},
    [FM_OP_MINIMUM] = {"fm_minimum($0, $1)", ARGS_FLOAT},
    [FM_OP_POW] = {"powf($0, $1)", ARGS_SPECIAL},
    [FM_OP_NEG] = {"(-$0)", ARGS_FLOAT},
    [FM_OP_ABS] = {"fabsf($0)", ARGS_FLOAT},
    [FM_OP_RELU] = {"fm_relu($0)", ARGS_FLOAT},
    [FM_OP_GELU] = {"fm_gelu($0)", ARGS_FLOAT},
    [FM_OP_GELU_TANH] = {"fm_gelu_tanh($0)", ARGS_FLOAT},
    [FM_OP_SILU] = {"fm_silu($0)", ARGS_FLOAT},
    [FM_OP_SIGMOID] = {"fm_sigmoid($0)", ARGS_FLOAT},
    [FM_OP_TANH] = {"fm_tanh($0)", ARGS_FLOAT},
    [FM_OP_EXP] = {"fm_exp($0)", ARGS_FLOAT},
    [FM_OP_LOG] = {"logf($0)", ARGS_FLOAT},
    [FM_OP_SQRT] = {"sqrtf($0)", ARGS_FLOAT},
    [FM_OP_RSQRT] = {"rsqrtf($0)", ARGS_FLOAT},
    [FM_OP_ERF] = {"erff($0)", ARGS_FLOAT},
    /* the full-range forms torch's own kernels use: rotary angles reach thousands of radians,
     * where __cosf's error is no longer bounded */
    [FM_OP_COS] = {"cosf($0)", ARGS_FLOAT},
    [FM_OP_SIN] = {"sinf($0)", ARGS_FLOAT},
    [FM_OP_GT] = {"($0 > $1)", ARGS_COMPARE},
    [FM_OP_GE] = {"($0 >= $1)", ARGS_COMPARE},
    [FM_OP_LT] = {"($0 < $1)", ARGS_COMPARE},
    [FM_OP_LE] = {"($0 <= $1)", ARGS_COMPARE},
    [FM_OP_EQ] = {"($0 == $1)", ARGS_COMPARE},
    [FM_OP_NE] = {"($0 != $1)", ARGS_COMPARE},
    [FM_OP_WHERE] = {"($0 ? $1 : $2)", ARGS_WHERE},
    [FM_OP_CAST] = {NULL, ARGS_SPECIAL},
    [FM_OP_FLOOR_DIV] = {NULL, ARGS_SPECIAL}, /* i64 only: int_code */
    [FM_OP_IOTA] = {NULL, ARGS_SPECIAL},
};

/* Integer values (vocab 10): the ops whose i64 form differs from op_code's. Operands are
 * names or literals, so repeating one costs nothing. floor_div's divisor is a nonzero
 * literal (validation): C's division truncates, so a quotient with a remainder of the other
 * sign steps down once. */
static const char *const int_code[FM_OP__COUNT] = {
    [FM_OP_MAXIMUM] = "($0 > $1 ? $0 : $1)",
    [FM_OP_MINIMUM] = "($0 < $1 ? $0 : $1)",
    [FM_OP_ABS] = "($0 < 0 ? -$0 : $0)",
    [FM_OP_FLOOR_DIV] = "($0 / $1 - (long long)(($0 % $1 != 0) && (($0 < 0) != ($1 < 0))))",
};

/* pow by a constant: the exponents PyTorch also special-cases, cheaper and exact. */
static const struct {
  double exponent;
  const char *fmt;
} pow_code[] = {
    {2.0, "($0 * $0)"},    {3.0, "($0 * $0 * $0)"},      {1.0, "($0)"}, {0.5, "sqrtf($0)"}, {-0.5, "rsqrtf($0)"},
    {-1.0, "(1.0f / $0)"}, {-2.0, "(1.0f / ($0 * $0))"},
};

/* What each op's code costs NVRTC, in units of a cheap op (fm_codegen_cost); 0 = 1 unit.
 * Measured on chains of 32-255 ops of one kind (pointwise, f32, 2-core CPU): ~5 ms of NVRTC
 * per unit; a general pow (powf) ~160 ms. Compile time grows faster than linearly with
 * the kernel's size, so these err high. */
static const uint8_t op_cost[FM_OP__COUNT] = {
    [FM_OP_DIV] = 2,     [FM_OP_EXP] = 2,  [FM_OP_TANH] = 2,      [FM_OP_SQRT] = 2,       [FM_OP_RSQRT] = 2,
    [FM_OP_SIGMOID] = 4, [FM_OP_SILU] = 4, [FM_OP_GELU_TANH] = 4, [FM_OP_GELU] = 6,       [FM_OP_ERF] = 6,
    [FM_OP_COS] = 4,     [FM_OP_SIN] = 4,  [FM_OP_LOG] = 6,       [FM_OP_SUM] = 2,        [FM_OP_MEAN] = 2,
    [FM_OP_AMAX] = 2,    [FM_OP_VAR] = 4,  [FM_OP_SOFTMAX] = 8,   [FM_OP_LAYER_NORM] = 8, [FM_OP_RMS_NORM] = 8,
    [FM_OP_POW] = 32, /* powf; see pow_cost */
};

/* pow by an exponent pow_code special-cases costs what its multiplication or root does. */
static uint32_t pow_cost(const fm_fragment *f, const fm_opnode *op) {
  uint32_t c = op->args[1];
  for (uint32_t i = 0; i < f->n_ops; i++) {
    if (f->ops[i].out != c || f->ops[i].op != FM_OP_CONST) continue;
    for (size_t k = 0; k < sizeof pow_code / sizeof pow_code[0]; k++)
      if (f->ops[i].value == pow_code[k].exponent) return 2;
  }
  return op_cost[FM_OP_POW];
}

static uint32_t one_cost(const fm_fragment *f, const fm_opnode *op) {
  if (op->op == FM_OP_POW) return pow_cost(f, op);
  if (fm_op_kind(op->op) == FM_OPK_WINDOW) return fm_cg_window_cost(op);
  return op_cost[op->op] ? op_cost[op->op] : 1;
}

/* The op defining value id among ops[0, limit), or -1 (an input). */
static int defining_op(const fm_fragment *f, uint32_t limit, uint32_t id) {
  for (uint32_t j = limit; j-- > 0;)
    if (f->ops[j].out == id) return (int)j;
  return -1;
}

/* A cat's operands are generated again in their branches (fm_codegen_cat.c): the ops each
 * one reads cost once more per operand. */
static uint64_t cat_cost(const fm_fragment *f, uint32_t i) {
  uint64_t cost = 0;
  for (uint32_t a = 0; a < f->ops[i].nargs && a < FM_MAX_ARGS; a++) {
    uint8_t need[FM_MAX_OPS] = {0};
    int root = defining_op(f, i, f->ops[i].args[a]);
    if (root >= 0) need[root] = 1;
    for (uint32_t j = i; j-- > 0;) {
      if (!need[j]) continue;
      cost += one_cost(f, &f->ops[j]);
      for (uint32_t b = 0; b < f->ops[j].nargs && b < FM_MAX_ARGS; b++) {
        int q = defining_op(f, j, f->ops[j].args[b]);
        if (q >= 0) need[q] = 1;
      }
    }
  }
  return cost;
}

uint32_t fm_codegen_cost(const fm_fragment *f) {
  uint64_t cost = 0; /* a window op's taps can be millions: saturate, never wrap */
  for (uint32_t i = 0; i < f->n_ops && i < FM_MAX_OPS; i++) {
    const fm_opnode *op = &f->ops[i];
    cost += one_cost(f, op);
    if (fm_op_kind(op->op) == FM_OPK_CAT) cost += cat_cost(f, i);
  }
  return cost > UINT32_MAX ? UINT32_MAX : (uint32_t)cost;
}

/* The prelude: identical in every kernel (so it costs nothing in the golden files to read
 * it once). Changing it changes generated source: bump FM_CODEGEN_VERSION. */
static const char prelude[] =
    "/* ---- prelude: storage conversions (16-bit floats are unsigned short) ---- */\n"
    "__device__ __forceinline__ float fm_bf16_to_f32(unsigned short h) {\n"
    "  return __uint_as_float(((unsigned int)h) << 16);\n"
    "}\n"
    "__device__ __forceinline__ unsigned short fm_f32_to_bf16(float f) {\n"
    "  /* one instruction on sm_80+ (every target): round to nearest even, NaN stays NaN */\n"
    "  unsigned short h;\n"
    "  asm(\"cvt.rn.bf16.f32 %0, %1;\" : \"=h\"(h) : \"f\"(f));\n"
    "  return h;\n"
    "}\n"
    "__device__ __forceinline__ float fm_f16_to_f32(unsigned short h) {\n"
    "  float f;\n"
    "  asm(\"cvt.f32.f16 %0, %1;\" : \"=f\"(f) : \"h\"(h));\n"
    "  return f;\n"
    "}\n"
    "__device__ __forceinline__ unsigned short fm_f32_to_f16(float f) {\n"
    "  unsigned short h;\n"
    "  asm(\"cvt.rn.f16.f32 %0, %1;\" : \"=h\"(h) : \"f\"(f));\n"
    "  return h;\n"
    "}\n"
    "__device__ __forceinline__ float fm_round_bf16(float x) { return fm_bf16_to_f32(fm_f32_to_bf16(x)); }\n"
    "__device__ __forceinline__ float fm_round_f16(float x) { return fm_f16_to_f32(fm_f32_to_f16(x)); }\n"
    "/* ---- prelude: ops (fp32; NaN propagates like torch) ---- */\n"
    "/* max.NaN/min.NaN (sm_80+, every target): one instruction where the (a != a) ? a : ...\n"
    " * form took five, which made a row's running max the issue-bound part of a streamed\n"
    " * cross-entropy. A NaN operand gives the canonical NaN. */\n"
    "__device__ __forceinline__ float fm_maximum(float a, float b) {\n"
    "  float r;\n"
    "  asm(\"max.NaN.f32 %0, %1, %2;\" : \"=f\"(r) : \"f\"(a), \"f\"(b));\n"
    "  return r;\n"
    "}\n"
    "__device__ __forceinline__ float fm_minimum(float a, float b) {\n"
    "  float r;\n"
    "  asm(\"min.NaN.f32 %0, %1, %2;\" : \"=f\"(r) : \"f\"(a), \"f\"(b));\n"
    "  return r;\n"
    "}\n"
    "__device__ __forceinline__ float fm_relu(float x) { return (x != x) ? x : fmaxf(x, 0.0f); }\n"
    "/* Transcendentals and division. FM_FAST_MATH is 1 when any float input or output is\n"
    " * 16-bit: its values carry 2^-9 (bf16) or 2^-12 (f16) relative rounding, and the\n"
    " * fragment's f32 values (a loss's log-sum-exp, statistics, a gradient kept in f32) are\n"
    " * checked to 1e-4 of an fp64 reference, so functions accurate to ~1e-6 (hardware\n"
    " * ex2/rcp approximations, division to 2 ulp over the full range, as Triton's kernels\n"
    " * use in fp32 too) cannot be told from exact ones, and they are several times cheaper:\n"
    " * the IEEE-exact library versions made Gemma 2's soft-capped cross-entropy compute-bound.\n"
    " * It is 2 when every output is bf16: GELU then takes a shorter fit (below). A fragment\n"
    " * that is f32 throughout (a model in fp32) keeps the exact library functions. */\n"
    "#if FM_FAST_MATH\n"
    "__device__ __forceinline__ float fm_exp(float x) { return __expf(x); }\n"
    "__device__ __forceinline__ float fm_rcp(float x) { return __fdividef(1.0f, x); }\n"
    "__device__ __forceinline__ float fm_div(float a, float b) {\n"
    "  float q;\n"
    "  asm(\"div.full.f32 %0, %1, %2;\" : \"=f\"(q) : \"f\"(a), \"f\"(b));\n"
    "  return q;\n"
    "}\n"
    "__device__ __forceinline__ float fm_tanh(float x) {\n"
    "  /* tanh|x| = 1 - 2/(1+e^2|x|), abs error ~1e-7; below 2^-4 the odd series x - x^3/3\n"
    "   * (truncation error < 2e-7 relative) avoids the cancellation. */\n"
    "  const float a = fabsf(x);\n"
    "  const float big = 1.0f - 2.0f * fm_rcp(1.0f + __expf(2.0f * a));\n"
    "  const float small = a - 0.333333343f * a * a * a;\n"
    "  return copysignf(a < 0.0625f ? small : big, x);\n"
    "}\n"
    "__device__ __forceinline__ float fm_gelu(float x) {\n"
    "  /* x Phi(x) = relu(x) - |x| Phi(-|x|) (both signs: x - x Phi(-x) = x Phi(x) for x >= 0),\n"
    "   * with Phi(-a) = 0.5 erfc(a / sqrt 2) = 2^q(a): q a degree-7 fit of log2 Phi(-a) on\n"
    "   * [0, 4.5 sqrt 2] (relative error of Phi(-a) <= 1e-5 evaluated in fp32), decreasing\n"
    "   * monotonically beyond it (q < -33 there; -inf past fp32, where 2^q = 0), so it needs no\n"
    "   * clamp. No cancellation on either side, one rounding in the last step, one MUFU op (the\n"
    "   * ex2), no branch, |x| an operand modifier: 11 instructions an element where the\n"
    "   * degree-9 erfc form took 15. That matters: GELU is the cost of a short-K GEMM's\n"
    "   * epilogue (16384 x 1024 x 256 + bias 0.026 ms; + GELU 0.033 before). |x| is capped at\n"
    "   * FLT_MAX in the product so that +inf gives +inf (inf x 2^-inf would be NaN). */\n"
    "  const float a = fabsf(x);\n"
    "#if FM_FAST_MATH == 2\n"
    "  /* bf16 outputs only: a degree-5 fit on the same range, relative error of Phi(-a)\n"
    "   * <= 4.8e-4, an eighth of a bf16 ulp (it would be a whole f16 one), still decreasing past\n"
    "   * the range: 9 instructions an element. GELU is the issue time of a short-K GEMM's\n"
    "   * epilogue, each instruction an element ~2% of 16384 x 1024 x 256 (bench/NOTES.md). */\n"
    "  float q = -1.815963312e-04f;\n"
    "  q = fmaf(q, a, 4.192861628e-03f);\n"
    "  q = fmaf(q, a, -4.153857518e-02f);\n"
    "  q = fmaf(q, a, -4.752223230e-01f);\n"
    "  q = fmaf(q, a, -1.142837962e+00f);\n"
    "  q = fmaf(q, a, -1.000686284e+00f);\n"
    "#else\n"
    "  float q = -1.805704528e-06f;\n"
    "  q = fmaf(q, a, 6.097363439e-05f);\n"
    "  q = fmaf(q, a, -9.252218297e-04f);\n"
    "  q = fmaf(q, a, 8.485276252e-03f);\n"
    "  q = fmaf(q, a, -5.390930921e-02f);\n"
    "  q = fmaf(q, a, -4.585215449e-01f);\n"
    "  q = fmaf(q, a, -1.151223660e+00f);\n"
    "  q = fmaf(q, a, -9.999988675e-01f);\n"
    "#endif\n"
    "  float h;\n"
    "  asm(\"ex2.approx.ftz.f32 %0, %1;\" : \"=f\"(h) : \"f\"(q));\n"
    "  return fmaf(-fminf(a, 3.402823466e+38f), h, fmaxf(x, 0.0f));\n"
    "}\n"
    "#else\n"
    "__device__ __forceinline__ float fm_exp(float x) { return expf(x); }\n"
    "__device__ __forceinline__ float fm_rcp(float x) { return 1.0f / x; }\n"
    "__device__ __forceinline__ float fm_div(float a, float b) { return a / b; }\n"
    "__device__ __forceinline__ float fm_tanh(float x) { return tanhf(x); }\n"
    "__device__ __forceinline__ float fm_gelu(float x) {\n"
    "  return 0.5f * x * (1.0f + erff(x * 0.70710678f));\n"
    "}\n"
    "#endif\n"
    "__device__ __forceinline__ float fm_gelu_tanh(float x) {\n"
    "  /* PyTorch's approximate='tanh': sqrt(2/pi) * (x + 0.044715 x^3) */\n"
    "  return 0.5f * x * (1.0f + fm_tanh(0.797884561f * (x + 0.044715f * x * x * x)));\n"
    "}\n"
    "__device__ __forceinline__ float fm_sigmoid(float x) { return fm_rcp(1.0f + fm_exp(-x)); }\n"
    "__device__ __forceinline__ float fm_silu(float x) { return x * fm_sigmoid(x); }\n"
    "/* ---- prelude: elements of a vector register (k, e are constants after unrolling) ---- */\n"
    "__device__ __forceinline__ unsigned int fm_word(const uint4 &r, int k) {\n"
    "  return k == 0 ? r.x : k == 1 ? r.y : k == 2 ? r.z : r.w;\n"
    "}\n"
    "__device__ __forceinline__ unsigned int fm_word(const uint2 &r, int k) { return k == 0 ? r.x : r.y; }\n"
    "__device__ __forceinline__ unsigned int fm_word(unsigned int r, int) { return r; }\n"
    "__device__ __forceinline__ unsigned int fm_word(unsigned short r, int) { return r; }\n"
    "__device__ __forceinline__ void fm_or_word(uint4 &r, int k, unsigned int b) {\n"
    "  if (k == 0) r.x |= b; else if (k == 1) r.y |= b; else if (k == 2) r.z |= b; else r.w |= b;\n"
    "}\n"
    "__device__ __forceinline__ void fm_or_word(uint2 &r, int k, unsigned int b) {\n"
    "  if (k == 0) r.x |= b; else r.y |= b;\n"
    "}\n"
    "__device__ __forceinline__ void fm_or_word(unsigned int &r, int, unsigned int b) { r |= b; }\n"
    "__device__ __forceinline__ void fm_or_word(unsigned short &r, int, unsigned int b) {\n"
    "  r = (unsigned short)(r | b);\n"
    "}\n"
    "template <typename V> __device__ __forceinline__ float fm_get_f32(const V &r, int e) {\n"
    "  return __uint_as_float(fm_word(r, e));\n"
    "}\n"
    "template <typename V> __device__ __forceinline__ unsigned short fm_get_u16(const V &r, int e) {\n"
    "  return (unsigned short)(fm_word(r, e >> 1) >> ((e & 1) * 16));\n"
    "}\n"
    "template <typename V> __device__ __forceinline__ unsigned char fm_get_u8(const V &r, int e) {\n"
    "  return (unsigned char)(fm_word(r, e >> 2) >> ((e & 3) * 8));\n"
    "}\n"
    "template <typename V> __device__ __forceinline__ void fm_put_f32(V &r, int e, float x) {\n"
    "  fm_or_word(r, e, __float_as_uint(x));\n"
    "}\n"
    "template <typename V> __device__ __forceinline__ void fm_put_u16(V &r, int e, unsigned short x) {\n"
    "  fm_or_word(r, e >> 1, (unsigned int)x << ((e & 1) * 16));\n"
    "}\n"
    "template <typename V> __device__ __forceinline__ void fm_put_u8(V &r, int e, unsigned char x) {\n"
    "  fm_or_word(r, e >> 2, (unsigned int)x << ((e & 3) * 8));\n"
    "}\n";

static int is_16bit(fm_dtype dt) { return dt == FM_DT_BF16 || dt == FM_DT_F16; }

int fm_cg_fast_math(const fm_fragment *f) {
  int all_bf16 = f->n_outputs > 0, any_16bit = 0;
  for (uint32_t o = 0; o < f->n_outputs; o++) {
    if (f->outputs[o].dtype != FM_DT_BF16) all_bf16 = 0;
    if (is_16bit(f->outputs[o].dtype)) any_16bit = 1;
  }
  for (uint32_t i = 0; i < f->n_inputs; i++)
    if (is_16bit(f->inputs[i].dtype)) any_16bit = 1;
  return all_bf16 ? 2 : any_16bit ? 1 : 0;
}

void fm_cg_emit_prelude(fm_strbuf *sb, int fast_math) {
  fm_strbuf_printf(sb, "#define FM_FAST_MATH %d\n", fast_math < 0 ? 0 : fast_math > 2 ? 2 : fast_math);
  fm_strbuf_append(sb, prelude);
}

const char *fm_cg_storage_type(fm_dtype dt) {
  switch (dt) {
    case FM_DT_BOOL:
      return "unsigned char";
    case FM_DT_F16:
    case FM_DT_BF16:
      return "unsigned short";
    case FM_DT_F32:
      return "float";
    case FM_DT_I64:
      return "long long";
    case FM_DT__COUNT:
      break;
  }
  return "float";
}

void fm_cg_emit_float(fm_strbuf *sb, double v) {
  if (isnan(v)) {
    fm_strbuf_append(sb, "(__int_as_float(0x7fc00000))");
    return;
  }
  /* The value the kernel computes with is the nearest float (overflowing to inf). Decide
   * overflow in double: converting an out-of-range double to float is undefined in C. */
  double mag = fabs(v);
  if (mag > (double)FLT_MAX) {
    double half_ulp = ldexp(1.0, FLT_MAX_EXP - FLT_MANT_DIG - 1);
    if (mag >= (double)FLT_MAX + half_ulp) {
      fm_strbuf_append(sb, v < 0 ? "(__int_as_float(0xff800000))" : "(__int_as_float(0x7f800000))");
      return;
    }
    v = v < 0 ? -(double)FLT_MAX : (double)FLT_MAX;
  }
  char num[48];
  snprintf(num, sizeof num, "%.9g", (double)(float)v); /* 9 digits round-trip a float */
  int has_point = strpbrk(num, ".e") != NULL;
  fm_strbuf_printf(sb, v < 0 || signbit(v) ? "(%s%sf)" : "%s%sf", num, has_point ? "" : ".0");
}

/* Writes fmt with $0..$2 replaced by operands. */
static void render(fm_strbuf *sb, const char *fmt, char ops[][48]) {
  for (const char *s = fmt; *s; s++) {
    if (s[0] == '$' && s[1] >= '0' && s[1] <= '2') {
      fm_strbuf_append(sb, ops[s[1] - '0']);
      s++;
    } else {
      fm_strbuf_appendn(sb, s, 1);
    }
  }
}

/* Value pos as a float, a bool or an i64 expression. */
static const char *idx(const fm_cg_plan *p, uint32_t pos) { return p->rowval[pos] ? "[i]" : ""; }

static void as_float(char out[48], const fm_cg_plan *p, uint32_t pos) {
  if (p->vdt[pos] == FM_DT_BOOL)
    snprintf(out, 48, "(v%u%s ? 1.0f : 0.0f)", pos, idx(p, pos));
  else if (p->vdt[pos] == FM_DT_I64) /* round to nearest, as torch's int64 -> float */
    snprintf(out, 48, "((float)v%u%s)", pos, idx(p, pos));
  else
    snprintf(out, 48, "v%u%s", pos, idx(p, pos));
}

static void as_bool(char out[48], const fm_cg_plan *p, uint32_t pos) {
  if (p->vdt[pos] == FM_DT_BOOL)
    snprintf(out, 48, "v%u%s", pos, idx(p, pos));
  else if (p->vdt[pos] == FM_DT_I64)
    snprintf(out, 48, "(v%u%s != 0)", pos, idx(p, pos));
  else
    snprintf(out, 48, "(v%u%s != 0.0f)", pos, idx(p, pos));
}

/* An operand of an integer op: an i64 value, a bool as 0/1, or an integer const as a
 * literal (validation keeps it exact: at most 2^24). */
static void as_int(char out[48], const fm_fragment *f, const fm_cg_plan *p, uint32_t pos) {
  if (pos >= p->n_in && f->ops[pos - p->n_in].op == FM_OP_CONST)
    snprintf(out, 48, "(%lldLL)", (long long)f->ops[pos - p->n_in].value);
  else if (p->vdt[pos] == FM_DT_I64)
    snprintf(out, 48, "v%u%s", pos, idx(p, pos));
  else
    snprintf(out, 48, "(long long)v%u%s", pos, idx(p, pos));
}

static void as_kind(char out[48], const fm_cg_plan *p, uint32_t pos, fm_dtype kind) {
  if (kind == FM_DT_BOOL)
    as_bool(out, p, pos);
  else
    as_float(out, p, pos);
}

/* Whether op i computes on integers: an i64 result, or a comparison reading an i64 value. */
static int integer_op(const fm_fragment *f, const fm_cg_plan *p, uint32_t i) {
  const fm_opnode *op = &f->ops[i];
  if (op->op == FM_OP_CAST || op->op == FM_OP_CONST) return 0;
  if (op->dtype == FM_DT_I64) return 1;
  if (op_code[op->op].mode != ARGS_COMPARE) return 0;
  return p->vdt[p->args[i][0]] == FM_DT_I64 || p->vdt[p->args[i][1]] == FM_DT_I64;
}

static void emit_cast(fm_strbuf *sb, const fm_cg_plan *p, uint32_t src, fm_dtype to) {
  char a[48];
  switch (to) {
    case FM_DT_BOOL:
      as_bool(a, p, src);
      fm_strbuf_append(sb, a);
      return;
    case FM_DT_F32:
      as_float(a, p, src);
      fm_strbuf_append(sb, a);
      return;
    case FM_DT_BF16:
    case FM_DT_F16:
      as_float(a, p, src);
      if (p->vdt[src] == FM_DT_BOOL)
        fm_strbuf_append(sb, a); /* 0 and 1 are exact */
      else
        fm_strbuf_printf(sb, "%s(%s)", to == FM_DT_BF16 ? "fm_round_bf16" : "fm_round_f16", a);
      return;
    case FM_DT_I64: /* of a bool or an i64 (validation) */
      fm_strbuf_printf(sb, p->vdt[src] == FM_DT_I64 ? "v%u%s" : "(long long)v%u%s", src, idx(p, src));
      return;
    case FM_DT__COUNT:
      break;
  }
}

void fm_cg_emit_op(fm_strbuf *sb, const fm_fragment *f, const fm_cg_plan *p, uint32_t i) {
  const fm_opnode *op = &f->ops[i];
  const uint16_t *args = p->args[i];
  char ops[3][48] = {"", "", ""};
  if (op->op == FM_OP_IOTA) { /* the element's column, which the template names fm_col */
    fm_strbuf_append(sb, op->dtype == FM_DT_I64 ? "fm_col" : "(float)fm_col");
    return;
  }
  if (integer_op(f, p, i)) {
    const uint32_t first = op->op == FM_OP_WHERE ? 1 : 0;
    if (first) as_bool(ops[0], p, args[0]);
    for (uint32_t a = first; a < op->nargs; a++) as_int(ops[a], f, p, args[a]);
    render(sb, int_code[op->op] ? int_code[op->op] : op_code[op->op].fmt, ops);
    return;
  }
  switch (op_code[op->op].mode) {
    case ARGS_FLOAT:
      for (uint32_t a = 0; a < op->nargs; a++) as_float(ops[a], p, args[a]);
      break;
    case ARGS_COMPARE: {
      int all_bool = p->vdt[args[0]] == FM_DT_BOOL && p->vdt[args[1]] == FM_DT_BOOL;
      for (uint32_t a = 0; a < 2; a++) {
        if (all_bool)
          snprintf(ops[a], 48, "v%u%s", args[a], idx(p, args[a]));
        else
          as_float(ops[a], p, args[a]);
      }
      break;
    }
    case ARGS_WHERE:
      as_bool(ops[0], p, args[0]);
      as_kind(ops[1], p, args[1], op->dtype);
      as_kind(ops[2], p, args[2], op->dtype);
      break;
    case ARGS_SPECIAL:
      if (op->op == FM_OP_CONST) {
        if (op->dtype == FM_DT_BOOL)
          fm_strbuf_append(sb, op->value != 0 ? "true" : "false");
        else
          fm_cg_emit_float(sb, op->value);
        return;
      }
      if (op->op == FM_OP_CAST) {
        emit_cast(sb, p, args[0], op->dtype);
        return;
      }
      /* pow: by a generation-time constant when the exponent is a const op */
      as_float(ops[0], p, args[0]);
      if (args[1] >= p->n_in && f->ops[args[1] - p->n_in].op == FM_OP_CONST) {
        double c = f->ops[args[1] - p->n_in].value;
        for (size_t k = 0; k < sizeof pow_code / sizeof pow_code[0]; k++) {
          if (c == pow_code[k].exponent) {
            render(sb, pow_code[k].fmt, ops);
            return;
          }
        }
        fm_strbuf_printf(sb, "powf(%s, ", ops[0]);
        fm_cg_emit_float(sb, c);
        fm_strbuf_append(sb, ")");
        return;
      }
      as_float(ops[1], p, args[1]);
      break;
  }
  render(sb, op_code[op->op].fmt, ops);
}

/* Raw element -> value, and value -> raw element. */
static void emit_load_value(fm_strbuf *sb, fm_dtype dt, uint32_t k) {
  switch (dt) {
    case FM_DT_BOOL:
      fm_strbuf_printf(sb, "(i%u != 0)", k);
      return;
    case FM_DT_F16:
      fm_strbuf_printf(sb, "fm_f16_to_f32(i%u)", k);
      return;
    case FM_DT_BF16:
      fm_strbuf_printf(sb, "fm_bf16_to_f32(i%u)", k);
      return;
    case FM_DT_F32:
    case FM_DT_I64: /* an integer value (vocab 10) */
    case FM_DT__COUNT:
      fm_strbuf_printf(sb, "i%u", k);
      return;
  }
}

static void emit_store_value(fm_strbuf *sb, const fm_fragment *f, const fm_cg_plan *p, fm_dtype dt, uint32_t pos) {
  char a[48];
  if (dt == FM_DT_I64)
    as_int(a, f, p, pos);
  else
    as_kind(a, p, pos, dt);
  switch (dt) {
    case FM_DT_BOOL:
      fm_strbuf_printf(sb, "(unsigned char)%s", a);
      return;
    case FM_DT_F16:
      fm_strbuf_printf(sb, "fm_f32_to_f16(%s)", a);
      return;
    case FM_DT_BF16:
      fm_strbuf_printf(sb, "fm_f32_to_bf16(%s)", a);
      return;
    case FM_DT_F32:
    case FM_DT_I64: /* an integer value (vocab 10) */
    case FM_DT__COUNT:
      fm_strbuf_append(sb, a);
      return;
  }
}

int fm_cg_emit_compute(fm_strbuf *sb, const fm_fragment *f, const fm_cg_plan *p, fm_diag *d) {
  (void)d;
  fm_strbuf_append(sb,
                   "/* ---- the fused op chain for one element ---- */\n"
                   "__device__ __forceinline__ void fm_compute(");
  const char *sep = "";
  for (uint32_t k = 0; k < p->n_in; k++) {
    if (p->t[k].access == FM_CG_UNUSED) continue;
    fm_strbuf_printf(sb, "%sconst %s i%u", sep, fm_cg_storage_type(p->t[k].dtype), k);
    sep = ", ";
  }
  for (uint32_t k = 0; k < p->n_out; k++) {
    fm_strbuf_printf(sb, "%s%s &o%u", sep, fm_cg_storage_type(p->t[p->n_in + k].dtype), k);
    sep = ", ";
  }
  if (p->iota_cols) fm_strbuf_printf(sb, "%sconst long long fm_col", sep);
  fm_strbuf_append(sb, ") {\n");
  for (uint32_t k = 0; k < p->n_in; k++) {
    if (p->t[k].access == FM_CG_UNUSED) continue;
    fm_strbuf_printf(sb, "  const %s v%u = ", fm_cg_val_type(p->vdt[k]), k);
    emit_load_value(sb, p->vdt[k], k);
    fm_strbuf_append(sb, ";\n");
  }
  for (uint32_t i = 0; i < p->n_ops; i++) {
    uint32_t pos = p->n_in + i;
    if (!p->live[pos]) continue;
    fm_strbuf_printf(sb, "  const %s v%u = ", fm_cg_val_type(p->vdt[pos]), pos);
    fm_cg_emit_op(sb, f, p, i);
    fm_strbuf_printf(sb, ";  /* %s */\n", fm_op_name(f->ops[i].op));
  }
  for (uint32_t k = 0; k < p->n_out; k++) {
    const fm_cg_tensor *t = &p->t[p->n_in + k];
    fm_strbuf_printf(sb, "  o%u = ", k);
    emit_store_value(sb, f, p, t->dtype, t->value);
    fm_strbuf_append(sb, ";\n");
  }
  fm_strbuf_append(sb, "}\n");
  return FM_OK;
}

/* ---- storage access shared by the templates that hold values in register arrays ---- */

const char *fm_cg_vec_type(uint32_t bytes) {
  switch (bytes) {
    case 16:
      return "uint4";
    case 8:
      return "uint2";
    case 4:
      return "unsigned int";
    case 2:
      return "unsigned short";
    default:
      return "unsigned char";
  }
}

const char *fm_cg_val_type(fm_dtype dt) { return dt == FM_DT_BOOL ? "bool" : dt == FM_DT_I64 ? "long long" : "float"; }

void fm_cg_emit_decode(fm_strbuf *sb, fm_dtype dt, const char *e) {
  switch (dt) {
    case FM_DT_BOOL:
      fm_strbuf_printf(sb, "(%s != 0)", e);
      return;
    case FM_DT_F16:
      fm_strbuf_printf(sb, "fm_f16_to_f32(%s)", e);
      return;
    case FM_DT_BF16:
      fm_strbuf_printf(sb, "fm_bf16_to_f32(%s)", e);
      return;
    default:
      fm_strbuf_append(sb, e);
      return;
  }
}

void fm_cg_emit_encode(fm_strbuf *sb, fm_dtype dt, fm_dtype vdt, const char *v) {
  char a[64];
  if (vdt == FM_DT_BOOL && dt != FM_DT_BOOL)
    snprintf(a, sizeof a, "(%s ? 1.0f : 0.0f)", v);
  else if (vdt != FM_DT_BOOL && dt == FM_DT_BOOL)
    snprintf(a, sizeof a, "(%s != 0.0f)", v);
  else
    snprintf(a, sizeof a, "%s", v);
  switch (dt) {
    case FM_DT_BOOL:
      fm_strbuf_printf(sb, "(unsigned char)%s", a);
      return;
    case FM_DT_F16:
      fm_strbuf_printf(sb, "fm_f32_to_f16(%s)", a);
      return;
    case FM_DT_BF16:
      fm_strbuf_printf(sb, "fm_f32_to_bf16(%s)", a);
      return;
    default:
      fm_strbuf_append(sb, a);
      return;
  }
}

const char *fm_cg_get_fn(fm_dtype dt) {
  size_t s = fm_dtype_size(dt);
  return s == 4 ? "fm_get_f32" : s == 2 ? "fm_get_u16" : "fm_get_u8";
}

const char *fm_cg_put_fn(fm_dtype dt) {
  size_t s = fm_dtype_size(dt);
  return s == 4 ? "fm_put_f32" : s == 2 ? "fm_put_u16" : "fm_put_u8";
}

static void emit_signature(fm_strbuf *sb, const fm_cg_plan *p, uint32_t block, uint32_t cluster_y, const char *entry,
                           const char *last) {
  fm_strbuf_append(sb, "extern \"C\" __global__ void ");
  if (cluster_y > 1) fm_strbuf_printf(sb, "__cluster_dims__(1, %u, 1) ", cluster_y);
  fm_strbuf_printf(sb, "__launch_bounds__(%u) %s(\n", block, entry);
  for (uint32_t k = 0; k < p->n_in; k++)
    fm_strbuf_printf(sb, "    const %s *__restrict__ in%u,\n", fm_cg_storage_type(p->t[k].dtype), k);
  for (uint32_t k = 0; k < p->n_out; k++)
    fm_strbuf_printf(sb, "    %s *__restrict__ out%u,\n", fm_cg_storage_type(p->t[p->n_in + k].dtype), k);
  fm_strbuf_append(sb, last);
}

void fm_cg_emit_signature(fm_strbuf *sb, const fm_cg_plan *p, uint32_t block, uint32_t cluster_y, const char *entry) {
  emit_signature(sb, p, block, cluster_y, entry, "    long long outer) {\n");
}

void fm_cg_emit_signature_scratch(fm_strbuf *sb, const fm_cg_plan *p, uint32_t block, uint32_t cluster_y,
                                  const char *entry) {
  emit_signature(sb, p, block, cluster_y, entry, "    long long outer,\n    float *__restrict__ fm_scratch) {\n");
}

void fm_cg_meta_begin(fm_kernel_meta *m, const char *kind, const char *rule, const char *entry, uint32_t block,
                      const fm_cg_plan *p) {
  memset(m, 0, sizeof *m);
  snprintf(m->kind, sizeof m->kind, "%s", kind);
  snprintf(m->grid_rule, sizeof m->grid_rule, "%s", rule);
  snprintf(m->entry, sizeof m->entry, "%s", entry);
  m->block[0] = block;
  m->block[1] = m->block[2] = 1;
  m->n_inputs = p->n_in;
  m->n_outputs = p->n_out;
}
