/* fm_codegen_cat.c: the pointwise template's form for extent fragments: a `cat` (vocabulary
 * 6), such as rotary embeddings' x * cos + cat([-x2, x1]) * sin, or a window op (vocabulary 7,
 * max pooling and its backward: fm_codegen_window.c).
 *
 * Shape of the generated kernel (candidate parameters as the pointwise template's):
 *   for each grid-wide step, thread t of block b owns units e0 + u*BLOCK, u < UNROLL, a unit
 *   VEC consecutive elements along the last dim (VEC 1 but where every output's rows hold
 *   whole aligned vectors, below):
 *     1. the element's coordinates c0.. in the iteration shape (divisions by constants): dim 0
 *        outermost, the others in outputs[0]'s memory order, the smallest stride fastest, so
 *        that consecutive threads store to consecutive addresses (a channels-last output
 *        too); a row-major output decomposes with the last dim fastest;
 *     2. every value the outputs need, in op order, each input loaded at its own strides;
 *        a cat picks the branch its coordinate along dim falls in and there evaluates the
 *        operand's whole subtree again, that coordinate shifted by the sizes before it
 *        (names are shadowed in the branch's block, so the op table's v<pos> names work);
 *        a window op loads its inputs at its taps, each load bounds-checked;
 *     3. the stores: one VEC-wide store per output and unit, the unit's elements packed.
 * Validation checked every value's extent (fm_fragment_cat_info), so a branch's inputs are
 * read inside their own shapes. Loads are one element each where which input an element
 * reads depends on its coordinate within a unit; where it does not (the unit form, below),
 * a unit's values are register arrays and each input is read once a unit. Stores are
 * vectors where every output is row-major along the last dim with whole aligned vectors in
 * each row (a gradient padded for a GEMM: GPT-2's 4096 x 50304 logits gradient, ATen's cat
 * 0.43 ms on an H200, ran at 0.8-1.9 TB/s with one 2-byte store per thread); window ops keep
 * one element per thread (channels-last outputs). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fm_codegen_int.h"

#define FM_CG_MAX_SOURCE  (1u << 20)
#define FM_CG_DEFAULT_SMS 132u /* H100 SXM: sizes the grid cap when the caller has no GPU */

/* How a kernel's units are computed (the unit form, below). */
typedef enum {
  UNITS_EACH,             /* element by element, every unit */
  UNITS_WHOLE,            /* as register arrays, every unit */
  UNITS_UNLESS_STRADDLING /* as arrays, but the unit a cat's split falls in, element by element */
} unit_plan;

typedef struct cat_gen {
  const fm_fragment *f;
  fm_cg_plan p;
  fm_cat_info ci;
  unit_plan units; /* for this kernel's vec */
  int split_cat;   /* UNITS_UNLESS_STRADDLING: the op of the cat along the last dim */
} cat_gen;

/* The names of the coordinates where values are being emitted. */
typedef struct cat_ctx {
  fm_cg_coord coord[FM_MAX_RANK];
  const char *ind;
  int shifted; /* inside a cat's branch that starts off a multiple of the unit: inputs are not
                  read as vectors there, whose offsets would not be aligned */
} cat_ctx;

/* Whether op's operands are read at other coordinates than its own: a cat's (in its
 * branches), a window op's (at its taps, by the op's own block), take_rows' (at the row its
 * index names, by its own block). */
static int reads_elsewhere(const fm_opnode *op) {
  const fm_opkind kind = fm_op_kind(op->op);
  return kind == FM_OPK_CAT || kind == FM_OPK_WINDOW || kind == FM_OPK_GATHER;
}

/* need[] of values an output (root) or a cat operand (arg >= 0) reads, cats' operands left to
 * their branches and window ops' to the ops. */
static void mark_needs(const cat_gen *g, int arg, uint8_t *need) {
  const uint32_t n_in = g->p.n_in, n_val = n_in + g->p.n_ops;
  memset(need, 0, n_val);
  if (arg >= 0)
    need[arg] = 1;
  else
    for (uint32_t k = 0; k < g->p.n_out; k++) need[g->p.t[n_in + k].value] = 1;
  for (uint32_t pos = n_val; pos-- > n_in;) {
    const fm_opnode *op = &g->f->ops[pos - n_in];
    if (!need[pos] || reads_elsewhere(op)) continue;
    for (uint32_t a = 0; a < op->nargs; a++) need[g->p.args[pos - n_in][a]] = 1;
  }
}

void fm_cg_emit_offset(fm_strbuf *sb, const fm_tensor *t, const fm_cg_coord *coord, uint32_t ndims) {
  const char *sep = "";
  for (uint32_t j = 0; j < ndims && j < t->rank; j++) {
    if (t->shape[j] == 1 || t->strides[j] == 0) continue;
    if (t->strides[j] == 1)
      fm_strbuf_printf(sb, "%s%s", sep, coord[j]);
    else
      fm_strbuf_printf(sb, "%s%s * %lldLL", sep, coord[j], (long long)t->strides[j]);
    sep = " + ";
  }
  if (!*sep) fm_strbuf_append(sb, "0");
}

