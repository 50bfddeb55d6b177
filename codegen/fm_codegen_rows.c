/* fm_codegen_rows.c: the rows template: one kernel per row fragment (reductions over the
 * last dim with pointwise prologue/epilogue), in two variants:
 *   WARP   one warp per row, block/32 rows per block (short rows: shuffles only);
 *   BLOCK  one block per row (long rows: shuffles, then shared memory across warps).
 * Each thread holds EPT = C * V elements of its row in fp32 registers: C chunks of V
 * consecutive elements, chunk c of lane l at column (c * TPR + l) * V, so a warp's chunk is
 * one coalesced run of 16-byte accesses. The row is read once, every reduction runs on the
 * registers, and every output is written once. var (and the mean of the same value before
 * it, as in layer_norm) is ONE cross-thread reduction of (count, sum, shifted sum, M2)
 * partials: each thread's M2 is two-pass around its own mean and partials merge by Chan's
 * pairwise rule, exact to fp32 rounding with one reduction instead of two. A block-variant
 * reduction costs one __syncthreads (double-buffered shared memory). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fm_codegen_rows.h"

#define MAX_SOURCE   (1u << 20)
#define MAX_EPT      64u /* registers per thread per row value */
/* Elements per thread per tile of a streamed row: 16, two 16-byte loads of a 16-bit row in
 * flight. With the running max taken element by element, 16 and 32 were slower than 8 on an
 * H200 (cross-entropy over 32000 and 50257 logits, 2026-11-29); with the tile's max first
 * (fm_codegen_rows_stream.c) 16 read Llama's 4096 x 32000 logits in 100 us against 112 at 8
 * (a hand-written copy of the kernel, bench/NOTES.md). */
#define STREAM_EPT   16u
/* The default streams a row needing more elements per thread than this at 1024 threads. */
#define STREAM_ABOVE 16u
/* Stream candidates for rows longer than this. */
#define STREAM_FROM  4096
#define DEFAULT_SMS  132u

typedef fm_cg_rows_shape shape;

/* (count, sum, shifted sum, M2) partials of a row value for var. Each warp shifts by one
 * value, its lane 0's first element k, so the means the merges subtract are small (a mean
 * near 1000 with deviations near 1 would lose its low bits to fp32 rounding, and an error in
 * a mean difference d enters M2 linearly). Within a warp partials merge by Chan's rule
 *   M2 = M2a + M2b + d^2 * na * nb / (na + nb),  d = ha / na - hb / nb  (h: sum of x - k),
 * written so merge(a, b) and merge(b, a) round alike (d only changes sign): the butterfly
 * leaves identical bits in every lane. The plain sum is carried too and added exactly as
 * fm_row_sum adds it, so the mean is bit-identical to fm_row_sum's (and inf where it is). With
 * an exact shape every count is a constant: not exchanged, and the divisions fold. */
static uint32_t msum_stride(const shape *s) { return s->exact ? 4 : 5; } /* floats per warp */

/* Floats in one half of the double-buffered shared array fm_red (block variant). */
static uint32_t red_half(const shape *s, int msum) { return s->tpr / 32 * (msum ? msum_stride(s) : 1); }

