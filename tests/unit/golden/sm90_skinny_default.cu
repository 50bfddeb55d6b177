/* fusemld skinny gemm kernel: fm_skinny_c8_w8_u4_p0, A row-major, B column-major, bf16 */
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
#define FM_BN 8
#define FM_WARPS 8
#define FM_UNROLL 4
#define FM_PIPE 0
#define FM_SPLIT 1
#define FM_X1 0
#define FM_K 4096
#define FM_N 4096
#define FM_LDA 4096LL
#define FM_LDB 4096LL
__device__ __forceinline__ void fm_mma(float c[4], const unsigned a[4], unsigned b0, unsigned b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
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
extern "C" __global__ void __launch_bounds__(FM_THREADS) fm_skinny_c8_w8_u4_p0(
    const unsigned short *__restrict__ in0,
    const unsigned short *__restrict__ in1,
    const unsigned short *__restrict__ in2,
    unsigned short *__restrict__ out0,
    long long outer) {
  const long long M = 8LL;
  (void)outer;
#if FM_PIPE >= 2
  /* the partial sums reuse the drained ring: one dynamic allocation, so a
     launch needs no shared memory beyond the metadata's smem */
  float *red = (float *)fm_ring;
#else
  __shared__ __align__(16) float red[FM_WARPS * 16 * FM_RED_LD];
#endif
  const long long m0 = (long long)blockIdx.y * 16;
  const int n0 = (int)(blockIdx.x / FM_SPLIT) * FM_BN;   /* a split's blocks share it */
  float acc[FM_NT][4];
  fm_skinny_mainloop(acc, in0, in1, M, m0, n0);
#if FM_PIPE >= 2
  __syncthreads();   /* every warp is done with its part of the ring */
#endif
  fm_skinny_stage(red, acc);
#if FM_SPLIT > 1
  fm_cluster_sync();
#else
  __syncthreads();
#endif
  /* one thread per (row, 8 columns), spread over the split's blocks: the sum over
     blocks and warps, then the epilogue */
  for (int t = threadIdx.x + fm_krank() * FM_THREADS; t < 16 * FM_NT; t += FM_THREADS * FM_SPLIT) {
    const int r = t / FM_NT, c = t % FM_NT * 8;
    const long long m = m0 + r;
    const long long n = n0 + c;
    if (m >= M || n >= FM_N) continue;
    float v[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    for (int b = 0; b < FM_SPLIT; b++)
#pragma unroll
      for (int w = 0; w < FM_WARPS; w++) {
        const float4 lo = fm_red4(red, b, (w * 16 + r) * FM_RED_LD + c);
        const float4 hi = fm_red4(red, b, (w * 16 + r) * FM_RED_LD + c + 4);
        v[0] += lo.x, v[1] += lo.y, v[2] += lo.z, v[3] += lo.w;
        v[4] += hi.x, v[5] += hi.y, v[6] += hi.z, v[7] += hi.w;
      }
    fm_epilogue(v, m, n, in2, out0);
  }
#if FM_SPLIT > 1
  fm_cluster_sync();
#endif
}
