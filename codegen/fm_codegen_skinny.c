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

/* The fixed part: loads, the K loop, the cross-warp sum. Needs FM_BN, FM_WARPS, FM_UNROLL,
 * FM_PIPE, FM_X1, FM_K, FM_N, FM_LDA, FM_LDB and fm_mma() defined before it. */
static const char body[] =
    "/* ---- skinny mainloop (sm_80+: W streamed into registers or a warp-private cp.async ring, mma.sync) ---- */\n"
    "#define FM_THREADS (FM_WARPS * 32)\n"
    "#define FM_NT (FM_BN / 8)\n"
    "#define FM_KC ((FM_K + 63) / 64)\n"
    "/* the warps along K: FM_SPLIT blocks of FM_WARPS (a cluster); block rank r's warp w is\n"
    "   K-warp r * FM_WARPS + w, and K-warp kw takes chunks kw, kw + FM_KWARPS, ... */\n"
    "#define FM_KWARPS (FM_WARPS * FM_SPLIT)\n"
    "#define FM_STEP (FM_KWARPS * FM_UNROLL)\n"
    "__device__ __forceinline__ int fm_krank() { return FM_SPLIT > 1 ? (int)(blockIdx.x % FM_SPLIT) : 0; }\n"
    "/* 16 bytes of W, read once: L1 is bypassed so that it keeps x; zeros where !ok */\n"
    "__device__ __forceinline__ uint4 fm_ldw(const unsigned short *p, bool ok) {\n"
    "  uint4 v;\n"
    "  asm(\"{\\n .reg .pred p;\\n setp.ne.b32 p, %5, 0;\\n\"\n"
    "      \" mov.b32 %0, 0;\\n mov.b32 %1, 0;\\n mov.b32 %2, 0;\\n mov.b32 %3, 0;\\n\"\n"
    "      \" @p ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];\\n}\\n\"\n"
    "      : \"=r\"(v.x), \"=r\"(v.y), \"=r\"(v.z), \"=r\"(v.w) : \"l\"(p), \"r\"((int)ok));\n"
    "  return v;\n"
    "}\n"
    "/* 16 bytes of x (small, read by every block: kept in L1); zeros where !ok. Predicated\n"
    "   in PTX like fm_ldw: a branch per load would split the step into basic blocks. */\n"
    "__device__ __forceinline__ uint4 fm_ldx(const unsigned short *p, bool ok) {\n"
    "  uint4 v;\n"
    "  asm(\"{\\n .reg .pred p;\\n setp.ne.b32 p, %5, 0;\\n\"\n"
    "      \" mov.b32 %0, 0;\\n mov.b32 %1, 0;\\n mov.b32 %2, 0;\\n mov.b32 %3, 0;\\n\"\n"
    "      \" @p ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];\\n}\\n\"\n"
    "      : \"=r\"(v.x), \"=r\"(v.y), \"=r\"(v.z), \"=r\"(v.w) : \"l\"(p), \"r\"((int)ok));\n"
    "  return v;\n"
    "}\n"
    "/* k-pair i (0..7) of the thread's 16 elements, held as two uint4 */\n"
    "__device__ __forceinline__ unsigned fm_pair(const uint4 (&v)[2], int i) {\n"
    "  const uint4 h = v[i >> 2];\n"
    "  return (i & 3) == 0 ? h.x : (i & 3) == 1 ? h.y : (i & 3) == 2 ? h.z : h.w;\n"
    "}\n"
    "/* The thread's two 8-element halves of a 64-wide chunk at k: elements k + 8q .. +7 and\n"
    "   k + 32 + 8q .. +7, so that the 4 lanes of a row read 64 contiguous bytes (two whole\n"
    "   sectors) per load instruction. Each half is wholly in or out (K is a multiple of 8). */\n"
    "#define FM_H0(k, q) ((k) + 8 * (q))\n"
    "#define FM_H1(k, q) ((k) + 32 + 8 * (q))\n"
    "/* The W of one step: chunks c0 + u * FM_WARPS (u < FM_UNROLL) of the warp's FM_NT rows. */\n"
    "__device__ __forceinline__ void fm_load_w(uint4 (&wv)[FM_UNROLL][FM_NT][2],\n"
    "    const unsigned short *const (&w)[FM_NT], const bool (&wok)[FM_NT], int c0, int q) {\n"
    "#pragma unroll\n"
    "  for (int u = 0; u < FM_UNROLL; u++) {\n"
    "    const int k = (c0 + u * FM_KWARPS) * 64;\n"
    "    const bool k0 = FM_H0(k, q) < FM_K, k1 = FM_H1(k, q) < FM_K;\n"
    "#pragma unroll\n"
    "    for (int nt = 0; nt < FM_NT; nt++) {\n"
    "      wv[u][nt][0] = fm_ldw(w[nt] + FM_H0(k, 0), wok[nt] && k0);\n"
    "      wv[u][nt][1] = fm_ldw(w[nt] + FM_H1(k, 0), wok[nt] && k1);\n"
    "    }\n"
    "  }\n"
    "}\n"
    "/* The x of one step: rows g and g + 8 (the latter never read when M <= 8 is static). */\n"
    "__device__ __forceinline__ void fm_load_x(uint4 (&xv)[FM_UNROLL][2][2], const unsigned short *x0,\n"
    "    const unsigned short *x1, bool x0ok, bool x1ok, int c0, int q) {\n"
    "#pragma unroll\n"
    "  for (int u = 0; u < FM_UNROLL; u++) {\n"
    "    const int k = (c0 + u * FM_KWARPS) * 64;\n"
    "    const bool k0 = FM_H0(k, q) < FM_K, k1 = FM_H1(k, q) < FM_K;\n"
    "    xv[u][0][0] = fm_ldx(x0 + FM_H0(k, 0), x0ok && k0);\n"
    "    xv[u][0][1] = fm_ldx(x0 + FM_H1(k, 0), x0ok && k1);\n"
    "#if FM_X1\n"
    "    xv[u][1][0] = fm_ldx(x1 + FM_H0(k, 0), x1ok && k0);\n"
    "    xv[u][1][1] = fm_ldx(x1 + FM_H1(k, 0), x1ok && k1);\n"
    "#else\n"
    "    (void)x1; (void)x1ok;\n"
    "    xv[u][1][0] = xv[u][1][1] = make_uint4(0u, 0u, 0u, 0u);\n"
    "#endif\n"
    "  }\n"
    "}\n"
    "/* The math of one step: 4 mma k-steps per chunk and n-tile (the K permutation above). */\n"
    "__device__ __forceinline__ void fm_step_mma(float (&acc)[FM_NT][4],\n"
    "    const uint4 (&wv)[FM_UNROLL][FM_NT][2], const uint4 (&xv)[FM_UNROLL][2][2]) {\n"
    "#pragma unroll\n"
    "  for (int u = 0; u < FM_UNROLL; u++)\n"
    "#pragma unroll\n"
    "    for (int s = 0; s < 4; s++) {\n"
    "      const unsigned a[4] = {fm_pair(xv[u][0], 2 * s), fm_pair(xv[u][1], 2 * s),\n"
    "                             fm_pair(xv[u][0], 2 * s + 1), fm_pair(xv[u][1], 2 * s + 1)};\n"
    "#pragma unroll\n"
    "      for (int nt = 0; nt < FM_NT; nt++)\n"
    "        fm_mma(acc[nt], a, fm_pair(wv[u][nt], 2 * s), fm_pair(wv[u][nt], 2 * s + 1));\n"
    "    }\n"
    "}\n"
    "#if FM_PIPE >= 2\n"
    "/* The cp.async ring: FM_PIPE stages per warp, each FM_UNROLL x FM_NT pieces of 1 KiB (one\n"
    "   chunk of 8 W rows) kept in lane order (lane l's halves at 16 l and 512 + 16 l), so every\n"
    "   thread reads back exactly the bytes it copied: no barrier, and conflict-free LDS.128. */\n"
    "#define FM_RING_STAGE (FM_UNROLL * FM_NT * 1024)\n"
    "extern __shared__ __align__(128) unsigned char fm_ring[];\n"
    "__device__ __forceinline__ void fm_cpw(unsigned dst, const unsigned short *src, const unsigned short *base, bool ok) {\n"
    "  asm volatile(\"cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\\n\"\n"
    "               :: \"r\"(dst), \"l\"(ok ? src : base), \"r\"(ok ? 16 : 0) : \"memory\");\n"
    "}\n"
    "__device__ __forceinline__ void fm_ring_issue(unsigned stage, const unsigned short *B,\n"
    "    const unsigned short *const (&w)[FM_NT], const bool (&wok)[FM_NT], int c0, int q, int lane) {\n"
    "#pragma unroll\n"
    "  for (int u = 0; u < FM_UNROLL; u++) {\n"
    "    const int k = (c0 + u * FM_KWARPS) * 64;\n"
    "    /* chunks past K (the last steps) copy nothing: src-size 0 zero-fills */\n"
    "    const bool k0 = FM_H0(k, q) < FM_K, k1 = FM_H1(k, q) < FM_K;\n"
    "#pragma unroll\n"
    "    for (int nt = 0; nt < FM_NT; nt++) {\n"
    "      const unsigned d = stage + (u * FM_NT + nt) * 1024 + lane * 16;\n"
    "      fm_cpw(d, w[nt] + FM_H0(k, 0), B, wok[nt] && k0);\n"
    "      fm_cpw(d + 512, w[nt] + FM_H1(k, 0), B, wok[nt] && k1);\n"
    "    }\n"
    "  }\n"
    "  asm volatile(\"cp.async.commit_group;\\n\" ::: \"memory\");\n"
    "}\n"
    "__device__ __forceinline__ void fm_ring_read(uint4 (&wv)[FM_UNROLL][FM_NT][2], const unsigned char *stage, int lane) {\n"
    "#pragma unroll\n"
    "  for (int u = 0; u < FM_UNROLL; u++)\n"
    "#pragma unroll\n"
    "    for (int nt = 0; nt < FM_NT; nt++) {\n"
    "      wv[u][nt][0] = *(const uint4 *)(stage + (u * FM_NT + nt) * 1024 + lane * 16);\n"
    "      wv[u][nt][1] = *(const uint4 *)(stage + (u * FM_NT + nt) * 1024 + 512 + lane * 16);\n"
    "    }\n"
    "}\n"
    "#endif\n"
    "/* acc[nt] = the mma accumulators of rows m0 .. m0+15 x columns n0 + 8 nt .. +7 over this\n"
    "   warp's K chunks (warp, warp + FM_WARPS, ...). */\n"
    "__device__ __forceinline__ void fm_skinny_mainloop(float (&acc)[FM_NT][4],\n"
    "    const unsigned short *__restrict__ A, const unsigned short *__restrict__ B,\n"
    "    long long M, long long m0, int n0) {\n"
    "  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;\n"
    "  const int kw = fm_krank() * FM_WARPS + warp;\n"
    "  const bool x0ok = m0 + g < M, x1ok = m0 + g + 8 < M;\n"
    "  const unsigned short *x0 = A + (x0ok ? m0 + g : 0) * FM_LDA + 8 * q;\n"
    "  const unsigned short *x1 = A + (x1ok ? m0 + g + 8 : 0) * FM_LDA + 8 * q;\n"
    "  const unsigned short *w[FM_NT];\n"
    "  bool wok[FM_NT];\n"
    "#pragma unroll\n"
    "  for (int nt = 0; nt < FM_NT; nt++) {\n"
    "    const int n = n0 + nt * 8 + g;\n"
    "    wok[nt] = n < FM_N;\n"
    "    w[nt] = B + (long long)(wok[nt] ? n : 0) * FM_LDB + 8 * q;\n"
    "#pragma unroll\n"
    "    for (int e = 0; e < 4; e++) acc[nt][e] = 0.0f;\n"
    "  }\n"
    "#if FM_PIPE >= 2\n"
    "  /* FM_PIPE - 1 steps of W in flight while one multiplies; cp.async needs no registers, so\n"
    "     ptxas cannot trade them away by sinking loads to their uses */\n"
    "  unsigned char *ring = fm_ring + warp * FM_PIPE * FM_RING_STAGE;\n"
    "  const unsigned ring_s = (unsigned)__cvta_generic_to_shared(ring);\n"
    "#pragma unroll\n"
    "  for (int s = 0; s < FM_PIPE - 1; s++) fm_ring_issue(ring_s + s * FM_RING_STAGE, B, w, wok, kw + s * FM_STEP, q, lane);\n"
    "  int st = 0;\n"
    "  for (int c0 = kw; c0 < FM_KC; c0 += FM_STEP) {\n"
    "    uint4 wv[FM_UNROLL][FM_NT][2], xv[FM_UNROLL][2][2];\n"
    "    asm volatile(\"cp.async.wait_group %0;\\n\" :: \"n\"(FM_PIPE - 2) : \"memory\");\n"
    "    fm_ring_read(wv, ring + st * FM_RING_STAGE, lane);\n"
    "    fm_load_x(xv, x0, x1, x0ok, x1ok, c0, q);\n"
    "    /* the stage refilled is the one read in the previous step, whose values the mma of that\n"
    "       step consumed: this thread's reads of it are complete */\n"
    "    const int fill = st == 0 ? FM_PIPE - 1 : st - 1;\n"
    "    fm_ring_issue(ring_s + fill * FM_RING_STAGE, B, w, wok, c0 + (FM_PIPE - 1) * FM_STEP, q, lane);\n"
    "    fm_step_mma(acc, wv, xv);\n"
    "    st = st == FM_PIPE - 1 ? 0 : st + 1;\n"
    "  }\n"
    "  asm volatile(\"cp.async.wait_group 0;\\n\" ::: \"memory\");\n"
    "#elif FM_PIPE\n"
    "  /* W prefetched one step ahead in registers */\n"
    "  uint4 wv[FM_UNROLL][FM_NT][2];\n"
    "  fm_load_w(wv, w, wok, kw, q);\n"
    "  for (int c0 = kw; c0 < FM_KC; c0 += FM_STEP) {\n"
    "    uint4 xv[FM_UNROLL][2][2], wn[FM_UNROLL][FM_NT][2];\n"
    "    fm_load_x(xv, x0, x1, x0ok, x1ok, c0, q);\n"
    "    fm_load_w(wn, w, wok, c0 + FM_STEP, q);\n"
    "    fm_step_mma(acc, wv, xv);\n"
    "#pragma unroll\n"
    "    for (int u = 0; u < FM_UNROLL; u++)\n"
    "#pragma unroll\n"
    "      for (int nt = 0; nt < FM_NT; nt++) {\n"
    "        wv[u][nt][0] = wn[u][nt][0];\n"
    "        wv[u][nt][1] = wn[u][nt][1];\n"
    "      }\n"
    "  }\n"
    "#else\n"
    "  /* each step's loads, then its math (ptxas interleaves them as it sees fit) */\n"
    "  for (int c0 = kw; c0 < FM_KC; c0 += FM_STEP) {\n"
    "    uint4 wv[FM_UNROLL][FM_NT][2], xv[FM_UNROLL][2][2];\n"
    "    fm_load_w(wv, w, wok, c0, q);\n"
    "    fm_load_x(xv, x0, x1, x0ok, x1ok, c0, q);\n"
    "    fm_step_mma(acc, wv, xv);\n"
    "  }\n"
    "#endif\n"
    "}\n"
    "/* one row of partial sums per (warp, row), padded so a warp's float2 writes spread over\n"
    "   the banks */\n"
    "#define FM_RED_LD (FM_BN + 4)\n"
    "/* The warps' accumulators into red[warp][row][col] (mma layout: thread (g, q) holds\n"
    "   columns 2q, 2q+1 of rows g and g + 8 in each n-tile). */\n"
    "__device__ __forceinline__ void fm_skinny_stage(float *red, const float (&acc)[FM_NT][4]) {\n"
    "  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;\n"
    "  float *r = red + warp * 16 * FM_RED_LD;\n"
    "#pragma unroll\n"
    "  for (int nt = 0; nt < FM_NT; nt++) {\n"
    "    *(float2 *)(r + g * FM_RED_LD + nt * 8 + 2 * q) = make_float2(acc[nt][0], acc[nt][1]);\n"
    "    *(float2 *)(r + (g + 8) * FM_RED_LD + nt * 8 + 2 * q) = make_float2(acc[nt][2], acc[nt][3]);\n"
    "  }\n"
    "}\n"
    "/* Four partial sums red[i .. i+3] (i a multiple of 4) of the cluster's block rank; the\n"
    "   block's own without a split. */\n"
    "__device__ __forceinline__ float4 fm_red4(const float *red, int rank, int i) {\n"
    "#if FM_SPLIT > 1\n"
    "  unsigned a = (unsigned)__cvta_generic_to_shared(red + i), r;\n"
    "  float4 v;\n"
    "  asm volatile(\"mapa.shared::cluster.u32 %0, %1, %2;\" : \"=r\"(r) : \"r\"(a), \"r\"(rank));\n"
    "  asm volatile(\"ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\"\n"
    "               : \"=f\"(v.x), \"=f\"(v.y), \"=f\"(v.z), \"=f\"(v.w) : \"r\"(r) : \"memory\");\n"
    "  return v;\n"
    "#else\n"
    "  (void)rank;\n"
    "  return *(const float4 *)(red + i);\n"
    "#endif\n"
    "}\n";

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
  fm_strbuf_append(&sb, body);
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
