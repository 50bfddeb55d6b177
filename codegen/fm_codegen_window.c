/* fm_codegen_window.c: the window ops (vocabulary 7) in the pointwise template's extent form
 * (fm_codegen_cat.c): max_pool2d, max_pool2d_argmax and max_pool2d_backward, each a block of
 * its own that loads its inputs at its taps. Semantics in fm_fragment.h.
 *
 *   max_pool2d, _argmax: the window's kh x kw taps, unrolled (compile-time sizes), each
 *                        bounds-checked; m = t when t > m or t is NaN, and the argmax's tap
 *                        index with it (the two ops of one fragment load the same taps, which
 *                        the compiler loads once).
 *   max_pool2d_backward: per element p = (h, w) of x, the windows that cover it (oh in
 *                        [max(0, ceil((h + ph - dh*(kh-1)) / sh)), min(OH-1, (h + ph) / sh)]
 *                        with (h + ph - oh*sh) a multiple of dh, the same for w), in ascending
 *                        (oh, ow); one load of the window's argmax and one compare with p's
 *                        tap index each, gy added where they are equal: the kernel moves what
 *                        a copy moves. Finding each covering window's argmax from x here
 *                        instead (kh*kw taps a window, four windows an element) ran 19x the
 *                        forward's time on an H200: instruction-bound, each warp's 32 channels
 *                        exiting the scan at different taps.
 * Every number (window, sizes, strides) is a constant of the canonical fragment. The taps are
 * the only loads at computed coordinates, and each is checked against the input's own H and
 * W; the leading coordinates are the element's, inside the input (validated extents). */
#include <stdio.h>
#include <string.h>

#include "fm_codegen_int.h"

/* Everything one window op's code needs, from the canonical fragment. */
typedef struct window_gen {
  const fm_opnode *op;
  const fm_tensor *x, *gy, *am; /* x: the forward's; gy and the argmax: the backward's */
  uint32_t ix, igy, iam, r;     /* input positions; the rank */
  int64_t k[2], s[2], p[2], d[2], in[2], out[2];
  const char *ct; /* C type of the pooled coordinates: int when every one fits */
} window_gen;

static void window_init(window_gen *w, const fm_fragment *f, const fm_cg_plan *p, uint32_t i) {
  w->op = &f->ops[i];
  const int backward = w->op->op == FM_OP_MAX_POOL2D_BACKWARD; /* [gy, argmax], else [x] */
  w->ix = w->igy = p->args[i][0];
  w->iam = p->args[i][backward ? 1 : 0];
  w->x = backward ? NULL : &f->inputs[w->ix];
  w->gy = backward ? &f->inputs[w->igy] : NULL;
  w->am = backward ? &f->inputs[w->iam] : NULL;
  w->r = f->outputs[0].rank;
  int64_t reach = 0;
  for (int a = 0; a < 2; a++) {
    w->k[a] = w->op->window[FM_WIN_KH + a];
    w->s[a] = w->op->window[FM_WIN_SH + a];
    w->p[a] = w->op->window[FM_WIN_PH + a];
    w->d[a] = w->op->window[FM_WIN_DH + a];
    /* x's size: the forward's input's, the backward's result's (the iteration shape) */
    w->in[a] = backward ? f->outputs[0].shape[w->r - 2 + a] : w->x->shape[w->r - 2 + a];
    w->out[a] = fm_window_pooled(w->in[a], w->op->window, a, w->op->ceil_mode);
    /* the largest magnitude any coordinate expression below reaches */
    int64_t m = w->in[a] + w->p[a] + w->out[a] * w->s[a] + w->d[a] * w->k[a];
    reach = m > reach ? m : reach;
  }
  w->ct = reach < ((int64_t)1 << 30) ? "int" : "long long";
}

