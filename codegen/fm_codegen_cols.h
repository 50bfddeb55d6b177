/* fm_codegen_cols.h: INTERNAL to codegen/ (the API is fm_codegen.h): the cols template's
 * plan, shared by its two files:
 *   fm_codegen_cols_plan.c  fragment -> plan (values, classes, what varies along the columns,
 *                           addressing, whether 8-column vector loads are legal);
 *   fm_codegen_cols.c       the kernel around the plan, configs, candidates and metadata.
 * The per-op expressions come from fm_codegen_ops.c (fm_cg_emit_op): one op table. */
#ifndef FM_CODEGEN_COLS_H
#define FM_CODEGEN_COLS_H

#include "fm_codegen_int.h"

#define FM_COLS_VEC 8u /* columns per thread in the vector form */

typedef struct fm_cg_cols_plan {
  fm_cg_plan base;                /* n_in/n_out/n_ops, vdt, args, live; t[k]: dtype, align, value,
                                es[0..1] = strides (0 where broadcast); rowval = the value varies
                                along the columns (an array over the thread's columns, v<pos>[i]) */
  fm_cols_info info;              /* M (static or FM_DIM_SYMBOLIC), N, the classes (fm_fragment.h) */
  uint8_t cls[FM_CG_MAX_VALUES];  /* FM_COLS_SPACE / PRE / POST per value position */
  uint8_t loop[FM_CG_MAX_VALUES]; /* needed over the rows: column-space, or read there */
  uint8_t epi[FM_CG_MAX_VALUES];  /* needed by the epilogue: stored, or read by what is */
  uint32_t n_red;                 /* live reductions (each an fp32 partial per column) */
  uint32_t col_bytes, row_bytes;  /* the element bytes of the live column-space inputs with
                                      N columns, and of those with one ([M, 1]): a thread loads
                                      V * col_bytes + row_bytes a row */
  int vec_ok;                     /* 8-column vector loads are legal for every live column-space input */
} fm_cg_cols_plan;

int fm_cg_cols_plan_build(const fm_fragment *f, fm_cg_cols_plan *cp, fm_diag *d);

#endif
