/* fm_device.h: what this daemon compiles for, decided once at startup, and the cache key.
 *
 * With a CUDA driver and a device (dlopen'ed, fm_cuda.h) the daemon runs in GPU mode and
 * device 0's identity (name, cc, SM count, arch) goes into every key. Without one it runs
 * compile-only: device {name "none", cc 0.0, 0 SMs, arch from --arch}, kernels stored
 * untuned. Either way the key also covers the canonical fragment, FM_CODEGEN_VERSION,
 * NVRTC's version and options, and FM_VOCAB_VERSION (fm_fingerprint.h). */
#ifndef FM_DEVICE_H
#define FM_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include "fm_error.h"
#include "fm_fingerprint.h"

typedef struct fm_devinfo {
  int gpu;         /* 1: GPU mode; 0: compile-only */
  fm_device_id id; /* the default target */
  char label[192]; /* fm_device_label(id) */
  uint32_t nvrtc_major, nvrtc_minor;
  uint64_t cublaslt_version;        /* cublasLtGetVersion(), e.g. 130100 */
  char why_no_gpu[sizeof(fm_diag)]; /* compile-only: the reason, for the startup log */
} fm_devinfo;

/* Probes the driver and NVRTC. arch is the compile-only target (ignored in GPU mode, where the
 * device's own arch is used). FM_EUNSUPPORTED if NVRTC cannot target the arch. */
int fm_device_init(fm_devinfo *dev, const char *arch, fm_diag *d);

/* The device identity for a request that names an arch (NULL or "" : the default): the
 * default identity with that arch. FM_EUNSUPPORTED for an arch NVRTC cannot target. */
int fm_device_for_arch(const fm_devinfo *dev, const char *arch, fm_device_id *out, fm_diag *d);

/* The cache key of canonical fragment bytes compiled for id. */
int fm_device_key(const fm_devinfo *dev, const fm_device_id *id, const uint8_t *canonical, size_t canonical_len,
                  fm_key *out);

/* "gpu" | "compile-only" */
const char *fm_device_mode(const fm_devinfo *dev);

#endif
