/* fusemld b2b kernel: fm_b2b_128_tma, chained GEMMs 256 -> 1024 -> 256, bf16 */
#define FM_FAST_MATH 2
/* ---- prelude: storage conversions (16-bit floats are unsigned short) ---- */
__device__ __forceinline__ float fm_bf16_to_f32(unsigned short h) {
  return __uint_as_float(((unsigned int)h) << 16);
}
__device__ __forceinline__ unsigned short fm_f32_to_bf16(float f) {
  /* one instruction on sm_80+ (every target): round to nearest even, NaN stays NaN */
  unsigned short h;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}
__device__ __forceinline__ float fm_f16_to_f32(unsigned short h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}
__device__ __forceinline__ unsigned short fm_f32_to_f16(float f) {
  unsigned short h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}
__device__ __forceinline__ float fm_round_bf16(float x) { return fm_bf16_to_f32(fm_f32_to_bf16(x)); }
__device__ __forceinline__ float fm_round_f16(float x) { return fm_f16_to_f32(fm_f32_to_f16(x)); }
/* ---- prelude: ops (fp32; NaN propagates like torch) ---- */
/* max.NaN/min.NaN (sm_80+, every target): one instruction where the (a != a) ? a : ...
 * form took five, which made a row's running max the issue-bound part of a streamed
 * cross-entropy. A NaN operand gives the canonical NaN. */
