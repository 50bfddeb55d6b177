/* fm_nvrtc.h: CUDA C -> CUBIN with NVRTC. Thread-safe: called from worker threads. */
#ifndef FM_NVRTC_H
#define FM_NVRTC_H

#include <stddef.h>
#include <stdint.h>

#include "fm_error.h"

/* NVRTC's version (nvrtcVersion). */
int fm_nvrtc_version(uint32_t *major, uint32_t *minor);

/* True for the architectures we compile for: sm_80, sm_86, sm_89, sm_90, sm_90a, sm_100,
 * sm_100a, sm_120 (whatever this NVRTC supports of those). */
int fm_nvrtc_arch_supported(const char *arch);

/* The options string compile() passes for arch, space separated (part of the cache key). */
const char *fm_nvrtc_options(const char *arch, char *buf, size_t cap);

/* Compiles src (one translation unit, no #include of files) for arch to CUBIN.
 * On success *cubin and *cubin_len are malloc'd. On FM_ECOMPILE *log holds NVRTC's log
 * (malloc'd, may be NULL for other errors); free() both. */
int fm_nvrtc_compile(const char *src, const char *name, const char *arch, uint8_t **cubin, size_t *cubin_len,
                     char **log);

#endif
