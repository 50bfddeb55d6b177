/* fm_codegen.h: fragment -> CUDA C kernel candidates.
 *
 * Only this module writes CUDA source, and every number it writes comes from validated,
 * typed fields of a canonical fragment (never a client string), so no client can inject
 * code. Bump FM_CODEGEN_VERSION on ANY change to generated source: it is part of the
 * cache key, so stale kernels are never served (and add the version to codegen/CHANGES.md). */
#ifndef FM_CODEGEN_H
#define FM_CODEGEN_H

#include <stddef.h>
#include <stdint.h>

#include "fm_error.h"
#include "fm_fragment.h"
#include "fm_meta.h"

#define FM_CODEGEN_VERSION 43 /* what each version changed: codegen/CHANGES.md */

/* ---- the generic API: what the daemon and the tuner use ---------------------------------
 * A fragment is served by one of several templates (pointwise now; row reductions and GEMMs
 * later). A candidate names a template and its parameters; the daemon compiles every
 * candidate, the tuner verifies and times them, and the winner is stored. */

#define FM_TEMPLATE_MAP(XX)     \
  XX(1, POINTWISE, "pointwise") \
  XX(2, ROWS, "rows")           \
  XX(3, GEMM, "gemm")           \
  XX(4, SKINNY, "skinny")       \
  XX(5, CUBLASLT, "cublaslt")   \
  XX(6, B2B, "b2b")             \
  XX(7, COLS, "cols")           \
  XX(8, SCATTER, "scatter")

typedef enum {
  FM_TMPL_NONE = 0,
#define FM_TMPL_ENUM_(n, name, str) FM_TMPL_##name = (n),
  FM_TEMPLATE_MAP(FM_TMPL_ENUM_)
#undef FM_TMPL_ENUM_
} fm_template;

const char *fm_template_name(fm_template t);

#define FM_CANDIDATE_PARAMS 10
/* A template and its parameters, one field of its config a word (meaning per template, in
 * the order of the config's fields; unused ones 0). Plain data: stored in the cache beside
 * each timing, so the numbers of an existing template never change. */
typedef struct fm_candidate {
  fm_template tmpl;
  uint32_t p[FM_CANDIDATE_PARAMS];
} fm_candidate;

/* The configuration used when nothing is tuned; FM_EUNSUPPORTED (reason in d) when no
 * template can serve the fragment (the client then runs it unfused: "bypass"). */
int fm_codegen_default(const fm_fragment *canon, fm_candidate *out, fm_diag *d);
/* Every candidate worth timing for this fragment (the default first), at most max. */
size_t fm_codegen_candidates(const fm_fragment *canon, fm_candidate *out, size_t max);
/* Source + launch metadata for one candidate (as fm_codegen_pointwise). */
int fm_codegen_generate(const fm_fragment *canon, const fm_candidate *c, uint32_t sm_count, char **src,
                        fm_kernel_meta *meta, fm_diag *d);
/* What compiling the fragment's generated code costs, in units of about one cheap op: each
 * op weighs what its code costs NVRTC (measured: a general `pow` is ~30 times an add, erf
 * ~6). The daemon refuses a fragment above its bound (--max-compile-cost, default
 * FM_CODEGEN_MAX_COST) before queueing it: 255 chained general pows held NVRTC for 50 s and
 * made a 1.2 MB CUBIN, while the largest fragment a real model sends costs under 60. */
#define FM_CODEGEN_MAX_COST 1024u
uint32_t fm_codegen_cost(const fm_fragment *canon);
/* "pointwise block=256 vec=0 unroll=4 blocks_per_sm=8", for logs and `fusectl show`. */
void fm_candidate_describe(const fm_candidate *c, char *out, size_t cap);
/* True when candidate c compiles for arch ("sm_90a", ...): the wgmma GEMM mainloop needs
 * sm_90a, a cols kernel in clusters sm_90 or later; every other candidate runs on any
 * supported architecture. */
int fm_candidate_runs_on(const fm_candidate *c, const char *arch);

/* ---- the pointwise template ---------------------------------------------------------- */

/* One point of the pointwise template's tuning space (candidate p[0..3], in this order). */
typedef struct fm_pw_config {
  uint32_t block;         /* threads per block: 128..1024, multiple of 32 */
  uint32_t vec;           /* elements per access: 1 or the 16-byte width; 0 = widest legal */
  uint32_t unroll;        /* vectors per thread per grid-stride step: 1..8 */
  uint32_t blocks_per_sm; /* grid cap = blocks_per_sm * sm_count */
} fm_pw_config;

