/* fm_reference_window.c: the CPU reference of the window ops (vocabulary 7; the semantics
 * in fm_fragment.h): max_pool2d and its backward at one index, in fp64, straight from the
 * definition: the forward scans its window's taps (keeping the max or the argmax's tap index),
 * the backward finds the windows that cover its element and adds the gradient of those whose
 * argmax names it. fm_reference_window_taps writes the tap indices the backward's
 * verification inputs hold (random ones: random floats would name no tap). */
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

/* The scan: the max of window (oh, ow) (NaN sticks), and its argmax's tap index in *best (the
 * first in-bounds tap, replaced whenever the max is; -1 without an in-bounds tap). */
static double scan(const window_ref *x, int64_t oh, int64_t ow, int64_t *best) {
  double m = -INFINITY;
  *best = -1;
  for (int i = 0; i < x->w[FM_WIN_KH]; i++)
    for (int j = 0; j < x->w[FM_WIN_KW]; j++) {
      int64_t h, w;
      if (!tap_at(x, oh, ow, i, j, &h, &w)) continue;
      const double t = tap(x, h, w);
      if (*best < 0 || t > m || isnan(t)) *best = (int64_t)i * x->w[FM_WIN_KW] + j;
      if (t > m || isnan(t)) m = t;
    }
  return m;
}

double fm_ref_window(const fm_fragment *f, uint32_t o, const uint16_t *args, const void *const *inputs,
                     const int64_t *idx) {
  const fm_opnode *op = &f->ops[o];
  const uint32_t r = f->outputs[0].rank;
  const int32_t *win = op->window;
  if (r < 3 || !inputs[args[0]]) return NAN;
  if (op->op != FM_OP_MAX_POOL2D_BACKWARD) {
    window_ref x = {.x = &f->inputs[args[0]], .data = inputs[args[0]], .w = win, .idx = idx};
    x.height = x.x->shape[r - 2];
    x.width = x.x->shape[r - 1];
    const int64_t oh_n = fm_window_pooled(x.height, win, 0, op->ceil_mode);
    const int64_t ow_n = fm_window_pooled(x.width, win, 1, op->ceil_mode);
    int64_t best; /* a pooled dim of size 1 is broadcast: index 0 */
    const double m = scan(&x, oh_n == 1 ? 0 : idx[r - 2], ow_n == 1 ? 0 : idx[r - 1], &best);
    return op->op == FM_OP_MAX_POOL2D ? m : (double)best;
  }
  /* the backward: x's H and W are the iteration shape's */
  const fm_tensor *gy = &f->inputs[args[0]], *am = &f->inputs[args[1]];
  const void *gy_data = inputs[args[0]], *am_data = inputs[args[1]];
  if (!am_data) return NAN;
  const int64_t height = f->outputs[0].shape[r - 2], width = f->outputs[0].shape[r - 1];
  const int64_t oh_n = fm_window_pooled(height, win, 0, op->ceil_mode);
  const int64_t ow_n = fm_window_pooled(width, win, 1, op->ceil_mode);
  const int64_t h = height == 1 ? 0 : idx[r - 2], w = width == 1 ? 0 : idx[r - 1];
  double acc = 0;
  /* the windows whose tap i (j) lands on h (w): ascending oh as i descends */
  for (int i = win[FM_WIN_KH]; i-- > 0;) {
    const int64_t num_h = h + win[FM_WIN_PH] - i * (int64_t)win[FM_WIN_DH];
    if (num_h < 0 || num_h % win[FM_WIN_SH] || num_h / win[FM_WIN_SH] >= oh_n) continue;
    for (int j = win[FM_WIN_KW]; j-- > 0;) {
      const int64_t num_w = w + win[FM_WIN_PW] - j * (int64_t)win[FM_WIN_DW];
      if (num_w < 0 || num_w % win[FM_WIN_SW] || num_w / win[FM_WIN_SW] >= ow_n) continue;
      const int64_t oh = num_h / win[FM_WIN_SH], ow = num_w / win[FM_WIN_SW];
      const double t = fm_ref_load(am->dtype, am_data, offset_at(am, idx, oh, ow));
      if (t == (double)i * win[FM_WIN_KW] + j) acc += fm_ref_load(gy->dtype, gy_data, offset_at(gy, idx, oh, ow));
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

int fm_reference_window_taps(const fm_fragment *canon, int64_t outer, uint64_t seed, void *const *inputs) {
  for (uint32_t o = 0; o < canon->n_ops; o++) {
    const fm_opnode *op = &canon->ops[o];
    if (op->op != FM_OP_MAX_POOL2D_BACKWARD || op->nargs != 2) continue;
    const int ia = input_of(canon, op->args[1]);
    if (ia < 0 || !inputs[ia]) return FM_EINVAL;
    const fm_tensor *am = &canon->inputs[ia];
    int64_t n = 1, idx[FM_MAX_RANK];
    for (uint32_t j = 0; j < am->rank; j++) n *= am->shape[j] == FM_DIM_SYMBOLIC ? outer : am->shape[j];
    const uint64_t taps = (uint64_t)op->window[FM_WIN_KH] * (uint64_t)op->window[FM_WIN_KW];
    uint64_t s = seed | 1;
    for (int64_t e = 0; e < n; e++) {
      s ^= s << 13, s ^= s >> 7, s ^= s << 17; /* xorshift64 */
      coords_of(am, outer, e, idx);
      int64_t off = 0;
      for (uint32_t j = 0; j < am->rank; j++)
        if (am->shape[j] != 1) off += idx[j] * am->strides[j];
      fm_ref_store(am->dtype, inputs[ia], off, (double)(s % (taps ? taps : 1)));
    }
  }
  return FM_OK;
}
