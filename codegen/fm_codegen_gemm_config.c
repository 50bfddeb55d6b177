/* fm_codegen_gemm_config.c: the gemm template's tuning space: the mainloop table (what each
 * mode is), the configurations offered and in which order, what a config is checked for, and
 * the shared memory, threads and blocks per SM it takes. No CUDA text here. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fm_codegen_gemm.h"

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
    {.bm = 128, .bn = 128, .bk = 32, .stages = 3, .wm = 2, .wn = 4}, /* the first pass's default (60 KiB) */
    {.bm = 128, .bn = 256, .bk = 32, .stages = 3, .wm = 2, .wn = 4}, /* 8 warps of 64x64 (90 KiB) */
    {.bm = 128, .bn = 64, .bk = 32, .stages = 4, .wm = 2, .wn = 2},  /* 4 warps of 64x32 (60 KiB) */
    {.bm = 64, .bn = 128, .bk = 32, .stages = 4, .wm = 2, .wn = 2},  /* 4 warps of 32x64 (60 KiB) */
    /* deeper pipelines and BK 64 for Hopper's latency, grouped rasterisation for L2 */
    {.bm = 128, .bn = 256, .bk = 32, .stages = 4, .wm = 2, .wn = 4, .raster = 8}, /* (120 KiB) */
    {.bm = 128, .bn = 256, .bk = 64, .stages = 2, .wm = 2, .wn = 4, .raster = 8}, /* (108 KiB) */
    {.bm = 256, .bn = 128, .bk = 32, .stages = 4, .wm = 4, .wn = 2, .raster = 8}, /* 8 warps of 64x64 (120 KiB) */
    {.bm = 256, .bn = 128, .bk = 64, .stages = 2, .wm = 4, .wn = 2, .raster = 8}, /* (108 KiB) */
    {.bm = 128, .bn = 128, .bk = 32, .stages = 4, .wm = 2, .wn = 4, .raster = 8}, /* (80 KiB) */
    {.bm = 128, .bn = 128, .bk = 64, .stages = 4, .wm = 2, .wn = 2, .raster = 8}, /* 4 warps of 64x64 (144 KiB) */
    /* skinny and small grids: more, smaller blocks keep every SM busy */
    {.bm = 64, .bn = 128, .bk = 64, .stages = 4, .wm = 2, .wn = 2}, /* (108 KiB) */
    {.bm = 128, .bn = 64, .bk = 64, .stages = 4, .wm = 2, .wn = 2}, /* (108 KiB) */
    {.bm = 32, .bn = 128, .bk = 64, .stages = 4, .wm = 1, .wn = 4}, /* 4 warps of 32x32: M <= 32 (90 KiB) */
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
    {.bm = 128,
     .bn = 256,
     .bk = 64,
     .stages = 4,
     .wm = 8,
     .wn = 1,
     .raster = 8,
     .wgmma = FM_GEMM_WGMMA_TMA,
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
    [FM_GEMM_WGMMA] =
        {.describe = " wgmma", .suffix = "_wgmma", .wgmma = 1, .min_stages = 2, .consumers = 1, .row_tiles = 1},
    [FM_GEMM_WGMMA_INFLIGHT] = {.describe = " wgmma inflight=1",
                                .suffix = "_wgmma_i1",
                                .wgmma = 1,
                                .inflight = 1,
                                .min_stages = 3,
                                .consumers = 1,
                                .row_tiles = 1},
    [FM_GEMM_WGMMA_WS] = {.describe = " wgmma ws",
                          .suffix = "_wgmma_ws",
                          .wgmma = 1,
                          .inflight = 1,
                          .min_stages = 2,
                          .specialized = 1,
                          .loader_threads = 128,
                          .consumers = 1},
    [FM_GEMM_WGMMA_TMA] = {.describe = " wgmma tma",
                           .suffix = "_wgmma_tma",
                           .wgmma = 1,
                           .inflight = 1,
                           .min_stages = 2,
                           .specialized = 1,
                           .loader_threads = 32,
                           .tma = 1,
                           .consumers = 1,
                           .cluster_pair = 1,
                           .siblings = 1},
    [FM_GEMM_WGMMA_PERSISTENT] = {.describe = " wgmma tma persistent",
                                  .suffix = "_wgmma_tmap",
                                  .wgmma = 1,
                                  .inflight = 1,
                                  .min_stages = 2,
                                  .specialized = 1,
                                  .loader_threads = 32,
                                  .tma = 1,
                                  .persistent = 1,
                                  .consumers = 1,
                                  .cluster_pair = 1,
                                  .siblings = 1},
    [FM_GEMM_WGMMA_PINGPONG] = {.describe = " wgmma tma pingpong",
                                .suffix = "_wgmma_pp",
                                .wgmma = 1,
                                .inflight = 1,
                                .min_stages = 2,
                                .specialized = 1,
                                .loader_threads = 32,
                                .tma = 1,
                                .persistent = 1,
                                .pingpong = 1,
                                .consumers = 2,
                                .siblings = 1},
};

