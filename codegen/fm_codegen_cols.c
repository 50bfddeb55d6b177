/* fm_codegen_cols.c: the cols template: one kernel per column fragment (reductions over
 * dim 0 of an [M, N] space with a pointwise prologue per element and an epilogue per column;
 * the bias gradient `grad.sum(0)` of every nn.Linear in a backward pass).
 *
 * A block owns a strip of W columns. Its threads are TX across the strip, each V contiguous
 * columns (V = 8: one 16-byte access per row of a 16-bit input; V = 1: the scalar form for
 * layouts that forbid it), and TY = block / TX rows at a time. The M rows of a strip are
 * split across the S blocks of a thread block cluster along grid y (rank r takes rows r * TY
 * + ty, stepping by S * TY), each thread loading U rows of every input before it adds any,
 * so that U * 16 bytes per thread are in flight. Every reduction keeps one fp32 partial per
 * column and thread; the TY partials of a column are folded in shared memory in a fixed
 * order, then (S > 1) rank 0 adds the other blocks' results through distributed shared
 * memory in rank order, between two cluster barriers (the second keeps every block alive
 * until rank 0 has read it), and runs the per-column epilogue and the stores. The result is
 * deterministic; one launch, no scratch, no atomics. M = 0 still writes every output.
 *
 * The split form (G > 1 groups): with few columns the strips times the cluster are too few
 * blocks to fill the GPU (64 channels of a batch norm over 800k rows: 8 blocks at most, 50 us
 * where the bytes take 25). G clusters then share the rows (block y of the grid takes rows
 * y * TY + ty, stepping by G * S * TY), each cluster's rank 0 writes its fp32 partials to a
 * scratch buffer the caller allocates ([G][reductions][N]), and a second kernel (one thread
 * per column) adds the G partials in group order and runs the epilogue: still deterministic,
 * no atomics, two launches (fm_meta.h, finish). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fm_codegen_cols.h"

#define MAX_SOURCE          (1u << 20)
#define MAX_SMEM            (48u * 1024u) /* static shared memory */
#define DEFAULT_BLOCK       256u
#define FINISH_BLOCK        256u
#define MAX_GROUPS          256u
/* The blocks a split form aims at: two waves of the largest GPUs' SMs (132 on an H100 or
 * H200); the tuner times the candidates, so the figure only picks which to time. */
#define SPLIT_TARGET_BLOCKS 264u

/* The shape of one kernel. */
typedef struct shape {
  uint32_t w, s, v, u, block; /* strip width, cluster, columns per thread, unroll, threads */
  uint32_t tx, ty;            /* threads across the strip, rows at a time */
  uint32_t g;                 /* groups of clusters sharing the rows (1: not split) */
} shape;

static int pow2(uint32_t x) { return x && !(x & (x - 1)); }

static int make_shape(const fm_cg_cols_plan *cp, const fm_cols_config *c, shape *s, fm_diag *d) {
  if (!pow2(c->width) || c->width < 8 || c->width > 1024)
    return fm_diag_set(d, FM_EINVAL, "config: width %u is not a power of two in 8..1024", c->width);
  if (c->cluster != 1 && c->cluster != 2 && c->cluster != 4 && c->cluster != 8)
    return fm_diag_set(d, FM_EINVAL, "config: cluster %u is not 1, 2, 4 or 8", c->cluster);
  if (c->vec != 1 && c->vec != FM_COLS_VEC)
    return fm_diag_set(d, FM_EINVAL, "config: vec %u is not 1 or %u", c->vec, FM_COLS_VEC);
  if (c->unroll < 1 || c->unroll > 8) return fm_diag_set(d, FM_EINVAL, "config: unroll %u is not in 1..8", c->unroll);
  if (c->block < 32 || c->block > 1024 || c->block % 32)
    return fm_diag_set(d, FM_EINVAL, "config: block %u is not a multiple of 32 in 32..1024", c->block);
  if (c->split > 1 && (!pow2(c->split) || c->split > MAX_GROUPS))
    return fm_diag_set(d, FM_EINVAL, "config: split %u is not 0, 1 or a power of two up to %u", c->split, MAX_GROUPS);
  s->w = c->width;
  s->s = c->cluster;
  s->v = c->vec;
  s->u = c->unroll;
  s->block = c->block;
  s->g = c->split > 1 ? c->split : 1;
  s->tx = c->width / c->vec;
  if (s->tx == 0 || c->block % s->tx || c->width > c->block)
    return fm_diag_set(d, FM_EINVAL, "config: %u threads cannot cover a strip of %u columns, %u each", c->block,
                       c->width, c->vec);
  s->ty = c->block / s->tx;
  if (c->vec > 1 && !cp->vec_ok)
    return fm_diag_set(d, FM_EUNSUPPORTED,
                       "cols: the column-space inputs do not allow %u-column vector loads "
                       "(N a multiple of 8, stride 1 along the columns, aligned rows)",
                       FM_COLS_VEC);
  uint64_t smem = (uint64_t)s->block * s->v * 4 + (s->v > 1 ? (uint64_t)s->block * 4 : 0) +
                  (s->s > 1 ? (uint64_t)cp->n_red * s->w * 4 : 0);
  if (smem > MAX_SMEM)
    return fm_diag_set(d, FM_EUNSUPPORTED,
                       "cols: %u reductions over strips of %u columns need %llu bytes of "
                       "shared memory (at most %u)",
                       cp->n_red, s->w, (unsigned long long)smem, MAX_SMEM);
  return FM_OK;
}

