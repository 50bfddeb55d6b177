/* fusemld gemm kernel: fm_gemm_128x256x64_s4_w8x1_r8_wgmma_i1, A row-major, B column-major, bf16 */
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
#define FM_BN 256
#define FM_BK 64
#define FM_STAGES 4
#define FM_WM 8
#define FM_WN 1
#define FM_RASTER 8
#define FM_K 4096
#define FM_N 4096
#define FM_LDA 4096LL
#define FM_LDB 4096LL
#define FM_A_KMAJOR 1
#define FM_B_KMAJOR 1
#define FM_SCOLS 256
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
#define FM_WG_INFLIGHT 1
#define FM_WG_SPECIALIZED 0
#define FM_WG_TMA 0
#define FM_WG_PINGPONG 0
/* one wgmma m64n256k16 (A and B K-major in shared memory): d += A B, or with add 0
   d = A B, d's values ignored. A tile's first wgmma starts its accumulators that way:
   zeroing them first took a move per register, and where the K loop unrolled whole
   ptxas placed those moves after the first wgmma and waited for it to retire
   (C7517), stalling the tensor pipe at every tile. */
__device__ __forceinline__ void fm_wgmma(float (&d)[32][4], unsigned long long da,
                                         unsigned long long db, int add) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3]), "+f"(d[16][0]), "+f"(d[16][1]), "+f"(d[16][2]), "+f"(d[16][3]), "+f"(d[17][0]), "+f"(d[17][1]), "+f"(d[17][2]), "+f"(d[17][3]), "+f"(d[18][0]), "+f"(d[18][1]), "+f"(d[18][2]), "+f"(d[18][3]), "+f"(d[19][0]), "+f"(d[19][1]), "+f"(d[19][2]), "+f"(d[19][3]), "+f"(d[20][0]), "+f"(d[20][1]), "+f"(d[20][2]), "+f"(d[20][3]), "+f"(d[21][0]), "+f"(d[21][1]), "+f"(d[21][2]), "+f"(d[21][3]), "+f"(d[22][0]), "+f"(d[22][1]), "+f"(d[22][2]), "+f"(d[22][3]), "+f"(d[23][0]), "+f"(d[23][1]), "+f"(d[23][2]), "+f"(d[23][3]), "+f"(d[24][0]), "+f"(d[24][1]), "+f"(d[24][2]), "+f"(d[24][3]), "+f"(d[25][0]), "+f"(d[25][1]), "+f"(d[25][2]), "+f"(d[25][3]), "+f"(d[26][0]), "+f"(d[26][1]), "+f"(d[26][2]), "+f"(d[26][3]), "+f"(d[27][0]), "+f"(d[27][1]), "+f"(d[27][2]), "+f"(d[27][3]), "+f"(d[28][0]), "+f"(d[28][1]), "+f"(d[28][2]), "+f"(d[28][3]), "+f"(d[29][0]), "+f"(d[29][1]), "+f"(d[29][2]), "+f"(d[29][3]), "+f"(d[30][0]), "+f"(d[30][1]), "+f"(d[30][2]), "+f"(d[30][3]), "+f"(d[31][0]), "+f"(d[31][1]), "+f"(d[31][2]), "+f"(d[31][3])
      : "l"(da), "l"(db), "r"(add));
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
/* ---- gemm mainloop (sm_90a: cp.async into 128-byte-swizzled tiles, wgmma) ---- */
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "the wgmma mainloop needs sm_90a"
#endif
/* warp-specialised: warpgroup 0 only loads, the others only multiply */
#define FM_LOADERS (FM_WG_SPECIALIZED ? 128 : FM_WM * FM_WN * 32)
/* the TMA form's loader is one warp after the consumers (warpgroups stay aligned) */
/* ping-pong (mode 6): two consumer warpgroups, each a whole tile of its own */
#define FM_CONSUMERS (FM_WG_PINGPONG ? 2 : 1)
#define FM_MMA_THREADS (FM_WM * FM_WN * 32 * FM_CONSUMERS)
#define FM_THREADS (FM_MMA_THREADS + (FM_WG_TMA ? 32 : FM_WG_SPECIALIZED ? 128 : 0))
#define FM_EPI_WARP0 (FM_WG_SPECIALIZED && !FM_WG_TMA ? 4 : 0)
/* a warpgroup multiplies 64-row pieces: warp w owns rows 16w .. 16w+15 of each (mt) */
#define FM_MT (FM_WG_PINGPONG ? FM_BM / 64 : 1)
#define FM_WARP_ROW(wm, mt) ((mt) * 64 + (wm) * 16)
#define FM_NT (FM_BN / 8)
#define FM_WCOLS FM_BN
#define FM_SLAB_LD (FM_SCOLS + 8)
/* the ping-pong kernel reads its biases before the mainloop where its tile epilogue takes
   one pass and a lane keeps its columns across it */
