/* fm_codegen_int.h: INTERNAL to codegen/ (not part of the module's API; fm_codegen.h is).
 *
 * The pointwise generator is split in three files with one job each:
 *   fm_codegen_plan.c       fragment -> plan: value numbering, liveness, flat vs strided
 *                           path, dimension coalescing, vector width;
 *   fm_codegen_ops.c        the per-op CUDA expression table, the fixed prelude and the
 *                           fm_compute() device function (the op chain for one element);
 *   fm_codegen_pointwise.c  the kernel loops around fm_compute(), configs and metadata.
 * Values are named by their position (inputs 0..n_in-1, then op results), never by the
 * client's ids, so nothing a client chose can reach the source. */
#ifndef FM_CODEGEN_INT_H
#define FM_CODEGEN_INT_H

#include <stdint.h>

#include "fm_codegen.h"
#include "fm_strbuf.h"

#define FM_CG_MAX_VALUES  (FM_MAX_INPUTS + FM_MAX_OPS)
#define FM_CG_MAX_TENSORS (FM_MAX_INPUTS + FM_MAX_OUTPUTS)

/* How a kernel parameter is accessed in the main loop. */
typedef enum {
  FM_CG_UNUSED, /* input no live value reads: never loaded */
  FM_CG_SCALAR, /* one element broadcast everywhere: loaded once per thread */
  FM_CG_VECTOR, /* VEC consecutive elements per access (VEC == 1: plain scalar access) */
  FM_CG_SPLAT,  /* strided path, innermost stride 0: one element per vector, splatted */
} fm_cg_access;

typedef struct fm_cg_tensor {
  fm_dtype dtype;
  uint32_t align;
  uint32_t value; /* position of the value read (input) or stored (output) */
  fm_cg_access access;
  int64_t es[FM_MAX_RANK]; /* strides per coalesced dim (0 where broadcast) */
  uint8_t gathered;        /* STRIDED with units: loaded an element at a time at its own
                              coordinates (else a vector at the unit's linear offset) */
} fm_cg_tensor;

typedef struct fm_cg_plan {
  uint32_t n_in, n_out, n_ops;
  fm_cg_tensor t[FM_CG_MAX_TENSORS];      /* inputs, then outputs */
  fm_dtype vdt[FM_CG_MAX_VALUES];         /* dtype of each value */
  uint8_t live[FM_CG_MAX_VALUES];         /* value needs a variable in fm_compute */
  uint16_t args[FM_MAX_OPS][FM_MAX_ARGS]; /* op operands as value positions */
  int symbolic;                           /* dim 0 is a launch argument */
  int64_t inner;                          /* product of iteration dims 1.. */
  int64_t outer;                          /* static dim 0 (1 for rank 0), -1 symbolic */
  int flat;                               /* FLAT path; else STRIDED */
  uint32_t rank;                          /* STRIDED: coalesced rank (>= 1) */
  int64_t dims[FM_MAX_RANK];              /* STRIDED: coalesced sizes; dims[0] is a
                                                 multiplier of outer when symbolic */
  uint32_t max_vec;                       /* widest legal vector (>= 1) */
  uint32_t unit_vec;                      /* STRIDED: widest unit of consecutive elements
                                                 that every output, row-major, stores as one
                                                 vector whatever the rows' length (1: none) */
  uint8_t rowval[FM_CG_MAX_VALUES];       /* rows template: value is a register array,
                                                 read as v<pos>[i] (pointwise: all 0) */
  int64_t iota_cols;                      /* pointwise with a live iota: the iteration's last
                                                 dim C (fm_col = the element's row-major index
                                                 mod C), -1 where that index is the column
                                                 (rank <= 1); 0: no live iota */
} fm_cg_plan;

/* Builds the plan; FM_EINVAL (not a valid fragment) or FM_EUNSUPPORTED, reason in d. */
int fm_cg_plan_build(const fm_fragment *f, fm_cg_plan *p, fm_diag *d);

/* Operands -> positions (args), result dtypes (vdt), the value each output stores (t[n_in + k]
 * .value) and liveness, for p->n_in / n_ops / n_out of f. Elementwise ops only (vocabulary
 * 1), and what `allow` lets through too: FM_CG_ALLOW_REDUCE (the cols template),
 * FM_CG_ALLOW_EXTENT (cats and window ops: the extent form of the pointwise template); else
 * FM_EUNSUPPORTED. */
enum { FM_CG_ALLOW_REDUCE = 1, FM_CG_ALLOW_EXTENT = 2 };
int fm_cg_plan_values(const fm_fragment *f, fm_cg_plan *p, int allow, fm_diag *d);

/* The pointwise template for an extent fragment (a cat or a window op; fm_codegen_cat.c): a
 * unit of elements along the last dim per thread and step (one element, or a 16-byte store's
 * worth where every output's rows hold whole aligned vectors), each operand of a cat
 * evaluated in its own branch at the shifted index, each window op a block of its own
 * (fm_codegen_window.c). */
int fm_codegen_cat(const fm_fragment *canon, const fm_pw_config *cfg, uint32_t sm_count, char **src,
                   fm_kernel_meta *meta, fm_diag *d);
/* The widest unit an extent fragment's outputs store as one aligned vector (1: none). */
uint32_t fm_cg_cat_widest_unit(const fm_fragment *canon);

