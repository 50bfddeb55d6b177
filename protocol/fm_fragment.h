/* fm_fragment.h: the fragment IR: what a client asks fusemld to fuse.
 *
 * A fragment is a small SSA dataflow graph over *values*:
 *   - inputs:  tensors in GPU memory the kernel reads (value ids given by the client),
 *   - ops:     each defines one new value from earlier values (fixed vocabulary, FM_OP_MAP),
 *   - outputs: tensors the kernel writes, each naming the value stored into it.
 * Intermediates never touch memory; the kernel computes in fp32 registers and rounds
 * only when storing an output (or at an explicit `cast`).
 *
 * Wire form (a msgpack map; the same structure as JSON for fusectl; PROTOCOL.md is normative):
 *   {vocab: 1 .. 11,
 *    m_hint?: int   (GEMM and column fragments with a symbolic M: the expected M; see fm_fragment.m_hint),
 *    inputs:  [{id, dtype, shape, strides, align}, ...],
 *    ops:     [{op, out, args: [id, ...], value?: float, dtype?: str,   (cast, iota)
 *              dim?: int, keepdim?: bool, correction?: 0|1,     (these three: vocab 2;
 *                                                   dim 0 of a rank-2 value: vocab 5, columns;
 *                                                   a cat's dim: vocab 6, required there)
 *              window?: [kh, kw, sh, sw, ph, pw, dh, dw], ceil_mode?: bool}, ...],
 *                                                  (window ops only, vocab 7; window required)
 *    outputs: [{id, dtype, shape, strides, align}, ...]}
 *
 * Shapes: rank 0..FM_MAX_RANK; each dim an int >= 1, or FM_DIM_SYMBOLIC (-1) for the one
 * symbolic dimension, which may only be dim 0 (the batch/token dimension: its size is a
 * launch argument, so one kernel serves every batch size). Strides are in elements, all
 * constants (dim 0 being outermost, no stride depends on it). The *iteration shape* of a
 * pointwise fragment (row and column fragments: below) is the shape of outputs[0]; every output has exactly that shape; each input has the same rank and
 * every dim equal to the iteration dim or 1 (broadcast; its stride is then ignored).
 * `align` is the byte alignment the client guarantees for the base pointer (power of two).
 *
 * Dtypes of values: inputs carry theirs; arithmetic ops promote like PyTorch
 * (bf16+bf16 -> bf16, bf16+f16 -> f32, anything+f32 -> f32; `const` is a Python scalar and
 * does not promote; bool operands of arithmetic become the other operand's type, or f32);
 * comparisons give bool; cast gives its `dtype`; where gives promote(args[1], args[2]).
 * Each output's dtype must equal the dtype of the value stored into it. `i64` (vocab 8) is
 * an index dtype: only index_add's and take_rows' index may be i64 (no op computes with it,
 * no output is), until vocabulary 10 (integer values, below). */
#ifndef FM_FRAGMENT_H
#define FM_FRAGMENT_H

#include <stdint.h>
#include <stddef.h>
#include <msgpack.h>

#include "fm_error.h"

/* The newest vocabulary this build speaks; it also accepts every older one (FM_VOCAB_MIN).
 * Vocabulary 2 adds the row reductions (sum, mean, amax, var) and the composite ops softmax,
 * layer_norm and rms_norm, which the decoder expands into primitives (fm_fragment_expand).
 * A canonical fragment records the LOWEST version that covers its ops, so a fragment without
 * reductions keeps its vocabulary-1 canonical bytes and cache key. Vocabulary 3 adds the
 * matrix products mm and addmm (GEMM fragments, below). `erf` (what GELU and its backward
 * decompose into) was appended to the elementwise ops of vocabulary 1 later: a daemon built
 * before it answers unknown_op, and the client runs the group eagerly. Vocabulary 4 adds
 * bmm (batched GEMM fragments); a daemon of vocabulary 3 refuses it as reserved. Vocabulary 5
 * adds no op: the reductions sum, mean and amax over dim 0 of a rank-2 value (column
 * fragments, below); a daemon of vocabulary 4 refuses them as unsupported ("only the last
 * dim (-1) can be reduced") and the client runs them unfused. Vocabulary 6 adds `cat`
 * (concatenation along a static dim of a pointwise fragment: cat fragments, below); a daemon
 * of vocabulary 5 refuses a fragment that says vocab 6 (FM_ESCHEMA, "vocab 6 not supported"),
 * and the client runs the group unfused. `cos` and `sin` (rotary embeddings' angles) were
 * appended to the elementwise ops of vocabulary 1 as `erf` was: a daemon built before them
 * answers unknown_op. Vocabulary 7 adds the window ops max_pool2d, max_pool2d_argmax and
 * max_pool2d_backward (2-D max pooling over the last two dims, read from fragment inputs:
 * extent fragments, below); a daemon of vocabulary 6 refuses a fragment that says vocab 7.
 * Vocabulary 8 adds the index dtype i64 and `index_add`, rows of a fragment input added at
 * computed rows of the output by atomic adds (scatter fragments, below); a daemon of
 * vocabulary 7 refuses a fragment that says vocab 8. Vocabulary 9 adds `take_rows`, a fragment
 * input read at the rows an i64 index input names (a gather feeding the fragment's other ops,
 * an extent op: below); a daemon of vocabulary 8 refuses a fragment that says vocab 9.
 * Vocabulary 10 adds integer values: i64 inputs read as data, i64 results of arithmetic,
 * comparisons, where and casts on them, `floor_div` by a constant, and i64 outputs, in
 * pointwise fragments only (a language model's labels, a router's token numbers: below); a
 * daemon of vocabulary 9 refuses a fragment that says vocab 10. Vocabulary 11 adds `iota`, the
 * column index computed in the kernel (cross-entropy's one-hot, a top-k's picks compared
 * against their columns) where a [C] arange was read from memory: below. */
