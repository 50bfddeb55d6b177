/* fm_codegen_rows_stream.c: the body of the rows template's STREAM variant, for rows longer
 * than registers hold (a vocabulary's logits: 50 257 for GPT-2, 128 256 for Llama 3).
 *
 * A block owns a row and walks it in tiles of block * ept elements, each tile loaded into
 * registers as the held variant loads a whole row: the whole tiles in a loop that tests no
 * column against the row's end, then the last tile, where the row ends inside it. A
 * reduction needs every tile, so the kernel makes passes: a value's *level* is the number of
 * reductions in its longest chain (inputs and consts 0; an op the max of its operands'; a
 * reduction one more than its operand). Pass L computes, tile by tile, the whole-row values
 * that level-L reductions read and accumulates each in a per-thread fp32 partial, then
 * reduces the partials across the block; the per-row values of level L follow at once. A
 * last pass computes the row outputs and stores them. A row output no reduction precedes
 * (level 0: Gemma 2's softcapped logits, written beside the loss's statistics) is stored in
 * the first pass, which computes it anyway; when every row output is such, there is no last
 * pass: the row is read once.
 *
 * A sum of exp(x - amax(x)) (softmax's, log_softmax's, cross-entropy's denominator) would be
 * level 2, a second pass; it is accumulated in the amax's pass instead, as an *online* pair
 * (the online normaliser of Milakov and Gimelshein, 2018): each thread keeps its running
 * max m and s = sum exp(x - m), and per tile takes the tile's max t = max(m, x...) first,
 * then s = s * exp(m - t) + sum exp(x - t) and m = t: one exp an element and one a tile.
 * The block combines them as S = sum_t s_t * exp(m_t - M) after M = max_t m_t. A thread
 * that met only -inf keeps m = -inf and s = 0 (its tiles shift by 0, so no inf - inf), and
 * its count vanishes in exp(-inf - M) unless the whole row is -inf, where, as in the two-pass
 * form, the sum is NaN (exp(-inf - -inf)); an inf in the row makes it NaN the same way.
 * Cross-entropy's forward thus reads its row once; log_softmax (amax and sum; x - max - log
 * sum) reads it twice, the second time from L2 when the rows in flight fit there, and writes
 * it once.
 *
 * var is refused (FM_EUNSUPPORTED): its exact form centres on the row's mean, which a single
 * pass does not have (validation refuses var over rows this long before codegen sees it). */
#include <stdio.h>

#include "fm_codegen_rows.h"

/* The op at value position pos, or NULL for an input. */
static const fm_opnode *op_at(const fm_fragment *f, const fm_cg_plan *p, uint32_t pos) {
  return pos < p->n_in ? NULL : &f->ops[pos - p->n_in];
}

/* The position of the live amax whose pass op i accumulates in, as an online pair (above):
 * op i is sum(exp(sub(x, m))) with m = amax(x) of the same x; else 0 (no amax is an input). */
static uint32_t online_max_of(const fm_fragment *f, const fm_cg_plan *p, uint32_t i) {
  if (f->ops[i].op != FM_OP_SUM) return 0;
  uint32_t e = p->args[i][0];
  const fm_opnode *exp_op = op_at(f, p, e);
  if (!exp_op || exp_op->op != FM_OP_EXP) return 0;
  uint32_t diff = p->args[e - p->n_in][0];
  const fm_opnode *sub_op = op_at(f, p, diff);
  if (!sub_op || sub_op->op != FM_OP_SUB) return 0;
  uint32_t x = p->args[diff - p->n_in][0], m = p->args[diff - p->n_in][1];
  const fm_opnode *max_op = op_at(f, p, m);
  if (!max_op || max_op->op != FM_OP_AMAX || !p->live[m] || p->args[m - p->n_in][0] != x) return 0;
  return m;
}

/* Levels of every value (inputs, then ops), as above; pair[S] = M and pair[M] = S for each
 * online pair (at most one sum per amax), 0 elsewhere. */
