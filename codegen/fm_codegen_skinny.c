/* fm_codegen_skinny.c: the skinny template: a GEMM fragment with a small M (decode: x
 * [M, K] @ W.t() with M <= 32) is pure weight streaming, so the kernel's only job is to read
 * W once at copy speed. The gemm template stages BM x BN x BK tiles through shared memory;
 * here each warp streams its rows of W with 16-byte accesses that bypass L1 (into registers,
 * or through a warp-private cp.async ring), several 64-wide K chunks per step, and
 * multiplies with mma.sync m16n8k16. Why tensor cores: 16 rows x 2 flops per 2-byte weight
 * at ~3 TB/s is 48 TFLOP/s of fp32 FMA, ~70% of an H100's FMA issue rate before the
 * bf16 -> fp32 conversions and address arithmetic; one mma does 16 x 8 x 16 of them.
 *
 * The K permutation: a dot product over K may sum in any order as long as x and W agree. In
 * the mma's fragments thread (g = lane / 4, q = lane % 4) holds, for k-step s, the k-pairs
 * q and q + 4 of a 16-wide slice. Thread q instead loads the 8 elements 8q .. 8q+7 and the
 * 8 elements 32+8q .. 32+8q+7 of a 64-wide chunk (pairs i = 0..3 and 4..7), and uses pairs
 * 2s and 2s+1 as its logical pairs q and q + 4 of step s. Where a logical k lands depends
 * only on (s, its pair), so x (rows g and g + 8) and W (row g of the n-tile) agree; the 4
 * lanes of a row read 64 contiguous bytes (two whole 32-byte sectors) per load instruction.
 *
 * A block owns FM_BN columns and 16 rows (grid rule "tiles": grid.y = ceil(M / 16)); its
 * warps take K chunks round-robin (neighbouring warps read neighbouring pieces of each row
 * at about the same time), the partial sums meet in static shared memory, and the gemm
 * template's generated epilogue (fm_cg_gemm_emit_epilogue) stores every output once.
 * No workspace: enough columns per SM come from N alone at decode widths (N / 8 >= 512 blocks
 * for N >= 4096). A split form (sm_90, fm_skinny_config.split) runs a cluster of 2 or 4
 * blocks per column block, each taking every split-th warp's share of K's chunks, and adds
 * their partial sums through distributed shared memory, in rank and warp order
 * (deterministic), before the one epilogue: built for where N gives too few warps to keep W
 * in flight (ncu at 8 x 4096 x 11008: 512 blocks of 8 warps, 47% occupancy, 68% of DRAM
 * bandwidth), it did not read W faster (bench/NOTES.md, "Split-K skinny"), so no candidate
 * uses it. Values are named by position, never by client ids. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fm_codegen_gemm.h"

#define MAX_SOURCE    (1u << 20)
#define ROWS          16u /* rows of x per block: the mma's M */
/* Candidates and the default up to this M (bucket): at 32 rows (two row tiles, W read twice)
 * the default still took 0.029 ms at 32 x 4096 x 4096 against 0.033 ms for the gemm
 * template's best (0.077 ms its symbolic default); beyond, W's reads multiply. */
#define MAX_ROWS      32
/* Load registers per thread per step: unroll x (W: cols / 8 x 8, twice when prefetched in
 * registers, + x: 16); beyond 128 the kernel spills or runs at a quarter of the SM's warps. */
#define MAX_LOAD_REGS 128u
/* A cp.async ring beyond this leaves too few blocks per SM for one wave at N = 4096. */
#define MAX_RING      (64u * 1024u)

/* The candidates, the default first. Measured on an H100 (two runs, bench/gemm_bench at
 * M = 1, 8, 16, 32 with N, K of 4096 and 11008, and the tuner at M = 8): 8 warps of 8
 * columns, 4 chunks a step, was best or within ~10% everywhere; more columns per block
 * (each x chunk reused for more W rows) won at N = 11008 and lost at N = 4096 (too few
 * blocks).
 * pipe 0: each step's loads then its math (ptxas sinks each load to its first use, so
 * occupancy, not unrolling, keeps W in flight); 1: the next step's W prefetched into
 * registers; 2..4: a warp-private cp.async ring of that many steps (never best, within
 * ~10% at 1 and 32 rows; two kept so the path stays verified). Dropped after the runs:
 * 16 warps of 8 columns and four more ring shapes, slower than another everywhere. */
