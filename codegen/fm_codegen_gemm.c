/* fm_codegen_gemm.c: the gemm template: a GEMM fragment (one mm/addmm whose A and B are
 * inputs, fm_fragment.h) -> a kernel = the fixed mainloop (fm_codegen_gemm_body.c) + a
 * generated epilogue that runs the fragment's pointwise ops on each fp32 accumulator and
 * stores every output once. Values are named by position (inputs, then ops), never by the
 * client's ids. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fm_codegen_gemm.h"

#define MAX_SOURCE (1u << 20)
/* The portable cap: an sm_80 block may opt in to 163 KiB (sm_90: 227 KiB). The tuner runs
 * on one device, but the candidate list must not depend on which. */
#define MAX_SMEM (163u * 1024u)
#define DEFAULT_SMS 132u
/* The wgmma mainloop runs on sm_90a only, which has 227 KiB per block. */
#define MAX_SMEM_SM90 (227u * 1024u)

/* The candidate configurations, the default's choices first. Shared memory below is for
 * the nn.Linear layouts (both operands K-major: stages x (BM + BN) x (BK + 8) x 2 bytes).
 * Measured on an H100 (bench/NOTES.md, "GEMM template, second pass"): BK 64 is the lever
 * that counts; 128x128x64 with 3 stages and 8 warps of 64x32 was the fastest from 256 to
 * 8192 rows, the 16-row tiles at M <= 16. */
static const fm_gemm_config configs[] = {
    /* 8 warps of 64x32: the large-GEMM default (108 KiB) */
    {.bm = 128, .bn = 128, .bk = 64, .stages = 3, .wm = 2, .wn = 4, .raster = 8},
    /* 4 warps of 32x32: more blocks for small grids (72 KiB) */
    {.bm = 64, .bn = 64, .bk = 64, .stages = 4, .wm = 2, .wn = 2},
    /* 4 warps of 16x16, long K steps: decode, M <= 16 (85 KiB) */
    {.bm = 16, .bn = 64, .bk = 128, .stages = 4, .wm = 1, .wn = 4},
    {.bm = 128, .bn = 128, .bk = 32, .stages = 3, .wm = 2, .wn = 4},   /* the first pass's default (60 KiB) */
    {.bm = 128, .bn = 256, .bk = 32, .stages = 3, .wm = 2, .wn = 4},   /* 8 warps of 64x64 (90 KiB) */
    {.bm = 128, .bn = 64, .bk = 32, .stages = 4, .wm = 2, .wn = 2},   /* 4 warps of 64x32 (60 KiB) */
    {.bm = 64, .bn = 128, .bk = 32, .stages = 4, .wm = 2, .wn = 2},   /* 4 warps of 32x64 (60 KiB) */
    /* deeper pipelines and BK 64 for Hopper's latency, grouped rasterisation for L2 */
    {.bm = 128, .bn = 256, .bk = 32, .stages = 4, .wm = 2, .wn = 4, .raster = 8},   /* (120 KiB) */
    {.bm = 128, .bn = 256, .bk = 64, .stages = 2, .wm = 2, .wn = 4, .raster = 8},   /* (108 KiB) */
    {.bm = 256, .bn = 128, .bk = 32, .stages = 4, .wm = 4, .wn = 2, .raster = 8},   /* 8 warps of 64x64 (120 KiB) */
    {.bm = 256, .bn = 128, .bk = 64, .stages = 2, .wm = 4, .wn = 2, .raster = 8},   /* (108 KiB) */
    {.bm = 128, .bn = 128, .bk = 32, .stages = 4, .wm = 2, .wn = 4, .raster = 8},   /* (80 KiB) */
    {.bm = 128, .bn = 128, .bk = 64, .stages = 4, .wm = 2, .wn = 2, .raster = 8},   /* 4 warps of 64x64 (144 KiB) */
    /* skinny and small grids: more, smaller blocks keep every SM busy */
    {.bm = 64, .bn = 128, .bk = 64, .stages = 4, .wm = 2, .wn = 2},   /* (108 KiB) */
    {.bm = 128, .bn = 64, .bk = 64, .stages = 4, .wm = 2, .wn = 2},   /* (108 KiB) */
    {.bm = 32, .bn = 128, .bk = 64, .stages = 4, .wm = 1, .wn = 4},   /* 4 warps of 32x32: M <= 32 (90 KiB) */
};
#define N_CONFIGS (sizeof configs / sizeof configs[0])

/* The Hopper (sm_90a) wgmma configurations: warpgroups of 64 rows (wm = BM / 16 warps),
 * BK 64 (one 128-byte swizzle row), stage bytes (BM + BN) x 128. Listed before the mma.sync
 * ones so a capped candidate list keeps them; the daemon drops them on other GPUs
 * (fm_candidate_runs_on). Measured on an H100 (bench/NOTES.md, "TMA mainloop"): the TMA
 * forms are the fastest at every shape measured (the 128x256 one from 2048 rows up, 128x128
 * with 6 stages where there are fewer tiles than SMs); the cp.async forms below them
 * (bench/NOTES.md, "wgmma mainloop") stay for the tuner to compare and as a fallback should
 * a tensor map be refused. */
static const fm_gemm_config wgmma_configs[] = {
    /* TMA loads (one thread issues a box per operand and k-tile) + 2 consumer warpgroups
       (193 KiB) */
    {.bm = 128, .bn = 256, .bk = 64, .stages = 4, .wm = 8, .wn = 1, .raster = 8, .wgmma = FM_GEMM_WGMMA_TMA},
    /* taller raster groups: 3-5% at 16384 x 16384 and 4096 x 11008 */
    {.bm = 128, .bn = 256, .bk = 64, .stages = 4, .wm = 8, .wn = 1, .raster = 16, .wgmma = FM_GEMM_WGMMA_TMA},
    /* A cluster of two blocks sharing B (each loads half of B's box into both by multicast):
       0.6-0.7x of the same tile until its stage releases stopped fencing at cluster scope;
       since, at parity: 1.13x faster than it at 16384 x 16384 x 4096 in one run and 1% slower
       in another, even at 8192^3, 0.85-0.95x at 4096^3, the tuner's pick for 16384 x 256 x
       1024 + residual (bench/NOTES.md, "Cluster pairs, released"). It took the place of
       128x192 with 5 stages, the fastest at no shape measured. (193 KiB a block) */
    {.bm = 128, .bn = 256, .bk = 64, .stages = 4, .wm = 8, .wn = 1, .raster = 8, .wgmma = FM_GEMM_WGMMA_TMA,
     .cluster = 2},
    /* (193 KiB) */
    {.bm = 128, .bn = 128, .bk = 64, .stages = 6, .wm = 8, .wn = 1, .raster = 8, .wgmma = FM_GEMM_WGMMA_TMA},
    /* 97 KiB: two blocks per SM, one's epilogue under the other's loads */
    {.bm = 128, .bn = 128, .bk = 64, .stages = 3, .wm = 8, .wn = 1, .raster = 8, .wgmma = FM_GEMM_WGMMA_TMA},
    /* The persistent form: one block per SM walks its tiles while the loader fills the next
       tile's stages during the epilogue; the slabs sit beside the stages, so fewer stages or
       narrower slabs (more epilogue passes) than above. */
    /* 4 stages + 32-column slabs (213 KiB), in place of 3 stages + 128-column slabs: the
       fastest at 8192^3 in the last run (1.00x of cuBLASLt's plain GEMM); at 16384 x 16384 x
       4096 8% faster than the TMA form in one run, 2% slower in another */
    {.bm = 128, .bn = 256, .bk = 64, .stages = 4, .wm = 8, .wn = 1, .raster = 8, .wgmma = FM_GEMM_WGMMA_PERSISTENT},
    /* 4 stages + 96-column slabs (213 KiB) */
    {.bm = 128, .bn = 192, .bk = 64, .stages = 4, .wm = 8, .wn = 1, .raster = 8, .wgmma = FM_GEMM_WGMMA_PERSISTENT},
    /* 5 stages + 64-column slabs (197 KiB) */
    {.bm = 128, .bn = 128, .bk = 64, .stages = 5, .wm = 8, .wn = 1, .raster = 8, .wgmma = FM_GEMM_WGMMA_PERSISTENT},
    /* Ping-pong: two consumer warpgroups, each a whole tile, take turns, so one's epilogue
       runs under the other's multiplies. Measured on an H100 (bench/NOTES.md, "Persistent
       and ping-pong"): the fastest at M=16384, N=1024, K=256 (0.035 against 0.039-0.040 ms). */
    /* 4 stages + 128-column slabs (194 KiB) */
    {.bm = 128, .bn = 128, .bk = 64, .stages = 4, .wm = 4, .wn = 1, .raster = 8, .wgmma = FM_GEMM_WGMMA_PINGPONG},
    /* 5 stages + 64-column slabs (197 KiB) */
    {.bm = 128, .bn = 128, .bk = 64, .stages = 5, .wm = 4, .wn = 1, .raster = 8, .wgmma = FM_GEMM_WGMMA_PINGPONG},
    /* 4 stages + 64-column slabs (197 KiB) */
    {.bm = 64, .bn = 256, .bk = 64, .stages = 4, .wm = 4, .wn = 1, .raster = 8, .wgmma = FM_GEMM_WGMMA_PINGPONG},
    /* 2 warpgroups, 1 batch in flight: fastest from 2048 rows up (193 KiB) */
    {.bm = 128, .bn = 256, .bk = 64, .stages = 4, .wm = 8, .wn = 1, .raster = 8, .wgmma = FM_GEMM_WGMMA_INFLIGHT},
    /* + a loader warpgroup: no block barrier per k-tile (193 KiB) */
    {.bm = 128, .bn = 256, .bk = 64, .stages = 4, .wm = 8, .wn = 1, .raster = 8, .wgmma = FM_GEMM_WGMMA_WS},
    /* deeper pipeline, 64 accumulators per thread (193 KiB) */
    {.bm = 128, .bn = 128, .bk = 64, .stages = 6, .wm = 8, .wn = 1, .raster = 8, .wgmma = FM_GEMM_WGMMA_INFLIGHT},
    /* 97 KiB: two blocks per SM overlap each other's waits */
    {.bm = 128, .bn = 128, .bk = 64, .stages = 3, .wm = 8, .wn = 1, .raster = 8, .wgmma = FM_GEMM_WGMMA_INFLIGHT},
    /* 1 warpgroup: more blocks for small grids (97 KiB) */
    {.bm = 64, .bn = 128, .bk = 64, .stages = 4, .wm = 4, .wn = 1, .wgmma = FM_GEMM_WGMMA_INFLIGHT},
    /* Several row tiles per block (rtiles, the next tile loading during this one's
       epilogue) are supported but offered nowhere: every such config lost to these at
       every shape measured (bench/NOTES.md, "Short-K GEMMs: the epilogue made free"). */
};
#define N_WGMMA (sizeof wgmma_configs / sizeof wgmma_configs[0])

