/* fm_codegen.h: fragment -> CUDA C kernel candidates.
 *
 * Only this module writes CUDA source, and every number it writes comes from validated,
 * typed fields of a canonical fragment (never a client string), so no client can inject
 * code. Bump FM_CODEGEN_VERSION on ANY change to generated source: it is part of the
 * cache key, so stale kernels are never served. */
#ifndef FM_CODEGEN_H
#define FM_CODEGEN_H

#include <stddef.h>
#include <stdint.h>

#include "fm_error.h"
#include "fm_fragment.h"
#include "fm_meta.h"

#define FM_CODEGEN_VERSION 2

/* One point of the pointwise template's tuning space. */
typedef struct fm_pw_config {
  uint32_t block;          /* threads per block: 128..1024, multiple of 32 */
  uint32_t vec;            /* elements per access: 1 or the 16-byte width; 0 = widest legal */
  uint32_t unroll;         /* vectors per thread per grid-stride step: 1..8 */
  uint32_t blocks_per_sm;  /* grid cap = blocks_per_sm * sm_count */
} fm_pw_config;

/* The heuristic configuration used when nothing is tuned (compile-only mode). */
fm_pw_config fm_codegen_pointwise_default(const fm_fragment *canon);

/* Up to max candidates for the tuner; returns how many were written. */
size_t fm_codegen_pointwise_candidates(const fm_fragment *canon, fm_pw_config *out, size_t max);

/* Generates the kernel for a canonical fragment (fm_fragment_canonicalize) and fills its
 * launch metadata. *src is malloc'd (free()). sm_count sizes the grid cap (0: assume 132).
 * FM_EUNSUPPORTED (with the reason in d) for fragments this template cannot run. */
int fm_codegen_pointwise(const fm_fragment *canon, const fm_pw_config *cfg, uint32_t sm_count,
                         char **src, fm_kernel_meta *meta, fm_diag *d);

#endif
