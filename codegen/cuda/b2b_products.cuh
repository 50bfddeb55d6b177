// The two products of one chunk, issued and committed (the caller waits): after fm_wgmma1/2.
/* acc = this warpgroup's A rows x B's chunk at w1: the first k-step does not accumulate, so
   no other instruction writes acc (that would make ptxas serialise the wgmma) */
__device__ __forceinline__ void fm_gemm1(float (&acc)[8][4], unsigned long long da, unsigned w1,
    unsigned xbars = 0) {
  fm_wg_fence();
#pragma unroll
  for (int kt = 0; kt < FM_K1 / 64; kt++) {
#if FM_WS
    if (xbars) fm_mbar_wait(xbars + 8 * kt, 0);   /* the first product: A's slice kt landed */
#endif
    const unsigned long long db = fm_desc(w1 + kt * (64 * 128));
#pragma unroll
    for (int kk = 0; kk < 4; kk++) fm_wgmma1(acc, da + kt * (FM_BM * 128 / 16) + 2 * kk, db + 2 * kk, kt | kk);
  }
  fm_wg_commit();
}
/* acc2 += the packed stage-1 values x B2's chunk at w2 (chunk 0 starts it: never zeroed) */
__device__ __forceinline__ void fm_gemm2(float (&acc2)[FM_N2 / 8][4], const unsigned (&af)[4][4], unsigned w2,
    int j) {
  fm_wg_fence();
  const unsigned long long db = fm_desc(w2);
#pragma unroll
  for (int kk = 0; kk < 4; kk++) fm_wgmma2(acc2, af[kk], db + 2 * kk, j | kk);
  fm_wg_commit();
}
