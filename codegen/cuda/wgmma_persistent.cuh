// The persistent TMA forms (FM_GEMM_WGMMA_PERSISTENT and _PINGPONG), appended after fm_cg_gemm_tail (they
// order tiles with fm_tile_of).
/* ---- persistent schedule: the grid holds at most the blocks the device runs at once and
   each block strides over the output tiles, so the loader runs ahead into the next tile's
   k-tiles while the consumers run this tile's epilogue (whose slabs sit beside the
   stages, FM_SLAB_OFF). A block's k-tiles are counted across its tiles (it): the it-th
   uses stage it % FM_STAGES, so the mbarrier phases carry from one tile to the next.
   Ping-pong (FM_WG_PINGPONG): the block's tiles alternate between two consumer
   warpgroups, so one multiplies while the other runs its epilogue; the loader's order is
   the same, and tile j's k-tiles are the block's j * FM_KT ... ---- */
#ifdef FM_SIB
#define FM_COLT ((FM_N + FM_BN / 2 - 1) / (FM_BN / 2))   /* siblings: half a tile's columns are outputs */
#else
#define FM_COLT ((FM_N + FM_BN - 1) / FM_BN)
#endif
/* Work units: tiles, or (clusters of 2) pairs of row tiles of one column tile, the
   cluster's blocks taking one each and sharing B's boxes by multicast (fm_tma_load_both). */
#if FM_CLUSTER == 2
#define FM_UNIT0 ((int)blockIdx.x >> 1)
#define FM_UNIT_STRIDE ((int)gridDim.x >> 1)
#else
#define FM_UNIT0 ((int)blockIdx.x)
#define FM_UNIT_STRIDE ((int)gridDim.x)
#endif
__device__ __forceinline__ int fm_units(int tiles_m) {
  return (FM_CLUSTER == 2 ? (tiles_m + 1) / 2 : tiles_m) * FM_COLT;
}
/* This block's tile of work unit u (a cluster's second block: the pair's odd row tile,
   which may lie past M: its TMA boxes read zeros and its epilogue stores nothing). */
__device__ __forceinline__ void fm_unit_tile(int u, int tiles_m, int &tm, int &tn) {
#if FM_CLUSTER == 2
  int pm;
  fm_tile_of(u, (tiles_m + 1) / 2, FM_COLT, pm, tn);
  tm = 2 * pm + (blockIdx.x & 1);
#else
  fm_tile_of(u, tiles_m, FM_COLT, tm, tn);
#endif
}
/* Ping-pong turns: tile j's mainloop starts once tile j-1's (the other warpgroup's) ended,
   so the multiplies alternate, each under the other warpgroup's epilogue, and no
   warpgroup waits on a stage more than one fill ahead of the loader (an mbarrier wait
   tells phases apart by parity only). Named barrier 1 hands the turn to warpgroup 1, 2 to
   warpgroup 0; a turn is handed on only when tile j + 1 exists, so none is left open. */
__device__ __forceinline__ void fm_turn_wait(int j) {
#if FM_WG_PINGPONG
  if (j > 0) asm volatile("bar.sync %0, %1;\n" :: "r"((j & 1) ? 1 : 2), "n"(FM_MMA_THREADS) : "memory");
#else
  (void)j;
#endif
}
__device__ __forceinline__ void fm_turn_pass(int j, bool next) {
#if FM_WG_PINGPONG
  if (next) asm volatile("bar.arrive %0, %1;\n" :: "r"((j & 1) ? 2 : 1), "n"(FM_MMA_THREADS) : "memory");
#else
  (void)j, (void)next;
#endif
}
/* The loader (one thread): both boxes of every k-tile of every tile this block owns, each
   into a stage the consumers released. */
__device__ __forceinline__ void fm_load_tiles(const void *tma, const void *tmb FM_TMB2_PARAM, int tiles_m, int units) {
  unsigned base, full, empty;
  fm_pipe_bars(base, full, empty);
  asm volatile("prefetch.tensormap [%0];\n" :: "l"((unsigned long long)tma) : "memory");
  asm volatile("prefetch.tensormap [%0];\n" :: "l"((unsigned long long)tmb) : "memory");
  unsigned it = 0;
  for (int u = FM_UNIT0; u < units; u += FM_UNIT_STRIDE) {
    int tm, tn;
    fm_unit_tile(u, tiles_m, tm, tn);
    for (int kt = 0; kt < FM_KT; kt++, it++) {
      const unsigned s = it % FM_STAGES;
      if (it >= FM_STAGES) fm_mbar_wait(empty + 8 * s, ((it / FM_STAGES) - 1) & 1);
      asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n"
                   :: "r"(full + 8 * s), "r"(FM_STAGE_BYTES) : "memory");
      const unsigned sa = base + s * FM_STAGE_BYTES;
      fm_tma_load(sa, tma, kt * 64, tm * FM_BM, full + 8 * s);
#if FM_CLUSTER == 2
      const int half = (blockIdx.x & 1) * (FM_BN / 2);
      fm_tma_load_both(sa + FM_A_BYTES + half * 128, tmb, kt * 64, tn * FM_BN + half, full + 8 * s);
#else
      FM_LOAD_B(sa + FM_A_BYTES, kt * 64, tn * FM_BN, full + 8 * s);
#endif
    }
  }
}
/* The consumers: one tile's accumulators from the stages, it counting on from the block's
   previous tiles. Every stage is released once its wgmma batch retired, the last one
   before the epilogue, so the loader fills it with the next tile meanwhile. */
__device__ __forceinline__ void fm_mainloop_tile(float (&acc)[FM_MT][FM_NT][4], unsigned &it) {
  unsigned base, full, empty;
  fm_pipe_bars(base, full, empty);
  const int tid = threadIdx.x, wg = tid >> 7;
  if (!FM_ACC_BY_WGMMA) fm_acc_zero(acc);
  for (int kt = 0; kt < FM_KT; kt++, it++) {
    const unsigned s = it % FM_STAGES;
    fm_mbar_wait(full + 8 * s, (it / FM_STAGES) & 1);
    const unsigned sa = base + s * FM_STAGE_BYTES;
    /* A's rows: the warpgroup's half of the tile, or (ping-pong) the whole tile in FM_MT
       pieces of 64 */
    const unsigned long long da = fm_desc(sa + (FM_WG_PINGPONG ? 0 : wg) * 64 * 128), db = fm_desc(sa + FM_A_BYTES);
    fm_wg_fence();
#pragma unroll
    for (int kk = 0; kk < 4; kk++)
#pragma unroll
      for (int mt = 0; mt < FM_MT; mt++) fm_wgmma(acc[mt], da + mt * 512 + 2 * kk, db + 2 * kk, FM_ACC_ADD(kt, kk));
    fm_wg_commit();
    fm_wg_wait<1>();
    if (kt > 0) fm_release_by_warpgroup(empty + 8 * ((it - 1) % FM_STAGES));
  }
  fm_wg_wait<0>();
  fm_release_by_warpgroup(empty + 8 * ((it - 1) % FM_STAGES));
}
