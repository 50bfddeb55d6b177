/* fm_reference_window.c: the CPU reference of the window ops (vocabulary 7; the semantics
 * in fm_fragment.h): max_pool2d and its backward at one index, in fp64, straight from the
 * definition: the forward scans its window's taps, the backward finds the windows that cover
 * its element and, for each, the tap its maximum selects, scanning every tap (the generator
 * reads them only when the element matches). fm_reference_window_maxima writes the maxima the
 * backward's verification inputs must hold (the client's contract: y is the forward's). */
#include <math.h>

#include "fm_reference_int.h"

/* Element (h, w) of the pooled dims of tensor t at the leading coordinates idx: offset. */
static int64_t offset_at(const fm_tensor *t, const int64_t *idx, int64_t h, int64_t w) {
  const uint32_t r = t->rank;
  int64_t off = 0;
  for (uint32_t j = 0; j < r; j++) {
    const int64_t c = j == r - 2 ? h : j == r - 1 ? w : idx[j];
    if (t->shape[j] != 1) off += c * t->strides[j];
  }
  return off;
}

typedef struct window_ref {
  const fm_tensor *x;
  const void *data;
  const int32_t *w;
  const int64_t *idx;
  int64_t height, width;
} window_ref;

static double tap(const window_ref *x, int64_t h, int64_t w) {
  return fm_ref_load(x->x->dtype, x->data, offset_at(x->x, x->idx, h, w));
}

/* Tap (i, j) of window (oh, ow) in the input's coordinates; 0 when outside it (skipped). */
static int tap_at(const window_ref *x, int64_t oh, int64_t ow, int i, int j, int64_t *h, int64_t *w) {
  *h = oh * x->w[FM_WIN_SH] - x->w[FM_WIN_PH] + i * (int64_t)x->w[FM_WIN_DH];
  *w = ow * x->w[FM_WIN_SW] - x->w[FM_WIN_PW] + j * (int64_t)x->w[FM_WIN_DW];
  return *h >= 0 && *h < x->height && *w >= 0 && *w < x->width;
}

/* The scan: the max of window (oh, ow) (NaN sticks), and its argmax in *bh, *bw (the first
 * in-bounds tap, replaced whenever the max is). */
static double scan(const window_ref *x, int64_t oh, int64_t ow, int64_t *bh, int64_t *bw) {
  double m = -INFINITY;
  int first = 1;
  for (int i = 0; i < x->w[FM_WIN_KH]; i++)
    for (int j = 0; j < x->w[FM_WIN_KW]; j++) {
      int64_t h, w;
      if (!tap_at(x, oh, ow, i, j, &h, &w)) continue;
      const double t = tap(x, h, w);
      if (first || t > m || isnan(t)) *bh = h, *bw = w;
      if (t > m || isnan(t)) m = t;
      first = 0;
    }
  return m;
}

/* The tap window (oh, ow) selects for its maximum m: the first in-bounds tap equal to it, or,
 * when m is NaN, the last NaN tap; 0 when none matches. */
static int selected_tap(const window_ref *x, int64_t oh, int64_t ow, double m, int64_t *bh, int64_t *bw) {
  int found = 0;
  for (int i = 0; i < x->w[FM_WIN_KH]; i++)
    for (int j = 0; j < x->w[FM_WIN_KW]; j++) {
      int64_t h, w;
      if (!tap_at(x, oh, ow, i, j, &h, &w)) continue;
      const double t = tap(x, h, w);
      if (isnan(m) ? !isnan(t) : (found || t != m)) continue;
      *bh = h, *bw = w, found = 1;
    }
  return found;
}

