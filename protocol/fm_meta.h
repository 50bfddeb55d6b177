/* fm_meta.h: launch metadata: everything a client needs to launch a served kernel without
 * knowing any template. Packed into compile/lookup replies and stored in the cache.
 *
 * Wire form (msgpack map, fixed key order):
 *   {kind: "pointwise", entry: str, block: [x, y, z], smem: u32,
 *    grid: {rule: "elementwise", inner: u64, items_per_block: u64, max_blocks: u32},
 *    outer: i64 (-1 when dim 0 is symbolic), n_inputs: u32, n_outputs: u32,
 *    params: ["in", ..., "out", ..., "outer"], cluster?: [x, y, z], tmaps?: [...], blas?: {...}}
 *
 * Kernel parameters, in order: one device pointer per input (fragment order), one per
 * output, then `long long outer` (the size of dim 0 for this launch; for a static
 * fragment pass `outer`). Grid for rule "elementwise":
 *   n = outer * inner;  grid.x = clamp(ceil(n / items_per_block), 1, max_blocks)
 * (n == 0: do not launch). Grid for rule "rows" (kind "rows", row fragments): inner is
 * the number of rows per unit of dim 0 and items_per_block the rows per block:
 *   rows = outer * inner;  grid.x = clamp(ceil(rows / items_per_block), 1, max_blocks)
 * (the kernel strides over rows, so the cap is safe). Grid for rule "tiles" (kind "gemm":
 * output tiles of items_per_block rows by inner / max_blocks columns, a 2-D grid):
 *   grid.x = max_blocks (column tiles, fixed by N);
 *   grid.y = ceil(outer / items_per_block)   (row tiles; M = outer; 0: do not launch)
 * `smem` may exceed 48 KiB for this rule (the client raises the function's limit).
 * Grid for rule "persistent" (kind "gemm", a kernel whose blocks stride over the output
 * tiles): units of items_per_block rows, inner blocks per row of units (the column tiles;
 * twice that when a cluster of two shares one), at most max_blocks blocks (the device's
 * SMs times the blocks that fit on one):
 *   tiles = ceil(outer / items_per_block) * inner;  grid.x = min(tiles, max_blocks)
 *   (0: do not launch); grid.y = 1.
 * Grid for rule "batched" (kind "gemm", a batched GEMM fragment: a 3-D grid of the tiles of
 * every product): inner is the static M of one product, items_per_block its rows per block,
 * max_blocks the column tiles, outer the batch (the products):
 *   grid.x = max_blocks;  grid.y = ceil(inner / items_per_block);  grid.z = outer
 *   (0: do not launch).
 * Grid for rule "columns" (kind "columns", column fragments: reductions over dim 0 of an
 * [M, N] space): inner is N, items_per_block the columns of one block's strip, max_blocks the
 * strips (ceil(N / items_per_block)); the M rows of a strip are shared by the S blocks of a
 * thread block cluster along y (the kernel's compiled-in cluster, key `cluster` below):
 *   grid.x = max_blocks;  grid.y = S (cluster[1], 1 without a cluster) * G;  grid.z = 1
 * launched for every M = outer >= 0, 0 included (the outputs are still written). G is 1
 * unless the key `finish` (below) says otherwise.
 *
 * Split column reductions: an optional key (after cluster, before tmaps and blas)
 *   finish: {entry: str, block: u32, grid: u32, groups: u32, scratch: u64}
 * (rule "columns" only) says the M rows are shared by G = groups clusters, each of which
 * writes its fp32 partial sums into a scratch buffer the CALLER allocates per launch
 * (`scratch` bytes, 256-byte aligned, passed as outputs[n_outputs], and the last parameter,
 * "scratch", of both kernels); then the kernel `entry` of this key, launched on the same
 * stream with grid.x = grid and `block` threads (grid.y = grid.z = 1, no dynamic shared
 * memory) and the same parameters, adds the G partials of each column in a fixed order and
 * writes the outputs. Without the second launch no output is written: a client that does not
 * know the key refuses the parameter list (it ends with "scratch"). Few columns over many
 * rows (a batch norm's statistics: 64 channels of 800k rows) fill the GPU this way.
 * Grid rule "none": no kernel at all (a kind "cublaslt" plan in its direct form, below).
 *
 * Clusters: an optional key `cluster: [x, y, z]` (after params, before tmaps and blas; each
 * 1..8, 8 blocks at most) says the kernel was compiled with __cluster_dims__(x, y, z), so the
 * grid must be a multiple of it; only rule "columns" takes one ([1, S, 1]), and a client
 * refuses it with any other rule. Absent: no cluster (a plain cuLaunchKernel launches one
 * compiled in all the same).
 *
 * cuBLASLt plans (kind "cublaslt"): an optional key
 *   blas: {form: "direct" | "split", dtype: "bf16" | "f16", a: u32, b: u32, bias: i32,
 *          c: i32, out: u32, act: "none" | "relu" | "gelu_tanh", a_kmajor: bool,
 *          b_kmajor: bool, lda: u64, ldb: u64, ldc: u64, ldd: u64, m: i64 (-1: outer),
 *          n: u64, k: u64, align: [a, b, c, d], workspace: u64,
 *          scratch: [fixed_bytes, row_bytes], algo: bin(64) | nil, batch?: [stride_a, stride_b],
 *          b2?: u32}
 * says the launch runs one cublasLtMatmul of input a ([M, K]) by input b ([K, N]), both
 * row-major views with leading dims lda / ldb (K contiguous in A when a_kmajor, in B when
 * b_kmajor), fp32 accumulation and scale, on a scratch buffer the CALLER allocates per
 * launch: fixed_bytes + outer * row_bytes, passed as outputs[n_outputs] (one pointer past
 * the outputs), 256-byte aligned; its first `workspace` bytes (rounded up to 256) are
 * cuBLASLt's workspace.
 *  - form "direct" (grid rule "none", no kernel, entry ""): cuBLASLt writes output `out`
 *    (row-major, leading dim ldd) as act(A@B + bias + C): bias (input `bias`, [N], or -1)
 *    through cuBLASLt's BIAS epilogue, C (input `c`, [M, N] with leading dim ldc, or -1)
 *    through beta = 1, then the activation;
 *  - form "split": cuBLASLt writes A@B (dtype, row-major [M, N], leading dim n) into the
 *    scratch after the workspace, then the kernel `entry` runs the whole epilogue on it; its
 *    params end with "scratch": that matmul result's address.
 * A plan of sibling products (two sharing A, fm_fragment.h) has the key b2: the second
 * product's B (input position). It is always the split form: cuBLASLt writes A@B and then
 * A@B2 densely after it ([rows, n] each; row_bytes counts both), and the kernel's params end
 * with "scratch", "scratch2" (the two products' addresses): a client that knows no b2
 * refuses that parameter list, so it never runs one product for both.
 * A plan of a batched GEMM fragment (bmm) has the key batch: the launch runs `outer` products
 * (m is then each one's static M), A's and B's batch strides in elements (0: one matrix for
 * every product), the product written densely as [outer, M, N] into the scratch (row_bytes
 * is then one product's M x N elements); such a plan is always the split form and its kernel
 * has grid rule "batched" (a client that knows neither refuses it).
 * algo is the cublasLtMatmulAlgo_t the tuner chose (nil: none chosen yet, the tuner's
 * search); the client re-checks it with cublasLtMatmulAlgoCheck for each M it launches
 * and falls back to the heuristic's first choice for an M it does not fit. align: the
 * fewest bytes each operand's address is aligned to (cuBLASLt's alignment preferences).
 *
 * Tensor maps (the sm_90a TMA mainloop): an optional last key
 *   tmaps: [{input: u32, dtype: "bf16" | "f16", rows: i64 (-1: outer), cols: u64,
 *            ld: u64 (elements between rows), box: [box_cols, box_rows]}, ...]
 * appends one "tmap" to params per entry, after "outer": a 128-byte CUtensorMap passed by
 * value, which the client encodes per launch for input `input` seen as a row-major
 * [rows, cols] matrix (128-byte swizzle, zero fill past the edges). Absent: no tensor maps. */
