// The TMA forms (FM_B2B_TMA, FM_B2B_TMA_PAIR): tensor maps of A [M, K1], B as [N1, K1] and B2 as [N2, N1] rows
// (launch metadata "tmaps", boxes of 64 columns: one 128-byte swizzle row). B's chunks and
// B2's stream through two rings of buffers (FM_S1 of B's 64 rows in K1 / 64 slices, FM_S2 of
// B2's N2 rows), each buffer with two mbarriers: full (the loader's expect-tx, completed by
// the bytes) and empty (one arrival per consumer warpgroup once its products left it). Two
// rings, not one of whole chunks, because the products of a chunk run a tensor turn apart
// (B's chunk j + 1 with B2's chunk j): a buffer of B is free a turn before its B2 half, and
// with whole chunks the two buffers that fit beside A's rows left the loads no lead at all
// (bench/NOTES.md, "The b2b rings"). The consumer warpgroups never meet at a barrier, so
// one's stage 1 runs on the ALUs while the other's products run on the tensor cores.
// After fm_cg_sm90 (fm_tmap, fm_tma_load(_both), fm_mbar_wait, fm_arrive_peer,
// fm_cluster_sync).
__device__ __forceinline__ void fm_mbar_init(unsigned bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" :: "r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void fm_mbar_expect(unsigned bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" :: "r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void fm_mbar_arrive(unsigned bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" :: "r"(bar) : "memory");
}
/* A pair of blocks (a cluster of 2: blockIdx.x is the rank) shares the weights: each loads
   half of every chunk into both (fm_tma_load_both), so L2 serves each chunk once per pair; a
   buffer is refilled once the consumers of both released it (empty counts both blocks'
   warpgroups). */
/* one consumer warpgroup done with a buffer, called by the one thread that speaks for it:
   an arrival on its empty barrier, in both blocks of a pair (each block's loader refills its
   own copy) */
__device__ __forceinline__ void fm_release_by_thread(unsigned bar) {
  fm_mbar_arrive(bar);
#if FM_CLUSTER == 2
  fm_arrive_peer(bar);
#endif
}
/* tensor turns of two consumer warpgroups (named barrier 1 + w: w's turn) */
#if FM_MMA_THREADS == 256
#define FM_TURN_WAIT(w) asm volatile("bar.sync %0, 256;\n" :: "r"(1 + (w)) : "memory")
#define FM_TURN_PASS(w) asm volatile("bar.arrive %0, 256;\n" :: "r"(1 + (w)) : "memory")
#else
#define FM_TURN_WAIT(w) ((void)0)
#define FM_TURN_PASS(w) ((void)0)
#endif
/* The loader: A's rows once (slice kt of 64 columns on mbarrier bars + 8 kt, so the first
   product starts on the first slice), then the chunks in the order the consumers
   need them (B's chunk j + 1 goes with B2's chunk j into the same tensor turn), each into
   its ring's next buffer once the consumers released what it held. Rows past M read as
   zeros (the map's bounds). */
__device__ __forceinline__ void fm_tma_w1(const void *tmw1, unsigned w1s, unsigned full1, unsigned empty1, int j) {
  const int s = j % FM_S1;
  if (j >= FM_S1) fm_mbar_wait(empty1 + 8 * s, ((j / FM_S1) - 1) & 1);
  const unsigned b = w1s + s * FM_W1_BYTES;
  fm_mbar_expect(full1 + 8 * s, FM_W1_BYTES);
#if FM_CLUSTER == 2
  /* this block's half (rows r*32 ..) into both blocks */
  const int r = blockIdx.x;
#pragma unroll
  for (int kt = 0; kt < FM_K1 / 64; kt++)
    fm_tma_load_both(b + kt * (64 * 128) + r * (32 * 128), tmw1, kt * 64, j * 64 + r * 32, full1 + 8 * s);
#else
#pragma unroll
  for (int kt = 0; kt < FM_K1 / 64; kt++) fm_tma_load(b + kt * (64 * 128), tmw1, kt * 64, j * 64, full1 + 8 * s);
#endif
}
__device__ __forceinline__ void fm_tma_w2(const void *tmw2, unsigned w2s, unsigned full2, unsigned empty2, int j) {
  const int s = j % FM_S2;
  if (j >= FM_S2) fm_mbar_wait(empty2 + 8 * s, ((j / FM_S2) - 1) & 1);
  const unsigned b = w2s + s * FM_W2_BYTES;
  fm_mbar_expect(full2 + 8 * s, FM_W2_BYTES);
#if FM_CLUSTER == 2
  /* this block's half (rows r*N2/2 ..) into both blocks */
  fm_tma_load_both(b + blockIdx.x * (FM_N2 / 2 * 128), tmw2, j * 64, blockIdx.x * (FM_N2 / 2), full2 + 8 * s);
#else
  fm_tma_load(b, tmw2, j * 64, 0, full2 + 8 * s);
#endif
}
__device__ __forceinline__ void fm_loader(const void *tmx, const void *tmw1, const void *tmw2, unsigned xs,
    unsigned w1s, unsigned w2s, unsigned bars, int m0) {
  const unsigned full1 = bars + 8 * (FM_K1 / 64), empty1 = full1 + 8 * FM_S1;
  const unsigned full2 = empty1 + 8 * FM_S1, empty2 = full2 + 8 * FM_S2;
  asm volatile("prefetch.tensormap [%0];\n" :: "l"((unsigned long long)tmw1) : "memory");
  asm volatile("prefetch.tensormap [%0];\n" :: "l"((unsigned long long)tmw2) : "memory");
#pragma unroll
  for (int kt = 0; kt < FM_K1 / 64; kt++) {
    fm_mbar_expect(bars + 8 * kt, FM_BM * 128);
    fm_tma_load(xs + kt * (FM_BM * 128), tmx, kt * 64, m0, bars + 8 * kt);
  }
  fm_tma_w1(tmw1, w1s, full1, empty1, 0);
  for (int j = 0; j < FM_CHUNKS; j++) {
    if (j + 1 < FM_CHUNKS) fm_tma_w1(tmw1, w1s, full1, empty1, j + 1);
    fm_tma_w2(tmw2, w2s, full2, empty2, j);
  }
}