static void emit_msum_helpers(fm_strbuf *sb, const fm_rows_config *c, const shape *s, uint32_t half) {
  /* Divisions by counts: with an exact shape every count is a constant and they fold into
   * multiplications; otherwise IEEE division (a slow-path subroutine, some 100 per thread at
   * 1024 threads) made the kernel compute-bound, so the fast reciprocal (2 ulp) is used. */
  fm_strbuf_printf(sb, "__device__ __forceinline__ float fm_cdiv(float x, float y) { return %s; }\n",
                   s->exact ? "x / y" : "__fdividef(x, y)");
  fm_strbuf_append(sb,
                   "struct fm_msum { float n, s, h, q; };\n"
                   "__device__ __forceinline__ fm_msum fm_msum_merge(fm_msum a, fm_msum b) {\n"
                   "  fm_msum r;\n"
                   "  r.n = a.n + b.n;\n"
                   "  r.s = a.s + b.s;\n"
                   "  r.h = a.h + b.h;\n"
                   "  const float d = a.n > 0.0f && b.n > 0.0f ? fm_cdiv(a.h, a.n) - fm_cdiv(b.h, b.n) : 0.0f;\n"
                   "  r.q = (a.q + b.q) + d * d * fm_cdiv(a.n * b.n, r.n > 0.0f ? r.n : 1.0f);\n"
                   "  return r;\n"
                   "}\n"
                   "__device__ __forceinline__ fm_msum fm_warp_msum(fm_msum x) {\n"
                   "#pragma unroll\n"
                   "  for (int o = 16; o > 0; o >>= 1) {\n"
                   "    fm_msum y;\n");
  fm_strbuf_printf(sb,
                   "    y.n = %s;\n"
                   "    y.s = __shfl_xor_sync(0xffffffffu, x.s, o);\n"
                   "    y.h = __shfl_xor_sync(0xffffffffu, x.h, o);\n"
                   "    y.q = __shfl_xor_sync(0xffffffffu, x.q, o);\n"
                   "    x = fm_msum_merge(x, y);\n"
                   "  }\n"
                   "  return x;\n"
                   "}\n",
                   s->exact ? "x.n" : "__shfl_xor_sync(0xffffffffu, x.n, o)");
  if (c->variant == FM_ROWS_WARP) {
    fm_strbuf_append(
        sb,
        "__device__ __forceinline__ fm_msum fm_row_msum(fm_msum x, float, float *, int &) { return fm_warp_msum(x); }\n");
    return;
  }
  /* One shared-memory exchange carries every warp's (k, s, h, M2) and, where the shape is
   * not exact, its count. The warps' shifts differ, so their means are taken relative to
   * warp 0's shift (k_w - k_0 is exact for nearby values) and merged in a fixed order. */
  uint32_t w = msum_stride(s);
  char cnt[32], cntw[32];
  snprintf(cnt, sizeof cnt, "%u.0f", 32 * s->ept);
  snprintf(cntw, sizeof cntw, s->exact ? "%u.0f" : "o[4]", 32 * s->ept);
  fm_strbuf_printf(sb,
                   "__device__ __forceinline__ fm_msum fm_row_msum(fm_msum x, float k, float *red, int &par) {\n"
                   "  x = fm_warp_msum(x);\n"
                   "  float *r = red + par;\n"
                   "  par ^= %u;\n"
                   "  if ((threadIdx.x & 31) == 0) {\n"
                   "    float *o = r + (threadIdx.x >> 5) * %u;\n"
                   "    o[0] = k;\n"
                   "    o[1] = x.s;\n"
                   "    o[2] = x.h;\n"
                   "    o[3] = x.q;\n%s"
                   "  }\n"
                   "  __syncthreads();\n"
                   "  fm_msum t;\n"
                   "  t.n = %s;\n"
                   "  t.s = r[1];\n"
                   "  t.q = r[3];\n"
                   "  float m = fm_cdiv(r[2], t.n);  /* warp 0's mean, relative to its shift (its count is > 0) */\n"
                   "#pragma unroll\n"
                   "  for (int w = 1; w < %u; ++w) {\n"
                   "    const float *o = r + w * %u;\n"
                   "    const float nw = %s;\n"
                   "    if (nw > 0.0f) {\n"
                   "      const float mw = (o[0] - r[0]) + fm_cdiv(o[2], nw);\n"
                   "      const float n2 = t.n + nw, d = m - mw;\n"
                   "      t.q = (t.q + o[3]) + d * d * fm_cdiv(t.n * nw, n2);\n"
                   "      m += (mw - m) * fm_cdiv(nw, n2);\n"
                   "      t.n = n2;\n"
                   "    }\n"
                   "    t.s += o[1];\n"
                   "  }\n"
                   "  t.h = m * t.n;  /* relative to warp 0's shift */\n"
                   "  return t;\n"
                   "}\n",
                   half, w, s->exact ? "" : "    o[4] = x.n;\n", s->exact ? cnt : "r[4]", s->tpr / 32, w, cntw);
}

/* Cross-thread reductions: a xor butterfly leaves the same bits in every lane (a + b and
 * b + a round alike), and the block variant then sums the per-warp results in a fixed order,
 * so every thread of a row holds the identical statistic. The block variant's shared array
 * is double-buffered (par alternates halves), so one barrier per reduction suffices: a
 * thread writing half h for reduction k+1 has passed reduction k's barrier, which every
 * thread reaches only after reading half h for reduction k-1. */
static void emit_helpers(fm_strbuf *sb, const fm_rows_config *c, const shape *s, int msum) {
  uint32_t half = red_half(s, msum);
  fm_strbuf_append(sb,
                   "/* ---- row reductions ---- */\n"
                   "__device__ __forceinline__ float fm_warp_sum(float x) {\n"
                   "#pragma unroll\n"
                   "  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);\n"
                   "  return x;\n"
                   "}\n"
                   "__device__ __forceinline__ float fm_warp_max(float x) {\n"
                   "#pragma unroll\n"
                   "  for (int o = 16; o > 0; o >>= 1) x = fm_maximum(x, __shfl_xor_sync(0xffffffffu, x, o));\n"
                   "  return x;\n"
                   "}\n");
  if (c->variant == FM_ROWS_WARP) {
    fm_strbuf_append(
        sb,
        "__device__ __forceinline__ float fm_row_sum(float x, float *, int &) { return fm_warp_sum(x); }\n"
        "__device__ __forceinline__ float fm_row_max(float x, float *, int &) { return fm_warp_max(x); }\n");
  } else {
    fm_strbuf_printf(sb,
                     "__device__ __forceinline__ float fm_row_sum(float x, float *red, int &par) {\n"
                     "  x = fm_warp_sum(x);\n"
                     "  float *r = red + par;\n"
                     "  par ^= %u;\n"
                     "  if ((threadIdx.x & 31) == 0) r[threadIdx.x >> 5] = x;\n"
                     "  __syncthreads();\n"
                     "  float t = r[0];\n"
                     "#pragma unroll\n"
                     "  for (int w = 1; w < %u; ++w) t += r[w];\n"
                     "  return t;\n"
                     "}\n"
                     "__device__ __forceinline__ float fm_row_max(float x, float *red, int &par) {\n"
                     "  x = fm_warp_max(x);\n"
                     "  float *r = red + par;\n"
                     "  par ^= %u;\n"
                     "  if ((threadIdx.x & 31) == 0) r[threadIdx.x >> 5] = x;\n"
                     "  __syncthreads();\n"
                     "  float t = r[0];\n"
                     "#pragma unroll\n"
                     "  for (int w = 1; w < %u; ++w) t = fm_maximum(t, r[w]);\n"
                     "  return t;\n"
                     "}\n",
                     half, s->tpr / 32, half, s->tpr / 32);
  }
  if (msum) emit_msum_helpers(sb, c, s, half);
}