/* `in<k>[<base> + h * sH + w * sW]` decoded: tensor t at pooled coordinates h, w. */
static void emit_load(fm_strbuf *sb, const fm_tensor *t, uint32_t k, const char *base, const char *h, const char *w) {
  char e[160];
  int n = snprintf(e, sizeof e, "in%u[%s", k, base);
  for (int a = 0; a < 2 && n > 0 && (size_t)n < sizeof e; a++) {
    const uint32_t j = t->rank - 2 + (uint32_t)a;
    if (t->shape[j] == 1 || t->strides[j] == 0) continue;
    if (t->strides[j] == 1)
      n += snprintf(e + n, sizeof e - (size_t)n, " + %s", a ? w : h);
    else
      n += snprintf(e + n, sizeof e - (size_t)n, " + %s * %lldLL", a ? w : h, (long long)t->strides[j]);
  }
  if (n > 0 && (size_t)n < sizeof e) snprintf(e + n, sizeof e - (size_t)n, "]");
  fm_cg_emit_decode(sb, t->dtype, e);
}

/* The element's coordinate along pooled axis a of a value of size n: 0 where broadcast. */
static void emit_coord(fm_strbuf *sb, const window_gen *w, const char *ind, const char *name, int64_t n,
                       const char *coord) {
  if (n == 1)
    fm_strbuf_printf(sb, "%s  const %s %s = 0;\n", ind, w->ct, name);
  else
    fm_strbuf_printf(sb, "%s  const %s %s = (%s)%s;\n", ind, w->ct, name, w->ct, coord);
}

/* `const long long <name> = <offset of t along its leading dims>;` */
static void emit_base(fm_strbuf *sb, const window_gen *w, const char *ind, const char *name, const fm_tensor *t,
                      const fm_cg_coord *coord) {
  fm_strbuf_printf(sb, "%s  const long long %s = ", ind, name);
  fm_cg_emit_offset(sb, t, coord, w->r - 2);
  fm_strbuf_append(sb, ";\n");
}

/* The scan of the window's taps: v<pos> = the max, and v<twin> = the argmax's tap index when
 * twin is a position (a fragment's max_pool2d and max_pool2d_argmax of one x and window share
 * it: one load a tap); v<pos> is the argmax itself when the op is one. */
static void emit_forward(fm_strbuf *sb, const window_gen *w, uint32_t pos, int twin, const fm_cg_coord *coord,
                         const char *ind) {
  const int only_argmax = w->op->op == FM_OP_MAX_POOL2D_ARGMAX, argmax = only_argmax || twin >= 0;
  emit_coord(sb, w, ind, "oh", w->out[0], coord[w->r - 2]);
  emit_coord(sb, w, ind, "ow", w->out[1], coord[w->r - 1]);
  emit_base(sb, w, ind, "xb", w->x, coord);
  fm_strbuf_printf(sb, "%s  float m = __int_as_float(0xff800000);  /* -inf */\n", ind);
  if (argmax) fm_strbuf_printf(sb, "%s  float best = -1.0f;  /* the argmax's tap index */\n", ind);
  fm_strbuf_printf(sb,
                   "#pragma unroll\n"
                   "%s  for (int i = 0; i < %lld; ++i) {\n"
                   "%s    const %s h = oh * %lld - %lld + i * %lld;\n"
                   "%s    if (h < 0 || h >= %lld) continue;\n"
                   "#pragma unroll\n"
                   "%s    for (int j = 0; j < %lld; ++j) {\n"
                   "%s      const %s w = ow * %lld - %lld + j * %lld;\n"
                   "%s      if (w < 0 || w >= %lld) continue;\n"
                   "%s      const float t = ",
                   ind, (long long)w->k[0], ind, w->ct, (long long)w->s[0], (long long)w->p[0], (long long)w->d[0], ind,
                   (long long)w->in[0], ind, (long long)w->k[1], ind, w->ct, (long long)w->s[1], (long long)w->p[1],
                   (long long)w->d[1], ind, (long long)w->in[1], ind);
  emit_load(sb, w->x, w->ix, "xb", "h", "w");
  if (argmax) /* the first in-bounds tap, replaced whenever the max is */
    fm_strbuf_printf(sb,
                     ";\n"
                     "%s      if (best < 0.0f || t > m || t != t) best = (float)(i * %lld + j);\n"
                     "%s      if (t > m || t != t) m = t;\n",
                     ind, (long long)w->k[1], ind);
  else
    fm_strbuf_printf(sb, ";\n%s      if (t > m || t != t) m = t;  /* NaN sticks */\n", ind);
  fm_strbuf_printf(sb, "%s    }\n%s  }\n%s  v%u = %s;\n", ind, ind, ind, pos, only_argmax ? "best" : "m");
  if (twin >= 0) fm_strbuf_printf(sb, "%s  v%d = best;\n", ind, twin);
}