static int is_reduce(const fm_fragment *f, uint32_t i) { return fm_op_kind(f->ops[i].op) == FM_OPK_REDUCE; }

/* value pos of plan p as an operand: v<pos>[i] where it varies along the columns */
static void operand(char *out, size_t cap, const fm_cg_plan *p, uint32_t pos) {
  snprintf(out, cap, "v%u%s", pos, p->rowval[pos] ? "[i]" : "");
}

/* `T v<pos>[V]; for i: v<pos>[i] = op;` or `const T v<pos> = op;` per whether it varies. */
static void emit_value(fm_strbuf *sb, const fm_fragment *f, const fm_cg_plan *p, uint32_t i, uint32_t v,
                       const char *indent) {
  uint32_t pos = p->n_in + i;
  const char *ty = fm_cg_val_type(p->vdt[pos]);
  if (p->rowval[pos])
    fm_strbuf_printf(sb, "%s%s v%u[%u];\n#pragma unroll\n%sfor (int i = 0; i < %u; ++i) v%u[i] = ", indent, ty, pos, v,
                     indent, v, pos);
  else
    fm_strbuf_printf(sb, "%sconst %s v%u = ", indent, ty, pos);
  fm_cg_emit_op(sb, f, p, i);
  fm_strbuf_printf(sb, ";  /* %s */\n", fm_op_name(f->ops[i].op));
}

/* Element `col` of input k's row 0 (a per-column input): in<k>[col * stride]. */
static void column_ref(char *out, size_t cap, const fm_cg_plan *p, uint32_t k, const char *col) {
  int64_t s1 = p->t[k].es[1];
  if (s1 == 0)
    snprintf(out, cap, "in%u[0]", k);
  else if (s1 == 1)
    snprintf(out, cap, "in%u[%s]", k, col);
  else
    snprintf(out, cap, "in%u[(%s) * %lldLL]", k, col, (long long)s1);
}

/* The cluster's helpers: fm_cg_sm90 (fm_cluster_sync), then the rank and distributed shared
 * memory loads. */
static void emit_cluster_helpers(fm_strbuf *sb) {
  fm_strbuf_append(sb, fm_cg_sm90);
  fm_strbuf_append(sb,
                   "/* ---- the cluster: rank, distributed shared memory ---- */\n"
                   "__device__ __forceinline__ unsigned int fm_cluster_rank() {\n"
                   "  unsigned int r;\n"
                   "  asm volatile(\"mov.u32 %0, %%cluster_ctarank;\" : \"=r\"(r));\n"
                   "  return r;\n"
                   "}\n"
                   "/* *x as it is in the shared memory of the cluster's block `rank`. */\n"
                   "__device__ __forceinline__ float fm_dsmem_load(const float *x, unsigned int rank) {\n"
                   "  unsigned int a = (unsigned int)__cvta_generic_to_shared(x), r;\n"
                   "  float v;\n"
                   "  asm volatile(\"mapa.shared::cluster.u32 %0, %1, %2;\" : \"=r\"(r) : \"r\"(a), \"r\"(rank));\n"
                   "  asm volatile(\"ld.shared::cluster.f32 %0, [%1];\" : \"=f\"(v) : \"r\"(r) : \"memory\");\n"
                   "  return v;\n"
                   "}\n");
}

/* The bytes of one vector access of input k (V columns are one or two of them). */
static uint32_t access_bytes(const fm_cg_plan *p, uint32_t k, const shape *s) {
  uint32_t row = s->v * (uint32_t)fm_dtype_size(p->t[k].dtype);
  return row < 16 ? row : 16;
}

/* U rows (m + u * step) of every live column-space input: loads first, then per row the
 * decode, the prologue and the reductions' additions. */
