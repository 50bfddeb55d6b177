/* gpu_util.h: host-side helpers shared by the GPU test suite and the benchmark:
 * a seeded RNG, dtype conversions on the host, device buffers through the dlopen'ed driver,
 * and the error norm ‖out−ref‖/‖ref‖. Everything here runs only on the device machine. */
#ifndef FM_GPU_UTIL_H
#define FM_GPU_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "fm_codegen.h"
#include "fm_cuda.h"
#include "fm_fragment.h"
#include "fm_meta.h"

/* xorshift64*: reproducible random inputs from a printed seed. */
typedef struct {
  uint64_t s;
} gu_rng;
uint64_t gu_next(gu_rng *r);
double gu_uniform(gu_rng *r, double lo, double hi);
uint32_t gu_below(gu_rng *r, uint32_t n);

/* Host conversions (round to nearest even, NaN kept). */
uint16_t gu_f32_to_bf16(float f);
float gu_bf16_to_f32(uint16_t h);
uint16_t gu_f32_to_f16(float f);
float gu_f16_to_f32(uint16_t h);
/* Element i of a buffer of dtype dt, as double. */
double gu_load(const void *buf, fm_dtype dt, size_t i);
/* Stores v rounded to dt. */
void gu_store(void *buf, fm_dtype dt, size_t i, double v);

/* Elements a tensor's buffer spans for dim 0 == outer (max offset + 1). */
size_t gu_span(const fm_tensor *t, int64_t outer);

/* ‖a−b‖₂/‖b‖₂ over n elements in fp64; +inf if any element of a is NaN/inf where b is finite
 * (so NaN never passes), and 0 when both are all-zero. */
double gu_rel_err(const void *a, fm_dtype adt, const void *b, fm_dtype bdt, size_t n);

/* Device memory: abort-free wrappers that print the failing call and return 0 / -1. */
fm_CUdeviceptr gu_dalloc(const fm_cuda *cu, size_t bytes);
int gu_h2d(const fm_cuda *cu, fm_CUdeviceptr d, const void *h, size_t bytes);
int gu_d2h(const fm_cuda *cu, void *h, fm_CUdeviceptr d, size_t bytes);

/* Median of n floats (sorts in place). */
float gu_median(float *v, size_t n);

/* Generates candidate c of canon and compiles it with NVRTC for arch: FM_OK with *cubin
 * (malloc'd) and *meta, else the error code with *err (malloc'd: the codegen reason or
 * NVRTC's log). name: the translation unit's name in NVRTC messages. */
int gu_build_candidate(const fm_fragment *canon, const fm_candidate *c, uint32_t sm_count, const char *arch,
                       const char *name, uint8_t **cubin, size_t *cubin_len, fm_kernel_meta *meta, char **err);

/* fusemld-tuner processes whose parent is this process (zombies included): a daemon running
 * beside the test has a worker of its own, which is not counted. */
int gu_count_child_tuners(void);
/* Whether a candidate described as desc is kept by env FM_GPU_CANDS="sub;sub" (unset or
 * empty: every one; else those whose description contains one of the substrings). */
int gu_picked(const char *desc);

#endif