static const fm_gemm_mainloop mainloops[FM_GEMM_MODES] = {
    [FM_GEMM_MMA_SYNC] = {.describe = "", .suffix = "", .min_stages = 2, .consumers = 1, .siblings = 1},
    [FM_GEMM_WGMMA] = {.describe = " wgmma", .suffix = "_wgmma", .wgmma = 1, .min_stages = 2, .consumers = 1,
                       .row_tiles = 1},
    [FM_GEMM_WGMMA_INFLIGHT] = {.describe = " wgmma inflight=1", .suffix = "_wgmma_i1", .wgmma = 1, .inflight = 1,
                                .min_stages = 3, .consumers = 1, .row_tiles = 1},
    [FM_GEMM_WGMMA_WS] = {.describe = " wgmma ws", .suffix = "_wgmma_ws", .wgmma = 1, .inflight = 1,
                          .min_stages = 2, .specialized = 1, .loader_threads = 128, .consumers = 1},
    [FM_GEMM_WGMMA_TMA] = {.describe = " wgmma tma", .suffix = "_wgmma_tma", .wgmma = 1, .inflight = 1,
                           .min_stages = 2, .specialized = 1, .loader_threads = 32, .tma = 1, .consumers = 1,
                           .cluster_pair = 1, .siblings = 1},
    [FM_GEMM_WGMMA_PERSISTENT] = {.describe = " wgmma tma persistent", .suffix = "_wgmma_tmap", .wgmma = 1,
                                  .inflight = 1, .min_stages = 2, .specialized = 1, .loader_threads = 32, .tma = 1,
                                  .persistent = 1, .consumers = 1, .cluster_pair = 1, .siblings = 1},
    [FM_GEMM_WGMMA_PINGPONG] = {.describe = " wgmma tma pingpong", .suffix = "_wgmma_pp", .wgmma = 1,
                                .inflight = 1, .min_stages = 2, .specialized = 1, .loader_threads = 32, .tma = 1,
                                .persistent = 1, .pingpong = 1, .consumers = 2, .siblings = 1},
};

const fm_gemm_mainloop *fm_cg_gemm_mainloop(uint32_t mode) { return mode < FM_GEMM_MODES ? &mainloops[mode] : NULL; }

/* The mainloop of a config check_config accepted (its mode is in the table). */
static const fm_gemm_mainloop *mainloop_of(const fm_gemm_config *c) { return &mainloops[c->wgmma]; }

int fm_cg_value_position(const fm_fragment *f, uint32_t limit, uint32_t id) {
  for (uint32_t k = limit; k-- > 0;) {
    uint32_t have = k < f->n_inputs ? f->inputs[k].id : f->ops[k - f->n_inputs].out;
    if (have == id) return (int)k;
  }
  return -1;
}

int fm_cg_gemm_values(const fm_fragment *f, int op1, int op2, const char *who, fm_cg_plan *p, fm_diag *d) {
  p->n_in = f->n_inputs;
  p->n_out = f->n_outputs;
  p->n_ops = f->n_ops;
  for (uint32_t k = 0; k < p->n_in; k++) p->vdt[k] = f->inputs[k].dtype;
  for (uint32_t i = 0; i < p->n_ops; i++) {
    const fm_opnode *op = &f->ops[i];
    fm_opkind kind = fm_op_kind(op->op);
    if ((unsigned)op->op >= FM_OP__COUNT || kind == FM_OPK_RESERVED || kind == FM_OPK_COMPOSITE ||
        kind == FM_OPK_REDUCE || (kind == FM_OPK_MATMUL && (int)i != op1 && (int)i != op2))
      return fm_diag_set(d, FM_EUNSUPPORTED, "ops[%u]: the %s cannot run '%s'", i, who, fm_op_name(op->op));
    if (op->nargs > 3 || fm_op_arity(op->op) != (int)op->nargs)
      return fm_diag_set(d, FM_EINVAL, "ops[%u]: wrong number of args", i);
    for (uint32_t a = 0; a < op->nargs; a++) {
      int pos = fm_cg_value_position(f, p->n_in + i, op->args[a]);
      if (pos < 0) return fm_diag_set(d, FM_EINVAL, "ops[%u].args[%u]: undefined value", i, a);
      p->args[i][a] = (uint16_t)pos;
    }
    p->vdt[p->n_in + i] = op->dtype;
    p->live[p->n_in + i] = 1;
  }
  return FM_OK;
}

/* One operand's layout: K-major when the K dim has stride 1 (a size-1 dim counts as
 * contiguous), else the other dim must; its stride (the leading dim) then steps by 16-byte
 * chunks, and so must the base. */
static int operand(const fm_tensor *t, uint32_t kdim, char name, int strict, int *kmajor, int64_t *ld,
                   fm_diag *d) {
  uint32_t odim = 1 - kdim;
  int k_unit = t->shape[kdim] == 1 || t->strides[kdim] == 1;
  int o_unit = t->shape[odim] == 1 || t->strides[odim] == 1;
  if (!k_unit && !o_unit)
    return fm_diag_set(d, FM_EUNSUPPORTED, "%c is neither row- nor column-major", name);
  *kmajor = k_unit;
  *ld = k_unit ? t->strides[odim] : t->strides[kdim];
  if (t->shape[*kmajor ? odim : kdim] == 1) *ld = 0;   /* never stepped */
  if (!strict) return FM_OK;
  if (*ld % 8)
    return fm_diag_set(d, FM_EUNSUPPORTED,
                       "%c's leading dimension %" PRId64 " is not a multiple of 8 (16-byte chunks)",
                       name, *ld);
  if (t->align < 16)
    return fm_diag_set(d, FM_EUNSUPPORTED, "%c is only %u-byte aligned; the gemm template needs 16",
                       name, t->align);
  return FM_OK;
}

/* strict: the generated templates' limits (K a multiple of 8, 16-byte chunks of A and B);
 * cuBLASLt's plans take any K, leading dim and alignment. */
static int plan_build(const fm_fragment *f, fm_cg_gemm_plan *gp, int strict, fm_diag *d) {
  fm_cg_plan *p = &gp->base;
  memset(gp, 0, sizeof *gp);
  if (f->n_inputs > FM_MAX_INPUTS || f->n_ops > FM_MAX_OPS || f->n_outputs > FM_MAX_OUTPUTS ||
      f->n_outputs == 0)
    return fm_diag_set(d, FM_EINVAL, "fragment exceeds the limits");
  gp->op = fm_fragment_gemm_op(f);
  gp->op2 = fm_fragment_gemm_op2(f);
  if (gp->op < 0) return fm_diag_set(d, FM_EUNSUPPORTED, "not a GEMM fragment (no mm or addmm)");
  if (fm_fragment_is_chain(f))   /* fm_codegen_b2b.c keeps the intermediate on chip */
    return fm_diag_set(d, FM_EUNSUPPORTED, "a chain of two products: only the b2b template serves it");
  int rc = fm_cg_gemm_values(f, gp->op, gp->op2, "gemm epilogue", p, d);
  if (rc) return rc;
  const fm_opnode *mm = &f->ops[gp->op];
  gp->ia = p->args[gp->op][mm->nargs - 2];
  gp->ib = p->args[gp->op][mm->nargs - 1];
  if (gp->ia >= p->n_in || gp->ib >= p->n_in)
    return fm_diag_set(d, FM_EINVAL, "the matrix operands are not inputs");
  /* bmm: rank-3 tensors whose dim 0 is the batch; the matrix code below sees each one's
     last two dims (views of rank 2) and the batch strides go to ez */
  const uint32_t r = f->ops[gp->op].op == FM_OP_BMM ? 3 : 2;
  fm_tensor av, bv;
  const fm_tensor *a = &f->inputs[gp->ia], *b = &f->inputs[gp->ib];
  if (a->rank != r || b->rank != r || f->outputs[0].rank != r)
    return fm_diag_set(d, FM_EINVAL, "GEMM tensors are rank %u", r);
  gp->batched = r == 3;
  if (gp->batched) {
    gp->batch = f->outputs[0].shape[0];
    gp->ez[gp->ia] = a->shape[0] == 1 ? 0 : a->strides[0];
    gp->ez[gp->ib] = b->shape[0] == 1 ? 0 : b->strides[0];
    av = *a;
    bv = *b;
    for (int w = 0; w < 2; w++) {
      fm_tensor *v = w ? &bv : &av;
      v->rank = 2;
      memmove(&v->shape[0], &v->shape[1], 2 * sizeof v->shape[0]);
      memmove(&v->strides[0], &v->strides[1], 2 * sizeof v->strides[0]);
    }
    a = &av;
    b = &bv;
  }
  gp->dt = a->dtype;
  if (gp->dt != FM_DT_BF16 && gp->dt != FM_DT_F16)
    return fm_diag_set(d, FM_EUNSUPPORTED, "the gemm template multiplies bf16 or f16");
  gp->m = a->shape[0];
  gp->k = a->shape[1];
  gp->n = b->shape[1];
  if (strict && gp->k % 8)
    return fm_diag_set(d, FM_EUNSUPPORTED, "K not a multiple of 8 (K = %" PRId64 ")", gp->k);
  rc = operand(a, 1, 'A', strict, &gp->a_kmajor, &gp->lda, d);
  if (!rc) rc = operand(b, 0, 'B', strict, &gp->b_kmajor, &gp->ldb, d);
  if (rc) return rc;
  if (gp->op2 >= 0) {
    const fm_opnode *m2 = &f->ops[gp->op2];
    gp->ib2 = p->args[gp->op2][m2->nargs - 1];
    if (gp->ib2 >= p->n_in || p->args[gp->op2][m2->nargs - 2] != gp->ia)
      return fm_diag_set(d, FM_EINVAL, "the sibling product's operands are not inputs");
    int kmajor2;
    int64_t ldb2;
    if ((rc = operand(&f->inputs[gp->ib2], 0, 'B', strict, &kmajor2, &ldb2, d))) return rc;
    /* one layout for both: the templates load them alike, a plan runs both matmuls on one set
       of cuBLASLt layouts */
    if (kmajor2 != gp->b_kmajor || ldb2 != gp->ldb)
      return fm_diag_set(d, FM_EUNSUPPORTED,
                         "the sibling B's differ in layout (leading dims %" PRId64 " and %" PRId64 ")",
                         gp->ldb, ldb2);
  }
  if (strict && gp->batched && (gp->ez[gp->ia] % 8 || gp->ez[gp->ib] % 8))
    return fm_diag_set(d, FM_EUNSUPPORTED,
                       "a batch stride of A or B (%" PRId64 ", %" PRId64 ") is not a multiple of 8 "
                       "(16-byte chunks)", gp->ez[gp->ia], gp->ez[gp->ib]);
  for (uint32_t i = 0; i < p->n_ops; i++)
    for (uint32_t x = 0; x < f->ops[i].nargs; x++)
      if (((int)i != gp->op && (int)i != gp->op2) || x + 2 < f->ops[i].nargs)
        if (p->args[i][x] < p->n_in) gp->used[p->args[i][x]] = 1;
  for (uint32_t k = 0; k < p->n_out; k++) {
    int pos = fm_cg_value_position(f, p->n_in + p->n_ops, f->outputs[k].id);
    if (pos < 0 || (uint32_t)pos == gp->ia || (uint32_t)pos == gp->ib || (gp->op2 >= 0 && (uint32_t)pos == gp->ib2))
      return fm_diag_set(d, FM_EINVAL, "outputs[%u]: bad value", k);
    p->t[p->n_in + k].value = (uint32_t)pos;
    p->t[p->n_in + k].dtype = f->outputs[k].dtype;
    if ((uint32_t)pos < p->n_in) gp->used[pos] = 1;
  }
  for (uint32_t k = 0; k < p->n_in + p->n_out; k++) {
    const fm_tensor *t = k < p->n_in ? &f->inputs[k] : &f->outputs[k - p->n_in];
    if (k == gp->ia || k == gp->ib || (gp->op2 >= 0 && k == gp->ib2)) continue;
    if (t->rank != r) return fm_diag_set(d, FM_EINVAL, "epilogue tensor %u is not rank %u", k, r);
    for (uint32_t j = 0; j < 2; j++) gp->es[k][j] = t->shape[r - 2 + j] == 1 ? 0 : t->strides[r - 2 + j];
    if (gp->batched) gp->ez[k] = t->shape[0] == 1 ? 0 : t->strides[0];
    p->t[k].dtype = t->dtype;
    p->t[k].align = t->align;
  }
  return FM_OK;
}

