/* fusemld codegen v43: rows kernel, a block streaming per row, block 256, rows of 32000, vec 8, 16 elements per thread.
 * Generated from a canonical fragment: every name and number below comes from its
 * typed fields. One self-contained translation unit (NVRTC has no include path). */
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
/* ---- row reductions ---- */
__device__ __forceinline__ float fm_warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}
__device__ __forceinline__ float fm_warp_max(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = fm_maximum(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}
__device__ __forceinline__ float fm_row_sum(float x, float *red, int &par) {
  x = fm_warp_sum(x);
  float *r = red + par;
  par ^= 8;
  if ((threadIdx.x & 31) == 0) r[threadIdx.x >> 5] = x;
  __syncthreads();
  float t = r[0];
#pragma unroll
  for (int w = 1; w < 8; ++w) t += r[w];
  return t;
}
__device__ __forceinline__ float fm_row_max(float x, float *red, int &par) {
  x = fm_warp_max(x);
  float *r = red + par;
  par ^= 8;
  if ((threadIdx.x & 31) == 0) r[threadIdx.x >> 5] = x;
  __syncthreads();
  float t = r[0];
#pragma unroll
  for (int w = 1; w < 8; ++w) t = fm_maximum(t, r[w]);
  return t;
}
/* ---- the kernel ---- */
extern "C" __global__ void __launch_bounds__(256) fm_rows_v43(
    const unsigned short *__restrict__ in0,
    const float *__restrict__ in1,
    const float *__restrict__ in2,
    float *__restrict__ out0,
    float *__restrict__ out1,
    long long outer) {
  const long long rows = outer * 1LL;
  const int lane = threadIdx.x;
  __shared__ float fm_red[16];
  int fm_par = 0;
  for (long long row = (long long)blockIdx.x * 1 + threadIdx.x / 256; row < rows;
       row += (long long)gridDim.x * 1) {
    unsigned long long q = (unsigned long long)row;
    const long long c0 = (long long)q;
    const long long b0 = 0 + c0 * 32000LL;
    const long long b1 = 0;
    const long long b2 = 0 + c0 * 1LL;
    const long long b3 = 0 + c0 * 1LL;
    const long long b4 = 0 + c0 * 1LL;
    (void)c0;
    /* the per-row inputs and values no reduction precedes */
    const float v2 = in2[b2];
    const float v11 = 0.0f;  /* const */
    /* pass 1: the reductions of level 1 */
    float fm_a4 = __int_as_float(0xff800000);
    float fm_a7 = 0.0f;
    float fm_a13 = 0.0f;
#pragma unroll 1
    for (long long fm_t0 = 0; fm_t0 < 28672LL; fm_t0 += 4096LL) {
    float v0[16];
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const long long j = fm_t0 + ((long long)c * 256 + lane) * 8;
      {
        const uint4 r0 = *reinterpret_cast<const uint4 *>(in0 + b0 + j + 0);
#pragma unroll
        for (int e = 0; e < 8; ++e) v0[c * 8 + 0 + e] = fm_bf16_to_f32(fm_get_u16(r0, e));
      }
    }
    float v1[16];
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const long long j = fm_t0 + ((long long)c * 256 + lane) * 8;
      {
        const uint4 r0 = *reinterpret_cast<const uint4 *>(in1 + b1 + j + 0);
#pragma unroll
        for (int e = 0; e < 4; ++e) v1[c * 8 + 0 + e] = fm_get_f32(r0, e);
        const uint4 r4 = *reinterpret_cast<const uint4 *>(in1 + b1 + j + 4);
#pragma unroll
        for (int e = 0; e < 4; ++e) v1[c * 8 + 4 + e] = fm_get_f32(r4, e);
      }
    }
    float v3[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) v3[i] = v0[i];  /* cast */
    bool v10[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) v10[i] = (v1[i] == v2);  /* eq */
    float v12[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) v12[i] = (v10[i] ? v3[i] : v11);  /* where */
    {  /* online: the tile's max, then the sum of exp(x - max) rescaled once */
      float fm_tm = fm_a4;
#pragma unroll
      for (int i = 0; i < 16; ++i)
        if (true) fm_tm = fm_maximum(fm_tm, v3[i]);
      const float fm_sh = fm_tm == __int_as_float(0xff800000) ? 0.0f : fm_tm;
      float fm_ts = 0.0f;
#pragma unroll
      for (int i = 0; i < 16; ++i)
        if (true) fm_ts += fm_exp(v3[i] - fm_sh);
      fm_a7 = fmaf(fm_a7, fm_exp(fm_a4 - fm_sh), fm_ts);
      fm_a4 = fm_tm;
    }
#pragma unroll
      for (int i = 0; i < 16; ++i)
        if (true) fm_a13 += v12[i];
    }
    {  /* the last tile: the row ends inside it */
    const long long fm_t0 = 28672LL;
    float v0[16];
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const long long j = fm_t0 + ((long long)c * 256 + lane) * 8;
      if (j < 32000LL) {
        const uint4 r0 = *reinterpret_cast<const uint4 *>(in0 + b0 + j + 0);
#pragma unroll
        for (int e = 0; e < 8; ++e) v0[c * 8 + 0 + e] = fm_bf16_to_f32(fm_get_u16(r0, e));
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) v0[c * 8 + e] = 0;
      }
    }
    float v1[16];
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const long long j = fm_t0 + ((long long)c * 256 + lane) * 8;
      if (j < 32000LL) {
        const uint4 r0 = *reinterpret_cast<const uint4 *>(in1 + b1 + j + 0);
#pragma unroll
        for (int e = 0; e < 4; ++e) v1[c * 8 + 0 + e] = fm_get_f32(r0, e);
        const uint4 r4 = *reinterpret_cast<const uint4 *>(in1 + b1 + j + 4);
#pragma unroll
        for (int e = 0; e < 4; ++e) v1[c * 8 + 4 + e] = fm_get_f32(r4, e);
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) v1[c * 8 + e] = 0;
      }
    }
    float v3[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) v3[i] = v0[i];  /* cast */
    bool v10[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) v10[i] = (v1[i] == v2);  /* eq */
    float v12[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) v12[i] = (v10[i] ? v3[i] : v11);  /* where */
    {  /* online: the tile's max, then the sum of exp(x - max) rescaled once */
      float fm_tm = fm_a4;
#pragma unroll
      for (int i = 0; i < 16; ++i)
        if ((fm_t0 + (i / 8 * 256 + lane) * 8 < 32000)) fm_tm = fm_maximum(fm_tm, v3[i]);
      const float fm_sh = fm_tm == __int_as_float(0xff800000) ? 0.0f : fm_tm;
      float fm_ts = 0.0f;
#pragma unroll
      for (int i = 0; i < 16; ++i)
        if ((fm_t0 + (i / 8 * 256 + lane) * 8 < 32000)) fm_ts += fm_exp(v3[i] - fm_sh);
      fm_a7 = fmaf(fm_a7, fm_exp(fm_a4 - fm_sh), fm_ts);
      fm_a4 = fm_tm;
    }
#pragma unroll
      for (int i = 0; i < 16; ++i)
        if ((fm_t0 + (i / 8 * 256 + lane) * 8 < 32000)) fm_a13 += v12[i];
    }
    const float v4 = fm_row_max(fm_a4, fm_red, fm_par);  /* amax */
    const float v7 = fm_row_sum(fm_a7 * fm_exp(fm_a4 - v4), fm_red, fm_par);  /* online sum */
    const float v13 = fm_row_sum(fm_a13, fm_red, fm_par);  /* sum */
    const float v8 = logf(v7);  /* log */
    const float v9 = (v8 + v4);  /* add */
    if (lane == 0) out0[b3] = v9;
    if (lane == 0) out1[b4] = v13;
  }
}
