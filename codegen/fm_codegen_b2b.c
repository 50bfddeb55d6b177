/* fm_codegen_b2b.c: the b2b template (sm_90a): a chained GEMM fragment (fm_fragment.h,
 * "Chains") as one kernel, back-to-back GEMMs whose [M, N1] intermediate never leaves the SM.
 *
 * A block owns BM whole rows of the output (one column tile of N2 <= 256 columns), one
 * warpgroup per 64 rows. Its A rows [BM, K1] (K1 <= 256) are loaded once into shared
 * memory; then for each 64-column chunk j of N1:
 *   GEMM 1   acc1[64 x 64] = A rows x B[:, chunk j]          (wgmma m64n64k16, both operands
 *                                                             from shared memory)
 *   stage 1  the fragment's first-stage ops on each accumulator (bias, activation, ...),
 *            rounded to the operand dtype and packed, in registers, into the A fragments of
 *            the next product: the m64n64 accumulator layout of columns 16kk .. 16kk+15 is
 *            the m64k16 A-register layout (what flash attention does with P)
 *   GEMM 2   acc2[64 x N2] += that x B2[chunk j rows, :]      (wgmma m64nN2k16, A from
 *                                                             registers, B2 from shared memory)
 * and at the end stage 2 (bias, residual, ...) on acc2, staged through shared memory so that
 * its inputs and outputs move as 16-byte row pieces, and the stores. A residual that is A's
 * memory (the MLP block's x, which the client sends twice) is read from A's rows, still in
 * shared memory, rather than from L2 (x_twin; checked per launch by comparing the two
 * pointers). B's and B2's chunks
 * stream through shared-memory buffers (128-byte swizzled K-major rows as the wgmma
 * descriptors name them). Forms (fm_b2b_config.form): cp.async by every
 * thread, each chunk's steps one after the other while the next chunk loads; TMA by a loader
 * warpgroup through mbarriers, the two consumer warpgroups taking ping-pong tensor turns; the
 * same in pairs of blocks multicasting half of each weight chunk. (A form issuing the next
 * chunk's first product before this chunk's stage 1 needed two accumulator sets and spilled
 * at N2 = 256: measured slower, removed; bench/NOTES.md.) No other instruction writes an
 * accumulator (the first k-step of each product does not accumulate): that would make ptxas
 * serialise every wgmma. Every B and B2 element is read once per block (from L2: the weights are shared by
 * every block), A and the outputs once in all. Measured on an H100 (bench/NOTES.md,
 * "Back-to-back GEMMs", "The b2b rings"): 0.78x the time of the two tuned GEMM kernels it
 * replaces at the MLP block with its inputs in L2, 0.92x with them in memory (codegen v23-24;
 * at parity before).
 *
 * Limits (else FM_EUNSUPPORTED, the reason in d; PROTOCOL.md names them): bf16 or f16;
 * K1 a multiple of 64, at most 256 (A's rows stay in shared memory); N1 a multiple of 64;
 * N2 a multiple of 16, at most 256 (acc2 is 128 registers a thread); A row-major, B and B2
 * K-major, every leading dim a multiple of 8 and every operand 16-byte aligned. Launch
 * metadata: kind "gemm", grid rule "tiles" with one column tile. Changing the generated
 * text changes generated source: bump FM_CODEGEN_VERSION. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fm_codegen_gemm.h"

#define MAX_SOURCE    (1u << 20)
#define MAX_SMEM_SM90 (227u * 1024u)
#define CHUNK         64u  /* columns of N1 per step: one 128-byte swizzle row of B2's K */
#define MIN_ROWS      8192 /* the fewest rows (static M or M bucket) served: see plan_build */

typedef struct b2b_plan {
  fm_cg_plan base; /* n_in/n_out/n_ops, vdt, args (positions); t[k] dtype/align */
  fm_chain_info ci;
  uint32_t ia, ib, ib2; /* input positions of A, B, B2 */
  fm_dtype dt;
  int64_t m, k1, n1, n2; /* m = -1 when symbolic */
  int64_t lda, ldb, ldb2;
  int64_t es[FM_CG_MAX_TENSORS][2]; /* [M, N] strides of epilogue tensors (0: broadcast) */
  int x_twin;                       /* a stage-2 input laid out like A (the MLP's residual x), or -1 */
} b2b_plan;

/* A K-major operand of the template: stride 1 along K (kdim), leading dim a multiple of 8. */
static int kmajor(const fm_tensor *t, uint32_t kdim, const char *name, int64_t *ld, fm_diag *d) {
  uint32_t odim = 1 - kdim;
  if (t->rank != 2 || (t->strides[kdim] != 1 && t->shape[kdim] != 1))
    return fm_diag_set(d, FM_EUNSUPPORTED, "b2b: %s must be K-major (%s)", name,
                       kdim ? "A row-major" : "nn.Linear's weight.t()");
  *ld = t->shape[odim] == 1 ? 0 : t->strides[odim];
  if (*ld % 8)
    return fm_diag_set(d, FM_EUNSUPPORTED, "b2b: %s's leading dimension %" PRId64 " is not a multiple of 8", name, *ld);
  if (t->align < 16)
    return fm_diag_set(d, FM_EUNSUPPORTED, "b2b: %s is only %u-byte aligned; the template needs 16", name, t->align);
  return FM_OK;
}

/* The stage-2 input that is laid out like A ([M, K1] with A's dtype and strides, N2 = K1),
 * or -1. The client sends the MLP's residual x a second time, as an input of its own (nothing
 * else may read a matrix operand's value), so the kernel gets one memory through two
 * parameters; where they are equal at launch, the last stage reads it from A's rows in shared
 * memory instead of from L2 (fm_stage2_staged). */
static int x_twin(const fm_fragment *f, const b2b_plan *bp) {
  if (bp->n2 != bp->k1 || bp->lda <= 0) return -1;
  const fm_tensor *a = &f->inputs[bp->ia];
  for (uint32_t k = 0; k < bp->base.n_in; k++) {
    const fm_tensor *t = &f->inputs[k];
    if (k == bp->ia || k == bp->ib || k == bp->ib2 || !(bp->ci.in_need[k] & 2)) continue;
    if (t->dtype == bp->dt && t->rank == 2 && t->shape[0] == a->shape[0] && bp->es[k][0] == bp->lda &&
        bp->es[k][1] == 1 && t->align >= 16)
      return (int)k;
  }
  return -1;
}