static void emit_rows(fm_strbuf *sb, const fm_fragment *f, const fm_cg_cols_plan *cp, const shape *s,
                      uint32_t u_count) {
  const fm_cg_plan *p = &cp->base;
  const uint32_t step = s->g * s->s * s->ty;
  for (uint32_t k = 0; k < p->n_in; k++) {
    if (!p->live[k] || cp->cls[k] != FM_COLS_SPACE) continue;
    if (p->rowval[k] && s->v > 1) {
      uint32_t ab = access_bytes(p, k, s);
      fm_strbuf_printf(sb, "      %s r%u[%u][%u];\n", fm_cg_vec_type(ab), k, u_count,
                       s->v * (uint32_t)fm_dtype_size(p->t[k].dtype) / ab);
    } else {
      fm_strbuf_printf(sb, "      %s r%u[%u];\n", fm_cg_storage_type(p->t[k].dtype), k, u_count);
    }
  }
  fm_strbuf_printf(sb, "#pragma unroll\n      for (int u = 0; u < %u; ++u) {\n", u_count);
  fm_strbuf_printf(sb, "        const long long mu = m + (long long)u * %u;\n", step);
  for (uint32_t k = 0; k < p->n_in; k++) {
    if (!p->live[k] || cp->cls[k] != FM_COLS_SPACE) continue;
    const fm_cg_tensor *t = &p->t[k];
    if (!p->rowval[k]) {
      fm_strbuf_printf(sb, "        r%u[u] = in%u[mu * %lldLL];\n", k, k, (long long)t->es[0]);
    } else if (s->v == 1) {
      fm_strbuf_printf(sb, "        r%u[u] = in%u[mu * %lldLL + n0 * %lldLL];\n", k, k, (long long)t->es[0],
                       (long long)t->es[1]);
    } else {
      uint32_t ab = access_bytes(p, k, s), per = ab / (uint32_t)fm_dtype_size(t->dtype);
      const char *vt = fm_cg_vec_type(ab);
      for (uint32_t w = 0; w < s->v / per; w++)
        fm_strbuf_printf(sb, "        r%u[u][%u] = *reinterpret_cast<const %s *>(in%u + mu * %lldLL + n0 + %u);\n", k,
                         w, vt, k, (long long)t->es[0], w * per);
    }
  }
  fm_strbuf_append(sb, "      }\n");
  fm_strbuf_printf(sb, "#pragma unroll\n      for (int u = 0; u < %u; ++u) {\n", u_count);
  for (uint32_t k = 0; k < p->n_in; k++) {
    if (!p->live[k] || cp->cls[k] != FM_COLS_SPACE) continue;
    fm_dtype dt = p->t[k].dtype;
    char e[64];
    if (!p->rowval[k]) {
      snprintf(e, sizeof e, "r%u[u]", k);
      fm_strbuf_printf(sb, "        const %s v%u = ", fm_cg_val_type(dt), k);
    } else if (s->v == 1) {
      snprintf(e, sizeof e, "r%u[u]", k);
      fm_strbuf_printf(sb, "        %s v%u[1];\n        v%u[0] = ", fm_cg_val_type(dt), k, k);
    } else {
      uint32_t per = access_bytes(p, k, s) / (uint32_t)fm_dtype_size(dt);
      snprintf(e, sizeof e, "%s(r%u[u][e / %u], e %% %u)", fm_cg_get_fn(dt), k, per, per);
      fm_strbuf_printf(sb, "        %s v%u[%u];\n#pragma unroll\n        for (int e = 0; e < %u; ++e) v%u[e] = ",
                       fm_cg_val_type(dt), k, s->v, s->v, k);
    }
    fm_cg_emit_decode(sb, dt, e);
    fm_strbuf_append(sb, ";\n");
  }
  for (uint32_t i = 0; i < p->n_ops; i++) {
    uint32_t pos = p->n_in + i;
    if (!p->live[pos]) continue;
    if (is_reduce(f, i)) {
      char x[32];
      operand(x, sizeof x, p, p->args[i][0]);
      if (f->ops[i].op == FM_OP_AMAX)
        fm_strbuf_printf(
            sb, "#pragma unroll\n        for (int i = 0; i < %u; ++i) fm_a%u[i] = fm_maximum(fm_a%u[i], %s);\n", s->v,
            pos, pos, x);
      else
        fm_strbuf_printf(sb, "#pragma unroll\n        for (int i = 0; i < %u; ++i) fm_a%u[i] += %s;\n", s->v, pos, x);
    } else if (cp->cls[pos] == FM_COLS_SPACE) {
      emit_value(sb, f, p, i, s->v, "        ");
    }
  }
  fm_strbuf_append(sb, "      }\n");
}

