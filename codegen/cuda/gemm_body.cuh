// cuda/gemm_body.cuh: the fixed part of the gemm template: the sm_80+ mainloop.
//
// One block computes a BM x BN output tile; its warps form a WM x WN grid, each owning a
// (BM/WM) x (BN/WN) piece held as fp32 accumulators of mma.sync m16n8k16 (row.col). Tiles of
// A and B stream through STAGES shared-memory buffers filled by cp.async (16-byte chunks,
// zero-filled past the edges, so any M and N work), so loads for k-tile kt+STAGES-1 overlap
// the math on k-tile kt. Each operand keeps its global layout in shared memory (K-major rows
// when K is contiguous, else M/N-major rows) and ldmatrix, with .trans for the M/N-major
// case, turns either into mma fragments. Rows are padded by 8 elements (16 bytes): the eight
// row addresses of one ldmatrix then fall in eight different 4-bank groups (an XOR swizzle
// would only save the padding's 12.5% of shared memory, not conflicts).
//
// After the K loop the stage buffers are reused to stage each warp's accumulators, 16 rows
// at a time, so that the generated epilogue runs on 8 consecutive columns of one row and
// stores them with one 16-byte access (the mma layout gives a thread 2 adjacent columns).
// Blocks walk the output tiles in groups of FM_RASTER tile rows (0: row by row), so the
// blocks resident at one time share A rows and B columns in L2.
//
// The generated part (fm_codegen_gemm.c) defines FM_BM, FM_BN, FM_BK, FM_STAGES, FM_WM, FM_WN,
// FM_RASTER, FM_K, FM_N, FM_LDA, FM_LDB, FM_A_KMAJOR, FM_B_KMAJOR, FM_SCOLS and fm_mma() before this
// text, and
// the kernel around it (the epilogue). Changing it changes generated source: bump
// FM_CODEGEN_VERSION.
/* ---- gemm mainloop (sm_80+: cp.async, ldmatrix, mma.sync) ---- */
#define FM_THREADS (FM_WM * FM_WN * 32)
#define FM_MT (FM_BM / FM_WM / 16)
/* the first row of a warp's 16-row piece mt in the tile: its warp tile's mt-th */
#define FM_WARP_ROW(wm, mt) ((wm) * (FM_BM / FM_WM) + (mt) * 16)
#define FM_NT (FM_BN / FM_WN / 8)
#define FM_A_ROW (FM_A_KMAJOR ? FM_BK + 8 : FM_BM + 8)
#define FM_B_ROW (FM_B_KMAJOR ? FM_BK + 8 : FM_BN + 8)
#define FM_A_STAGE (FM_A_KMAJOR ? FM_BM * FM_A_ROW : FM_BK * FM_A_ROW)
#define FM_B_STAGE (FM_B_KMAJOR ? FM_BN * FM_B_ROW : FM_BK * FM_B_ROW)
#define FM_KT ((FM_K + FM_BK - 1) / FM_BK)
#define FM_WCOLS (FM_BN / FM_WN)
/* one warp's staging slab: 16 rows of FM_SCOLS (= FM_WCOLS here) fp32, padded by 8 (the float2 writes of a
   half-warp then cover 32 distinct banks) */
#define FM_SLAB_LD (FM_SCOLS + 8)
extern __shared__ __align__(128) unsigned short fm_smem[];
__device__ __forceinline__ void fm_ldsm4(unsigned r[4], unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr) : "memory");
}
__device__ __forceinline__ void fm_ldsm4t(unsigned r[4], unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr) : "memory");
}
#ifdef FM_SIB
/* Siblings: tile column r holds output column *gn of B (the first half of each warp's
   FM_WCOLS columns) or of B2 (the second half, the same output columns), so that one
   thread's accumulators pair them; the tile's output columns start at n0 / 2. */
