/* fm_codegen_rows_stream.c: the body of the rows template's STREAM variant, for rows longer
 * than registers hold (a vocabulary's logits: 50 257 for GPT-2, 128 256 for Llama 3).
 *
 * A block owns a row and walks it in tiles of block * ept elements, each tile loaded into
 * registers as the held variant loads a whole row. A reduction needs every tile, so the
 * kernel makes passes: a value's *level* is the number of reductions in its longest chain
 * (inputs and consts 0; an op the max of its operands'; a reduction one more than its
 * operand). Pass L computes, tile by tile, the whole-row values that level-L reductions read
 * and accumulates each in a per-thread fp32 partial, then reduces the partials across the
 * block; the per-row values of level L follow at once. A last pass computes the row outputs
 * and stores them. log_softmax (amax; sum of exp; x - max - log sum) reads its row three
 * times, the second and third from L2 when the rows in flight fit there, and writes it once.
 *
 * var is refused (FM_EUNSUPPORTED): its exact form centres on the row's mean, which a single
 * pass does not have (validation refuses var over rows this long before codegen sees it). */
#include <stdio.h>

#include "fm_codegen_rows.h"

/* Levels of every value (inputs, then ops), as above. */
static void value_levels(const fm_fragment *f, const fm_cg_plan *p, uint32_t *level) {
  for (uint32_t k = 0; k < p->n_in; k++) level[k] = 0;
  for (uint32_t i = 0; i < p->n_ops; i++) {
    uint32_t l = 0;
    for (uint32_t a = 0; a < f->ops[i].nargs; a++)
      if (level[p->args[i][a]] > l) l = level[p->args[i][a]];
    level[p->n_in + i] = l + (fm_op_kind(f->ops[i].op) == FM_OPK_REDUCE);
  }
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

/* Pass l: every live reduction of level l, accumulated over the tiles, then across the block. */
static void emit_reduce_pass(fm_strbuf *sb, const fm_fragment *f, const fm_cg_rows_plan *rp, const fm_cg_rows_shape *s,
                             const uint32_t *level, uint32_t l, uint8_t *targets, uint8_t *need) {
  const fm_cg_plan *p = &rp->base;
  uint32_t n_values = p->n_in + p->n_ops;
  for (uint32_t v = 0; v < n_values; v++) targets[v] = 0;
  fm_strbuf_printf(sb, "    /* pass %u: the reductions of level %u */\n", l, l);
  for (uint32_t i = 0; i < p->n_ops; i++) {
    uint32_t pos = p->n_in + i;
    if (!p->live[pos] || level[pos] != l || fm_op_kind(f->ops[i].op) != FM_OPK_REDUCE) continue;
    targets[p->args[i][0]] = 1;
    fm_strbuf_printf(sb, "    float fm_a%u = %s;\n", pos,
                     f->ops[i].op == FM_OP_AMAX ? "__int_as_float(0xff800000)" : "0.0f");
  }
  mark_row_needs(f, p, targets, need);
  fm_strbuf_printf(sb, "#pragma unroll 1\n    for (long long fm_t0 = 0; fm_t0 < %lldLL; fm_t0 += %lluLL) {\n",
                   (long long)rp->n, (unsigned long long)s->tpr * s->ept);
  emit_tile_values(sb, f, rp, s, need);
  for (uint32_t i = 0; i < p->n_ops; i++) {
    uint32_t pos = p->n_in + i, x = p->args[i][0];
    if (!p->live[pos] || level[pos] != l || fm_op_kind(f->ops[i].op) != FM_OPK_REDUCE) continue;
    fm_strbuf_printf(sb, "#pragma unroll\n    for (int i = 0; i < %u; ++i)\n      if (", s->ept);
    fm_cg_rows_emit_valid(sb, rp, s, "i");
    if (f->ops[i].op == FM_OP_AMAX)
      fm_strbuf_printf(sb, ") fm_a%u = fm_maximum(fm_a%u, v%u[i]);\n", pos, pos, x);
    else
      fm_strbuf_printf(sb, ") fm_a%u += v%u[i];\n", pos, x);
  }
  fm_strbuf_append(sb, "    }\n");
  for (uint32_t i = 0; i < p->n_ops; i++) {
    uint32_t pos = p->n_in + i;
    if (!p->live[pos] || level[pos] != l || fm_op_kind(f->ops[i].op) != FM_OPK_REDUCE) continue;
    if (f->ops[i].op == FM_OP_AMAX)
      fm_strbuf_printf(sb, "    const float v%u = fm_row_max(fm_a%u, fm_red, fm_par);  /* amax */\n", pos, pos);
    else if (f->ops[i].op == FM_OP_SUM)
      fm_strbuf_printf(sb, "    const float v%u = fm_row_sum(fm_a%u, fm_red, fm_par);  /* sum */\n", pos, pos);
    else
      fm_strbuf_printf(sb, "    const float v%u = fm_row_sum(fm_a%u, fm_red, fm_par) / %lld.0f;  /* mean */\n", pos,
                       pos, (long long)rp->n);
  }
  emit_scalars(sb, f, p, s, level, l);
}

int fm_cg_rows_emit_stream_body(fm_strbuf *sb, const fm_fragment *f, const fm_cg_rows_plan *rp,
                                const fm_cg_rows_shape *s, fm_diag *d) {
  const fm_cg_plan *p = &rp->base;
  uint32_t level[FM_CG_MAX_VALUES];
  uint8_t targets[FM_CG_MAX_VALUES], need[FM_CG_MAX_VALUES];
  uint32_t n_values = p->n_in + p->n_ops, top = 0;
  for (uint32_t i = 0; i < p->n_ops; i++)
    if (f->ops[i].op == FM_OP_VAR && p->live[p->n_in + i])
      return fm_diag_set(d, FM_EUNSUPPORTED, "rows: var over a streamed row of %lld elements (it needs the row held)",
                         (long long)rp->n);
  value_levels(f, p, level);
  for (uint32_t v = 0; v < n_values; v++)
    if (p->live[v] && level[v] > top) top = level[v];
  fm_strbuf_append(sb, "    /* the per-row inputs and values no reduction precedes */\n");
  emit_scalars(sb, f, p, s, level, 0);
  for (uint32_t l = 1; l <= top; l++) emit_reduce_pass(sb, f, rp, s, level, l, targets, need);

  fm_strbuf_append(sb, "    /* the last pass: the row outputs, tile by tile */\n");
  for (uint32_t v = 0; v < n_values; v++) targets[v] = 0;
  int any_row_out = 0;
  for (uint32_t k = 0; k < p->n_out; k++) {
    uint32_t pos = p->t[p->n_in + k].value;
    if (p->rowval[pos]) targets[pos] = any_row_out = 1;
  }
  if (any_row_out) {
    mark_row_needs(f, p, targets, need);
    fm_strbuf_printf(sb, "#pragma unroll 1\n    for (long long fm_t0 = 0; fm_t0 < %lldLL; fm_t0 += %lluLL) {\n",
                     (long long)rp->n, (unsigned long long)s->tpr * s->ept);
    emit_tile_values(sb, f, rp, s, need);
    for (uint32_t k = 0; k < p->n_out; k++)
      if (p->rowval[p->t[p->n_in + k].value]) fm_cg_rows_emit_store_row(sb, rp, s, k);
    fm_strbuf_append(sb, "    }\n");
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