static void value_levels(const fm_fragment *f, const fm_cg_plan *p, uint32_t *level, uint32_t *pair) {
  for (uint32_t v = 0; v < p->n_in + p->n_ops; v++) level[v] = pair[v] = 0;
  for (uint32_t i = 0; i < p->n_ops; i++) {
    uint32_t pos = p->n_in + i, l = 0, m = p->live[pos] ? online_max_of(f, p, i) : 0;
    if (m && !pair[m]) {
      pair[m] = pos;
      pair[pos] = m;
      level[pos] = level[m];
      continue;
    }
    for (uint32_t a = 0; a < f->ops[i].nargs; a++)
      if (level[p->args[i][a]] > l) l = level[p->args[i][a]];
    level[pos] = l + (fm_op_kind(f->ops[i].op) == FM_OPK_REDUCE);
  }
}

/* The whole-row value a reduction accumulates over its tiles: its operand, or for the sum of
 * an online pair the x its amax reads. */
static uint32_t reduced_value(const fm_cg_plan *p, uint32_t i, const uint32_t *pair) {
  uint32_t pos = p->n_in + i, m = pair[pos];
  int online_sum = m && m < pos;
  return online_sum ? p->args[m - p->n_in][0] : p->args[i][0];
}

/* need[pos] = 1 for every whole-row value a target reads, through whole-row operands only
 * (per-row operands are already in scope as scalars). targets[pos] marks the roots. */
static void mark_row_needs(const fm_fragment *f, const fm_cg_plan *p, const uint8_t *targets, uint8_t *need) {
  uint32_t n_values = p->n_in + p->n_ops;
  for (uint32_t v = 0; v < n_values; v++) need[v] = targets[v];
  for (uint32_t i = p->n_ops; i-- > 0;) {
    uint32_t pos = p->n_in + i;
    if (!need[pos]) continue;
    for (uint32_t a = 0; a < f->ops[i].nargs; a++) {
      uint32_t at = p->args[i][a];
      if (p->rowval[at]) need[at] = 1;
    }
  }
}

/* One tile's whole-row values that `need` marks: row inputs loaded, row ops computed. */
static void emit_tile_values(fm_strbuf *sb, const fm_fragment *f, const fm_cg_rows_plan *rp, const fm_cg_rows_shape *s,
                             const uint8_t *need) {
  const fm_cg_plan *p = &rp->base;
  for (uint32_t k = 0; k < p->n_in; k++)
    if (need[k] && p->rowval[k]) fm_cg_rows_emit_load_row(sb, rp, s, k);
  for (uint32_t i = 0; i < p->n_ops; i++) {
    uint32_t pos = p->n_in + i;
    if (need[pos] && p->rowval[pos] && fm_op_kind(f->ops[i].op) != FM_OPK_REDUCE) fm_cg_rows_emit_op(sb, f, p, s, i);
  }
}

/* The per-row (scalar) ops of one level, in order; level 0 also loads the per-row inputs. */
static void emit_scalars(fm_strbuf *sb, const fm_fragment *f, const fm_cg_plan *p, const fm_cg_rows_shape *s,
                         const uint32_t *level, uint32_t l) {
  if (l == 0)
    for (uint32_t k = 0; k < p->n_in; k++)
      if (p->live[k] && !p->rowval[k]) fm_cg_rows_emit_load_per_row(sb, p, k);
  for (uint32_t i = 0; i < p->n_ops; i++) {
    uint32_t pos = p->n_in + i;
    if (p->live[pos] && !p->rowval[pos] && level[pos] == l && fm_op_kind(f->ops[i].op) != FM_OPK_REDUCE)
      fm_cg_rows_emit_op(sb, f, p, s, i);
  }
}

/* Is output k a row output that the first reduction pass stores (there is one: top, the
 * highest level, is at least 1; and no reduction precedes the output)? */
static int stored_early(const fm_cg_plan *p, const uint32_t *level, uint32_t top, uint32_t k) {
  uint32_t pos = p->t[p->n_in + k].value;
  return top > 0 && p->rowval[pos] && level[pos] == 0;
}

