/* fm_module.h: the GPU runtime's public part: load a served kernel (a CUBIN and its launch
 * metadata, fm_meta.h) into a CUDA context and launch it, or run its cuBLASLt plan. The CUDA
 * driver is dlopen'ed (fm_cuda.h); without one every call returns FM_ENOGPU. Shared by
 * libfusemld (fm_client.h includes this header; installed with it) and the daemon's tuner
 * worker. */
#ifndef FM_MODULE_H
#define FM_MODULE_H

#include <stddef.h>
#include <stdint.h>

#include "fm_error.h"
#include "fm_fingerprint.h"
#include "fm_meta.h"

/* A served kernel: what a compile or lookup reply carries (fm_client.h) and what
 * fm_module_load loads. */
typedef struct fm_compiled {
  fm_key key;
  char kind[16];
  char state[16];  /* "untuned" | "tuned" */
  char origin[16]; /* "hit" | "compiled" | "joined" | "remote" */
  fm_kernel_meta meta;
  uint8_t *cubin;
  size_t cubin_len;
} fm_compiled;
void fm_compiled_free(fm_compiled *k);

typedef struct fm_module fm_module;

/* Loads k's CUBIN into the current context of this thread (or device 0's primary context
 * when none is current). */
int fm_module_load(const fm_compiled *k, fm_module **out, fm_diag *d);
/* The same from a compile/lookup reply's raw fields: the CUBIN and the msgpack-packed `meta`
 * map (borrowed for the call only). FM_EMALFORMED / FM_ESCHEMA for bad metadata. */
int fm_module_load_bytes(const uint8_t *cubin, size_t cubin_len, const uint8_t *meta, size_t meta_len, fm_module **out,
                         fm_diag *d);
void fm_module_unload(fm_module *m);
/* Launches on stream (a CUstream; NULL = the legacy default stream) per the metadata:
 * inputs[n_inputs] and outputs[n_outputs] are device pointers; outer is dim 0's size
 * (ignored unless the fragment's dim 0 is symbolic). A cuBLASLt plan (kind "cublaslt") also
 * takes outputs[n_outputs]: a scratch buffer of fm_module_scratch_bytes(outer), 256-byte
 * aligned, the caller's until the launch's work on stream is done. Asynchronous. */
int fm_module_launch(fm_module *m, void *const *inputs, void *const *outputs, int64_t outer, void *stream, fm_diag *d);
/* Bytes of scratch a launch at outer needs (0: none). */
uint64_t fm_module_scratch_bytes(const fm_module *m, int64_t outer);

/* The tuner's cuBLASLt search on a plan without an algorithm: asks the heuristic for its first
 * max choices at dim 0 = outer (returns how many, >= 1, or a negative error); choose(i) makes
 * choice i the plan's algorithm; algo copies it (64 bytes; FM_ENOT_FOUND before a choice). */
int fm_module_blas_search(fm_module *m, int64_t outer, int max, fm_diag *d);
int fm_module_blas_choose(fm_module *m, int i, fm_diag *d);
int fm_module_blas_algo(fm_module *m, uint8_t out[FM_META_ALGO_BYTES]);

#endif
