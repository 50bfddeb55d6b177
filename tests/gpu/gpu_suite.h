/* gpu_suite.h: a correctness suite of GEMM-shaped fragments for the device machine: each
 * case's candidates compiled locally in parallel (codegen + NVRTC for this GPU), loaded and
 * launched through libfusemld (a cuBLASLt plan with its scratch), outputs poisoned with NaN
 * before each launch, every output compared with the CPU reference (fm_reference_eval,
 * fp64) by ||out-ref||/||ref|| on fresh random inputs (never zeros; the matrix operands
 * scaled so that sums over K stay O(1)); then, optionally, every candidate of one fragment
 * timed. Used by test_bmm_gpu and test_siblings_gpu. Device machine only. */
#ifndef FM_GPU_SUITE_H
#define FM_GPU_SUITE_H

#include <stdint.h>

#include "fm_fragment.h"
#include "gpu_util.h"

/* Fragment pieces for the tests built on the suite (wire ids, not yet canonical): a rank-2
 * matrix [d0, d1], row-major or column-major (colmajor) with its leading dim rounded up to
 * 8 elements (16-byte rows); a dense rank-1 vector [n]; an op appended to f (unused args 0). */
void gs_matrix(fm_tensor *t, uint32_t id, fm_dtype dt, int64_t d0, int64_t d1, int colmajor);
void gs_vector(fm_tensor *t, uint32_t id, fm_dtype dt, int64_t n);
void gs_op(fm_fragment *f, fm_op o, uint32_t out, uint32_t nargs, uint32_t a0, uint32_t a1, uint32_t a2);

/* Validates f and canonicalizes it into canon: FM_OK, or the error after printing
 * "FAIL build <what>: <reason>". */
int gs_canon(fm_fragment *f, fm_fragment *canon, const char *what);

/* Loads the driver, makes device 0's primary context current, prints the device and seed;
 * 0, or 2 without a GPU. */
int gs_start(uint64_t seed);
/* From now on (cases added, gs_time), an input laid out like an earlier one (dtype, shape,
 * strides) reads that one's memory: the same tensor passed twice, as the client sends the
 * MLP's x as the first product's operand and again as the residual. Off at the start. */
void gs_share_equal_inputs(int on);
/* A case: every candidate of canon (which the suite copies) becomes a job, launched at
 * outer (env FM_GPU_CANDS="sub;sub": only those whose description contains one of them);
 * k scales the operands' random values (1 / K^(1/4)). */
void gs_add_case(const char *name, const fm_fragment *canon, int64_t outer, int64_t k);
/* Compiles every job (16 threads), then checks each case in order; prints one line per
 * kernel ("ok" / "FAIL ...") and returns the failures so far. */
int gs_run(void);
/* Times every candidate of canon (that FM_GPU_CANDS picks) at outer, its launches taking
 * buffer sets in turn (copies of the inputs and outputs spanning 128 MiB, at most 8: inputs
 * from memory, not L2) (3 warm-ups, the median of 20 between CUDA
 * events), printing "time [desc]: ms" and returning the fastest (ms) with its description
 * in best (cap bytes). */
double gs_time(const fm_fragment *canon, int64_t outer, int64_t k, char *best, size_t cap);
/* Prints "N passed, N failed", releases the context; the exit status (0: all passed). */
int gs_finish(void);

#endif
