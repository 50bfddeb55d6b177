/* fm_codegen_gemm.h: INTERNAL to codegen/ (the API is fm_codegen.h): the GEMM templates'
 * shared parts. Files:
 *   fm_codegen_gemm_plan.c      a GEMM fragment -> its plan (layouts, leading dims, batch
 *                               strides, the epilogue's tensors);
 *   fm_codegen_gemm_config.c    the gemm template's tuning space: the mainloop table, the
 *                               configs offered, their checks, shared memory and threads;
 *   fm_codegen_gemm_epilogue.c  the generated epilogue (fm_epilogue) and the tile epilogues
 *                               around it;
 *   fm_codegen_gemm.c           the gemm template's kernel around the mainloop and its
 *                               launch metadata;
 *   fm_codegen_gemm_wgmma.c     fm_wgmma(), the generated instruction of the sm_90a mainloops;
 *   fm_codegen_blas.c           cuBLASLt plans (the library as a candidate) and the split
 *                               form's epilogue kernel, which reuses the generated epilogue;
 *   fm_codegen_skinny.c         the skinny template (small M: weight streaming), which reuses
 *                               the plan, the epilogue and fm_mma();
 *   fm_codegen_b2b.c            back-to-back GEMMs, which reuse fm_cg_gemm_values;
 *   cuda/<name>.cuh             the fixed CUDA text, configured by the macros the generated
 *                               part defines before it (embedded at build time as fm_cg_<name>,
 *                               each file's leading // lines saying what it needs): the sm_80+
 *                               mainloop (gemm_body), the sm_90a ones (wgmma_head, wgmma_ops,
 *                               wgmma_body, wgmma_persistent), the pieces around either
 *                               (gemm_cp_async, gemm_tail, st16), skinny's and b2b's fixed
 *                               parts, and the sm_90 helpers (TMA, mbarriers, clusters) the
 *                               wgmma mainloops, b2b, skinny's split form and cols share (sm90).
 * The epilogue's per-op expressions come from fm_codegen_ops.c (fm_cg_emit_op). */
#ifndef FM_CODEGEN_GEMM_H
#define FM_CODEGEN_GEMM_H

#include "fm_codegen_int.h"

/* The fixed CUDA text (cuda/<name>.cuh, embedded at build time). */
extern const char fm_cg_gemm_cp_async[]; /* fm_saddr, fm_cp16, fm_cp_commit, fm_cp_wait: before either mainloop */
extern const char fm_cg_gemm_body[];     /* the sm_80+ mainloop (fm_mainloop and the slab macros) */
/* The Hopper mainloop, the same contract as fm_cg_gemm_body, in three parts in this order: its
 * macros and shared memory, the warpgroup-MMA helpers b2b shares (fm_wg_fence, fm_wg_commit,
 * fm_wg_wait<N>, fm_desc), the loads and the mainloop. */
extern const char fm_cg_wgmma_head[];
extern const char fm_cg_wgmma_ops[];
extern const char fm_cg_wgmma_body[];
/* The persistent mainloops (FM_GEMM_WGMMA_PERSISTENT, _PINGPONG), after fm_cg_gemm_tail: work units
 * (fm_units, fm_unit_tile), ping-pong turns, fm_load_tiles (the loader) and
 * fm_mainloop_tile (the consumers, one tile at a time). */
extern const char fm_cg_wgmma_persistent[];
/* fm_st16(p, a, b, c, d): one 16-byte global store of four words (the epilogues' stores). */
extern const char fm_cg_st16[];
/* ", w0, w1, w2, w3": fm_st16's words for 16-byte piece v of o<k>[8] (elements of es bytes). */
void fm_cg_emit_st16_words(fm_strbuf *sb, uint32_t k, size_t es, size_t v);
/* fm_tile_of, fm_tile_coords and fm_stage, appended after either mainloop. */
extern const char fm_cg_gemm_tail[];
/* The skinny template's fixed part: loads, the K loop, the cross-warp sum. */
extern const char fm_cg_skinny_body[];
/* b2b's fixed parts: helpers and loads; the TMA forms' loader; a chunk's two products; one
 * chunk's step in the cp.async form and in the TMA forms. */