/* "true" or the runtime test that element i of this thread is inside the row. */
void fm_cg_rows_emit_valid(fm_strbuf *sb, const fm_cg_rows_plan *rp, const shape *s, const char *i) {
  const char *t0 = s->stream ? "fm_t0 + " : "";
  if (s->exact)
    fm_strbuf_append(sb, "true");
  else if (s->vec == 1)
    fm_strbuf_printf(sb, "(%s%s * %u + lane < %lld)", t0, i, s->tpr, (long long)rp->n);
  else if (s->ragged)
    fm_strbuf_printf(sb, "(%s(%s / %u * %u + lane) * %u + %s %% %u < %lld)", t0, i, s->vec, s->tpr, s->vec, i, s->vec,
                     (long long)rp->n);
  else
    fm_strbuf_printf(sb, "(%s(%s / %u * %u + lane) * %u < %lld)", t0, i, s->vec, s->tpr, s->vec, (long long)rp->n);
}

/* "<ptr>[b<k> + column j]": tensor k's element at column j (scalar access) */
static void elem_ref(char *out, size_t cap, const fm_cg_rows_plan *rp, const char *ptr, uint32_t k) {
  int64_t s = rp->base.t[k].es[rp->rank - 1];
  if (s == 0)
    snprintf(out, cap, "%s[b%u]", ptr, k);
  else if (s == 1)
    snprintf(out, cap, "%s[b%u + j]", ptr, k);
  else
    snprintf(out, cap, "%s[b%u + j * %lldLL]", ptr, k, (long long)s);
}

/* Row index -> coordinates of dims 0..r-2 -> each used tensor's row base offset b<k>. */
static void emit_bases(fm_strbuf *sb, const fm_cg_rows_plan *rp, const fm_fragment *f) {
  const fm_cg_plan *p = &rp->base;
  uint32_t r = rp->rank;
  if (r >= 2) {
    fm_strbuf_append(sb, "    unsigned long long q = (unsigned long long)row;\n");
    for (uint32_t g = r - 1; g-- > 1;) {
      fm_strbuf_printf(sb, "    const long long c%u = (long long)(q %% %lldull);\n", g,
                       (long long)f->outputs[0].shape[g]);
      fm_strbuf_printf(sb, "    q /= %lldull;\n", (long long)f->outputs[0].shape[g]);
    }
    fm_strbuf_append(sb, "    const long long c0 = (long long)q;\n");
  }
  for (uint32_t k = 0; k < p->n_in + p->n_out; k++) {
    if (k < p->n_in && !p->live[k]) continue;
    fm_strbuf_printf(sb, "    const long long b%u = 0", k);
    for (uint32_t g = 0; g + 1 < r; g++) {
      int64_t s = p->t[k].es[g];
      if (s) fm_strbuf_printf(sb, " + c%u * %lldLL", g, (long long)s);
    }
    fm_strbuf_append(sb, ";\n");
  }
  if (r >= 2) fm_strbuf_append(sb, "    (void)c0;\n");
}

static void emit_chunk_head(fm_strbuf *sb, const fm_cg_rows_plan *rp, const shape *s) {
  fm_strbuf_printf(sb,
                   "#pragma unroll\n"
                   "    for (int c = 0; c < %u; ++c) {\n"
                   "      const long long j = %s((long long)c * %u + lane) * %u;\n",
                   s->chunks, s->stream ? "fm_t0 + " : "", s->tpr, s->vec);
  if (!s->exact)
    fm_strbuf_printf(sb, "      if (j < %lldLL) {\n", (long long)rp->n);
  else
    fm_strbuf_append(sb, "      {\n");
}

/* Elements of one access of a dtype-dt row tensor: the whole vector, or 16 bytes of it where
 * the vector is wider (plan_vec: an f32 row beside 16-bit ones takes two). */
static uint32_t piece_elems(const shape *s, fm_dtype dt) {
  const uint32_t size = (uint32_t)fm_dtype_size(dt);
  return s->vec * size > 16u ? 16u / size : s->vec;
}