#define FM_VOCAB_VERSION 11
#define FM_VOCAB_MIN     1
#define FM_VOCAB_COLS    5  /* the vocabulary of column fragments */
#define FM_VOCAB_CAT     6  /* the vocabulary of `cat` */
#define FM_VOCAB_WINDOW  7  /* the vocabulary of the window ops (max_pool2d, its argmax, backward) */
#define FM_VOCAB_SCATTER 8  /* the vocabulary of index_add and the i64 index dtype */
#define FM_VOCAB_GATHER  9  /* the vocabulary of take_rows */
#define FM_VOCAB_INTEGER 10 /* the vocabulary of integer values (i64 data, floor_div) */
#define FM_VOCAB_IOTA    11 /* the vocabulary of iota */
/* Field 11 of the cache key (fm_fingerprint.h). The canonical bytes already carry each
 * fragment's own (lowest covering) vocab, so this stays 1 and no existing key changes when
 * a vocabulary is added. */
#define FM_VOCAB_KEY     1

/* Row fragments (vocab 2): a reduced (last) dimension up to FM_MAX_ROW_HELD is held in
 * registers and read once; a longer one, up to FM_MAX_ROW (a vocabulary of a million), is
 * streamed through them in passes, which cannot compute var (its exact two-pass form needs
 * the row held): var over a longer row is FM_EUNSUPPORTED (the client runs it unfused). */
#define FM_MAX_ROW_HELD 32768
#define FM_MAX_ROW      (1 << 20)

/* Hard limits: anything beyond is refused with FM_ELIMIT before any work is done. */
#define FM_MAX_RANK     8
#define FM_MAX_INPUTS   32
#define FM_MAX_OUTPUTS  16
#define FM_MAX_OPS      256
#define FM_MAX_ARGS     8 /* operands of one op (cat's most) */
#define FM_MIN_CAT_ARGS 2
#define FM_MAX_VALUE_ID 0xFFFFFFu          /* client-chosen ids are 0..this */
#define FM_MAX_DIM      ((int64_t)1 << 31) /* one dimension: 1..FM_MAX_DIM-1 */
#define FM_MAX_ELEMENTS ((int64_t)1 << 40) /* product of a static shape */
#define FM_MAX_STRIDE   ((int64_t)1 << 40)
#define FM_MAX_ALIGN    256u
#define FM_DIM_SYMBOLIC (-1)

/* A window op's `window`: [kh, kw, sh, sw, ph, pw, dh, dw] (kernel, stride, padding, dilation;
 * H then W), indexed by these. Limits: 1 <= k <= FM_WINDOW_MAX_KERNEL, 1 <= s <=
 * FM_WINDOW_MAX_STEP, 1 <= d <= FM_WINDOW_MAX_STEP, 0 <= p <= k / 2 (PyTorch's rule). */
enum { FM_WIN_KH, FM_WIN_KW, FM_WIN_SH, FM_WIN_SW, FM_WIN_PH, FM_WIN_PW, FM_WIN_DH, FM_WIN_DW, FM_WIN__N };
#define FM_WINDOW_MAX_KERNEL 64
#define FM_WINDOW_MAX_STEP   (1 << 20)

#define FM_DTYPE_MAP(XX) \
  XX(BOOL, "bool", 1)    \
  XX(F16, "f16", 2)      \
  XX(BF16, "bf16", 2)    \
  XX(F32, "f32", 4)      \
  XX(I64, "i64", 8)

typedef enum {
#define FM_DTYPE_ENUM_(name, str, size) FM_DT_##name,
  FM_DTYPE_MAP(FM_DTYPE_ENUM_)
#undef FM_DTYPE_ENUM_
      FM_DT__COUNT
} fm_dtype;

const char *fm_dtype_name(fm_dtype dt);
size_t fm_dtype_size(fm_dtype dt);
/* Returns FM_OK and sets *out, or FM_ESCHEMA for an unknown name. */
int fm_dtype_parse(const char *s, size_t len, fm_dtype *out);