int fm_cg_gemm_plan_build(const fm_fragment *f, fm_cg_gemm_plan *gp, fm_diag *d) {
  return plan_build(f, gp, 1, d);
}

int fm_cg_gemm_plan_build_any(const fm_fragment *f, fm_cg_gemm_plan *gp, fm_diag *d) {
  return plan_build(f, gp, 0, d);
}

static int check_wgmma(const fm_cg_gemm_plan *gp, const fm_gemm_config *c, fm_diag *d) {
  const fm_gemm_mainloop *ml = mainloop_of(c);
  if (!gp->a_kmajor || !gp->b_kmajor)
    return fm_diag_set(d, FM_EUNSUPPORTED, "config: the wgmma mainloop needs K-major A and B");
  /* ping-pong: each of the two consumer warpgroups (4 warps) owns a whole tile, its
     accumulators (BM / 64) x BN / 2 a thread */
  if (ml->pingpong && (c->bk != 64 || c->wn != 1 || c->wm != 4 || (c->bm != 64 && c->bm != 128) ||
                        c->bm / 64 * c->bn > 256))
    return fm_diag_set(d, FM_EINVAL, "config: ping-pong wgmma takes BK 64, 4 x 1 warps, BM 64 or 128, (BM/64) x BN <= 256");
  if (!ml->pingpong && (c->bk != 64 || c->wn != 1 || (c->bm != 64 && c->bm != 128) || c->wm != c->bm / 16))
    return fm_diag_set(d, FM_EINVAL, "config: wgmma takes BK 64, BM 64 or 128 with BM/16 x 1 warps");
  if (c->bn < 64 || c->bn > 256 || c->bn % 64)
    return fm_diag_set(d, FM_EINVAL, "config: wgmma BN %u (64, 128, 192 or 256)", c->bn);
  if (c->stages < ml->min_stages || c->stages > 6)
    return fm_diag_set(d, FM_EINVAL, "config: %u stages for wgmma mode %u", c->stages, c->wgmma);
  if (c->raster > 64) return fm_diag_set(d, FM_EINVAL, "config: raster group %u (0..64)", c->raster);
  if (c->rtiles > 8 || (c->rtiles > 1 && !ml->row_tiles))
    return fm_diag_set(d, FM_EINVAL, "config: %u row tiles per block (1..8, not warp-specialised)", c->rtiles);
  if (c->cluster > 2 || (c->cluster == 2 && !ml->cluster_pair))
    return fm_diag_set(d, FM_EINVAL, "config: cluster %u (0..2; 2 with TMA loads, not ping-pong)", c->cluster);
  return FM_OK;
}

static uint32_t slab_cols(const fm_gemm_config *c);

/* Siblings: each warp's columns split in two halves of whole 8-column groups, staged in one
 * pass; loaded through pointers by the sm_80 mainloop or through a second tensor map by the
 * TMA forms (not the cp.async wgmma forms, row tiles or clusters). */
static int check_siblings(const fm_gemm_config *c, fm_diag *d) {
  uint32_t wcols = c->bn / c->wn;
  if (!mainloop_of(c)->siblings || c->rtiles > 1 || c->cluster > 1)
    return fm_diag_set(d, FM_EUNSUPPORTED, "config: sibling products take the sm_80 or the TMA mainloop");
  if (wcols % 16 || slab_cols(c) != wcols)
    return fm_diag_set(d, FM_EUNSUPPORTED,
                       "config: sibling products need a warp's %u columns in halves of 8-column groups, "
                       "staged at once", wcols);
  return FM_OK;
}

static int check_config(const fm_cg_gemm_plan *gp, const fm_gemm_config *c, fm_diag *d) {
  int rc;
  /* first, so that every check below may ask the mainloop for its properties */
  if (!fm_cg_gemm_mainloop(c->wgmma))
    return fm_diag_set(d, FM_EINVAL, "config: wgmma mode %u (0..%u)", c->wgmma, FM_GEMM_MODES - 1u);
  if (gp->op2 >= 0 && (rc = check_siblings(c, d))) return rc;
  if (gp->batched && mainloop_of(c)->tma)
    return fm_diag_set(d, FM_EUNSUPPORTED, "config: a tensor map addresses one matrix, not a batch (bmm)");
  if (mainloop_of(c)->wgmma) return check_wgmma(gp, c, d);
  if (c->wm < 1 || c->wn < 1 || c->wm * c->wn > 16)
    return fm_diag_set(d, FM_EINVAL, "config: %ux%u warps (1..16 in all)", c->wm, c->wn);
  if (c->bm < 16 || c->bm > 256 || c->bm % (16 * c->wm))
    return fm_diag_set(d, FM_EINVAL, "config: BM %u is not a multiple of 16 x %u warps (<= 256)",
                       c->bm, c->wm);
  if (c->bn < 16 || c->bn > 256 || c->bn % (16 * c->wn))
    return fm_diag_set(d, FM_EINVAL, "config: BN %u is not a multiple of 16 x %u warps (<= 256)",
                       c->bn, c->wn);
  if (c->bk < 16 || c->bk > 128 || c->bk % 16)
    return fm_diag_set(d, FM_EINVAL, "config: BK %u is not a multiple of 16 in 16..128", c->bk);
  if (c->stages < 2 || c->stages > 4)
    return fm_diag_set(d, FM_EINVAL, "config: %u stages (2..4)", c->stages);
  if (c->raster > 64) return fm_diag_set(d, FM_EINVAL, "config: raster group %u (0..64)", c->raster);
  if (c->rtiles > 1) return fm_diag_set(d, FM_EINVAL, "config: row tiles per block need the wgmma mainloop");
  if (c->cluster > 1) return fm_diag_set(d, FM_EINVAL, "config: clusters need the TMA mainloop");
  /* accumulators per thread: beyond 128 the 255-register budget spills */
  if ((c->bm / c->wm) * (c->bn / c->wn) / 32 > 128)
    return fm_diag_set(d, FM_EINVAL, "config: %u accumulators per thread exceed 128",
                       (c->bm / c->wm) * (c->bn / c->wn) / 32);
  return FM_OK;
}

/* Bytes of the epilogue's slabs (16 rows of scols fp32 per warp, padded by 8). */
static uint32_t slab_bytes(const fm_gemm_config *c, uint32_t scols) {
  return mainloop_of(c)->consumers * c->wm * c->wn * 16u * (scols + 8u) * 4u;   /* ping-pong: two warpgroups */
}

/* Whether the slabs sit beside the stages rather than in them: the next tile loads during
 * the epilogue (several row tiles per block; the persistent form, wgmma mode 5). */
static int slabs_apart(const fm_gemm_config *c) { return c->rtiles > 1 || mainloop_of(c)->persistent; }

/* The wgmma stages (1 KiB of slack to align them for the swizzle) and, for the
 * warp-specialised forms, their two mbarriers each. */
static uint32_t wgmma_stage_bytes(const fm_gemm_config *c) {
  return c->stages * (c->bm + c->bn) * 128u + 1024u + (mainloop_of(c)->specialized ? 16u * c->stages : 0u);
}

/* Where the slabs start in the dynamic shared memory (bytes). */
static uint32_t slab_offset(const fm_gemm_config *c) { return slabs_apart(c) ? wgmma_stage_bytes(c) : 0u; }