void fm_cg_rows_emit_load_row(fm_strbuf *sb, const fm_cg_rows_plan *rp, const shape *s, uint32_t k) {
  const fm_cg_plan *p = &rp->base;
  fm_dtype dt = p->t[k].dtype;
  char e[64];
  fm_strbuf_printf(sb, "    %s v%u[%u];\n", fm_cg_val_type(dt), k, s->ept);
  emit_chunk_head(sb, rp, s);
  if (s->vec == 1) {
    char ptr[16];
    snprintf(ptr, sizeof ptr, "in%u", k);
    elem_ref(e, sizeof e, rp, ptr, k);
    fm_strbuf_printf(sb, "        v%u[c] = ", k);
    fm_cg_emit_decode(sb, dt, e);
    fm_strbuf_append(sb, ";\n");
  } else {
    const uint32_t per = piece_elems(s, dt);
    const char *vt = fm_cg_vec_type(per * (uint32_t)fm_dtype_size(dt));
    if (s->ragged) { /* the chunk the row ends in: its elements inside the row, one at a time */
      fm_strbuf_printf(sb,
                       "        if (j + %u > %lldLL) {\n"
                       "#pragma unroll\n"
                       "          for (int e = 0; e < %u; ++e) v%u[c * %u + e] = j + e < %lldLL ? ",
                       s->vec, (long long)rp->n, s->vec, k, s->vec, (long long)rp->n);
      snprintf(e, sizeof e, "in%u[b%u + j + e]", k, k);
      fm_cg_emit_decode(sb, dt, e);
      fm_strbuf_append(sb, " : 0;\n        } else {\n");
    }
    for (uint32_t p0 = 0; p0 < s->vec; p0 += per) {
      fm_strbuf_printf(sb, "        const %s r%u = *reinterpret_cast<const %s *>(in%u + b%u + j + %u);\n", vt, p0, vt,
                       k, k, p0);
      fm_strbuf_printf(sb,
                       "#pragma unroll\n"
                       "        for (int e = 0; e < %u; ++e) v%u[c * %u + %u + e] = ",
                       per, k, s->vec, p0);
      snprintf(e, sizeof e, "%s(r%u, e)", fm_cg_get_fn(dt), p0);
      fm_cg_emit_decode(sb, dt, e);
      fm_strbuf_append(sb, ";\n");
    }
    if (s->ragged) fm_strbuf_append(sb, "        }\n");
  }
  /* outside the row: a defined value that no reduction reads and no store writes */
  fm_strbuf_printf(sb, "      }%s\n", s->exact ? "" : " else {");
  if (!s->exact) {
    if (s->vec == 1)
      fm_strbuf_printf(sb, "        v%u[c] = 0;\n      }\n", k);
    else
      fm_strbuf_printf(sb,
                       "#pragma unroll\n"
                       "        for (int e = 0; e < %u; ++e) v%u[c * %u + e] = 0;\n      }\n",
                       s->vec, k, s->vec);
  }
  fm_strbuf_append(sb, "    }\n");
}

/* Is there a live var of value x at or after op `from`? */
static int var_of(const fm_fragment *f, const fm_cg_plan *p, uint32_t from, uint32_t x) {
  for (uint32_t k = from; k < p->n_ops; k++)
    if (f->ops[k].op == FM_OP_VAR && p->live[p->n_in + k] && p->args[k][0] == x) return 1;
  return 0;
}

/* The var partials of value x reduced into `fm_msum t`, inside an open block: the thread's
 * count, sum and sum shifted by its warp's k, its M2 around its own mean (the exact two-pass
 * over registers: an error in that center changes M2 only by its square), then one
 * cross-thread merge. */
static void emit_msum(fm_strbuf *sb, const fm_cg_rows_plan *rp, const shape *s, uint32_t x) {
  fm_strbuf_printf(sb,
                   "      const float k = __shfl_sync(0xffffffffu, (float)v%u[0], 0);  /* the warp's shift */\n"
                   "      float a = 0.0f, h = 0.0f",
                   x);
  if (s->exact)
    fm_strbuf_printf(sb, ";\n      const float n = %u.0f;\n", s->ept);
  else
    fm_strbuf_append(sb, ", n = 0.0f;\n");
  fm_strbuf_printf(sb, "#pragma unroll\n      for (int i = 0; i < %u; ++i)\n        if (", s->ept);
  fm_cg_rows_emit_valid(sb, rp, s, "i");
  fm_strbuf_printf(sb, ") { a += v%u[i]; h += v%u[i] - k;%s }\n", x, x, s->exact ? "" : " n += 1.0f;");
  fm_strbuf_printf(sb,
                   "      const float ctr = k + (n > 0.0f ? fm_cdiv(h, n) : 0.0f);\n"
                   "      float q = 0.0f;\n"
                   "#pragma unroll\n      for (int i = 0; i < %u; ++i)\n        if (",
                   s->ept);
  fm_cg_rows_emit_valid(sb, rp, s, "i");
  fm_strbuf_printf(sb, ") { const float t = v%u[i] - ctr; q += t * t; }\n", x);
  fm_strbuf_append(sb,
                   "      const fm_msum p = {n, a, h, q};\n"
                   "      const fm_msum t = fm_row_msum(p, k, fm_red, fm_par);\n");
}

/* var from the merged M2 q (an expression): q / (N - correction) */
static void emit_var_from(fm_strbuf *sb, const fm_cg_rows_plan *rp, const fm_opnode *op, uint32_t pos, const char *q) {
  if (rp->n > op->correction)
    fm_strbuf_printf(sb, "      v%u = %s / %lld.0f;\n", pos, q, (long long)(rp->n - op->correction));
  else /* one element, correction 1: 0/0, NaN as in torch (spelled out: no division by 0) */
    fm_strbuf_printf(sb, "      v%u = %s * __int_as_float(0x7fc00000);\n", pos, q);
}

