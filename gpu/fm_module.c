/* fm_module.c: load a served CUBIN into the caller's CUDA context and launch it per its
 * metadata (fm_module.h, fm_meta.h). No template knowledge here: the metadata says
 * everything (entry symbol, block, grid rule, parameter order). */
#include "fm_module.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fm_blas.h"
#include "fm_cuda.h"

struct fm_module {
  const fm_cuda *cu;
  fm_CUcontext ctx;     /* the context the module was loaded into */
  fm_CUdevice device;   /* valid when retained_primary */
  int retained_primary; /* holds a reference to device 0's primary context */
  fm_CUmodule mod;
  fm_CUfunction fn;
  fm_CUfunction finish; /* a split column reduction's second kernel (meta.finish), or NULL */
  fm_kernel_meta meta;
  fm_blas *blas; /* kind "cublaslt": the plan (fm_blas.h) */
  /* The last tensor map encoded per metadata entry, reused while its input's address and
   * rows stay the same (a weight's always do): encoding costs host time on every launch
   * otherwise. Locked: a module may be launched from several threads. */
  pthread_mutex_t tmap_lock;
  struct {
    void *ptr;
    uint64_t rows;
    fm_CUtensorMap map;
  } tmap_cache[FM_META_MAX_TMAPS];
};

/* The primary context this library made current on some thread (NULL until then). Every
 * module loaded into it holds one driver reference (cuDevicePrimaryCtxRetain is counted),
 * so unloading modules in any order releases it only after the last one is gone. */
static pthread_mutex_t fm_primary_lock = PTHREAD_MUTEX_INITIALIZER;
static fm_CUcontext fm_primary_ctx;

/* Picks the context for a new module: the thread's current one, or device 0's primary
 * context (the one the runtime API, and so PyTorch, uses) when none is current. */
static int fm_attach_context(fm_module *m, fm_diag *d) {
  const fm_cuda *cu = m->cu;
  fm_CUresult r;
  int err = FM_OK;

  if ((r = cu->cuCtxGetCurrent(&m->ctx)) != 0) return fm_cuda_fail(cu, r, "cuCtxGetCurrent", d);
  pthread_mutex_lock(&fm_primary_lock);
  if (m->ctx && m->ctx != fm_primary_ctx) goto out; /* the caller's own context */
  if ((r = cu->cuDeviceGet(&m->device, 0)) != 0) {
    err = fm_cuda_fail(cu, r, "cuDeviceGet(0)", d);
    goto out;
  }
  if ((r = cu->cuDevicePrimaryCtxRetain(&m->ctx, m->device)) != 0) {
    err = fm_cuda_fail(cu, r, "cuDevicePrimaryCtxRetain", d);
    goto out;
  }
  m->retained_primary = 1;
  fm_primary_ctx = m->ctx;
  if ((r = cu->cuCtxSetCurrent(m->ctx)) != 0) err = fm_cuda_fail(cu, r, "cuCtxSetCurrent", d);
out:
  pthread_mutex_unlock(&fm_primary_lock);
  return err;
}

void fm_compiled_free(fm_compiled *k) {
  if (!k) return;
  free(k->cubin);
  memset(k, 0, sizeof *k);
}