/* The first window covering the element along axis a and the most that can (compile-time):
 * lo = max(0, ceil((hp - d*(k-1)) / s)), hi = min(out-1, hp / s), hp the coordinate plus the
 * padding; at most (k-1)*d / s + 1 of them. */
static int64_t emit_cover(fm_strbuf *sb, const window_gen *w, int a, const char *ind) {
  const char *o = a ? "ow" : "oh", *cp = a ? "wp" : "hp";
  const long long span = (long long)(w->d[a] * (w->k[a] - 1)), s = (long long)w->s[a], last = (long long)w->out[a] - 1;
  fm_strbuf_printf(sb, "%sconst %s %s_lo = %s < %lld ? 0 : (%s - %lld + %lld) / %lld;\n", ind, w->ct, o, cp, span, cp,
                   span, s - 1, s);
  fm_strbuf_printf(sb, "%sconst %s %s_hi = %s / %lld < %lld ? %s / %lld : %lld;\n", ind, w->ct, o, cp, s, last, cp, s,
                   last);
  return span / s + 1;
}

/* Window number n along axis a of the covering ones: its index o, whether it covers the
 * element (`ok`), and the element's tap index in it (t / d). */
static void emit_candidate(fm_strbuf *sb, const window_gen *w, int a, const char *ind) {
  const char *o = a ? "ow" : "oh", *cp = a ? "wp" : "hp", *t = a ? "tw" : "th", *tap = a ? "jp" : "ip";
  const char *n = a ? "nw" : "nh", *ok = a ? "ok" : "okh";
  fm_strbuf_printf(sb, "%sconst %s %s = %s_lo + %s;\n", ind, w->ct, o, o, n);
  fm_strbuf_printf(sb, "%sconst %s %s = %s - %s * %lld;\n", ind, w->ct, t, cp, o, (long long)w->s[a]);
  fm_strbuf_printf(sb, "%sconst bool %s = %s%s <= %s_hi", ind, ok, a ? "okh && " : "", o, o);
  if (w->d[a] > 1) fm_strbuf_printf(sb, " && %s %% %lld == 0", t, (long long)w->d[a]);
  fm_strbuf_printf(sb, ";\n%sconst int %s = (int)(%s / %lld);\n", ind, tap, t, (long long)w->d[a]);
}

/* Per element, the covering windows unrolled over the most there can be, each one predicated
 * (no branch: every load of every window is issued at once, the gradient's unconditionally,
 * so a thread waits on memory once an element, not once a window) */
static void emit_backward(fm_strbuf *sb, const window_gen *w, uint32_t pos, const fm_cg_coord *coord, const char *ind) {
  char in1[64], in2[64];
  snprintf(in1, sizeof in1, "%s  ", ind);
  snprintf(in2, sizeof in2, "%s    ", ind);
  emit_coord(sb, w, ind, "h", w->in[0], coord[w->r - 2]);
  emit_coord(sb, w, ind, "w", w->in[1], coord[w->r - 1]);
  emit_base(sb, w, ind, "gb", w->gy, coord);
  emit_base(sb, w, ind, "ab", w->am, coord);
  fm_strbuf_printf(sb, "%s  const %s hp = h + %lld, wp = w + %lld;\n", ind, w->ct, (long long)w->p[0],
                   (long long)w->p[1]);
  fm_strbuf_printf(sb, "%s  float acc = 0.0f;\n", ind);
  const int64_t nh = emit_cover(sb, w, 0, in1), nw = emit_cover(sb, w, 1, in1);
  fm_strbuf_printf(sb, "#pragma unroll\n%sfor (int nh = 0; nh < %lld; ++nh) {\n", in1, (long long)nh);
  emit_candidate(sb, w, 0, in2);
  fm_strbuf_printf(sb, "#pragma unroll\n%sfor (int nw = 0; nw < %lld; ++nw) {\n", in2, (long long)nw);
  char in3[72];
  snprintf(in3, sizeof in3, "%s  ", in2);
  emit_candidate(sb, w, 1, in3);
  fm_strbuf_printf(sb, "%sconst float t = ok ? ", in3);
  emit_load(sb, w->am, w->iam, "ab", "oh", "ow");
  fm_strbuf_printf(sb, " : -1.0f;\n%sconst float g = ok ? ", in3);
  emit_load(sb, w->gy, w->igy, "gb", "oh", "ow");
  fm_strbuf_printf(sb, " : 0.0f;\n%sif (t == (float)(ip * %lld + jp)) acc += g;\n", in3, (long long)w->k[1]);
  fm_strbuf_printf(sb, "%s}\n%s}\n%s  v%u = acc;\n", in2, in1, ind, pos);
}