/* Steps 1 and 2, for the thread's columns n0 .. n0 + V - 1 (all inside: N % V == 0). */
static void emit_accumulate(fm_strbuf *sb, const fm_fragment *f, const fm_cg_cols_plan *cp, const shape *s) {
  const fm_cg_plan *p = &cp->base;
  const uint32_t step = s->g * s->s * s->ty;
  fm_strbuf_printf(sb, "  if (n0 < %lldLL) {\n", (long long)cp->info.n);
  int pre = 0;
  for (uint32_t v = 0; v < p->n_in + p->n_ops; v++) pre |= cp->loop[v] && cp->cls[v] == FM_COLS_PRE;
  if (pre) fm_strbuf_append(sb, "    /* 1. per-column values (before any reduction): once per thread and column */\n");
  for (uint32_t k = 0; k < p->n_in; k++) {
    if (!cp->loop[k] || cp->cls[k] != FM_COLS_PRE) continue;
    char e[64];
    fm_dtype dt = p->t[k].dtype;
    column_ref(e, sizeof e, p, k, "n0 + i");
    if (p->rowval[k])
      fm_strbuf_printf(sb, "    %s v%u[%u];\n#pragma unroll\n    for (int i = 0; i < %u; ++i) v%u[i] = ",
                       fm_cg_val_type(dt), k, s->v, s->v, k);
    else
      fm_strbuf_printf(sb, "    const %s v%u = ", fm_cg_val_type(dt), k);
    fm_cg_emit_decode(sb, dt, e);
    fm_strbuf_append(sb, ";\n");
  }
  for (uint32_t i = 0; i < p->n_ops; i++)
    if (cp->loop[p->n_in + i] && cp->cls[p->n_in + i] == FM_COLS_PRE) emit_value(sb, f, p, i, s->v, "    ");
  if (s->g > 1) {
    fm_strbuf_printf(
        sb, "    /* 2. the rows: blockIdx.y * %u + ty, stepping by %u (%u groups of %u blocks share them) */\n", s->ty,
        step, s->g, s->s);
    fm_strbuf_printf(sb, "    long long m = (long long)blockIdx.y * %u + ty;\n", s->ty);
  } else {
    if (s->s > 1)
      fm_strbuf_printf(sb,
                       "    /* 2. the rows: rank * %u + ty, stepping by %u (the cluster's %u blocks share them) */\n",
                       s->ty, step, s->s);
    else
      fm_strbuf_printf(sb, "    /* 2. the rows: ty, stepping by %u */\n", step);
    fm_strbuf_printf(sb, "    long long m = (long long)rank * %u + ty;\n", s->ty);
  }
  if (s->u > 1) {
    fm_strbuf_printf(sb, "    for (; m + %lldLL < M; m += %lldLL) {\n", (long long)(s->u - 1) * step,
                     (long long)s->u * step);
    emit_rows(sb, f, cp, s, s->u);
    fm_strbuf_append(sb, "    }\n");
  }
  fm_strbuf_printf(sb, "    for (; m < M; m += %u) {\n", step);
  emit_rows(sb, f, cp, s, 1);
  fm_strbuf_append(sb, "    }\n  }\n");
}

/* a op b of the reduction: a + b, or the NaN-propagating max */
static void combine(char *out, size_t cap, int is_max, const char *a, const char *b) {
  snprintf(out, cap, is_max ? "fm_maximum(%s, %s)" : "%s + %s", a, b);
}

/* Step 3: each reduction's TY partials of a column (fm_sh[y * W + c]) folded in a fixed order:
 * in the vector form first V rows at a time by every thread (thread g * W + c takes rows g * V
 * .. g * V + V - 1: a chain of V adds, not TY), then the block / W group sums by thread c < W,
 * which owns column c of the strip; step 4 (S > 1): rank 0 adds the other blocks' in rank order. */