int fm_module_load(const fm_compiled *k, fm_module **out, fm_diag *d) {
  const fm_cuda *cu;
  fm_module *m = NULL;
  fm_CUresult r;
  int err;

  if (out) *out = NULL;
  if (!k || !out) return fm_diag_set(d, FM_EINVAL, "fm_module_load: bad argument");
  int kernel = strcmp(k->meta.grid_rule, "none") != 0; /* a direct cuBLASLt plan has none */
  if (kernel && (!k->cubin || k->cubin_len == 0))
    return fm_diag_set(d, FM_EINVAL, "kernel of kind %s has no CUBIN to load", k->kind);
  /* A rule fm_meta_grid_x does not know would launch with a wrong grid: refuse it before
   * touching the GPU. */
  if (!fm_meta_rule_known(k->meta.grid_rule))
    return fm_diag_set(d, FM_EUNSUPPORTED, "grid rule \"%s\" is not supported by this client", k->meta.grid_rule);
  if ((uint64_t)k->meta.n_inputs + k->meta.n_outputs + 3 + k->meta.n_tmaps > FM_META_MAX_PARAMS)
    return fm_diag_set(d, FM_ELIMIT, "kernel takes %u inputs and %u outputs; at most %d params", k->meta.n_inputs,
                       k->meta.n_outputs, FM_META_MAX_PARAMS);
  err = fm_cuda_load(&cu, d);
  if (err) return err;

  m = calloc(1, sizeof *m);
  if (!m) return fm_diag_set(d, FM_ENOMEM, "out of memory");
  pthread_mutex_init(&m->tmap_lock, NULL);
  m->cu = cu;
  m->meta = k->meta;

  err = fm_attach_context(m, d);
  if (err) goto fail;
  if (k->meta.blas.form[0] && (err = fm_blas_open(&k->meta, &m->blas, d))) goto fail;
  if (!kernel) {
    *out = m;
    return FM_OK;
  }
  if ((r = cu->cuModuleLoadData(&m->mod, k->cubin)) != 0) {
    err = fm_cuda_fail(cu, r, "cuModuleLoadData", d);
    goto fail;
  }
  if ((r = cu->cuModuleGetFunction(&m->fn, m->mod, k->meta.entry)) != 0 ||
      (k->meta.finish.entry[0] && (r = cu->cuModuleGetFunction(&m->finish, m->mod, k->meta.finish.entry)) != 0)) {
    fm_diag why;
    fm_cuda_fail(cu, r, "cuModuleGetFunction", &why);
    err = fm_diag_set(d, FM_ECUDA, "%s (entry \"%s\"%s%s)", why.text, k->meta.entry,
                      k->meta.finish.entry[0] ? ", finish " : "", k->meta.finish.entry);
    goto fail;
  }
  /* Above 48 KiB of dynamic shared memory a launch fails unless the function opts in. */
  if (k->meta.smem > 48u * 1024u &&
      (r = cu->cuFuncSetAttribute(m->fn, FM_CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, (int)k->meta.smem)) != 0) {
    err = fm_cuda_fail(cu, r, "cuFuncSetAttribute(max dynamic shared memory)", d);
    goto fail;
  }
  *out = m;
  return FM_OK;

fail:
  fm_module_unload(m);
  return err;
}

void fm_module_unload(fm_module *m) {
  const fm_cuda *cu;
  fm_CUcontext cur = NULL;

  if (!m) return;
  cu = m->cu;
  cu->cuCtxGetCurrent(&cur);
  if (m->mod) {
    /* cuModuleUnload acts on the current context: make the module's own current for it. */
    if (cur != m->ctx) cu->cuCtxSetCurrent(m->ctx);
    cu->cuModuleUnload(m->mod);
    if (cur != m->ctx) cu->cuCtxSetCurrent(cur);
  }
  /* A primary context stays valid as a handle after its last release (the driver only
   * deactivates it), so leaving it current on this thread is harmless. */
  fm_blas_close(m->blas);
  if (m->retained_primary) cu->cuDevicePrimaryCtxRelease(m->device);
  pthread_mutex_destroy(&m->tmap_lock);
  free(m);
}

/* The tensor map of metadata entry i over the input at ptr, for a launch of dim 0 = outer:
 * the cached one when ptr and the rows match the last launch, else encoded (host work only,
 * no driver round trip) and cached. */
