/* frag_builder.h: builds fm_fragment structs in code (wire form ids, not yet canonical),
 * tracking each value's dtype with the protocol's promotion rule, for the GPU suite and the
 * benchmark. */
#ifndef FM_FRAG_BUILDER_H
#define FM_FRAG_BUILDER_H

#include "fm_fragment.h"

typedef struct fb {
  fm_fragment f;
  uint32_t next_id;
  fm_dtype dt[FM_MAX_OPS + FM_MAX_INPUTS + 8]; /* value id -> dtype */
} fb;

void fb_init(fb *b);
/* Adds an input with the given shape (dim0 may be FM_DIM_SYMBOLIC) and strides
 * (NULL = contiguous); returns its value id. */
uint32_t fb_input(fb *b, fm_dtype dt, uint32_t rank, const int64_t *shape, const int64_t *strides, uint32_t align);
uint32_t fb_const(fb *b, double v);
uint32_t fb_op1(fb *b, fm_op op, uint32_t a);
uint32_t fb_op2(fb *b, fm_op op, uint32_t a, uint32_t c);
uint32_t fb_where(fb *b, uint32_t cond, uint32_t a, uint32_t c);
uint32_t fb_cast(fb *b, uint32_t a, fm_dtype dt);
/* The element's index along the last dim (vocabulary 11; the caller sets b->f.vocab), of dt:
 * f32 or i64. */
uint32_t fb_iota(fb *b, fm_dtype dt);
/* cat([a, c], dim) (vocabulary 6; the caller sets b->f.vocab): the promoted dtype. */
uint32_t fb_cat(fb *b, uint32_t a, uint32_t c, int32_t dim);
/* cat(args[0..n), dim), 2 <= n <= FM_MAX_ARGS. */
uint32_t fb_catn(fb *b, const uint32_t *args, uint32_t n, int32_t dim);
/* Adds an output storing value v, dense, with the iteration shape. */
void fb_output(fb *b, uint32_t v, uint32_t rank, const int64_t *shape);

#endif