#define FM_EPI_PRELOAD (FM_WCOLS == FM_SCOLS && 32 % (FM_SCOLS / 8) == 0)
#define FM_KT ((FM_K + 63) / 64)
/* A tile's first wgmma starts its accumulators (fm_wgmma with add 0) where the K loop
   unrolls whole (up to 6 k-tiles with this ptxas): zeroed first, ptxas put the zeroing
   after that wgmma and waited for it to retire (C7517) at every tile. In a K loop that
   stays a loop the zeroing costs nothing of the sort, and the runtime predicate raised
   register use to the cap (spills in the persistent forms). */
#define FM_ACC_BY_WGMMA (FM_KT >= 1 && FM_KT <= 6)
#define FM_ACC_ADD(kt, kk) (!FM_ACC_BY_WGMMA || (kt) > 0 || (kk) > 0)
#define FM_A_BYTES (FM_BM * 128)
#define FM_STAGE_BYTES ((FM_BM + FM_BN) * 128)
#define FM_AHEAD (FM_STAGES - 1 - FM_WG_INFLIGHT)
extern __shared__ __align__(1024) unsigned short fm_smem[];
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
/* Output tile (tm, tn) at position lin of the launch order over tiles_m x tiles_n tiles:
   groups of FM_RASTER tile rows, each walked column by column (L2 keeps the group's A rows
   and one column of B); row by row without groups. */
__device__ __forceinline__ void fm_tile_of(int lin, int tiles_m, int tiles_n, int &tm, int &tn) {
#if FM_RASTER > 1
  const int per_group = FM_RASTER * tiles_n, first = lin / per_group * FM_RASTER, in_group = lin % per_group;
  const int rows = min(tiles_m - first, FM_RASTER);
  tm = first + in_group % rows;
  tn = in_group / rows;
#else
  tm = lin / tiles_n;
  tn = lin % tiles_n;
#endif
}
/* This block's output tile (tm, tn) from its place in the launch order (x fastest). */
__device__ __forceinline__ void fm_tile_coords(int &tm, int &tn) {
#if defined(FM_CLUSTER) && FM_CLUSTER == 2
  /* clusters of 2 along x: a pair of row tiles (2 pm, 2 pm + 1) of one column tile; the
     grid is (2 x column tiles, row-tile pairs), the pairs ordered like tiles */
  int pm;
  fm_tile_of(blockIdx.y * (gridDim.x >> 1) + (blockIdx.x >> 1), gridDim.y, gridDim.x >> 1, pm, tn);
  tm = 2 * pm + (blockIdx.x & 1);
#else
  fm_tile_of(blockIdx.y * gridDim.x + blockIdx.x, gridDim.y, gridDim.x, tm, tn);
#endif
}
/* The slab's swizzle: in row r the two 4-column halves of the 8-column group at c swap
   places when bit 5 of c differs from r's parity. A lane reads its 8 columns as two float4s;
   unswizzled, the 8 lanes of a quarter-warp (32 bytes apart, or two rows 8 banks apart)
   hit each bank twice; swizzled, they cover the 32 banks once. The swap stays inside the
   group's 8 banks, so fm_stage's float2 writes remain conflict-free. */