/* Op classes: how many args, how the result dtype is inferred. */
typedef enum {
  FM_OPK_CONST,     /* no args; `value` (double) */
  FM_OPK_UNARY,     /* 1 float arg -> same float dtype */
  FM_OPK_BINARY,    /* 2 args -> promoted dtype */
  FM_OPK_COMPARE,   /* 2 args -> bool */
  FM_OPK_WHERE,     /* (bool cond, a, b) -> promote(a, b) */
  FM_OPK_CAST,      /* 1 arg -> `dtype` */
  FM_OPK_POW,       /* (x, c) where c is a `const` value: pow by scalar */
  FM_OPK_RESERVED,  /* a known name of a later vocabulary: refused as FM_EUNSUPPORTED */
  FM_OPK_REDUCE,    /* vocab 2: 1 float arg, reduced over its last dim -> same dtype
                      (sum, mean, amax; var also takes `correction`); vocab 5: sum, mean
                      and amax over dim 0 of a rank-2 value (column fragments) */
  FM_OPK_COMPOSITE, /* vocab 2, wire form only: expanded into primitives by
                      fm_fragment_expand (softmax, layer_norm, rms_norm) */
  FM_OPK_MATMUL,    /* vocab 3: mm (A, B) and addmm (bias, A, B) = bias + A@B; GEMM fragments;
                      vocab 4: bmm (A, B), a batch of products (batched GEMM fragments) */
  FM_OPK_CAT,       /* vocab 6: cat (FM_MIN_CAT_ARGS..FM_MAX_ARGS values) along `dim` ->
                      promoted dtype (cat fragments, below) */
  FM_OPK_WINDOW,    /* vocab 7: max_pool2d (x) -> x's dtype; max_pool2d_argmax (x) -> f32;
                      max_pool2d_backward (gy, argmax) -> gy's dtype; `window`, `ceil_mode`;
                      operands are fragment inputs (extent fragments, below) */
  FM_OPK_SCATTER,   /* vocab 8: index_add (src, index) -> f32, rows of src added at rows
                      index[m] of the output (scatter fragments, below) */
  FM_OPK_GATHER,    /* vocab 9: take_rows (src, index) -> src's dtype, src read at row
                      index[...] (extent fragments, below) */
  FM_OPK_IOTA,      /* vocab 11: no args; `dtype` (f32 or i64): the element's index along the
                      last dim of the iteration (a row fragment's: its column; below) */
} fm_opkind;

/* XX(NAME, "wire name", kind). Append only: the enum value is not on the wire, but the
 * canonical form spells names, and changing a name changes every fingerprint. */
#define FM_OP_MAP(XX)                                           \
  XX(CONST, "const", FM_OPK_CONST)                              \
  XX(ADD, "add", FM_OPK_BINARY)                                 \
  XX(SUB, "sub", FM_OPK_BINARY)                                 \
  XX(MUL, "mul", FM_OPK_BINARY)                                 \
  XX(DIV, "div", FM_OPK_BINARY)                                 \
  XX(MAXIMUM, "maximum", FM_OPK_BINARY)                         \
  XX(MINIMUM, "minimum", FM_OPK_BINARY)                         \
  XX(POW, "pow", FM_OPK_POW)                                    \
  XX(NEG, "neg", FM_OPK_UNARY)                                  \
  XX(ABS, "abs", FM_OPK_UNARY)                                  \
  XX(RELU, "relu", FM_OPK_UNARY)                                \
  XX(GELU, "gelu", FM_OPK_UNARY)                                \
  XX(GELU_TANH, "gelu_tanh", FM_OPK_UNARY)                      \
  XX(SILU, "silu", FM_OPK_UNARY)                                \
  XX(SIGMOID, "sigmoid", FM_OPK_UNARY)                          \
  XX(TANH, "tanh", FM_OPK_UNARY)                                \
  XX(EXP, "exp", FM_OPK_UNARY)                                  \
  XX(LOG, "log", FM_OPK_UNARY)                                  \
  XX(SQRT, "sqrt", FM_OPK_UNARY)                                \
  XX(RSQRT, "rsqrt", FM_OPK_UNARY)                              \
  XX(GT, "gt", FM_OPK_COMPARE)                                  \
  XX(GE, "ge", FM_OPK_COMPARE)                                  \
  XX(LT, "lt", FM_OPK_COMPARE)                                  \
  XX(LE, "le", FM_OPK_COMPARE)                                  \
  XX(EQ, "eq", FM_OPK_COMPARE)                                  \
  XX(NE, "ne", FM_OPK_COMPARE)                                  \
  XX(WHERE, "where", FM_OPK_WHERE)                              \
  XX(CAST, "cast", FM_OPK_CAST)                                 \
  XX(MM, "mm", FM_OPK_MATMUL)                                   \
  XX(ADDMM, "addmm", FM_OPK_MATMUL)                             \
  XX(BMM, "bmm", FM_OPK_MATMUL)                                 \
  XX(SUM, "sum", FM_OPK_REDUCE)                                 \
  XX(MEAN, "mean", FM_OPK_REDUCE)                               \
  XX(AMAX, "amax", FM_OPK_REDUCE)                               \
  XX(VAR, "var", FM_OPK_REDUCE)                                 \
  XX(SOFTMAX, "softmax", FM_OPK_COMPOSITE)                      \
  XX(LAYER_NORM, "layer_norm", FM_OPK_COMPOSITE)                \
  XX(RMS_NORM, "rms_norm", FM_OPK_COMPOSITE)                    \
  XX(ERF, "erf", FM_OPK_UNARY)                                  \
  XX(CAT, "cat", FM_OPK_CAT)                                    \
  XX(COS, "cos", FM_OPK_UNARY)                                  \
  XX(SIN, "sin", FM_OPK_UNARY)                                  \
  XX(MAX_POOL2D, "max_pool2d", FM_OPK_WINDOW)                   \
  XX(MAX_POOL2D_BACKWARD, "max_pool2d_backward", FM_OPK_WINDOW) \
  XX(MAX_POOL2D_ARGMAX, "max_pool2d_argmax", FM_OPK_WINDOW)     \
  XX(INDEX_ADD, "index_add", FM_OPK_SCATTER)                    \
  XX(TAKE_ROWS, "take_rows", FM_OPK_GATHER)                     \
  XX(FLOOR_DIV, "floor_div", FM_OPK_BINARY)                     \
  XX(IOTA, "iota", FM_OPK_IOTA)