static const fm_skinny_config configs[] = {
    {.cols = 8, .warps = 8, .unroll = 4, .pipe = 0},
    {.cols = 16, .warps = 8, .unroll = 1, .pipe = 1},
    {.cols = 8, .warps = 8, .unroll = 2, .pipe = 1},
    {.cols = 8, .warps = 4, .unroll = 4, .pipe = 0},
    {.cols = 16, .warps = 4, .unroll = 2, .pipe = 1},
    {.cols = 32, .warps = 4, .unroll = 1, .pipe = 1},
    {.cols = 24, .warps = 4, .unroll = 2, .pipe = 1},
    {.cols = 16, .warps = 8, .unroll = 1, .pipe = 3}, /* 48 KiB ring */
    {.cols = 8, .warps = 8, .unroll = 1, .pipe = 4},  /* 32 KiB ring */
    /* The split form (2 or 4 blocks of a cluster along K) is supported but offered nowhere:
       correct (the decode suite with three split candidates, 428/428) and at best level with
       these (8 x 4096 x 11008: 0.0429-0.0435 ms against 0.0425-0.0438), slower at 8 x 11008
       x 4096 and at M = 1..32, 4096 x 4096 (bench/NOTES.md, "Split-K skinny"). */
};
#define N_CONFIGS (sizeof configs / sizeof configs[0])

/* The cp.async ring (pipe >= 2): 1 KiB per chunk of 8 W rows, per stage, per warp. */
static uint32_t ring_bytes(const fm_skinny_config *c) {
  return c->pipe >= 2 ? c->warps * c->pipe * c->unroll * (c->cols / 8) * 1024u : 0;
}

/* Dynamic shared memory: the ring, which the cross-warp sum (16 rows of cols + 4 floats per
 * warp) reuses; none without a ring (the sum is static shared memory, < 48 KiB). */
static uint32_t smem_bytes(const fm_skinny_config *c) {
  uint32_t red = c->warps * 16u * (c->cols + 4u) * 4u;
  return c->pipe >= 2 ? (ring_bytes(c) > red ? ring_bytes(c) : red) : 0;
}

static int check_config(const fm_skinny_config *c, fm_diag *d) {
  if (c->cols < 8 || c->cols > 32 || c->cols % 8)
    return fm_diag_set(d, FM_EINVAL, "config: %u columns per block (8, 16, 24 or 32)", c->cols);
  if (c->warps < 1 || c->warps > 16) return fm_diag_set(d, FM_EINVAL, "config: %u warps (1..16)", c->warps);
  if (c->unroll < 1 || c->unroll > 8) return fm_diag_set(d, FM_EINVAL, "config: unroll %u (1..8)", c->unroll);
  if (c->pipe > 4) return fm_diag_set(d, FM_EINVAL, "config: pipe %u (0..4)", c->pipe);
  if (c->split > 1 && c->split != 2 && c->split != 4)
    return fm_diag_set(d, FM_EINVAL, "config: split %u (1, 2 or 4 blocks along K)", c->split);
  uint32_t regs = c->unroll * (c->cols * (c->pipe == 1 ? 2 : 1) + 16);
  if (regs > MAX_LOAD_REGS)
    return fm_diag_set(d, FM_EINVAL, "config: %u load registers per thread exceed %u", regs, MAX_LOAD_REGS);
  if (ring_bytes(c) > MAX_RING)
    return fm_diag_set(d, FM_EINVAL, "config: a %u-byte cp.async ring exceeds %u", ring_bytes(c), MAX_RING);
  return FM_OK;
}

/* The plan, and FM_EUNSUPPORTED unless both operands are K-major (the 16-byte loads run
 * along K). */