__device__ __forceinline__ int fm_swz(int r, int c) { return c ^ ((((c >> 5) ^ r) & 1) << 2); }
/* Columns pass * FM_SCOLS .. + FM_SCOLS of row tile mt of the warp's accumulators into its
   slab (16 x FM_SCOLS, swizzled). */
__device__ __forceinline__ void fm_stage(float *slab, const float (&acc)[FM_NT][4], int lane, int pass) {
  /* rows lane/4 and lane/4 + 8 (same parity): one base for the groups with bit 5 of the
     column clear, one for those with it set; nt * 8 is then an immediate offset */
  const int r = lane >> 2, q = (lane & 3) * 2;
  float *const s0 = slab + r * FM_SLAB_LD + fm_swz(r, q), *const s1 = slab + r * FM_SLAB_LD + fm_swz(r, 32 + q) - 32;
#pragma unroll
  for (int nt = 0; nt < FM_SCOLS / 8; nt++)
#pragma unroll
    for (int h = 0; h < 2; h++)
      *(float2 *)((nt & 4 ? s1 : s0) + h * 8 * FM_SLAB_LD + nt * 8) =
          make_float2(acc[pass * (FM_SCOLS / 8) + nt][h * 2], acc[pass * (FM_SCOLS / 8) + nt][h * 2 + 1]);
}
/* Columns c .. c+7 of slab row r (c a multiple of 8) back in order. */
__device__ __forceinline__ void fm_unstage(float (&v)[8], const float *slab, int r, int c) {
  *(float4 *)v = *(const float4 *)(slab + r * FM_SLAB_LD + fm_swz(r, c));
  *(float4 *)(v + 4) = *(const float4 *)(slab + r * FM_SLAB_LD + fm_swz(r, c + 4));
}
/* One 16-byte store of four words. Through a uint4 cast, the compiler split some of
   these into four 4-byte stores (PTX of the ping-pong kernel; ncu: 12.8 of 32
   bytes used per stored sector). */
__device__ __forceinline__ void fm_st16(void *p, unsigned a, unsigned b, unsigned c, unsigned d) {
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::
               "l"(__cvta_generic_to_global(p)), "r"(a), "r"(b), "r"(c), "r"(d));
}
/* 16 bytes through the read-only path; volatile, so it stays where it is written. */
__device__ __forceinline__ uint4 fm_ld_nc16(const void *p) {
  uint4 r;
  asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(__cvta_generic_to_global(p)));
  return r;
}
/* ---- the epilogue: the fragment's ops on 8 accumulators of one row (columns
   n .. n+7, n a multiple of 8, those past N ignored), each output stored once;
   WHOLE: the caller knows all 8 columns are inside N (no masking compiled in) ---- */