/* Input pos's element at coordinates `at`, decoded to its value type: in<pos>[offset]. */
static void emit_input_at(fm_strbuf *sb, const cat_gen *g, uint32_t pos, const fm_cg_coord *at) {
  const fm_tensor *t = &g->f->inputs[pos];
  fm_strbuf tmp; /* the load, which the decode wraps */
  fm_strbuf_init(&tmp, 1024);
  fm_strbuf_printf(&tmp, "in%u[", pos);
  fm_cg_emit_offset(&tmp, t, at, t->rank);
  fm_strbuf_append(&tmp, "]");
  char *e = fm_strbuf_take(&tmp);
  fm_cg_emit_decode(sb, t->dtype, e ? e : "0");
  free(e);
  fm_strbuf_free(&tmp);
}

static void emit_values(fm_strbuf *sb, const cat_gen *g, const uint8_t *need, const cat_ctx *cx);

/* v<pos> = take_rows of op i: the index loaded at the element's coordinates, wrapped once
 * when negative and checked against src's S rows (a trap outside them, before any load), then
 * src read at that row and the element's other coordinates. */
static void emit_take_rows(fm_strbuf *sb, const cat_gen *g, uint32_t i, const cat_ctx *cx) {
  const uint32_t pos = g->p.n_in + i, isrc = g->p.args[i][0], iidx = g->p.args[i][1];
  const fm_tensor *src = &g->f->inputs[isrc], *index = &g->f->inputs[iidx];
  const int64_t rows = src->shape[0];
  fm_strbuf_printf(sb, "%slong long t%u = in%u[", cx->ind, pos, iidx);
  fm_cg_emit_offset(sb, index, cx->coord, index->rank);
  fm_strbuf_append(sb, "];  /* take_rows: the row */\n");
  fm_strbuf_printf(sb, "%sif (t%u < 0) t%u += %lldLL;\n", cx->ind, pos, pos, (long long)rows);
  fm_strbuf_printf(sb, "%sif ((unsigned long long)t%u >= %lluull) __trap();  /* outside src's rows */\n", cx->ind, pos,
                   (unsigned long long)rows);
  fm_cg_coord at[FM_MAX_RANK];
  memcpy(at, cx->coord, sizeof at);
  snprintf(at[0], sizeof at[0], "t%u", pos);
  fm_strbuf_printf(sb, "%sconst %s v%u = ", cx->ind, fm_cg_val_type(src->dtype), pos);
  emit_input_at(sb, g, isrc, at);
  fm_strbuf_append(sb, ";  /* take_rows */\n");
}

static void emit_unit_values(fm_strbuf *sb, const cat_gen *g, const uint8_t *need, const cat_ctx *cx, uint32_t vec);

/* v<pos> = the cat of op i, each operand in its own branch: one element (vec 0), or a unit's
 * register array of vec elements (the unit form, below), the branch taken once for the unit. */
static void emit_cat(fm_strbuf *sb, const cat_gen *g, uint32_t i, const cat_ctx *cx, uint32_t vec) {
  const fm_opnode *op = &g->f->ops[i];
  const uint32_t pos = g->p.n_in + i, dim = (uint32_t)op->dim;
  const fm_dtype vdt = g->p.vdt[pos];
  uint8_t need[FM_CG_MAX_VALUES];
  char ind[64], len[16] = "";
  snprintf(ind, sizeof ind, "%s  ", cx->ind);
  if (vec) snprintf(len, sizeof len, "[%u]", vec);
  fm_strbuf_printf(sb, "%s%s v%u%s;  /* cat along dim %u */\n", cx->ind, fm_cg_val_type(vdt), pos, len, dim);
  int64_t start = 0;
  for (uint32_t a = 0; a < op->nargs; a++) {
    const uint32_t arg = g->p.args[i][a];
    const int64_t size = g->ci.ext[arg][dim];
    if (a == 0)
      fm_strbuf_printf(sb, "%sif (%s < %lldLL) {\n", cx->ind, cx->coord[dim], (long long)size);
    else if (a + 1 < op->nargs)
      fm_strbuf_printf(sb, "%s} else if (%s < %lldLL) {\n", cx->ind, cx->coord[dim], (long long)(start + size));
    else
      fm_strbuf_printf(sb, "%s} else {\n", cx->ind);
    cat_ctx in = *cx;
    in.ind = ind;
    if (vec && start % vec) in.shifted = 1;
    if (start > 0) {
      snprintf(in.coord[dim], sizeof in.coord[dim], "b%u", dim);
      fm_strbuf_printf(sb, "%sconst long long b%u = %s - %lldLL;\n", ind, dim, cx->coord[dim], (long long)start);
    }
    mark_needs(g, (int)arg, need);
    char v[24], to[24];
    if (vec) {
      emit_unit_values(sb, g, need, &in, vec);
      snprintf(v, sizeof v, g->p.rowval[arg] ? "v%u[i]" : "v%u", arg);
      snprintf(to, sizeof to, "v%u[i]", pos);
      fm_strbuf_printf(sb, "#pragma unroll\n%sfor (int i = 0; i < %u; ++i) ", ind, vec);
    } else {
      emit_values(sb, g, need, &in);
      snprintf(v, sizeof v, "v%u", arg);
      snprintf(to, sizeof to, "v%u", pos);
      fm_strbuf_append(sb, ind);
    }
    if (vdt != FM_DT_BOOL && g->p.vdt[arg] == FM_DT_BOOL)
      fm_strbuf_printf(sb, "%s = %s ? 1.0f : 0.0f;\n", to, v);
    else
      fm_strbuf_printf(sb, "%s = %s;\n", to, v);
    start += size;
  }
  fm_strbuf_printf(sb, "%s}\n", cx->ind);
}

