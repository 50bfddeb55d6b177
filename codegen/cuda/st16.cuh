/* One 16-byte store of four words. Through a uint4 cast, the compiler split some of
   these into four 4-byte stores (PTX of the ping-pong kernel; ncu: 12.8 of 32
   bytes used per stored sector). */
__device__ __forceinline__ void fm_st16(void *p, unsigned a, unsigned b, unsigned c, unsigned d) {
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::
               "l"(__cvta_generic_to_global(p)), "r"(a), "r"(b), "r"(c), "r"(d));
}