static int plan_build(const fm_fragment *f, b2b_plan *bp, fm_diag *d) {
  fm_cg_plan *p = &bp->base;
  memset(bp, 0, sizeof *bp);
  if (!fm_fragment_is_chain(f)) return fm_diag_set(d, FM_EUNSUPPORTED, "b2b: not a chained GEMM fragment");
  int rc = fm_fragment_chain_info(f, &bp->ci, d);
  if (rc) return rc;
  if ((rc = fm_cg_gemm_values(f, bp->ci.op1, bp->ci.op2, "b2b template", p, d))) return rc;
  const fm_opnode *m1 = &f->ops[bp->ci.op1], *m2 = &f->ops[bp->ci.op2];
  bp->ia = p->args[bp->ci.op1][m1->nargs - 2];
  bp->ib = p->args[bp->ci.op1][m1->nargs - 1];
  bp->ib2 = p->args[bp->ci.op2][m2->nargs - 1];
  if (bp->ia >= p->n_in || bp->ib >= p->n_in || bp->ib2 >= p->n_in)
    return fm_diag_set(d, FM_EINVAL, "b2b: the matrix operands are not inputs");
  const fm_tensor *a = &f->inputs[bp->ia], *b = &f->inputs[bp->ib], *b2 = &f->inputs[bp->ib2];
  bp->dt = a->dtype;
  if (bp->dt != FM_DT_BF16 && bp->dt != FM_DT_F16)
    return fm_diag_set(d, FM_EUNSUPPORTED, "b2b: the template multiplies bf16 or f16");
  bp->m = a->shape[0];
  bp->k1 = a->shape[1];
  bp->n1 = b->shape[1];
  bp->n2 = b2->shape[1];
  /* a block owns BM rows and walks every chunk of the weights alone: with few rows the GPU
     is mostly idle and the chain loses to the two GEMM kernels (H100, M = 128: 0.034 ms
     against 0.020; M = 16384: 0.058 against 0.061; bench/NOTES.md), so the client runs those */
  const int64_t rows = bp->m >= 0 ? bp->m : (int64_t)f->m_hint;
  if (rows < MIN_ROWS)
    return fm_diag_set(d, FM_EUNSUPPORTED,
                       "b2b: M = %" PRId64 " (%s) is under %d rows: too few blocks to beat the two GEMM kernels", rows,
                       bp->m >= 0 ? "static" : "its bucket; 0: none given", MIN_ROWS);
  if (bp->k1 % 64 || bp->k1 > 256)
    return fm_diag_set(d, FM_EUNSUPPORTED,
                       "b2b: K1 = %" PRId64 " (A's rows stay on chip: a multiple of 64, at most 256)", bp->k1);
  if (bp->n1 % CHUNK)
    return fm_diag_set(d, FM_EUNSUPPORTED, "b2b: N1 = %" PRId64 " is not a multiple of %u", bp->n1, CHUNK);
  if (bp->n2 % 16 || bp->n2 > 256)
    return fm_diag_set(d, FM_EUNSUPPORTED,
                       "b2b: N2 = %" PRId64 " (the output rows stay in registers: a multiple of 16, at most 256)",
                       bp->n2);
  if ((rc = kmajor(a, 1, "A", &bp->lda, d)) || (rc = kmajor(b, 0, "B", &bp->ldb, d)) ||
      (rc = kmajor(b2, 0, "B2", &bp->ldb2, d)))
    return rc;
  for (uint32_t k = 0; k < p->n_out; k++) {
    int pos = fm_cg_value_position(f, p->n_in + p->n_ops, f->outputs[k].id);
    if (pos < (int)p->n_in) return fm_diag_set(d, FM_EINVAL, "outputs[%u]: bad value", k);
    p->t[p->n_in + k].value = (uint32_t)pos;
  }
  for (uint32_t k = 0; k < p->n_in + p->n_out; k++) {
    const fm_tensor *t = k < p->n_in ? &f->inputs[k] : &f->outputs[k - p->n_in];
    p->t[k].dtype = t->dtype;
    p->t[k].align = t->align;
    if (k == bp->ia || k == bp->ib || k == bp->ib2) continue;
    if (k < p->n_in && !bp->ci.in_need[k]) continue;
    if (t->rank != 2) return fm_diag_set(d, FM_EINVAL, "b2b: epilogue tensor %u is not rank 2", k);
    for (uint32_t j = 0; j < 2; j++) bp->es[k][j] = t->shape[j] == 1 ? 0 : t->strides[j];
  }
  bp->x_twin = x_twin(f, bp);
  return FM_OK;
}

/* One wgmma: m64n<n>k16, fp32 accumulators d[n/8][4] kept; A from shared memory (descriptor)
 * or from 4 registers of packed pairs (a_regs), B from shared memory. */
static void emit_wgmma(fm_strbuf *sb, const char *name, const char *ty, uint32_t n, int a_regs) {
  uint32_t regs = n / 2, next = regs;
  if (a_regs)
    fm_strbuf_printf(
        sb,
        "__device__ __forceinline__ void %s(float (&d)[%u][4], const unsigned (&a)[4], unsigned long long db,\n"
        "    int accumulate) {\n"
        "  asm volatile(\"{\\n.reg .pred p;\\nsetp.ne.b32 p, %%%u, 0;\\n\"\n"
        "      \"wgmma.mma_async.sync.aligned.m64n%uk16.f32.%s.%s {",
        name, n / 8, regs + 5, n, ty, ty);
  else
    fm_strbuf_printf(
        sb,
        "__device__ __forceinline__ void %s(float (&d)[%u][4], unsigned long long da, unsigned long long db,\n"
        "    int accumulate) {\n"
        "  asm volatile(\"{\\n.reg .pred p;\\nsetp.ne.b32 p, %%%u, 0;\\n\"\n"
        "      \"wgmma.mma_async.sync.aligned.m64n%uk16.f32.%s.%s {",
        name, n / 8, regs + 2, n, ty, ty);
  for (uint32_t i = 0; i < regs; i++) fm_strbuf_printf(sb, "%s%%%u", i ? ", " : "", i);
  if (a_regs) {
    fm_strbuf_printf(sb, "}, {%%%u, %%%u, %%%u, %%%u}, %%%u, p, 1, 1, 0;\\n}\\n\"\n      : ", next, next + 1, next + 2,
                     next + 3, next + 4);
  } else { /* scale-d from `accumulate`: 0 on a product's first k-step, so no zeroing is needed */
    fm_strbuf_printf(sb, "}, %%%u, %%%u, p, 1, 1, 0, 0;\\n}\\n\"\n      : ", next, next + 1);
  }
  for (uint32_t i = 0; i < regs; i++) fm_strbuf_printf(sb, "%s\"+f\"(d[%u][%u])", i ? ", " : "", i / 4, i % 4);
  if (a_regs)
    fm_strbuf_append(
        sb, "\n      : \"r\"(a[0]), \"r\"(a[1]), \"r\"(a[2]), \"r\"(a[3]), \"l\"(db), \"r\"(accumulate));\n}\n");
  else
    fm_strbuf_append(sb, "\n      : \"l\"(da), \"l\"(db), \"r\"(accumulate));\n}\n");
}

/* "in3[m * 1024LL + n]" for tensor k, column expression col (a broadcast dim contributes
 * nothing). */
