/* fm_dispatch.h: one request frame -> one command handler, through a static command table
 * {name, handler, flags} (as Redis's command table). Dispatch decodes the envelope
 * ({op, id}), enforces the handshake (only ping may precede hello), answers hello and ping
 * itself, hands the rest to fm_commands.h, and turns a handler's error into the error reply.
 * Every request is counted (FM_STAT_REQUESTS), and every one refused for what the client
 * sent (malformed, schema, limits, unknown op or request, handshake) in FM_STAT_BAD_REQUESTS. */
#ifndef FM_DISPATCH_H
#define FM_DISPATCH_H

#include <stddef.h>
#include <stdint.h>

#include "fm_server.h"

/* fm_server_frame_fn; ctx is the fm_daemon. */
void fm_dispatch_frame(fm_conn *c, const uint8_t *payload, size_t len, void *ctx);
/* fm_server_refused_fn: counts frames the server refused itself. */
void fm_dispatch_refused(int err, void *ctx);
/* True for errors caused by what the client sent (counted as bad requests). */
int fm_dispatch_is_client_error(int err);

#endif
