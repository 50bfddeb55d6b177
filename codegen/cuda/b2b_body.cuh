// The fixed part: wgmma and cp.async helpers and the loads. Needs FM_BM, FM_K1, FM_N1,
// FM_N2, FM_LDA, FM_LDB, FM_LDB2 before it.
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "the b2b template needs sm_90a"
#endif
#define FM_MMA_THREADS (FM_BM / 64 * 128)
/* the TMA form (FM_WS): a loader warpgroup after the consumer warpgroups (one thread of it
   issues every box), so that registers can move to the consumers (setmaxnreg works per
   warpgroup: 384 threads start at 168 registers, the two consumer warpgroups take 240) */
#define FM_THREADS (FM_MMA_THREADS + (FM_WS ? 128 : 0))
#define FM_X_BYTES (FM_BM * FM_K1 * 2)
#define FM_W1_BYTES (64 * FM_K1 * 2)
#define FM_W2_BYTES (FM_N2 * 128)
#define FM_CHUNKS (FM_N1 / 64)
extern __shared__ __align__(1024) unsigned short fm_smem[];
/* where A's rows start, then the chunk buffers: 1024-byte aligned for the swizzle */
__device__ __forceinline__ unsigned fm_stage_base() { return (fm_saddr(fm_smem) + 1023u) & ~1023u; }
/* 16-byte chunk c (of 8 per 128-byte row) of row r of a 64-wide K slice at s, swizzled */
#define FM_SW(s, r, c) ((s) + (r) * 128 + ((((c) ^ ((r) & 7))) << 4))
/* The block's A rows: K1 / 64 slices of BM rows; rows past M are zeros. */
__device__ __forceinline__ void fm_load_a(unsigned xs, const unsigned short *__restrict__ A, long long M,
    long long m0, int tid) {
#pragma unroll 4
  for (int c = tid; c < FM_BM * (FM_K1 / 8); c += FM_MMA_THREADS) {
    const int r = c / (FM_K1 / 8), kc = c % (FM_K1 / 8);
    const long long gm = m0 + r;
    const bool ok = gm < M;
    fm_cp16(FM_SW(xs + (kc >> 3) * (FM_BM * 128), r, kc & 7), ok ? A + gm * FM_LDA + kc * 8 : A, ok ? 16 : 0);
  }
}
/* Chunk j of B: its 64 columns j*64.. as 64 K-major rows (K1 / 64 slices of 64 rows). */
__device__ __forceinline__ void fm_load_w1(unsigned ws, const unsigned short *__restrict__ B, int j, int tid) {
#pragma unroll 4
  for (int c = tid; c < 64 * (FM_K1 / 8); c += FM_MMA_THREADS) {
    const int r = c / (FM_K1 / 8), kc = c % (FM_K1 / 8);
    fm_cp16(FM_SW(ws + (kc >> 3) * (64 * 128), r, kc & 7), B + (long long)(j * 64 + r) * FM_LDB + kc * 8, 16);
  }
}
/* Chunk j of B2: its rows j*64 .. j*64+63 as N2 K-major rows of one 64-wide slice. */
__device__ __forceinline__ void fm_load_w2(unsigned ws, const unsigned short *__restrict__ B2, int j, int tid) {
#pragma unroll 4
  for (int c = tid; c < FM_N2 * 8; c += FM_MMA_THREADS) {
    const int r = c >> 3, kc = c & 7;
    fm_cp16(FM_SW(ws, r, kc), B2 + (long long)r * FM_LDB2 + j * 64 + kc * 8, 16);
  }
}
__device__ __forceinline__ unsigned fm_pack(unsigned short lo, unsigned short hi) {
  return (unsigned)lo | ((unsigned)hi << 16);
}