static void emit_at(fm_strbuf *sb, const b2b_plan *bp, uint32_t k, const char *name, const char *col) {
  int any = 0;
  fm_strbuf_printf(sb, "%s[", name);
  for (uint32_t j = 0; j < 2; j++) {
    if (!bp->es[k][j]) continue;
    if (j && bp->es[k][j] == 1)
      fm_strbuf_printf(sb, "%s%s", any ? " + " : "", col); /* col is an int */
    else
      fm_strbuf_printf(sb, "%s%s * %" PRId64 "LL", any ? " + " : "", j ? col : "m", bp->es[k][j]);
    any = 1;
  }
  fm_strbuf_append(sb, any ? "]" : "0]");
}

/* "const float v3 = fm_bf16_to_f32(<raw>);" for input k, whose raw element the caller writes
 * between the two halves. */
static void emit_input_open(fm_strbuf *sb, const b2b_plan *bp, uint32_t k, const char *ind) {
  fm_dtype dt = bp->base.vdt[k];
  fm_strbuf_printf(sb, "%sconst %s v%u = %s", ind, dt == FM_DT_BOOL ? "bool" : "float", k,
                   dt == FM_DT_F16    ? "fm_f16_to_f32("
                   : dt == FM_DT_BF16 ? "fm_bf16_to_f32("
                                      : "(");
}

static void emit_input_close(fm_strbuf *sb, const b2b_plan *bp, uint32_t k) {
  fm_strbuf_append(sb, bp->base.vdt[k] == FM_DT_BOOL ? " != 0);\n" : ");\n");
}

/* Every op stage s (1 or 2) needs, in order, on accumulator value fm_a (ops of neither stage
 * are computed where they are needed). */
static void emit_stage_ops(fm_strbuf *sb, const fm_fragment *f, const b2b_plan *bp, int s, const char *ind) {
  const fm_cg_plan *p = &bp->base;
  const uint8_t bit = (uint8_t)(1u << (s - 1));
  for (uint32_t i = 0; i < p->n_ops; i++) {
    if (!(bp->ci.need[i] & bit) || (bp->ci.stage[i] && bp->ci.stage[i] != s)) continue;
    uint32_t pos = p->n_in + i;
    fm_strbuf_printf(sb, "%sconst %s v%u = ", ind, p->vdt[pos] == FM_DT_BOOL ? "bool" : "float", pos);
    if ((int)i == bp->ci.op1 || (int)i == bp->ci.op2) {
      if (f->ops[i].nargs == 3) {
        uint32_t b = p->args[i][0];
        if (p->vdt[b] == FM_DT_BOOL)
          fm_strbuf_printf(sb, "(fm_a + (v%u ? 1.0f : 0.0f))", b);
        else
          fm_strbuf_printf(sb, "(fm_a + v%u)", b);
      } else {
        fm_strbuf_append(sb, "fm_a");
      }
    } else {
      fm_cg_emit_op(sb, f, p, i);
    }
    fm_strbuf_printf(sb, ";  /* %s */\n", fm_op_name(f->ops[i].op));
  }
}

/* Stage 1 on accumulator fm_a at (m, n), as a block of statements: the inputs it reads, its
 * ops; it leaves the second product's A element in fm_h. */
static void emit_stage1(fm_strbuf *sb, const fm_fragment *f, const b2b_plan *bp, const char *ind) {
  const fm_cg_plan *p = &bp->base;
  char raw[32];
  for (uint32_t k = 0; k < p->n_in; k++) {
    if (!(bp->ci.in_need[k] & 1)) continue;
    emit_input_open(sb, bp, k, ind);
    snprintf(raw, sizeof raw, "in%u", k);
    emit_at(sb, bp, k, raw, "n");
    emit_input_close(sb, bp, k);
  }
  emit_stage_ops(sb, f, bp, 1, ind);
  fm_strbuf_printf(sb, "%sfm_h = v%u;\n", ind, (unsigned)bp->ci.a2);
}

static uint64_t stage_bytes(const b2b_plan *bp) {
  return (uint64_t)CHUNK * (uint64_t)bp->k1 * 2u + (uint64_t)bp->n2 * 128u; /* B's chunk + B2's */
}

/* The TMA forms' rings: buffers of B's chunks (s1) and of B2's (s2). */
typedef struct tma_rings {
  uint32_t s1, s2;
} tma_rings;

static uint64_t rings_bytes(const b2b_plan *bp, uint32_t bm, tma_rings r) {
  return (uint64_t)bm * (uint64_t)bp->k1 * 2u + 1024u +
         8u * ((uint64_t)bp->k1 / 64u + 2u * (r.s1 + r.s2)) + /* A, alignment, mbarriers */
         r.s1 * (uint64_t)CHUNK * (uint64_t)bp->k1 * 2u + r.s2 * (uint64_t)bp->n2 * 128u;
}

/* As many buffers as fit beside A's rows, 2..4 a ring, B's ring first when they differ (a
 * buffer of B is needed a turn before its B2 half); {0, 0}: not even two each. Each ring's
 * loads lead its products by s - 1 chunk periods. */
static tma_rings tma_rings_for(const b2b_plan *bp, uint32_t bm) {
  tma_rings r = {2, 2};
  if (rings_bytes(bp, bm, r) > MAX_SMEM_SM90) return (tma_rings){0, 0};
  for (;;) {
    tma_rings more = r;
    if (more.s1 <= more.s2)
      more.s1++;
    else
      more.s2++;
    if (more.s1 > 4 || rings_bytes(bp, bm, more) > MAX_SMEM_SM90) break; /* (4, 4) at most */
    r = more;
  }
  return r;
}

static uint32_t smem_bytes(const b2b_plan *bp, const fm_b2b_config *c) {
  uint64_t total;
  if (c->form != FM_B2B_CPASYNC) {
    tma_rings r = tma_rings_for(bp, c->bm);
    total = rings_bytes(bp, c->bm, r.s1 ? r : (tma_rings){2, 2});
  } else { /* A's rows and two buffers of each chunk, + alignment of the swizzled buffers */
    total = (uint64_t)c->bm * (uint64_t)bp->k1 * 2u + 2u * stage_bytes(bp) + 1024u;
  }
  return total > UINT32_MAX ? UINT32_MAX : (uint32_t)total;
}

/* Passes of the last stage's staging (fm_stage2_staged): the fewest whose columns (N2 / p, a
 * multiple of 8) fit BM padded rows of floats into the buffers after the products (only the
 * chunk buffers where an x_twin keeps A's rows); 0: none does (check_config refuses; the limits
 * never reach it: two passes fit every shape they allow, test_codegen_b2b). */
static uint32_t stage2_passes(const b2b_plan *bp, const fm_b2b_config *c) {
  uint64_t room = smem_bytes(bp, c) - 1024u, n2 = (uint64_t)bp->n2;
  if (bp->x_twin >= 0) room -= (uint64_t)c->bm * (uint64_t)bp->k1 * 2u; /* A's rows stay: x_twin */
  if (c->form != FM_B2B_CPASYNC) {
    tma_rings r = tma_rings_for(bp, c->bm);
    room -= 8u * ((uint64_t)bp->k1 / 64u + 2u * (r.s1 + r.s2)); /* the mbarriers stay */
  }
  for (uint32_t p = 1; p <= n2 / 8; p++)
    if (n2 % (8u * p) == 0 && (uint64_t)c->bm * (n2 / p + 8) * 4u <= room) return p;
  return 0;
}