#ifndef FM_META_H
#define FM_META_H

#include <stdint.h>
#include <msgpack.h>

#include "fm_error.h"

#define FM_META_ENTRY_MAX  64
#define FM_META_MAX_TMAPS  3                                     /* A, B, and a sibling's B2 */
#define FM_META_MAX_PARAMS (32 + 16 + 1 + FM_META_MAX_TMAPS + 2) /* + a plan's scratch (two: siblings) */
#define FM_META_MAX_GROUPS 1024u                                 /* finish.groups */
#define FM_META_ALGO_BYTES 64                                    /* sizeof(cublasLtMatmulAlgo_t) */

/* One tensor map the launch encodes (see tmaps above). */
typedef struct fm_meta_tmap {
  uint32_t input;      /* which input pointer */
  uint32_t elem_bytes; /* 2: "bf16" or "f16" (dtype below) */
  char dtype[8];
  int64_t rows;      /* -1: the launch's outer */
  uint64_t cols, ld; /* elements; ld >= cols, ld * elem_bytes a multiple of 16 */
  uint32_t box[2];   /* box_cols (box_cols * elem_bytes == 128: one swizzle row), box_rows */
} fm_meta_tmap;

/* A split column reduction's second kernel (see finish above); entry[0] == 0: none. */
typedef struct fm_meta_finish {
  char entry[FM_META_ENTRY_MAX];
  uint32_t block, grid, groups;
  uint64_t scratch; /* bytes */
} fm_meta_finish;