static void emit_fold(fm_strbuf *sb, const fm_fragment *f, const fm_cg_cols_plan *cp, const shape *s) {
  const fm_cg_plan *p = &cp->base;
  const uint32_t groups = s->block / s->w; /* TY / V */
  char e[96];
  fm_strbuf_append(sb, "  /* 3. the block's partials of each column, folded in a fixed order */\n");
  uint32_t r = 0;
  for (uint32_t i = 0; i < p->n_ops; i++) {
    uint32_t pos = p->n_in + i;
    if (!p->live[pos] || !is_reduce(f, i)) continue;
    int is_max = f->ops[i].op == FM_OP_AMAX;
    /* the scalar form's fold reads fm_sh until its end; the vector form's has passed a
       barrier since it last read it */
    if (r && s->v == 1) fm_strbuf_append(sb, "  __syncthreads();   /* the previous fold has read fm_sh */\n");
    fm_strbuf_printf(sb,
                     "#pragma unroll\n"
                     "  for (int i = 0; i < %u; ++i) fm_sh[ty * W + tx * %u + i] = fm_a%u[i];\n"
                     "  __syncthreads();\n",
                     s->v, s->v, pos);
    const char *sums = "fm_sh";
    if (s->v > 1) {
      combine(e, sizeof e, is_max, "t", "fm_sh[(g + j) * W + c]");
      fm_strbuf_printf(sb,
                       "  {\n"
                       "    const int c = threadIdx.x %% W, g = threadIdx.x / W * %u;\n"
                       "    float t = fm_sh[g * W + c];\n"
                       "#pragma unroll\n"
                       "    for (int j = 1; j < %u; ++j) t = %s;\n"
                       "    fm_red[threadIdx.x] = t;\n"
                       "  }\n"
                       "  __syncthreads();\n",
                       s->v, s->v, e);
      sums = "fm_red";
    }
    char term[48];
    snprintf(term, sizeof term, "%s[y * W + threadIdx.x]", sums);
    combine(e, sizeof e, is_max, "t", term);
    fm_strbuf_printf(sb,
                     "  if (threadIdx.x < W) {\n"
                     "    float t = %s[threadIdx.x];\n"
                     "#pragma unroll\n"
                     "    for (int y = 1; y < %u; ++y) t = %s;\n"
                     "    fm_c%u = t;\n",
                     sums, s->v > 1 ? groups : s->ty, e, pos);
    if (s->s > 1) fm_strbuf_printf(sb, "    fm_part[%u * W + threadIdx.x] = t;\n", r);
    fm_strbuf_append(sb, "  }\n");
    r++;
  }
  if (s->s == 1) return;
  fm_strbuf_printf(sb,
                   "  /* 4. the cluster's %u blocks meet in rank 0, in rank order */\n"
                   "  fm_cluster_sync();\n"
                   "  if (rank == 0 && threadIdx.x < W) {\n"
                   "#pragma unroll\n"
                   "    for (unsigned int q = 1; q < %u; ++q) {\n",
                   s->s, s->s);
  r = 0;
  for (uint32_t i = 0; i < p->n_ops; i++) {
    uint32_t pos = p->n_in + i;
    if (!p->live[pos] || !is_reduce(f, i)) continue;
    char c[16], load[64];
    snprintf(c, sizeof c, "fm_c%u", pos);
    snprintf(load, sizeof load, "fm_dsmem_load(&fm_part[%u * W + threadIdx.x], q)", r);
    combine(e, sizeof e, f->ops[i].op == FM_OP_AMAX, c, load);
    fm_strbuf_printf(sb, "      %s = %s;\n", c, e);
    r++;
  }
  fm_strbuf_append(sb, "    }\n  }\n  fm_cluster_sync();   /* no block leaves while rank 0 may still read it */\n");
}

/* Column n's per-column values recomputed as one number each (epi: the plan with nothing
 * varying) from its reductions' results fm_c<pos>, then every output once. */
static void emit_column_outputs(fm_strbuf *sb, const fm_fragment *f, const fm_cg_cols_plan *cp, const fm_cg_plan *epi) {
  const fm_cg_plan *p = &cp->base;
  for (uint32_t k = 0; k < p->n_in; k++) {
    if (!cp->epi[k] || cp->cls[k] != FM_COLS_PRE) continue;
    char e[64];
    column_ref(e, sizeof e, p, k, "n");
    fm_strbuf_printf(sb, "      const %s v%u = ", fm_cg_val_type(p->t[k].dtype), k);
    fm_cg_emit_decode(sb, p->t[k].dtype, e);
    fm_strbuf_append(sb, ";\n");
  }
  for (uint32_t i = 0; i < p->n_ops; i++) {
    uint32_t pos = p->n_in + i;
    if (!cp->epi[pos]) continue;
    if (!is_reduce(f, i)) {
      emit_value(sb, f, epi, i, 1, "      ");
      continue;
    }
    fm_strbuf_printf(sb, "      const float v%u = fm_c%u%s;  /* %s */\n", pos, pos,
                     f->ops[i].op == FM_OP_MEAN ? " / (float)M" : "", fm_op_name(f->ops[i].op));
  }
  for (uint32_t k = 0; k < p->n_out; k++) {
    const fm_cg_tensor *t = &p->t[p->n_in + k];
    char v[16];
    snprintf(v, sizeof v, "v%u", t->value);
    if (t->es[1] == 0)
      fm_strbuf_printf(sb, "      out%u[0] = ", k);
    else if (t->es[1] == 1)
      fm_strbuf_printf(sb, "      out%u[n] = ", k);
    else
      fm_strbuf_printf(sb, "      out%u[n * %lldLL] = ", k, (long long)t->es[1]);
    fm_cg_emit_encode(sb, t->dtype, p->vdt[t->value], v);
    fm_strbuf_append(sb, ";\n");
  }
}

/* Step 5: rank 0's thread c takes column n = strip * W + c: the epilogue and the stores or,
 * split, the cluster's partials into the scratch (group blockIdx.y / S). */
static void emit_epilogue(fm_strbuf *sb, const fm_fragment *f, const fm_cg_cols_plan *cp, const fm_cg_plan *epi,
                          const shape *s) {
  const fm_cg_plan *p = &cp->base;
  fm_strbuf_printf(sb,
                   "  /* 5. %s */\n"
                   "  if (rank == 0 && threadIdx.x < W) {\n"
                   "    const long long n = (long long)blockIdx.x * W + threadIdx.x;\n"
                   "    if (n < %lldLL) {\n",
                   s->g > 1 ? "the cluster's partials, to be added by the finishing kernel"
                            : "the per-column epilogue and the stores, each output once",
                   (long long)cp->info.n);
  if (s->g > 1) {
    fm_strbuf_printf(sb, "      float *part = fm_scratch + (long long)(blockIdx.y / %u) * %lldLL + n;\n", s->s,
                     (long long)cp->n_red * cp->info.n);
    uint32_t r = 0;
    for (uint32_t i = 0; i < p->n_ops; i++)
      if (p->live[p->n_in + i] && is_reduce(f, i))
        fm_strbuf_printf(sb, "      part[%lldLL] = fm_c%u;\n", (long long)(r++) * cp->info.n, p->n_in + i);
  } else {
    emit_column_outputs(sb, f, cp, epi);
  }
  fm_strbuf_append(sb, "    }\n  }\n}\n");
}

