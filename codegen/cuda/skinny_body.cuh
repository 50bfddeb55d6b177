// The fixed part: loads, the K loop, the cross-warp sum. Needs FM_BN, FM_WARPS, FM_UNROLL,
// FM_PIPE, FM_X1, FM_K, FM_N, FM_LDA, FM_LDB and fm_mma() defined before it.
/* ---- skinny mainloop (sm_80+: W streamed into registers or a warp-private cp.async ring, mma.sync) ---- */
#define FM_THREADS (FM_WARPS * 32)
#define FM_NT (FM_BN / 8)
#define FM_KC ((FM_K + 63) / 64)
/* the warps along K: FM_SPLIT blocks of FM_WARPS (a cluster); block rank r's warp w is
   K-warp r * FM_WARPS + w, and K-warp kw takes chunks kw, kw + FM_KWARPS, ... */
#define FM_KWARPS (FM_WARPS * FM_SPLIT)
#define FM_STEP (FM_KWARPS * FM_UNROLL)
__device__ __forceinline__ int fm_krank() { return FM_SPLIT > 1 ? (int)(blockIdx.x % FM_SPLIT) : 0; }
/* 16 bytes of W, read once: L1 is bypassed so that it keeps x; zeros where !ok */
__device__ __forceinline__ uint4 fm_ldw(const unsigned short *p, bool ok) {
  uint4 v;
  asm("{\n .reg .pred p;\n setp.ne.b32 p, %5, 0;\n"
      " mov.b32 %0, 0;\n mov.b32 %1, 0;\n mov.b32 %2, 0;\n mov.b32 %3, 0;\n"
      " @p ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];\n}\n"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p), "r"((int)ok));
  return v;
}
/* 16 bytes of x (small, read by every block: kept in L1); zeros where !ok. Predicated
   in PTX like fm_ldw: a branch per load would split the step into basic blocks. */
__device__ __forceinline__ uint4 fm_ldx(const unsigned short *p, bool ok) {
  uint4 v;
  asm("{\n .reg .pred p;\n setp.ne.b32 p, %5, 0;\n"
      " mov.b32 %0, 0;\n mov.b32 %1, 0;\n mov.b32 %2, 0;\n mov.b32 %3, 0;\n"
      " @p ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];\n}\n"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p), "r"((int)ok));
  return v;
}
/* k-pair i (0..7) of the thread's 16 elements, held as two uint4 */
__device__ __forceinline__ unsigned fm_pair(const uint4 (&v)[2], int i) {
  const uint4 h = v[i >> 2];
  return (i & 3) == 0 ? h.x : (i & 3) == 1 ? h.y : (i & 3) == 2 ? h.z : h.w;
}
/* The thread's two 8-element halves of a 64-wide chunk at k: elements k + 8q .. +7 and
   k + 32 + 8q .. +7, so that the 4 lanes of a row read 64 contiguous bytes (two whole
   sectors) per load instruction. Each half is wholly in or out (K is a multiple of 8). */