template <bool WHOLE = false>
__device__ __forceinline__ void fm_epilogue(const float (&acc)[8], const long long m, const long long n,
    const unsigned short *__restrict__ in2,
    unsigned short *__restrict__ out0,
    const uint4 *pre2 = nullptr) {
  const bool full = WHOLE || n + 8 <= FM_N;
  __align__(16) unsigned short r2[8];
  if (full) {
    ((uint4 *)r2)[0] = pre2 ? *pre2 : *(const uint4 *)(in2 + n * 1LL + 0);
  } else {
#pragma unroll
  for (int e = 0; e < 8; e++)
    r2[e] = n + e < FM_N ? in2[(n + e) * 1LL] : (unsigned short)0;
  }
  __align__(16) unsigned short o0[8];
#pragma unroll
  for (int e = 0; e < 8; e++) {
    const float v2 = fm_bf16_to_f32(r2[e]);
    const float v3 = (acc[e] + v2);  /* addmm */
    const float v4 = fm_gelu(v3);  /* gelu */
    o0[e] = fm_f32_to_bf16(v4);
  }
  if (full) {
    fm_st16(out0 + m * 4096LL + n * 1LL + 0, (unsigned)o0[0] | (unsigned)o0[1] << 16, (unsigned)o0[2] | (unsigned)o0[3] << 16, (unsigned)o0[4] | (unsigned)o0[5] << 16, (unsigned)o0[6] | (unsigned)o0[7] << 16);
  } else {
#pragma unroll
  for (int e = 0; e < 8; e++)
    if (n + e < FM_N) out0[m * 4096LL + (n + e) * 1LL] = o0[e];
  }
}
extern "C" __global__ void __launch_bounds__(FM_THREADS) fm_gemm_128x256x64_s4_w8x1_r8_wgmma_i1(
    const unsigned short *__restrict__ in0,
    const unsigned short *__restrict__ in1,
    const unsigned short *__restrict__ in2,
    unsigned short *__restrict__ out0,
    long long outer) {
  const long long M = outer;
  int tm, tn;
  fm_tile_coords(tm, tn);
  const int n0 = tn * FM_BN;
  const long long m0 = (long long)tm * FM_BM;
  float acc[FM_MT][FM_NT][4];
  fm_mainloop(acc, in0, in1, M, m0, n0);
  /* every warp is past its last ldmatrix: the stage buffers become the slabs */
  __syncthreads();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int wm = warp / FM_WN, wn = warp % FM_WN;
  float *slab = (float *)fm_smem + warp * 16 * FM_SLAB_LD;
  {
    /* A tile wholly inside M and N (all but the edges) runs a branch-free copy of
       the loop: its loads, independent across iterations, are scheduled ahead
       of earlier iterations' math instead of one round trip per 8 columns. */
    const bool whole = m0 + FM_BM <= M && n0 + FM_BN <= FM_N;
#pragma unroll
    for (int mt = 0; mt < FM_MT; mt++) {
#pragma unroll
    for (int pass = 0; pass < FM_WCOLS / FM_SCOLS; pass++) {
      fm_stage(slab, acc[mt], lane, pass);
      __syncwarp();
      const long long mw = m0 + FM_WARP_ROW(wm, mt);
      const long long nw = n0 + wn * FM_WCOLS + pass * FM_SCOLS;
      if (whole) {
#if 32 % (FM_SCOLS / 8) == 0
        /* 16 rows x FM_SCOLS / 8 groups, lane + 32 i each: where FM_SCOLS / 8 divides 32 a
           lane keeps its 8 columns (c) and steps down the rows by a constant, so its
           addresses advance by a constant too (with s0 / s1 below: 449 instructions a trip
           of 32 bias + GELU elements where the per-trip indexing took 497) */
        const int c = lane % (FM_SCOLS / 8) * 8, r0 = lane / (FM_SCOLS / 8);
        /* the slab's swizzle depends on a row's parity, the same on every trip when the
           rows step by an even number */
        const int s0 = fm_swz(r0, c), s1 = fm_swz(r0, c + 4), even = (32 / (FM_SCOLS / 8)) % 2 == 0;
#pragma unroll
        for (int i = 0; i < 2 * FM_SCOLS / 32; i++) {
          const int r = r0 + i * (32 / (FM_SCOLS / 8));
          float v[8];
          if (even) {
            *(float4 *)v = *(const float4 *)(slab + r * FM_SLAB_LD + s0);
            *(float4 *)(v + 4) = *(const float4 *)(slab + r * FM_SLAB_LD + s1);
          } else {
            fm_unstage(v, slab, r, c);
          }
#else
#pragma unroll
        for (int i = 0; i < 2 * FM_SCOLS / 32; i++) {
          const int g = lane + 32 * i, r = g / (FM_SCOLS / 8), c = g % (FM_SCOLS / 8) * 8;
          float v[8];
          fm_unstage(v, slab, r, c);
#endif
          fm_epilogue<true>(v, mw + r, nw + c, in2, out0);
        }
      } else {
#pragma unroll
        for (int g = lane; g < 2 * FM_SCOLS; g += 32) {   /* the edges */
          const int r = g / (FM_SCOLS / 8), c = g % (FM_SCOLS / 8) * 8;
          if (mw + r >= M || nw + c >= FM_N) continue;
          float v[8];
          fm_unstage(v, slab, r, c);
          fm_epilogue<false>(v, mw + r, nw + c, in2, out0);
        }
      }
      __syncwarp();   /* the slab is rewritten next */
    }
    }
  }
}
