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