static int tensor_map(fm_module *m, uint32_t i, void *ptr, int64_t outer, fm_CUtensorMap *map, fm_diag *d) {
  const fm_meta_tmap *t = &m->meta.tmaps[i];
  uint64_t dims[2] = {t->cols, t->rows < 0 ? (uint64_t)outer : (uint64_t)t->rows};
  uint64_t stride = t->ld * t->elem_bytes; /* bytes between rows; dim 0 is contiguous */
  uint32_t elem_strides[2] = {1, 1};
  fm_CUresult r;
  if (((uintptr_t)ptr & 15u) != 0)
    return fm_diag_set(d, FM_EINVAL, "kernel %s: input %u at %p is not 16-byte aligned (TMA)", m->meta.entry, t->input,
                       ptr);
  pthread_mutex_lock(&m->tmap_lock);
  if (m->tmap_cache[i].ptr == ptr && m->tmap_cache[i].rows == dims[1]) {
    *map = m->tmap_cache[i].map;
    pthread_mutex_unlock(&m->tmap_lock);
    return FM_OK;
  }
  pthread_mutex_unlock(&m->tmap_lock);
  r = m->cu->cuTensorMapEncodeTiled(
      map, strcmp(t->dtype, "bf16") == 0 ? FM_CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : FM_CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2,
      ptr, dims, &stride, t->box, elem_strides, FM_CU_TENSOR_MAP_INTERLEAVE_NONE, FM_CU_TENSOR_MAP_SWIZZLE_128B,
      FM_CU_TENSOR_MAP_L2_PROMOTION_L2_256B, FM_CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != 0) return fm_cuda_fail(m->cu, r, "cuTensorMapEncodeTiled", d);
  pthread_mutex_lock(&m->tmap_lock);
  m->tmap_cache[i].ptr = ptr;
  m->tmap_cache[i].rows = dims[1];
  m->tmap_cache[i].map = *map;
  pthread_mutex_unlock(&m->tmap_lock);
  return FM_OK;
}

