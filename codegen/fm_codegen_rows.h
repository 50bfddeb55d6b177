/* fm_codegen_rows.h: INTERNAL to codegen/ (the API is fm_codegen.h): the rows template's
 * plan, shared by its two files:
 *   fm_codegen_rows_plan.c  fragment -> plan (values, classes, row shape, addressing, vector);
 *   fm_codegen_rows.c       the kernel around the plan, configs, candidates and metadata.
 * The per-op expressions come from fm_codegen_ops.c (fm_cg_emit_op): one op table. */
#ifndef FM_CODEGEN_ROWS_H
#define FM_CODEGEN_ROWS_H

#include "fm_codegen_int.h"

typedef struct fm_cg_rows_plan {
  fm_cg_plan base;           /* n_in/n_out/n_ops, vdt, args, live; rowval = whole-row value;
                                t[k]: dtype, align, value, es = strides (0 where broadcast),
                                access: FM_CG_VECTOR (row input), FM_CG_SCALAR (per row) */
  uint32_t rank;             /* row rank r: dims 0..r-2 enumerate rows, dim r-1 is the row */
  int64_t n;                 /* row length N */
  int symbolic;              /* dim 0 is a launch argument */
  int64_t outer;             /* static dim 0 (1 for rank 1), -1 when symbolic */
  int64_t rows_per_outer;    /* product of dims 1..r-2 */
  uint8_t row_t[FM_CG_MAX_TENSORS]; /* tensor's last dim is N (> 1) */
  uint32_t max_vec;          /* widest vector (elements) every live row tensor allows */
} fm_cg_rows_plan;

int fm_cg_rows_plan_build(const fm_fragment *f, fm_cg_rows_plan *rp, fm_diag *d);

#endif
