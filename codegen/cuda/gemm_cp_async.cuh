// cp.async and shared-address helpers, emitted before either mainloop.
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
