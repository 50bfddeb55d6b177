/* fm_codegen_gemm_wgmma.c: the gemm template's Hopper mainloop (sm_90a): warpgroup MMA.
 *
 * Same contract as fm_codegen_gemm_body.c (fm_mainloop and the slab macros; the cp.async
 * helpers come before it from fm_cg_gemm_cp_async, fm_tile_coords and fm_stage after it
 * from fm_cg_gemm_tail), so the generated kernel and epilogue around it
 * are the gemm template's own. What differs: each warpgroup (4 warps, 128 threads) owns 64
 * rows of the block's BM x BN tile and multiplies with wgmma.mma_async m64nBNk16, both operands read by the tensor cores straight
 * from shared memory through matrix descriptors (no ldmatrix, no register fragments of A or
 * B). Only the nn.Linear layouts (A and B both K-major) are served, with BK = 64: a stage row
 * of 64 bf16/f16 is exactly one 128-byte swizzle row. Tiles are filled by cp.async into the
 * 128-byte-swizzled layout the descriptors name (16-byte chunk c of row r at chunk c ^ (r % 8);
 * stage buffers 1024-byte aligned, so the hardware's address-based swizzle agrees), then a
 * proxy fence makes the generic-proxy writes visible to the async proxy wgmma reads through.
 *
 * Pipeline: FM_WG_INFLIGHT (0 or 1) wgmma batches stay in flight while the next stage is
 * issued; a stage is refilled only once every warpgroup is done reading it, so the loads run
 * FM_STAGES - 1 - FM_WG_INFLIGHT k-tiles ahead. The accumulator fragment of m64nN gives
 * warp w of the block rows 16w .. 16w+15 in the same per-warp layout as mma.sync m16n8 (a
 * thread's 4 values per 8 columns), so the epilogue's staging (fm_stage) is unchanged, with
 * FM_WM = BM / 16 warps along M and FM_WN = 1.
 *
 * The generated part defines FM_BM, FM_BN, FM_BK (64), FM_STAGES, FM_WM, FM_WN, FM_RASTER,
 * FM_K, FM_N, FM_LDA, FM_LDB, FM_SCOLS (slab columns), FM_WG_INFLIGHT and fm_wgmma() before
 * this text (FM_RT and FM_SLAB_OFF too when a block walks several row tiles). Changing it
 * changes generated source: bump FM_CODEGEN_VERSION. */
#include "fm_codegen_gemm.h"