/* The slabs' columns: a warp's whole width, except where the slabs sit beside the stages:
 * the widest of the whole, a half, a quarter or an eighth (more passes) that fits, in
 * multiples of 32 columns (the swizzle's unit). */
static uint32_t slab_cols(const fm_gemm_config *c) {
  uint32_t w = c->bn / c->wn;
  if (!slabs_apart(c)) return w;
  for (uint32_t part = 1; part <= 8; part *= 2)
    if ((w / part) % 32 == 0 && w % part == 0 && slab_offset(c) + slab_bytes(c, w / part) <= MAX_SMEM_SM90)
      return w / part;
  return w;   /* too large either way: smem_bytes says so */
}

static uint32_t smem_bytes(const fm_cg_gemm_plan *gp, const fm_gemm_config *c) {
  if (mainloop_of(c)->wgmma) {
    /* the stages, or the slabs if larger where they reuse them */
    uint32_t mainloop = wgmma_stage_bytes(c);
    uint32_t staging = slab_bytes(c, slab_cols(c));
    if (slabs_apart(c)) return slab_offset(c) + staging;
    return mainloop > staging ? mainloop : staging;
  }
  uint32_t a = gp->a_kmajor ? c->bm * (c->bk + 8) : c->bk * (c->bm + 8);
  uint32_t b = gp->b_kmajor ? c->bn * (c->bk + 8) : c->bk * (c->bn + 8);
  uint32_t mainloop = c->stages * (a + b) * 2u;
  /* the epilogue's staging slabs reuse the stage buffers: 16 rows per warp */
  uint32_t staging = slab_bytes(c, slab_cols(c));
  return mainloop > staging ? mainloop : staging;
}

uint32_t fm_codegen_gemm_smem(const fm_fragment *canon, const fm_gemm_config *cfg) {
  fm_cg_gemm_plan *gp = malloc(sizeof *gp);
  uint32_t bytes = 0;
  if (gp && canon && cfg && !fm_cg_gemm_plan_build(canon, gp, NULL) && !check_config(gp, cfg, NULL))
    bytes = smem_bytes(gp, cfg);
  free(gp);
  return bytes;
}

fm_gemm_config fm_codegen_gemm_default(const fm_fragment *canon) {
  /* Fewer 128x128 tiles than SMs leaves the GPU idle: take the 64x64 tiles then, and the
   * 16-row tiles for a decode-sized M. A symbolic M is a batch dimension, assumed large. */
  int64_t m = canon && canon->n_inputs ? -1 : 1, n = 1, batch = 1;
  int g = canon ? fm_fragment_gemm_op(canon) : -1;
  if (g >= 0) {
    const fm_opnode *mm = &canon->ops[g];
    int ia = fm_cg_value_position(canon, canon->n_inputs, mm->args[mm->nargs - 2]);
    int ib = fm_cg_value_position(canon, canon->n_inputs, mm->args[mm->nargs - 1]);
    uint32_t r = mm->op == FM_OP_BMM ? 3 : 2;   /* bmm: [Bt, M, K] @ [Bt, K, N] */
    if (ia >= 0 && ib >= 0 && canon->inputs[ia].rank == r && canon->inputs[ib].rank == r) {
      m = canon->inputs[ia].shape[r - 2];
      n = canon->inputs[ib].shape[r - 1];
      if (r == 3) batch = canon->outputs[0].shape[0];   /* -1: symbolic, assumed large */
    }
  }
  if (m > 0 && m <= 16) return configs[2];
  if (m > 0 && batch > 0 && ((m + 127) / 128) * ((n + 127) / 128) * batch < (int64_t)DEFAULT_SMS)
    return configs[1];
  return configs[0];
}

size_t fm_codegen_gemm_candidates(const fm_fragment *canon, fm_gemm_config *out, size_t max) {
  fm_cg_gemm_plan *gp = malloc(sizeof *gp);
  size_t n = 0;
  if (!gp || !canon || !out || fm_cg_gemm_plan_build(canon, gp, NULL)) goto done;
  /* A known M at most a quarter of BM leaves most of the tile idle: the smaller tiles
     serve it (BM 16 and 32 always remain). A symbolic M may be anything: keep all. */
  int64_t m_eff = gp->m < 16 ? 16 : gp->m;
  for (size_t i = 0; i < N_WGMMA && n < max; i++) {
    const fm_gemm_config *c = &wgmma_configs[i];
    int64_t rows = (int64_t)c->bm * (c->rtiles > 1 ? c->rtiles : 1);
    if (!check_config(gp, c, NULL) && smem_bytes(gp, c) <= MAX_SMEM_SM90 && (gp->m < 0 || rows < 4 * m_eff))
      out[n++] = *c;
  }
  for (size_t i = 0; i < N_CONFIGS && n < max; i++)
    if (!check_config(gp, &configs[i], NULL) && smem_bytes(gp, &configs[i]) <= MAX_SMEM &&
        (gp->m < 0 || (int64_t)configs[i].bm < 4 * m_eff))
      out[n++] = configs[i];
done:
  free(gp);
  return n;
}

/* The start of "raw element -> value" (the caller writes the element and the close). */
static void emit_decode_open(fm_strbuf *sb, fm_dtype dt) {
  switch (dt) {
    case FM_DT_BOOL: fm_strbuf_append(sb, "("); return;
    case FM_DT_F16: fm_strbuf_append(sb, "fm_f16_to_f32("); return;
    case FM_DT_BF16: fm_strbuf_append(sb, "fm_bf16_to_f32("); return;
    default: return;
  }
}

static void emit_encode(fm_strbuf *sb, fm_dtype dt, fm_dtype vdt, uint32_t pos) {
  char a[48];
  if (vdt == FM_DT_BOOL && dt != FM_DT_BOOL) snprintf(a, sizeof a, "(v%u ? 1.0f : 0.0f)", pos);
  else if (vdt != FM_DT_BOOL && dt == FM_DT_BOOL) snprintf(a, sizeof a, "(v%u != 0.0f)", pos);
  else snprintf(a, sizeof a, "v%u", pos);
  switch (dt) {
    case FM_DT_BOOL: fm_strbuf_printf(sb, "(unsigned char)%s", a); return;
    case FM_DT_F16: fm_strbuf_printf(sb, "fm_f32_to_f16(%s)", a); return;
    case FM_DT_BF16: fm_strbuf_printf(sb, "fm_f32_to_bf16(%s)", a); return;
    default: fm_strbuf_append(sb, a); return;
  }
}

/* "m * 1024LL + (n + e) * 1LL" for tensor k, column expression nx (a broadcast dim
 * contributes nothing). */
static void emit_offset(fm_strbuf *sb, const fm_cg_gemm_plan *gp, uint32_t k, const char *nx) {
  int any = 0;
  for (uint32_t j = 0; j < 2; j++) {
    int64_t s = gp->es[k][j];
    if (!s) continue;
    fm_strbuf_printf(sb, "%s%s * %" PRId64 "LL", any ? " + " : "", j ? nx : "m", s);
    any = 1;
  }
  if (!any) fm_strbuf_append(sb, "0");
}

/* Tensor k's 8 elements (n .. n+7 of row m) move as 16-byte accesses when they are
 * contiguous, every row starts on a 16-byte boundary and the element is 2 or 4 bytes
 * (n is a multiple of 8, so the first element is aligned too). */
static int vector_ok(const fm_cg_gemm_plan *gp, uint32_t k) {
  fm_dtype dt = gp->base.t[k].dtype;
  size_t es = fm_dtype_size(dt);
  if (dt == FM_DT_BOOL || (es != 2 && es != 4)) return 0;
  return gp->es[k][1] == 1 && gp->es[k][0] % (int64_t)(16 / es) == 0 && gp->ez[k] % (int64_t)(16 / es) == 0 &&
         gp->base.t[k].align >= 16;
}

/* The epilogue parameter list after (acc, m, n): used inputs, then outputs. */
void fm_cg_gemm_emit_epi_params(fm_strbuf *sb, const fm_cg_gemm_plan *gp, int decl) {
  const fm_cg_plan *p = &gp->base;
  for (uint32_t k = 0; k < p->n_in; k++) {
    if (!gp->used[k]) continue;
    if (decl) fm_strbuf_printf(sb, ",\n    const %s *__restrict__ in%u", fm_cg_storage_type(p->t[k].dtype), k);
    else fm_strbuf_printf(sb, ", in%u", k);
  }
  for (uint32_t k = 0; k < p->n_out; k++) {
    if (decl)
      fm_strbuf_printf(sb, ",\n    %s *__restrict__ out%u", fm_cg_storage_type(p->t[p->n_in + k].dtype), k);
    else fm_strbuf_printf(sb, ", out%u", k);
  }
}

/* Input k is a row vector over the columns (a bias) of 16-bit elements whose 8 move as one
 * 16-byte load: the ping-pong kernel reads a lane's 8 before its mainloop (pre<k>). */
static int row_vector16(const fm_cg_gemm_plan *gp, uint32_t k) {
  return gp->used[k] && gp->es[k][0] == 0 && gp->es[k][1] == 1 && vector_ok(gp, k) &&
         fm_dtype_size(gp->base.t[k].dtype) == 2;
}

/* Raw elements of used input k into r<k>[8] (columns past N read nothing). */
static void emit_epi_load(fm_strbuf *sb, const fm_cg_gemm_plan *gp, uint32_t k) {
  const char *st = fm_cg_storage_type(gp->base.t[k].dtype);
  size_t es = fm_dtype_size(gp->base.t[k].dtype);
  if (gp->es[k][1] == 0) {   /* one value for the whole row piece */
    fm_strbuf_printf(sb, "  const %s r%u = in%u[", st, k, k);
    emit_offset(sb, gp, k, "n");
    fm_strbuf_append(sb, "];\n");
    return;
  }
  fm_strbuf_printf(sb, "  __align__(16) %s r%u[8];\n", st, k);
  if (vector_ok(gp, k)) {
    fm_strbuf_append(sb, "  if (full) {\n");
    for (size_t v = 0; v < es / 2; v++) {
      fm_strbuf_printf(sb, "    ((uint4 *)r%u)[%zu] = ", k, v);
      if (row_vector16(gp, k)) fm_strbuf_printf(sb, "pre%u ? *pre%u : ", k, k);
      fm_strbuf_printf(sb, "*(const uint4 *)(in%u + ", k);
      emit_offset(sb, gp, k, "n");
      fm_strbuf_printf(sb, " + %zu);\n", v * 16 / es);
    }
    fm_strbuf_append(sb, "  } else {\n");
  }
  fm_strbuf_append(sb, "#pragma unroll\n  for (int e = 0; e < 8; e++)\n");
  fm_strbuf_printf(sb, "    r%u[e] = n + e < FM_N ? in%u[", k, k);
  emit_offset(sb, gp, k, "(n + e)");
  fm_strbuf_printf(sb, "] : (%s)0;\n", st);
  if (vector_ok(gp, k)) fm_strbuf_append(sb, "  }\n");
}