static void emit_reduce(fm_strbuf *sb, const fm_fragment *f, const fm_cg_rows_plan *rp, const shape *s, uint32_t i) {
  const fm_opnode *op = &f->ops[i];
  const fm_cg_plan *p = &rp->base;
  uint32_t pos = p->n_in + i, x = p->args[i][0];
  int is_max = op->op == FM_OP_AMAX;
  /* var after a mean of the same value (layer_norm) takes the M2 that mean's reduction
   * carried: one reduction fewer */
  int32_t mean_at = -1;
  for (uint32_t k = 0; op->op == FM_OP_VAR && k < i; k++)
    if (f->ops[k].op == FM_OP_MEAN && p->live[p->n_in + k] && p->args[k][0] == x) mean_at = (int32_t)(p->n_in + k);
  if (op->op == FM_OP_VAR && mean_at >= 0) {
    char q[32];
    snprintf(q, sizeof q, "fm_q%d", mean_at);
    fm_strbuf_printf(sb, "    float v%u;  /* %s */\n    {\n", pos, fm_op_name(op->op));
    emit_var_from(sb, rp, op, pos, q);
    fm_strbuf_append(sb, "    }\n");
    return;
  }
  if (op->op == FM_OP_VAR || (op->op == FM_OP_MEAN && var_of(f, p, i + 1, x))) {
    fm_strbuf_printf(sb, "    float v%u;  /* %s */\n", pos, fm_op_name(op->op));
    if (op->op == FM_OP_MEAN)
      fm_strbuf_printf(sb, "    float fm_q%u;  /* its sum of squared deviations, for the var below */\n", pos);
    fm_strbuf_append(sb, "    {\n");
    emit_msum(sb, rp, s, x);
    if (op->op == FM_OP_MEAN)
      fm_strbuf_printf(sb, "      v%u = t.s / %lld.0f;\n      fm_q%u = t.q;\n", pos, (long long)rp->n, pos);
    else
      emit_var_from(sb, rp, op, pos, "t.q");
    fm_strbuf_append(sb, "    }\n");
    return;
  }
  fm_strbuf_printf(sb, "    float v%u;  /* %s */\n    {\n", pos, fm_op_name(op->op));
  fm_strbuf_printf(sb, "      float a = %s;\n#pragma unroll\n      for (int i = 0; i < %u; ++i)\n        if (",
                   is_max ? "__int_as_float(0xff800000)" : "0.0f", s->ept);
  fm_cg_rows_emit_valid(sb, rp, s, "i");
  if (is_max)
    fm_strbuf_printf(sb, ") a = fm_maximum(a, v%u[i]);\n", x);
  else
    fm_strbuf_printf(sb, ") a += v%u[i];\n", x);
  if (is_max || op->op == FM_OP_SUM)
    fm_strbuf_printf(sb, "      v%u = fm_row_%s(a, fm_red, fm_par);\n    }\n", pos, is_max ? "max" : "sum");
  else
    fm_strbuf_printf(sb, "      v%u = fm_row_sum(a, fm_red, fm_par) / %lld.0f;\n    }\n", pos, (long long)rp->n);
}

/* Does the kernel have a var (hence the (count, sum, M2) helpers)? */
static int has_var(const fm_fragment *f, const fm_cg_plan *p) {
  for (uint32_t k = 0; k < p->n_ops; k++)
    if (f->ops[k].op == FM_OP_VAR && p->live[p->n_in + k]) return 1;
  return 0;
}

void fm_cg_rows_emit_store_row(fm_strbuf *sb, const fm_cg_rows_plan *rp, const shape *s, uint32_t k) {
  const fm_cg_plan *p = &rp->base;
  uint32_t t = p->n_in + k, pos = p->t[t].value;
  fm_dtype dt = p->t[t].dtype;
  char v[48];
  emit_chunk_head(sb, rp, s);
  if (s->vec == 1) {
    char ptr[16], ref[64];
    snprintf(ptr, sizeof ptr, "out%u", k);
    elem_ref(ref, sizeof ref, rp, ptr, t);
    fm_strbuf_printf(sb, "        %s = ", ref);
    snprintf(v, sizeof v, "v%u[c]", pos);
    fm_cg_emit_encode(sb, dt, p->vdt[pos], v);
    fm_strbuf_append(sb, ";\n");
  } else {
    const uint32_t per = piece_elems(s, dt);
    const char *vt = fm_cg_vec_type(per * (uint32_t)fm_dtype_size(dt));
    if (s->ragged) { /* the chunk the row ends in: its elements inside the row, one at a time */
      fm_strbuf_printf(sb,
                       "        if (j + %u > %lldLL) {\n"
                       "#pragma unroll\n"
                       "          for (int e = 0; e < %u; ++e)\n"
                       "            if (j + e < %lldLL) out%u[b%u + j + e] = ",
                       s->vec, (long long)rp->n, s->vec, (long long)rp->n, k, t);
      snprintf(v, sizeof v, "v%u[c * %u + e]", pos, s->vec);
      fm_cg_emit_encode(sb, dt, p->vdt[pos], v);
      fm_strbuf_append(sb, ";\n        } else {\n");
    }
    for (uint32_t p0 = 0; p0 < s->vec; p0 += per) {
      fm_strbuf_printf(sb, "        %s w%u = %s;\n", vt, p0,
                       !strcmp(vt, "uint4")   ? "make_uint4(0u, 0u, 0u, 0u)"
                       : !strcmp(vt, "uint2") ? "make_uint2(0u, 0u)"
                                              : "0");
      fm_strbuf_printf(sb, "#pragma unroll\n        for (int e = 0; e < %u; ++e) %s(w%u, e, ", per, fm_cg_put_fn(dt),
                       p0);
      snprintf(v, sizeof v, "v%u[c * %u + %u + e]", pos, s->vec, p0);
      fm_cg_emit_encode(sb, dt, p->vdt[pos], v);
      fm_strbuf_append(sb, ");\n");
      fm_strbuf_printf(sb, "        *reinterpret_cast<%s *>(out%u + b%u + j + %u) = w%u;\n", vt, k, t, p0, p0);
    }
    if (s->ragged) fm_strbuf_append(sb, "        }\n");
  }
  fm_strbuf_append(sb, "      }\n    }\n");
}

