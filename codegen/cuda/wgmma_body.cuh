/* One k-tile of A (BM rows) and B (BN rows), 64 elements of K each, into the stage at
   shared address sa; chunks past M, N or K are zero-filled. */
__device__ __forceinline__ void fm_load_tile(unsigned sa, const unsigned short *__restrict__ A,
    const unsigned short *__restrict__ B, long long M, long long m0, int n0, int k0, int tid) {
#pragma unroll
  for (int c = tid; c < FM_BM * 8; c += FM_LOADERS) {
    const int r = c >> 3, kc = c & 7;
    const long long gm = m0 + r;
    const int gk = k0 + kc * 8;
    const bool ok = gm < M && gk < FM_K;
    fm_cp16(sa + r * 128 + ((kc ^ (r & 7)) << 4), ok ? A + gm * FM_LDA + gk : A, ok ? 16 : 0);
  }
  const unsigned sb = sa + FM_A_BYTES;
#pragma unroll
  for (int c = tid; c < FM_BN * 8; c += FM_LOADERS) {
    const int r = c >> 3, kc = c & 7;
    const int gn = n0 + r, gk = k0 + kc * 8;
    const bool ok = gn < FM_N && gk < FM_K;
    fm_cp16(sb + r * 128 + ((kc ^ (r & 7)) << 4), ok ? B + (long long)gn * FM_LDB + gk : B, ok ? 16 : 0);
  }
}
/* fm_mbar_wait, and for the TMA forms fm_tmap, fm_tma_load(_both), fm_arrive_peer and
   fm_cluster_sync: the sm_90 helpers above */
#if FM_WG_TMA
#ifndef FM_CLUSTER
#define FM_CLUSTER 1
#endif
/* The stages (1024-byte aligned for the swizzle) and their two mbarriers each, after them. */
__device__ __forceinline__ void fm_pipe_bars(unsigned &base, unsigned &full, unsigned &empty) {
  base = (fm_saddr(fm_smem) + 1023u) & ~1023u;
  full = base + FM_STAGES * FM_STAGE_BYTES;
  empty = full + FM_STAGES * 8;
}
/* full[s]: armed by the loader with the stage's bytes; empty[s]: one arrival per warpgroup
   reading it (in a cluster, of both blocks: B's box lands in both). A warpgroup's
   wgmma.wait_group retires the whole warpgroup's batch, so one thread of it speaks for all
   four warps (fm_release_by_warpgroup). */
