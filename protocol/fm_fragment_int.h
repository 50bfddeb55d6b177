/* fm_fragment_int.h: INTERNAL to protocol/ (the API is fm_fragment.h): what the files that
 * validate one kind of fragment share with fm_fragment_validate. */
#ifndef FM_FRAGMENT_INT_H
#define FM_FRAGMENT_INT_H

#include "fm_fragment.h"

/* Position of value id among the inputs (k) or the ops (n_inputs + i), or -1. */
int fm_fragment_find_value(const fm_fragment *f, uint32_t id);

/* [N] -> [1, N], [] -> [1, 1] up to `rank`: torch's right-aligned broadcast, the added dims
 * stride 0 (the canonical shape of a low-rank operand of a GEMM or column fragment). */
void fm_fragment_prepend_ones(fm_tensor *t, uint32_t rank);

/* Column fragments' rules (fm_fragment.h), for fm_fragment_validate once the dataflow is
 * checked (ids, arity, dtypes): the reductions' dims, the shapes (inputs of rank < 2 get
 * their leading 1s, [N] outputs become [1, N]: the canonical shapes), the value classes, the
 * outputs. */
int fm_fragment_check_cols(fm_fragment *f, fm_diag *d);

/* Extent fragments' rules (fm_fragment.h), for fm_fragment_validate once the dataflow is
 * checked: every value's extent (fm_fragment_cat_info), each cat's dim made non-negative. */
int fm_fragment_check_cat(fm_fragment *f, fm_diag *d);

/* An extent as "[2, -1, 8]" into out (cap bytes), for diagnostics. */
void fm_fragment_format_extent(const int64_t *e, uint32_t r, char *out, size_t cap);

/* Window ops (fm_fragment.h): the ranges of op's window (path names the op in d), for
 * fm_fragment_validate; and the extent e of window op i of an extent fragment from its
 * operands' extents in ci (its operands inputs, each pooled size >= 1, gy's extent), for
 * fm_fragment_cat_info. */
int fm_fragment_check_window(const fm_opnode *op, const char *path, fm_diag *d);
int fm_fragment_window_extent(const fm_fragment *f, const fm_cat_info *ci, uint32_t i, int64_t *e, fm_diag *d);

/* Scatter fragments' rules (fm_fragment.h), for fm_fragment_validate once the dataflow is
 * checked (index_add's operands are inputs of a float and the i64 dtype): one op, the shapes,
 * the output's dtype and layout, static sizes; the overlap check of its output included. */
int fm_fragment_check_scatter(const fm_fragment *f, fm_diag *d);

/* iota's placement (fm_fragment.h), for fm_fragment_validate once the fragment's kind is
 * known: a pointwise or row fragment only; an f32 iota's last dim static and <= 2^24. */
int fm_fragment_check_iota(const fm_fragment *f, fm_diag *d);

#endif