/* Every needed value, in position order (operands before their ops). */
static void emit_values(fm_strbuf *sb, const cat_gen *g, const uint8_t *need, const cat_ctx *cx) {
  const uint32_t n_in = g->p.n_in;
  uint8_t done[FM_MAX_OPS] = {0}; /* a max_pool2d's argmax, set by the max's scan */
  for (uint32_t pos = 0; pos < n_in + g->p.n_ops; pos++) {
    if (!need[pos] || (pos >= n_in && done[pos - n_in])) continue;
    if (pos < n_in) {
      fm_strbuf_printf(sb, "%sconst %s v%u = ", cx->ind, fm_cg_val_type(g->f->inputs[pos].dtype), pos);
      emit_input_at(sb, g, pos, cx->coord);
      fm_strbuf_append(sb, ";\n");
      continue;
    }
    const uint32_t i = pos - n_in;
    if (fm_op_kind(g->f->ops[i].op) == FM_OPK_CAT) {
      emit_cat(sb, g, i, cx, 0);
      continue;
    }
    if (fm_op_kind(g->f->ops[i].op) == FM_OPK_GATHER) {
      emit_take_rows(sb, g, i, cx);
      continue;
    }
    if (fm_op_kind(g->f->ops[i].op) == FM_OPK_WINDOW) {
      int twin = fm_cg_window_twin(g->f, i);
      if (twin >= 0 && !need[n_in + (uint32_t)twin]) twin = -1;
      if (twin >= 0) done[twin] = 1;
      fm_cg_emit_window(sb, g->f, &g->p, i, twin, cx->coord, cx->ind);
      continue;
    }
    fm_strbuf_printf(sb, "%sconst %s v%u = ", cx->ind, fm_cg_val_type(g->p.vdt[pos]), pos);
    fm_cg_emit_op(sb, g->f, &g->p, i);
    fm_strbuf_printf(sb, ";  /* %s */\n", fm_op_name(g->f->ops[i].op));
  }
}

/* ---- the unit form: every value of a unit a register array of vec elements ----------------
 * Where a unit never straddles a cat's branches (every cat along the last dim splits it at
 * multiples of vec; a cat along another dim is uniform over a unit anyway) and no op reads at
 * other coordinates per element (window ops, take_rows), the branch is taken once a unit and
 * each input is read once a unit: a 16-byte vector (two for an f32 unit of 8) where it is
 * contiguous along the last dim, one element where it is broadcast along it, one element at
 * a time otherwise. The per-element form (above) loaded every element alone behind its
 * branch: rotary embeddings' kernels ran at 1.4 TB/s on an H200, bound by load latency. */

/* The unit form for vec, and (UNITS_UNLESS_STRADDLING) the one cat along the last dim whose
 * split falls inside some unit: those units (one a row: GPT-2's loss gradient padded from
 * 50257 to 50304 columns) are computed element by element and every other one as a unit,
 * its branch's inputs read element by element where the branch starts off a multiple of vec
 * (cat_ctx.shifted). Two such cats (or one inside another) leave every unit element by element. */