/* "for each element i of this thread's tile inside the row: <statement>" */
static void emit_each_valid(fm_strbuf *sb, const fm_cg_rows_plan *rp, const fm_cg_rows_shape *s, const char *stmt) {
  fm_strbuf_printf(sb, "#pragma unroll\n      for (int i = 0; i < %u; ++i)\n        if (", s->ept);
  fm_cg_rows_emit_valid(sb, rp, s, "i");
  fm_strbuf_printf(sb, ") %s\n", stmt);
}

/* One tile's update of an online pair (sum S at pos, amax M at m, of x): the tile's max first,
 * then one exp an element against it and one rescale of the running sum, so that no element
 * waits on the previous one's max (the per-element form's dependent chain and selects made
 * the pass issue-bound: 1.7 TB/s on Llama's 4096 x 32000 logits). A tile that is -inf so far
 * shifts by 0, where exp(-inf) is 0 and the running sum stays 0; a NaN or +inf in the tile
 * makes the shift and so the sum NaN, as the two-pass form does. */
static void emit_online_tile(fm_strbuf *sb, const fm_cg_rows_plan *rp, const fm_cg_rows_shape *s, uint32_t pos,
                             uint32_t m, uint32_t x) {
  char stmt[96];
  fm_strbuf_printf(sb,
                   "    {  /* online: the tile's max, then the sum of exp(x - max) rescaled once */\n"
                   "      float fm_tm = fm_a%u;\n",
                   m);
  snprintf(stmt, sizeof stmt, "fm_tm = fm_maximum(fm_tm, v%u[i]);", x);
  emit_each_valid(sb, rp, s, stmt);
  fm_strbuf_append(sb,
                   "      const float fm_sh = fm_tm == __int_as_float(0xff800000) ? 0.0f : fm_tm;\n"
                   "      float fm_ts = 0.0f;\n");
  snprintf(stmt, sizeof stmt, "fm_ts += fm_exp(v%u[i] - fm_sh);", x);
  emit_each_valid(sb, rp, s, stmt);
  fm_strbuf_printf(sb,
                   "      fm_a%u = fmaf(fm_a%u, fm_exp(fm_a%u - fm_sh), fm_ts);\n"
                   "      fm_a%u = fm_tm;\n"
                   "    }\n",
                   pos, pos, m, m);
}

/* What one tile of a pass does (emit_tile_body): a reduction pass's accumulations of level l
 * (and, in pass 1, the row outputs no reduction precedes), or the last pass's row stores. */
typedef struct tile_pass {
  const fm_fragment *f;
  const fm_cg_rows_plan *rp;
  const uint32_t *level, *pair;
  uint32_t l;             /* 0: the last pass */
  const uint8_t *need;    /* the whole-row values the tile computes */
  const uint8_t *targets; /* the last pass: the values its row outputs store */
} tile_pass;

static void emit_tile_body(fm_strbuf *sb, const tile_pass *tp, const fm_cg_rows_shape *s) {
  const fm_fragment *f = tp->f;
  const fm_cg_rows_plan *rp = tp->rp;
  const fm_cg_plan *p = &rp->base;
  emit_tile_values(sb, f, rp, s, tp->need);
  if (!tp->l) {
    for (uint32_t k = 0; k < p->n_out; k++)
      if (tp->targets[p->t[p->n_in + k].value]) fm_cg_rows_emit_store_row(sb, rp, s, k);
    return;
  }
  for (uint32_t i = 0; i < p->n_ops; i++) {
    uint32_t pos = p->n_in + i, x = reduced_value(p, i, tp->pair), m = tp->pair[pos];
    if (!p->live[pos] || tp->level[pos] != tp->l || fm_op_kind(f->ops[i].op) != FM_OPK_REDUCE) continue;
    if (m > pos) continue; /* an amax its online sum updates */
    if (m) {
      emit_online_tile(sb, rp, s, pos, m, x);
      continue;
    }
    char stmt[64];
    if (f->ops[i].op == FM_OP_AMAX)
      snprintf(stmt, sizeof stmt, "fm_a%u = fm_maximum(fm_a%u, v%u[i]);", pos, pos, x);
    else
      snprintf(stmt, sizeof stmt, "fm_a%u += v%u[i];", pos, x);
    emit_each_valid(sb, rp, s, stmt);
  }
  if (tp->l == 1)
    for (uint32_t k = 0; k < p->n_out; k++)
      if (stored_early(p, tp->level, tp->l, k)) fm_cg_rows_emit_store_row(sb, rp, s, k);
}