__device__ __forceinline__ float fm_maximum(float a, float b) {
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
__device__ __forceinline__ float fm_minimum(float a, float b) {
  float r;
  asm("min.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
__device__ __forceinline__ float fm_relu(float x) { return (x != x) ? x : fmaxf(x, 0.0f); }
/* Transcendentals and division. FM_FAST_MATH is 1 when any float input or output is
 * 16-bit: its values carry 2^-9 (bf16) or 2^-12 (f16) relative rounding, and the
 * fragment's f32 values (a loss's log-sum-exp, statistics, a gradient kept in f32) are
 * checked to 1e-4 of an fp64 reference, so functions accurate to ~1e-6 (hardware
 * ex2/rcp approximations, division to 2 ulp over the full range, as Triton's kernels
 * use in fp32 too) cannot be told from exact ones, and they are several times cheaper:
 * the IEEE-exact library versions made Gemma 2's soft-capped cross-entropy compute-bound.
 * It is 2 when every output is bf16: GELU then takes a shorter fit (below). A fragment
 * that is f32 throughout (a model in fp32) keeps the exact library functions. */
#if FM_FAST_MATH
__device__ __forceinline__ float fm_exp(float x) { return __expf(x); }
__device__ __forceinline__ float fm_rcp(float x) { return __fdividef(1.0f, x); }
__device__ __forceinline__ float fm_div(float a, float b) {
  float q;
  asm("div.full.f32 %0, %1, %2;" : "=f"(q) : "f"(a), "f"(b));
  return q;
}
__device__ __forceinline__ float fm_tanh(float x) {
  /* tanh|x| = 1 - 2/(1+e^2|x|), abs error ~1e-7; below 2^-4 the odd series x - x^3/3
   * (truncation error < 2e-7 relative) avoids the cancellation. */
  const float a = fabsf(x);
  const float big = 1.0f - 2.0f * fm_rcp(1.0f + __expf(2.0f * a));
  const float small = a - 0.333333343f * a * a * a;
  return copysignf(a < 0.0625f ? small : big, x);
}
__device__ __forceinline__ float fm_gelu(float x) {
  /* x Phi(x) = relu(x) - |x| Phi(-|x|) (both signs: x - x Phi(-x) = x Phi(x) for x >= 0),
   * with Phi(-a) = 0.5 erfc(a / sqrt 2) = 2^q(a): q a degree-7 fit of log2 Phi(-a) on
   * [0, 4.5 sqrt 2] (relative error of Phi(-a) <= 1e-5 evaluated in fp32), decreasing
   * monotonically beyond it (q < -33 there; -inf past fp32, where 2^q = 0), so it needs no
   * clamp. No cancellation on either side, one rounding in the last step, one MUFU op (the
   * ex2), no branch, |x| an operand modifier: 11 instructions an element where the
   * degree-9 erfc form took 15. That matters: GELU is the cost of a short-K GEMM's
   * epilogue (16384 x 1024 x 256 + bias 0.026 ms; + GELU 0.033 before). |x| is capped at
   * FLT_MAX in the product so that +inf gives +inf (inf x 2^-inf would be NaN). */
  const float a = fabsf(x);
#if FM_FAST_MATH == 2
  /* bf16 outputs only: a degree-5 fit on the same range, relative error of Phi(-a)
   * <= 4.8e-4, an eighth of a bf16 ulp (it would be a whole f16 one), still decreasing past
   * the range: 9 instructions an element. GELU is the issue time of a short-K GEMM's
   * epilogue, each instruction an element ~2% of 16384 x 1024 x 256 (bench/NOTES.md). */
  float q = -1.815963312e-04f;
  q = fmaf(q, a, 4.192861628e-03f);
  q = fmaf(q, a, -4.153857518e-02f);
  q = fmaf(q, a, -4.752223230e-01f);
  q = fmaf(q, a, -1.142837962e+00f);
  q = fmaf(q, a, -1.000686284e+00f);
#else
  float q = -1.805704528e-06f;
  q = fmaf(q, a, 6.097363439e-05f);
  q = fmaf(q, a, -9.252218297e-04f);
  q = fmaf(q, a, 8.485276252e-03f);
  q = fmaf(q, a, -5.390930921e-02f);
  q = fmaf(q, a, -4.585215449e-01f);
  q = fmaf(q, a, -1.151223660e+00f);
  q = fmaf(q, a, -9.999988675e-01f);
#endif
  float h;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(h) : "f"(q));
  return fmaf(-fminf(a, 3.402823466e+38f), h, fmaxf(x, 0.0f));
}
#else
__device__ __forceinline__ float fm_exp(float x) { return expf(x); }
__device__ __forceinline__ float fm_rcp(float x) { return 1.0f / x; }
__device__ __forceinline__ float fm_div(float a, float b) { return a / b; }
__device__ __forceinline__ float fm_tanh(float x) { return tanhf(x); }
__device__ __forceinline__ float fm_gelu(float x) {
  return 0.5f * x * (1.0f + erff(x * 0.70710678f));
}
#endif
__device__ __forceinline__ float fm_gelu_tanh(float x) {
  /* PyTorch's approximate='tanh': sqrt(2/pi) * (x + 0.044715 x^3) */
  return 0.5f * x * (1.0f + fm_tanh(0.797884561f * (x + 0.044715f * x * x * x)));
}
__device__ __forceinline__ float fm_sigmoid(float x) { return fm_rcp(1.0f + fm_exp(-x)); }
__device__ __forceinline__ float fm_silu(float x) { return x * fm_sigmoid(x); }
/* ---- prelude: elements of a vector register (k, e are constants after unrolling) ---- */
__device__ __forceinline__ unsigned int fm_word(const uint4 &r, int k) {
  return k == 0 ? r.x : k == 1 ? r.y : k == 2 ? r.z : r.w;
}
__device__ __forceinline__ unsigned int fm_word(const uint2 &r, int k) { return k == 0 ? r.x : r.y; }
__device__ __forceinline__ unsigned int fm_word(unsigned int r, int) { return r; }
__device__ __forceinline__ unsigned int fm_word(unsigned short r, int) { return r; }
__device__ __forceinline__ void fm_or_word(uint4 &r, int k, unsigned int b) {
  if (k == 0) r.x |= b; else if (k == 1) r.y |= b; else if (k == 2) r.z |= b; else r.w |= b;
}
__device__ __forceinline__ void fm_or_word(uint2 &r, int k, unsigned int b) {
  if (k == 0) r.x |= b; else r.y |= b;
}
__device__ __forceinline__ void fm_or_word(unsigned int &r, int, unsigned int b) { r |= b; }
__device__ __forceinline__ void fm_or_word(unsigned short &r, int, unsigned int b) {
  r = (unsigned short)(r | b);
}
template <typename V> __device__ __forceinline__ float fm_get_f32(const V &r, int e) {
  return __uint_as_float(fm_word(r, e));
}
template <typename V> __device__ __forceinline__ unsigned short fm_get_u16(const V &r, int e) {
  return (unsigned short)(fm_word(r, e >> 1) >> ((e & 1) * 16));
}
template <typename V> __device__ __forceinline__ unsigned char fm_get_u8(const V &r, int e) {
  return (unsigned char)(fm_word(r, e >> 2) >> ((e & 3) * 8));
}
template <typename V> __device__ __forceinline__ void fm_put_f32(V &r, int e, float x) {
  fm_or_word(r, e, __float_as_uint(x));
}
template <typename V> __device__ __forceinline__ void fm_put_u16(V &r, int e, unsigned short x) {
  fm_or_word(r, e >> 1, (unsigned int)x << ((e & 1) * 16));
}
template <typename V> __device__ __forceinline__ void fm_put_u8(V &r, int e, unsigned char x) {
  fm_or_word(r, e >> 2, (unsigned int)x << ((e & 3) * 8));
}
#define FM_BM 128
#define FM_K1 256
#define FM_N1 1024
#define FM_N2 256
#define FM_LDA 256LL
#define FM_LDB 256LL
#define FM_LDB2 1024LL
#define FM_WS 1
#define FM_CLUSTER 1
#define FM_S1 3
#define FM_S2 2
#define FM_PASSES 1
#define FM_PCOLS 256
#define FM_SROW (FM_PCOLS + 8)
#define FM_SPOS(c) (((c) & 4) * (FM_PCOLS / 8 + 1) + ((c) >> 3) * 4 + ((c) & 3))
__device__ __forceinline__ unsigned fm_saddr(const void *p) {
  return (unsigned)__cvta_generic_to_shared(p);
}
/* bytes < 16 zero-fills the rest of the chunk (0: all zeros, nothing read) */
__device__ __forceinline__ void fm_cp16(unsigned dst, const void *src, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" :: "r"(dst), "l"(src), "r"(bytes) : "memory");
}
/* A 16-byte chunk of which `bytes` (a multiple of 2) lie inside the tensor: 16 or 0 through
   cp.async (0: zeros, the dummy address read for nothing); a partial chunk at an M or N edge
   element by element, since a 16-byte cp.async would name bytes past the tensor's end
   (compute-sanitizer reports that, though only `bytes` are read); stored before the stage
   is read, which the wait and barrier before every read of a stage order. */
__device__ __forceinline__ void fm_cp16_edge(unsigned short *dst, const unsigned short *src,
    const unsigned short *dummy, int bytes) {
  if (bytes == 16 || bytes == 0) {
    fm_cp16(fm_saddr(dst), bytes ? src : dummy, bytes);
    return;
  }
  __align__(16) unsigned short v[8];
#pragma unroll
  for (int e = 0; e < 8; e++) v[e] = 2 * e < bytes ? src[e] : (unsigned short)0;
  *(uint4 *)dst = *(const uint4 *)v;
}
__device__ __forceinline__ void fm_cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void fm_cp_wait() {
  asm volatile("cp.async.wait_group %0;\n" :: "n"(N) : "memory");
}
/* Every accumulator of a warp's (or warpgroup's) tile to zero, before its K loop. */
template <int MT, int NT> __device__ __forceinline__ void fm_acc_zero(float (&acc)[MT][NT][4]) {
#pragma unroll
  for (int mt = 0; mt < MT; mt++)
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
      for (int e = 0; e < 4; e++) acc[mt][nt][e] = 0.0f;
}
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
__device__ __forceinline__ void fm_wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void fm_wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void fm_wg_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" :: "n"(N) : "memory");
}
/* A K-major operand in 128-byte swizzle: start >> 4, leading offset unused (1), 1024 bytes
   between 8-row groups, swizzle mode 1 (128 B). */
__device__ __forceinline__ unsigned long long fm_desc(unsigned addr) {
  return (unsigned long long)((addr & 0x3FFFFu) >> 4) | (1ull << 16) | (64ull << 32) | (1ull << 62);
}
/* ---- sm_90 helpers (codegen/cuda/sm90.cuh): tensor-map loads, mbarriers, clusters ---- */
/* A CUtensorMap, passed by value (__grid_constant__): the TMA unit reads it through its
   generic address. */
struct __align__(64) fm_tmap { unsigned long long opaque[16]; };
/* One box (64 elements of K by the map's box rows) at (k, row) into shared memory at dst,
   128-byte swizzled, zero-filled past the matrix; its bytes complete on mbarrier bar. */
__device__ __forceinline__ void fm_tma_load(unsigned dst, const void *map, int k, int row, unsigned bar) {
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
               " [%0], [%1, {%2, %3}], [%4];\n"
               :: "r"(dst), "l"((unsigned long long)map), "r"(k), "r"(row), "r"(bar) : "memory");
}
/* The same box into dst of both blocks of a cluster pair, completing on each one's bar. */
__device__ __forceinline__ void fm_tma_load_both(unsigned dst, const void *map, int k, int row, unsigned bar) {
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster"
               " [%0], [%1, {%2, %3}], [%4], %5;\n"
               :: "r"(dst), "l"((unsigned long long)map), "r"(k), "r"(row), "r"(bar), "h"((unsigned short)3)
               : "memory");
}
__device__ __forceinline__ void fm_mbar_wait(unsigned bar, unsigned parity) {
  asm volatile("{\n.reg .pred P;\nFM_WAIT:\n"
               "mbarrier.try_wait.parity.shared::cta.b64 P, [%0], %1;\n"
               "@!P bra FM_WAIT;\n}\n" :: "r"(bar), "r"(parity) : "memory");
}
/* One arrival on mbarrier bar of the other block of a cluster pair (blockIdx.x & 1 is the
   rank). CTA-scope release, as for a local arrival: what it announces is that wgmma reads of
   a stage retired (wgmma.wait_group), not writes the peer must see, and a cluster-scope
   release fences every prior access of the thread at cluster scope on each k-tile (it cost
   the GEMM template's pairs 35%, bench/NOTES.md "Cluster pairs, released"). */