static int check_config(const b2b_plan *bp, const fm_b2b_config *c, fm_diag *d) {
  if (c->bm != 64 && c->bm != 128)
    return fm_diag_set(d, FM_EUNSUPPORTED, "config: BM %u (64 or 128: one warpgroup per 64 rows)", c->bm);
  if (c->form > FM_B2B_TMA_PAIR) return fm_diag_set(d, FM_EUNSUPPORTED, "config: form %u (0 .. 2)", c->form);
  if (c->form != FM_B2B_CPASYNC && !tma_rings_for(bp, c->bm).s1)
    return fm_diag_set(d, FM_EUNSUPPORTED, "config: two chunk buffers do not fit beside A's rows");
  if (smem_bytes(bp, c) > MAX_SMEM_SM90)
    return fm_diag_set(d, FM_EUNSUPPORTED, "config: %u bytes of shared memory exceed %u", smem_bytes(bp, c),
                       MAX_SMEM_SM90);
  if (!stage2_passes(bp, c))
    return fm_diag_set(d, FM_EUNSUPPORTED, "config: the last stage's staging does not fit in %u bytes",
                       smem_bytes(bp, c));
  return FM_OK;
}

/* Tried in this order; the first that fits is the default. Two warpgroups of 64 rows share
 * each chunk of the weights (128 rows: M = 16384 is 128 blocks, one wave of an H100). */
static const fm_b2b_config configs[] = {
    {.bm = 128, .form = FM_B2B_TMA},    {.bm = 64, .form = FM_B2B_TMA},       {.bm = 128, .form = FM_B2B_CPASYNC},
    {.bm = 64, .form = FM_B2B_CPASYNC}, {.bm = 128, .form = FM_B2B_TMA_PAIR},
};

fm_b2b_config fm_codegen_b2b_default(const fm_fragment *canon) {
  fm_b2b_config out[1];
  if (fm_codegen_b2b_candidates(canon, out, 1) == 1) return out[0];
  return configs[0];
}

size_t fm_codegen_b2b_candidates(const fm_fragment *canon, fm_b2b_config *out, size_t max) {
  b2b_plan *bp = malloc(sizeof *bp);
  size_t n = 0;
  if (!bp) return 0;
  if (canon && !plan_build(canon, bp, NULL))
    for (size_t i = 0; i < sizeof configs / sizeof configs[0] && n < max; i++)
      if (!check_config(bp, &configs[i], NULL)) out[n++] = configs[i];
  free(bp);
  return n;
}

/* The stage-1 inputs as parameters (decl) or arguments of fm_stage1. */
static void emit_stage1_params(fm_strbuf *sb, const fm_fragment *f, const b2b_plan *bp, int decl) {
  for (uint32_t k = 0; k < bp->base.n_in; k++) {
    if (!(bp->ci.in_need[k] & 1)) continue;
    if (decl)
      fm_strbuf_printf(sb, ", const %s *__restrict__ in%u", fm_cg_storage_type(f->inputs[k].dtype), k);
    else
      fm_strbuf_printf(sb, ", in%u", k);
  }
}

/* fm_stage1(acc, af, ...): stage 1 on a thread's m64n64 accumulators of chunk j (rows mw and
 * mw + 8; rows past M compute garbage nothing stores, their loads read row M - 1), rounded
 * and packed into the A fragments of the second product: columns 16kk .. 16kk+15 of the
 * m64n64 accumulator layout are the m64k16 A-register layout, pairs (row, 2c), (row + 8, 2c),
 * (row, 2c + 8), (row + 8, 2c + 8). */
static void emit_stage1_fn(fm_strbuf *sb, const fm_fragment *f, const b2b_plan *bp) {
  const char *cvt = bp->dt == FM_DT_BF16 ? "fm_f32_to_bf16" : "fm_f32_to_f16";
  fm_strbuf_append(sb,
                   "__device__ __forceinline__ void fm_stage1(const float (&acc)[8][4], unsigned (&af)[4][4],\n"
                   "    const long long M, const long long mw, const int j, const int lane");
  emit_stage1_params(sb, f, bp, 1);
  fm_strbuf_append(sb,
                   ") {\n"
                   "  unsigned short hv[8][4];\n"
                   "#pragma unroll\n"
                   "  for (int t = 0; t < 8; t++)\n"
                   "#pragma unroll\n"
                   "    for (int e = 0; e < 4; e++) {\n"
                   "      const long long m = mw + (e >> 1) * 8 < M ? mw + (e >> 1) * 8 : M - 1;\n"
                   "      const int n = j * 64 + t * 8 + 2 * (lane & 3) + (e & 1);   /* N1 < 2^31 */\n"
                   "      const float fm_a = acc[t][e];\n"
                   "      float fm_h;\n"
                   "      (void)m; (void)n;\n"
                   "      {\n");
  emit_stage1(sb, f, bp, "        ");
  fm_strbuf_printf(sb,
                   "      }\n"
                   "      /* rounded to the operand dtype into a register of its own (writing acc back\n"
                   "         would make ptxas serialise the wgmma that define it) */\n"
                   "      hv[t][e] = %s(fm_h);\n"
                   "    }\n"
                   "#pragma unroll\n"
                   "  for (int kk = 0; kk < 4; kk++) {\n"
                   "    af[kk][0] = fm_pack(hv[2 * kk][0], hv[2 * kk][1]);\n"
                   "    af[kk][1] = fm_pack(hv[2 * kk][2], hv[2 * kk][3]);\n"
                   "    af[kk][2] = fm_pack(hv[2 * kk + 1][0], hv[2 * kk + 1][1]);\n"
                   "    af[kk][3] = fm_pack(hv[2 * kk + 1][2], hv[2 * kk + 1][3]);\n"
                   "  }\n"
                   "}\n",
                   cvt);
}

/* Tensor k (an epilogue input or output) moves 8 elements of a row as 16-byte accesses:
 * contiguous columns, rows 16-byte aligned, 2- or 4-byte elements (n is a multiple of 8). */
static int vector_ok(const b2b_plan *bp, uint32_t k) {
  fm_dtype dt = bp->base.t[k].dtype;
  size_t es = fm_dtype_size(dt);
  if (dt == FM_DT_BOOL || (es != 2 && es != 4)) return 0;
  return bp->es[k][1] == 1 && bp->es[k][0] % (int64_t)(16 / es) == 0 && bp->base.t[k].align >= 16;
}