static unit_plan unit_form(const cat_gen *g, uint32_t vec, int *split_cat) {
  const uint32_t r = g->f->outputs[0].rank;
  int straddled = -1, last_dim_cats = 0;
  int64_t straddling_units = 0;
  if (vec < 2 || r == 0) return UNITS_EACH;
  for (uint32_t i = 0; i < g->f->n_ops; i++) {
    const fm_opnode *op = &g->f->ops[i];
    const fm_opkind kind = fm_op_kind(op->op);
    if (kind == FM_OPK_WINDOW || kind == FM_OPK_GATHER) return UNITS_EACH;
    if (kind != FM_OPK_CAT || (uint32_t)op->dim != r - 1) continue;
    last_dim_cats++;
    int64_t split = 0;
    for (uint32_t a = 0; a + 1 < op->nargs; a++) {
      split += g->ci.ext[g->p.args[i][a]][r - 1];
      if (split % vec) straddled = (int)i, straddling_units++;
    }
  }
  for (uint32_t k = 0; k < g->f->n_inputs; k++)
    if (g->f->inputs[k].rank != r) return UNITS_EACH;
  if (straddled < 0) return UNITS_WHOLE;
  /* two cats, or a split in every unit of a row (heads of 8 halved at 4): element by element */
  if (last_dim_cats != 1 || g->f->outputs[0].shape[r - 1] / vec <= straddling_units) return UNITS_EACH;
  *split_cat = straddled;
  return UNITS_UNLESS_STRADDLING;
}

/* How input t is read for a unit of vec elements along dim r-1. */
typedef enum { UNIT_BROADCAST, UNIT_VECTOR, UNIT_EACH } unit_read;

static unit_read unit_read_of(const fm_tensor *t, uint32_t r, uint32_t vec) {
  if (t->shape[r - 1] == 1 || t->strides[r - 1] == 0) return UNIT_BROADCAST;
  const uint32_t size = (uint32_t)fm_dtype_size(t->dtype), bytes = vec * size;
  /* a unit lies inside its branch (no unit straddles a split it computes as a unit), so a
     vector never reads past the last dim, whatever its length (GPT-2's 50 257 logits) */
  if (t->dtype == FM_DT_I64 || t->strides[r - 1] != 1) return UNIT_EACH;
  if (t->align < (bytes < 16 ? bytes : 16)) return UNIT_EACH;
  for (uint32_t j = 0; j + 1 < r; j++)
    if (t->shape[j] != 1 && t->strides[j] % vec) return UNIT_EACH;
  return UNIT_VECTOR;
}

/* v<pos>[vec] of input pos at the unit whose first element is at cx's coordinates. */
static void emit_unit_input(fm_strbuf *sb, const cat_gen *g, uint32_t pos, const cat_ctx *cx, uint32_t vec) {
  const fm_tensor *t = &g->f->inputs[pos];
  const uint32_t r = g->f->outputs[0].rank, size = (uint32_t)fm_dtype_size(t->dtype);
  const char *ind = cx->ind;
  fm_strbuf_printf(sb, "%s%s v%u[%u];\n", ind, fm_cg_val_type(t->dtype), pos, vec);
  unit_read how = unit_read_of(t, r, vec);
  if (how == UNIT_VECTOR && cx->shifted) how = UNIT_EACH;
  if (how == UNIT_BROADCAST) { /* one element, copied */
    fm_strbuf_printf(sb, "%s{\n%s  const %s s = ", ind, ind, fm_cg_val_type(t->dtype));
    emit_input_at(sb, g, pos, cx->coord);
    fm_strbuf_printf(sb, ";\n#pragma unroll\n%s  for (int i = 0; i < %u; ++i) v%u[i] = s;\n%s}\n", ind, vec, pos, ind);
  } else if (how == UNIT_EACH) { /* element by element, the last coordinate cl */
    fm_cg_coord at[FM_MAX_RANK];
    memcpy(at, cx->coord, sizeof at);
    snprintf(at[r - 1], sizeof at[r - 1], "cl");
    fm_strbuf_printf(
        sb, "#pragma unroll\n%sfor (int q = 0; q < %u; ++q) {\n%s  const long long cl = %s + q;\n%s  v%u[q] = ", ind,
        vec, ind, cx->coord[r - 1], ind, pos);
    emit_input_at(sb, g, pos, at);
    fm_strbuf_printf(sb, ";\n%s}\n", ind);
  } else { /* 16-byte vectors (or one narrower), decoded element by element */
    const uint32_t bytes = vec * size, piece = bytes > 16 ? 16 : bytes, per = piece / size;
    const char *vt = fm_cg_vec_type(piece);
    fm_strbuf off;
    fm_strbuf_init(&off, 1024);
    fm_cg_emit_offset(&off, t, cx->coord, t->rank);
    char *o = fm_strbuf_take(&off);
    for (uint32_t p0 = 0; p0 < vec; p0 += per) {
      char at[16] = "", first[16] = "", e[32];
      if (p0) snprintf(at, sizeof at, " + %u", p0), snprintf(first, sizeof first, "%u + ", p0);
      fm_strbuf_printf(sb, "%s{\n%s  const %s ld = *reinterpret_cast<const %s *>(in%u + %s%s);\n", ind, ind, vt, vt,
                       pos, o ? o : "0", at);
      fm_strbuf_printf(sb, "#pragma unroll\n%s  for (int h = 0; h < %u; ++h) v%u[%sh] = ", ind, per, pos, first);
      snprintf(e, sizeof e, "%s(ld, h)", fm_cg_get_fn(t->dtype));
      fm_cg_emit_decode(sb, t->dtype, e);
      fm_strbuf_printf(sb, ";\n%s}\n", ind);
    }
    free(o);
    fm_strbuf_free(&off);
  }
}