__device__ __forceinline__ void fm_arrive_peer(unsigned bar) {
  unsigned remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(bar), "r"((blockIdx.x & 1) ^ 1));
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" :: "r"(remote) : "memory");
}
/* Every thread of every block of the cluster: the writes before it (shared memory included)
   are seen by the reads after it in any block, and no block goes on (or leaves) while another
   may still use it. */
__device__ __forceinline__ void fm_cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}
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
__device__ __forceinline__ void fm_wgmma1(float (&d)[8][4], unsigned long long da, unsigned long long db,
    int accumulate) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
      : "l"(da), "l"(db), "r"(accumulate));
}
__device__ __forceinline__ void fm_wgmma2(float (&d)[32][4], const unsigned (&a)[4], unsigned long long db,
    int accumulate) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, {%128, %129, %130, %131}, %132, p, 1, 1, 0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3]), "+f"(d[16][0]), "+f"(d[16][1]), "+f"(d[16][2]), "+f"(d[16][3]), "+f"(d[17][0]), "+f"(d[17][1]), "+f"(d[17][2]), "+f"(d[17][3]), "+f"(d[18][0]), "+f"(d[18][1]), "+f"(d[18][2]), "+f"(d[18][3]), "+f"(d[19][0]), "+f"(d[19][1]), "+f"(d[19][2]), "+f"(d[19][3]), "+f"(d[20][0]), "+f"(d[20][1]), "+f"(d[20][2]), "+f"(d[20][3]), "+f"(d[21][0]), "+f"(d[21][1]), "+f"(d[21][2]), "+f"(d[21][3]), "+f"(d[22][0]), "+f"(d[22][1]), "+f"(d[22][2]), "+f"(d[22][3]), "+f"(d[23][0]), "+f"(d[23][1]), "+f"(d[23][2]), "+f"(d[23][3]), "+f"(d[24][0]), "+f"(d[24][1]), "+f"(d[24][2]), "+f"(d[24][3]), "+f"(d[25][0]), "+f"(d[25][1]), "+f"(d[25][2]), "+f"(d[25][3]), "+f"(d[26][0]), "+f"(d[26][1]), "+f"(d[26][2]), "+f"(d[26][3]), "+f"(d[27][0]), "+f"(d[27][1]), "+f"(d[27][2]), "+f"(d[27][3]), "+f"(d[28][0]), "+f"(d[28][1]), "+f"(d[28][2]), "+f"(d[28][3]), "+f"(d[29][0]), "+f"(d[29][1]), "+f"(d[29][2]), "+f"(d[29][3]), "+f"(d[30][0]), "+f"(d[30][1]), "+f"(d[30][2]), "+f"(d[30][3]), "+f"(d[31][0]), "+f"(d[31][1]), "+f"(d[31][2]), "+f"(d[31][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(accumulate));
}
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
__device__ __forceinline__ void fm_stage1(const float (&acc)[8][4], unsigned (&af)[4][4],
    const long long M, const long long mw, const int j, const int lane, const unsigned short *__restrict__ in2) {
  unsigned short hv[8][4];
#pragma unroll
  for (int t = 0; t < 8; t++)
#pragma unroll
    for (int e = 0; e < 4; e++) {
      const long long m = mw + (e >> 1) * 8 < M ? mw + (e >> 1) * 8 : M - 1;
      const int n = j * 64 + t * 8 + 2 * (lane & 3) + (e & 1);   /* N1 < 2^31 */
      const float fm_a = acc[t][e];
      float fm_h;
      (void)m; (void)n;
      {
        const float v2 = fm_bf16_to_f32(in2[n]);
        const float v6 = (fm_a + v2);  /* addmm */
        const float v7 = fm_gelu(v6);  /* gelu */
        fm_h = v7;
      }
      /* rounded to the operand dtype into a register of its own (writing acc back
         would make ptxas serialise the wgmma that define it) */
      hv[t][e] = fm_f32_to_bf16(fm_h);
    }
#pragma unroll
  for (int kk = 0; kk < 4; kk++) {
    af[kk][0] = fm_pack(hv[2 * kk][0], hv[2 * kk][1]);
    af[kk][1] = fm_pack(hv[2 * kk][2], hv[2 * kk][3]);
    af[kk][2] = fm_pack(hv[2 * kk + 1][0], hv[2 * kk + 1][1]);
    af[kk][3] = fm_pack(hv[2 * kk + 1][2], hv[2 * kk + 1][3]);
  }
}
/* One 16-byte store of four words. Through a uint4 cast, the compiler split some of
   these into four 4-byte stores (PTX of the ping-pong kernel; ncu: 12.8 of 32
   bytes used per stored sector). */