/* `M`: the launch's outer, or the static M. */
static void emit_rows_count(fm_strbuf *sb, const fm_cg_cols_plan *cp) {
  if (cp->base.symbolic)
    fm_strbuf_append(sb, "  const long long M = outer;\n");
  else
    fm_strbuf_printf(sb, "  const long long M = %lldLL;\n  (void)outer;\n", (long long)cp->info.m);
}

/* The split form's second kernel: a thread per column adds the G groups' partials of each
 * reduction in group order, then runs the epilogue and the stores. */
static void emit_finish(fm_strbuf *sb, const fm_fragment *f, const fm_cg_cols_plan *cp, const fm_cg_plan *epi,
                        const shape *s, const char *entry) {
  const fm_cg_plan *p = &cp->base;
  fm_cg_emit_signature_scratch(sb, p, FINISH_BLOCK, 0, entry);
  emit_rows_count(sb, cp);
  fm_strbuf_printf(sb,
                   "  (void)M;\n"
                   "  const long long n = (long long)blockIdx.x * %u + threadIdx.x;\n"
                   "  if (n >= %lldLL) return;\n",
                   FINISH_BLOCK, (long long)cp->info.n);
  uint32_t r = 0;
  for (uint32_t i = 0; i < p->n_ops; i++) {
    uint32_t pos = p->n_in + i;
    if (!p->live[pos] || !is_reduce(f, i)) continue;
    char e[96], term[96];
    snprintf(term, sizeof term, "fm_scratch[(long long)g * %lldLL + %lldLL + n]", (long long)cp->n_red * cp->info.n,
             (long long)r * cp->info.n);
    combine(e, sizeof e, f->ops[i].op == FM_OP_AMAX, "t", term);
    fm_strbuf_printf(sb,
                     "  float fm_c%u;  /* %s: the groups' partials, in group order */\n"
                     "  {\n"
                     "    float t = fm_scratch[%lldLL + n];\n"
                     "    for (int g = 1; g < %u; ++g) t = %s;\n"
                     "    fm_c%u = t;\n"
                     "  }\n",
                     pos, fm_op_name(f->ops[i].op), (long long)r * cp->info.n, s->g, e, pos);
    r++;
  }
  fm_strbuf_append(sb, "  {\n");
  emit_column_outputs(sb, f, cp, epi);
  fm_strbuf_append(sb, "  }\n}\n");
}

static void emit_kernel(fm_strbuf *sb, const fm_fragment *f, const fm_cg_cols_plan *cp, const fm_cg_plan *epi,
                        const shape *s, const char *entry) {
  const fm_cg_plan *p = &cp->base;
  if (s->g > 1)
    fm_cg_emit_signature_scratch(sb, p, s->block, s->s, entry);
  else
    fm_cg_emit_signature(sb, p, s->block, s->s, entry);
  emit_rows_count(sb, cp);
  fm_strbuf_printf(sb,
                   "  constexpr int W = %u;   /* columns of the strip */\n"
                   "  const int tx = threadIdx.x %% %u, ty = threadIdx.x / %u;\n"
                   "  const unsigned int rank = %s;\n"
                   "  const long long n0 = (long long)blockIdx.x * W + tx * %u;   /* the thread's first column */\n"
                   "  __shared__ float fm_sh[%u];   /* TY rows of the strip's partials */\n",
                   s->w, s->tx, s->tx, s->s > 1 ? "fm_cluster_rank()" : "0", s->v, s->ty * s->w);
  if (s->v > 1) fm_strbuf_printf(sb, "  __shared__ float fm_red[%u];   /* their sums, V rows each */\n", s->block);
  if (s->s > 1)
    fm_strbuf_printf(sb, "  __shared__ float fm_part[%u];   /* the folded partials, read by rank 0 */\n",
                     cp->n_red * s->w);
  for (uint32_t i = 0; i < p->n_ops; i++) {
    uint32_t pos = p->n_in + i;
    if (!p->live[pos] || !is_reduce(f, i)) continue;
    fm_strbuf_printf(sb,
                     "  float fm_a%u[%u], fm_c%u = 0.0f;  /* %s */\n#pragma unroll\n"
                     "  for (int i = 0; i < %u; ++i) fm_a%u[i] = %s;\n",
                     pos, s->v, pos, fm_op_name(f->ops[i].op), s->v, pos,
                     f->ops[i].op == FM_OP_AMAX ? "__int_as_float(0xff800000)" : "0.0f");
  }
  emit_accumulate(sb, f, cp, s);
  emit_fold(sb, f, cp, s);
  emit_epilogue(sb, f, cp, epi, s);
}

