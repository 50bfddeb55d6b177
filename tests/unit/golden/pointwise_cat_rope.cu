/* fusemld codegen v43: pointwise kernel, CAT path, vec 8, unroll 2, block 256.
 * Generated from a canonical fragment: every name and number below comes from its
 * typed fields. One self-contained translation unit (NVRTC has no include path). */
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
/* ---- the kernel ---- */
extern "C" __global__ void __launch_bounds__(256) fm_pointwise_v43(
    const unsigned short *__restrict__ in0,
    const unsigned short *__restrict__ in1,
    const unsigned short *__restrict__ in2,
    const unsigned short *__restrict__ in3,
    const unsigned short *__restrict__ in4,
    unsigned short *__restrict__ out0,
    long long outer) {
  const long long n = outer * 24LL;
  const long long nu = n / 8;  /* units of 8 elements */
  for (long long e0 = (long long)blockIdx.x * 512 + threadIdx.x; e0 < nu;
       e0 += (long long)gridDim.x * 512) {
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      if (e0 + u * 256 >= nu) break;
      const long long e = (e0 + u * 256) * 8;  /* the unit's first element */
      const long long c0 = e / 24LL;
      unsigned int r = (unsigned int)(e - c0 * 24LL);
      const long long c2 = (long long)(r % 8u);
      r /= 8u;
      const long long c1 = (long long)(r % 3u);
      r /= 3u;
      uint4 w0 = {};
#pragma unroll
      for (int q = 0; q < 8; ++q) {
        const long long cl = c2 + q;
        const float v2 = fm_bf16_to_f32(in2[c0 * 24LL + c1 * 8LL + cl]);
        const float v3 = fm_bf16_to_f32(in3[c0 * 8LL + cl]);
        const float v4 = fm_bf16_to_f32(in4[c0 * 8LL + cl]);
        const float v5 = (v2 * v3);  /* mul */
        float v7;  /* cat along dim 2 */
        if (cl < 4LL) {
          const float v1 = fm_bf16_to_f32(in1[c0 * 24LL + c1 * 8LL + cl]);
          const float v6 = (-v1);  /* neg */
          v7 = v6;
        } else {
          const long long b2 = cl - 4LL;
          const float v0 = fm_bf16_to_f32(in0[c0 * 24LL + c1 * 8LL + b2]);
          v7 = v0;
        }
        const float v8 = (v7 * v4);  /* mul */
        const float v9 = (v5 + v8);  /* add */
        fm_put_u16(w0, q, fm_f32_to_bf16(v9));
      }
      *reinterpret_cast<uint4 *>(out0 + c0 * 24LL + c1 * 8LL + c2) = w0;
    }
  }
}