/* Every needed value of the unit, in position order; consts stay scalars (rowval 0). */
static void emit_unit_values(fm_strbuf *sb, const cat_gen *g, const uint8_t *need, const cat_ctx *cx, uint32_t vec) {
  const uint32_t n_in = g->p.n_in;
  for (uint32_t pos = 0; pos < n_in + g->p.n_ops; pos++) {
    if (!need[pos]) continue;
    if (pos < n_in) {
      emit_unit_input(sb, g, pos, cx, vec);
      continue;
    }
    const uint32_t i = pos - n_in;
    if (fm_op_kind(g->f->ops[i].op) == FM_OPK_CAT) {
      emit_cat(sb, g, i, cx, vec);
      continue;
    }
    if (!g->p.rowval[pos]) {
      fm_strbuf_printf(sb, "%sconst %s v%u = ", cx->ind, fm_cg_val_type(g->p.vdt[pos]), pos);
      fm_cg_emit_op(sb, g->f, &g->p, i);
      fm_strbuf_printf(sb, ";  /* %s */\n", fm_op_name(g->f->ops[i].op));
      continue;
    }
    fm_strbuf_printf(sb, "%s%s v%u[%u];\n#pragma unroll\n%sfor (int i = 0; i < %u; ++i) v%u[i] = ", cx->ind,
                     fm_cg_val_type(g->p.vdt[pos]), pos, vec, cx->ind, vec, pos);
    fm_cg_emit_op(sb, g->f, &g->p, i);
    fm_strbuf_printf(sb, ";  /* %s */\n", fm_op_name(g->f->ops[i].op));
  }
}

/* rowval for the unit form: every value an array but the consts (and what only consts make). */
static void unit_rowvals(cat_gen *g) {
  for (uint32_t k = 0; k < g->p.n_in; k++) g->p.rowval[k] = 1;
  for (uint32_t i = 0; i < g->p.n_ops; i++) {
    const uint32_t pos = g->p.n_in + i;
    const fm_opnode *op = &g->f->ops[i];
    g->p.rowval[pos] = fm_op_kind(op->op) == FM_OPK_CAT;
    for (uint32_t a = 0; a < op->nargs; a++) g->p.rowval[pos] |= g->p.rowval[g->p.args[i][a]];
  }
}

/* Dims 1..rank-1 of the iteration shape t (outputs[0]) that move (size > 1), fastest first:
 * ascending stride, ties to the higher dim (a row-major t gives rank-1, rank-2, ..., 1). Dim 0
 * stays outermost (a symbolic one has the largest stride). Returns how many. */
static uint32_t memory_order(const fm_tensor *t, uint32_t order[FM_MAX_RANK]) {
  uint32_t n = 0;
  for (uint32_t j = t->rank; j-- > 1;) {
    if (t->shape[j] == 1) continue;
    uint32_t k = n++; /* insertion: those with a larger stride move up */
    while (k > 0 && t->strides[order[k - 1]] > t->strides[j]) {
      order[k] = order[k - 1];
      k--;
    }
    order[k] = j;
  }
  return n;
}

/* The widest unit (elements along the last dim, at most 16 bytes of any output) that every
 * output stores as one aligned vector: row-major along the last dim, a whole number of units
 * in it, every other stride and the alignment multiples of the unit. 1 with a window op. */
uint32_t fm_cg_cat_widest_unit(const fm_fragment *f) {
  if (f->n_outputs < 1 || f->n_outputs > FM_MAX_OUTPUTS || f->n_ops > FM_MAX_OPS) return 1;
  const uint32_t r = f->outputs[0].rank;
  size_t widest = 1;
  if (r == 0 || r > FM_MAX_RANK) return 1;
  for (uint32_t i = 0; i < f->n_ops; i++)
    if (fm_op_kind(f->ops[i].op) == FM_OPK_WINDOW) return 1;
  for (uint32_t k = 0; k < f->n_outputs; k++)
    if (fm_dtype_size(f->outputs[k].dtype) > widest) widest = fm_dtype_size(f->outputs[k].dtype);
  for (uint32_t w = 16u / (uint32_t)widest; w > 1; w /= 2) {
    int legal = 1;
    for (uint32_t k = 0; legal && k < f->n_outputs; k++) {
      const fm_tensor *t = &f->outputs[k];
      legal = t->strides[r - 1] == 1 && t->shape[r - 1] % w == 0 && t->align >= w * fm_dtype_size(t->dtype);
      for (uint32_t j = 0; legal && j + 1 < r; j++) legal = t->shape[j] == 1 || t->strides[j] % w == 0;
    }
    if (legal) return w;
  }
  return 1;
}