#define FM_H0(k, q) ((k) + 8 * (q))
#define FM_H1(k, q) ((k) + 32 + 8 * (q))
/* The W of one step: chunks c0 + u * FM_WARPS (u < FM_UNROLL) of the warp's FM_NT rows. */
__device__ __forceinline__ void fm_load_w(uint4 (&wv)[FM_UNROLL][FM_NT][2],
    const unsigned short *const (&w)[FM_NT], const bool (&wok)[FM_NT], int c0, int q) {
#pragma unroll
  for (int u = 0; u < FM_UNROLL; u++) {
    const int k = (c0 + u * FM_KWARPS) * 64;
    const bool k0 = FM_H0(k, q) < FM_K, k1 = FM_H1(k, q) < FM_K;
#pragma unroll
    for (int nt = 0; nt < FM_NT; nt++) {
      wv[u][nt][0] = fm_ldw(w[nt] + FM_H0(k, 0), wok[nt] && k0);
      wv[u][nt][1] = fm_ldw(w[nt] + FM_H1(k, 0), wok[nt] && k1);
    }
  }
}
/* The x of one step: rows g and g + 8 (the latter never read when M <= 8 is static). */
__device__ __forceinline__ void fm_load_x(uint4 (&xv)[FM_UNROLL][2][2], const unsigned short *x0,
    const unsigned short *x1, bool x0ok, bool x1ok, int c0, int q) {
#pragma unroll
  for (int u = 0; u < FM_UNROLL; u++) {
    const int k = (c0 + u * FM_KWARPS) * 64;
    const bool k0 = FM_H0(k, q) < FM_K, k1 = FM_H1(k, q) < FM_K;
    xv[u][0][0] = fm_ldx(x0 + FM_H0(k, 0), x0ok && k0);
    xv[u][0][1] = fm_ldx(x0 + FM_H1(k, 0), x0ok && k1);
#if FM_X1
    xv[u][1][0] = fm_ldx(x1 + FM_H0(k, 0), x1ok && k0);
    xv[u][1][1] = fm_ldx(x1 + FM_H1(k, 0), x1ok && k1);
#else
    (void)x1; (void)x1ok;
    xv[u][1][0] = xv[u][1][1] = make_uint4(0u, 0u, 0u, 0u);
#endif
  }
}
/* The math of one step: 4 mma k-steps per chunk and n-tile (the K permutation above). */
__device__ __forceinline__ void fm_step_mma(float (&acc)[FM_NT][4],
    const uint4 (&wv)[FM_UNROLL][FM_NT][2], const uint4 (&xv)[FM_UNROLL][2][2]) {
#pragma unroll
  for (int u = 0; u < FM_UNROLL; u++)
#pragma unroll
    for (int s = 0; s < 4; s++) {
      const unsigned a[4] = {fm_pair(xv[u][0], 2 * s), fm_pair(xv[u][1], 2 * s),
                             fm_pair(xv[u][0], 2 * s + 1), fm_pair(xv[u][1], 2 * s + 1)};
#pragma unroll
      for (int nt = 0; nt < FM_NT; nt++)
        fm_mma(acc[nt], a, fm_pair(wv[u][nt], 2 * s), fm_pair(wv[u][nt], 2 * s + 1));
    }
}
#if FM_PIPE >= 2
/* The cp.async ring: FM_PIPE stages per warp, each FM_UNROLL x FM_NT pieces of 1 KiB (one
   chunk of 8 W rows) kept in lane order (lane l's halves at 16 l and 512 + 16 l), so every
   thread reads back exactly the bytes it copied: no barrier, and conflict-free LDS.128. */
