/* fm_cuda.c: the CUDA driver, loaded once per process with dlopen.
 *
 * Why dlopen and not -lcuda: libcuda.so.1 belongs to the driver, not the toolkit, so it
 * exists only on GPU machines; linking it would make fusemld, fusectl and libfusemld
 * unusable everywhere else (and "no GPU is a mode, not an error"). Inside PyTorch the
 * driver is already loaded, and RTLD_NOLOAD makes us share that very copy. */
#include "fm_cuda.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

/* Device attributes from the driver's CUdevice_attribute enum (stable ABI values). */
#define FM_CU_ATTR_MULTIPROCESSOR_COUNT 16
#define FM_CU_ATTR_CC_MAJOR             75
#define FM_CU_ATTR_CC_MINOR             76

/* Where each entry point goes. Versioned names where the driver kept an old ABI under the
 * plain name (cuMemAlloc is the 32-bit-size one; cuMemAlloc_v2 takes size_t). */
static const struct {
  size_t offset;
  const char *symbol;
} fm_cuda_syms[] = {
#define FM_SYM_(field, name) \
  { offsetof(fm_cuda, field), name }
    FM_SYM_(cuInit, "cuInit"),
    FM_SYM_(cuDriverGetVersion, "cuDriverGetVersion"),
    FM_SYM_(cuDeviceGetCount, "cuDeviceGetCount"),
    FM_SYM_(cuDeviceGet, "cuDeviceGet"),
    FM_SYM_(cuDeviceGetName, "cuDeviceGetName"),
    FM_SYM_(cuDeviceGetAttribute, "cuDeviceGetAttribute"),
    FM_SYM_(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain"),
    FM_SYM_(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2"),
    FM_SYM_(cuCtxGetCurrent, "cuCtxGetCurrent"),
    FM_SYM_(cuCtxSetCurrent, "cuCtxSetCurrent"),
    FM_SYM_(cuCtxSynchronize, "cuCtxSynchronize"),
    FM_SYM_(cuModuleLoadData, "cuModuleLoadData"),
    FM_SYM_(cuModuleUnload, "cuModuleUnload"),
    FM_SYM_(cuModuleGetFunction, "cuModuleGetFunction"),
    FM_SYM_(cuLaunchKernel, "cuLaunchKernel"),
    FM_SYM_(cuMemAlloc, "cuMemAlloc_v2"),
    FM_SYM_(cuMemFree, "cuMemFree_v2"),
    FM_SYM_(cuMemcpyHtoD, "cuMemcpyHtoD_v2"),
    FM_SYM_(cuMemcpyDtoH, "cuMemcpyDtoH_v2"),
    FM_SYM_(cuMemcpyDtoD, "cuMemcpyDtoD_v2"),
    FM_SYM_(cuMemsetD8, "cuMemsetD8_v2"),
    FM_SYM_(cuEventCreate, "cuEventCreate"),
    FM_SYM_(cuEventRecord, "cuEventRecord"),
    FM_SYM_(cuEventSynchronize, "cuEventSynchronize"),
    FM_SYM_(cuEventElapsedTime, "cuEventElapsedTime"),
    FM_SYM_(cuEventDestroy, "cuEventDestroy_v2"),
    FM_SYM_(cuGetErrorString, "cuGetErrorString"),
    FM_SYM_(cuFuncSetAttribute, "cuFuncSetAttribute"),
    FM_SYM_(cuTensorMapEncodeTiled, "cuTensorMapEncodeTiled"),
#undef FM_SYM_
};

/* The result of the one load attempt; never changes after pthread_once. */
static pthread_once_t fm_cuda_once = PTHREAD_ONCE_INIT;
static fm_cuda fm_cuda_table;
static int fm_cuda_err;
static fm_diag fm_cuda_reason;

static const char *fm_cuda_errstr(const fm_cuda *cu, fm_CUresult r) {
  const char *s = NULL;
  if (cu && cu->cuGetErrorString && cu->cuGetErrorString(r, &s) == 0 && s) return s;
  return "unknown CUDA error";
}

static int fm_cuda_load_impl(void) {
  fm_diag *d = &fm_cuda_reason;
  void *h;
  int err = FM_OK, count = 0;
  fm_CUresult r;

  h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (!h) h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char *why = dlerror();
    return fm_diag_set(d, FM_ENOGPU, "cannot load the CUDA driver (libcuda.so.1): %s", why ? why : "not found");
  }
  for (size_t i = 0; i < sizeof fm_cuda_syms / sizeof fm_cuda_syms[0]; i++) {
    void *sym = dlsym(h, fm_cuda_syms[i].symbol);
    if (!sym) {
      err = fm_diag_set(d, FM_ENOGPU, "the CUDA driver lacks %s (driver too old?)", fm_cuda_syms[i].symbol);
      goto fail;
    }
    /* POSIX guarantees a data pointer from dlsym converts to a function pointer;
     * memcpy avoids the ISO C cast warning. */
    memcpy((char *)&fm_cuda_table + fm_cuda_syms[i].offset, &sym, sizeof sym);
  }
  r = fm_cuda_table.cuInit(0);
  if (r != 0) {
    err = fm_diag_set(d, FM_ENOGPU, "cuInit failed: %s (CUresult %d)", fm_cuda_errstr(&fm_cuda_table, r), r);
    goto fail;
  }
  r = fm_cuda_table.cuDeviceGetCount(&count);
  if (r != 0 || count <= 0) {
    err = fm_diag_set(d, FM_ENOGPU, "the CUDA driver reports no device (%s)",
                      r != 0 ? fm_cuda_errstr(&fm_cuda_table, r) : "count 0");
    goto fail;
  }
  return FM_OK; /* the handle stays open for the life of the process */

fail:
  memset(&fm_cuda_table, 0, sizeof fm_cuda_table);
  dlclose(h);
  return err;
}

static void fm_cuda_once_fn(void) { fm_cuda_err = fm_cuda_load_impl(); }

int fm_cuda_load(const fm_cuda **out, fm_diag *d) {
  if (out) *out = NULL;
  pthread_once(&fm_cuda_once, fm_cuda_once_fn);
  if (fm_cuda_err != FM_OK) return fm_diag_set(d, fm_cuda_err, "%s", fm_cuda_reason.text);
  if (out) *out = &fm_cuda_table;
  return FM_OK;
}

int fm_cuda_fail(const fm_cuda *cu, fm_CUresult r, const char *what, fm_diag *d) {
  return fm_diag_set(d, FM_ECUDA, "%s failed: %s (CUresult %d)", what ? what : "CUDA call", fm_cuda_errstr(cu, r), r);
}

/* NVRTC target for a compute capability. The "a" variants unlock the arch-specific
 * instructions (wgmma, TMA multicast, tcgen05) that the Hopper and Blackwell templates use;
 * a CUBIN built for them runs only on exactly that cc, which the cache key already pins. */
static void fm_cuda_arch(uint32_t major, uint32_t minor, char *out, size_t cap) {
  const char *suffix = (major == 9 && minor == 0) || major == 10 ? "a" : "";
  snprintf(out, cap, "sm_%u%u%s", major, minor, suffix);
}

int fm_cuda_device_id(int ordinal, fm_device_id *out, fm_diag *d) {
  const fm_cuda *cu;
  fm_CUdevice dev;
  fm_CUresult r;
  int major = 0, minor = 0, sms = 0, count = 0, err;

  if (!out || ordinal < 0) return fm_diag_set(d, FM_EINVAL, "fm_cuda_device_id: bad argument");
  memset(out, 0, sizeof *out);
  err = fm_cuda_load(&cu, d);
  if (err) return err;
  if ((r = cu->cuDeviceGetCount(&count)) != 0) return fm_cuda_fail(cu, r, "cuDeviceGetCount", d);
  if (ordinal >= count) return fm_diag_set(d, FM_ENOGPU, "no CUDA device %d (the driver sees %d)", ordinal, count);
  if ((r = cu->cuDeviceGet(&dev, ordinal)) != 0) return fm_cuda_fail(cu, r, "cuDeviceGet", d);
  if ((r = cu->cuDeviceGetName(out->name, (int)sizeof out->name, dev)) != 0)
    return fm_cuda_fail(cu, r, "cuDeviceGetName", d);
  out->name[sizeof out->name - 1] = '\0';
  if ((r = cu->cuDeviceGetAttribute(&major, FM_CU_ATTR_CC_MAJOR, dev)) != 0 ||
      (r = cu->cuDeviceGetAttribute(&minor, FM_CU_ATTR_CC_MINOR, dev)) != 0 ||
      (r = cu->cuDeviceGetAttribute(&sms, FM_CU_ATTR_MULTIPROCESSOR_COUNT, dev)) != 0)
    return fm_cuda_fail(cu, r, "cuDeviceGetAttribute", d);
  out->cc_major = (uint32_t)major;
  out->cc_minor = (uint32_t)minor;
  out->sm_count = (uint32_t)sms;
  fm_cuda_arch(out->cc_major, out->cc_minor, out->arch, sizeof out->arch);
  return FM_OK;
}
