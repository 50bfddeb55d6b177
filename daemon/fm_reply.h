/* fm_reply.h: building and sending replies ({ok:true, id, ...} maps) on the loop thread.
 *
 * A reply is packed into a buffer whose allocation failures are sticky (as SQLite's StrAccum):
 * packing goes on as a no-op after the first failure and fm_reply_send reports it once, so
 * handlers need no check per field. Stored msgpack (a canonical fragment, launch metadata,
 * timings) is spliced in raw after checking it is one well-formed object. */
#ifndef FM_REPLY_H
#define FM_REPLY_H

#include <stddef.h>
#include <stdint.h>
#include <msgpack.h>

#include "fm_error.h"
#include "fm_fingerprint.h"
#include "fm_server.h"

typedef struct fm_reply {
  msgpack_sbuffer sb;
  msgpack_packer pk;
  int err; /* first allocation failure */
} fm_reply;

/* Starts {ok: true, id: id, <n_fields more pairs>}; the caller packs exactly n_fields pairs. */
void fm_reply_begin(fm_reply *r, uint64_t id, uint32_t n_fields);
/* Starts an empty buffer (for packing parts of a reply separately, e.g. list entries). */
void fm_reply_init(fm_reply *r);
/* Appends pre-packed msgpack bytes if they are one well-formed object, else nil. */
void fm_reply_raw(fm_reply *r, const uint8_t *bytes, size_t len);
/* Appends bytes as they are (already known to be well-formed msgpack). */
void fm_reply_append(fm_reply *r, const void *bytes, size_t len);
/* Sends the reply (or, if packing failed, an out_of_memory error for id) and frees it. */
int fm_reply_send(fm_reply *r, fm_conn *c, uint64_t id);
void fm_reply_discard(fm_reply *r);

/* Sends {ok:false, id, code, message, detail}. */
int fm_reply_error(fm_conn *c, uint64_t id, int err, const char *detail);

/* Packs {name, cc: [major, minor], sm_count, arch}. */
void fm_reply_pack_device(msgpack_packer *pk, const fm_device_id *dev);
/* Packs the key as lowercase hex. */
void fm_reply_pack_key(msgpack_packer *pk, const fm_key *key);

#endif