static int plan(const fm_fragment *canon, fm_cg_gemm_plan *gp, fm_diag *d) {
  int rc = fm_cg_gemm_plan_build(canon, gp, d);
  if (rc) return rc;
  if (gp->batched || gp->op2 >= 0)
    return fm_diag_set(d, FM_EUNSUPPORTED, "the skinny template runs one product (not a batch, not siblings)");
  if (!gp->a_kmajor || !gp->b_kmajor)
    return fm_diag_set(d, FM_EUNSUPPORTED, "the skinny template needs K-major A and B (x [M, K] @ W.t(), nn.Linear)");
  return FM_OK;
}

int64_t fm_codegen_skinny_rows(const fm_fragment *canon) {
  fm_cg_gemm_plan *gp = malloc(sizeof *gp);
  int64_t m = 0;
  if (gp && canon && !plan(canon, gp, NULL)) m = gp->m >= 0 ? gp->m : (int64_t)canon->m_hint;
  free(gp);
  return m;
}

int fm_codegen_skinny_preferred(const fm_fragment *canon) {
  int64_t m = fm_codegen_skinny_rows(canon);
  return m >= 1 && m <= MAX_ROWS;
}

fm_skinny_config fm_codegen_skinny_default(const fm_fragment *canon) {
  (void)canon; /* one configuration was best or close at every decode shape measured */
  return configs[0];
}

size_t fm_codegen_skinny_candidates(const fm_fragment *canon, fm_skinny_config *out, size_t max) {
  int64_t m = fm_codegen_skinny_rows(canon);
  size_t n = 0;
  if (!out || m < 1 || m > MAX_ROWS) return 0;
  fm_skinny_config def = fm_codegen_skinny_default(canon);
  if (n < max) out[n++] = def;
  for (size_t i = 0; i < N_CONFIGS && n < max; i++)
    if (memcmp(&configs[i], &def, sizeof def) != 0) out[n++] = configs[i];
  return n;
}

static void emit_kernel(fm_strbuf *sb, const fm_fragment *f, const fm_cg_gemm_plan *gp, const char *entry,
                        uint32_t split) {
  fm_cg_gemm_emit_kernel_open_cluster(sb, f, gp, entry, split);
  fm_strbuf_printf(
      sb,
      "#if FM_PIPE >= 2\n"
      "  /* the partial sums reuse the drained ring: one dynamic allocation, so a\n"
      "     launch needs no shared memory beyond the metadata's smem */\n"
      "  float *red = (float *)fm_ring;\n"
      "#else\n"
      "  __shared__ __align__(16) float red[FM_WARPS * 16 * FM_RED_LD];\n"
      "#endif\n"
      "  const long long m0 = (long long)blockIdx.y * 16;\n"
      "  const int n0 = (int)(blockIdx.x / FM_SPLIT) * FM_BN;   /* a split's blocks share it */\n"
      "  float acc[FM_NT][4];\n"
      "  fm_skinny_mainloop(acc, in%u, in%u, M, m0, n0);\n"
      "#if FM_PIPE >= 2\n"
      "  __syncthreads();   /* every warp is done with its part of the ring */\n"
      "#endif\n"
      "  fm_skinny_stage(red, acc);\n"
      "#if FM_SPLIT > 1\n"
      "  fm_cluster_sync();\n"
      "#else\n"
      "  __syncthreads();\n"
      "#endif\n"
      "  /* one thread per (row, 8 columns), spread over the split's blocks: the sum over\n"
      "     blocks and warps, then the epilogue */\n"
      "  for (int t = threadIdx.x + fm_krank() * FM_THREADS; t < 16 * FM_NT; t += FM_THREADS * FM_SPLIT) {\n"
      "    const int r = t / FM_NT, c = t %% FM_NT * 8;\n"
      "    const long long m = m0 + r;\n"
      "    const long long n = n0 + c;\n"
      "    if (m >= M || n >= FM_N) continue;\n"
      "    float v[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};\n"
      "    for (int b = 0; b < FM_SPLIT; b++)\n"
      "#pragma unroll\n"
      "      for (int w = 0; w < FM_WARPS; w++) {\n"
      "        const float4 lo = fm_red4(red, b, (w * 16 + r) * FM_RED_LD + c);\n"
      "        const float4 hi = fm_red4(red, b, (w * 16 + r) * FM_RED_LD + c + 4);\n"
      "        v[0] += lo.x, v[1] += lo.y, v[2] += lo.z, v[3] += lo.w;\n"
      "        v[4] += hi.x, v[5] += hi.y, v[6] += hi.z, v[7] += hi.w;\n"
      "      }\n"
      "    fm_epilogue(v, m, n",
      gp->ia, gp->ib);
  fm_cg_gemm_emit_epi_params(sb, gp, 0);
  fm_strbuf_append(sb,
                   ");\n  }\n"
                   "#if FM_SPLIT > 1\n"
                   "  fm_cluster_sync();\n"
                   "#endif\n"
                   "}\n");
}

