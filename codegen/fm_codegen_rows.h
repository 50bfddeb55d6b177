/* fm_codegen_rows.h: INTERNAL to codegen/ (the API is fm_codegen.h): the rows template's
 * plan and kernel shape, shared by its three files:
 *   fm_codegen_rows_plan.c    fragment -> plan (values, classes, row shape, addressing, vector);
 *   fm_codegen_rows.c         the kernel around the plan: the row held in registers, configs,
 *                             candidates and metadata;
 *   fm_codegen_rows_stream.c  the body of the STREAM variant (rows longer than registers hold).
 * The per-op expressions come from fm_codegen_ops.c (fm_cg_emit_op): one op table. */
#ifndef FM_CODEGEN_ROWS_H
#define FM_CODEGEN_ROWS_H

#include "fm_codegen_int.h"

typedef struct fm_cg_rows_plan {
  fm_cg_plan base;                  /* n_in/n_out/n_ops, vdt, args, live; rowval = whole-row value;
                                t[k]: dtype, align, value, es = strides (0 where broadcast),
                                access: FM_CG_VECTOR (row input), FM_CG_SCALAR (per row) */
  uint32_t rank;                    /* row rank r: dims 0..r-2 enumerate rows, dim r-1 is the row */
  int64_t n;                        /* row length N */
  int symbolic;                     /* dim 0 is a launch argument */
  int64_t outer;                    /* static dim 0 (1 for rank 1), -1 when symbolic */
  int64_t rows_per_outer;           /* product of dims 1..r-2 */
  uint8_t row_t[FM_CG_MAX_TENSORS]; /* tensor's last dim is N (> 1) */
  uint32_t max_vec;                 /* widest vector (elements) every live row tensor allows */
} fm_cg_rows_plan;

int fm_cg_rows_plan_build(const fm_fragment *f, fm_cg_rows_plan *rp, fm_diag *d);

/* The shape of one kernel: threads per row, rows per block, vector and chunk counts. A held
 * row is `chunks` chunks of `vec` elements per thread, the whole row; a streamed row is tiles
 * of tpr * ept elements, column j of a tile at fm_t0 + j. */
typedef struct fm_cg_rows_shape {
  uint32_t tpr, rpb, vec, chunks, ept;
  int exact;  /* every column a thread visits is inside the row */
  int ragged; /* the row's length is no multiple of vec: the chunk the row ends in is read and
                 written element by element, and every element is tested, not every chunk */
  int stream; /* the row is streamed in tiles (FM_ROWS_STREAM) */
} fm_cg_rows_shape;

/* Emitters shared by the two bodies (fm_codegen_rows.c): a row input's tile loaded into the
 * register array v<k>[ept], a row output's tile stored from its value's array, and "true" or
 * the test that element i of this thread is inside the row. */
void fm_cg_rows_emit_load_row(fm_strbuf *sb, const fm_cg_rows_plan *rp, const fm_cg_rows_shape *s, uint32_t k);
void fm_cg_rows_emit_store_row(fm_strbuf *sb, const fm_cg_rows_plan *rp, const fm_cg_rows_shape *s, uint32_t k);
void fm_cg_rows_emit_valid(fm_strbuf *sb, const fm_cg_rows_plan *rp, const fm_cg_rows_shape *s, const char *i);
/* A per-row input's element, and op i (not a reduction) as a register array or a scalar. */
void fm_cg_rows_emit_load_per_row(fm_strbuf *sb, const fm_cg_plan *p, uint32_t k);
void fm_cg_rows_emit_op(fm_strbuf *sb, const fm_fragment *f, const fm_cg_plan *p, const fm_cg_rows_shape *s,
                        uint32_t i);

/* The STREAM body, inside the row loop after the row bases (fm_codegen_rows_stream.c):
 * passes over the row's tiles, reductions accumulated per thread then across the block,
 * per-row values as soon as their reductions are done, then a pass that stores. FM_EUNSUPPORTED
 * for a live var. */
int fm_cg_rows_emit_stream_body(fm_strbuf *sb, const fm_fragment *f, const fm_cg_rows_plan *rp,
                                const fm_cg_rows_shape *s, fm_diag *d);
/* How many times the STREAM body reads each row: one pass per level of reductions (an online
 * pair sharing its amax's), one more where a row value is stored. */
uint32_t fm_cg_rows_stream_passes(const fm_fragment *f, const fm_cg_rows_plan *rp);

#endif
