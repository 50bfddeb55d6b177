/* fusemld gemm kernel: fm_gemm_64x64x64_s4_w2x2_r0, A column-major, B row-major, f16 */
#define FM_FAST_MATH 1
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
#define FM_BM 64
#define FM_BN 64
#define FM_BK 64
#define FM_STAGES 4
#define FM_WM 2
#define FM_WN 2
#define FM_RASTER 0
#define FM_K 128
#define FM_N 200
#define FM_LDA 304LL
#define FM_LDB 200LL
#define FM_A_KMAJOR 0
#define FM_B_KMAJOR 0
#define FM_SCOLS 32
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
__device__ __forceinline__ void fm_mma(float c[4], const unsigned a[4], unsigned b0, unsigned b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
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
/* ---- the epilogue: the fragment's ops on 8 accumulators of one row (columns
   n .. n+7, n a multiple of 8, those past N ignored), each output stored once;
   WHOLE: the caller knows all 8 columns are inside N (no masking compiled in) ---- */
template <bool WHOLE = false>
__device__ __forceinline__ void fm_epilogue(const float (&acc)[8], const long long m, const long long n,
    const unsigned short *__restrict__ in2,
    unsigned short *__restrict__ out0) {
  const bool full = WHOLE || n + 8 <= FM_N;
  __align__(16) unsigned short r2[8];
  if (full) {
    ((uint4 *)r2)[0] = *(const uint4 *)(in2 + m * 200LL + n * 1LL + 0);
  } else {
#pragma unroll
  for (int e = 0; e < 8; e++)
    r2[e] = n + e < FM_N ? in2[m * 200LL + (n + e) * 1LL] : (unsigned short)0;
  }
  __align__(16) unsigned short o0[8];
#pragma unroll
  for (int e = 0; e < 8; e++) {
    const float v2 = fm_f16_to_f32(r2[e]);
    const float v3 = acc[e];  /* mm */
    const float v4 = (v3 + v2);  /* add */
    const float v5 = fm_silu(v4);  /* silu */
    o0[e] = fm_f32_to_f16(v5);
  }
  if (full) {
    fm_st16(out0 + m * 200LL + n * 1LL + 0, (unsigned)o0[0] | (unsigned)o0[1] << 16, (unsigned)o0[2] | (unsigned)o0[3] << 16, (unsigned)o0[4] | (unsigned)o0[5] << 16, (unsigned)o0[6] | (unsigned)o0[7] << 16);
  } else {
#pragma unroll
  for (int e = 0; e < 8; e++)
    if (n + e < FM_N) out0[m * 200LL + (n + e) * 1LL] = o0[e];
  }
}
extern "C" __global__ void __launch_bounds__(FM_THREADS, 2) fm_gemm_64x64x64_s4_w2x2_r0(
    const unsigned short *__restrict__ in0,
    const unsigned short *__restrict__ in1,
    const unsigned short *__restrict__ in2,
    unsigned short *__restrict__ out0,
    long long outer) {
  const long long M = 300LL;
  (void)outer;
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