/* A pass over the row's tiles: the whole tiles in a loop with no test of any column against
 * the row's end, then the last tile, where the row ends inside it, with those tests. Tested in
 * every tile, the masks cost an integer compare an element and statement: on cross-entropy's
 * forward over 32 000 columns (three statements an element: the tile's max, its exps, the
 * picked logit) they were as many instructions as the arithmetic. */
static void emit_tiles(fm_strbuf *sb, const tile_pass *tp, const fm_cg_rows_shape *s) {
  const unsigned long long tile = (unsigned long long)s->tpr * s->ept;
  const long long whole = tp->rp->n / (long long)tile * (long long)tile;
  fm_cg_rows_shape inside = *s;
  inside.exact = 1;
  inside.ragged = 0; /* every chunk of a whole tile is inside the row */
  if (whole > 0) {
    fm_strbuf_printf(sb, "#pragma unroll 1\n    for (long long fm_t0 = 0; fm_t0 < %lldLL; fm_t0 += %lluLL) {\n", whole,
                     tile);
    emit_tile_body(sb, tp, &inside);
    fm_strbuf_append(sb, "    }\n");
  }
  if (whole < tp->rp->n) {
    fm_strbuf_printf(sb, "    {  /* the last tile: the row ends inside it */\n    const long long fm_t0 = %lldLL;\n",
                     whole);
    emit_tile_body(sb, tp, s);
    fm_strbuf_append(sb, "    }\n");
  }
}

/* Pass l: every live reduction of level l, accumulated over the tiles, then across the block. */
static void emit_reduce_pass(fm_strbuf *sb, const fm_fragment *f, const fm_cg_rows_plan *rp, const fm_cg_rows_shape *s,
                             const uint32_t *level, const uint32_t *pair, uint32_t l, uint8_t *targets, uint8_t *need) {
  const fm_cg_plan *p = &rp->base;
  uint32_t n_values = p->n_in + p->n_ops;
  for (uint32_t v = 0; v < n_values; v++) targets[v] = 0;
  if (l == 1)
    for (uint32_t k = 0; k < p->n_out; k++)
      if (stored_early(p, level, l, k)) targets[p->t[p->n_in + k].value] = 1;
  fm_strbuf_printf(sb, "    /* pass %u: the reductions of level %u */\n", l, l);
  for (uint32_t i = 0; i < p->n_ops; i++) {
    uint32_t pos = p->n_in + i;
    if (!p->live[pos] || level[pos] != l || fm_op_kind(f->ops[i].op) != FM_OPK_REDUCE) continue;
    targets[reduced_value(p, i, pair)] = 1;
    fm_strbuf_printf(sb, "    float fm_a%u = %s;\n", pos,
                     f->ops[i].op == FM_OP_AMAX ? "__int_as_float(0xff800000)" : "0.0f");
  }
  mark_row_needs(f, p, targets, need);
  const tile_pass tp = {f, rp, level, pair, l, need, targets};
  emit_tiles(sb, &tp, s);
  for (uint32_t i = 0; i < p->n_ops; i++) {
    uint32_t pos = p->n_in + i;
    if (!p->live[pos] || level[pos] != l || fm_op_kind(f->ops[i].op) != FM_OPK_REDUCE) continue;
    if (f->ops[i].op == FM_OP_AMAX)
      fm_strbuf_printf(sb, "    const float v%u = fm_row_max(fm_a%u, fm_red, fm_par);  /* amax */\n", pos, pos);
    else if (f->ops[i].op == FM_OP_SUM && pair[pos] && pair[pos] < pos)
      fm_strbuf_printf(
          sb, "    const float v%u = fm_row_sum(fm_a%u * fm_exp(fm_a%u - v%u), fm_red, fm_par);  /* online sum */\n",
          pos, pos, pair[pos], pair[pos]);
    else if (f->ops[i].op == FM_OP_SUM)
      fm_strbuf_printf(sb, "    const float v%u = fm_row_sum(fm_a%u, fm_red, fm_par);  /* sum */\n", pos, pos);
    else
      fm_strbuf_printf(sb, "    const float v%u = fm_row_sum(fm_a%u, fm_red, fm_par) / %lld.0f;  /* mean */\n", pos,
                       pos, (long long)rp->n);
  }
  emit_scalars(sb, f, p, s, level, l);
}

