// Shared by both mainloops (appended after either): tile order and accumulator staging.
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