/* The heuristic configuration used when nothing is tuned (compile-only mode). */
fm_pw_config fm_codegen_pointwise_default(const fm_fragment *canon);

/* Up to max candidates for the tuner; returns how many were written. */
size_t fm_codegen_pointwise_candidates(const fm_fragment *canon, fm_pw_config *out, size_t max);

/* Generates the kernel for a canonical fragment (fm_fragment_canonicalize) and fills its
 * launch metadata. *src is malloc'd (free()). sm_count sizes the grid cap (0: assume 132).
 * FM_EUNSUPPORTED (with the reason in d) for fragments this template cannot run. */
int fm_codegen_pointwise(const fm_fragment *canon, const fm_pw_config *cfg, uint32_t sm_count, char **src,
                         fm_kernel_meta *meta, fm_diag *d);

/* ---- the scatter template (scatter fragments: index_add, fm_codegen_scatter.c) ---------- */

/* One point of its tuning space (candidate p[0..3], in this order). */
typedef struct fm_scatter_config {
  uint32_t block;   /* threads per block: 32..1024, multiple of 32 */
  uint32_t vec;     /* src elements a thread loads at once: a power of two its rows (columns) allow */
  uint32_t table;   /* 1: each block adds into its own [R, D] table in shared memory, then that into the output */
  uint32_t lanes_m; /* 1: a thread's elements are consecutive rows of one column (lanes along M) */
} fm_scatter_config;

/* The default (256 threads, 4 elements a thread where src's rows allow; a shared table where
 * it fits and output rows take 16 src rows or more each, lanes along M where src's columns are
 * contiguous) and the candidates timed beside it (128, 256, 512 threads x the widest, half of
 * it, one element; 256 and 512 threads with lanes along M, through the output and a table,
 * and along D through a table, where each applies). */
fm_scatter_config fm_codegen_scatter_default(const fm_fragment *canon);
size_t fm_codegen_scatter_candidates(const fm_fragment *canon, fm_scatter_config *out, size_t max);
/* Generates the kernel and its launch metadata (kind "pointwise", rule "elementwise": inner
 * D, outer M), as fm_codegen_pointwise. The kernel adds into the output: its caller zeroes it. */
int fm_codegen_scatter(const fm_fragment *canon, const fm_scatter_config *cfg, uint32_t sm_count, char **src,
                       fm_kernel_meta *meta, fm_diag *d);

/* ---- the rows template (row fragments: reductions over the last dim) ------------------
 * One row (up to FM_MAX_ROW_HELD elements) is read once into fp32 registers (elements per thread a compile-time constant,
 * 16-byte vector loads where every row tensor allows them, masked edges for any N), reduced
 * by warp shuffles (+ shared memory across warps), normalised there and written once. A
 * longer row streams (by default past 16384 elements; a candidate past 4096): each pass
 * reads it tile by tile (from L2 after the first), one pass per level of dependent
 * reductions plus one that writes, a sum of exp(x - amax(x)) sharing its amax's pass
 * (log_softmax: 2 reads, 1 write; cross-entropy's statistics: 1 read).
 * Launch metadata: kind "rows", grid rule "rows" (fm_meta.h). */

typedef enum {
  FM_ROWS_WARP = 1,   /* one warp per row, block/32 rows per block: short rows */
  FM_ROWS_BLOCK = 2,  /* one block per row: long rows */
  FM_ROWS_STREAM = 3, /* one block per row, the row streamed through registers in tiles, one
                         pass per level of reductions: rows longer than registers hold well (a
                         vocabulary's logits); no var */
} fm_rows_variant;

/* One point of the rows template's tuning space (candidate p[0..2], in this order). */
typedef struct fm_rows_config {
  uint32_t variant; /* fm_rows_variant */
  uint32_t block;   /* threads per block: 32..1024, multiple of 32 (power of two for BLOCK, STREAM) */
  uint32_t vec;     /* elements per access: 0 = widest legal, else a cap (power of two) */
} fm_rows_config;

