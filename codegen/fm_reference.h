/* fm_reference.h: a CPU reference evaluator for fragments (after llm.c: a reference next to
 * every kernel). GPU tests check generated kernels against it, and the tuner verifies every
 * candidate against it before timing any.
 *
 * Semantics are those of the fragment IR (fm_fragment.h), evaluated independently of the
 * code generator:
 *  - every element of the iteration shape (outputs[0].shape, dim 0 = `outer` when it is
 *    symbolic) is computed once; tensors are addressed by their strides (elements), a dim of
 *    size 1 in an input is broadcast (its stride ignored);
 *  - inputs are decoded exactly (bf16/f16/f32/bool as stored), every op is computed in fp64
 *    (bool as 0/1), with the same special cases as the kernels: NaN propagates through
 *    maximum/minimum/relu, gelu is erf-based, gelu_tanh is PyTorch's tanh approximation,
 *    pow by a const uses x*x, x*x*x, x, sqrt, 1/sqrt, 1/x, 1/(x*x) for 2, 3, 1, 0.5, -0.5,
 *    -1, -2; a `const` is its value rounded to fp32 (a Python scalar meets fp32 math);
 *  - rounding happens at a `cast` and when storing an output, as fp64 -> fp32 (overflow to
 *    inf) -> the output dtype with round-to-nearest-even, NaN kept quiet; bool stores 0/1.
 *  - row fragments (a reduction; fm_fragment.h): per row, sum/mean/amax/var over the N
 *    elements of a whole-row value in fp64 (mean = sum / N; var two-pass around the mean,
 *    divided by N - correction, so N == correction gives NaN like torch; amax propagates
 *    NaN); a per-row value broadcasts along the row; a per-row output stores one element
 *    per row (its last dim is 1).
 *  - column fragments (reductions over dim 0; fm_fragment.h): column by column over the
 *    [M, N] space (M = `outer` when symbolic, 0 allowed): the per-column values before the
 *    reductions, then every row's column-space ops in fp64 with each reduction accumulated
 *    (sum; mean = sum / M, NaN for M = 0; amax propagating NaN, -inf for M = 0), then the
 *    per-column values after them; each output ([1, N]) gets one element per column.
 *  - GEMM fragments (mm / addmm): the product at (m, n) is the fp64 sum over k of
 *    A[m, k] * B[k, n] (operands decoded exactly), not rounded (kernels keep it fp32);
 *    addmm adds its bias in fp64; the epilogue then runs per element as above. bmm: the
 *    same per product z of the [Bt, M, N] iteration, over A[z, m, k] * B[z, k, n] (a batch
 *    dim of 1 is the one matrix of every product).
 *  - cat fragments (vocabulary 6; fm_fragment.h): element by element as above, except that
 *    a cat at index i along its dim evaluates the operand whose range holds i, at i minus
 *    the sizes of the operands before it, and that operand's inputs are read there.
 *  - window ops (vocabulary 7; fm_fragment.h): max_pool2d scans its window's in-bounds taps
 *    of x (NaN sticks); max_pool2d_backward sums, in fp64 and ascending (oh, ow), gy over
 *    the windows covering its element whose argmax scan (the first in-bounds tap, replaced
 *    when the max is) ends on it.
 *  - scatter fragments (vocabulary 8; fm_fragment.h): index_add adds each src row, in fp64
 *    and row order, to the output row its index names, on top of what outputs[0] holds (the
 *    caller zeroes it, as for the kernel), rounded to f32 once.
 * Kernels compute in fp32, so compare with a tolerance (relative error ~1e-6 per op before
 * the final rounding), not bit for bit. */
#ifndef FM_REFERENCE_H
#define FM_REFERENCE_H

#include <stdint.h>

#include "fm_error.h"
#include "fm_fragment.h"

/* Evaluates a valid (canonical or not) fragment on host memory. inputs[k] points at input
 * k's first element (may be NULL for an input no output depends on); outputs[k] at output
 * k's. outer: the size of dim 0 when the fragment is symbolic (>= 0; 0 does nothing),
 * ignored otherwise. FM_EINVAL with the reason in d for a malformed fragment or argument. */
int fm_reference_eval(const fm_fragment *canon, int64_t outer, const void *const *inputs, void *const *outputs,
                      fm_diag *d);

/* Rewrites, in place, the verification inputs that must hold tap indices: each
 * max_pool2d_backward's argmax (its second operand) gets random taps in [0, kh*kw) from seed
 * (random floats would name no tap, and every gradient would be zero). inputs as for
 * fm_reference_eval, each holding its whole span at `outer`; the other inputs are untouched.
 * FM_EINVAL for an operand that is not an input. */
int fm_reference_window_taps(const fm_fragment *canon, int64_t outer, uint64_t seed, void *const *inputs);

/* Rewrites, in place, the i64 index inputs from seed (random bits would name no row): a
 * scatter fragment's (index_add) with rows in [0, R), the first 0, the second R - 1, the rest
 * uniform; each take_rows' with rows of its src in [-S, S), every element of the index's
 * extent: 0, S - 1, -1 and -S first (the ends and their negative spellings), the rest uniform
 * in [0, S). inputs as for fm_reference_eval; FM_OK and nothing done for any other fragment.
 * FM_EINVAL for a scatter's NULL index buffer (take_rows': left alone). */
int fm_reference_index_rows(const fm_fragment *canon, uint64_t seed, void *const *inputs);

/* Rewrites, in place, each i64 input read as data (integer values, vocab 10) from seed: small
 * integers, half uniform in [-1024, 1024], half at the fragment's integer constants or one
 * either side (fm_reference_integer.c); and each input a comparison meets with an iota (vocab
 * 11; directly or through a cast) with columns in [-1, C], C the iteration's last dim, its
 * ends and the values just outside among them. inputs as for fm_reference_eval, each holding
 * its whole span at `outer`; every other input is untouched. */
void fm_reference_integer_inputs(const fm_fragment *canon, int64_t outer, uint64_t seed, void *const *inputs);

/* The largest ||out - ref|| / ||ref|| a kernel's output k may show against fm_reference_eval
 * (NaN never passes): its dtype's rounding (bf16 1e-2, f16 2e-3, f32 1e-4; bool exact), or
 * the loosest `cast` it is computed through, when that rounds coarser. A cast rounds a value
 * the kernel summed in another order than the reference (a product's K, a reduction's row):
 * where the two straddle a rounding step they differ by a step of the cast's dtype, and so
 * may everything computed from it; an f32 output behind a bf16 cast is no closer than bf16. */
double fm_reference_tolerance(const fm_fragment *canon, uint32_t k);

/* The storage conversions it uses (also handy for building test data). */
float fm_reference_bf16_to_f32(uint16_t h);
uint16_t fm_reference_f32_to_bf16(float f);
float fm_reference_f16_to_f32(uint16_t h);
uint16_t fm_reference_f32_to_f16(float f);
/* fp64 -> fp32, round to nearest even, overflowing to +-inf (no undefined conversion). */
float fm_reference_f64_to_f32(double x);

#endif