int fm_codegen_cols(const fm_fragment *canon, const fm_cols_config *cfg, uint32_t sm_count, char **src,
                    fm_kernel_meta *meta, fm_diag *d) {
  fm_strbuf sb;
  fm_cg_cols_plan *cp = NULL;
  fm_cg_plan *epi = NULL;
  int rc = FM_OK;
  shape s = {0};
  char entry[FM_META_ENTRY_MAX], finish[FM_META_ENTRY_MAX], m_text[32];
  (void)sm_count; /* the grid is the strips times the cluster: no cap to size */
  if (!canon || !src || !meta) return fm_diag_set(d, FM_EINVAL, "codegen: NULL argument");
  *src = NULL;
  fm_strbuf_init(&sb, MAX_SOURCE);
  fm_cols_config c = cfg ? *cfg : fm_codegen_cols_default(canon);
  cp = malloc(sizeof *cp);
  epi = malloc(sizeof *epi);
  if (!cp || !epi) {
    rc = fm_diag_set(d, FM_ENOMEM, "codegen: out of memory");
    goto out;
  }
  if ((rc = fm_cg_cols_plan_build(canon, cp, d))) goto out;
  if ((rc = make_shape(cp, &c, &s, d))) goto out;
  *epi = cp->base;
  memset(epi->rowval, 0, sizeof epi->rowval); /* the epilogue holds one column per thread */
  snprintf(entry, sizeof entry, "fm_cols_v%d", FM_CODEGEN_VERSION);
  snprintf(finish, sizeof finish, "fm_cols_v%d_finish", FM_CODEGEN_VERSION);
  if (cp->base.symbolic)
    snprintf(m_text, sizeof m_text, "M");
  else
    snprintf(m_text, sizeof m_text, "%lld", (long long)cp->info.m);

  fm_strbuf_printf(&sb,
                   "/* fusemld codegen v%d: cols kernel over [%s, %lld], strips of %u columns, cluster %u,"
                   " vec %u, unroll %u, block %u (%u x %u).\n"
                   " * Generated from a canonical fragment: every name and number below comes "
                   "from its\n * typed fields. One self-contained translation unit (NVRTC has "
                   "no include path). */\n",
                   FM_CODEGEN_VERSION, m_text, (long long)cp->info.n, s.w, s.s, s.v, s.u, s.block, s.tx, s.ty);
  fm_cg_emit_prelude(&sb, fm_cg_fast_math(canon));
  if (s.s > 1) emit_cluster_helpers(&sb);
  fm_strbuf_append(&sb, "/* ---- the kernel ---- */\n");
  emit_kernel(&sb, canon, cp, epi, &s, entry);
  if (s.g > 1) {
    fm_strbuf_printf(&sb, "/* ---- the finishing kernel: %u groups' partials per column ---- */\n", s.g);
    emit_finish(&sb, canon, cp, epi, &s, finish);
  }
  if (fm_strbuf_error(&sb)) {
    rc = fm_diag_set(d, FM_ECODEGEN, "codegen: source buffer: %s", fm_strerror(fm_strbuf_error(&sb)));
    goto out;
  }
  fm_cg_meta_begin(meta, "columns", "columns", entry, s.block, &cp->base);
  meta->inner = (uint64_t)cp->info.n;
  meta->items_per_block = s.w;
  meta->max_blocks = (uint32_t)(((uint64_t)cp->info.n + s.w - 1) / s.w);
  meta->outer = cp->info.m; /* FM_DIM_SYMBOLIC is -1: the launch's */
  if (s.s > 1) {
    meta->cluster[0] = meta->cluster[2] = 1;
    meta->cluster[1] = s.s;
  }
  if (s.g > 1) {
    snprintf(meta->finish.entry, sizeof meta->finish.entry, "%s", finish);
    meta->finish.block = FINISH_BLOCK;
    meta->finish.grid = (uint32_t)(((uint64_t)cp->info.n + FINISH_BLOCK - 1) / FINISH_BLOCK);
    meta->finish.groups = s.g;
    meta->finish.scratch = ((uint64_t)s.g * cp->n_red * (uint64_t)cp->info.n * 4 + 255) & ~(uint64_t)255;
  }
  *src = fm_strbuf_take(&sb);
  if (!*src) rc = fm_diag_set(d, FM_ENOMEM, "codegen: out of memory");
out:
  fm_strbuf_free(&sb);
  free(cp);
  free(epi);
  return rc;
}

