/* fm_client.h: libfusemld, the C client: talk to fusemld, and (with a GPU) load and launch
 * the kernels it serves. Link with -lfusemld (pkg-config fusemld). */
#ifndef FM_CLIENT_H
#define FM_CLIENT_H

#include <stddef.h>
#include <stdint.h>
#include <msgpack.h>

#include "fm_error.h"
#include "fm_fingerprint.h"
#include "fm_meta.h"

typedef struct fm_client fm_client;

/* Connects to socket_path (NULL: FUSEML_SOCKET or the per-user default) and performs the
 * hello handshake, both within timeout_ms. The hello reply is kept (fm_client_hello). */
int fm_client_connect(const char *socket_path, const char *client_name, int timeout_ms,
                      fm_client **out, fm_diag *d);
void fm_client_close(fm_client *c);
/* The daemon's hello reply (valid until close). */
const msgpack_object *fm_client_hello(const fm_client *c);
/* Per-request timeout for later calls (default: the connect timeout; <=0: wait forever). */
void fm_client_set_timeout(fm_client *c, int timeout_ms);

/* Generic call: sends {op, id, <fields packed by pack_fields>} and waits for the reply with
 * that id. The reply is unpacked into zone (caller inits/destroys). An {ok:false} reply is
 * returned as its negative error code (slug mapped back) with message+detail in d, and *reply
 * is still set. pack_fields packs n_fields key/value pairs (it gets the packer and ctx). */
typedef void (*fm_pack_fields_fn)(msgpack_packer *pk, void *ctx);
int fm_client_call(fm_client *c, const char *op, uint32_t n_fields, fm_pack_fields_fn pack_fields,
                   void *ctx, msgpack_zone *zone, msgpack_object *reply, fm_diag *d);

/* A served kernel. */
typedef struct fm_compiled {
  fm_key key;
  char kind[16];
  char state[16];       /* "untuned" | "tuned" */
  char origin[16];      /* "hit" | "compiled" | "joined" | "remote" */
  fm_kernel_meta meta;
  uint8_t *cubin;
  size_t cubin_len;
} fm_compiled;
void fm_compiled_free(fm_compiled *k);

/* compile / lookup with a fragment already in msgpack wire form (one map). */
int fm_client_compile(fm_client *c, const uint8_t *fragment, size_t len, fm_compiled *out, fm_diag *d);
int fm_client_lookup(fm_client *c, const uint8_t *fragment, size_t len, fm_compiled *out, fm_diag *d);

/* ---- GPU side (the CUDA driver is dlopen'ed; without one these return FM_ENOGPU) ---- */

typedef struct fm_module fm_module;

/* Loads k's CUBIN into the current context of this thread (or device 0's primary context
 * when none is current). */
int fm_module_load(const fm_compiled *k, fm_module **out, fm_diag *d);
/* The same from a compile/lookup reply's raw fields: the CUBIN and the msgpack-packed `meta`
 * map (borrowed for the call only). FM_EMALFORMED / FM_ESCHEMA for bad metadata. */
int fm_module_load_bytes(const uint8_t *cubin, size_t cubin_len, const uint8_t *meta,
                         size_t meta_len, fm_module **out, fm_diag *d);
void fm_module_unload(fm_module *m);
/* Launches on stream (a CUstream; NULL = the legacy default stream) per the metadata:
 * inputs[n_inputs] and outputs[n_outputs] are device pointers; outer is dim 0's size
 * (ignored unless the fragment's dim 0 is symbolic). A cuBLASLt plan (kind "cublaslt") also
 * takes outputs[n_outputs]: a scratch buffer of fm_module_scratch_bytes(outer), 256-byte
 * aligned, the caller's until the launch's work on stream is done. Asynchronous. */
int fm_module_launch(fm_module *m, void *const *inputs, void *const *outputs, int64_t outer,
                     void *stream, fm_diag *d);
/* Bytes of scratch a launch at outer needs (0: none). */
uint64_t fm_module_scratch_bytes(const fm_module *m, int64_t outer);

/* The tuner's cuBLASLt search on a plan without an algorithm: asks the heuristic for its first
 * max choices at dim 0 = outer (returns how many, >= 1, or a negative error); choose(i) makes
 * choice i the plan's algorithm; algo copies it (64 bytes; FM_ENOT_FOUND before a choice). */
int fm_module_blas_search(fm_module *m, int64_t outer, int max, fm_diag *d);
int fm_module_blas_choose(fm_module *m, int i, fm_diag *d);
int fm_module_blas_algo(fm_module *m, uint8_t out[FM_META_ALGO_BYTES]);

#endif