uint32_t fm_cg_rows_stream_passes(const fm_fragment *f, const fm_cg_rows_plan *rp) {
  const fm_cg_plan *p = &rp->base;
  uint32_t level[FM_CG_MAX_VALUES], pair[FM_CG_MAX_VALUES], top = 0, row_out = 0;
  value_levels(f, p, level, pair);
  for (uint32_t v = 0; v < p->n_in + p->n_ops; v++)
    if (p->live[v] && level[v] > top) top = level[v];
  for (uint32_t k = 0; k < p->n_out; k++)
    row_out |= p->rowval[p->t[p->n_in + k].value] && !stored_early(p, level, top, k);
  return top + row_out;
}

int fm_cg_rows_emit_stream_body(fm_strbuf *sb, const fm_fragment *f, const fm_cg_rows_plan *rp,
                                const fm_cg_rows_shape *s, fm_diag *d) {
  const fm_cg_plan *p = &rp->base;
  uint32_t level[FM_CG_MAX_VALUES], pair[FM_CG_MAX_VALUES];
  uint8_t targets[FM_CG_MAX_VALUES], need[FM_CG_MAX_VALUES];
  uint32_t n_values = p->n_in + p->n_ops, top = 0;
  for (uint32_t i = 0; i < p->n_ops; i++)
    if (f->ops[i].op == FM_OP_VAR && p->live[p->n_in + i])
      return fm_diag_set(d, FM_EUNSUPPORTED, "rows: var over a streamed row of %lld elements (it needs the row held)",
                         (long long)rp->n);
  value_levels(f, p, level, pair);
  for (uint32_t v = 0; v < n_values; v++)
    if (p->live[v] && level[v] > top) top = level[v];
  fm_strbuf_append(sb, "    /* the per-row inputs and values no reduction precedes */\n");
  emit_scalars(sb, f, p, s, level, 0);
  for (uint32_t l = 1; l <= top; l++) emit_reduce_pass(sb, f, rp, s, level, pair, l, targets, need);

  for (uint32_t v = 0; v < n_values; v++) targets[v] = 0;
  int any_row_out = 0;
  for (uint32_t k = 0; k < p->n_out; k++) {
    uint32_t pos = p->t[p->n_in + k].value;
    if (p->rowval[pos] && !stored_early(p, level, top, k)) targets[pos] = any_row_out = 1;
  }
  if (any_row_out) {
    fm_strbuf_append(sb, "    /* the last pass: the row outputs, tile by tile */\n");
    mark_row_needs(f, p, targets, need);
    const tile_pass tp = {f, rp, level, pair, 0, need, targets};
    emit_tiles(sb, &tp, s);
  }
  for (uint32_t k = 0; k < p->n_out; k++) {
    uint32_t t = p->n_in + k, pos = p->t[t].value;
    if (p->rowval[pos]) continue;
    char v[16];
    snprintf(v, sizeof v, "v%u", pos);
    fm_strbuf_printf(sb, "    if (lane == 0) out%u[b%u] = ", k, t);
    fm_cg_emit_encode(sb, p->t[t].dtype, p->vdt[pos], v);
    fm_strbuf_append(sb, ";\n");
  }
  return FM_OK;
}