/* The stage-2 inputs and the outputs as parameters (decl) or arguments of fm_stage2. */
static void emit_stage2_params(fm_strbuf *sb, const fm_fragment *f, const b2b_plan *bp, int decl) {
  const fm_cg_plan *p = &bp->base;
  for (uint32_t k = 0; k < p->n_in; k++) {
    if (!(bp->ci.in_need[k] & 2)) continue;
    if (decl)
      fm_strbuf_printf(sb, ", const %s *__restrict__ in%u", fm_cg_storage_type(f->inputs[k].dtype), k);
    else
      fm_strbuf_printf(sb, ", in%u", k);
  }
  for (uint32_t k = 0; k < p->n_out; k++) {
    if (decl)
      fm_strbuf_printf(sb, ", %s *__restrict__ out%u", fm_cg_storage_type(p->t[p->n_in + k].dtype), k);
    else
      fm_strbuf_printf(sb, ", out%u", k);
  }
}

/* fm_stage2(acc, m, n, ...): stage 2 on the fp32 sums of row m, columns n .. n+7 (n a
 * multiple of 8; N2 is a multiple of 16, so all 8 are inside), each output stored once.
 * The caller has them in that layout (staged through shared memory), so that every input
 * and output moves as whole 16-byte pieces of a row: the accumulator layout gave each
 * thread pairs of columns 8 apart, 2-byte accesses (ncu: a third of the chain kernel's time
 * in its last stage, bench/NOTES.md "The b2b rings"). An x_twin's piece comes from A's row
 * fm_rl (of the block) when fm_xa is set: one 16-byte shared-memory load, where the row lies
 * in A's swizzled slice n / 64. */
static void emit_stage2_fn(fm_strbuf *sb, const fm_fragment *f, const b2b_plan *bp) {
  const fm_cg_plan *p = &bp->base;
  char name[16];
  if (bp->x_twin >= 0)
    fm_strbuf_append(sb,
                     "__device__ __forceinline__ uint4 fm_lds16(unsigned a) {\n"
                     "  uint4 v;\n"
                     "  asm volatile(\"ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\\n\"\n"
                     "               : \"=r\"(v.x), \"=r\"(v.y), \"=r\"(v.z), \"=r\"(v.w) : \"r\"(a) : \"memory\");\n"
                     "  return v;\n"
                     "}\n");
  fm_strbuf_append(sb,
                   "__device__ __forceinline__ void fm_stage2(const float (&acc)[8], const long long m, const int n");
  if (bp->x_twin >= 0) fm_strbuf_append(sb, ", const unsigned fm_xa, const int fm_rl");
  emit_stage2_params(sb, f, bp, 1);
  fm_strbuf_append(sb, ") {\n");
  for (uint32_t k = 0; k < p->n_in; k++) {
    if (!(bp->ci.in_need[k] & 2)) continue;
    const char *st = fm_cg_storage_type(f->inputs[k].dtype);
    size_t es = fm_dtype_size(f->inputs[k].dtype);
    snprintf(name, sizeof name, "in%u", k);
    if (bp->es[k][1] == 0) { /* one value for the whole row piece */
      fm_strbuf_printf(sb, "  const %s r%u = ", st, k);
      emit_at(sb, bp, k, name, "n");
      fm_strbuf_append(sb, ";\n");
    } else if ((int)k == bp->x_twin) { /* one 16-byte piece: from A's rows when fm_xa names them */
      fm_strbuf_printf(
          sb,
          "  __align__(16) %s r%u[8];\n"
          "  if (fm_xa) *(uint4 *)r%u = fm_lds16(FM_SW(fm_xa + (n >> 6) * (FM_BM * 128), fm_rl, (n >> 3) & 7));\n"
          "  else *(uint4 *)r%u = *(const uint4 *)(&",
          st, k, k, k);
      emit_at(sb, bp, k, name, "n");
      fm_strbuf_append(sb, ");\n");
    } else if (vector_ok(bp, k)) {
      fm_strbuf_printf(sb, "  __align__(16) %s r%u[8];\n", st, k);
      for (size_t v = 0; v < es / 2; v++) {
        fm_strbuf_printf(sb, "  ((uint4 *)r%u)[%zu] = *(const uint4 *)(&", k, v);
        emit_at(sb, bp, k, name, "n");
        fm_strbuf_printf(sb, " + %zu);\n", v * 16 / es);
      }
    } else {
      fm_strbuf_printf(sb, "  %s r%u[8];\n#pragma unroll\n  for (int e = 0; e < 8; e++) {\n    const int ne = n + e;\n",
                       st, k);
      fm_strbuf_printf(sb, "    r%u[e] = ", k);
      emit_at(sb, bp, k, name, "ne");
      fm_strbuf_append(sb, ";\n  }\n");
    }
  }
  for (uint32_t k = 0; k < p->n_out; k++)
    fm_strbuf_printf(sb, "  __align__(16) %s o%u[8];\n", fm_cg_storage_type(p->t[p->n_in + k].dtype), k);
  fm_strbuf_append(sb, "#pragma unroll\n  for (int e = 0; e < 8; e++) {\n    const float fm_a = acc[e];\n");
  for (uint32_t k = 0; k < p->n_in; k++) {
    if (!(bp->ci.in_need[k] & 2)) continue;
    emit_input_open(sb, bp, k, "    ");
    fm_strbuf_printf(sb, "r%u%s", k, bp->es[k][1] == 0 ? "" : "[e]");
    emit_input_close(sb, bp, k);
  }
  emit_stage_ops(sb, f, bp, 2, "    ");
  for (uint32_t k = 0; k < p->n_out; k++) {
    uint32_t t = p->n_in + k;
    char v[16];
    snprintf(v, sizeof v, "v%u", p->t[t].value);
    fm_strbuf_printf(sb, "    o%u[e] = ", k);
    fm_cg_emit_encode(sb, p->t[t].dtype, p->vdt[p->t[t].value], v);
    fm_strbuf_append(sb, ";\n");
  }
  fm_strbuf_append(sb, "  }\n");
  for (uint32_t k = 0; k < p->n_out; k++) {
    uint32_t t = p->n_in + k;
    size_t es = fm_dtype_size(p->t[t].dtype);
    snprintf(name, sizeof name, "out%u", k);
    if (vector_ok(bp, t)) {
      for (size_t v = 0; v < es / 2; v++) {
        fm_strbuf_append(sb, "  fm_st16(&");
        emit_at(sb, bp, t, name, "n");
        fm_strbuf_printf(sb, " + %zu", v * 16 / es);
        fm_cg_emit_st16_words(sb, k, es, v);
        fm_strbuf_append(sb, ");\n");
      }
    } else {
      fm_strbuf_append(
          sb, "#pragma unroll\n  for (int e = 0; e < 8; e++) {\n    const int ne = n + e;\n    (void)ne;\n    ");
      emit_at(sb, bp, t, name, "ne");
      fm_strbuf_printf(sb, " = o%u[e];\n  }\n", k);
    }
  }
  fm_strbuf_append(sb, "}\n");
}