int fm_codegen_skinny(const fm_fragment *canon, const fm_skinny_config *cfg, uint32_t sm_count, char **src,
                      fm_kernel_meta *meta, fm_diag *d) {
  fm_cg_gemm_plan *gp = NULL;
  fm_strbuf sb;
  int rc;
  (void)sm_count; /* the grid is the column count; nothing to cap */
  if (src) *src = NULL;
  if (!canon || !cfg || !src || !meta) return fm_diag_set(d, FM_EINVAL, "codegen: NULL argument");
  fm_strbuf_init(&sb, MAX_SOURCE);
  gp = malloc(sizeof *gp);
  if (!gp) {
    rc = fm_diag_set(d, FM_ENOMEM, "codegen: out of memory");
    goto out;
  }
  if ((rc = plan(canon, gp, d)) || (rc = check_config(cfg, d))) goto out;
  char entry[FM_META_ENTRY_MAX];
  uint32_t split = cfg->split > 1 ? cfg->split : 1;
  snprintf(entry, sizeof entry, "fm_skinny_c%u_w%u_u%u_p%u%s", cfg->cols, cfg->warps, cfg->unroll, cfg->pipe,
           split == 2   ? "_k2"
           : split == 4 ? "_k4"
                        : "");
  const char *ty = gp->dt == FM_DT_BF16 ? "bf16" : "f16";
  fm_strbuf_printf(&sb, "/* fusemld skinny gemm kernel: %s, A row-major, B column-major, %s */\n", entry, ty);
  fm_cg_emit_prelude(&sb, fm_cg_fast_math(canon));
  /* FM_X1: rows 8..15 of a block's x exist (a static M <= 8 never loads them) */
  fm_strbuf_printf(&sb,
                   "#define FM_BN %u\n#define FM_WARPS %u\n#define FM_UNROLL %u\n#define FM_PIPE %u\n"
                   "#define FM_SPLIT %u\n"
                   "#define FM_X1 %d\n#define FM_K %" PRId64 "\n#define FM_N %" PRId64
                   "\n"
                   "#define FM_LDA %" PRId64 "LL\n#define FM_LDB %" PRId64 "LL\n",
                   cfg->cols, cfg->warps, cfg->unroll, cfg->pipe, split, gp->m < 0 || gp->m > 8, gp->k, gp->n, gp->lda,
                   gp->ldb);
  fm_cg_gemm_emit_mma(&sb, ty);
  /* the split form's blocks meet at fm_cluster_sync: when its partial sums are staged, and
     when no other block still reads them */
  if (split > 1) fm_strbuf_append(&sb, fm_cg_sm90);
  fm_strbuf_append(&sb, fm_cg_skinny_body);
  fm_cg_gemm_emit_epilogue(&sb, canon, gp);
  emit_kernel(&sb, canon, gp, entry, split);
  if ((rc = fm_strbuf_error(&sb))) {
    rc = fm_diag_set(d, rc, "codegen: the kernel source exceeds %u bytes", MAX_SOURCE);
    goto out;
  }
  fm_cg_gemm_tiles_meta(meta, canon, gp, entry, cfg->warps * 32, smem_bytes(cfg), ROWS, cfg->cols);
  meta->max_blocks *= split; /* grid.x: a cluster of split blocks per column block */
  *src = fm_strbuf_take(&sb);
  if (!*src) rc = fm_diag_set(d, FM_ENOMEM, "codegen: out of memory");
out:
  fm_strbuf_free(&sb);
  free(gp);
  return rc;
}