fm_rows_config fm_codegen_rows_default(const fm_fragment *canon);
size_t fm_codegen_rows_candidates(const fm_fragment *canon, fm_rows_config *out, size_t max);
/* As fm_codegen_pointwise, for a canonical row fragment (fm_fragment_is_rows). */
int fm_codegen_rows(const fm_fragment *canon, const fm_rows_config *cfg, uint32_t sm_count, char **src,
                    fm_kernel_meta *meta, fm_diag *d);

/* ---- the cols template (column fragments: reductions over dim 0, bias gradients) -------
 * Blocks own a strip of `width` columns; the M rows of a strip are split across the S
 * blocks of a thread block cluster along grid y (sm_90+; S = 1 anywhere else). Threads: TX
 * across the strip (each `vec` contiguous columns: 8 with one 16-byte load per 16-bit input
 * where every column-space input is stride-1 along its columns, 16-byte aligned and N % 8 ==
 * 0, else 1 in a scalar form), TY = block / TX rows at a time, `unroll` rows loaded before
 * any is added; the prologue runs per element, per-column values once per thread. fp32
 * partials reduce across TY in shared memory, then the cluster's blocks meet in rank 0 through
 * distributed shared memory in a fixed rank order, which runs the per-column epilogue and
 * stores: deterministic, one launch, no scratch, no atomics. Launch metadata: kind "columns",
 * grid rule "columns", cluster [1, S, 1] when S > 1 (fm_meta.h). The split form (`split` G >
 * 1): G clusters share the rows, each writes its partials to a scratch buffer the caller
 * allocates, and a second kernel adds them per column in group order and runs the epilogue
 * (metadata key finish): two launches, still no atomics. */

/* One point of the cols template's tuning space (candidate p[0..5], in this order). */
typedef struct fm_cols_config {
  uint32_t width;   /* columns per block (its strip): a power of two, 8..1024, <= block;
                         the candidates take 16..256 */
  uint32_t cluster; /* S: blocks of a cluster sharing a strip's rows: 1, 2, 4 or 8 (> 1: sm_90+) */
  uint32_t vec;     /* columns per thread: 8 (vector loads; the plan must allow them) or 1 */
  uint32_t unroll;  /* rows a thread loads before it adds them: 1..8 (candidates: 8, or 4
                         when that is more than 32 bytes of registers a row) */
  uint32_t block;   /* threads per block: 128..1024, a multiple of width / vec */
  uint32_t split;   /* G: groups of clusters sharing the rows, their partials added by a second
                         kernel (fm_meta.h, finish); 0 or 1: one kernel. A power of two <= 256 */
} fm_cols_config;

fm_cols_config fm_codegen_cols_default(const fm_fragment *canon);
/* The default (width 16, no cluster: it runs anywhere) first, then strip widths x cluster
 * sizes worth timing for canon's N and M. */
size_t fm_codegen_cols_candidates(const fm_fragment *canon, fm_cols_config *out, size_t max);
/* As fm_codegen_pointwise, for a canonical column fragment (fm_fragment_is_cols). */
int fm_codegen_cols(const fm_fragment *canon, const fm_cols_config *cfg, uint32_t sm_count, char **src,
                    fm_kernel_meta *meta, fm_diag *d);

/* ---- the gemm template (GEMM fragments: one mm/addmm + a pointwise epilogue) ----------
 * sm_80+ (also runs on sm_90a): BM x BN x BK tiles, mma.sync m16n8k16 with fp32
 * accumulators, ldmatrix (.trans where the layout needs it), cp.async with STAGES buffers,
 * masked edges for any M and N; K must be a multiple of 8 (16-byte chunks) and every
 * non-unit stride of A and B a multiple of 8 with 16-byte aligned bases, else
 * FM_EUNSUPPORTED. The epilogue runs the fragment's pointwise ops on the fp32 accumulators
 * (staged through shared memory so each thread holds 8 consecutive columns of one row)
 * before the single, 16-byte-wide where aligned, store of each output; blocks may walk the
 * tiles in groups of `raster` tile rows. Launch metadata: kind "gemm", grid rule
 * "tiles" (fm_meta.h), dynamic shared memory (may exceed 48 KiB). */