__device__ __forceinline__ const unsigned short *fm_sib_col(const unsigned short *B,
    const unsigned short *B2, int n0, int r, int &gn) {
  const int c = r % FM_WCOLS;
  gn = n0 / 2 + r / FM_WCOLS * (FM_WCOLS / 2) + c % (FM_WCOLS / 2);
  return c < FM_WCOLS / 2 ? B : B2;
}
#define FM_B2_PARAM , const unsigned short *__restrict__ B2
#define FM_B2_ARG , B2
#else
#define FM_B2_PARAM
#define FM_B2_ARG
#endif
/* One k-tile of A and B into stage buffers as, bs (element (m, k) of A at A[m * sm + k * sk]). */
__device__ __forceinline__ void fm_load_tile(unsigned short *as, unsigned short *bs,
    const unsigned short *__restrict__ A, const unsigned short *__restrict__ B FM_B2_PARAM,
    long long M, long long m0, int n0, int k0, int tid) {
#if FM_A_KMAJOR
#pragma unroll
  for (int c = tid; c < FM_BM * FM_BK / 8; c += FM_THREADS) {
    const int r = c / (FM_BK / 8), kc = (c % (FM_BK / 8)) * 8;
    const long long gm = m0 + r;
    const int gk = k0 + kc;
    const bool ok = gm < M && gk < FM_K;
    fm_cp16(fm_saddr(as + r * FM_A_ROW + kc), ok ? A + gm * FM_LDA + gk : A, ok ? 16 : 0);
  }
#else
#pragma unroll
  for (int c = tid; c < FM_BM * FM_BK / 8; c += FM_THREADS) {
    const int r = c / (FM_BM / 8), mc = (c % (FM_BM / 8)) * 8;
    const long long gm = m0 + mc, rem = M - gm;
    const int gk = k0 + r;
    const int bytes = (gk < FM_K && rem > 0) ? (rem >= 8 ? 16 : (int)rem * 2) : 0;
    fm_cp16_edge(as + r * FM_A_ROW + mc, A + gm + (long long)gk * FM_LDA, A, bytes);
  }
#endif
#if FM_B_KMAJOR
#pragma unroll
  for (int c = tid; c < FM_BN * FM_BK / 8; c += FM_THREADS) {
    const int r = c / (FM_BK / 8), kc = (c % (FM_BK / 8)) * 8;
#ifdef FM_SIB
    int gn;
    const unsigned short *const src = fm_sib_col(B, B2, n0, r, gn);
#else
    const int gn = n0 + r;
    const unsigned short *const src = B;
#endif
    const int gk = k0 + kc;
    const bool ok = gn < FM_N && gk < FM_K;
    fm_cp16(fm_saddr(bs + r * FM_B_ROW + kc), ok ? src + (long long)gn * FM_LDB + gk : B, ok ? 16 : 0);
  }
#else
#pragma unroll
  for (int c = tid; c < FM_BN * FM_BK / 8; c += FM_THREADS) {
    const int r = c / (FM_BN / 8), nc = (c % (FM_BN / 8)) * 8;
#ifdef FM_SIB
    int gn;   /* 8 columns stay in one half: FM_WCOLS / 2 is a multiple of 8 */
    const unsigned short *const src = fm_sib_col(B, B2, n0, nc, gn);
#else
    const int gn = n0 + nc;
    const unsigned short *const src = B;
#endif
    const int rem = FM_N - gn, gk = k0 + r;
    const int bytes = (gk < FM_K && rem > 0) ? (rem >= 8 ? 16 : rem * 2) : 0;
    fm_cp16_edge(bs + r * FM_B_ROW + nc, src + (long long)gk * FM_LDB + gn, B, bytes);
  }
#endif
}
/* The math on one stage: BK/16 steps of MT x NT mma per warp. */
__device__ __forceinline__ void fm_tile_mma(float (&acc)[FM_MT][FM_NT][4], const unsigned short *as,
    const unsigned short *bs, int wm, int wn, int lane) {
  const int j = lane >> 3, r = lane & 7;
#pragma unroll
  for (int kk = 0; kk < FM_BK; kk += 16) {
    unsigned af[FM_MT][4], bf[FM_NT][2];
#pragma unroll
    for (int mt = 0; mt < FM_MT; mt++) {
      const int mrow = wm * (FM_BM / FM_WM) + mt * 16;
#if FM_A_KMAJOR
      fm_ldsm4(af[mt], fm_saddr(as + (mrow + (lane & 15)) * FM_A_ROW + kk + (lane >> 4) * 8));
#else
      fm_ldsm4t(af[mt], fm_saddr(as + (kk + r + 8 * (j >> 1)) * FM_A_ROW + mrow + 8 * (j & 1)));
#endif
    }
#pragma unroll
    for (int nt = 0; nt < FM_NT; nt += 2) {
      const int ncol = wn * (FM_BN / FM_WN) + nt * 8;
      unsigned q[4];
#if FM_B_KMAJOR
      fm_ldsm4(q, fm_saddr(bs + (ncol + r + 8 * (j >> 1)) * FM_B_ROW + kk + 8 * (j & 1)));
#else
      fm_ldsm4t(q, fm_saddr(bs + (kk + r + 8 * (j & 1)) * FM_B_ROW + ncol + 8 * (j >> 1)));
#endif
      bf[nt][0] = q[0]; bf[nt][1] = q[1]; bf[nt + 1][0] = q[2]; bf[nt + 1][1] = q[3];
    }
#pragma unroll
    for (int mt = 0; mt < FM_MT; mt++)
#pragma unroll
      for (int nt = 0; nt < FM_NT; nt++) fm_mma(acc[mt][nt], af[mt], bf[nt][0], bf[nt][1]);
  }
}
/* The whole K loop for the block's tile; acc comes back with A@B for the warp's piece. */
__device__ __forceinline__ void fm_mainloop(float (&acc)[FM_MT][FM_NT][4],
    const unsigned short *__restrict__ A, const unsigned short *__restrict__ B FM_B2_PARAM,
    long long M, long long m0, int n0) {
  unsigned short *As = fm_smem, *Bs = fm_smem + FM_STAGES * FM_A_STAGE;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp / FM_WN, wn = warp % FM_WN;
  fm_acc_zero(acc);
#pragma unroll
  for (int s = 0; s < FM_STAGES - 1; s++) {
    if (s < FM_KT) fm_load_tile(As + s * FM_A_STAGE, Bs + s * FM_B_STAGE, A, B FM_B2_ARG, M, m0, n0, s * FM_BK, tid);
    fm_cp_commit();
  }
  for (int kt = 0; kt < FM_KT; kt++) {
    /* groups 0..kt have landed; the barrier also says every warp is done with the stage
       the next load overwrites (the one read in iteration kt-1) */
    fm_cp_wait<FM_STAGES - 2>();
    __syncthreads();
    const int nk = kt + FM_STAGES - 1;
    if (nk < FM_KT) {
      const int st = nk % FM_STAGES;
      fm_load_tile(As + st * FM_A_STAGE, Bs + st * FM_B_STAGE, A, B FM_B2_ARG, M, m0, n0, nk * FM_BK, tid);
    }
    fm_cp_commit();
    const int cs = kt % FM_STAGES;
    fm_tile_mma(acc, As + cs * FM_A_STAGE, Bs + cs * FM_B_STAGE, wm, wn, lane);
  }
  fm_cp_wait<0>();
}