__device__ __forceinline__ void fm_st16(void *p, unsigned a, unsigned b, unsigned c, unsigned d) {
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::
               "l"(__cvta_generic_to_global(p)), "r"(a), "r"(b), "r"(c), "r"(d));
}
__device__ __forceinline__ uint4 fm_lds16(unsigned a) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(a) : "memory");
  return v;
}
__device__ __forceinline__ void fm_stage2(const float (&acc)[8], const long long m, const int n, const unsigned fm_xa, const int fm_rl, const unsigned short *__restrict__ in4, const unsigned short *__restrict__ in5, unsigned short *__restrict__ out0) {
  __align__(16) unsigned short r4[8];
  ((uint4 *)r4)[0] = *(const uint4 *)(&in4[n] + 0);
  __align__(16) unsigned short r5[8];
  if (fm_xa) *(uint4 *)r5 = fm_lds16(FM_SW(fm_xa + (n >> 6) * (FM_BM * 128), fm_rl, (n >> 3) & 7));
  else *(uint4 *)r5 = *(const uint4 *)(&in5[m * 256LL + n]);
  __align__(16) unsigned short o0[8];
#pragma unroll
  for (int e = 0; e < 8; e++) {
    const float fm_a = acc[e];
    const float v4 = fm_bf16_to_f32(r4[e]);
    const float v5 = fm_bf16_to_f32(r5[e]);
    const float v8 = (fm_a + v4);  /* addmm */
    const float v9 = (v8 + v5);  /* add */
    o0[e] = fm_f32_to_bf16(v9);
  }
  fm_st16(&out0[m * 256LL + n] + 0, (unsigned)o0[0] | (unsigned)o0[1] << 16, (unsigned)o0[2] | (unsigned)o0[3] << 16, (unsigned)o0[4] | (unsigned)o0[5] << 16, (unsigned)o0[6] | (unsigned)o0[7] << 16);
}
#define FM_STAGE2_ARGS , in4, in5, out0
__device__ __forceinline__ void fm_stage2_staged(const float (&acc2)[FM_N2 / 8][4], const long long M,
    const long long m0, const int wg, const int wr, const int lane, const unsigned fm_xa, const unsigned short *__restrict__ in4, const unsigned short *__restrict__ in5, unsigned short *__restrict__ out0) {
  asm volatile("bar.sync 3, %0;\n" :: "n"(FM_MMA_THREADS) : "memory");
  float *const stg = (float *)((char *)fm_smem + (fm_stage_base() + FM_X_BYTES - fm_saddr(fm_smem))) + wg * 64 * FM_SROW;
  const int wt = wr * 32 + lane;
#pragma unroll
  for (int pass = 0; pass < FM_PASSES; pass++) {
    if (pass) asm volatile("bar.sync %0, 128;\n" :: "r"(4 + wg) : "memory");
#pragma unroll
    for (int t = pass * (FM_PCOLS / 8); t < (pass + 1) * (FM_PCOLS / 8); t++) {
      const int r = wr * 16 + (lane >> 2), c = t * 8 - pass * FM_PCOLS + 2 * (lane & 3);
      *(float2 *)&stg[r * FM_SROW + FM_SPOS(c)] = make_float2(acc2[t][0], acc2[t][1]);
      *(float2 *)&stg[(r + 8) * FM_SROW + FM_SPOS(c)] = make_float2(acc2[t][2], acc2[t][3]);
    }
    asm volatile("bar.sync %0, 128;\n" :: "r"(4 + wg) : "memory");
    /* unrolled whole (16 trips at N2 = 256), so that every input's loads are in flight at once */
#pragma unroll
    for (int g = wt; g < 64 * (FM_PCOLS / 8); g += 128) {
      const int r = g / (FM_PCOLS / 8), c = g % (FM_PCOLS / 8) * 8;
      const long long m = m0 + wg * 64 + r;
      if (m >= M) continue;
      float v[8];
      *(float4 *)&v[0] = *(const float4 *)&stg[r * FM_SROW + FM_SPOS(c)];
      *(float4 *)&v[4] = *(const float4 *)&stg[r * FM_SROW + FM_SPOS(c + 4)];
      fm_stage2(v, m, pass * FM_PCOLS + c, fm_xa, wg * 64 + r FM_STAGE2_ARGS);
    }
  }
}
#define FM_B in1
#define FM_B2 in3
#define FM_STAGE1_ARGS , in2
extern "C" __global__ void __launch_bounds__(FM_THREADS, 1) fm_b2b_128_tma(
    const unsigned short *__restrict__ in0,
    const unsigned short *__restrict__ in1,
    const unsigned short *__restrict__ in2,
    const unsigned short *__restrict__ in3,
    const unsigned short *__restrict__ in4,
    const unsigned short *__restrict__ in5,
    unsigned short *__restrict__ out0,
    long long outer, const __grid_constant__ fm_tmap fm_tmx,
    const __grid_constant__ fm_tmap fm_tmw1, const __grid_constant__ fm_tmap fm_tmw2) {
  const long long M = outer;
  const int tid = threadIdx.x, lane = tid & 31, wr = (tid >> 5) & 3;
  /* warp-uniform through a shuffle, else ptxas serialises the wgmma */
  const int wg = __shfl_sync(0xffffffffu, tid >> 7, 0);
#if FM_CLUSTER == 2
  /* grid (2, row-tile pairs): a block past M still runs (its partner needs its half
     of the weights); TMA reads it zeros and nothing is stored */
  const long long m0 = ((long long)blockIdx.y * 2 + blockIdx.x) * FM_BM;
#else
  const long long m0 = (long long)blockIdx.y * FM_BM;
#endif
  /* A's rows, the two rings (1024-byte aligned for the swizzle), the mbarriers: A's,
     then full and empty of B's ring, then of B2's */
  const unsigned xs = (fm_saddr(fm_smem) + 1023u) & ~1023u, w1s = xs + FM_X_BYTES;
  const unsigned w2s = w1s + FM_S1 * FM_W1_BYTES, bars = w2s + FM_S2 * FM_W2_BYTES;
  const unsigned full1 = bars + 8 * (FM_K1 / 64), empty1 = full1 + 8 * FM_S1;
  const unsigned full2 = empty1 + 8 * FM_S1, empty2 = full2 + 8 * FM_S2;
  if (tid == 0) {
    for (int kt = 0; kt < FM_K1 / 64; kt++) fm_mbar_init(bars + 8 * kt, 1);   /* A's slices */
    for (int s = 0; s < FM_S1 + FM_S2; s++) {
      const unsigned full = s < FM_S1 ? full1 + 8 * s : full2 + 8 * (s - FM_S1);
      fm_mbar_init(full, 1);
      fm_mbar_init(full + 8 * (s < FM_S1 ? FM_S1 : FM_S2), FM_MMA_THREADS / 128 * FM_CLUSTER);
    }
    /* the barriers are completed by the async proxy (TMA's complete_tx) */
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
#if FM_CLUSTER == 2
  fm_cluster_sync();   /* neither block fills or signals the other before both initialised */
#else
  __syncthreads();
#endif
  if (tid >= FM_MMA_THREADS) {   /* the loader warpgroup: one thread issues every box */
#if FM_MMA_THREADS == 256
    asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n" ::: "memory");
#endif
    if (tid == FM_MMA_THREADS) fm_loader(&fm_tmx, &fm_tmw1, &fm_tmw2, xs, w1s, w2s, bars, (int)m0);
#if FM_CLUSTER == 2
    __syncwarp();
    fm_cluster_sync();
#endif
    return;
  }
#if FM_MMA_THREADS == 256
  asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n" ::: "memory");
#endif
  float acc2[FM_N2 / 8][4];
  /* this thread's rows of the accumulators: mw and mw + 8 */
  const long long mw = m0 + wg * 64 + wr * 16 + (lane >> 2);
  const unsigned long long da = fm_desc(xs + wg * 64 * 128);
  unsigned af[4][4];
  float acc1[8][4];
  fm_mbar_wait(full1, 0);
  fm_gemm1(acc1, da, w1s, bars);   /* each slice of A's rows waited for */
  fm_wg_wait<0>();
  if (tid % 128 == 0) fm_release_by_thread(empty1);
  if (wg == 1) FM_TURN_PASS(0);   /* warpgroup 0 takes the first turn */
  for (int j = 0; j < FM_CHUNKS; j++) {
    fm_stage1(acc1, af, M, mw, j, lane FM_STAGE1_ARGS);
    FM_TURN_WAIT(wg);
    const int s2 = j % FM_S2;
    fm_mbar_wait(full2 + 8 * s2, (j / FM_S2) & 1);
    fm_gemm2(acc2, af, w2s + s2 * FM_W2_BYTES, j);
    const int s1 = (j + 1) % FM_S1;
    if (j + 1 < FM_CHUNKS) {
      fm_mbar_wait(full1 + 8 * s1, ((j + 1) / FM_S1) & 1);
      fm_gemm1(acc1, da, w1s + s1 * FM_W1_BYTES);
    }
    if (!(wg == 1 && j + 1 == FM_CHUNKS)) FM_TURN_PASS(1 - wg);
    fm_wg_wait<0>();
    if (tid % 128 == 0) {   /* the warpgroup's products retired: one arrival each */
      fm_release_by_thread(empty2 + 8 * s2);
      if (j + 1 < FM_CHUNKS) fm_release_by_thread(empty1 + 8 * s1);
    }
  }
  fm_stage2_staged(acc2, M, m0, wg, wr, lane, (const void *)in5 == (const void *)in0 ? xs : 0u FM_STAGE2_ARGS);
}