/* The coordinate names of the extent form: coord[j] names the element's index along dim j. */
typedef char fm_cg_coord[16];
/* Element offset of tensor t at coordinates coord along its first `ndims` dims (size-1 and
 * stride-0 dims never move; "0" when none does). */
void fm_cg_emit_offset(fm_strbuf *sb, const fm_tensor *t, const fm_cg_coord *coord, uint32_t ndims);
/* `v<pos>` of window op i (fm_codegen_window.c): a block at indentation ind that loads the
 * op's inputs at its taps, every load inside the input's shape, and assigns v<pos>. */
void fm_cg_emit_window(fm_strbuf *sb, const fm_fragment *f, const fm_cg_plan *p, uint32_t i, int twin,
                       const fm_cg_coord *coord, const char *ind);
/* The op after max_pool2d op i that is the argmax of the same x and window (its scan's twin:
 * emitted together, v<twin> set from the same loads), or -1. */
int fm_cg_window_twin(const fm_fragment *f, uint32_t i);
/* What a window op's code costs NVRTC (fm_codegen_cost): a unit per tap, the backward's
 * times the windows that can cover one element. */
uint32_t fm_cg_window_cost(const fm_opnode *op);

/* Largest width <= want that every vector tensor of the plan allows, or a unit's (unit_vec)
 * where that is wider: the kernel then runs with units (fm_cg_plan_units). want 0: no limit,
 * and units only where the rows take no vectors (max_vec 1). */
uint32_t fm_cg_plan_vec(const fm_cg_plan *p, uint32_t want);
static inline int fm_cg_plan_units(const fm_cg_plan *p, uint32_t vec) { return !p->flat && vec > p->max_vec; }

/* C storage type of a dtype in memory ("unsigned short" for bf16/f16). */
const char *fm_cg_storage_type(fm_dtype dt);

/* The fixed prelude: conversions, op helpers, vector element access. */
/* The prelude's math level: 1 when any float input or output is 16-bit, so the cheaper
 * ~1e-6-accurate math is exact enough; 2 when every output is bf16 (GELU's fit then ~5e-4,
 * an eighth of its ulp); 0 when the fragment is f32 throughout (the exact library functions). */
int fm_cg_fast_math(const fm_fragment *f);
void fm_cg_emit_prelude(fm_strbuf *sb, int fast_math); /* fast_math: that level, 0..2 */

/* fm_compute(): raw input elements (used inputs, in order) -> raw output elements; where the
 * plan has a live iota (iota_cols), the element's column as its last argument, fm_col. */
int fm_cg_emit_compute(fm_strbuf *sb, const fm_fragment *f, const fm_cg_plan *p, fm_diag *d);

/* The expression for op i (operands by position, named v<pos> or v<pos>[i] per rowval);
 * shared by the pointwise fm_compute() and the rows template, so there is one op table. */
void fm_cg_emit_op(fm_strbuf *sb, const fm_fragment *f, const fm_cg_plan *p, uint32_t i);

/* A float constant as CUDA source: "%.9g" + "f", inf/nan spelled by bit pattern. */
void fm_cg_emit_float(fm_strbuf *sb, double v);

/* Storage access for the templates that hold values in register arrays (rows, cols):
 * the vector type of `bytes` (16: uint4, 8: uint2, 4, 2, 1); a value's C type (bool or
 * float); raw element expression e (storage type) -> value; value v (of dtype vdt) ->
 * storage element of dtype dt; the prelude's element getter / setter for a dtype's size. */
const char *fm_cg_vec_type(uint32_t bytes);
const char *fm_cg_val_type(fm_dtype dt);
void fm_cg_emit_decode(fm_strbuf *sb, fm_dtype dt, const char *e);
void fm_cg_emit_encode(fm_strbuf *sb, fm_dtype dt, fm_dtype vdt, const char *v);
const char *fm_cg_get_fn(fm_dtype dt);
const char *fm_cg_put_fn(fm_dtype dt);

/* `extern "C" __global__ void [__cluster_dims__(1, cluster_y, 1)] __launch_bounds__(block)
 * entry(` then a pointer per input and output (in<k>, out<k>) and `long long outer) {`;
 * cluster_y <= 1: no cluster. */
void fm_cg_emit_signature(fm_strbuf *sb, const fm_cg_plan *p, uint32_t block, uint32_t cluster_y, const char *entry);
/* The same with `float *__restrict__ fm_scratch` after outer: a split column reduction's
 * partial sums (fm_meta.h, finish). */
void fm_cg_emit_signature_scratch(fm_strbuf *sb, const fm_cg_plan *p, uint32_t block, uint32_t cluster_y,
                                  const char *entry);

/* Launch metadata of a one-dimensional block of `block` threads: cleared, then kind, grid
 * rule, entry symbol, block and the plan's input and output counts (the caller adds the grid
 * sizes, outer and what else its template has). */
void fm_cg_meta_begin(fm_kernel_meta *m, const char *kind, const char *rule, const char *entry, uint32_t block,
                      const fm_cg_plan *p);

/* The sm_90 helpers every kernel that uses tensor maps, mbarriers or clusters shares
 * (codegen/cuda/sm90.cuh, embedded at build time): fm_tmap, fm_tma_load, fm_tma_load_both,
 * fm_mbar_wait, fm_arrive_peer, fm_cluster_sync. One copy, emitted once per kernel; changing
 * it changes generated source: bump FM_CODEGEN_VERSION. */
extern const char fm_cg_sm90[];

#endif