void fm_cg_emit_st16_words(fm_strbuf *sb, uint32_t k, size_t es, size_t v) {
  for (size_t w = 0; w < 4; w++) {
    size_t e = v * 16 / es + w * 4 / es;
    if (es == 2) fm_strbuf_printf(sb, ", (unsigned)o%u[%zu] | (unsigned)o%u[%zu] << 16", k, e, k, e + 1);
    else fm_strbuf_printf(sb, ", __float_as_uint(o%u[%zu])", k, e);
  }
}

/* o<k>[8] to output k: one 16-byte store per 16 bytes when whole and aligned, else masked. */
static void emit_epi_store(fm_strbuf *sb, const fm_cg_gemm_plan *gp, uint32_t k) {
  uint32_t t = gp->base.n_in + k;
  size_t es = fm_dtype_size(gp->base.t[t].dtype);
  if (vector_ok(gp, t)) {
    fm_strbuf_append(sb, "  if (full) {\n");
    for (size_t v = 0; v < es / 2; v++) {
      fm_strbuf_printf(sb, "    fm_st16(out%u + ", k);
      emit_offset(sb, gp, t, "n");
      fm_strbuf_printf(sb, " + %zu", v * 16 / es);
      fm_cg_emit_st16_words(sb, k, es, v);
      fm_strbuf_append(sb, ");\n");
    }
    fm_strbuf_append(sb, "  } else {\n");
  }
  fm_strbuf_append(sb, "#pragma unroll\n  for (int e = 0; e < 8; e++)\n");
  fm_strbuf_printf(sb, "    if (n + e < FM_N) out%u[", k);
  emit_offset(sb, gp, t, "(n + e)");
  fm_strbuf_printf(sb, "] = o%u[e];\n", k);
  if (vector_ok(gp, t)) fm_strbuf_append(sb, "  }\n");
}

/* For the ping-pong kernel's early bias read (emitted where an input is row_vector16). */
static const char ld_nc16[] =
    "/* 16 bytes through the read-only path; volatile, so it stays where it is written. */\n"
    "__device__ __forceinline__ uint4 fm_ld_nc16(const void *p) {\n"
    "  uint4 r;\n"
    "  asm volatile(\"ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];\" : \"=r\"(r.x), \"=r\"(r.y), \"=r\"(r.z), \"=r\"(r.w)\n"
    "               : \"l\"(__cvta_generic_to_global(p)));\n"
    "  return r;\n"
    "}\n";

const char fm_cg_st16[] =
    "/* One 16-byte store of four words. Through a uint4 cast, the compiler split some of\n"
    "   these into four 4-byte stores (PTX of the ping-pong kernel; ncu: 12.8 of 32\n"
    "   bytes used per stored sector). */\n"
    "__device__ __forceinline__ void fm_st16(void *p, unsigned a, unsigned b, unsigned c, unsigned d) {\n"
    "  asm volatile(\"st.global.v4.b32 [%0], {%1, %2, %3, %4};\" ::\n"
    "               \"l\"(__cvta_generic_to_global(p)), \"r\"(a), \"r\"(b), \"r\"(c), \"r\"(d));\n"
    "}\n";

void fm_cg_gemm_emit_epilogue(fm_strbuf *sb, const fm_fragment *f, const fm_cg_gemm_plan *gp) {
  const fm_cg_plan *p = &gp->base;
  fm_strbuf_append(sb, fm_cg_st16);
  for (uint32_t k = 0; k < p->n_in; k++)
    if (row_vector16(gp, k)) {
      fm_strbuf_append(sb, ld_nc16);
      break;
    }
  fm_strbuf_append(sb, "/* ---- the epilogue: the fragment's ops on 8 accumulators of one row (columns\n"
                       "   n .. n+7, n a multiple of 8, those past N ignored), each output stored once;\n"
                       "   WHOLE: the caller knows all 8 columns are inside N (no masking compiled in) ---- */\n"
                       "template <bool WHOLE = false>\n"
                       "__device__ __forceinline__ void fm_epilogue(const float (&acc)[8], ");
  /* siblings: the second product's 8 accumulators of the same columns */
  if (gp->op2 >= 0) fm_strbuf_append(sb, "const float (&acc2)[8], ");
  fm_strbuf_append(sb, "const long long m, const long long n");
  fm_cg_gemm_emit_epi_params(sb, gp, 1);
  /* a row vector's 8 elements already loaded by the caller (the ping-pong kernel), if any */
  for (uint32_t k = 0; k < p->n_in; k++)
    if (row_vector16(gp, k)) fm_strbuf_printf(sb, ",\n    const uint4 *pre%u = nullptr", k);
  fm_strbuf_append(sb, ") {\n  const bool full = WHOLE || n + 8 <= FM_N;\n");
  for (uint32_t k = 0; k < p->n_in; k++)
    if (gp->used[k]) emit_epi_load(sb, gp, k);
  for (uint32_t k = 0; k < p->n_out; k++)
    fm_strbuf_printf(sb, "  __align__(16) %s o%u[8];\n", fm_cg_storage_type(p->t[p->n_in + k].dtype), k);
  fm_strbuf_append(sb, "#pragma unroll\n  for (int e = 0; e < 8; e++) {\n");
  for (uint32_t k = 0; k < p->n_in; k++) {
    if (!gp->used[k]) continue;
    fm_strbuf_printf(sb, "    const %s v%u = ", p->vdt[k] == FM_DT_BOOL ? "bool" : "float", k);
    emit_decode_open(sb, p->vdt[k]);
    fm_strbuf_printf(sb, "r%u%s", k, gp->es[k][1] == 0 ? "" : "[e]");
    fm_strbuf_append(sb, p->vdt[k] == FM_DT_BOOL ? " != 0)" : p->vdt[k] == FM_DT_F32 ? "" : ")");
    fm_strbuf_append(sb, ";\n");
  }
  for (uint32_t i = 0; i < p->n_ops; i++) {
    uint32_t pos = p->n_in + i;
    fm_strbuf_printf(sb, "    const %s v%u = ", p->vdt[pos] == FM_DT_BOOL ? "bool" : "float", pos);
    if ((int)i == gp->op || (int)i == gp->op2) {
      /* the product stays fp32, like every intermediate; addmm adds its bias in fp32 */
      const char *acc = (int)i == gp->op ? "acc" : "acc2";
      if (f->ops[i].nargs == 3) {
        uint32_t b = p->args[i][0];
        if (p->vdt[b] == FM_DT_BOOL) fm_strbuf_printf(sb, "(%s[e] + (v%u ? 1.0f : 0.0f))", acc, b);
        else fm_strbuf_printf(sb, "(%s[e] + v%u)", acc, b);
      } else {
        fm_strbuf_printf(sb, "%s[e]", acc);
      }
    } else {
      fm_cg_emit_op(sb, f, p, i);
    }
    fm_strbuf_printf(sb, ";  /* %s */\n", fm_op_name(f->ops[i].op));
  }
  for (uint32_t k = 0; k < p->n_out; k++) {
    uint32_t t = p->n_in + k;
    fm_strbuf_printf(sb, "    o%u[e] = ", k);
    emit_encode(sb, p->t[t].dtype, p->vdt[p->t[t].value], p->t[t].value);
    fm_strbuf_append(sb, ";\n");
  }
  fm_strbuf_append(sb, "  }\n");
  for (uint32_t k = 0; k < p->n_out; k++) emit_epi_store(sb, gp, k);
  fm_strbuf_append(sb, "}\n");
}

/* fm_mma(): one mma.sync m16n8k16 (row.col, fp32 accumulators) on ty ("bf16" or "f16"). */
void fm_cg_gemm_emit_mma(fm_strbuf *sb, const char *ty) {
  fm_strbuf_printf(sb,
                   "__device__ __forceinline__ void fm_mma(float c[4], const unsigned a[4], unsigned b0, unsigned b1) {\n"
                   "  asm(\"mma.sync.aligned.m16n8k16.row.col.f32.%s.%s.f32 {%%0, %%1, %%2, %%3}, {%%4, %%5, %%6, %%7}, \"\n"
                   "      \"{%%8, %%9}, {%%0, %%1, %%2, %%3};\\n\"\n"
                   "      : \"+f\"(c[0]), \"+f\"(c[1]), \"+f\"(c[2]), \"+f\"(c[3])\n"
                   "      : \"r\"(a[0]), \"r\"(a[1]), \"r\"(a[2]), \"r\"(a[3]), \"r\"(b0), \"r\"(b1));\n"
                   "}\n",
                   ty, ty);
}

/* min_blocks > 1 caps the registers so that many blocks fit on an SM (0: no cap); tma: the
 * two tensor maps of the TMA mainloop follow outer (launch metadata "tmaps"). */