typedef enum {
#define FM_OP_ENUM_(name, str, kind) FM_OP_##name,
  FM_OP_MAP(FM_OP_ENUM_)
#undef FM_OP_ENUM_
      FM_OP__COUNT
} fm_op;

const char *fm_op_name(fm_op op);
fm_opkind fm_op_kind(fm_op op);
/* Number of args the op takes (0..3; max_pool2d and its argmax 1, its backward 2); -1 for reserved ops;
 * for a composite op the most it takes (layer_norm: x[, weight[, bias]]; rms_norm: x[, weight]; softmax: x); for cat
 * the most, FM_MAX_ARGS (it takes FM_MIN_CAT_ARGS or more). */
int fm_op_arity(fm_op op);
/* True when a primitive op takes n args (cat: FM_MIN_CAT_ARGS..FM_MAX_ARGS; others: their
 * arity). */
int fm_op_nargs_ok(fm_op op, uint32_t n);
/* How many of an op's nargs leading args it reads as values: all but index_add's and
 * take_rows' index (their last), which names rows. */
uint32_t fm_op_data_args(fm_op op, uint32_t nargs);
/* The vocabulary version that introduced op (1 to FM_VOCAB_VERSION; 0 for reserved ops). */
uint32_t fm_op_vocab(fm_op op);
/* FM_OK, or FM_EUNKNOWN_OP for a name not in FM_OP_MAP. */
int fm_op_parse(const char *s, size_t len, fm_op *out);

typedef struct fm_tensor {
  uint32_t id; /* value id */
  fm_dtype dtype;
  uint32_t rank;
  int64_t shape[FM_MAX_RANK];   /* FM_DIM_SYMBOLIC allowed in shape[0] only */
  int64_t strides[FM_MAX_RANK]; /* elements */
  uint32_t align;               /* bytes, power of two, 1..FM_MAX_ALIGN */
} fm_tensor;

typedef struct fm_opnode {
  fm_op op;
  uint32_t out; /* value id defined here */
  uint32_t nargs;
  uint32_t args[FM_MAX_ARGS]; /* value ids defined earlier (nargs of them) */
  double value;               /* FM_OP_CONST; eps of layer_norm/rms_norm (wire only) */
  fm_dtype dtype;             /* result dtype: inferred by validation; given for cast */
  /* Reductions (vocab 2). `dim` is the reduced dim as the client wrote it (-1 or rank-1;
   * vocab 5: 0 or -2 of a rank-2 value, a column reduction; any other is refused); canonical
   * form: -1, or 0 for a column reduction (the only case it is packed). `keepdim` only says
   * which output shape the client meant; the canonical form drops it (reduced values always
   * have the keepdim shape: [..., 1], [1, N] for columns). `correction` (var only): 0
   * (population) or 1 (Bessel, torch's default). */
  /* cat (vocab 6): the dim along which it concatenates, as written (-rank..rank-1); validation
   * makes it non-negative (the canonical form, always packed). */
  int32_t dim;
  uint8_t keepdim;
  uint8_t correction;
  /* Window ops (vocab 7): [kh, kw, sh, sw, ph, pw, dh, dw] (FM_WIN_*) and PyTorch's ceil_mode;
   * zero on every other op (the canonical form packs them on window ops only). */
  int32_t window[FM_WIN__N];
  uint8_t ceil_mode;
} fm_opnode;

typedef struct fm_fragment {
  uint32_t vocab;
  /* The M bucket of a GEMM or column fragment with a symbolic M (wire key `m_hint`,
   * optional): the batch size the client expects, so the tuner times candidates at the size
   * they will run at. The canonical form rounds it up to a power of two (so nearby batch
   * sizes share one kernel and key) and drops it from every fragment that is not a symbolic
   * GEMM or column fragment; 0: none. */
  uint64_t m_hint;
  uint32_t n_inputs, n_ops, n_outputs;
  fm_tensor inputs[FM_MAX_INPUTS];
  fm_opnode ops[FM_MAX_OPS];
  fm_tensor outputs[FM_MAX_OUTPUTS];
} fm_fragment;