/* Unit width for a config: the widest legal, capped by the config's vec (0: no cap). */
static uint32_t unit_width(const cat_gen *g, const fm_pw_config *cfg) {
  uint32_t w = fm_cg_cat_widest_unit(g->f);
  while (cfg->vec && w > cfg->vec) w /= 2;
  return w;
}

/* The unit's values as register arrays (rowval set), packed into w<k>. */
static void emit_unit_body(fm_strbuf *sb, const cat_gen *g, const uint8_t *need, const cat_ctx *cx, uint32_t vec) {
  emit_unit_values(sb, g, need, cx, vec);
  fm_strbuf_printf(sb, "#pragma unroll\n%sfor (int q = 0; q < %u; ++q) {\n", cx->ind, vec);
  for (uint32_t k = 0; k < g->p.n_out; k++) {
    const fm_cg_tensor *t = &g->p.t[g->p.n_in + k];
    char v[24];
    snprintf(v, sizeof v, g->p.rowval[t->value] ? "v%u[q]" : "v%u", t->value);
    fm_strbuf_printf(sb, "%s  %s(w%u, q, ", cx->ind, fm_cg_put_fn(t->dtype), k);
    fm_cg_emit_encode(sb, t->dtype, g->p.vdt[t->value], v);
    fm_strbuf_append(sb, ");\n");
  }
  fm_strbuf_printf(sb, "%s}\n", cx->ind);
}

/* The unit's elements one at a time (rowval clear), each packed into w<k>. */
static void emit_element_body(fm_strbuf *sb, const cat_gen *g, const uint8_t *need, const cat_ctx *cx, uint32_t vec) {
  const uint32_t r = g->f->outputs[0].rank;
  cat_ctx el = *cx;
  el.ind = "        ";
  snprintf(el.coord[r - 1], sizeof el.coord[r - 1], "cl");
  fm_strbuf_printf(sb,
                   "#pragma unroll\n"
                   "      for (int q = 0; q < %u; ++q) {\n"
                   "        const long long cl = %s + q;\n",
                   vec, cx->coord[r - 1]);
  emit_values(sb, g, need, &el);
  for (uint32_t k = 0; k < g->p.n_out; k++) {
    const fm_cg_tensor *t = &g->p.t[g->p.n_in + k];
    char v[16];
    snprintf(v, sizeof v, "v%u", t->value);
    fm_strbuf_printf(sb, "        %s(w%u, q, ", fm_cg_put_fn(t->dtype), k);
    fm_cg_emit_encode(sb, t->dtype, g->p.vdt[t->value], v);
    fm_strbuf_append(sb, ");\n");
  }
  fm_strbuf_append(sb, "      }\n");
}

/* `straddles`: whether the unit at cx's coordinates holds a split of the cat along the last
 * dim (its first element a multiple of vec, so a split s off a multiple falls in the unit
 * starting at s - s % vec). */
static void emit_straddle_test(fm_strbuf *sb, const cat_gen *g, const cat_ctx *cx, uint32_t vec) {
  const uint32_t r = g->f->outputs[0].rank, i = (uint32_t)g->split_cat;
  const fm_opnode *op = &g->f->ops[i];
  const char *sep = "";
  int64_t split = 0;
  fm_strbuf_append(sb, "      const bool straddles = ");
  for (uint32_t a = 0; a + 1 < op->nargs; a++) {
    split += g->ci.ext[g->p.args[i][a]][r - 1];
    if (split % vec == 0) continue;
    fm_strbuf_printf(sb, "%s%s == %lldLL", sep, cx->coord[r - 1], (long long)(split - split % vec));
    sep = " || ";
  }
  fm_strbuf_append(sb, ";  /* a cat's split inside the unit */\n");
}