extern const char fm_cg_b2b_body[];
extern const char fm_cg_b2b_tma[];
extern const char fm_cg_b2b_products[];
extern const char fm_cg_b2b_step_cpasync[];
extern const char fm_cg_b2b_step_tma[];
/* The index (inputs 0..n_inputs-1, then ops) of the value id defined last before position
 * limit, or -1: operands by position, never by the client's ids. */
int fm_cg_value_position(const fm_fragment *f, uint32_t limit, uint32_t id);
/* The value side of a GEMM-shaped plan (n_in/n_out/n_ops, vdt, args as positions, live):
 * every op must be pointwise or one of the products op1 / op2 (-1: none), else
 * FM_EUNSUPPORTED "ops[i]: the <who> cannot run '<op>'". Shared by the gemm and b2b plans. */
int fm_cg_gemm_values(const fm_fragment *f, int op1, int op2, const char *who, fm_cg_plan *p, fm_diag *d);
/* fm_wgmma(d, da, db, add): one wgmma m64n<bn>k16 on descriptors, d += A B (add != 0) or
 * d = A B; ty "bf16" or "f16". */
void fm_cg_gemm_emit_wgmma(fm_strbuf *sb, const char *ty, uint32_t bn);

/* The gemm template's mainloops, by fm_gemm_config.wgmma (the number is the candidate's wire
 * form, p[7]: never renumber). Code asks a mainloop for the property it needs
 * (fm_cg_gemm_mainloop(c->wgmma)->tma), never compares mode numbers. */
typedef enum fm_gemm_mode {
  FM_GEMM_MMA_SYNC = 0,         /* sm_80+: ldmatrix + mma.sync, cp.async stages */
  FM_GEMM_WGMMA = 1,            /* sm_90a: cp.async stages, wgmma, no batch in flight */
  FM_GEMM_WGMMA_INFLIGHT = 2,   /* the same with one wgmma batch in flight */
  FM_GEMM_WGMMA_WS = 3,         /* + a loader warpgroup (warp-specialised, mbarriers) */
  FM_GEMM_WGMMA_TMA = 4,        /* a loader warp issues TMA boxes (two tensor maps) */
  FM_GEMM_WGMMA_PERSISTENT = 5, /* the same, persistent: blocks stride over the tiles */
  FM_GEMM_WGMMA_PINGPONG = 6,   /* persistent, two consumer warpgroups taking tiles in turn */
  FM_GEMM_MODES
} fm_gemm_mode;

typedef struct fm_gemm_mainloop {
  const char *describe;    /* fm_candidate_describe's words after the tile (" wgmma tma") */
  const char *suffix;      /* the kernel entry's suffix ("_wgmma_tma") */
  uint8_t wgmma;           /* warpgroup MMA (fm_cg_wgmma_body, sm_90a, 227 KiB of shared
                               memory); else the mma.sync mainloop (fm_cg_gemm_body, sm_80+) */
  uint8_t inflight;        /* wgmma batches left in flight while the next stage issues */
  uint8_t min_stages;      /* the fewest stages it runs with */
  uint8_t specialized;     /* loaders apart from the MMA warps, each stage with two mbarriers */
  uint32_t loader_threads; /* those loaders: a warpgroup (cp.async) or one warp (TMA) */
  uint8_t tma;             /* loads through the launch's tensor maps (metadata "tmaps"); a
                               map addresses one matrix, so no batch (bmm) */
  uint8_t persistent;      /* at most the blocks the device holds, each striding over the
                               tiles (fm_cg_wgmma_persistent, grid rule "persistent"); the
                               slabs sit beside the stages so the next tile loads meanwhile */
  uint8_t pingpong;        /* two consumer warpgroups, each owning whole tiles in turn */
  uint8_t consumers;       /* consumer warpgroup sets (2 for ping-pong): slabs and threads */
  uint8_t row_tiles;       /* takes rtiles > 1 (several row tiles a block) */
  uint8_t cluster_pair;    /* takes cluster 2 (blocks in pairs sharing B by multicast) */
  uint8_t siblings;        /* takes sibling products (two B's: through pointers or maps) */
} fm_gemm_mainloop;