/* Row fragments (vocab 2). A fragment with at least one reduction is a *row fragment*. Its
 * row shape R = [d0, ..., d(r-2), N] is outputs[0]'s shape with the last dim replaced by N,
 * the largest last dim of any tensor. Every value is either row-shaped ([..., N]: an input
 * whose last dim is N, or a pointwise op over one) or per-row ([..., 1]: a reduction, an
 * input with last dim 1, a const, or a pointwise op over only those); pointwise ops mix them
 * (broadcast). Reductions reduce the last dim of a row-shaped float value and give a per-row
 * value of the same dtype: a reduction of a per-row value is refused ("nested reduction").
 * Inputs broadcast to R ([..., N], [1, N], [..., 1], all-1 scalars); an output storing a
 * row-shaped value has shape R, one storing a per-row value [d0, ..., d(r-2), 1] or, with
 * keepdim=false, [d0, ..., d(r-2)] (validation appends the 1: that is the canonical shape).
 * N must be static (a rank-1 symbolic fragment cannot reduce) and <= FM_MAX_ROW. */

/* GEMM fragments (vocab 3). A fragment with an mm or addmm is a *GEMM fragment*: one matrix
 * product (or two *siblings*, below), whose A [M, K] and B [K, N] are rank-2 fragment inputs
 * of the same dtype (bf16 or f16) that nothing else reads; `mm` args [A, B], `addmm` args [bias, A, B]
 * (= bias + A@B, bias any value of A's dtype broadcasting to [M, N]). The result has A's
 * dtype but is computed with fp32 accumulation and stays fp32 in registers (no rounding)
 * like every other intermediate. Every other value is pointwise over the iteration shape
 * [M, N] (the epilogue); outputs are [M, N]; other inputs broadcast to [M, N] and may be
 * written with rank 1 ([N]) or rank 0, which validation turns into [1, N] / [1, 1] (the
 * canonical shape). M may be the symbolic dim 0 (A's and the outputs'); K and N are
 * static. Layouts: A and B each row- or column-major (stride 1 in one of the two dims);
 * anything else is FM_EUNSUPPORTED, as is a reduction in a GEMM fragment.
 *
 * Siblings: a GEMM fragment may hold a second mm / addmm that shares A (the same value) with
 * the first, by another input B2 of B's shape and dtype (SwiGLU's gate and up projections,
 * or two of Q, K, V); both products are [M, N] values of one epilogue (silu(g) * u). Any
 * other second product, or a third, is FM_EUNSUPPORTED. No new op: a daemon that predates
 * siblings refuses the fragment as FM_EUNSUPPORTED and the client runs the two GEMMs apart.
 *
 * Batched GEMM fragments (vocab 4): the product is a `bmm` (args [A, B]) of rank-3 inputs
 * A [Bt, M, K] and B [Bt, K, N]: Bt products at once, each batch's matrix row- or
 * column-major as above, any static batch stride (0: one matrix expanded over the batch).
 * The iteration shape is [Bt, M, N]; dim 0 (the batch) may be the symbolic dim (its size
 * is the launch's outer, and m_hint then hints the batch count), M, K and N are static.
 * Outputs are [Bt, M, N]; other inputs broadcast to it and may be written with rank < 3
 * (right-aligned: [N] -> [1, 1, N], [M, N] -> [1, M, N]; validation adds the leading 1s). */
int fm_fragment_is_gemm(const fm_fragment *f);
/* True for a batched GEMM fragment (its product is a bmm). */
int fm_fragment_is_bmm(const fm_fragment *f);
/* Index of the GEMM fragment's matmul op (valid GEMM fragment), or -1. */
int fm_fragment_gemm_op(const fm_fragment *f);
/* Index of a GEMM fragment's second (sibling) matmul op, or -1 when it has one. */
int fm_fragment_gemm_op2(const fm_fragment *f);

/* Chains (fm_fragment_is_chain): a GEMM fragment whose second product's A is a value
 * computed from the first product (not an input): back-to-back GEMMs, `gelu(x @ W1 + b1) @
 * W2 + b2 + x` with the [M, N1] intermediate never in memory. Stage 1 is the first product
 * and what is computed from it, up to the second product's A (iteration [M, N1]); stage 2 the
 * second product and what is computed from it ([M, N2]). That A is rounded to its dtype
 * before the second product (a tensor core operand; what eager does with the bf16
 * intermediate). Every output stores a stage-2 value; no stage-2 op reads a stage-1 value
 * but through the second product; an input read in stage 1 broadcasts to [M, N1], one read
 * in stage 2 to [M, N2]; B2 is an input [N1, N2] that nothing else reads. PROTOCOL.md,
 * "Chains", is normative. */
int fm_fragment_is_chain(const fm_fragment *f);

/* Integer values (vocab 10, fm_fragment_integer.c). An i64 value is an i64 input read as data
 * (not as index_add's or take_rows' index), or the result of an op on one: add, sub, mul,
 * maximum, minimum, neg, abs (i64, wrapping as torch's int64 does), `floor_div` by a nonzero
 * integer const (i64, rounding toward -inf), div (true division: f32 of the two operands as
 * f32, as torch), the comparisons (bool), where (i64), a cast to i64 of a bool or an i64, and
 * casts of an i64 to bool or a float. The other operand of such an op is an i64 value, a
 * bool or an integer const of magnitude at most FM_MAX_INT_CONST (exact in f32); a float
 * value or a const with a fraction is refused (the client casts the i64 first, which is what
 * torch's promotion does). Such values run in pointwise fragments only. PROTOCOL.md,
 * "Integer values", is normative. */