#define FM_STAGE_READERS (FM_WM / 4)
__device__ __forceinline__ void fm_pipe_init() {
  unsigned base, full, empty;
  fm_pipe_bars(base, full, empty);
  if (threadIdx.x == 0) {
    for (int s = 0; s < FM_STAGES; s++) {
      asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" :: "r"(full + 8 * s), "r"(1) : "memory");
      asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" :: "r"(empty + 8 * s), "r"(FM_STAGE_READERS * FM_CLUSTER) : "memory");
    }
    /* the barriers are used by the async proxy (TMA's complete_tx) and the partner block */
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
#if FM_CLUSTER == 2
  /* neither block signals or fills the other before both initialised their barriers */
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
#else
  __syncthreads();
#endif
}
/* The end of the block: in a cluster, neither block leaves while the other may still
   arrive on its barriers (every thread of both takes part). */
__device__ __forceinline__ void fm_pipe_done() {
#if FM_CLUSTER == 2
  fm_cluster_sync();
#endif
}
/* Every thread of a consumer warpgroup calls this once its wgmma batch that read a stage
   retired: one thread arrives on the stage's empty barrier and, in a cluster, another on
   the other block's (whose loader multicasts into this block too). */
__device__ __forceinline__ void fm_release_by_warpgroup(unsigned bar) {
  const int t = threadIdx.x & 127;
  if (t == 0) asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" :: "r"(bar) : "memory");
#if FM_CLUSTER == 2
  if (t == 32) fm_arrive_peer(bar);
#endif
}
/* The first thread of the warp after the consumers issues two TMA boxes per k-tile (A's BM rows, B's BN rows) once
   the consumers released the stage (mbarrier empty[s], one arrival per consumer warpgroup) and
   arms full[s] with the stage's byte count; the consumers wait on full[s], multiply, and
   release the previous k-tile's stage once its wgmma batch retired (only the stages a
   later k-tile refills). Edges need no predicates: the tensor map zero-fills past M, N
   and K. FM_CLUSTER 2: the pair of blocks (row tiles 2p, 2p + 1 of one column tile,
   fm_tile_coords) shares B: each loads half of B's rows into both blocks, so a stage is
   refilled only once the consumers of both released it (empty[s] counts both blocks'
   warpgroups). A block past M runs the pipeline all the same (TMA reads zeros; the epilogue
   stores nothing), since its partner needs its half of B. */
#ifdef FM_SIB
/* Siblings: B's stage rows are B's BN / 2 rows of the tile's output columns (from n0 / 2),
   then B2's same rows: two boxes through two maps, the stage laid out as one box of BN. */
#define FM_TMB2_PARAM , const void *tmb2
#define FM_LOAD_B(dst, k, n0, bar)                                  \
  do {                                                              \
    fm_tma_load((dst), tmb, (k), (n0) / 2, (bar));                  \
    fm_tma_load((dst) + FM_BN / 2 * 128, tmb2, (k), (n0) / 2, (bar)); \
  } while (0)
#else
#define FM_TMB2_PARAM
#define FM_LOAD_B(dst, k, n0, bar) fm_tma_load((dst), tmb, (k), (n0), (bar))
#endif
__device__ __forceinline__ void fm_mainloop(float (&acc)[FM_MT][FM_NT][4], const void *tma,
    const void *tmb FM_TMB2_PARAM, long long M, long long m0, int n0) {
  unsigned base, full, empty;
  fm_pipe_bars(base, full, empty);
  const int tid = threadIdx.x, wg = tid >> 7;
  (void)M;
  if (!FM_ACC_BY_WGMMA) fm_acc_zero(acc);
  fm_pipe_init();
  if (tid >= FM_WM * 32) {
    if (tid != FM_WM * 32) return;
    asm volatile("prefetch.tensormap [%0];\n" :: "l"((unsigned long long)tma) : "memory");
    asm volatile("prefetch.tensormap [%0];\n" :: "l"((unsigned long long)tmb) : "memory");
    for (int kt = 0; kt < FM_KT; kt++) {
      const int s = kt % FM_STAGES;
      if (kt >= FM_STAGES) fm_mbar_wait(empty + 8 * s, ((kt / FM_STAGES) - 1) & 1);
      asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n"
                   :: "r"(full + 8 * s), "r"(FM_STAGE_BYTES) : "memory");
      const unsigned sa = base + s * FM_STAGE_BYTES;
      fm_tma_load(sa, tma, kt * 64, (int)m0, full + 8 * s);
#if FM_CLUSTER == 2
      const int half = (blockIdx.x & 1) * (FM_BN / 2);
      fm_tma_load_both(sa + FM_A_BYTES + half * 128, tmb, kt * 64, n0 + half, full + 8 * s);
#else
      FM_LOAD_B(sa + FM_A_BYTES, kt * 64, n0, full + 8 * s);
#endif
    }
    return;
  }
  for (int kt = 0; kt < FM_KT; kt++) {
    const int s = kt % FM_STAGES;
    fm_mbar_wait(full + 8 * s, (kt / FM_STAGES) & 1);
    const unsigned sa = base + s * FM_STAGE_BYTES;
    const unsigned long long da = fm_desc(sa + wg * 64 * 128), db = fm_desc(sa + FM_A_BYTES);
    fm_wg_fence();
#pragma unroll
    for (int kk = 0; kk < 4; kk++) fm_wgmma(acc[0], da + 2 * kk, db + 2 * kk, FM_ACC_ADD(kt, kk));
    fm_wg_commit();
    fm_wg_wait<1>();
    /* this warpgroup's reads of the previous k-tile's stage are done: release it if refilled */
    if (kt > 0 && kt - 1 + FM_STAGES < FM_KT) fm_release_by_warpgroup(empty + 8 * ((kt - 1) % FM_STAGES));
  }
  fm_wg_wait<0>();
}
#elif FM_WG_SPECIALIZED
/* Warpgroup 0 fills stage kt %% FM_STAGES once the consumers released it (mbarrier
   empty[s]) and signals full[s] when its cp.asyncs land; warpgroups 1 and 2 wait on
   full[s], multiply, and release the stage of the previous k-tile once its wgmma batch
   retired. No block-wide barrier in the loop. */