/* A per-row input's one element, decoded once per row. */
void fm_cg_rows_emit_load_per_row(fm_strbuf *sb, const fm_cg_plan *p, uint32_t k) {
  char e[32];
  snprintf(e, sizeof e, "in%u[b%u]", k, k);
  fm_strbuf_printf(sb, "    const %s v%u = ", fm_cg_val_type(p->vdt[k]), k);
  fm_cg_emit_decode(sb, p->vdt[k], e);
  fm_strbuf_append(sb, ";\n");
}

/* Op i (not a reduction): a register array of ept elements for a row value, else a scalar. */
void fm_cg_rows_emit_op(fm_strbuf *sb, const fm_fragment *f, const fm_cg_plan *p, const shape *s, uint32_t i) {
  uint32_t pos = p->n_in + i;
  if (f->ops[i].op == FM_OP_IOTA) { /* element i's column: chunk i / vec's start, then its place */
    fm_strbuf_printf(sb,
                     "    %s v%u[%u];\n#pragma unroll\n    for (int i = 0; i < %u; ++i)\n"
                     "      v%u[i] = (%s)(%s((long long)(i / %u) * %u + lane) * %u + i %% %u);  /* iota */\n",
                     fm_cg_val_type(p->vdt[pos]), pos, s->ept, s->ept, pos, fm_cg_val_type(p->vdt[pos]),
                     s->stream ? "fm_t0 + " : "", s->vec, s->tpr, s->vec, s->vec);
    return;
  }
  if (p->rowval[pos])
    fm_strbuf_printf(sb, "    %s v%u[%u];\n#pragma unroll\n    for (int i = 0; i < %u; ++i) v%u[i] = ",
                     fm_cg_val_type(p->vdt[pos]), pos, s->ept, s->ept, pos);
  else
    fm_strbuf_printf(sb, "    const %s v%u = ", fm_cg_val_type(p->vdt[pos]), pos);
  fm_cg_emit_op(sb, f, p, i);
  fm_strbuf_printf(sb, ";  /* %s */\n", fm_op_name(f->ops[i].op));
}

/* The held body: load whole rows into registers, every op on them, store each output once. */
static void emit_held_body(fm_strbuf *sb, const fm_fragment *f, const fm_cg_rows_plan *rp, const shape *s) {
  const fm_cg_plan *p = &rp->base;
  fm_strbuf_append(sb, "    /* 1. load: whole rows into registers, per-row values once */\n");
  for (uint32_t k = 0; k < p->n_in; k++) {
    if (!p->live[k]) continue;
    if (p->rowval[k])
      fm_cg_rows_emit_load_row(sb, rp, s, k);
    else
      fm_cg_rows_emit_load_per_row(sb, p, k);
  }
  fm_strbuf_append(sb, "    /* 2. the ops, in fp32 registers */\n");
  for (uint32_t i = 0; i < p->n_ops; i++) {
    uint32_t pos = p->n_in + i;
    if (!p->live[pos]) continue;
    if (fm_op_kind(f->ops[i].op) == FM_OPK_REDUCE) {
      emit_reduce(sb, f, rp, s, i);
    } else {
      fm_cg_rows_emit_op(sb, f, p, s, i);
    }
  }
  fm_strbuf_append(sb, "    /* 3. store: each output once */\n");
  for (uint32_t k = 0; k < p->n_out; k++) {
    uint32_t t = p->n_in + k, pos = p->t[t].value;
    if (p->rowval[pos]) {
      fm_cg_rows_emit_store_row(sb, rp, s, k);
    } else {
      char v[16];
      snprintf(v, sizeof v, "v%u", pos);
      fm_strbuf_printf(sb, "    if (lane == 0) out%u[b%u] = ", k, t);
      fm_cg_emit_encode(sb, p->t[t].dtype, p->vdt[pos], v);
      fm_strbuf_append(sb, ";\n");
    }
  }
}

static int emit_kernel(fm_strbuf *sb, const fm_fragment *f, const fm_cg_rows_plan *rp, const fm_rows_config *c,
                       const shape *s, const char *entry, fm_diag *d) {
  const fm_cg_plan *p = &rp->base;
  fm_cg_emit_signature(sb, p, c->block, 0, entry);
  if (rp->symbolic)
    fm_strbuf_printf(sb, "  const long long rows = outer * %lldLL;\n", (long long)rp->rows_per_outer);
  else
    fm_strbuf_printf(sb, "  const long long rows = %lldLL;\n  (void)outer;\n",
                     (long long)(rp->outer * rp->rows_per_outer));
  if (c->variant == FM_ROWS_WARP)
    fm_strbuf_append(sb, "  const int lane = threadIdx.x & 31;\n  float *fm_red = nullptr;\n  int fm_par = 0;\n");
  else
    fm_strbuf_printf(sb, "  const int lane = threadIdx.x;\n  __shared__ float fm_red[%u];\n  int fm_par = 0;\n",
                     2 * red_half(s, has_var(f, p)));
  fm_strbuf_printf(sb,
                   "  for (long long row = (long long)blockIdx.x * %u + threadIdx.x / %u; row < rows;\n"
                   "       row += (long long)gridDim.x * %u) {\n",
                   s->rpb, s->tpr, s->rpb);
  emit_bases(sb, rp, f);
  if (s->stream) {
    int rc = fm_cg_rows_emit_stream_body(sb, f, rp, s, d);
    if (rc) return rc;
  } else {
    emit_held_body(sb, f, rp, s);
  }
  fm_strbuf_append(sb, "  }\n}\n");
  return FM_OK;
}