#define FM_MAX_INT_CONST (1 << 24)
/* True when a validated fragment holds an integer value (an op reading an i64 value as data,
 * an i64 result, an i64 output): its lowest covering vocabulary is FM_VOCAB_INTEGER. */
int fm_fragment_has_integers(const fm_fragment *f);
/* Whether an integer const of this value may meet an i64 value: integral, |c| <= 2^24. */
int fm_int_const_ok(double c);

/* iota (vocab 11, FM_OPK_IOTA): no args, `dtype` f32 or i64 (required, as a cast's). Its value
 * at an element is the element's index along the last dim of the iteration shape: 0..N-1 in
 * a row fragment (its row's column), 0 in a rank-0 one; torch.arange(N) broadcast over the
 * iteration, without reading it. An f32 iota needs a static last dim of at most
 * FM_MAX_INT_CONST (every index exact); an i64 one is an integer value (above: pointwise
 * fragments only). It runs in pointwise and row fragments: in a GEMM, column, extent or
 * scatter fragment it is FM_EUNSUPPORTED (the client reads an arange there). */
/* True when a validated fragment has an iota (its lowest covering vocabulary is then
 * FM_VOCAB_IOTA). */
int fm_fragment_has_iota(const fm_fragment *f);
typedef struct fm_chain_info {
  int op1, op2;                   /* the two products' op indices */
  int a2;                         /* position of the second A (n_inputs + op index) */
  uint8_t stage[FM_MAX_OPS];      /* 1, 2, or 0: computed from inputs and consts only */
  uint8_t need[FM_MAX_OPS];       /* bit 0: needed by stage 1, bit 1: by stage 2 (0: dead) */
  uint8_t in_need[FM_MAX_INPUTS]; /* the same for inputs (the matrix operands: 0) */
} fm_chain_info;
/* The stages of a chain (ids defined before use; validation has checked the rest, or is
 * checking it: it calls this). FM_EUNSUPPORTED with the reason for a stage rule broken. */
int fm_fragment_chain_info(const fm_fragment *f, fm_chain_info *ci, fm_diag *d);

/* Expands composite ops (softmax, layer_norm, rms_norm) in place into the primitive ops
 * PROTOCOL.md spells out, so that both spellings share a canonical form and a key. The
 * composite's `out` id names the final op; the intermediate values get fresh ids above
 * FM_MAX_VALUE_ID. fm_fragment_decode calls it; C code building fragments may call it
 * before fm_fragment_validate. FM_ELIMIT when the expansion exceeds FM_MAX_OPS. */
int fm_fragment_expand(fm_fragment *f, fm_diag *d);

/* True if f (validated) has a reduction over the last dim: it is a row fragment, served by the
 * rows template. */
int fm_fragment_is_rows(const fm_fragment *f);

/* Column fragments (vocab 5, fm_fragment_is_cols): reductions over dim 0 of a rank-2 value,
 * `grad.sum(0)` of a bias gradient. A reduction (sum, mean, amax) with dim 0 (or -2) in a
 * fragment whose tensors have rank <= 2, at least one rank 2, makes it a column fragment
 * (rank-1 fragments reduce their last dim, which is dim 0 too: row fragments). The column
 * space is [M, N]: M the dim 0 of the inputs that have one other than 1 (the symbolic dim
 * or static; 1 when none has), N the largest dim 1 of any tensor (static). Inputs have rank
 * 2 and broadcast to [M, N] ([M, N], [1, N], [M, 1], [1, 1]); lower ranks get 1s prepended
 * (stride 0; the canonical shape), any strides. Each value is
 *   - column-space (FM_COLS_SPACE): an input whose dim 0 is M, or an op with such an arg:
 *     evaluated per element before the reductions (a prologue);
 *   - per column, before any reduction (FM_COLS_PRE): an input whose dim 0 is 1 (M > 1), a
 *     const, or an op over such values only;
 *   - per column, from a reduction (FM_COLS_POST): a reduction (over dim 0 of a column-space
 *     float value: sum, mean = sum / M with the launch's M, amax propagating NaN; fp32
 *     accumulation; the operand's dtype), or an op over per-column values reading one.
 * FM_EUNSUPPORTED: var over dim 0; a column-space op reading a reduction's result (a second
 * pass over the rows); a reduction of a per-column value ("nested reduction"); last-dim and
 * dim-0 reductions mixed; a matrix product; an output of a column-space value (the kernel
 * writes column results only); a fragment that says vocab < 5 ("only the last dim (-1) can
 * be reduced", what a vocabulary-4 daemon answers); no output depending on a reduction.
 * Outputs store per-column values, shape [1, N] or [N] (keepdim=false; validation prepends
 * the 1: canonical). M = 0 is a valid launch: sum 0, mean NaN, amax -inf. */