#define FM_RING_STAGE (FM_UNROLL * FM_NT * 1024)
extern __shared__ __align__(128) unsigned char fm_ring[];
__device__ __forceinline__ void fm_cpw(unsigned dst, const unsigned short *src, const unsigned short *base, bool ok) {
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n"
               :: "r"(dst), "l"(ok ? src : base), "r"(ok ? 16 : 0) : "memory");
}
__device__ __forceinline__ void fm_ring_issue(unsigned stage, const unsigned short *B,
    const unsigned short *const (&w)[FM_NT], const bool (&wok)[FM_NT], int c0, int q, int lane) {
#pragma unroll
  for (int u = 0; u < FM_UNROLL; u++) {
    const int k = (c0 + u * FM_KWARPS) * 64;
    /* chunks past K (the last steps) copy nothing: src-size 0 zero-fills */
    const bool k0 = FM_H0(k, q) < FM_K, k1 = FM_H1(k, q) < FM_K;
#pragma unroll
    for (int nt = 0; nt < FM_NT; nt++) {
      const unsigned d = stage + (u * FM_NT + nt) * 1024 + lane * 16;
      fm_cpw(d, w[nt] + FM_H0(k, 0), B, wok[nt] && k0);
      fm_cpw(d + 512, w[nt] + FM_H1(k, 0), B, wok[nt] && k1);
    }
  }
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
__device__ __forceinline__ void fm_ring_read(uint4 (&wv)[FM_UNROLL][FM_NT][2], const unsigned char *stage, int lane) {
#pragma unroll
  for (int u = 0; u < FM_UNROLL; u++)
#pragma unroll
    for (int nt = 0; nt < FM_NT; nt++) {
      wv[u][nt][0] = *(const uint4 *)(stage + (u * FM_NT + nt) * 1024 + lane * 16);
      wv[u][nt][1] = *(const uint4 *)(stage + (u * FM_NT + nt) * 1024 + 512 + lane * 16);
    }
}
#endif
/* acc[nt] = the mma accumulators of rows m0 .. m0+15 x columns n0 + 8 nt .. +7 over this
   warp's K chunks (warp, warp + FM_WARPS, ...). */
__device__ __forceinline__ void fm_skinny_mainloop(float (&acc)[FM_NT][4],
    const unsigned short *__restrict__ A, const unsigned short *__restrict__ B,
    long long M, long long m0, int n0) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
  const int kw = fm_krank() * FM_WARPS + warp;
  const bool x0ok = m0 + g < M, x1ok = m0 + g + 8 < M;
  const unsigned short *x0 = A + (x0ok ? m0 + g : 0) * FM_LDA + 8 * q;
  const unsigned short *x1 = A + (x1ok ? m0 + g + 8 : 0) * FM_LDA + 8 * q;
  const unsigned short *w[FM_NT];
  bool wok[FM_NT];
#pragma unroll
  for (int nt = 0; nt < FM_NT; nt++) {
    const int n = n0 + nt * 8 + g;
    wok[nt] = n < FM_N;
    w[nt] = B + (long long)(wok[nt] ? n : 0) * FM_LDB + 8 * q;
#pragma unroll
    for (int e = 0; e < 4; e++) acc[nt][e] = 0.0f;
  }
#if FM_PIPE >= 2
  /* FM_PIPE - 1 steps of W in flight while one multiplies; cp.async needs no registers, so
     ptxas cannot trade them away by sinking loads to their uses */
  unsigned char *ring = fm_ring + warp * FM_PIPE * FM_RING_STAGE;
  const unsigned ring_s = (unsigned)__cvta_generic_to_shared(ring);
#pragma unroll
  for (int s = 0; s < FM_PIPE - 1; s++) fm_ring_issue(ring_s + s * FM_RING_STAGE, B, w, wok, kw + s * FM_STEP, q, lane);
  int st = 0;
  for (int c0 = kw; c0 < FM_KC; c0 += FM_STEP) {
    uint4 wv[FM_UNROLL][FM_NT][2], xv[FM_UNROLL][2][2];
    asm volatile("cp.async.wait_group %0;\n" :: "n"(FM_PIPE - 2) : "memory");
    fm_ring_read(wv, ring + st * FM_RING_STAGE, lane);
    fm_load_x(xv, x0, x1, x0ok, x1ok, c0, q);
    /* the stage refilled is the one read in the previous step, whose values the mma of that
       step consumed: this thread's reads of it are complete */
    const int fill = st == 0 ? FM_PIPE - 1 : st - 1;
    fm_ring_issue(ring_s + fill * FM_RING_STAGE, B, w, wok, c0 + (FM_PIPE - 1) * FM_STEP, q, lane);
    fm_step_mma(acc, wv, xv);
    st = st == FM_PIPE - 1 ? 0 : st + 1;
  }
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
#elif FM_PIPE
  /* W prefetched one step ahead in registers */
  uint4 wv[FM_UNROLL][FM_NT][2];
  fm_load_w(wv, w, wok, kw, q);
  for (int c0 = kw; c0 < FM_KC; c0 += FM_STEP) {
    uint4 xv[FM_UNROLL][2][2], wn[FM_UNROLL][FM_NT][2];
    fm_load_x(xv, x0, x1, x0ok, x1ok, c0, q);
    fm_load_w(wn, w, wok, c0 + FM_STEP, q);
    fm_step_mma(acc, wv, xv);
#pragma unroll
    for (int u = 0; u < FM_UNROLL; u++)
#pragma unroll
      for (int nt = 0; nt < FM_NT; nt++) {
        wv[u][nt][0] = wn[u][nt][0];
        wv[u][nt][1] = wn[u][nt][1];
      }
  }
#else
  /* each step's loads, then its math (ptxas interleaves them as it sees fit) */
  for (int c0 = kw; c0 < FM_KC; c0 += FM_STEP) {
    uint4 wv[FM_UNROLL][FM_NT][2], xv[FM_UNROLL][2][2];
    fm_load_w(wv, w, wok, c0, q);
    fm_load_x(xv, x0, x1, x0ok, x1ok, c0, q);
    fm_step_mma(acc, wv, xv);
  }
#endif
}
/* one row of partial sums per (warp, row), padded so a warp's float2 writes spread over
   the banks */
#define FM_RED_LD (FM_BN + 4)
/* The warps' accumulators into red[warp][row][col] (mma layout: thread (g, q) holds
   columns 2q, 2q+1 of rows g and g + 8 in each n-tile). */
__device__ __forceinline__ void fm_skinny_stage(float *red, const float (&acc)[FM_NT][4]) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
  float *r = red + warp * 16 * FM_RED_LD;
#pragma unroll
  for (int nt = 0; nt < FM_NT; nt++) {
    *(float2 *)(r + g * FM_RED_LD + nt * 8 + 2 * q) = make_float2(acc[nt][0], acc[nt][1]);
    *(float2 *)(r + (g + 8) * FM_RED_LD + nt * 8 + 2 * q) = make_float2(acc[nt][2], acc[nt][3]);
  }
}
/* Four partial sums red[i .. i+3] (i a multiple of 4) of the cluster's block rank; the
   block's own without a split. */
__device__ __forceinline__ float4 fm_red4(const float *red, int rank, int i) {
#if FM_SPLIT > 1
  unsigned a = (unsigned)__cvta_generic_to_shared(red + i), r;
  float4 v;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(rank));
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(r) : "memory");
  return v;
#else
  (void)rank;
  return *(const float4 *)(red + i);
#endif
}