static void emit_kernel(fm_strbuf *sb, cat_gen *g, const fm_pw_config *cfg, uint32_t vec, const char *entry) {
  const fm_tensor *it = &g->f->outputs[0];
  const uint32_t r = it->rank, per_step = cfg->block * cfg->unroll;
  fm_cg_emit_signature(sb, &g->p, cfg->block, 0, entry);
  if (g->p.symbolic)
    fm_strbuf_printf(sb, "  const long long n = outer * %lldLL;\n", (long long)g->p.inner);
  else
    fm_strbuf_printf(sb, "  const long long n = %lldLL;\n", (long long)(g->p.outer * g->p.inner));
  if (vec > 1) fm_strbuf_printf(sb, "  const long long nu = n / %u;  /* units of %u elements */\n", vec, vec);
  fm_strbuf_printf(sb,
                   "  for (long long e0 = (long long)blockIdx.x * %u + threadIdx.x; e0 < %s;\n"
                   "       e0 += (long long)gridDim.x * %u) {\n"
                   "#pragma unroll\n"
                   "    for (int u = 0; u < %u; ++u) {\n",
                   per_step, vec > 1 ? "nu" : "n", per_step, cfg->unroll);
  if (vec > 1)
    fm_strbuf_printf(sb,
                     "      if (e0 + u * %u >= nu) break;\n"
                     "      const long long e = (e0 + u * %u) * %u;  /* the unit's first element */\n",
                     cfg->block, cfg->block, vec);
  else
    fm_strbuf_printf(sb,
                     "      const long long e = e0 + u * %u;\n"
                     "      if (e >= n) break;\n",
                     cfg->block);
  cat_ctx cx = {.ind = "      "};
  /* dim 0 by one 64-bit division; the rest within a unit of dim 0, in 32 bits when it fits
   * (a division by a constant is then a multiply-high, not a 64-bit sequence) */
  const char *rt = g->p.inner <= (int64_t)UINT32_MAX ? "unsigned int" : "unsigned long long";
  const char *suffix = g->p.inner <= (int64_t)UINT32_MAX ? "u" : "ull";
  if (r > 0) {
    snprintf(cx.coord[0], sizeof cx.coord[0], "c0");
    if (r == 1 || g->p.inner == 1)
      fm_strbuf_append(sb, "      const long long c0 = e;\n");
    else
      fm_strbuf_printf(sb, "      const long long c0 = e / %lldLL;\n", (long long)g->p.inner);
    if (r > 1 && g->p.inner > 1)
      fm_strbuf_printf(sb, "      %s r = (%s)(e - c0 * %lldLL);\n", rt, rt, (long long)g->p.inner);
  }
  uint32_t order[FM_MAX_RANK];
  const uint32_t n_order = memory_order(it, order);
  for (uint32_t j = 1; j < r; j++) snprintf(cx.coord[j], sizeof cx.coord[j], "c%u", j);
  for (uint32_t k = 0; k < n_order; k++) {
    const uint32_t j = order[k];
    fm_strbuf_printf(sb, "      const long long c%u = (long long)(r %% %lld%s);\n", j, (long long)it->shape[j], suffix);
    fm_strbuf_printf(sb, "      r /= %lld%s;\n", (long long)it->shape[j], suffix);
  }
  uint8_t need[FM_CG_MAX_VALUES];
  mark_needs(g, -1, need);
  if (vec == 1) {
    emit_values(sb, g, need, &cx);
    for (uint32_t k = 0; k < g->p.n_out; k++) {
      const fm_cg_tensor *t = &g->p.t[g->p.n_in + k];
      char v[16];
      snprintf(v, sizeof v, "v%u", t->value);
      fm_strbuf_printf(sb, "      out%u[", k);
      fm_cg_emit_offset(sb, &g->f->outputs[k], cx.coord, g->f->outputs[k].rank);
      fm_strbuf_append(sb, "] = ");
      fm_cg_emit_encode(sb, t->dtype, g->p.vdt[t->value], v);
      fm_strbuf_append(sb, ";\n");
    }
    fm_strbuf_append(sb, "    }\n  }\n}\n");
    return;
  }
  /* a unit: its elements one by one along the last dim, packed, then one store per output */
  for (uint32_t k = 0; k < g->p.n_out; k++) {
    const char *vt = fm_cg_vec_type(vec * (uint32_t)fm_dtype_size(g->p.t[g->p.n_in + k].dtype));
    fm_strbuf_printf(sb, "      %s w%u = {};\n", vt, k);
  }
  if (g->units == UNITS_WHOLE) {
    emit_unit_body(sb, g, need, &cx, vec);
  } else if (g->units == UNITS_UNLESS_STRADDLING) {
    emit_straddle_test(sb, g, &cx, vec);
    fm_strbuf_append(sb, "      if (!straddles) {\n");
    cat_ctx in = cx;
    in.ind = "        ";
    /* the op emitter names a value v<pos>[i] or v<pos> by rowval: set for the unit, cleared
       again for the element-by-element body below */
    unit_rowvals(g);
    emit_unit_body(sb, g, need, &in, vec);
    memset(g->p.rowval, 0, sizeof g->p.rowval);
    fm_strbuf_append(sb, "      } else {\n");
    emit_element_body(sb, g, need, &cx, vec);
    fm_strbuf_append(sb, "      }\n");
  } else {
    emit_element_body(sb, g, need, &cx, vec);
  }
  for (uint32_t k = 0; k < g->p.n_out; k++) {
    const char *vt = fm_cg_vec_type(vec * (uint32_t)fm_dtype_size(g->p.t[g->p.n_in + k].dtype));
    fm_strbuf_printf(sb, "      *reinterpret_cast<%s *>(out%u + ", vt, k);
    fm_cg_emit_offset(sb, &g->f->outputs[k], cx.coord, g->f->outputs[k].rank);
    fm_strbuf_printf(sb, ") = w%u;\n", k);
  }
  fm_strbuf_append(sb, "    }\n  }\n}\n");
}

