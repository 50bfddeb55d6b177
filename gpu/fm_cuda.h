/* fm_cuda.h: the CUDA driver API, loaded at run time with dlopen("libcuda.so.1") so every
 * binary builds and runs on a machine without a GPU. Inside a process that already loaded
 * the driver (PyTorch), the same copy is used (RTLD_NOLOAD first). Only the entry points
 * fusemld uses, with the driver's own ABI types redeclared here (no cuda.h needed). */
#ifndef FM_CUDA_H
#define FM_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "fm_error.h"
#include "fm_fingerprint.h"

typedef int fm_CUresult; /* CUDA_SUCCESS == 0 */
typedef int fm_CUdevice;
typedef struct fm_CUctx_st *fm_CUcontext;
typedef struct fm_CUmod_st *fm_CUmodule;
typedef struct fm_CUfunc_st *fm_CUfunction;
typedef struct fm_CUstream_st *fm_CUstream;
typedef struct fm_CUevent_st *fm_CUevent;
typedef unsigned long long fm_CUdeviceptr;
#define FM_CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES 8
/* CUtensorMap: 128 opaque bytes, 64-byte aligned (cuda.h's CU_TENSOR_MAP_NUM_QWORDS 16) */
typedef struct fm_CUtensorMap {
  _Alignas(64) uint64_t opaque[16];
} fm_CUtensorMap;
/* the cuTensorMapEncodeTiled enum values fusemld passes (cuda.h) */
#define FM_CU_TENSOR_MAP_DATA_TYPE_FLOAT16    6
#define FM_CU_TENSOR_MAP_DATA_TYPE_BFLOAT16   9
#define FM_CU_TENSOR_MAP_INTERLEAVE_NONE      0
#define FM_CU_TENSOR_MAP_SWIZZLE_128B         3
#define FM_CU_TENSOR_MAP_L2_PROMOTION_L2_256B 3
#define FM_CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE  0 /* out-of-bounds elements read as zero */

typedef struct fm_cuda {
  fm_CUresult (*cuInit)(unsigned);
  fm_CUresult (*cuDriverGetVersion)(int *);
  fm_CUresult (*cuDeviceGetCount)(int *);
  fm_CUresult (*cuDeviceGet)(fm_CUdevice *, int);
  fm_CUresult (*cuDeviceGetName)(char *, int, fm_CUdevice);
  fm_CUresult (*cuDeviceGetAttribute)(int *, int, fm_CUdevice);
  fm_CUresult (*cuDevicePrimaryCtxRetain)(fm_CUcontext *, fm_CUdevice);
  fm_CUresult (*cuDevicePrimaryCtxRelease)(fm_CUdevice);
  fm_CUresult (*cuCtxGetCurrent)(fm_CUcontext *);
  fm_CUresult (*cuCtxSetCurrent)(fm_CUcontext);
  fm_CUresult (*cuCtxSynchronize)(void);
  fm_CUresult (*cuModuleLoadData)(fm_CUmodule *, const void *);
  fm_CUresult (*cuModuleUnload)(fm_CUmodule);
  fm_CUresult (*cuModuleGetFunction)(fm_CUfunction *, fm_CUmodule, const char *);
  fm_CUresult (*cuLaunchKernel)(fm_CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                fm_CUstream, void **, void **);
  fm_CUresult (*cuMemAlloc)(fm_CUdeviceptr *, size_t);
  fm_CUresult (*cuMemFree)(fm_CUdeviceptr);
  fm_CUresult (*cuMemcpyHtoD)(fm_CUdeviceptr, const void *, size_t);
  fm_CUresult (*cuMemcpyDtoH)(void *, fm_CUdeviceptr, size_t);
  fm_CUresult (*cuMemcpyDtoD)(fm_CUdeviceptr, fm_CUdeviceptr, size_t);
  fm_CUresult (*cuMemsetD8)(fm_CUdeviceptr, unsigned char, size_t);
  fm_CUresult (*cuEventCreate)(fm_CUevent *, unsigned);
  fm_CUresult (*cuEventRecord)(fm_CUevent, fm_CUstream);
  fm_CUresult (*cuEventSynchronize)(fm_CUevent);
  fm_CUresult (*cuEventElapsedTime)(float *, fm_CUevent, fm_CUevent);
  fm_CUresult (*cuEventDestroy)(fm_CUevent);
  fm_CUresult (*cuGetErrorString)(fm_CUresult, const char **);
  /* GEMM kernels: dynamic shared memory above 48 KiB must be allowed per function */
  fm_CUresult (*cuFuncSetAttribute)(fm_CUfunction, int, int);
  /* the TMA mainloop's operands (driver 12.0+) */
  fm_CUresult (*cuTensorMapEncodeTiled)(fm_CUtensorMap *, int, uint32_t, void *, const uint64_t *, const uint64_t *,
                                        const uint32_t *, const uint32_t *, int, int, int, int);
} fm_cuda;

/* Loads the driver once per process (thread-safe) and calls cuInit(0). FM_ENOGPU with the
 * reason in d when there is no driver or no device. */
int fm_cuda_load(const fm_cuda **out, fm_diag *d);

/* Identity of device `ordinal` for the cache key: name, cc, SM count, and arch
 * ("sm_80", "sm_86", "sm_89", "sm_90a", "sm_100a", "sm_120", ...). */
int fm_cuda_device_id(int ordinal, fm_device_id *out, fm_diag *d);

/* Formats a failed driver call into d; returns FM_ECUDA. */
int fm_cuda_fail(const fm_cuda *cu, fm_CUresult r, const char *what, fm_diag *d);

#endif