/* fm_stage2_staged(acc2, ...): the end of a consumer warpgroup. Once every product of the
 * block is done (a barrier of the consumers: the other warpgroup may still read the buffers),
 * its 64 rows of sums go through shared memory, FM_PCOLS columns a pass (FM_PASSES passes:
 * the buffers hold BM x (FM_PCOLS + 8) floats), so that each thread then holds 8 consecutive
 * columns of a row for fm_stage2. The padding of 8 floats a row spreads the accumulator
 * layout's rows over the banks. With an x_twin the staging starts after A's rows, and fm_xa
 * (A's rows, or 0 where the launch passed another memory) goes to fm_stage2. */
static void emit_stage2_staged(fm_strbuf *sb, const fm_fragment *f, const b2b_plan *bp) {
  fm_strbuf_append(sb, "#define FM_STAGE2_ARGS ");
  emit_stage2_params(sb, f, bp, 0);
  fm_strbuf_append(sb, "\n");
  const int twin = bp->x_twin >= 0; /* it reads A's rows: the staging goes after them */
  fm_strbuf_append(
      sb,
      "__device__ __forceinline__ void fm_stage2_staged(const float (&acc2)[FM_N2 / 8][4], const long long M,\n"
      "    const long long m0, const int wg, const int wr, const int lane");
  if (twin) fm_strbuf_append(sb, ", const unsigned fm_xa");
  emit_stage2_params(sb, f, bp, 1);
  fm_strbuf_printf(
      sb,
      ") {\n"
      "  asm volatile(\"bar.sync 3, %%0;\\n\" :: \"n\"(FM_MMA_THREADS) : \"memory\");\n"
      "  float *const stg = (float *)((char *)fm_smem + (fm_stage_base()%s - fm_saddr(fm_smem))) + wg * 64 * FM_SROW;\n",
      twin ? " + FM_X_BYTES" : "");
  fm_strbuf_append(
      sb,
      "  const int wt = wr * 32 + lane;\n"
      "#pragma unroll\n"
      "  for (int pass = 0; pass < FM_PASSES; pass++) {\n"
      "    if (pass) asm volatile(\"bar.sync %0, 128;\\n\" :: \"r\"(4 + wg) : \"memory\");\n"
      "#pragma unroll\n"
      "    for (int t = pass * (FM_PCOLS / 8); t < (pass + 1) * (FM_PCOLS / 8); t++) {\n"
      "      const int r = wr * 16 + (lane >> 2), c = t * 8 - pass * FM_PCOLS + 2 * (lane & 3);\n"
      "      *(float2 *)&stg[r * FM_SROW + FM_SPOS(c)] = make_float2(acc2[t][0], acc2[t][1]);\n"
      "      *(float2 *)&stg[(r + 8) * FM_SROW + FM_SPOS(c)] = make_float2(acc2[t][2], acc2[t][3]);\n"
      "    }\n"
      "    asm volatile(\"bar.sync %0, 128;\\n\" :: \"r\"(4 + wg) : \"memory\");\n"
      "    /* unrolled whole (16 trips at N2 = 256), so that every input's loads are in flight at once */\n"
      "#pragma unroll\n"
      "    for (int g = wt; g < 64 * (FM_PCOLS / 8); g += 128) {\n"
      "      const int r = g / (FM_PCOLS / 8), c = g % (FM_PCOLS / 8) * 8;\n"
      "      const long long m = m0 + wg * 64 + r;\n"
      "      if (m >= M) continue;\n"
      "      float v[8];\n"
      "      *(float4 *)&v[0] = *(const float4 *)&stg[r * FM_SROW + FM_SPOS(c)];\n"
      "      *(float4 *)&v[4] = *(const float4 *)&stg[r * FM_SROW + FM_SPOS(c + 4)];\n"
      "      fm_stage2(v, m, pass * FM_PCOLS + c");
  fm_strbuf_append(sb, twin ? ", fm_xa, wg * 64 + r" : "");
  fm_strbuf_append(sb,
                   " FM_STAGE2_ARGS);\n"
                   "    }\n"
                   "  }\n"
                   "}\n");
}