/* A config of width w (0: the narrowest, 16) and cluster s in the plan's widest form.
 * 8 rows in flight per thread unless that takes more than 32 bytes of registers a row: on an
 * H100, [16384, 256] bf16 sums in 11.4 us with 8 and 12.5 us with 4 (both width 16, S 8),
 * 0.0197 / 0.0216 ms at N 1024 (width 32): the grid is small, each block must keep more
 * bytes in flight. */
static fm_cols_config config(const fm_cg_cols_plan *cp, uint32_t w, uint32_t s) {
  uint32_t v = cp && cp->vec_ok ? FM_COLS_VEC : 1u;
  fm_cols_config c = {.width = w ? w : 16u,
                      .cluster = s,
                      .vec = v,
                      .unroll = cp && v * cp->col_bytes + cp->row_bytes > 32 ? 4u : 8u,
                      .block = DEFAULT_BLOCK};
  return c;
}

/* Runs on anything (no cluster: compile-only mode may target sm_80). Narrow strips: a strip
 * is a block, and without a cluster the grid has no more blocks than strips. A strip of 16
 * bf16 columns is 32 bytes of a row: one whole sector. */
fm_cols_config fm_codegen_cols_default(const fm_fragment *canon) {
  fm_cg_cols_plan *cp = canon ? malloc(sizeof *cp) : NULL;
  if (cp && fm_cg_cols_plan_build(canon, cp, NULL) != FM_OK) {
    free(cp);
    cp = NULL;
  }
  fm_cols_config c = config(cp, 0, 1);
  free(cp);
  return c;
}

/* The groups a split form of config c takes: enough that the strips times the cluster times
 * the groups reach SPLIT_TARGET_BLOCKS, each block still adding at least `unroll` rows of
 * each thread's; 1 (no split) where the strips and clusters are enough or M too short. */
static uint32_t split_groups(const fm_cg_cols_plan *cp, const fm_cols_config *c, const shape *s) {
  uint64_t blocks = ((uint64_t)cp->info.n + c->width - 1) / c->width * c->cluster, g = 1;
  while (blocks * g < SPLIT_TARGET_BLOCKS && g < MAX_GROUPS) g *= 2;
  if (!cp->base.symbolic)
    while (g > 1 && (uint64_t)cp->info.m < g * c->cluster * s->ty * c->unroll) g /= 2;
  return (uint32_t)g;
}

/* The default first; then strips of 16..256 columns (none with more than half of it past N)
 * times clusters of 1, 2, 4 and 8 blocks (a static M gives each block rows to add). On an
 * H100 the clusters win (S 8 at [16384, 1024] bf16: 0.0197 ms, S 1: 0.069 ms); S 1 stays for
 * the GPUs without clusters. Where those leave the GPU short of blocks (fewer than 528
 * columns), the split form of strips of 16, 32 and 64 with clusters of 1 and 8. */
size_t fm_codegen_cols_candidates(const fm_fragment *canon, fm_cols_config *out, size_t max) {
  static const uint32_t widths[] = {16, 32, 64, 128, 256}, clusters[] = {1, 2, 4, 8};
  size_t n = 0;
  if (!out || !max) return 0;
  fm_cols_config def = fm_codegen_cols_default(canon);
  out[n++] = def;
  fm_cg_cols_plan *cp = canon ? malloc(sizeof *cp) : NULL;
  if (!cp || fm_cg_cols_plan_build(canon, cp, NULL) != FM_OK) goto done;
  for (size_t wi = 0; wi < sizeof widths / sizeof widths[0]; wi++)
    for (size_t si = 0; si < sizeof clusters / sizeof clusters[0]; si++) {
      fm_cols_config c = config(cp, widths[wi], clusters[si]);
      shape s = {0};
      if (wi > 0 && (int64_t)widths[wi] / 2 >= cp->info.n) continue;
      if (make_shape(cp, &c, &s, NULL) != FM_OK) continue;
      if (c.cluster > 1 && !cp->base.symbolic && cp->info.m < (int64_t)c.cluster * s.ty) continue;
      if (!memcmp(&c, &def, sizeof c)) continue;
      if (n == max) goto done;
      out[n++] = c;
    }
  /* split: only where the narrowest strips in clusters of 8 are too few blocks, in strips
     of at most 64 columns */
  uint64_t most = ((uint64_t)cp->info.n + 15) / 16 * 8;
  for (size_t wi = 0; most < SPLIT_TARGET_BLOCKS && wi < 3; wi++)
    for (uint32_t si = 1; si <= 8; si += 7) {
      fm_cols_config c = config(cp, widths[wi], si);
      shape s = {0};
      if (wi > 0 && (int64_t)widths[wi] / 2 >= cp->info.n) continue;
      if (make_shape(cp, &c, &s, NULL) != FM_OK) continue;
      if ((c.split = split_groups(cp, &c, &s)) < 2) continue;
      if (n == max) goto done;
      out[n++] = c;
    }
done:
  free(cp);
  return n;
}