const fm_gemm_mainloop *fm_cg_gemm_mainloop(uint32_t mode) { return mode < FM_GEMM_MODES ? &mainloops[mode] : NULL; }

/* The mainloop of a config check_config accepted (its mode is in the table). */
const fm_gemm_mainloop *fm_cg_gemm_mainloop_of(const fm_gemm_config *c) { return &mainloops[c->wgmma]; }

static int check_wgmma(const fm_cg_gemm_plan *gp, const fm_gemm_config *c, fm_diag *d) {
  const fm_gemm_mainloop *ml = fm_cg_gemm_mainloop_of(c);
  if (!gp->a_kmajor || !gp->b_kmajor)
    return fm_diag_set(d, FM_EUNSUPPORTED, "config: the wgmma mainloop needs K-major A and B");
  /* ping-pong: each of the two consumer warpgroups (4 warps) owns a whole tile, its
     accumulators (BM / 64) x BN / 2 a thread */
  if (ml->pingpong &&
      (c->bk != 64 || c->wn != 1 || c->wm != 4 || (c->bm != 64 && c->bm != 128) || c->bm / 64 * c->bn > 256))
    return fm_diag_set(d, FM_EINVAL,
                       "config: ping-pong wgmma takes BK 64, 4 x 1 warps, BM 64 or 128, (BM/64) x BN <= 256");
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

/* Siblings: each warp's columns split in two halves of whole 8-column groups, staged in one
 * pass; loaded through pointers by the sm_80 mainloop or through a second tensor map by the
 * TMA forms (not the cp.async wgmma forms, row tiles or clusters). */
static int check_siblings(const fm_gemm_config *c, fm_diag *d) {
  uint32_t wcols = c->bn / c->wn;
  if (!fm_cg_gemm_mainloop_of(c)->siblings || c->rtiles > 1 || c->cluster > 1)
    return fm_diag_set(d, FM_EUNSUPPORTED, "config: sibling products take the sm_80 or the TMA mainloop");
  if (wcols % 16 || fm_cg_gemm_slab_cols(c) != wcols)
    return fm_diag_set(d, FM_EUNSUPPORTED,
                       "config: sibling products need a warp's %u columns in halves of 8-column groups, "
                       "staged at once",
                       wcols);
  return FM_OK;
}

int fm_cg_gemm_check_config(const fm_cg_gemm_plan *gp, const fm_gemm_config *c, fm_diag *d) {
  int rc;
  /* first, so that every check below may ask the mainloop for its properties */
  if (!fm_cg_gemm_mainloop(c->wgmma))
    return fm_diag_set(d, FM_EINVAL, "config: wgmma mode %u (0..%u)", c->wgmma, FM_GEMM_MODES - 1u);
  if (gp->op2 >= 0 && (rc = check_siblings(c, d))) return rc;
  if (gp->batched && fm_cg_gemm_mainloop_of(c)->tma)
    return fm_diag_set(d, FM_EUNSUPPORTED, "config: a tensor map addresses one matrix, not a batch (bmm)");
  if (fm_cg_gemm_mainloop_of(c)->wgmma) return check_wgmma(gp, c, d);
  if (c->wm < 1 || c->wn < 1 || c->wm * c->wn > 16)
    return fm_diag_set(d, FM_EINVAL, "config: %ux%u warps (1..16 in all)", c->wm, c->wn);
  if (c->bm < 16 || c->bm > 256 || c->bm % (16 * c->wm))
    return fm_diag_set(d, FM_EINVAL, "config: BM %u is not a multiple of 16 x %u warps (<= 256)", c->bm, c->wm);
  if (c->bn < 16 || c->bn > 256 || c->bn % (16 * c->wn))
    return fm_diag_set(d, FM_EINVAL, "config: BN %u is not a multiple of 16 x %u warps (<= 256)", c->bn, c->wn);
  if (c->bk < 16 || c->bk > 128 || c->bk % 16)
    return fm_diag_set(d, FM_EINVAL, "config: BK %u is not a multiple of 16 in 16..128", c->bk);
  if (c->stages < 2 || c->stages > 4) return fm_diag_set(d, FM_EINVAL, "config: %u stages (2..4)", c->stages);
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
  return fm_cg_gemm_mainloop_of(c)->consumers * c->wm * c->wn * 16u * (scols + 8u) * 4u; /* ping-pong: two warpgroups */
}

/* Whether the slabs sit beside the stages rather than in them: the next tile loads during
 * the epilogue (several row tiles per block; the persistent forms). */
int fm_cg_gemm_slabs_apart(const fm_gemm_config *c) { return c->rtiles > 1 || fm_cg_gemm_mainloop_of(c)->persistent; }

/* The wgmma stages (1 KiB of slack to align them for the swizzle) and, for the
 * warp-specialised forms, their two mbarriers each. */
static uint32_t wgmma_stage_bytes(const fm_gemm_config *c) {
  return c->stages * (c->bm + c->bn) * 128u + 1024u + (fm_cg_gemm_mainloop_of(c)->specialized ? 16u * c->stages : 0u);
}

/* Where the slabs start in the dynamic shared memory (bytes). */
uint32_t fm_cg_gemm_slab_offset(const fm_gemm_config *c) {
  return fm_cg_gemm_slabs_apart(c) ? wgmma_stage_bytes(c) : 0u;
}

/* The slabs' columns: a warp's whole width, except where the slabs sit beside the stages:
 * the widest of the whole, a half, a quarter or an eighth (more passes) that fits, in
 * multiples of 32 columns (the swizzle's unit). */
uint32_t fm_cg_gemm_slab_cols(const fm_gemm_config *c) {
  uint32_t w = c->bn / c->wn;
  if (!fm_cg_gemm_slabs_apart(c)) return w;
  for (uint32_t part = 1; part <= 8; part *= 2)
    if ((w / part) % 32 == 0 && w % part == 0 &&
        fm_cg_gemm_slab_offset(c) + slab_bytes(c, w / part) <= FM_CG_GEMM_SMEM_SM90)
      return w / part;
  return w; /* too large either way: smem_bytes says so */
}

uint32_t fm_cg_gemm_smem_bytes(const fm_cg_gemm_plan *gp, const fm_gemm_config *c) {
  if (fm_cg_gemm_mainloop_of(c)->wgmma) {
    /* the stages, or the slabs if larger where they reuse them */
    uint32_t mainloop = wgmma_stage_bytes(c);
    uint32_t staging = slab_bytes(c, fm_cg_gemm_slab_cols(c));
    if (fm_cg_gemm_slabs_apart(c)) return fm_cg_gemm_slab_offset(c) + staging;
    return mainloop > staging ? mainloop : staging;
  }
  uint32_t a = gp->a_kmajor ? c->bm * (c->bk + 8) : c->bk * (c->bm + 8);
  uint32_t b = gp->b_kmajor ? c->bn * (c->bk + 8) : c->bk * (c->bn + 8);
  uint32_t mainloop = c->stages * (a + b) * 2u;
  /* the epilogue's staging slabs reuse the stage buffers: 16 rows per warp */
  uint32_t staging = slab_bytes(c, fm_cg_gemm_slab_cols(c));
  return mainloop > staging ? mainloop : staging;
}

uint32_t fm_codegen_gemm_smem(const fm_fragment *canon, const fm_gemm_config *cfg) {
  fm_cg_gemm_plan *gp = malloc(sizeof *gp);
  uint32_t bytes = 0;
  if (gp && canon && cfg && !fm_cg_gemm_plan_build(canon, gp, NULL) && !fm_cg_gemm_check_config(gp, cfg, NULL))
    bytes = fm_cg_gemm_smem_bytes(gp, cfg);
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
    uint32_t r = mm->op == FM_OP_BMM ? 3 : 2; /* bmm: [Bt, M, K] @ [Bt, K, N] */
    if (ia >= 0 && ib >= 0 && canon->inputs[ia].rank == r && canon->inputs[ib].rank == r) {
      m = canon->inputs[ia].shape[r - 2];
      n = canon->inputs[ib].shape[r - 1];
      if (r == 3) batch = canon->outputs[0].shape[0]; /* -1: symbolic, assumed large */
    }
  }
  if (m > 0 && m <= 16) return configs[2];
  if (m > 0 && batch > 0 && ((m + 127) / 128) * ((n + 127) / 128) * batch < (int64_t)FM_CG_GEMM_DEFAULT_SMS)
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
    if (!fm_cg_gemm_check_config(gp, c, NULL) && fm_cg_gemm_smem_bytes(gp, c) <= FM_CG_GEMM_SMEM_SM90 &&
        (gp->m < 0 || rows < 4 * m_eff))
      out[n++] = *c;
  }
  for (size_t i = 0; i < N_CONFIGS && n < max; i++)
    if (!fm_cg_gemm_check_config(gp, &configs[i], NULL) &&
        fm_cg_gemm_smem_bytes(gp, &configs[i]) <= FM_CG_GEMM_SMEM_SM80 &&
        (gp->m < 0 || (int64_t)configs[i].bm < 4 * m_eff))
      out[n++] = configs[i];
done:
  free(gp);
  return n;
}

/* The block: the MMA warps, plus the loaders of the warp-specialised forms (a warpgroup; one
 * warp for TMA). */
uint32_t fm_cg_gemm_block_threads(const fm_gemm_config *c) {
  return fm_cg_gemm_mainloop_of(c)->consumers * c->wm * c->wn * 32 + fm_cg_gemm_mainloop_of(c)->loader_threads;
}

/* Two blocks per SM when the shared memory allows it (sm_90's 227 KiB) and the accumulators
 * are few (64 a thread): the mainloop then needs about 128 registers, and a fused epilogue
 * that pushed it to 130 would silently halve the blocks per SM (measured: 128x128x64, 3
 * stages, 2x4 warps went from 0.459 to 0.640 ms at 4096^3). Larger accumulator sets keep
 * their registers: a cap would spill them. */
uint32_t fm_cg_gemm_min_blocks(const fm_gemm_config *c, uint32_t smem) {
  uint32_t acc = (c->bm / c->wm) * (c->bn / c->wn) / 32;
  return acc <= 64 && fm_cg_gemm_block_threads(c) <= 288 && 2 * (smem + 1024) <= FM_CG_GEMM_SMEM_SM90 + 1024 ? 2 : 0;
}