static void emit_kernel(fm_strbuf *sb, const fm_fragment *f, const b2b_plan *bp, const fm_b2b_config *cfg,
                        const char *entry) {
  const fm_cg_plan *p = &bp->base;
  fm_strbuf_printf(sb, "#define FM_B in%u\n#define FM_B2 in%u\n#define FM_STAGE1_ARGS ", bp->ib, bp->ib2);
  emit_stage1_params(sb, f, bp, 0);
  fm_strbuf_printf(sb, "\nextern \"C\" __global__ void %s__launch_bounds__(FM_THREADS, 1) %s(\n",
                   cfg->form == FM_B2B_TMA_PAIR ? "__cluster_dims__(2, 1, 1) " : "", entry);
  for (uint32_t k = 0; k < p->n_in; k++)
    fm_strbuf_printf(sb, "    const %s *__restrict__ in%u,\n", fm_cg_storage_type(f->inputs[k].dtype), k);
  for (uint32_t k = 0; k < p->n_out; k++)
    fm_strbuf_printf(sb, "    %s *__restrict__ out%u,\n", fm_cg_storage_type(p->t[p->n_in + k].dtype), k);
  if (cfg->form != FM_B2B_CPASYNC)
    fm_strbuf_append(sb,
                     "    long long outer, const __grid_constant__ fm_tmap fm_tmx,\n"
                     "    const __grid_constant__ fm_tmap fm_tmw1, const __grid_constant__ fm_tmap fm_tmw2) {\n");
  else
    fm_strbuf_append(sb, "    long long outer) {\n");
  if (bp->m < 0)
    fm_strbuf_append(sb, "  const long long M = outer;\n");
  else
    fm_strbuf_printf(sb, "  const long long M = %" PRId64 "LL;\n  (void)outer;\n", bp->m);
  if (cfg->form != FM_B2B_CPASYNC) {
    fm_strbuf_append(
        sb,
        "  const int tid = threadIdx.x, lane = tid & 31, wr = (tid >> 5) & 3;\n"
        "  /* warp-uniform through a shuffle, else ptxas serialises the wgmma */\n"
        "  const int wg = __shfl_sync(0xffffffffu, tid >> 7, 0);\n"
        "#if FM_CLUSTER == 2\n"
        "  /* grid (2, row-tile pairs): a block past M still runs (its partner needs its half\n"
        "     of the weights); TMA reads it zeros and nothing is stored */\n"
        "  const long long m0 = ((long long)blockIdx.y * 2 + blockIdx.x) * FM_BM;\n"
        "#else\n"
        "  const long long m0 = (long long)blockIdx.y * FM_BM;\n"
        "#endif\n"
        "  /* A's rows, the two rings (1024-byte aligned for the swizzle), the mbarriers: A's,\n"
        "     then full and empty of B's ring, then of B2's */\n"
        "  const unsigned xs = (fm_saddr(fm_smem) + 1023u) & ~1023u, w1s = xs + FM_X_BYTES;\n"
        "  const unsigned w2s = w1s + FM_S1 * FM_W1_BYTES, bars = w2s + FM_S2 * FM_W2_BYTES;\n"
        "  const unsigned full1 = bars + 8 * (FM_K1 / 64), empty1 = full1 + 8 * FM_S1;\n"
        "  const unsigned full2 = empty1 + 8 * FM_S1, empty2 = full2 + 8 * FM_S2;\n"
        "  if (tid == 0) {\n"
        "    for (int kt = 0; kt < FM_K1 / 64; kt++) fm_mbar_init(bars + 8 * kt, 1);   /* A's slices */\n"
        "    for (int s = 0; s < FM_S1 + FM_S2; s++) {\n"
        "      const unsigned full = s < FM_S1 ? full1 + 8 * s : full2 + 8 * (s - FM_S1);\n"
        "      fm_mbar_init(full, 1);\n"
        "      fm_mbar_init(full + 8 * (s < FM_S1 ? FM_S1 : FM_S2), FM_MMA_THREADS / 128 * FM_CLUSTER);\n"
        "    }\n"
        "    /* the barriers are completed by the async proxy (TMA's complete_tx) */\n"
        "    asm volatile(\"fence.mbarrier_init.release.cluster;\\n\" ::: \"memory\");\n"
        "  }\n"
        "#if FM_CLUSTER == 2\n"
        "  fm_cluster_sync();   /* neither block fills or signals the other before both initialised */\n"
        "#else\n"
        "  __syncthreads();\n"
        "#endif\n"
        "  if (tid >= FM_MMA_THREADS) {   /* the loader warpgroup: one thread issues every box */\n"
        "#if FM_MMA_THREADS == 256\n"
        "    asm volatile(\"setmaxnreg.dec.sync.aligned.u32 24;\\n\" ::: \"memory\");\n"
        "#endif\n"
        "    if (tid == FM_MMA_THREADS) fm_loader(&fm_tmx, &fm_tmw1, &fm_tmw2, xs, w1s, w2s, bars, (int)m0);\n"
        "#if FM_CLUSTER == 2\n"
        "    __syncwarp();\n"
        "    fm_cluster_sync();\n"
        "#endif\n"
        "    return;\n"
        "  }\n"
        "#if FM_MMA_THREADS == 256\n"
        "  asm volatile(\"setmaxnreg.inc.sync.aligned.u32 240;\\n\" ::: \"memory\");\n"
        "#endif\n"
        "  float acc2[FM_N2 / 8][4];\n"
        "  /* this thread's rows of the accumulators: mw and mw + 8 */\n"
        "  const long long mw = m0 + wg * 64 + wr * 16 + (lane >> 2);\n"
        "  const unsigned long long da = fm_desc(xs + wg * 64 * 128);\n"
        "  unsigned af[4][4];\n"
        "  float acc1[8][4];\n"
        "  fm_mbar_wait(full1, 0);\n"
        "  fm_gemm1(acc1, da, w1s, bars);   /* each slice of A's rows waited for */\n"
        "  fm_wg_wait<0>();\n"
        "  if (tid % 128 == 0) fm_release_by_thread(empty1);\n"
        "  if (wg == 1) FM_TURN_PASS(0);   /* warpgroup 0 takes the first turn */\n"
        "  for (int j = 0; j < FM_CHUNKS; j++) {\n");
    fm_strbuf_append(sb, fm_cg_b2b_step_tma);
    fm_strbuf_append(sb, "  }\n");
  } else {
    fm_strbuf_printf(sb,
                     "  const int tid = threadIdx.x, lane = tid & 31, wr = (tid >> 5) & 3;\n"
                     "  /* warp-uniform through a shuffle, else ptxas serialises the wgmma */\n"
                     "  const int wg = __shfl_sync(0xffffffffu, tid >> 7, 0);\n"
                     "  const long long m0 = (long long)blockIdx.y * FM_BM;\n"
                     "  /* A's rows, B's two chunk buffers, B2's two (1024-byte aligned for the swizzle) */\n"
                     "  const unsigned xs = (fm_saddr(fm_smem) + 1023u) & ~1023u, w1s = xs + FM_X_BYTES;\n"
                     "  const unsigned w2s = w1s + 2 * FM_W1_BYTES;\n"
                     "  fm_load_a(xs, in%u, M, m0, tid);\n"
                     "  fm_load_w1(w1s, FM_B, 0, tid);\n"
                     "  fm_cp_commit();\n",
                     bp->ia);
    fm_strbuf_append(sb,
                     "  fm_load_w2(w2s, FM_B2, 0, tid);\n"
                     "  fm_cp_commit();\n"
                     "  float acc2[FM_N2 / 8][4];\n"
                     "  /* this thread's rows of the accumulators: mw and mw + 8 */\n"
                     "  const long long mw = m0 + wg * 64 + wr * 16 + (lane >> 2);\n"
                     "  const unsigned long long da = fm_desc(xs + wg * 64 * 128);\n"
                     "  unsigned af[4][4];\n");
    fm_strbuf_append(sb, "  float acc1[8][4];\n  for (int j = 0; j < FM_CHUNKS; j++) {\n");
    fm_strbuf_append(sb, fm_cg_b2b_step_cpasync);
    fm_strbuf_append(sb, "  }\n");
  }
  if (bp->x_twin >= 0) /* one memory through two parameters: read it from A's rows */
    fm_strbuf_printf(sb,
                     "  fm_stage2_staged(acc2, M, m0, wg, wr, lane, (const void *)in%d == (const void *)in%u ? xs : 0u"
                     " FM_STAGE2_ARGS);\n",
                     bp->x_twin, bp->ia);
  else
    fm_strbuf_append(sb, "  fm_stage2_staged(acc2, M, m0, wg, wr, lane FM_STAGE2_ARGS);\n");
  if (cfg->form == FM_B2B_TMA_PAIR)
    fm_strbuf_append(sb, "  fm_cluster_sync();   /* the partner may still arrive on our barriers */\n");
  fm_strbuf_append(sb, "}\n");
}