enum { FM_COLS_SPACE = 1, FM_COLS_PRE = 2, FM_COLS_POST = 3 };
int fm_fragment_is_cols(const fm_fragment *f);
typedef struct fm_cols_info {
  int64_t m;                     /* M: static, or FM_DIM_SYMBOLIC (the launch's outer) */
  int64_t n;                     /* N: static */
  uint8_t in_cls[FM_MAX_INPUTS]; /* FM_COLS_SPACE or FM_COLS_PRE */
  uint8_t op_cls[FM_MAX_OPS];    /* FM_COLS_SPACE, FM_COLS_PRE or FM_COLS_POST */
} fm_cols_info;
/* The column space and every value's class of a column fragment whose tensors are rank 2
 * (validation has prepended the 1s, or is doing so: it calls this); FM_EUNSUPPORTED with the
 * reason for a class rule broken (above), FM_EINVAL for what is no column fragment. */
int fm_fragment_cols_info(const fm_fragment *f, fm_cols_info *ci, fm_diag *d);

/* Cat fragments (vocab 6, fm_fragment_is_cat): pointwise fragments with a `cat`. Each value
 * has an *extent*, a shape of the iteration rank: an input's is its shape; a const's is all 1s;
 * an elementwise op's is the broadcast of its operands' (each dim equal, or 1); a cat's is its
 * operands' broadcast with their sizes along `dim` added up (a window op's: below). Evaluating
 * a value at an index evaluates its operands at the same index (index 0 along their size-1
 * dims: broadcast; a window op loads its inputs itself, at its taps), and a cat at index i
 * along dim evaluates the operand whose range holds i at i minus the sizes
 * before it, so every input is read inside its shape. Rules (FM_ESCHEMA unless said): every
 * tensor has the rank of outputs[0]; an op's operands broadcast; a cat's operands are static
 * along dim (not the symbolic dim 0); each output's value broadcasts to the output's shape (the
 * iteration shape); an input no op reads broadcasts to it too. FM_EUNSUPPORTED: a cat whose
 * operand depends on another cat (nested), a cat in a row, column or GEMM fragment. */
int fm_fragment_is_cat(const fm_fragment *f);

/* Window ops (vocab 7, FM_OPK_WINDOW): 2-D max pooling over the last two dims (H, W) of a
 * rank >= 3 fragment input x, as torch.nn.functional.max_pool2d(x, kernel, stride, padding,
 * dilation, ceil_mode), and its gradient from the windows' argmax tap indices (no int64
 * indices tensor: Inductor's offsets, a small integer per window).
 * Window (oh, ow) has taps t = i*kw + j (i < kh outer, j < kw inner) at h = oh*sh - ph + i*dh,
 * w = ow*sw - pw + j*dw; taps outside x are skipped (padding never wins).
 *   max_pool2d [x]: m = -inf; over the in-bounds taps in scan order, m = x[t] when x[t] > m
 *     or x[t] is NaN (NaN propagates; a window without an in-bounds tap gives -inf).
 *   max_pool2d_argmax [x]: the tap the same scan keeps (best = the first in-bounds tap,
 *     replaced whenever m is: PyTorch's argmax), as its index t, an exact integer in fp32
 *     (f32; -1 for a window without an in-bounds tap). Stored through a cast, f16 holds every
 *     index of a window up to 2049 taps.
 *   max_pool2d_backward [gy, argmax]: grad_x[.., h, w] = the sum (fp32, ascending (oh, ow))
 *     of gy[.., oh, ow] over the windows that have (h, w) as their tap argmax[.., oh, ow];
 *     gy's dtype; argmax of a float dtype that holds kh*kw - 1 exactly. x's H and W are the
 *     iteration shape's (outputs[0]).
 * Each pooled size is PyTorch's pooling_output_shape (fm_window_pooled) and at least 1; the
 * operands are fragment inputs (FM_EUNSUPPORTED otherwise), whose dims the op reads whole.
 * A window op makes the fragment an *extent fragment* (below): max_pool2d's and its argmax's
 * extent is x's with the last two dims pooled; the backward's is gy's leading dims and the
 * iteration shape's last two, which must pool to gy's, and the argmax's extent must be gy's.
 * A window op in a row, column or GEMM fragment is FM_EUNSUPPORTED, as a cat is. The window's
 * limits are FM_ELIMIT, its other rules (and `window` or `ceil_mode` on another op)
 * FM_ESCHEMA. */
/* The pooled size of a dim of size `in` (axis 0: H, 1: W) under window (FM_WIN_* layout):
 * floor_or_ceil((in + 2p - d*(k-1) - 1) / s) + 1, with ceil_mode one less when the last
 * window would start at or past in + p; < 1 when no window fits. */
int64_t fm_window_pooled(int64_t in, const int32_t *window, int axis, int ceil_mode);