/* One point of the gemm template's tuning space (candidate p[0..9], in this order). */
typedef struct fm_gemm_config {
  uint32_t bm, bn, bk; /* block tile */
  uint32_t stages;     /* cp.async buffers: 2..4 */
  uint32_t wm, wn;     /* warps along M and N (block = wm * wn * 32 threads) */
  uint32_t raster;     /* tile rows per launch-order group (L2 reuse); 0 or 1: row by row */
  uint32_t wgmma;      /* 0: the sm_80+ mma.sync mainloop; 1 + n: the sm_90a wgmma one with
                            n (0 or 1) wgmma batches in flight (wm = BM / 16, wn = 1, BK 64);
                            3: the same, warp-specialised (+ a loader warpgroup);
                            4: warp-specialised with TMA loads (the launch encodes two tensor
                            maps, metadata "tmaps"); 5: the same, persistent (at most the
                            blocks the device holds, each striding over the tiles, grid rule
                            "persistent"; the next tile loads during the epilogue); 6: the
                            same with two consumer warpgroups of 4 warps (wm = 4), each
                            owning whole BM x BN tiles in turn (ping-pong) */
  uint32_t rtiles;     /* row tiles per block (0 or 1: one; > 1: wgmma modes 1 and 2 only):
                            the block walks rtiles consecutive BM-row tiles, loading the next
                            tile's first k-tiles while the epilogue of this one runs */
  uint32_t cluster;    /* 0 or 1: none; 2 (wgmma modes 4 and 5): blocks in pairs along M that
                            share B, each loading half of its tile and multicasting it to both
                            (a cluster of 2, compiled in) */
} fm_gemm_config;

fm_gemm_config fm_codegen_gemm_default(const fm_fragment *canon);
size_t fm_codegen_gemm_candidates(const fm_fragment *canon, fm_gemm_config *out, size_t max);
/* As fm_codegen_pointwise, for a canonical GEMM fragment (fm_fragment_is_gemm). */
int fm_codegen_gemm(const fm_fragment *canon, const fm_gemm_config *cfg, uint32_t sm_count, char **src,
                    fm_kernel_meta *meta, fm_diag *d);
/* Dynamic shared memory of cfg for canon's layouts, in bytes (0 for an invalid config). */
uint32_t fm_codegen_gemm_smem(const fm_fragment *canon, const fm_gemm_config *cfg);

/* ---- the skinny template (GEMM fragments with a small M: decode) ----------------------
 * Pure weight streaming for M <= 32 with nn.Linear layouts (A = x [M, K] and B = W.t(),
 * both K-major; else FM_EUNSUPPORTED): a block owns `cols` output columns (rows of W) and
 * up to 16 rows of x; its warps split K, each streaming W with 16-byte loads that bypass L1
 * (`unroll` 64-wide K chunks per step; into registers, or through a warp-private cp.async
 * ring) and multiplying with mma.sync m16n8k16 on a K permutation that makes both
 * operands' fragments 16-byte loads. The warps' partial sums meet in shared memory, then
 * the gemm template's generated epilogue runs. Any M works (rows past M are masked; a
 * block per 16 rows), K a multiple of 8, any N. Launch metadata: kind "gemm", grid rule
 * "tiles" with 16-row tiles (fm_meta.h); dynamic shared memory only for the ring. */

/* One point of the skinny template's tuning space (candidate p[0..3], in this order). */
typedef struct fm_skinny_config {
  uint32_t cols;   /* output columns per block: 8, 16, 24 or 32 */
  uint32_t warps;  /* warps splitting K: 1..16 */
  uint32_t unroll; /* 64-wide K chunks per warp and step: 1..8 */
  uint32_t pipe;   /* 0: load then multiply; 1: next step's W prefetched into registers;
                        2..4: a cp.async ring of that many steps per warp */
  uint32_t split;  /* 0 or 1: a block covers all of K; 2 or 4 (sm_90): a cluster of that many
                        blocks shares the columns, each a 1/split of K's chunks, their partial
                        sums added through distributed shared memory (candidate p[4]) */
} fm_skinny_config;

/* The M the skinny template is timed at for canon: its static M, else its M bucket
 * (m_hint); 0 when the template cannot serve it (symbolic M without an m_hint, a layout
 * other than nn.Linear's, anything the gemm plan refuses). */
int64_t fm_codegen_skinny_rows(const fm_fragment *canon);
/* True when the skinny template is canon's default (1 <= rows <= 32, where it is also a
 * candidate; the gemm template's candidates are timed beside it). */