static void kernel_open(fm_strbuf *sb, const fm_fragment *f, const fm_cg_gemm_plan *gp, const char *entry,
                        uint32_t min_blocks, int tma, uint32_t cluster, const char *scratch_ty) {
  const fm_cg_plan *p = &gp->base;
  fm_strbuf_append(sb, "extern \"C\" __global__ void ");
  if (cluster > 1) fm_strbuf_printf(sb, "__cluster_dims__(%u, 1, 1) ", cluster);
  if (min_blocks > 1)
    fm_strbuf_printf(sb, "__launch_bounds__(FM_THREADS, %u) %s(\n", min_blocks, entry);
  else
    fm_strbuf_printf(sb, "__launch_bounds__(FM_THREADS) %s(\n", entry);
  for (uint32_t k = 0; k < p->n_in; k++)
    fm_strbuf_printf(sb, "    const %s *__restrict__ in%u,\n", fm_cg_storage_type(f->inputs[k].dtype), k);
  for (uint32_t k = 0; k < p->n_out; k++)
    fm_strbuf_printf(sb, "    %s *__restrict__ out%u,\n", fm_cg_storage_type(p->t[p->n_in + k].dtype), k);
  if (tma)
    fm_strbuf_printf(sb, "    long long outer, const __grid_constant__ fm_tmap fm_tma,\n"
                         "    const __grid_constant__ fm_tmap fm_tmb%s) {\n",
                     gp->op2 >= 0 ? ", const __grid_constant__ fm_tmap fm_tmb2" : "");
  else if (scratch_ty && gp->op2 >= 0)   /* siblings' plan: both products */
    fm_strbuf_printf(sb, "    long long outer, const %s *__restrict__ fm_scratch,\n"
                         "    const %s *__restrict__ fm_scratch2) {\n", scratch_ty, scratch_ty);
  else if (scratch_ty)
    fm_strbuf_printf(sb, "    long long outer, const %s *__restrict__ fm_scratch) {\n", scratch_ty);
  else
    fm_strbuf_append(sb, "    long long outer) {\n");
  if (gp->m < 0) fm_strbuf_append(sb, "  const long long M = outer;\n");
  else fm_strbuf_printf(sb, "  const long long M = %" PRId64 "LL;\n  (void)outer;\n", gp->m);
  if (!gp->batched) return;
  /* bmm: blockIdx.z is this block's product; every tensor moves to it (a broadcast one,
     batch stride 0, stays), and the rest of the kernel is that of one GEMM */
  fm_strbuf_append(sb, "  const long long fm_z = blockIdx.z;\n");
  for (uint32_t k = 0; k < p->n_in + p->n_out; k++) {
    if (!gp->ez[k] || (k < p->n_in && !gp->used[k] && k != gp->ia && k != gp->ib)) continue;
    fm_strbuf_printf(sb, "  %s%u += fm_z * %" PRId64 "LL;\n", k < p->n_in ? "in" : "out",
                     k < p->n_in ? k : k - p->n_in, gp->ez[k]);
  }
}

void fm_cg_gemm_emit_kernel_open(fm_strbuf *sb, const fm_fragment *f, const fm_cg_gemm_plan *gp,
                                 const char *entry) {
  kernel_open(sb, f, gp, entry, 0, 0, 0, NULL);
}

void fm_cg_gemm_emit_kernel_open_cluster(fm_strbuf *sb, const fm_fragment *f, const fm_cg_gemm_plan *gp,
                                         const char *entry, uint32_t cluster) {
  kernel_open(sb, f, gp, entry, 0, 0, cluster, NULL);
}

void fm_cg_gemm_emit_kernel_open_extra(fm_strbuf *sb, const fm_fragment *f, const fm_cg_gemm_plan *gp,
                                       const char *entry, const char *scratch_ty) {
  kernel_open(sb, f, gp, entry, 0, 0, 0, scratch_ty);
}

/* The block: the MMA warps, plus the loaders of the warp-specialised forms (a warpgroup; one
 * warp for TMA). */
static uint32_t block_threads(const fm_gemm_config *c) {
  return mainloop_of(c)->consumers * c->wm * c->wn * 32 + mainloop_of(c)->loader_threads;
}

/* Two blocks per SM when the shared memory allows it (sm_90's 227 KiB) and the accumulators
 * are few (64 a thread): the mainloop then needs about 128 registers, and a fused epilogue
 * that pushed it to 130 would silently halve the blocks per SM (measured: 128x128x64, 3
 * stages, 2x4 warps went from 0.459 to 0.640 ms at 4096^3). Larger accumulator sets keep
 * their registers: a cap would spill them. */
static uint32_t min_blocks(const fm_gemm_config *c, uint32_t smem) {
  uint32_t acc = (c->bm / c->wm) * (c->bn / c->wn) / 32;
  return acc <= 64 && block_threads(c) <= 288 && 2 * (smem + 1024) <= MAX_SMEM_SM90 + 1024 ? 2 : 0;
}

/* The unroll of a tile epilogue's loop: "" (whole) or 8 (eight 8-column groups a trip). Whole,
 * the loop is thousands of straight-line instructions run once per tile; in the ping-pong
 * form, whose four epilogue warps run beside the other warpgroup's mainloop, they stalled on
 * instruction fetch (ncu, 16384x1024x256: 26% of stall samples "no instruction"), and two
 * groups a trip measured 3-7% faster there; with the shorter GELU of codegen v19, four groups
 * a trip (more independent chains for a warp that runs alone on its scheduler) measured 1-4%
 * faster again at short K, even elsewhere. Where both warpgroups run the epilogue together,
 * the whole loop stayed faster (its later loads are hoisted over earlier math), by 3-8%
 * (bench/NOTES.md, "The tile epilogue rolled"). With the 9-instruction GELU of codegen v28,
 * eight a trip (one trip per 128-column pass, so its indexing is set up once, not twice)
 * measured 3% faster again at 16384 x 1024 x 256 and the same at 16384 x 256 x 1024. */
static const char *epi_unroll(int rolled) { return rolled ? " 8" : ""; }

/* The epilogue of the tile at row m0 (block-uniform): each warp stages its accumulators
 * through its slab, FM_SCOLS columns at a time, and runs fm_epilogue on 8 columns of a row. */
/* The siblings' epilogue (the slab holds all FM_WCOLS columns of the warp, one pass): the
 * first half of the slab's columns are B's products, the second half B2's of the same output
 * columns, which start at n0 / 2 + wn * FM_WCOLS / 2. */
static void emit_sibling_epilogue(fm_strbuf *sb, const fm_cg_gemm_plan *gp, const char *indent, int rolled) {
  fm_strbuf_printf(sb,
                   "%s{\n"
                   "%s  const bool whole = m0 + FM_BM <= M && n0 / 2 + FM_BN / 2 <= FM_N;\n"
                   "#pragma unroll\n"
                   "%s  for (int mt = 0; mt < FM_MT; mt++) {\n"
                   "%s    fm_stage(slab, acc[mt], lane, 0);\n"
                   "%s    __syncwarp();\n"
                   "%s    const long long mw = m0 + FM_WARP_ROW(wm, mt);\n"
                   "%s    const long long nw = n0 / 2 + wn * (FM_WCOLS / 2);\n"
                   "#pragma unroll%s\n"
                   "%s    for (int g = lane; g < FM_WCOLS; g += 32) {   /* 16 rows x FM_WCOLS / 16 */\n"
                   "%s      const int r = g / (FM_WCOLS / 16), c = g %% (FM_WCOLS / 16) * 8;\n"
                   "%s      if (!whole && (mw + r >= M || nw + c >= FM_N)) continue;\n"
                   "%s      float v[8], v2[8];\n"
                   "%s      fm_unstage(v, slab, r, c);\n"
                   "%s      fm_unstage(v2, slab, r, c + FM_WCOLS / 2);\n"
                   "%s      if (whole) fm_epilogue<true>(v, v2, mw + r, nw + c",
                   indent, indent, indent, indent, indent, indent, indent, epi_unroll(rolled), indent, indent,
                   indent, indent, indent, indent, indent);
  fm_cg_gemm_emit_epi_params(sb, gp, 0);
  fm_strbuf_printf(sb, ");\n%s      else fm_epilogue<false>(v, v2, mw + r, nw + c", indent);
  fm_cg_gemm_emit_epi_params(sb, gp, 0);
  fm_strbuf_printf(sb,
                   ");\n"
                   "%s    }\n"
                   "%s    __syncwarp();   /* the slab is rewritten next */\n"
                   "%s  }\n"
                   "%s}\n",
                   indent, indent, indent, indent);
}

