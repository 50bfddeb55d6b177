/* fm_fragment_window.c: the rules of the window ops (vocabulary 7: max_pool2d and its
 * backward; fm_fragment.h): the window's ranges, the pooled sizes, and each op's extent, so
 * that every tap a kernel loads lies inside the input whatever sizes a client sends. */
#include <inttypes.h>
#include <stdio.h>

#include "fm_fragment_int.h"

int64_t fm_window_pooled(int64_t in, const int32_t *window, int axis, int ceil_mode) {
  if (!window || axis < 0 || axis > 1) return 0;
  const int64_t k = window[FM_WIN_KH + axis], s = window[FM_WIN_SH + axis], p = window[FM_WIN_PH + axis],
                dl = window[FM_WIN_DH + axis];
  if (in < 1 || k < 1 || s < 1 || dl < 1 || p < 0) return 0;
  /* PyTorch's pooling_output_shape: div_rtn rounds toward -inf; each term < 2^62 */
  const int64_t num = in + 2 * p - dl * (k - 1) - 1 + (ceil_mode ? s - 1 : 0);
  int64_t out = (num >= 0 ? num / s : -((-num + s - 1) / s)) + 1;
  /* ceil_mode: the last window must start inside the input or its left padding */
  if (ceil_mode && (out - 1) * s >= in + p) out--;
  return out;
}

static const char *const field_name[FM_WIN__N] = {
    "kernel height (kh)",  "kernel width (kw)",  "stride height (sh)",   "stride width (sw)",
    "padding height (ph)", "padding width (pw)", "dilation height (dh)", "dilation width (dw)",
};

int fm_fragment_check_window(const fm_opnode *op, const char *path, fm_diag *d) {
  for (int k = 0; k < FM_WIN__N; k++) {
    const int64_t v = op->window[k];
    if (k == FM_WIN_PH || k == FM_WIN_PW) { /* the kernels (0, 1) are checked by now */
      const int64_t kernel = op->window[k - FM_WIN_PH];
      if (v < 0 || v > kernel / 2)
        return fm_diag_set(d, FM_ESCHEMA,
                           "%s.window[%d]: the %s is %" PRId64 "; pad should be at most half of kernel size %" PRId64
                           " (0 <= p <= k / 2)",
                           path, k, field_name[k], v, kernel);
      continue;
    }
    const int64_t max = k <= FM_WIN_KW ? FM_WINDOW_MAX_KERNEL : FM_WINDOW_MAX_STEP;
    if (v < 1)
      return fm_diag_set(d, FM_ESCHEMA, "%s.window[%d]: the %s is %" PRId64 ", below 1", path, k, field_name[k], v);
    if (v > max)
      return fm_diag_set(d, FM_ELIMIT, "%s.window[%d]: the %s is %" PRId64 ", above the limit of %" PRId64, path, k,
                         field_name[k], v, max);
  }
  return FM_OK;
}

int fm_fragment_window_extent(const fm_fragment *f, const fm_cat_info *ci, uint32_t i, int64_t *e, fm_diag *d) {
  const fm_opnode *op = &f->ops[i];
  const uint32_t r = ci->rank;
  const char *name = fm_op_name(op->op);
  char x_s[160], want_s[160], gy_s[160];
  if (r < 3)
    return fm_diag_set(d, FM_ESCHEMA, "ops[%u]: '%s' pools the last two dims of a rank >= 3 tensor; the rank is %u", i,
                       name, r);
  char path[32];
  snprintf(path, sizeof path, "ops[%u]", i);
  /* again here: codegen and the reference rely on this alone for a window's bounds */
  int rc = fm_fragment_check_window(op, path, d);
  if (rc) return rc;
  if (!fm_op_nargs_ok(op->op, op->nargs))
    return fm_diag_set(d, FM_EINVAL, "ops[%u]: '%s' with %u args", i, name, op->nargs);
  int q[2]; /* [x], or the backward's [gy, argmax] */
  for (uint32_t a = 0; a < op->nargs && a < 2; a++) {
    q[a] = fm_fragment_find_value(f, op->args[a]);
    if (q[a] < 0 || q[a] >= (int)f->n_inputs)
      return fm_diag_set(d, FM_EUNSUPPORTED, "ops[%u].args[%u]: a %s reads fragment inputs only", i, a, name);
  }
  const int backward = op->op == FM_OP_MAX_POOL2D_BACKWARD;
  /* the pooled input: x, or for the backward x's sizes, which only the iteration shape (its
     result's) says: its leading dims are gy's, its last two the iteration shape's */
  const int64_t *gy = ci->ext[q[0]], *it = f->outputs[0].shape;
  int64_t x[FM_MAX_RANK];
  for (uint32_t j = 0; j < r; j++) x[j] = backward && j < r - 2 ? gy[j] : backward ? it[j] : ci->ext[q[0]][j];
  for (uint32_t j = 0; j < r; j++) e[j] = x[j];
  int64_t want[FM_MAX_RANK];
  for (uint32_t j = 0; j < r; j++) want[j] = x[j];
  for (int axis = 0; axis < 2; axis++) {
    const int64_t in = x[r - 2 + axis];
    const int64_t out = in == FM_DIM_SYMBOLIC ? 0 : fm_window_pooled(in, op->window, axis, op->ceil_mode);
    if (out < 1) {
      const int32_t *w = op->window;
      return fm_diag_set(d, FM_ESCHEMA,
                         "ops[%u]: '%s' over an input %s of %" PRId64
                         ": the window (kernel %d, dilation %d, padding %d) leaves no output (%" PRId64 ")",
                         i, name, axis ? "width" : "height", in, w[FM_WIN_KH + axis], w[FM_WIN_DH + axis],
                         w[FM_WIN_PH + axis], out);
    }
    want[r - 2 + axis] = out;
    if (!backward) e[r - 2 + axis] = out;
  }
  if (!backward) return FM_OK;
  /* gy and the argmax are what max_pool2d of x gives */
  for (uint32_t a = 0; a < 2; a++) {
    const int64_t *got = ci->ext[q[a]];
    int same = 1;
    for (uint32_t j = 0; j < r; j++) same = same && got[j] == want[j];
    if (same) continue;
    fm_fragment_format_extent(got, r, gy_s, sizeof gy_s);
    fm_fragment_format_extent(x, r, x_s, sizeof x_s);
    fm_fragment_format_extent(want, r, want_s, sizeof want_s);
    return fm_diag_set(d, FM_ESCHEMA, "ops[%u].args[%u]: %s is %s, but max_pool2d of the result's %s is %s", i, a,
                       a ? "the argmax" : "gy", gy_s, x_s, want_s);
  }
  return FM_OK;
}