/* A cuBLASLt plan (see blas above); form[0] == 0: none. */
typedef struct fm_meta_blas {
  char form[8];    /* "direct" | "split" */
  char dtype[8];   /* "bf16" | "f16" */
  uint32_t a, b;   /* input positions of A and B */
  int32_t bias, c; /* input positions, -1: none (direct form only) */
  uint32_t out;    /* direct form: the output written */
  char act[12];    /* "none" | "relu" | "gelu_tanh" */
  uint32_t a_kmajor, b_kmajor;
  uint64_t lda, ldb, ldc, ldd;
  int64_t m; /* -1: the launch's outer */
  uint64_t n, k;
  uint32_t align[4];           /* bytes: A, B, C, D */
  uint64_t workspace;          /* bytes */
  uint32_t has_b2, b2;         /* siblings: the second product's B (input position) */
  uint32_t batched;            /* bmm: outer products, batch strides below */
  uint64_t stride_a, stride_b; /* elements between products (0: one for all) */
  uint32_t has_algo;
  uint8_t algo[FM_META_ALGO_BYTES];
} fm_meta_blas;

typedef struct fm_kernel_meta {
  char kind[16];                 /* "pointwise", "rows", "columns", "gemm", "cublaslt" */
  char entry[FM_META_ENTRY_MAX]; /* kernel symbol (extern "C") */
  uint32_t block[3];
  uint32_t smem;      /* dynamic shared memory bytes */
  char grid_rule[16]; /* "elementwise", "rows", "tiles", "persistent", "batched",
                                    "columns", "none" */
  uint64_t inner;     /* elements per unit of dim 0 */
  uint64_t items_per_block;
  uint32_t max_blocks;
  int64_t outer; /* static dim-0 size, or -1 when symbolic */
  uint32_t n_inputs, n_outputs;
  uint32_t cluster[3]; /* compiled-in cluster dims; 0 or 1 each: none (key `cluster`) */
  uint32_t n_tmaps;    /* tensor-map parameters after outer (0 .. FM_META_MAX_TMAPS) */
  fm_meta_tmap tmaps[FM_META_MAX_TMAPS];
  fm_meta_blas blas;     /* kind "cublaslt" */
  fm_meta_finish finish; /* rule "columns", split over row groups */
} fm_kernel_meta;

int fm_meta_pack(const fm_kernel_meta *m, msgpack_packer *pk);
/* FM_ESCHEMA with a reason for a missing/ill-typed field. */
int fm_meta_unpack(const msgpack_object *obj, fm_kernel_meta *m, fm_diag *d);
/* Whether rule is one of the grid rules above (a client refuses any other). */
int fm_meta_rule_known(const char *rule);
/* Grid size for `outer` per the rule; 0 when there is nothing to do. */
uint64_t fm_meta_grid_x(const fm_kernel_meta *m, int64_t outer);
/* Bytes of the scratch buffer a launch at `outer` needs (0: none; see blas and finish above). */
uint64_t fm_meta_scratch_bytes(const fm_kernel_meta *m, int64_t outer);
/* Offset of the split form's matmul result in the scratch: the workspace, rounded up to 256. */
uint64_t fm_meta_scratch_result_offset(const fm_kernel_meta *m);
/* Bytes from the first product to the second (siblings' b2) for a launch at outer; 0: none. */
uint64_t fm_meta_scratch_second_offset(const fm_kernel_meta *m, int64_t outer);
/* grid.y: the row tiles for rules "tiles" and "batched", S * G for "columns", 1 for
 * the 1-D rules, 0 when nothing to do. */
uint64_t fm_meta_grid_y(const fm_kernel_meta *m, int64_t outer);
/* grid.z: the products for rule "batched", 1 for the others, 0 when nothing to do. */
uint64_t fm_meta_grid_z(const fm_kernel_meta *m, int64_t outer);

#endif