static void emit_tile_epilogue(fm_strbuf *sb, const fm_cg_gemm_plan *gp, const char *indent, int rolled) {
  if (gp->op2 >= 0) {
    emit_sibling_epilogue(sb, gp, indent, rolled);
    return;
  }
  fm_strbuf_printf(sb,
                   "%s{\n"
                   "%s  /* A tile wholly inside M and N (all but the edges) runs a branch-free copy of\n"
                   "%s     the loop: its loads, independent across iterations, are scheduled ahead\n"
                   "%s     of earlier iterations' math instead of one round trip per 8 columns. */\n"
                   "%s  const bool whole = m0 + FM_BM <= M && n0 + FM_BN <= FM_N;\n"
                   "#pragma unroll\n"
                   "%s  for (int mt = 0; mt < FM_MT; mt++) {\n"
                   "#pragma unroll\n"
                   "%s  for (int pass = 0; pass < FM_WCOLS / FM_SCOLS; pass++) {\n"
                   "%s    fm_stage(slab, acc[mt], lane, pass);\n"
                   "%s    __syncwarp();\n"
                   "%s    const long long mw = m0 + FM_WARP_ROW(wm, mt);\n"
                   "%s    const long long nw = n0 + wn * FM_WCOLS + pass * FM_SCOLS;\n"
                   "%s    if (whole) {\n"
                   "#if 32 %% (FM_SCOLS / 8) == 0\n"
                   "%s      /* 16 rows x FM_SCOLS / 8 groups, lane + 32 i each: where FM_SCOLS / 8 divides 32 a\n"
                   "%s         lane keeps its 8 columns (c) and steps down the rows by a constant, so its\n"
                   "%s         addresses advance by a constant too (with s0 / s1 below: 449 instructions a trip\n"
                   "%s         of 32 bias + GELU elements where the per-trip indexing took 497) */\n"
                   "%s      const int c = lane %% (FM_SCOLS / 8) * 8, r0 = lane / (FM_SCOLS / 8);\n"
                   "%s      /* the slab's swizzle depends on a row's parity, the same on every trip when the\n"
                   "%s         rows step by an even number */\n"
                   "%s      const int s0 = fm_swz(r0, c), s1 = fm_swz(r0, c + 4), even = (32 / (FM_SCOLS / 8)) %% 2 == 0;\n"
                   "#pragma unroll%s\n"
                   "%s      for (int i = 0; i < 2 * FM_SCOLS / 32; i++) {\n"
                   "%s        const int r = r0 + i * (32 / (FM_SCOLS / 8));\n"
                   "%s        float v[8];\n"
                   "%s        if (even) {\n"
                   "%s          *(float4 *)v = *(const float4 *)(slab + r * FM_SLAB_LD + s0);\n"
                   "%s          *(float4 *)(v + 4) = *(const float4 *)(slab + r * FM_SLAB_LD + s1);\n"
                   "%s        } else {\n"
                   "%s          fm_unstage(v, slab, r, c);\n"
                   "%s        }\n"
                   "#else\n"
                   "#pragma unroll%s\n"
                   "%s      for (int i = 0; i < 2 * FM_SCOLS / 32; i++) {\n"
                   "%s        const int g = lane + 32 * i, r = g / (FM_SCOLS / 8), c = g %% (FM_SCOLS / 8) * 8;\n"
                   "%s        float v[8];\n"
                   "%s        fm_unstage(v, slab, r, c);\n"
                   "#endif\n"
                   "%s        fm_epilogue<true>(v, mw + r, nw + c",
                   indent, indent, indent, indent, indent, indent, indent, indent, indent, indent, indent,
                   indent, indent, indent, indent, indent, indent, indent, indent, indent, epi_unroll(rolled), indent,
                   indent, indent, indent, indent, indent, indent, indent, indent, epi_unroll(rolled), indent,
                   indent, indent, indent, indent);
  fm_cg_gemm_emit_epi_params(sb, gp, 0);
  if (rolled) {   /* the ping-pong kernel's biases, read before its mainloop */
    fm_strbuf_append(sb, "\n#if FM_EPI_PRELOAD\n");
    for (uint32_t k = 0; k < gp->base.n_in; k++)
      if (row_vector16(gp, k)) fm_strbuf_printf(sb, "            , &pre%u\n", k);
    fm_strbuf_append(sb, "#endif\n            ");
  }
  fm_strbuf_printf(sb,
                   ");\n"
                   "%s      }\n"
                   "%s    } else {\n"
                   "#pragma unroll%s\n"
                   "%s      for (int g = lane; g < 2 * FM_SCOLS; g += 32) {   /* the edges */\n"
                   "%s        const int r = g / (FM_SCOLS / 8), c = g %% (FM_SCOLS / 8) * 8;\n"
                   "%s        if (mw + r >= M || nw + c >= FM_N) continue;\n"
                   "%s        float v[8];\n"
                   "%s        fm_unstage(v, slab, r, c);\n"
                   "%s        fm_epilogue<false>(v, mw + r, nw + c",
                   indent, indent, rolled ? " 1" : "", indent, indent, indent, indent, indent, indent);
  fm_cg_gemm_emit_epi_params(sb, gp, 0);
  fm_strbuf_printf(sb,
                   ");\n"
                   "%s      }\n"
                   "%s    }\n"
                   "%s    __syncwarp();   /* the slab is rewritten next */\n"
                   "%s  }\n"
                   "%s  }\n"
                   "%s}\n",
                   indent, indent, indent, indent, indent, indent);
}

/* The kernel around mainloop ml. Specialised (cp.async): warpgroup 0 of the block only
 * loads; it leaves after the barrier and the epilogue's warps count from 4. TMA: the
 * mainloop reads A and B through the tensor maps fm_tma and fm_tmb, and its one loader warp
 * comes after the MMA warps (it leaves after the barrier). rtiles > 1: the
 * block walks that many row tiles, the next one's first k-tiles loading during the
 * epilogue (the slabs then sit beside the stages, FM_SLAB_OFF). Persistent (TMA only): at
 * most the blocks the device holds, each walking tiles blockIdx.x, + gridDim.x, ... while its
 * loader runs ahead (fm_cg_wgmma_persistent; slabs beside the stages too); ping-pong: its two
 * consumer warpgroups take the tiles in turn (the epilogue loop is rolled). */
static void emit_kernel(fm_strbuf *sb, const fm_fragment *f, const fm_cg_gemm_plan *gp, const char *entry,
                        const fm_gemm_mainloop *ml, uint32_t cluster, uint32_t min_blocks, uint32_t rtiles) {
  const int tma = ml->tma, specialized = ml->specialized, pingpong = ml->pingpong;
  kernel_open(sb, f, gp, entry, min_blocks, tma, cluster, NULL);
  if (ml->persistent) {
    fm_strbuf_append(sb,
                     "  const int tiles_m = (int)((M + FM_BM - 1) / FM_BM), units = fm_units(tiles_m);\n"
                     "  fm_pipe_init();\n"
                     "  if (threadIdx.x >= FM_MMA_THREADS) {   /* the loader warp: one thread issues every box */\n");
    fm_strbuf_printf(sb, "    if (threadIdx.x == FM_MMA_THREADS) fm_load_tiles(&fm_tma, &fm_tmb%s, tiles_m, units);\n",
                     gp->op2 >= 0 ? ", &fm_tmb2" : "");
    fm_strbuf_append(sb,
                     "    fm_pipe_done();\n"
                     "    return;\n"
                     "  }\n"
                     "  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;\n"
                     "  /* consumer wg takes the block's tiles j = wg, wg + FM_CONSUMERS, ...; read through a\n"
                     "     shuffle so the compiler knows it is warp-uniform (else it serialises wgmma) */\n"
                     "  const int wg = __shfl_sync(0xffffffffu, warp / (FM_WM * FM_WN), 0);\n"
                     "  const int wm = warp % (FM_WM * FM_WN) / FM_WN, wn = warp % FM_WN;\n"
                     "  float *slab = (float *)((char *)fm_smem + FM_SLAB_OFF) + warp * 16 * FM_SLAB_LD;\n"
                     "  for (int j = wg, u = FM_UNIT0 + wg * FM_UNIT_STRIDE; u < units; j += FM_CONSUMERS, u += FM_CONSUMERS * FM_UNIT_STRIDE) {\n"
                     "    /* declared per tile: where the first wgmma ignores their values (FM_ACC_BY_WGMMA)\n"
                     "       none is live from the tile before */\n"
                     "    float acc[FM_MT][FM_NT][4];\n"
                     "    unsigned it = (unsigned)j * FM_KT;\n"
                     "    int tm, tn;\n"
                     "    fm_unit_tile(u, tiles_m, tm, tn);\n"
                     "    const long long m0 = (long long)tm * FM_BM;\n"
                     "    const int n0 = tn * FM_BN;\n");
  if (pingpong && gp->op2 < 0) {   /* (the siblings' epilogue takes no preloaded bias) */
    /* a lane's 8 columns of each bias, read before the mainloop: loaded just before their first
       use in the epilogue they were 3% of the kernel's stall samples (ncu, 16384 x 1024 x
       256); the epilogue's one pass keeps a lane on these columns */
    fm_strbuf_append(sb, "#if FM_EPI_PRELOAD\n");
    for (uint32_t k = 0; k < gp->base.n_in; k++)
      if (row_vector16(gp, k))
        fm_strbuf_printf(sb,
                         "    const uint4 pre%u = n0 + FM_BN <= FM_N   /* used by whole tiles only: past N, read nothing */\n"
                         "        ? fm_ld_nc16(in%u + n0 + wn * FM_WCOLS + lane %% (FM_SCOLS / 8) * 8) : make_uint4(0u, 0u, 0u, 0u);\n",
                         k, k);
    fm_strbuf_append(sb, "#endif\n");
  }
  fm_strbuf_append(sb,
                     "    fm_turn_wait(j);\n"
                     "    fm_mainloop_tile(acc, it);\n"
                     "    fm_turn_pass(j, u + FM_UNIT_STRIDE < units);\n");
    emit_tile_epilogue(sb, gp, "    ", pingpong);
    fm_strbuf_append(sb, "  }\n  fm_pipe_done();\n}\n");
    return;
  }
  fm_strbuf_append(sb,
                   "  int tm, tn;\n"
                   "  fm_tile_coords(tm, tn);\n"
                   "  const int n0 = tn * FM_BN;\n");
  if (rtiles > 1) {
    fm_strbuf_printf(sb,
                     "  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;\n"
                     "  const int wm = warp / FM_WN, wn = warp %% FM_WN;\n"
                     "  float *slab = (float *)((char *)fm_smem + FM_SLAB_OFF) + warp * 16 * FM_SLAB_LD;\n"
                     "  fm_prologue(in%u, in%u, M, (long long)tm * FM_RT * FM_BM, n0);\n"
                     "  for (int t = 0; t < FM_RT; t++) {\n"
                     "    const long long m0 = ((long long)tm * FM_RT + t) * FM_BM;\n"
                     "    if (m0 >= M) break;\n"
                     "    float acc[FM_MT][FM_NT][4];\n"
                     "    fm_mainloop_rest(acc, in%u, in%u, M, m0, n0);\n"
                     "    /* every warpgroup is done with the stages: the next tile's first k-tiles load\n"
                     "       while this tile's epilogue runs (its slabs are elsewhere) */\n"
                     "    __syncthreads();\n"
                     "    if (t + 1 < FM_RT && m0 + FM_BM < M) fm_prologue(in%u, in%u, M, m0 + FM_BM, n0);\n",
                     gp->ia, gp->ib, gp->ia, gp->ib, gp->ia, gp->ib);
    emit_tile_epilogue(sb, gp, "    ", 0);
    fm_strbuf_append(sb, "  }\n}\n");
    return;
  }
  char opa[16], opb[32];
  snprintf(opa, sizeof opa, tma ? "&fm_tma" : "in%u", gp->ia);
  if (gp->op2 >= 0 && tma) snprintf(opb, sizeof opb, "&fm_tmb, &fm_tmb2");
  else if (gp->op2 >= 0) snprintf(opb, sizeof opb, "in%u, in%u", gp->ib, gp->ib2);
  else snprintf(opb, sizeof opb, tma ? "&fm_tmb" : "in%u", gp->ib);
  fm_strbuf_printf(sb,
                   "  const long long m0 = (long long)tm * FM_BM;\n"
                   "  float acc[FM_MT][FM_NT][4];\n"
                   "  fm_mainloop(acc, %s, %s, M, m0, n0);\n"
                   "  /* every warp is past its last ldmatrix: the stage buffers become the slabs */\n"
                   "  __syncthreads();\n"
                   "  const int lane = threadIdx.x & 31, warp = %s;\n%s"
                   "  const int wm = warp / FM_WN, wn = warp %% FM_WN;\n"
                   "  float *slab = (float *)fm_smem + warp * 16 * FM_SLAB_LD;\n",
                   opa, opb, specialized && !tma ? "(threadIdx.x >> 5) - 4" : "threadIdx.x >> 5",
                   tma           ? "  if (warp >= FM_WM * FM_WN) return;   /* the loader */\n"
                   : specialized ? "  if (warp < 0) return;   /* the loaders */\n"
                                 : "");
  emit_tile_epilogue(sb, gp, "  ", 0);
  fm_strbuf_append(sb, "}\n");
}