int fm_module_launch(fm_module *m, void *const *inputs, void *const *outputs, int64_t outer, void *stream, fm_diag *d) {
  fm_CUdeviceptr ptrs[FM_META_MAX_PARAMS];
  void *params[FM_META_MAX_PARAMS];
  fm_CUtensorMap maps[FM_META_MAX_TMAPS];
  long long outer_arg;
  void *scratch_result = NULL, *scratch_result2 = NULL, *partials = NULL;
  uint64_t grid, grid_y, grid_z;
  uint32_t n = 0;
  fm_CUresult r;

  if (!m || (m->meta.n_inputs && !inputs) || (m->meta.n_outputs && !outputs))
    return fm_diag_set(d, FM_EINVAL, "fm_module_launch: bad argument");
  /* A static fragment carries its own dim-0 size; only a symbolic one takes the caller's. */
  if (m->meta.outer >= 0) {
    outer = m->meta.outer;
  } else if (outer < 0) {
    return fm_diag_set(d, FM_EINVAL, "kernel %s has a symbolic dim 0: outer must be >= 0, got %lld", m->meta.entry,
                       (long long)outer);
  }
  if (m->blas) {
    /* the product first (on the same stream, so the epilogue kernel below sees it) */
    void *scratch = outputs[m->meta.n_outputs];
    int err;
    if (!scratch || ((uintptr_t)scratch & 255u))
      return fm_diag_set(d, FM_EINVAL,
                         "cuBLASLt plan: the scratch buffer (outputs[%u]) must be a 256-byte aligned pointer",
                         m->meta.n_outputs);
    scratch_result = (char *)scratch + fm_meta_scratch_result_offset(&m->meta);
    err = fm_blas_run(m->blas, inputs, m->mod ? scratch_result : outputs[m->meta.blas.out], scratch, outer, stream, d);
    if (err || !m->mod) return err;
  }
  if (m->finish) {
    partials = outputs[m->meta.n_outputs];
    if (!partials || ((uintptr_t)partials & 255u))
      return fm_diag_set(d, FM_EINVAL,
                         "split column reduction: the scratch buffer (outputs[%u]) must be a 256-byte aligned pointer",
                         m->meta.n_outputs);
  }
  grid = fm_meta_grid_x(&m->meta, outer);
  grid_y = fm_meta_grid_y(&m->meta, outer);
  grid_z = fm_meta_grid_z(&m->meta, outer);
  if (grid == 0 || grid_y == 0 || grid_z == 0) return FM_OK; /* an empty tensor: nothing to launch */
  if (grid > 0x7fffffffu || grid_y > 65535u || grid_z > 65535u)
    return fm_diag_set(d, FM_ELIMIT, "grid of %llu x %llu x %llu blocks exceeds the CUDA limit",
                       (unsigned long long)grid, (unsigned long long)grid_y, (unsigned long long)grid_z);

  /* Kernel parameters in metadata order: inputs, outputs, long long outer, then the tensor
   * maps (each 128 bytes by value, __grid_constant__ in the kernel). The driver
   * reads each through the pointer in params, so the values need stable storage here. */
  for (uint32_t i = 0; i < m->meta.n_inputs; i++, n++) {
    ptrs[n] = (fm_CUdeviceptr)(uintptr_t)inputs[i];
    params[n] = &ptrs[n];
  }
  for (uint32_t i = 0; i < m->meta.n_outputs; i++, n++) {
    ptrs[n] = (fm_CUdeviceptr)(uintptr_t)outputs[i];
    params[n] = &ptrs[n];
  }
  outer_arg = (long long)outer;
  params[n++] = &outer_arg;
  for (uint32_t i = 0; i < m->meta.n_tmaps; i++, n++) {
    int err = tensor_map(m, i, inputs[m->meta.tmaps[i].input], outer, &maps[i], d);
    if (err) return err;
    params[n] = &maps[i];
  }
  if (m->blas) params[n++] = &scratch_result; /* the split form's epilogue reads the product */
  if (m->blas && m->meta.blas.has_b2) {       /* and, siblings, the second one after it */
    scratch_result2 = (char *)scratch_result + fm_meta_scratch_second_offset(&m->meta, outer);
    params[n++] = &scratch_result2;
  }
  if (m->finish) params[n++] = &partials; /* both kernels: the groups' partial sums */

  r = m->cu->cuLaunchKernel(m->fn, (unsigned)grid, (unsigned)grid_y, (unsigned)grid_z, m->meta.block[0],
                            m->meta.block[1], m->meta.block[2], m->meta.smem, (fm_CUstream)stream, params, NULL);
  if (r != 0) return fm_cuda_fail(m->cu, r, "cuLaunchKernel", d);
  if (m->finish) { /* the groups' partials, added per column, and the outputs: same stream, after it */
    r = m->cu->cuLaunchKernel(m->finish, m->meta.finish.grid, 1, 1, m->meta.finish.block, 1, 1, 0, (fm_CUstream)stream,
                              params, NULL);
    if (r != 0) return fm_cuda_fail(m->cu, r, "cuLaunchKernel(finish)", d);
  }
  return FM_OK;
}

uint64_t fm_module_scratch_bytes(const fm_module *m, int64_t outer) {
  if (!m) return 0;
  return fm_meta_scratch_bytes(&m->meta, m->meta.outer >= 0 ? m->meta.outer : outer);
}

int fm_module_blas_search(fm_module *m, int64_t outer, int max, fm_diag *d) {
  if (!m || !m->blas) return fm_diag_set(d, FM_EINVAL, "not a cuBLASLt plan");
  return fm_blas_search(m->blas, outer, max, d);
}

int fm_module_blas_choose(fm_module *m, int i, fm_diag *d) {
  if (!m || !m->blas) return fm_diag_set(d, FM_EINVAL, "not a cuBLASLt plan");
  return fm_blas_choose(m->blas, i, d);
}

int fm_module_blas_algo(fm_module *m, uint8_t out[FM_META_ALGO_BYTES]) {
  if (!m || !m->blas) return FM_EINVAL;
  return fm_blas_algo(m->blas, out);
}