static int make_shape(const fm_cg_rows_plan *rp, const fm_rows_config *c, shape *s, fm_diag *d) {
  if (c->variant != FM_ROWS_WARP && c->variant != FM_ROWS_BLOCK && c->variant != FM_ROWS_STREAM)
    return fm_diag_set(d, FM_EINVAL, "config: variant %u is not warp (1), block (2) or stream (3)", c->variant);
  if (c->block < 32 || c->block > 1024 || c->block % 32)
    return fm_diag_set(d, FM_EINVAL, "config: block %u is not a multiple of 32 in 32..1024", c->block);
  if (c->variant != FM_ROWS_WARP && (c->block & (c->block - 1)))
    return fm_diag_set(d, FM_EINVAL, "config: block %u is not a power of two", c->block);
  if (c->vec > 16 || (c->vec & (c->vec - 1)))
    return fm_diag_set(d, FM_EINVAL, "config: vec %u is not 0 or a power of two <= 16", c->vec);
  s->stream = c->variant == FM_ROWS_STREAM;
  s->tpr = c->variant == FM_ROWS_WARP ? 32 : c->block;
  s->rpb = c->block / s->tpr;
  s->vec = rp->max_vec;
  while (c->vec && s->vec > c->vec) s->vec >>= 1;
  s->ragged = (uint64_t)rp->n % s->vec != 0;
  uint64_t per_chunk = (uint64_t)s->tpr * s->vec;
  if (s->stream) { /* a tile: STREAM_EPT elements per thread, whatever the row's length */
    s->chunks = s->vec >= STREAM_EPT ? 1 : STREAM_EPT / s->vec;
    s->ept = s->chunks * s->vec;
    s->exact = (uint64_t)rp->n % (per_chunk * s->chunks) == 0;
    return FM_OK;
  }
  s->chunks = (uint32_t)(((uint64_t)rp->n + per_chunk - 1) / per_chunk);
  s->ept = s->chunks * s->vec;
  s->exact = (uint64_t)s->chunks * per_chunk == (uint64_t)rp->n;
  if (s->ept > MAX_EPT)
    return fm_diag_set(d, FM_EUNSUPPORTED,
                       "rows: %lld elements need %u per thread with %u threads per row (at most %u "
                       "fit in registers)",
                       (long long)rp->n, s->ept, s->tpr, MAX_EPT);
  return FM_OK;
}

int fm_codegen_rows(const fm_fragment *canon, const fm_rows_config *cfg, uint32_t sm_count, char **src,
                    fm_kernel_meta *meta, fm_diag *d) {
  fm_strbuf sb;
  fm_cg_rows_plan *rp = NULL;
  int rc = FM_OK;
  shape s = {0};
  char entry[FM_META_ENTRY_MAX];
  if (!canon || !src || !meta) return fm_diag_set(d, FM_EINVAL, "codegen: NULL argument");
  *src = NULL;
  fm_strbuf_init(&sb, MAX_SOURCE);
  fm_rows_config c = cfg ? *cfg : fm_codegen_rows_default(canon);
  rp = malloc(sizeof *rp);
  if (!rp) {
    rc = fm_diag_set(d, FM_ENOMEM, "codegen: out of memory");
    goto out;
  }
  if ((rc = fm_cg_rows_plan_build(canon, rp, d))) goto out;
  if ((rc = make_shape(rp, &c, &s, d))) goto out;
  snprintf(entry, sizeof entry, "fm_rows_v%d", FM_CODEGEN_VERSION);

  fm_strbuf_printf(&sb,
                   "/* fusemld codegen v%d: rows kernel, %s per row, block %u, rows of %lld, vec %u,"
                   " %u elements per thread.\n"
                   " * Generated from a canonical fragment: every name and number below comes "
                   "from its\n * typed fields. One self-contained translation unit (NVRTC has "
                   "no include path). */\n",
                   FM_CODEGEN_VERSION,
                   c.variant == FM_ROWS_WARP ? "a warp"
                   : s.stream                ? "a block streaming"
                                             : "a block",
                   c.block, (long long)rp->n, s.vec, s.ept);
  fm_cg_emit_prelude(&sb, fm_cg_fast_math(canon));
  emit_helpers(&sb, &c, &s, has_var(canon, &rp->base));
  fm_strbuf_append(&sb, "/* ---- the kernel ---- */\n");
  if ((rc = emit_kernel(&sb, canon, rp, &c, &s, entry, d))) goto out;
  if (fm_strbuf_error(&sb)) {
    rc = fm_diag_set(d, FM_ECODEGEN, "codegen: source buffer: %s", fm_strerror(fm_strbuf_error(&sb)));
    goto out;
  }
  fm_cg_meta_begin(meta, "rows", "rows", entry, c.block, &rp->base);
  meta->inner = (uint64_t)rp->rows_per_outer;
  meta->items_per_block = s.rpb;
  /* the kernel strides over rows, so any cap is correct; this one is many waves deep */
  uint64_t max_blocks = (uint64_t)(sm_count ? sm_count : DEFAULT_SMS) * (2048u / c.block) * 64u;
  meta->max_blocks = max_blocks > 0x7fffffffu ? 0x7fffffffu : (uint32_t)max_blocks;
  meta->outer = rp->outer;
  *src = fm_strbuf_take(&sb);
  if (!*src) rc = fm_diag_set(d, FM_ENOMEM, "codegen: out of memory");
out:
  fm_strbuf_free(&sb);
  free(rp);
  return rc;
}

