// cuda/wgmma_head.cuh, wgmma_ops.cuh and wgmma_body.cuh, in this order: the gemm template's Hopper mainloop (sm_90a): warpgroup MMA.
//
// Same contract as cuda/gemm_body.cuh (fm_mainloop and the slab macros; the cp.async
// helpers come before it from fm_cg_gemm_cp_async, fm_tile_coords and fm_stage after it
// from fm_cg_gemm_tail), so the generated kernel and epilogue around it
// are the gemm template's own. What differs: each warpgroup (4 warps, 128 threads) owns 64
// rows of the block's BM x BN tile and multiplies with wgmma.mma_async m64nBNk16, both operands read by the tensor cores straight
// from shared memory through matrix descriptors (no ldmatrix, no register fragments of A or
// B). Only the nn.Linear layouts (A and B both K-major) are served, with BK = 64: a stage row
// of 64 bf16/f16 is exactly one 128-byte swizzle row. Tiles are filled by cp.async into the
// 128-byte-swizzled layout the descriptors name (16-byte chunk c of row r at chunk c ^ (r % 8);
// stage buffers 1024-byte aligned, so the hardware's address-based swizzle agrees), then a
// proxy fence makes the generic-proxy writes visible to the async proxy wgmma reads through.
//
// Pipeline: FM_WG_INFLIGHT (0 or 1) wgmma batches stay in flight while the next stage is
// issued; a stage is refilled only once every warpgroup is done reading it, so the loads run
// FM_STAGES - 1 - FM_WG_INFLIGHT k-tiles ahead. The accumulator fragment of m64nN gives
// warp w of the block rows 16w .. 16w+15 in the same per-warp layout as mma.sync m16n8 (a
// thread's 4 values per 8 columns), so the epilogue's staging (fm_stage) is unchanged, with
// FM_WM = BM / 16 warps along M and FM_WN = 1.
//
// FM_WG_TMA (always warp-specialised; FM_GEMM_WGMMA_TMA and the persistent forms below): the loader
// is one thread of a warp after the consumer warpgroups, issuing TMA boxes through two tensor maps the launch encodes (launch
// metadata "tmaps", fm_meta.h); fm_mainloop then takes the maps' addresses in place of A
// and B. One loader warp rather than a warpgroup leaves registers for two blocks per SM.
//
// The generated part defines FM_BM, FM_BN, FM_BK (64), FM_STAGES, FM_WM, FM_WN, FM_RASTER,
// FM_K, FM_N, FM_LDA, FM_LDB, FM_SCOLS (slab columns), FM_WG_INFLIGHT, FM_WG_SPECIALIZED,
// FM_WG_TMA, fm_wgmma() and the sm_90 helpers (fm_cg_sm90: fm_mbar_wait, fm_tma_load, ...) before
// this text (FM_SLAB_OFF too when the slabs sit beside the stages: several row tiles per
// block, FM_RT, or the persistent forms, FM_WG_PINGPONG telling ping-pong). Changing it
// changes generated source: bump FM_CODEGEN_VERSION.
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