/* The plan's value table, with the checks every generator makes on what it indexes. */
static int build(const fm_fragment *f, cat_gen *g, fm_diag *d) {
  memset(&g->p, 0, sizeof g->p);
  g->f = f;
  if (f->n_inputs > FM_MAX_INPUTS || f->n_ops > FM_MAX_OPS || f->n_outputs < 1 || f->n_outputs > FM_MAX_OUTPUTS ||
      f->outputs[0].rank > FM_MAX_RANK)
    return fm_diag_set(d, FM_EINVAL, "codegen: fragment exceeds the limits");
  g->p.n_in = f->n_inputs;
  g->p.n_out = f->n_outputs;
  g->p.n_ops = f->n_ops;
  int rc = fm_cg_plan_values(f, &g->p, FM_CG_ALLOW_EXTENT, d);
  if (rc) return rc;
  if ((rc = fm_fragment_cat_info(f, &g->ci, d))) return rc == FM_EUNSUPPORTED ? rc : FM_EINVAL;
  for (uint32_t i = 0; i < f->n_ops; i++)
    if (fm_op_kind(f->ops[i].op) == FM_OPK_CAT && (f->ops[i].dim < 0 || (uint32_t)f->ops[i].dim >= f->outputs[0].rank))
      return fm_diag_set(d, FM_EINVAL, "codegen: ops[%u]: a cat's dim is not canonical", i);
  for (uint32_t k = 0; k < g->p.n_in + g->p.n_out; k++) {
    const fm_tensor *t = k < g->p.n_in ? &f->inputs[k] : &f->outputs[k - g->p.n_in];
    if ((unsigned)t->dtype >= FM_DT__COUNT) return fm_diag_set(d, FM_EINVAL, "codegen: invalid dtype");
    g->p.t[k].dtype = t->dtype;
    g->p.t[k].align = t->align;
    if (k < g->p.n_in) g->p.t[k].value = k;
  }
  const fm_tensor *it = &f->outputs[0];
  g->p.symbolic = it->rank > 0 && it->shape[0] == FM_DIM_SYMBOLIC;
  g->p.inner = 1;
  for (uint32_t j = 1; j < it->rank; j++) g->p.inner *= it->shape[j];
  g->p.outer = it->rank == 0 ? 1 : it->shape[0];
  return FM_OK;
}

int fm_codegen_cat(const fm_fragment *canon, const fm_pw_config *cfg, uint32_t sm_count, char **src,
                   fm_kernel_meta *meta, fm_diag *d) {
  fm_strbuf sb;
  fm_strbuf_init(&sb, FM_CG_MAX_SOURCE);
  char entry[FM_META_ENTRY_MAX];
  /* the plan and the extents are tens of KiB: keep them off worker-thread stacks */
  cat_gen *g = malloc(sizeof *g);
  int rc = g ? build(canon, g, d) : fm_diag_set(d, FM_ENOMEM, "codegen: out of memory");
  if (rc) goto out;
  snprintf(entry, sizeof entry, "fm_pointwise_v%d", FM_CODEGEN_VERSION);
  const uint32_t vec = unit_width(g, cfg);
  g->units = unit_form(g, vec, &g->split_cat);
  if (g->units == UNITS_WHOLE) unit_rowvals(g);
  fm_strbuf_printf(&sb,
                   "/* fusemld codegen v%d: pointwise kernel, CAT path, vec %u, unroll %u, block %u.\n"
                   " * Generated from a canonical fragment: every name and number below comes "
                   "from its\n * typed fields. One self-contained translation unit (NVRTC has "
                   "no include path). */\n",
                   FM_CODEGEN_VERSION, vec, cfg->unroll, cfg->block);
  fm_cg_emit_prelude(&sb, fm_cg_fast_math(canon));
  fm_strbuf_append(&sb, "/* ---- the kernel ---- */\n");
  emit_kernel(&sb, g, cfg, vec, entry);
  if (fm_strbuf_error(&sb)) {
    rc = fm_diag_set(d, FM_ECODEGEN, "codegen: source buffer: %s", fm_strerror(fm_strbuf_error(&sb)));
    goto out;
  }
  fm_cg_meta_begin(meta, "pointwise", "elementwise", entry, cfg->block, &g->p);
  meta->inner = (uint64_t)g->p.inner;
  meta->items_per_block = (uint64_t)cfg->block * cfg->unroll * vec;
  uint64_t max_blocks = (uint64_t)cfg->blocks_per_sm * (sm_count ? sm_count : FM_CG_DEFAULT_SMS);
  meta->max_blocks = max_blocks > 0x7fffffffu ? 0x7fffffffu : (uint32_t)max_blocks;
  meta->outer = g->p.symbolic ? -1 : g->p.outer;
  *src = fm_strbuf_take(&sb);
  if (!*src) rc = fm_diag_set(d, FM_ENOMEM, "codegen: out of memory");
out:
  fm_strbuf_free(&sb);
  free(g);
  return rc;
}