/* Short rows: a warp each (no barriers), 8 rows per 256-thread block. Long rows: a block
 * each, the smallest power-of-two block that keeps <= 32 elements per thread: on an H200,
 * [16384, 4096] bf16, 128 threads (32 each) reached 99/86/88% of copy bandwidth for
 * RMSNorm/LayerNorm/softmax where 256 threads (16 each) reached 96/85/77% (bench/rows_bw):
 * more independent 16-byte loads in flight per thread, and fewer warps per barrier. Rows
 * that need more than STREAM_ABOVE elements per thread at 1024 threads stream, 1024 threads
 * each: a 1024-thread block has at most 64 registers a thread, which 32 elements of a row
 * and the values made from them overflow (cross-entropy's forward over Llama's 32000 logits
 * spilled: 1.1 TB/s), and the fewest rows in flight keep re-read tiles in L2 (264 rows of
 * 50304 bf16 logits on 132 SMs: 26 MB). A row read once (cross-entropy's statistics) has no
 * tile to re-read: 256 threads, more rows in flight (the tuner chose 256 for it at 32000 and
 * 50257 logits on an H200, 1.3-1.6x faster than 1024). */
fm_rows_config fm_codegen_rows_default(const fm_fragment *canon) {
  fm_rows_config c = {FM_ROWS_WARP, 256, 0};
  fm_cg_rows_plan *rp = canon ? malloc(sizeof *rp) : NULL;
  if (rp && fm_cg_rows_plan_build(canon, rp, NULL) == FM_OK && rp->n > 1024) {
    c.variant = FM_ROWS_BLOCK;
    c.block = 128;
    while (c.block < 1024 && (uint64_t)rp->n > (uint64_t)c.block * 32) c.block *= 2;
    if ((uint64_t)rp->n > 1024u * STREAM_ABOVE && !has_var(canon, &rp->base)) {
      c.variant = FM_ROWS_STREAM;
      if (fm_cg_rows_stream_passes(canon, rp) == 1) c.block = 256;
    }
  }
  free(rp);
  return c;
}

/* The default first; then the warp variant at 128/256/512 threads for rows up to 2048, the
 * block variant at 128..1024 threads where it fits in registers and uses most threads, and
 * the stream variant at 256..1024 threads for rows longer than STREAM_FROM (which of the two
 * is faster where both run depends on how many values the kernel keeps per element). */
size_t fm_codegen_rows_candidates(const fm_fragment *canon, fm_rows_config *out, size_t max) {
  static const uint32_t blocks[] = {128, 256, 512, 1024};
  size_t n = 0;
  if (!out || !max) return 0;
  fm_rows_config def = fm_codegen_rows_default(canon);
  out[n++] = def;
  fm_cg_rows_plan *rp = canon ? malloc(sizeof *rp) : NULL;
  if (!rp || fm_cg_rows_plan_build(canon, rp, NULL) != FM_OK) goto done;
  const int var = has_var(canon, &rp->base);
  for (int v = FM_ROWS_WARP; v <= FM_ROWS_STREAM; v++)
    for (size_t b = 0; b < sizeof blocks / sizeof blocks[0]; b++) {
      fm_rows_config c = {(uint32_t)v, blocks[b], 0};
      shape s = {0};
      if (v == FM_ROWS_WARP && (blocks[b] > 512 || rp->n > 2048)) continue;
      if (v == FM_ROWS_STREAM && (blocks[b] < 256 || rp->n <= STREAM_FROM || var)) continue;
      if (v == FM_ROWS_BLOCK && rp->n > FM_MAX_ROW_HELD) continue; /* spills: streamed instead */
      if (make_shape(rp, &c, &s, NULL) != FM_OK) continue;
      if (v == FM_ROWS_BLOCK && (uint64_t)blocks[b] * s.vec > 2 * (uint64_t)rp->n) continue;
      if (c.variant == def.variant && c.block == def.block && c.vec == def.vec) continue;
      if (n == max) goto done;
      out[n++] = c;
    }
  /* a ragged row (its vectors end inside it): the default at the widest vector that divides
     the row too, every element in whole vectors (the tuner times the two forms) */
  uint32_t whole = rp->max_vec;
  while (whole > 1 && rp->n % whole) whole >>= 1;
  fm_rows_config narrow = def;
  shape ns = {0};
  narrow.vec = whole;
  if (whole < rp->max_vec && n < max && make_shape(rp, &narrow, &ns, NULL) == FM_OK) out[n++] = narrow;
done:
  free(rp);
  return n;
}
