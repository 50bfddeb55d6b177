/* fm_reference_int.h: INTERNAL to the CPU reference (the API is fm_reference.h): the
 * primitives fm_reference.c evaluates every fragment kind with, shared with the files that
 * walk one kind of their own (fm_reference_cols.c). */
#ifndef FM_REFERENCE_INT_H
#define FM_REFERENCE_INT_H

#include <stdint.h>

#include "fm_error.h"
#include "fm_fragment.h"

#define REF_MAX_VALUES (FM_MAX_INPUTS + FM_MAX_OPS)

/* The fragment's operands as value positions (inputs 0.., then ops) and what each output
 * stores. */
typedef struct ref_prog {
  uint32_t n_in, n_ops, n_out;
  uint16_t args[FM_MAX_OPS][FM_MAX_ARGS];
  uint16_t out_value[FM_MAX_OUTPUTS];
} ref_prog;

/* FM_EINVAL with the reason for an op that is no primitive or an undefined operand. */
int fm_ref_compile(const fm_fragment *f, ref_prog *pr, fm_diag *d);
/* Element off of a buffer of dtype dt, decoded exactly; x stored rounded to dt. */
double fm_ref_load(fm_dtype dt, const void *base, int64_t off);
void fm_ref_store(fm_dtype dt, void *base, int64_t off, double x);
/* Element (m, n) of rank-2 input k, broadcast along its size-1 dims; NaN when inputs[k] is
 * NULL (promised unused: poison, so a wrong promise shows). */
double fm_ref_load_mn(const fm_fragment *f, const void *const *inputs, uint32_t k, int64_t m, int64_t n);
/* One elementwise op on fp64 operands (bools as 0/1); the larger of a and b, NaN first. */
double fm_ref_op(const fm_opnode *op, double a, double b, double c);
double fm_ref_nan_max(double a, double b);

/* Column fragments (fm_fragment_is_cols): per column, every row's prologue and the
 * reductions in fp64, then the per-column epilogue (fm_reference.h). */
int fm_ref_eval_cols(const fm_fragment *f, const ref_prog *pr, int64_t outer, const void *const *inputs,
                     void *const *outputs, fm_diag *d);

/* Extent fragments (fm_fragment_is_extent): element by element, each cat's operand evaluated
 * at the index shifted into its own range, each window op from its inputs (fm_reference.h). */
int fm_ref_eval_cat(const fm_fragment *f, const ref_prog *pr, int64_t outer, const void *const *inputs,
                    void *const *outputs, fm_diag *d);

/* Window op o (max_pool2d, max_pool2d_backward; operands args, positions of inputs) at idx,
 * the element's coordinates in the iteration rank (0 read along the op's size-1 dims). NaN
 * when an operand's buffer is NULL. */
double fm_ref_window(const fm_fragment *f, uint32_t o, const uint16_t *args, const void *const *inputs,
                     const int64_t *idx);

/* Scatter fragments (fm_fragment_is_scatter): src's rows added in fp64, row by row, to the
 * output rows their index names, on top of outputs[0] as it is (the caller zeroes it, as
 * for the kernel); FM_EINVAL for an index outside [0, R). */
int fm_ref_eval_scatter(const fm_fragment *f, const void *const *inputs, void *const *outputs, fm_diag *d);

#endif