int fm_codegen_b2b(const fm_fragment *canon, const fm_b2b_config *cfg, uint32_t sm_count, char **src,
                   fm_kernel_meta *meta, fm_diag *d) {
  b2b_plan *bp = NULL;
  fm_strbuf sb;
  int rc;
  (void)sm_count; /* one block per BM rows: the grid needs no device size */
  if (src) *src = NULL;
  if (!canon || !cfg || !src || !meta) return fm_diag_set(d, FM_EINVAL, "codegen: NULL argument");
  fm_strbuf_init(&sb, MAX_SOURCE);
  bp = malloc(sizeof *bp);
  if (!bp) {
    rc = fm_diag_set(d, FM_ENOMEM, "codegen: out of memory");
    goto out;
  }
  if ((rc = plan_build(canon, bp, d)) || (rc = check_config(bp, cfg, d))) goto out;
  char entry[FM_META_ENTRY_MAX];
  snprintf(entry, sizeof entry, "fm_b2b_%u%s", cfg->bm,
           cfg->form == FM_B2B_TMA_PAIR ? "_tma_c2"
           : cfg->form == FM_B2B_TMA    ? "_tma"
                                        : "");
  const char *ty = bp->dt == FM_DT_BF16 ? "bf16" : "f16";
  fm_strbuf_printf(&sb, "/* fusemld b2b kernel: %s, chained GEMMs %" PRId64 " -> %" PRId64 " -> %" PRId64 ", %s */\n",
                   entry, bp->k1, bp->n1, bp->n2, ty);
  fm_cg_emit_prelude(&sb, fm_cg_fast_math(canon));
  fm_strbuf_printf(&sb,
                   "#define FM_BM %u\n#define FM_K1 %" PRId64 "\n#define FM_N1 %" PRId64
                   "\n"
                   "#define FM_N2 %" PRId64 "\n#define FM_LDA %" PRId64 "LL\n#define FM_LDB %" PRId64
                   "LL\n"
                   "#define FM_LDB2 %" PRId64 "LL\n",
                   cfg->bm, bp->k1, bp->n1, bp->n2, bp->lda, bp->ldb, bp->ldb2);
  fm_strbuf_printf(&sb, "#define FM_WS %d\n#define FM_CLUSTER %d\n", cfg->form != FM_B2B_CPASYNC,
                   cfg->form == FM_B2B_TMA_PAIR ? 2 : 1);
  if (cfg->form != FM_B2B_CPASYNC) {
    tma_rings r = tma_rings_for(bp, cfg->bm);
    fm_strbuf_printf(&sb, "#define FM_S1 %u\n#define FM_S2 %u\n", r.s1, r.s2);
  }
  uint32_t passes = stage2_passes(bp, cfg);
  /* a staged row: the first halves (columns 8q .. 8q+3) of its 8-column groups, 4 floats of
     padding, the second halves, 4 more: a thread reading its group's two halves as float4 then
     meets no other lane of its 8 on a bank (whole groups in a row put lanes i and i + 4 on the
     same banks: ncu, two-way conflicts), and the accumulator layout's float2 writes neither */
  fm_strbuf_printf(&sb,
                   "#define FM_PASSES %u\n#define FM_PCOLS %u\n#define FM_SROW (FM_PCOLS + 8)\n"
                   "#define FM_SPOS(c) (((c) & 4) * (FM_PCOLS / 8 + 1) + ((c) >> 3) * 4 + ((c) & 3))\n",
                   passes, (uint32_t)bp->n2 / passes);
  fm_strbuf_append(&sb, fm_cg_gemm_cp_async); /* fm_saddr, fm_cp16, fm_cp_commit, fm_cp_wait */
  fm_strbuf_append(&sb, fm_cg_b2b_body);
  fm_strbuf_append(&sb, fm_cg_wgmma_ops);
  if (cfg->form != FM_B2B_CPASYNC) {
    fm_strbuf_append(&sb, fm_cg_sm90);
    fm_strbuf_append(&sb, fm_cg_b2b_tma);
  }
  emit_wgmma(&sb, "fm_wgmma1", ty, CHUNK, 0);
  emit_wgmma(&sb, "fm_wgmma2", ty, (uint32_t)bp->n2, 1);
  fm_strbuf_append(&sb, fm_cg_b2b_products);
  emit_stage1_fn(&sb, canon, bp);
  fm_strbuf_append(&sb, fm_cg_st16);
  emit_stage2_fn(&sb, canon, bp);
  emit_stage2_staged(&sb, canon, bp);
  emit_kernel(&sb, canon, bp, cfg, entry);
  if ((rc = fm_strbuf_error(&sb))) {
    rc = fm_diag_set(d, rc, "codegen: the kernel source exceeds %u bytes", MAX_SOURCE);
    goto out;
  }
  memset(meta, 0, sizeof *meta);
  snprintf(meta->kind, sizeof meta->kind, "gemm");
  snprintf(meta->entry, sizeof meta->entry, "%s", entry);
  meta->block[0] = cfg->bm / 64 * 128 + (cfg->form != FM_B2B_CPASYNC ? 128u : 0u);
  meta->block[1] = meta->block[2] = 1;
  meta->smem = smem_bytes(bp, cfg);
  snprintf(meta->grid_rule, sizeof meta->grid_rule, "tiles");
  meta->inner = (uint64_t)bp->n2;
  meta->items_per_block = cfg->bm;
  meta->max_blocks = 1; /* one column tile: a block owns whole output rows */
  meta->outer = bp->m;
  meta->n_inputs = canon->n_inputs;
  meta->n_outputs = canon->n_outputs;
  if (cfg->form == FM_B2B_TMA_PAIR) {
    /* grid (2, row-tile pairs): x is the rank of a block in its cluster */
    meta->items_per_block = 2u * cfg->bm;
    meta->max_blocks = 2;
  }
  if (cfg->form != FM_B2B_CPASYNC) {
    /* A as [M, K1] in boxes of BM rows, B as [N1, K1] rows in boxes of 64, B2 as [N2, N1]
       rows in one box of N2; 64 columns a box (one swizzle row). A leading dim of 0 (a
       single row, never stepped) becomes the row length: TMA wants a real stride. */
    const char *dt = bp->dt == FM_DT_BF16 ? "bf16" : "f16";
    const struct {
      uint32_t input;
      int64_t rows;
      int64_t cols, ld;
      uint32_t box_rows;
    } maps[3] = {
        {bp->ia, bp->m, bp->k1, bp->lda ? bp->lda : bp->k1, cfg->bm},
        {bp->ib, bp->n1, bp->k1, bp->ldb ? bp->ldb : bp->k1, cfg->form == FM_B2B_TMA_PAIR ? CHUNK / 2 : CHUNK},
        {bp->ib2, bp->n2, bp->n1, bp->ldb2 ? bp->ldb2 : bp->n1,
         (uint32_t)bp->n2 / (cfg->form == FM_B2B_TMA_PAIR ? 2u : 1u)},
    };
    meta->n_tmaps = 3;
    for (int i = 0; i < 3; i++) {
      fm_meta_tmap *t = &meta->tmaps[i];
      t->input = maps[i].input;
      t->elem_bytes = 2;
      snprintf(t->dtype, sizeof t->dtype, "%s", dt);
      t->rows = maps[i].rows;
      t->cols = (uint64_t)maps[i].cols;
      t->ld = (uint64_t)maps[i].ld;
      t->box[0] = 64;
      t->box[1] = maps[i].box_rows;
    }
  }
  *src = fm_strbuf_take(&sb);
  if (!*src) rc = fm_diag_set(d, FM_ENOMEM, "codegen: out of memory");
out:
  fm_strbuf_free(&sb);
  free(bp);
  return rc;
}