/* Scatter fragments (vocab 8, fm_fragment_is_scatter): the one op `index_add` [src, index] of
 * two fragment inputs, src [M, D] (bf16, f16 or f32, any strides) and index [M] (i64, any
 * stride), and one output [R, D], f32, row-major contiguous (strides [D, 1]), that stores it:
 *   for every m < M, d < D:  out[index[m], d] += f32(src[m, d])
 * by atomic adds INTO WHAT THE OUTPUT HOLDS: the caller zeroes it (torch.zeros(R, D)
 * .index_add_(0, index, src.float())), and the sums land in any order (not bitwise
 * reproducible, as torch's CUDA index_add_ is not). An index outside [0, R) stops the kernel
 * (a device trap, as torch's device-side assert): no address outside the output is written.
 * Static sizes only; anything else in the fragment, another op, a symbolic dim, another
 * output dtype or layout is FM_EUNSUPPORTED; an index not i64 or of another length, a src
 * that is no float or whose D differs from the output's, FM_ESCHEMA. Launched as a
 * pointwise kernel (kind "pointwise", grid rule "elementwise"). */
int fm_fragment_is_scatter(const fm_fragment *f);
/* The input positions of a scatter fragment's src and index (its one op's operands): FM_OK, or
 * FM_EINVAL for a fragment without that one op over two distinct inputs and one output. */
int fm_fragment_scatter_inputs(const fm_fragment *f, uint32_t *src, uint32_t *index);

/* Extent fragments: a pointwise fragment with a cat, a window op or take_rows, whose values
 * each have an extent (below) so that every input is read inside its shape; served by the
 * pointwise template's extent ("CAT path") form and evaluated by the reference element by
 * element.
 *
 * take_rows (vocab 9) [src, index], two fragment inputs of the iteration's rank, static sizes
 * (a symbolic dim 0 is FM_EUNSUPPORTED): src of any dtype but i64 and any strides, its dim 0
 * (S rows) free, its other dims the iteration's or 1; index i64, broadcasting to the
 * iteration shape like any operand. At
 * element (c0, c1, ...):
 *   take_rows = src[i, c1, ...]   with i = index[c0, c1, ...], i + S where i < 0
 * (torch.gather(src, 0, index) with src's other dims broadcast, as x[index] is for a 1-D
 * index read as [T, 1, ...]). Its extent is the index's along dim 0 and the broadcast of both
 * along the others. An index outside [-S, S) stops the kernel (a device trap, as torch's
 * device-side assert): no address outside src is read. `i64` appears as take_rows' index and
 * index_add's, nowhere else. */
int fm_fragment_is_extent(const fm_fragment *f);
typedef struct fm_cat_info {
  uint32_t rank;
  /* each value's extent: inputs 0..n_inputs-1, then ops (FM_DIM_SYMBOLIC in dim 0 follows
   * the launch's outer) */
  int64_t ext[FM_MAX_INPUTS + FM_MAX_OPS][FM_MAX_RANK];
} fm_cat_info;
/* The extents of an extent fragment's values (validation has checked it, or is checking it:
 * it calls this and normalizes each cat's dim); the reason in d for a rule broken (a window
 * op: rank >= 3, each pooled size >= 1, gy's extent; FM_ESCHEMA). */
int fm_fragment_cat_info(const fm_fragment *f, fm_cat_info *ci, fm_diag *d);

/* Decodes the wire form (a msgpack map) into *out and validates it (fm_fragment_validate).
 * Any failure returns a negative fm_err with a precise reason in d ("ops[3].args[1]: value 9
 * is not defined before use"). Never reads outside obj. */
int fm_fragment_decode(const msgpack_object *obj, fm_fragment *out, fm_diag *d);

/* Checks every rule in the header comment and the limits, and fills each op's result dtype.
 * Errors: FM_ELIMIT (a limit), FM_EUNKNOWN_OP, FM_EUNSUPPORTED (reserved op),
 * FM_ESCHEMA (anything else malformed: undefined/duplicate ids, bad arity, shape mismatch,
 * dtype mismatch, second symbolic dim, ...). */
int fm_fragment_validate(fm_fragment *f, fm_diag *d);

/* Canonical form of a valid fragment: equivalent fragments become identical.
 *  - ops reachable from the outputs only, ordered by a depth-first post-order walk from
 *    outputs[0], outputs[1], ... (args visited in order);
 *  - value ids renumbered densely: inputs 0..n_inputs-1 in their given order (the order is
 *    the kernel's parameter order, so it is meaningful), then op results in op order;
 *  - strides of size-1 dims set to 0 (they are never used), align clamped to 16
 *    (the widest access codegen uses) so that irrelevant differences do not split the cache. */
int fm_fragment_canonicalize(const fm_fragment *in, fm_fragment *out);

/* Packs f in wire form with a fixed key order (the order in the header comment); optional
 * fields only where meaningful (value for const, dtype for cast, dim 0 for a reduction over
 * dim 0, a cat's dim, correction for var, window and ceil_mode for a window op). For a canonical fragment
 * these are the canonical bytes that go into the fingerprint and the cache. */
int fm_fragment_pack(const fm_fragment *f, msgpack_packer *pk);

/* Convenience: canonicalize + pack into a fresh malloc'd buffer (*out, *len; free()). */
int fm_fragment_canonical_bytes(const fm_fragment *f, uint8_t **out, size_t *len);

/* True if the iteration shape has a symbolic dim 0 (a column fragment's: its M). */
int fm_fragment_is_symbolic(const fm_fragment *f);

#endif