double fm_ref_window(const fm_fragment *f, uint32_t o, const uint16_t *args, const void *const *inputs,
                     const int64_t *idx) {
  const fm_opnode *op = &f->ops[o];
  const int backward = op->op == FM_OP_MAX_POOL2D_BACKWARD;
  const uint32_t ix = args[backward ? 1 : 0], r = f->inputs[ix].rank;
  if (!inputs[ix] || r < 3) return NAN;
  window_ref x = {.x = &f->inputs[ix], .data = inputs[ix], .w = op->window, .idx = idx};
  x.height = x.x->shape[r - 2];
  x.width = x.x->shape[r - 1];
  const int64_t oh_n = fm_window_pooled(x.height, op->window, 0, op->ceil_mode);
  const int64_t ow_n = fm_window_pooled(x.width, op->window, 1, op->ceil_mode);
  int64_t bh = -1, bw = -1;
  if (!backward) /* a pooled dim of size 1 is broadcast: index 0 */
    return scan(&x, oh_n == 1 ? 0 : idx[r - 2], ow_n == 1 ? 0 : idx[r - 1], &bh, &bw);
  const fm_tensor *gy = &f->inputs[args[0]], *y = &f->inputs[args[2]];
  const void *gy_data = inputs[args[0]], *y_data = inputs[args[2]];
  if (!gy_data || !y_data) return NAN;
  const int64_t h = x.height == 1 ? 0 : idx[r - 2], w = x.width == 1 ? 0 : idx[r - 1];
  double acc = 0;
  /* the windows whose tap i (j) lands on h (w): ascending oh as i descends */
  for (int i = x.w[FM_WIN_KH]; i-- > 0;) {
    const int64_t num_h = h + x.w[FM_WIN_PH] - i * (int64_t)x.w[FM_WIN_DH];
    if (num_h < 0 || num_h % x.w[FM_WIN_SH] || num_h / x.w[FM_WIN_SH] >= oh_n) continue;
    for (int j = x.w[FM_WIN_KW]; j-- > 0;) {
      const int64_t num_w = w + x.w[FM_WIN_PW] - j * (int64_t)x.w[FM_WIN_DW];
      if (num_w < 0 || num_w % x.w[FM_WIN_SW] || num_w / x.w[FM_WIN_SW] >= ow_n) continue;
      const int64_t oh = num_h / x.w[FM_WIN_SH], ow = num_w / x.w[FM_WIN_SW];
      const double m = fm_ref_load(y->dtype, y_data, offset_at(y, idx, oh, ow));
      if (selected_tap(&x, oh, ow, m, &bh, &bw) && bh == h && bw == w)
        acc += fm_ref_load(gy->dtype, gy_data, offset_at(gy, idx, oh, ow));
    }
  }
  return acc;
}

/* Element e (row-major over t's shape, dim 0 `outer` long when symbolic) as coordinates. */
static void coords_of(const fm_tensor *t, int64_t outer, int64_t e, int64_t *idx) {
  for (uint32_t j = t->rank; j-- > 0;) {
    const int64_t n = t->shape[j] == FM_DIM_SYMBOLIC ? outer : t->shape[j];
    idx[j] = n > 1 ? e % n : 0;
    e = n > 1 ? e / n : e;
  }
}

/* The position of the input with value id `id`, or -1. */
static int input_of(const fm_fragment *f, uint32_t id) {
  for (uint32_t k = 0; k < f->n_inputs && k < FM_MAX_INPUTS; k++)
    if (f->inputs[k].id == id) return (int)k;
  return -1;
}

int fm_reference_window_maxima(const fm_fragment *canon, int64_t outer, void *const *inputs) {
  for (uint32_t o = 0; o < canon->n_ops; o++) {
    const fm_opnode *op = &canon->ops[o];
    if (op->op != FM_OP_MAX_POOL2D_BACKWARD || op->nargs != 3) continue;
    int ix = input_of(canon, op->args[1]), iy = input_of(canon, op->args[2]);
    if (ix < 0 || iy < 0 || ix >= (int)canon->n_inputs || iy >= (int)canon->n_inputs || !inputs[ix] || !inputs[iy])
      return FM_EINVAL;
    const fm_tensor *y = &canon->inputs[iy];
    const uint32_t r = y->rank;
    if (r < 3 || canon->inputs[ix].rank != r) return FM_EINVAL;
    int64_t n = 1, idx[FM_MAX_RANK];
    for (uint32_t j = 0; j < r; j++) n *= y->shape[j] == FM_DIM_SYMBOLIC ? outer : y->shape[j];
    window_ref x = {.x = &canon->inputs[ix], .data = inputs[ix], .w = op->window, .idx = idx};
    x.height = x.x->shape[r - 2];
    x.width = x.x->shape[r - 1];
    for (int64_t e = 0; e < n; e++) {
      int64_t bh, bw;
      coords_of(y, outer, e, idx);
      const double m = scan(&x, idx[r - 2], idx[r - 1], &bh, &bw);
      fm_ref_store(y->dtype, inputs[iy], offset_at(y, idx, idx[r - 2], idx[r - 1]), m);
    }
  }
  return FM_OK;
}