void fm_cg_gemm_tiles_meta(fm_kernel_meta *meta, const fm_fragment *canon, const fm_cg_gemm_plan *gp,
                           const char *entry, uint32_t threads, uint32_t smem, uint32_t rows,
                           uint32_t cols) {
  memset(meta, 0, sizeof *meta);
  snprintf(meta->kind, sizeof meta->kind, "gemm");
  snprintf(meta->entry, sizeof meta->entry, "%s", entry);
  meta->block[0] = threads;
  meta->block[1] = meta->block[2] = 1;
  meta->smem = smem;
  snprintf(meta->grid_rule, sizeof meta->grid_rule, "tiles");
  meta->inner = (uint64_t)gp->n;
  meta->items_per_block = rows;
  meta->max_blocks = (uint32_t)((gp->n + cols - 1) / cols);
  meta->outer = gp->m;
  meta->n_inputs = canon->n_inputs;
  meta->n_outputs = canon->n_outputs;
}

/* The TMA mainloop's two tensor maps: A as [M, K] (M = the launch's outer when symbolic)
 * in boxes of 64 x BM, B as [N, K] in boxes of 64 x BN; both K-major (check_wgmma). A
 * leading dim of 0 (a single row, never stepped) becomes K: TMA wants a real stride. */
static void tma_meta(fm_kernel_meta *meta, const fm_cg_gemm_plan *gp, const fm_gemm_config *cfg) {
  const char *dt = gp->dt == FM_DT_BF16 ? "bf16" : "f16";
  fm_meta_tmap *a = &meta->tmaps[0], *b = &meta->tmaps[1];
  meta->n_tmaps = gp->op2 >= 0 ? 3 : 2;
  a->input = gp->ia;
  b->input = gp->ib;
  a->rows = gp->m;   /* -1: outer */
  b->rows = gp->n;
  a->cols = b->cols = (uint64_t)gp->k;
  a->ld = (uint64_t)(gp->lda ? gp->lda : gp->k);
  b->ld = (uint64_t)(gp->ldb ? gp->ldb : gp->k);
  a->box[0] = b->box[0] = 64;
  a->box[1] = cfg->bm;
  b->box[1] = cfg->cluster == 2 ? cfg->bn / 2 : cfg->bn;   /* a pair loads half each */
  a->elem_bytes = b->elem_bytes = 2;
  snprintf(a->dtype, sizeof a->dtype, "%s", dt);
  snprintf(b->dtype, sizeof b->dtype, "%s", dt);
  if (gp->op2 >= 0) {   /* siblings: B and B2 in boxes of half the tile's rows each */
    b->box[1] = cfg->bn / 2;
    meta->tmaps[2] = *b;
    meta->tmaps[2].input = gp->ib2;
  }
}

int fm_codegen_gemm(const fm_fragment *canon, const fm_gemm_config *cfg, uint32_t sm_count,
                    char **src, fm_kernel_meta *meta, fm_diag *d) {
  fm_cg_gemm_plan *gp = NULL;
  fm_strbuf sb;
  int rc;
  if (src) *src = NULL;
  if (!canon || !cfg || !src || !meta) return fm_diag_set(d, FM_EINVAL, "codegen: NULL argument");
  fm_strbuf_init(&sb, MAX_SOURCE);
  gp = malloc(sizeof *gp);
  if (!gp) {
    rc = fm_diag_set(d, FM_ENOMEM, "codegen: out of memory");
    goto out;
  }
  if ((rc = fm_cg_gemm_plan_build(canon, gp, d)) || (rc = check_config(gp, cfg, d))) goto out;
  const fm_gemm_mainloop *ml = mainloop_of(cfg);
  uint32_t smem = smem_bytes(gp, cfg), cap = ml->wgmma ? MAX_SMEM_SM90 : MAX_SMEM;
  if (smem > cap) {
    rc = fm_diag_set(d, FM_EUNSUPPORTED, "config: %u bytes of shared memory exceed %u", smem, cap);
    goto out;
  }
  char entry[FM_META_ENTRY_MAX];
  uint32_t rt = cfg->rtiles > 1 ? cfg->rtiles : 1;
  char tiles[16] = "";
  if (rt > 1) snprintf(tiles, sizeof tiles, "_t%u", rt);
  if (cfg->cluster == 2) snprintf(tiles, sizeof tiles, "_c2");
  snprintf(entry, sizeof entry, "fm_gemm_%ux%ux%u_s%u_w%ux%u_r%u%s%s", cfg->bm, cfg->bn, cfg->bk,
           cfg->stages, cfg->wm, cfg->wn, cfg->raster, ml->suffix, tiles);
  const char *ty = gp->dt == FM_DT_BF16 ? "bf16" : "f16";
  fm_strbuf_printf(&sb, "/* fusemld gemm kernel: %s, A %s-major, B %s-major, %s */\n", entry,
                   gp->a_kmajor ? "row" : "column", gp->b_kmajor ? "column" : "row", ty);
  fm_cg_emit_prelude(&sb, fm_cg_fast_math(canon));
  fm_strbuf_printf(&sb,
                   "#define FM_BM %u\n#define FM_BN %u\n#define FM_BK %u\n#define FM_STAGES %u\n"
                   "#define FM_WM %u\n#define FM_WN %u\n#define FM_RASTER %u\n"
                   "#define FM_K %" PRId64 "\n#define FM_N %" PRId64 "\n"
                   "#define FM_LDA %" PRId64 "LL\n#define FM_LDB %" PRId64 "LL\n"
                   "#define FM_A_KMAJOR %d\n#define FM_B_KMAJOR %d\n",
                   cfg->bm, cfg->bn, cfg->bk, cfg->stages, cfg->wm, cfg->wn, cfg->raster, gp->k,
                   gp->n, gp->lda, gp->ldb, gp->a_kmajor, gp->b_kmajor);
  fm_strbuf_printf(&sb, "#define FM_SCOLS %u\n", slab_cols(cfg));
  if (rt > 1) fm_strbuf_printf(&sb, "#define FM_RT %u\n", rt);
  if (slabs_apart(cfg)) fm_strbuf_printf(&sb, "#define FM_SLAB_OFF %u\n", slab_offset(cfg));
  if (cfg->cluster == 2) fm_strbuf_append(&sb, "#define FM_CLUSTER 2\n");
  if (gp->op2 >= 0) fm_strbuf_append(&sb, "#define FM_SIB 1\n");   /* two products (fm_codegen_gemm.h) */
  fm_strbuf_append(&sb, fm_cg_gemm_cp_async);
  if (ml->wgmma) {
    fm_strbuf_printf(&sb, "#define FM_WG_INFLIGHT %u\n#define FM_WG_SPECIALIZED %d\n#define FM_WG_TMA %d\n"
                     "#define FM_WG_PINGPONG %d\n",
                     ml->inflight, ml->specialized, ml->tma, ml->pingpong);
    fm_cg_gemm_emit_wgmma(&sb, ty, cfg->bn);
    fm_strbuf_append(&sb, fm_cg_wgmma_body);
  } else {
    fm_cg_gemm_emit_mma(&sb, ty);
    fm_strbuf_append(&sb, fm_cg_gemm_body);
  }
  fm_strbuf_append(&sb, fm_cg_gemm_tail);
  if (ml->persistent) fm_strbuf_append(&sb, fm_cg_wgmma_persistent);
  fm_cg_gemm_emit_epilogue(&sb, canon, gp);
  emit_kernel(&sb, canon, gp, entry, ml, cfg->cluster, min_blocks(cfg, smem), rt);
  if ((rc = fm_strbuf_error(&sb))) {
    rc = fm_diag_set(d, rc, "codegen: the kernel source exceeds %u bytes", MAX_SOURCE);
    goto out;
  }
  fm_cg_gemm_tiles_meta(meta, canon, gp, entry,
                        block_threads(cfg),
                        smem, cfg->bm * rt,              /* a block's rows: rt tiles */
                        gp->op2 >= 0 ? cfg->bn / 2 : cfg->bn);   /* siblings: half are B2's */
  if (ml->tma) tma_meta(meta, gp, cfg);
  if (gp->batched) {
    /* grid (column tiles, row tiles of one product, products): M is static, the batch the
       launch's outer when symbolic */
    snprintf(meta->grid_rule, sizeof meta->grid_rule, "batched");
    meta->inner = (uint64_t)gp->m;
    meta->outer = gp->batch;
  }
  if (cfg->cluster == 2) {
    /* grid (2 x column tiles, row-tile pairs): x pairs the cluster's blocks (fm_tile_coords) */
    meta->items_per_block = 2u * cfg->bm;
    meta->max_blocks *= 2u;
  }
  if (ml->persistent) {
    /* blocks stride over ceil(M / rows) x column tiles (a cluster: pairs of row tiles, two
       blocks each); at most the blocks the device holds, an even number for clusters */
    uint32_t sms = sm_count ? sm_count : DEFAULT_SMS;
    snprintf(meta->grid_rule, sizeof meta->grid_rule, "persistent");
    meta->inner = meta->max_blocks;   /* column tiles (twice, for a cluster's two blocks) */
    meta->max_blocks = (cfg->cluster == 2 ? sms & ~1u : sms) * (min_blocks(cfg, smem) > 1 ? 2u : 1u);
  }
  *src = fm_strbuf_take(&sb);
  if (!*src) rc = fm_diag_set(d, FM_ENOMEM, "codegen: out of memory");
out:
  fm_strbuf_free(&sb);
  free(gp);
  return rc;
}