int fm_codegen_skinny_preferred(const fm_fragment *canon);
fm_skinny_config fm_codegen_skinny_default(const fm_fragment *canon);
/* Up to max candidates (the default first); 0 unless 1 <= fm_codegen_skinny_rows() <= 32. */
size_t fm_codegen_skinny_candidates(const fm_fragment *canon, fm_skinny_config *out, size_t max);
/* As fm_codegen_pointwise, for a canonical GEMM fragment (fm_fragment_is_gemm). */
int fm_codegen_skinny(const fm_fragment *canon, const fm_skinny_config *cfg, uint32_t sm_count, char **src,
                      fm_kernel_meta *meta, fm_diag *d);

/* ---- the b2b template (chained GEMM fragments: back-to-back GEMMs, sm_90a) ------------
 * fm_fragment_is_chain: gelu(x @ W1 + b1) @ W2 + ... in one kernel, the [M, N1] intermediate
 * kept on chip (fm_codegen_b2b.c says how). Limits, else FM_EUNSUPPORTED: bf16/f16, K1 a
 * multiple of 64 <= 256, N1 a multiple of 64, N2 a multiple of 16 <= 256, A row-major, B and
 * B2 K-major, leading dims multiples of 8, 16-byte aligned operands. Launch metadata: kind
 * "gemm", grid rule "tiles" with one column tile (a block owns BM whole output rows). */
#define FM_B2B_CPASYNC 0 /* every thread loads with cp.async; each chunk's steps in order */
#define FM_B2B_TMA \
  1 /* a loader warpgroup issues TMA through mbarriers (launch metadata
                               "tmaps": A, B, B2); two consumer warpgroups in ping-pong turns */
#define FM_B2B_TMA_PAIR \
  2 /* the same in clusters of two blocks (adjacent row tiles), each
                               loading half of every weight chunk into both (multicast); grid
                               (2, row-tile pairs) */
typedef struct fm_b2b_config {
  uint32_t bm;   /* output rows per block: 64 or 128 (a warpgroup per 64) */
  uint32_t form; /* FM_B2B_CPASYNC, FM_B2B_TMA or FM_B2B_TMA_PAIR */
} fm_b2b_config;

fm_b2b_config fm_codegen_b2b_default(const fm_fragment *canon);
/* Up to max candidates (the default first); 0 when the template cannot serve canon. */
size_t fm_codegen_b2b_candidates(const fm_fragment *canon, fm_b2b_config *out, size_t max);
int fm_codegen_b2b(const fm_fragment *canon, const fm_b2b_config *cfg, uint32_t sm_count, char **src,
                   fm_kernel_meta *meta, fm_diag *d);

/* ---- cuBLASLt plans (GEMM fragments): the library competes ------------------------------
 * Candidate p[0] is the form (fm_meta.h "blas"): FM_BLAS_DIRECT, cuBLASLt runs the whole
 * fragment (its epilogue is at most a [N] bias and an [M, N] addend, then a relu or a tanh
 * GELU, stored once in A's dtype); FM_BLAS_SPLIT, cuBLASLt writes A@B into the launch's
 * scratch and a generated kernel runs the epilogue on it. No algorithm is chosen here: the
 * metadata leaves algo nil, the tuner's worker times the heuristic's first choices and the
 * winner's algo is stored. Never the default (an untuned plan has no algo to serve). */
#define FM_BLAS_DIRECT    1
#define FM_BLAS_SPLIT     2
#define FM_BLAS_WORKSPACE (4u << 20) /* bytes of workspace a plan may use */

/* The one cuBLASLt candidate of a GEMM fragment (direct where possible, else split) in out[0]:
 * 1, or 0 when the fragment is no GEMM a plan can run. Plans take any K, leading dims and
 * alignment: where the generated templates refuse those, the plan is the default. */
size_t fm_codegen_blas_candidates(const fm_fragment *canon, fm_candidate *out, size_t max);
/* Metadata of kind "cublaslt" and, for the split form, the epilogue kernel's source (*src
 * NULL for the direct form: nothing to compile). FM_EUNSUPPORTED for a direct form the
 * fragment's epilogue does not allow. */
int fm_codegen_blas(const fm_fragment *canon, uint32_t form, uint32_t sm_count, char **src, fm_kernel_meta *meta,
                    fm_diag *d);

#endif