__device__ __forceinline__ void fm_mainloop(float (&acc)[FM_MT][FM_NT][4],
    const unsigned short *__restrict__ A, const unsigned short *__restrict__ B,
    long long M, long long m0, int n0) {
  const unsigned base = (fm_saddr(fm_smem) + 1023u) & ~1023u;
  const unsigned full = base + FM_STAGES * FM_STAGE_BYTES, empty = full + FM_STAGES * 8;
  const int tid = threadIdx.x, wg = tid >> 7;
  if (!FM_ACC_BY_WGMMA) fm_acc_zero(acc);
  if (tid == 0)
    for (int s = 0; s < FM_STAGES; s++) {
      asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" :: "r"(full + 8 * s), "r"(128) : "memory");
      asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" :: "r"(empty + 8 * s), "r"(FM_WM * 32) : "memory");
    }
  __syncthreads();
  if (wg == 0) {
    for (int kt = 0; kt < FM_KT; kt++) {
      const int s = kt % FM_STAGES;
      if (kt >= FM_STAGES) fm_mbar_wait(empty + 8 * s, ((kt / FM_STAGES) - 1) & 1);
      fm_load_tile(base + s * FM_STAGE_BYTES, A, B, M, m0, n0, kt * 64, tid);
      asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" :: "r"(full + 8 * s) : "memory");
    }
    return;
  }
  for (int kt = 0; kt < FM_KT; kt++) {
    const int s = kt % FM_STAGES;
    fm_mbar_wait(full + 8 * s, (kt / FM_STAGES) & 1);
    /* the loads were generic-proxy writes; wgmma reads through the async proxy */
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    const unsigned sa = base + s * FM_STAGE_BYTES;
    const unsigned long long da = fm_desc(sa + (wg - 1) * 64 * 128), db = fm_desc(sa + FM_A_BYTES);
    fm_wg_fence();
#pragma unroll
    for (int kk = 0; kk < 4; kk++) fm_wgmma(acc[0], da + 2 * kk, db + 2 * kk, FM_ACC_ADD(kt, kk));
    fm_wg_commit();
    fm_wg_wait<1>();
    if (kt > 0) asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" :: "r"(empty + 8 * ((kt - 1) % FM_STAGES)) : "memory");
  }
  fm_wg_wait<0>();
}
#else
/* The first FM_AHEAD k-tiles of the tile at m0 into stages 0 .. FM_AHEAD-1, one cp.async
   group each. Every warpgroup must be done reading those stages. */
__device__ __forceinline__ void fm_prologue(const unsigned short *__restrict__ A,
    const unsigned short *__restrict__ B, long long M, long long m0, int n0) {
  /* the dynamic allocation carries 1 KiB of slack for this alignment */
  const unsigned base = (fm_saddr(fm_smem) + 1023u) & ~1023u;
#pragma unroll
  for (int s = 0; s < FM_AHEAD; s++) {
    if (s < FM_KT) fm_load_tile(base + s * FM_STAGE_BYTES, A, B, M, m0, n0, s * 64, threadIdx.x);
    fm_cp_commit();
  }
}
/* The K loop after fm_prologue for the same tile; acc comes back with A@B for the warp's
   16 rows, every cp.async landed and every wgmma retired. */
__device__ __forceinline__ void fm_mainloop_rest(float (&acc)[FM_MT][FM_NT][4],
    const unsigned short *__restrict__ A, const unsigned short *__restrict__ B,
    long long M, long long m0, int n0) {
  const unsigned base = (fm_saddr(fm_smem) + 1023u) & ~1023u;
  const int tid = threadIdx.x, wg = tid >> 7;
  if (!FM_ACC_BY_WGMMA) fm_acc_zero(acc);
  for (int kt = 0; kt < FM_KT; kt++) {
    /* k-tile kt has landed; after the barrier every warpgroup has also retired the
       wgmma batches that read the stage refilled below */
    fm_cp_wait<FM_AHEAD - 1>();
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    const int nk = kt + FM_AHEAD;
    if (nk < FM_KT) fm_load_tile(base + (nk % FM_STAGES) * FM_STAGE_BYTES, A, B, M, m0, n0, nk * 64, tid);
    fm_cp_commit();
    const unsigned sa = base + (kt % FM_STAGES) * FM_STAGE_BYTES;
    const unsigned long long da = fm_desc(sa + wg * 64 * 128), db = fm_desc(sa + FM_A_BYTES);
    fm_wg_fence();
#pragma unroll
    for (int kk = 0; kk < 4; kk++) fm_wgmma(acc[0], da + 2 * kk, db + 2 * kk, FM_ACC_ADD(kt, kk));   /* +32 bytes of K */
    fm_wg_commit();
    fm_wg_wait<FM_WG_INFLIGHT>();
  }
  fm_wg_wait<0>();
  fm_cp_wait<0>();
}
/* The whole K loop for the block's tile. */
__device__ __forceinline__ void fm_mainloop(float (&acc)[FM_MT][FM_NT][4],
    const unsigned short *__restrict__ A, const unsigned short *__restrict__ B,
    long long M, long long m0, int n0) {
  fm_prologue(A, B, M, m0, n0);
  fm_mainloop_rest(acc, A, B, M, m0, n0);
}
#endif