/* The mainloop of mode (fm_gemm_config.wgmma); NULL past the table. */
const fm_gemm_mainloop *fm_cg_gemm_mainloop(uint32_t mode);
/* The mainloop of a config fm_cg_gemm_check_config accepted (its mode is in the table). */
const fm_gemm_mainloop *fm_cg_gemm_mainloop_of(const fm_gemm_config *c);
/* A gemm config as its candidate, and a gemm candidate (FM_TMPL_GEMM) as its config
 * (fm_codegen.c): code that reads or writes a candidate's mainloop goes through these, then
 * the table above. */
fm_candidate fm_cg_gemm_candidate_of(fm_gemm_config c);
fm_gemm_config fm_cg_gemm_config_of(const fm_candidate *c);

/* What the generators need to know about a GEMM fragment. */
typedef struct fm_cg_gemm_plan {
  fm_cg_plan base; /* n_in/n_out/n_ops, vdt, args (positions), live; rowval all 0 */
  int op;          /* index of the mm/addmm op */
  uint32_t ia, ib; /* input positions of A and B */
  /* Siblings (fm_fragment.h): the second product's op (-1: none) and its B's position; B2
   * has B's layout and leading dim (else the templates refuse). A tile of BN columns holds
   * BN / 2 output columns: each warp's first half of its columns from B, the second half
   * the same columns from B2, so one thread's accumulators pair them for the epilogue. */
  int op2;
  uint32_t ib2;
  fm_dtype dt;                      /* A's and B's dtype */
  int a_kmajor, b_kmajor;           /* K is the contiguous dim of A / of B */
  int64_t lda, ldb;                 /* the other dim's stride */
  int64_t m, k, n;                  /* m = -1 when symbolic */
  int64_t es[FM_CG_MAX_TENSORS][2]; /* [M, N] strides of epilogue tensors (0 where broadcast) */
  /* A batched GEMM (bmm): Bt products, blockIdx.z the product; each tensor's batch stride
   * (0 where broadcast; A's and B's too), batch the static Bt or -1 (the launch's outer).
   * Only templates that address A and B through pointers serve it (the sm_80 mainloop,
   * the cp.async wgmma forms). */
  int batched;
  int64_t batch;
  int64_t ez[FM_CG_MAX_TENSORS];
  uint8_t used[FM_MAX_INPUTS]; /* input read by the epilogue */
} fm_cg_gemm_plan;

/* The plan of a canonical GEMM fragment; FM_EINVAL / FM_EUNSUPPORTED with the reason in d
 * (K not a multiple of 8, layouts, alignment, ops the epilogue cannot run). */
int fm_cg_gemm_plan_build(const fm_fragment *f, fm_cg_gemm_plan *gp, fm_diag *d);
/* The same without the generated templates' limits (K a multiple of 8, leading dims of 8
 * elements, 16-byte aligned A and B): what cuBLASLt's plans need (fm_codegen_blas.c). */
int fm_cg_gemm_plan_build_any(const fm_fragment *f, fm_cg_gemm_plan *gp, fm_diag *d);
/* fm_epilogue<WHOLE = false>(acc[8], m, n, <used inputs>, <outputs>): the fragment's ops on
 * 8 fp32 accumulators of row m, columns n .. n+7 (n a multiple of 8, those past FM_N ignored;
 * WHOLE: the caller knows all 8 are inside, no masking compiled), each output stored once.
 * Needs FM_N defined before it. */
void fm_cg_gemm_emit_epilogue(fm_strbuf *sb, const fm_fragment *f, const fm_cg_gemm_plan *gp);
/* The epilogue's extra parameters: declarations (decl) or the arguments of a call. */
void fm_cg_gemm_emit_epi_params(fm_strbuf *sb, const fm_cg_gemm_plan *gp, int decl);
/* The kernel's signature (inputs, outputs, outer) and its M, up to the body: both templates. */
void fm_cg_gemm_emit_kernel_open(fm_strbuf *sb, const fm_fragment *f, const fm_cg_gemm_plan *gp, const char *entry);
/* The same with __cluster_dims__(cluster, 1, 1) compiled in (cluster > 1): the skinny
 * template's split form. */
