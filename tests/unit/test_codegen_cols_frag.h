/* test_codegen_cols_frag.h: column fragments (vocab 5: reductions over dim 0) for the cols
 * template's tests, built as structs, validated and canonicalized through the real protocol
 * code. */
#ifndef TEST_CODEGEN_COLS_FRAG_H
#define TEST_CODEGEN_COLS_FRAG_H

#include "fm_fragment.h"

/* A reduction of arg over dim 0 (sum, mean, amax). */
void cf_reduce(fm_fragment *f, fm_op op, uint32_t out, uint32_t arg);

/* The test column fragments:
 *   0 cols_bias_grad_bf16 (the golden): the bias gradient grad.sum(0) of grad [-1, 1024] bf16,
 *     output [1024] (keepdim=false);
 *   1 a prologue and an epilogue: (g * s).sum(0) of g [-1, 512] bf16 (row stride 520) and a
 *     per-column f32 scale [512], cast to bf16; the f32 sum a second output;
 *   2 every statistic of an f16 [-1, 100] (N not a multiple of 8: the scalar form): sum,
 *     mean, amax as f32;
 *   3 a column-major f32 [300, 48] (static M, scalar form) times a per-row [300, 1] input:
 *     mean and amax, then amax * 0.5 + bias [1, 48];
 *   4 where(mask, x, 0).sum(0) of a bool mask and x, [-1, 256] bf16 (bool vector loads);
 *   5 one column: x [-1, 1] f32, sum. */
#define CF_N_FRAGMENTS 7
int cf_fragment(int which, fm_fragment *canon);
extern const char *const cf_name[CF_N_FRAGMENTS];

#endif
