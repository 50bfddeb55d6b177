/* fm_blas.h: INTERNAL to gpu/ (fm_module.c): running a cuBLASLt plan (fm_meta.h "blas").
 *
 * cuBLASLt is loaded with dlopen, preferring the copy the process already has (PyTorch's:
 * RTLD_NOLOAD), so a process never holds two. One plan: a handle, the matmul descriptor
 * (transposes, epilogue, fp32 compute) and, per M, the four matrix layouts and the algorithm
 * that runs at that M: the stored one where cublasLtMatmulAlgoCheck accepts it, else the
 * heuristic's first choice. Row-major C = A@B is column-major C^T = B^T A^T, so cuBLASLt's
 * "A" is the fragment's B and its "B" the fragment's A. Thread-safe (one lock per plan). */
#ifndef FM_BLAS_H
#define FM_BLAS_H

#include <stddef.h>
#include <stdint.h>

#include "fm_error.h"
#include "fm_meta.h"

typedef struct fm_blas fm_blas;

/* A plan for meta (kind "cublaslt"), on the calling thread's current context. FM_ENOGPU when
 * no cuBLASLt can be loaded, FM_ECUDA when it refuses the descriptors. */
int fm_blas_open(const fm_kernel_meta *meta, fm_blas **out, fm_diag *d);
void fm_blas_close(fm_blas *b);

/* The product for dim 0 = outer on stream: inputs per the metadata, d_out the matrix written
 * (the output, or the split form's place in the scratch), workspace at the scratch's start.
 * Asynchronous. */
int fm_blas_run(fm_blas *b, void *const *inputs, void *d_out, void *workspace, int64_t outer, void *stream, fm_diag *d);

/* The tuner's search: the heuristic's first choices (at most max) at dim 0 = outer; returns
 * how many (>= 1) or a negative error. fm_blas_choose(i) makes choice i the plan's algorithm
 * for every M; fm_blas_algo copies the plan's algorithm (FM_ENOT_FOUND when it has none). */
int fm_blas_search(fm_blas *b, int64_t outer, int max, fm_diag *d);
int fm_blas_choose(fm_blas *b, int i, fm_diag *d);
int fm_blas_algo(fm_blas *b, uint8_t out[FM_META_ALGO_BYTES]);

#endif