void fm_cg_gemm_emit_kernel_open_cluster(fm_strbuf *sb, const fm_fragment *f, const fm_cg_gemm_plan *gp,
                                         const char *entry, uint32_t cluster);
/* The same signature with one more parameter after outer: `const scratch_ty *fm_scratch` (the
 * cuBLASLt split form's product, fm_codegen_blas.c), and `fm_scratch2` for siblings. */
void fm_cg_gemm_emit_kernel_open_extra(fm_strbuf *sb, const fm_fragment *f, const fm_cg_gemm_plan *gp,
                                       const char *entry, const char *scratch_ty);
/* The launch metadata of a GEMM kernel whose blocks each own rows x cols of the output
 * (grid rule "tiles"), after src is generated. */
void fm_cg_gemm_tiles_meta(fm_kernel_meta *meta, const fm_fragment *canon, const fm_cg_gemm_plan *gp, const char *entry,
                           uint32_t threads, uint32_t smem, uint32_t rows, uint32_t cols);
/* ---- the gemm template's tuning space (fm_codegen_gemm_config.c) ---- */
/* Shared memory a block may take: the portable cap of the mma.sync configs (an sm_80 block
 * may opt in to 163 KiB; the tuner runs on one device, but the candidate list must not
 * depend on which), and sm_90a's 227 KiB for the wgmma ones. */
#define FM_CG_GEMM_SMEM_SM80   (163u * 1024u)
#define FM_CG_GEMM_SMEM_SM90   (227u * 1024u)
/* The SMs assumed where the caller has no GPU (an H100 SXM). */
#define FM_CG_GEMM_DEFAULT_SMS 132u
/* Whether cfg runs gp (FM_EINVAL / FM_EUNSUPPORTED with the reason); first of all its mode. */
int fm_cg_gemm_check_config(const fm_cg_gemm_plan *gp, const fm_gemm_config *c, fm_diag *d);
/* Dynamic shared memory of an accepted config, in bytes: stages and slabs. */
uint32_t fm_cg_gemm_smem_bytes(const fm_cg_gemm_plan *gp, const fm_gemm_config *c);
/* Whether the epilogue's slabs sit beside the stages (the next tile loads during the
 * epilogue: several row tiles a block, the persistent forms), and then where they start. */
int fm_cg_gemm_slabs_apart(const fm_gemm_config *c);
uint32_t fm_cg_gemm_slab_offset(const fm_gemm_config *c);
/* The slabs' columns (FM_SCOLS): a warp's whole width, or a part where they sit apart. */
uint32_t fm_cg_gemm_slab_cols(const fm_gemm_config *c);
/* Threads of a block: the MMA warps and the loaders. */
uint32_t fm_cg_gemm_block_threads(const fm_gemm_config *c);
/* __launch_bounds__' blocks per SM: 2 where two fit and the accumulators are few, else 0. */
uint32_t fm_cg_gemm_min_blocks(const fm_gemm_config *c, uint32_t smem);

/* ---- the tile epilogues (fm_codegen_gemm_epilogue.c) ---- */
/* Input k is a bias-like row vector of 16-bit elements whose 8 move as one 16-byte load:
 * the ping-pong kernel reads a lane's 8 before its mainloop (pre<k>). */
int fm_cg_gemm_row_vector16(const fm_cg_gemm_plan *gp, uint32_t k);
/* The epilogue of the tile at row m0 (block-uniform; needs m0, n0, M, acc, slab, lane, wm,
 * wn in scope): each warp stages its accumulators through its slab and runs fm_epilogue on
 * 8 columns of a row; rolled: the ping-pong form's loop (and its preloaded biases). */
void fm_cg_gemm_emit_tile_epilogue(fm_strbuf *sb, const fm_cg_gemm_plan *gp, const char *indent, int rolled);

/* fm_mma(c, a, b0, b1): one mma.sync m16n8k16 (row.col, fp32 accumulators); ty "bf16"/"f16". */
void fm_cg_gemm_emit_mma(fm_strbuf *sb, const char *ty);

#endif
