/* fm_client.h: libfusemld, the C client: talk to fusemld, and (with a GPU) load and launch
 * the kernels it serves (fm_module.h, from gpu/, included here so this header stays the
 * whole API). Link with -lfusemld (pkg-config fusemld). */
#ifndef FM_CLIENT_H
#define FM_CLIENT_H

#include <stddef.h>
#include <stdint.h>
#include <msgpack.h>

#include "fm_error.h"
#include "fm_fingerprint.h"
#include "fm_meta.h"
#include "fm_module.h"

typedef struct fm_client fm_client;

/* Connects to socket_path (NULL: FUSEML_SOCKET or the per-user default) and performs the
 * hello handshake, both within timeout_ms. The hello reply is kept (fm_client_hello). */
int fm_client_connect(const char *socket_path, const char *client_name, int timeout_ms, fm_client **out, fm_diag *d);
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
int fm_client_call(fm_client *c, const char *op, uint32_t n_fields, fm_pack_fields_fn pack_fields, void *ctx,
                   msgpack_zone *zone, msgpack_object *reply, fm_diag *d);

/* compile / lookup (a served kernel: fm_compiled, fm_module.h) with a fragment already in msgpack wire form (one map). */
int fm_client_compile(fm_client *c, const uint8_t *fragment, size_t len, fm_compiled *out, fm_diag *d);
int fm_client_lookup(fm_client *c, const uint8_t *fragment, size_t len, fm_compiled *out, fm_diag *d);

#endif