const char fm_cg_wgmma_body[] =
    "/* ---- gemm mainloop (sm_90a: cp.async into 128-byte-swizzled tiles, wgmma) ---- */\n"
    "#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)\n"
    "#error \"the wgmma mainloop needs sm_90a\"\n"
    "#endif\n"
    "/* warp-specialised: warpgroup 0 only loads, the others only multiply */\n"
    "#define FM_LOADERS (FM_WG_SPECIALIZED ? 128 : FM_WM * FM_WN * 32)\n"
    "#define FM_THREADS (FM_WM * FM_WN * 32 + (FM_WG_SPECIALIZED ? 128 : 0))\n"
    "#define FM_EPI_WARP0 (FM_WG_SPECIALIZED ? 4 : 0)\n"
    "#define FM_MT 1\n"
    "#define FM_NT (FM_BN / 8)\n"
    "#define FM_WCOLS FM_BN\n"
    "#define FM_SLAB_LD (FM_SCOLS + 8)\n"
    "#define FM_KT ((FM_K + 63) / 64)\n"
    "#define FM_A_BYTES (FM_BM * 128)\n"
    "#define FM_STAGE_BYTES ((FM_BM + FM_BN) * 128)\n"
    "#define FM_AHEAD (FM_STAGES - 1 - FM_WG_INFLIGHT)\n"
    "extern __shared__ __align__(1024) unsigned short fm_smem[];\n"
    "__device__ __forceinline__ void fm_wg_fence() { asm volatile(\"wgmma.fence.sync.aligned;\\n\" ::: \"memory\"); }\n"
    "__device__ __forceinline__ void fm_wg_commit() { asm volatile(\"wgmma.commit_group.sync.aligned;\\n\" ::: \"memory\"); }\n"
    "template <int N> __device__ __forceinline__ void fm_wg_wait() {\n"
    "  asm volatile(\"wgmma.wait_group.sync.aligned %0;\\n\" :: \"n\"(N) : \"memory\");\n"
    "}\n"
    "/* A K-major operand in 128-byte swizzle: start >> 4, leading offset unused (1), 1024 bytes\n"
    "   between 8-row groups, swizzle mode 1 (128 B). */\n"
    "__device__ __forceinline__ unsigned long long fm_desc(unsigned addr) {\n"
    "  return (unsigned long long)((addr & 0x3FFFFu) >> 4) | (1ull << 16) | (64ull << 32) | (1ull << 62);\n"
    "}\n"
    "/* One k-tile of A (BM rows) and B (BN rows), 64 elements of K each, into the stage at\n"
    "   shared address sa; chunks past M, N or K are zero-filled. */\n"
    "__device__ __forceinline__ void fm_load_tile(unsigned sa, const unsigned short *__restrict__ A,\n"
    "    const unsigned short *__restrict__ B, long long M, long long m0, int n0, int k0, int tid) {\n"
    "#pragma unroll\n"
    "  for (int c = tid; c < FM_BM * 8; c += FM_LOADERS) {\n"
    "    const int r = c >> 3, kc = c & 7;\n"
    "    const long long gm = m0 + r;\n"
    "    const int gk = k0 + kc * 8;\n"
    "    const bool ok = gm < M && gk < FM_K;\n"
    "    fm_cp16(sa + r * 128 + ((kc ^ (r & 7)) << 4), ok ? A + gm * FM_LDA + gk : A, ok ? 16 : 0);\n"
    "  }\n"
    "  const unsigned sb = sa + FM_A_BYTES;\n"
    "#pragma unroll\n"
    "  for (int c = tid; c < FM_BN * 8; c += FM_LOADERS) {\n"
    "    const int r = c >> 3, kc = c & 7;\n"
    "    const int gn = n0 + r, gk = k0 + kc * 8;\n"
    "    const bool ok = gn < FM_N && gk < FM_K;\n"
    "    fm_cp16(sb + r * 128 + ((kc ^ (r & 7)) << 4), ok ? B + (long long)gn * FM_LDB + gk : B, ok ? 16 : 0);\n"
    "  }\n"
    "}\n"
    "__device__ __forceinline__ void fm_mbar_wait(unsigned bar, unsigned parity) {\n"
    "  asm volatile(\"{\\n.reg .pred P;\\nFM_WAIT:\\n\"\n"
    "               \"mbarrier.try_wait.parity.shared::cta.b64 P, [%0], %1;\\n\"\n"
    "               \"@!P bra FM_WAIT;\\n}\\n\" :: \"r\"(bar), \"r\"(parity) : \"memory\");\n"
    "}\n"
    "#if FM_WG_SPECIALIZED\n"
    "/* Warpgroup 0 fills stage kt %% FM_STAGES once the consumers released it (mbarrier\n"
    "   empty[s]) and signals full[s] when its cp.asyncs land; warpgroups 1 and 2 wait on\n"
    "   full[s], multiply, and release the stage of the previous k-tile once its wgmma batch\n"
    "   retired. No block-wide barrier in the loop. */\n"
    "__device__ __forceinline__ void fm_mainloop(float (&acc)[FM_MT][FM_NT][4],\n"
    "    const unsigned short *__restrict__ A, const unsigned short *__restrict__ B,\n"
    "    long long M, long long m0, int n0) {\n"
    "  const unsigned base = (fm_saddr(fm_smem) + 1023u) & ~1023u;\n"
    "  const unsigned full = base + FM_STAGES * FM_STAGE_BYTES, empty = full + FM_STAGES * 8;\n"
    "  const int tid = threadIdx.x, wg = tid >> 7;\n"
    "#pragma unroll\n"
    "  for (int nt = 0; nt < FM_NT; nt++)\n"
    "#pragma unroll\n"
    "    for (int e = 0; e < 4; e++) acc[0][nt][e] = 0.0f;\n"
    "  if (tid == 0)\n"
    "    for (int s = 0; s < FM_STAGES; s++) {\n"
    "      asm volatile(\"mbarrier.init.shared::cta.b64 [%0], %1;\\n\" :: \"r\"(full + 8 * s), \"r\"(128) : \"memory\");\n"
    "      asm volatile(\"mbarrier.init.shared::cta.b64 [%0], %1;\\n\" :: \"r\"(empty + 8 * s), \"r\"(FM_WM * 32) : \"memory\");\n"
    "    }\n"
    "  __syncthreads();\n"
    "  if (wg == 0) {\n"
    "    for (int kt = 0; kt < FM_KT; kt++) {\n"
    "      const int s = kt % FM_STAGES;\n"
    "      if (kt >= FM_STAGES) fm_mbar_wait(empty + 8 * s, ((kt / FM_STAGES) - 1) & 1);\n"
    "      fm_load_tile(base + s * FM_STAGE_BYTES, A, B, M, m0, n0, kt * 64, tid);\n"
    "      asm volatile(\"cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\\n\" :: \"r\"(full + 8 * s) : \"memory\");\n"
    "    }\n"
    "    return;\n"
    "  }\n"
    "  for (int kt = 0; kt < FM_KT; kt++) {\n"
    "    const int s = kt % FM_STAGES;\n"
    "    fm_mbar_wait(full + 8 * s, (kt / FM_STAGES) & 1);\n"
    "    /* the loads were generic-proxy writes; wgmma reads through the async proxy */\n"
    "    asm volatile(\"fence.proxy.async.shared::cta;\\n\" ::: \"memory\");\n"
    "    const unsigned sa = base + s * FM_STAGE_BYTES;\n"
    "    const unsigned long long da = fm_desc(sa + (wg - 1) * 64 * 128), db = fm_desc(sa + FM_A_BYTES);\n"
    "    fm_wg_fence();\n"
    "#pragma unroll\n"
    "    for (int kk = 0; kk < 4; kk++) fm_wgmma(acc[0], da + 2 * kk, db + 2 * kk);\n"
    "    fm_wg_commit();\n"
    "    fm_wg_wait<1>();\n"
    "    if (kt > 0) asm volatile(\"mbarrier.arrive.shared::cta.b64 _, [%0];\\n\" :: \"r\"(empty + 8 * ((kt - 1) % FM_STAGES)) : \"memory\");\n"
    "  }\n"
    "  fm_wg_wait<0>();\n"
    "}\n"
    "#else\n"
    "/* The first FM_AHEAD k-tiles of the tile at m0 into stages 0 .. FM_AHEAD-1, one cp.async\n"
    "   group each. Every warpgroup must be done reading those stages. */\n"
    "__device__ __forceinline__ void fm_prologue(const unsigned short *__restrict__ A,\n"
    "    const unsigned short *__restrict__ B, long long M, long long m0, int n0) {\n"
    "  /* the dynamic allocation carries 1 KiB of slack for this alignment */\n"
    "  const unsigned base = (fm_saddr(fm_smem) + 1023u) & ~1023u;\n"
    "#pragma unroll\n"
    "  for (int s = 0; s < FM_AHEAD; s++) {\n"
    "    if (s < FM_KT) fm_load_tile(base + s * FM_STAGE_BYTES, A, B, M, m0, n0, s * 64, threadIdx.x);\n"
    "    fm_cp_commit();\n"
    "  }\n"
    "}\n"
    "/* The K loop after fm_prologue for the same tile; acc comes back with A@B for the warp's\n"
    "   16 rows, every cp.async landed and every wgmma retired. */\n"
    "__device__ __forceinline__ void fm_mainloop_rest(float (&acc)[FM_MT][FM_NT][4],\n"
    "    const unsigned short *__restrict__ A, const unsigned short *__restrict__ B,\n"
    "    long long M, long long m0, int n0) {\n"
    "  const unsigned base = (fm_saddr(fm_smem) + 1023u) & ~1023u;\n"
    "  const int tid = threadIdx.x, wg = tid >> 7;\n"
    "#pragma unroll\n"
    "  for (int nt = 0; nt < FM_NT; nt++)\n"
    "#pragma unroll\n"
    "    for (int e = 0; e < 4; e++) acc[0][nt][e] = 0.0f;\n"
    "  for (int kt = 0; kt < FM_KT; kt++) {\n"
    "    /* k-tile kt has landed; after the barrier every warpgroup has also retired the\n"
    "       wgmma batches that read the stage refilled below */\n"
    "    fm_cp_wait<FM_AHEAD - 1>();\n"
    "    asm volatile(\"fence.proxy.async.shared::cta;\\n\" ::: \"memory\");\n"
    "    __syncthreads();\n"
    "    const int nk = kt + FM_AHEAD;\n"
    "    if (nk < FM_KT) fm_load_tile(base + (nk % FM_STAGES) * FM_STAGE_BYTES, A, B, M, m0, n0, nk * 64, tid);\n"
    "    fm_cp_commit();\n"
    "    const unsigned sa = base + (kt % FM_STAGES) * FM_STAGE_BYTES;\n"
    "    const unsigned long long da = fm_desc(sa + wg * 64 * 128), db = fm_desc(sa + FM_A_BYTES);\n"
    "    fm_wg_fence();\n"
    "#pragma unroll\n"
    "    for (int kk = 0; kk < 4; kk++) fm_wgmma(acc[0], da + 2 * kk, db + 2 * kk);   /* +32 bytes of K */\n"
    "    fm_wg_commit();\n"
    "    fm_wg_wait<FM_WG_INFLIGHT>();\n"
    "  }\n"
    "  fm_wg_wait<0>();\n"
    "  fm_cp_wait<0>();\n"
    "}\n"
    "/* The whole K loop for the block's tile. */\n"
    "__device__ __forceinline__ void fm_mainloop(float (&acc)[FM_MT][FM_NT][4],\n"
    "    const unsigned short *__restrict__ A, const unsigned short *__restrict__ B,\n"
    "    long long M, long long m0, int n0) {\n"
    "  fm_prologue(A, B, M, m0, n0);\n"
    "  fm_mainloop_rest(acc, A, B, M, m0, n0);\n"
    "}\n"
    "#endif\n"
    ;