int fm_cg_window_twin(const fm_fragment *f, uint32_t i) {
  const fm_opnode *a = &f->ops[i];
  if (a->op != FM_OP_MAX_POOL2D) return -1;
  for (uint32_t j = i + 1; j < f->n_ops; j++) {
    const fm_opnode *b = &f->ops[j];
    if (b->op == FM_OP_MAX_POOL2D_ARGMAX && b->args[0] == a->args[0] && b->ceil_mode == a->ceil_mode &&
        memcmp(b->window, a->window, sizeof a->window) == 0)
      return (int)j;
  }
  return -1;
}

void fm_cg_emit_window(fm_strbuf *sb, const fm_fragment *f, const fm_cg_plan *p, uint32_t i, int twin,
                       const fm_cg_coord *coord, const char *ind) {
  const uint32_t pos = p->n_in + i;
  window_gen w;
  window_init(&w, f, p, i);
  fm_strbuf_printf(sb, "%s%s v%u;  /* %s %lldx%lld stride %lldx%lld pad %lldx%lld dilation %lldx%lld%s */\n", ind,
                   fm_cg_val_type(p->vdt[pos]), pos, fm_op_name(w.op->op), (long long)w.k[0], (long long)w.k[1],
                   (long long)w.s[0], (long long)w.s[1], (long long)w.p[0], (long long)w.p[1], (long long)w.d[0],
                   (long long)w.d[1], w.op->ceil_mode ? " ceil_mode" : "");
  if (twin >= 0)
    fm_strbuf_printf(sb, "%s%s v%u;  /* %s, from the same scan */\n", ind, fm_cg_val_type(p->vdt[p->n_in + twin]),
                     p->n_in + (uint32_t)twin, fm_op_name(f->ops[twin].op));
  fm_strbuf_printf(sb, "%s{\n", ind);
  if (w.gy)
    emit_backward(sb, &w, pos, coord, ind);
  else
    emit_forward(sb, &w, pos, twin >= 0 ? (int)(p->n_in + (uint32_t)twin) : -1, coord, ind);
  fm_strbuf_printf(sb, "%s}\n", ind);
}

/* ceil(a / b) capped at c, for positive a, b, c. */
static uint64_t ceil_cap(uint64_t a, uint64_t b, uint64_t c) {
  uint64_t q = (a + b - 1) / b;
  return q < c ? q : c;
}

uint32_t fm_cg_window_cost(const fm_opnode *op) {
  const uint64_t kh = (uint32_t)op->window[FM_WIN_KH], kw = (uint32_t)op->window[FM_WIN_KW];
  const uint64_t sh = (uint32_t)op->window[FM_WIN_SH], sw = (uint32_t)op->window[FM_WIN_SW];
  const uint64_t dh = (uint32_t)op->window[FM_WIN_DH], dw = (uint32_t)op->window[FM_WIN_DW];
  if (kh < 1 || kw < 1 || sh < 1 || sw < 1 || kh > FM_WINDOW_MAX_KERNEL || kw > FM_WINDOW_MAX_KERNEL)
    return UINT32_MAX; /* not a valid window: never cheap */
  uint64_t cost = kh * kw;
  /* at most kh windows cover an element along H (one per tap row), fewer when they are
     strided apart: ceil(kh * dh / sh) */
  /* the backward: a load and a compare per window covering an element */
  if (op->op == FM_OP_MAX_POOL2D_BACKWARD) cost = ceil_cap(kh * dh, sh, kh) * ceil_cap(kw * dw, sw, kw);
  return cost > UINT32_MAX ? UINT32_MAX : (uint32_t)cost;
}
