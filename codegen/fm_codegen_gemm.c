/* fm_codegen_gemm.c: the gemm template's kernel: a GEMM fragment + a config -> the source
 * (the prelude, the configuration as macros, the mainloop of the config's mode:
 * cuda/gemm_body.cuh or the cuda/wgmma_*.cuh texts, the generated epilogue,
 * fm_codegen_gemm_epilogue.c) and its launch metadata (grid rule, tensor maps, clusters).
 * The plan is fm_codegen_gemm_plan.c's, the tuning space fm_codegen_gemm_config.c's. Values
 * are named by position (inputs, then ops), never by the client's ids. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fm_codegen_gemm.h"

#define MAX_SOURCE (1u << 20)

/* fm_mma(): one mma.sync m16n8k16 (row.col, fp32 accumulators) on ty ("bf16" or "f16"). */
void fm_cg_gemm_emit_mma(fm_strbuf *sb, const char *ty) {
  fm_strbuf_printf(
      sb,
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
    fm_strbuf_printf(sb,
                     "    long long outer, const __grid_constant__ fm_tmap fm_tma,\n"
                     "    const __grid_constant__ fm_tmap fm_tmb%s) {\n",
                     gp->op2 >= 0 ? ", const __grid_constant__ fm_tmap fm_tmb2" : "");
  else if (scratch_ty && gp->op2 >= 0) /* siblings' plan: both products */
    fm_strbuf_printf(sb,
                     "    long long outer, const %s *__restrict__ fm_scratch,\n"
                     "    const %s *__restrict__ fm_scratch2) {\n",
                     scratch_ty, scratch_ty);
  else if (scratch_ty)
    fm_strbuf_printf(sb, "    long long outer, const %s *__restrict__ fm_scratch) {\n", scratch_ty);
  else
    fm_strbuf_append(sb, "    long long outer) {\n");
  if (gp->m < 0)
    fm_strbuf_append(sb, "  const long long M = outer;\n");
  else
    fm_strbuf_printf(sb, "  const long long M = %" PRId64 "LL;\n  (void)outer;\n", gp->m);
  if (!gp->batched) return;
  /* bmm: blockIdx.z is this block's product; every tensor moves to it (a broadcast one,
     batch stride 0, stays), and the rest of the kernel is that of one GEMM */
  fm_strbuf_append(sb, "  const long long fm_z = blockIdx.z;\n");
  for (uint32_t k = 0; k < p->n_in + p->n_out; k++) {
    if (!gp->ez[k] || (k < p->n_in && !gp->used[k] && k != gp->ia && k != gp->ib)) continue;
    fm_strbuf_printf(sb, "  %s%u += fm_z * %" PRId64 "LL;\n", k < p->n_in ? "in" : "out", k < p->n_in ? k : k - p->n_in,
                     gp->ez[k]);
  }
}

void fm_cg_gemm_emit_kernel_open(fm_strbuf *sb, const fm_fragment *f, const fm_cg_gemm_plan *gp, const char *entry) {
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
    fm_strbuf_append(
        sb,
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
    if (pingpong && gp->op2 < 0) { /* (the siblings' epilogue takes no preloaded bias) */
      /* a lane's 8 columns of each bias, read before the mainloop: loaded just before their first
       use in the epilogue they were 3% of the kernel's stall samples (ncu, 16384 x 1024 x
       256); the epilogue's one pass keeps a lane on these columns */
      fm_strbuf_append(sb, "#if FM_EPI_PRELOAD\n");
      for (uint32_t k = 0; k < gp->base.n_in; k++)
        if (fm_cg_gemm_row_vector16(gp, k))
          fm_strbuf_printf(
              sb,
              "    const uint4 pre%u = n0 + FM_BN <= FM_N   /* used by whole tiles only: past N, read nothing */\n"
              "        ? fm_ld_nc16(in%u + n0 + wn * FM_WCOLS + lane %% (FM_SCOLS / 8) * 8) : make_uint4(0u, 0u, 0u, 0u);\n",
              k, k);
      fm_strbuf_append(sb, "#endif\n");
    }
    fm_strbuf_append(sb,
                     "    fm_turn_wait(j);\n"
                     "    fm_mainloop_tile(acc, it);\n"
                     "    fm_turn_pass(j, u + FM_UNIT_STRIDE < units);\n");
    fm_cg_gemm_emit_tile_epilogue(sb, gp, "    ", pingpong);
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
    fm_cg_gemm_emit_tile_epilogue(sb, gp, "    ", 0);
    fm_strbuf_append(sb, "  }\n}\n");
    return;
  }
  char opa[16], opb[32];
  snprintf(opa, sizeof opa, tma ? "&fm_tma" : "in%u", gp->ia);
  if (gp->op2 >= 0 && tma)
    snprintf(opb, sizeof opb, "&fm_tmb, &fm_tmb2");
  else if (gp->op2 >= 0)
    snprintf(opb, sizeof opb, "in%u, in%u", gp->ib, gp->ib2);
  else
    snprintf(opb, sizeof opb, tma ? "&fm_tmb" : "in%u", gp->ib);
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
  fm_cg_gemm_emit_tile_epilogue(sb, gp, "  ", 0);
  fm_strbuf_append(sb, "}\n");
}

void fm_cg_gemm_tiles_meta(fm_kernel_meta *meta, const fm_fragment *canon, const fm_cg_gemm_plan *gp, const char *entry,
                           uint32_t threads, uint32_t smem, uint32_t rows, uint32_t cols) {
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
  a->rows = gp->m; /* -1: outer */
  b->rows = gp->n;
  a->cols = b->cols = (uint64_t)gp->k;
  a->ld = (uint64_t)(gp->lda ? gp->lda : gp->k);
  b->ld = (uint64_t)(gp->ldb ? gp->ldb : gp->k);
  a->box[0] = b->box[0] = 64;
  a->box[1] = cfg->bm;
  b->box[1] = cfg->cluster == 2 ? cfg->bn / 2 : cfg->bn; /* a pair loads half each */
  a->elem_bytes = b->elem_bytes = 2;
  snprintf(a->dtype, sizeof a->dtype, "%s", dt);
  snprintf(b->dtype, sizeof b->dtype, "%s", dt);
  if (gp->op2 >= 0) { /* siblings: B and B2 in boxes of half the tile's rows each */
    b->box[1] = cfg->bn / 2;
    meta->tmaps[2] = *b;
    meta->tmaps[2].input = gp->ib2;
  }
}

int fm_codegen_gemm(const fm_fragment *canon, const fm_gemm_config *cfg, uint32_t sm_count, char **src,
                    fm_kernel_meta *meta, fm_diag *d) {
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
  if ((rc = fm_cg_gemm_plan_build(canon, gp, d)) || (rc = fm_cg_gemm_check_config(gp, cfg, d))) goto out;
  const fm_gemm_mainloop *ml = fm_cg_gemm_mainloop_of(cfg);
  uint32_t smem = fm_cg_gemm_smem_bytes(gp, cfg), cap = ml->wgmma ? FM_CG_GEMM_SMEM_SM90 : FM_CG_GEMM_SMEM_SM80;
  if (smem > cap) {
    rc = fm_diag_set(d, FM_EUNSUPPORTED, "config: %u bytes of shared memory exceed %u", smem, cap);
    goto out;
  }
  char entry[FM_META_ENTRY_MAX];
  uint32_t rt = cfg->rtiles > 1 ? cfg->rtiles : 1;
  char tiles[16] = "";
  if (rt > 1) snprintf(tiles, sizeof tiles, "_t%u", rt);
  if (cfg->cluster == 2) snprintf(tiles, sizeof tiles, "_c2");
  snprintf(entry, sizeof entry, "fm_gemm_%ux%ux%u_s%u_w%ux%u_r%u%s%s", cfg->bm, cfg->bn, cfg->bk, cfg->stages, cfg->wm,
           cfg->wn, cfg->raster, ml->suffix, tiles);
  const char *ty = gp->dt == FM_DT_BF16 ? "bf16" : "f16";
  fm_strbuf_printf(&sb, "/* fusemld gemm kernel: %s, A %s-major, B %s-major, %s */\n", entry,
                   gp->a_kmajor ? "row" : "column", gp->b_kmajor ? "column" : "row", ty);
  fm_cg_emit_prelude(&sb, fm_cg_fast_math(canon));
  fm_strbuf_printf(&sb,
                   "#define FM_BM %u\n#define FM_BN %u\n#define FM_BK %u\n#define FM_STAGES %u\n"
                   "#define FM_WM %u\n#define FM_WN %u\n#define FM_RASTER %u\n"
                   "#define FM_K %" PRId64 "\n#define FM_N %" PRId64
                   "\n"
                   "#define FM_LDA %" PRId64 "LL\n#define FM_LDB %" PRId64
                   "LL\n"
                   "#define FM_A_KMAJOR %d\n#define FM_B_KMAJOR %d\n",
                   cfg->bm, cfg->bn, cfg->bk, cfg->stages, cfg->wm, cfg->wn, cfg->raster, gp->k, gp->n, gp->lda,
                   gp->ldb, gp->a_kmajor, gp->b_kmajor);
  fm_strbuf_printf(&sb, "#define FM_SCOLS %u\n", fm_cg_gemm_slab_cols(cfg));
  if (rt > 1) fm_strbuf_printf(&sb, "#define FM_RT %u\n", rt);
  if (fm_cg_gemm_slabs_apart(cfg)) fm_strbuf_printf(&sb, "#define FM_SLAB_OFF %u\n", fm_cg_gemm_slab_offset(cfg));
  if (cfg->cluster == 2) fm_strbuf_append(&sb, "#define FM_CLUSTER 2\n");
  if (gp->op2 >= 0) fm_strbuf_append(&sb, "#define FM_SIB 1\n"); /* two products (fm_codegen_gemm.h) */
  fm_strbuf_append(&sb, fm_cg_gemm_cp_async);
  if (ml->wgmma) {
    fm_strbuf_printf(&sb,
                     "#define FM_WG_INFLIGHT %u\n#define FM_WG_SPECIALIZED %d\n#define FM_WG_TMA %d\n"
                     "#define FM_WG_PINGPONG %d\n",
                     ml->inflight, ml->specialized, ml->tma, ml->pingpong);
    fm_cg_gemm_emit_wgmma(&sb, ty, cfg->bn);
    fm_strbuf_append(&sb, fm_cg_sm90);
    fm_strbuf_append(&sb, fm_cg_wgmma_head);
    fm_strbuf_append(&sb, fm_cg_wgmma_ops);
    fm_strbuf_append(&sb, fm_cg_wgmma_body);
  } else {
    fm_cg_gemm_emit_mma(&sb, ty);
    fm_strbuf_append(&sb, fm_cg_gemm_body);
  }
  fm_strbuf_append(&sb, fm_cg_gemm_tail);
  if (ml->persistent) fm_strbuf_append(&sb, fm_cg_wgmma_persistent);
  fm_cg_gemm_emit_epilogue(&sb, canon, gp);
  emit_kernel(&sb, canon, gp, entry, ml, cfg->cluster, fm_cg_gemm_min_blocks(cfg, smem), rt);
  if ((rc = fm_strbuf_error(&sb))) {
    rc = fm_diag_set(d, rc, "codegen: the kernel source exceeds %u bytes", MAX_SOURCE);
    goto out;
  }
  fm_cg_gemm_tiles_meta(meta, canon, gp, entry, fm_cg_gemm_block_threads(cfg), smem,
                        cfg->bm * rt,                          /* a block's rows: rt tiles */
                        gp->op2 >= 0 ? cfg->bn / 2 : cfg->bn); /* siblings: half are B2's */
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
    uint32_t sms = sm_count ? sm_count : FM_CG_GEMM_DEFAULT_SMS;
    snprintf(meta->grid_rule, sizeof meta->grid_rule, "persistent");
    meta->inner = meta->max_blocks; /* column tiles (twice, for a cluster's two blocks) */
    meta->max_blocks = (cfg->cluster == 2 ? sms & ~1u : sms) * (fm_cg_gemm_min_blocks(cfg, smem) > 1 ? 2u : 1u);
  }
  *src = fm_strbuf_take(&sb);
  if (!*src) rc = fm_diag_set(d, FM_ENOMEM, "codegen: out of memory");
out:
  fm_strbuf_free(&sb);
  free(gp);
  return rc;
}