void fm_cg_gemm_emit_wgmma(fm_strbuf *sb, const char *ty, uint32_t bn) {
  uint32_t regs = bn / 2;
  fm_strbuf_printf(sb,
                   "/* one wgmma m64n%uk16 (A and B K-major in shared memory, fp32 accumulators kept) */\n"
                   "__device__ __forceinline__ void fm_wgmma(float (&d)[%u][4], unsigned long long da,\n"
                   "                                         unsigned long long db) {\n"
                   "  asm volatile(\"{\\n.reg .pred p;\\nsetp.ne.b32 p, %%%u, 0;\\n\"\n"
                   "      \"wgmma.mma_async.sync.aligned.m64n%uk16.f32.%s.%s {",
                   bn, bn / 8, regs + 2, bn, ty, ty);
  for (uint32_t i = 0; i < regs; i++) fm_strbuf_printf(sb, "%s%%%u", i ? ", " : "", i);
  fm_strbuf_printf(sb, "}, %%%u, %%%u, p, 1, 1, 0, 0;\\n}\\n\"\n      : ", regs, regs + 1);
  for (uint32_t i = 0; i < regs; i++)
    fm_strbuf_printf(sb, "%s\"+f\"(d[%u][%u])", i ? ", " : "", i / 4, i % 4);
  fm_strbuf_append(sb, "\n      : \"l\"(da), \"l\"(db), \"r\"(1));\n}\n");
}
