/* fm_client.c: libfusemld's conversation with fusemld: connect + hello, one request at a
 * time per connection, replies matched by id, error replies mapped back to fm_err codes.
 *
 * Why one request at a time: a C caller (fusectl, a test, a launcher) waits for each answer
 * anyway; pipelining would need a reply buffer keyed by id for no gain here. So a reply
 * with any id but ours is a protocol error, and after any transport or framing failure the
 * connection is marked broken: the stream position is lost (a late reply may still arrive),
 * and the only safe thing is to reconnect. */
#include "fm_client.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fm_client_io.h"
#include "fm_frame.h"
#include "fm_msg.h"
#include "fm_paths.h"
#include "fm_proto.h"
#include "fm_text.h"

struct fm_client {
  int fd;
  int timeout_ms;
  uint64_t next_id;
  size_t max_request; /* the daemon's max_frame from hello */
  int broken;         /* nonzero after a failure that desynchronised the stream */
  fm_diag broken_why;
  msgpack_zone *hello_zone;
  msgpack_object hello;
  char path[512];
};

/* ---- packing into a buffer with a sticky out-of-memory flag (as SQLite's StrAccum) ---- */

typedef struct fm_wbuf {
  msgpack_sbuffer sb;
  int oom;
} fm_wbuf;

static int fm_wbuf_write(void *data, const char *buf, size_t len) {
  fm_wbuf *w = data;
  if (w->oom) return -1;
  if (msgpack_sbuffer_write(&w->sb, buf, len) != 0) w->oom = 1;
  return w->oom ? -1 : 0;
}

static int fm_is_map_byte(uint8_t b) { return (b >= 0x80 && b <= 0x8f) || b == 0xde || b == 0xdf; }

/* ---- one request/reply exchange ---- */

static int fm_mark_broken(fm_client *c, int err, const fm_diag *d) {
  c->broken = 1;
  snprintf(c->broken_why.text, sizeof c->broken_why.text, "%s", d ? d->text : fm_strerror(err));
  return err;
}

/* Builds the frame {op, id, fields...} in w (header included). */
static int fm_build_request(fm_client *c, const char *op, uint64_t id, uint32_t n_fields, fm_pack_fields_fn pack_fields,
                            void *ctx, fm_wbuf *w, fm_diag *d) {
  msgpack_packer pk;
  static const uint8_t zero_header[FM_FRAME_HEADER_BYTES];
  const uint8_t *payload;
  size_t len;
  int err;

  msgpack_packer_init(&pk, w, fm_wbuf_write);
  fm_wbuf_write(w, (const char *)zero_header, sizeof zero_header); /* patched below */
  msgpack_pack_map(&pk, 2 + n_fields);
  fm_pack_cstr(&pk, "op");
  fm_pack_cstr(&pk, op);
  fm_pack_cstr(&pk, "id");
  msgpack_pack_uint64(&pk, id);
  if (pack_fields) pack_fields(&pk, ctx);
  if (w->oom) return fm_diag_set(d, FM_ENOMEM, "out of memory packing a %s request", op);

  payload = (const uint8_t *)w->sb.data + FM_FRAME_HEADER_BYTES;
  len = w->sb.size - FM_FRAME_HEADER_BYTES;
  if (len > c->max_request)
    return fm_diag_set(d, FM_ETOOBIG, "%s request is %zu bytes; fusemld accepts at most %zu", op, len, c->max_request);
  /* Catches a pack_fields that packed a different number of pairs than it declared: such a
   * frame would be refused by the daemon with a far less useful message. */
  err = fm_msg_check(payload, len, &fm_msg_request_limits, d);
  if (err) {
    fm_diag why = *d;
    if (err == FM_ELIMIT) /* well-formed, but the daemon would refuse it: say which limit */
      return fm_diag_set(d, FM_ELIMIT, "%s request exceeds a protocol limit: %s", op, why.text);
    return fm_diag_set(d, FM_EINVAL, "%s request is not one well-formed map of %u fields: %s", op, 2 + n_fields,
                       why.text);
  }
  fm_frame_header((uint8_t *)w->sb.data, (uint32_t)len);
  return FM_OK;
}

/* Reads one reply frame into zone-owned memory and unpacks it. The payload is copied into the
 * zone so every object in *reply (strings, bins) lives exactly as long as the zone. */
static int fm_read_reply(fm_client *c, int64_t deadline, msgpack_zone *zone, msgpack_object *reply, fm_diag *d) {
  uint8_t hdr[FM_FRAME_HEADER_BYTES];
  uint8_t *buf;
  uint32_t len;
  int err;

  err = fm_client_io_recv_exact(c->fd, hdr, sizeof hdr, deadline, "a reply", d);
  if (err) return fm_mark_broken(c, err, d);
  len = (uint32_t)hdr[0] << 24 | (uint32_t)hdr[1] << 16 | (uint32_t)hdr[2] << 8 | hdr[3];
  if (len > FM_FRAME_MAX_REPLY) {
    err = fm_diag_set(d, FM_ETOOBIG, "fusemld announced a %u-byte reply; the limit is %u", len, FM_FRAME_MAX_REPLY);
    return fm_mark_broken(c, err, d);
  }
  if (len == 0) return fm_diag_set(d, FM_EPROTOCOL, "fusemld sent an empty reply frame");
  buf = msgpack_zone_malloc(zone, len);
  if (!buf) {
    err = fm_diag_set(d, FM_ENOMEM, "out of memory for a %u-byte reply", len);
    return fm_mark_broken(c, err, d);
  }
  err = fm_client_io_recv_exact(c->fd, buf, len, deadline, "a reply", d);
  if (err) return fm_mark_broken(c, err, d);
  err = fm_msg_unpack(buf, len, &fm_msg_reply_limits, zone, reply, d);
  if (err) {
    fm_diag why = *d;
    return fm_diag_set(d, FM_EPROTOCOL, "fusemld sent an unreadable reply: %s", why.text);
  }
  return FM_OK;
}

/* Turns {ok:false, code, message, detail} into (code, "message: detail"). */
static int fm_error_reply(const msgpack_object *r, fm_diag *d) {
  const char *code = NULL, *msg = NULL, *detail = NULL;
  size_t code_len = 0, msg_len = 0, detail_len = 0;
  int err;

  if (fm_msg_get_str(r, "code", &code, &code_len, NULL) != FM_OK)
    return fm_diag_set(d, FM_EPROTOCOL, "fusemld sent an error reply without a code");
  err = fm_err_from_slug(code, code_len);
  if (err >= 0) err = FM_EPROTOCOL; /* an "error" must carry a failure code */
  if (fm_msg_get_str(r, "message", &msg, &msg_len, NULL) != FM_OK || msg_len == 0) {
    msg = fm_strerror(err);
    msg_len = strlen(msg);
  }
  if (fm_msg_get_str(r, "detail", &detail, &detail_len, NULL) != FM_OK) detail_len = 0;
  /* The daemon's words are printed by callers as they are: escaped here, once, so that no
   * control character from the other end of the socket reaches a terminal (fm_text.h). */
  fm_text_escape(d->text, sizeof d->text, msg, msg_len, 0);
  if (detail_len > 0) {
    size_t len = strlen(d->text);
    if (len + 2 < sizeof d->text) {
      memcpy(d->text + len, ": ", 2);
      fm_text_escape(d->text + len + 2, sizeof d->text - len - 2, detail, detail_len, 0);
    }
  }
  return err;
}

/* Our request could not be sent because fusemld closed the connection. A daemon that refuses
 * a connection (permission_denied, busy) answers and closes at once, maybe before the request
 * went out: that answer, still queued on the socket, says more than the failed write. Returns
 * its error code (d and *reply set from it), or send_err when nothing was queued. */
static int fm_answer_before_close(fm_client *c, int64_t deadline, msgpack_zone *zone, msgpack_object *reply,
                                  int send_err, fm_diag *d) {
  fm_diag unread;
  bool ok = true;
  if (fm_read_reply(c, deadline, zone, reply, &unread) != FM_OK || fm_msg_get_bool(reply, "ok", &ok, NULL) != FM_OK ||
      ok) {
    reply->type = MSGPACK_OBJECT_NIL;
    return send_err;
  }
  return fm_error_reply(reply, d);
}

static int fm_call_until(fm_client *c, const char *op, uint32_t n_fields, fm_pack_fields_fn pack_fields, void *ctx,
                         msgpack_zone *zone, msgpack_object *reply, int64_t deadline, fm_diag *d) {
  fm_wbuf w = {.oom = 0};
  fm_diag scratch;
  uint64_t id, rid = 0;
  bool ok = false;
  int err;

  if (!d) d = &scratch; /* the helpers below copy d's text, so it must exist */
  if (reply) reply->type = MSGPACK_OBJECT_NIL;
  if (!c || !op || !zone || !reply) return fm_diag_set(d, FM_EINVAL, "fm_client_call: bad argument");
  if (c->broken)
    return fm_diag_set(d, FM_ECLOSED,
                       "connection to fusemld unusable after an earlier failure "
                       "(%s); reconnect",
                       c->broken_why.text);
  msgpack_sbuffer_init(&w.sb);
  id = c->next_id++;
  err = fm_build_request(c, op, id, n_fields, pack_fields, ctx, &w, d);
  if (err) goto out;
  err = fm_client_io_send_all(c->fd, w.sb.data, w.sb.size, deadline, d);
  if (err) {
    fm_mark_broken(c, err, d);
    if (err == FM_ECLOSED) err = fm_answer_before_close(c, deadline, zone, reply, err, d);
    goto out;
  }
  err = fm_read_reply(c, deadline, zone, reply, d);
  if (err) goto out;

  if (fm_msg_get_u64(reply, "id", &rid, NULL) != FM_OK || fm_msg_get_bool(reply, "ok", &ok, NULL) != FM_OK) {
    err = fm_diag_set(d, FM_EPROTOCOL, "fusemld's reply to %s lacks id or ok", op);
    goto out;
  }
  /* id 0 is how the daemon answers a request it could not read far enough to learn the id;
   * with one request outstanding, such an error is ours. */
  if (rid != id && !(rid == 0 && !ok)) {
    err = fm_diag_set(d, FM_EPROTOCOL, "fusemld answered request %llu with id %llu", (unsigned long long)id,
                      (unsigned long long)rid);
    fm_mark_broken(c, err, d);
    goto out;
  }
  if (!ok) err = fm_error_reply(reply, d);

out:
  msgpack_sbuffer_destroy(&w.sb);
  return err;
}

int fm_client_call(fm_client *c, const char *op, uint32_t n_fields, fm_pack_fields_fn pack_fields, void *ctx,
                   msgpack_zone *zone, msgpack_object *reply, fm_diag *d) {
  return fm_call_until(c, op, n_fields, pack_fields, ctx, zone, reply, fm_client_io_deadline(c ? c->timeout_ms : 0), d);
}

/* ---- connect + hello ---- */

typedef struct fm_hello_ctx {
  const char *name;
  size_t name_len;
} fm_hello_ctx;

static void fm_pack_hello(msgpack_packer *pk, void *ctx) {
  const fm_hello_ctx *h = ctx;
  fm_pack_kv_u64(pk, "proto", FM_PROTO_VERSION);
  fm_pack_cstr(pk, "client");
  fm_pack_strn(pk, h->name, h->name_len);
  fm_pack_kv_u64(pk, "pid", (uint64_t)getpid());
}

int fm_client_connect(const char *socket_path, const char *client_name, int timeout_ms, fm_client **out, fm_diag *d) {
  char defpath[512];
  fm_client *c = NULL;
  fm_hello_ctx hello = {0};
  uint64_t proto = 0, max_frame = 0;
  int64_t deadline = fm_client_io_deadline(timeout_ms);
  fm_diag scratch;
  int err;

  if (!d) d = &scratch;
  if (!out) return fm_diag_set(d, FM_EINVAL, "fm_client_connect: out is NULL");
  *out = NULL;
  if (!socket_path) {
    err = fm_default_socket_path(defpath, sizeof defpath, 1, 0, d);
    if (err) return err;
    socket_path = defpath;
  }
  if (strlen(socket_path) >= sizeof c->path) return fm_diag_set(d, FM_ELIMIT, "socket path too long: %s", socket_path);
  /* Whatever answers there is trusted with our fragments and sends the GPU code we run. */
  if ((err = fm_check_socket_dir(socket_path, d))) return err;

  c = calloc(1, sizeof *c);
  if (!c) return fm_diag_set(d, FM_ENOMEM, "out of memory");
  c->fd = -1;
  c->timeout_ms = timeout_ms;
  c->next_id = 1;
  c->max_request = FM_FRAME_MAX_REQUEST;
  snprintf(c->path, sizeof c->path, "%s", socket_path);
  c->hello_zone = msgpack_zone_new(MSGPACK_ZONE_CHUNK_SIZE);
  if (!c->hello_zone) {
    err = fm_diag_set(d, FM_ENOMEM, "out of memory");
    goto fail;
  }

  err = fm_client_io_connect(socket_path, deadline, &c->fd, d);
  if (err) goto fail;

  /* The name is cut to the protocol's limit at a UTF-8 boundary, so the daemon never sees
   * a split character. */
  hello.name = client_name && *client_name ? client_name : "libfusemld";
  hello.name_len = strlen(hello.name);
  if (hello.name_len > FM_CLIENT_NAME_MAX) {
    hello.name_len = FM_CLIENT_NAME_MAX;
    while (hello.name_len > 0 && ((unsigned char)hello.name[hello.name_len] & 0xC0) == 0x80) hello.name_len--;
  }
  err = fm_call_until(c, "hello", 3, fm_pack_hello, &hello, c->hello_zone, &c->hello, deadline, d);
  if (err) {
    fm_diag why = *d;
    fm_diag_set(d, err, "hello to fusemld at %s failed: %s", socket_path, why.text);
    goto fail;
  }
  if (fm_msg_get_u64(&c->hello, "proto", &proto, NULL) != FM_OK || proto != FM_PROTO_VERSION) {
    err = fm_diag_set(d, FM_EPROTO_VERSION,
                      "fusemld at %s speaks protocol %llu; this client "
                      "speaks %d",
                      socket_path, (unsigned long long)proto, FM_PROTO_VERSION);
    goto fail;
  }
  if (fm_msg_get_u64(&c->hello, "max_frame", &max_frame, NULL) == FM_OK && max_frame > 0)
    c->max_request = (size_t)max_frame;
  *out = c;
  return FM_OK;

fail:
  fm_client_close(c);
  return err;
}

void fm_client_close(fm_client *c) {
  if (!c) return;
  if (c->fd >= 0) close(c->fd);
  if (c->hello_zone) msgpack_zone_free(c->hello_zone);
  free(c);
}

const msgpack_object *fm_client_hello(const fm_client *c) { return c ? &c->hello : NULL; }

void fm_client_set_timeout(fm_client *c, int timeout_ms) {
  if (c) c->timeout_ms = timeout_ms;
}

/* ---- compile / lookup ---- */

typedef struct fm_frag_ctx {
  const uint8_t *fragment;
  size_t len;
} fm_frag_ctx;

static void fm_pack_fragment(msgpack_packer *pk, void *ctx) {
  const fm_frag_ctx *f = ctx;
  fm_pack_cstr(pk, "fragment");
  /* Already msgpack: copied verbatim through the packer's writer. */
  pk->callback(pk->data, (const char *)f->fragment, f->len);
}

static int fm_parse_compiled(const msgpack_object *r, const char *op, fm_compiled *out, fm_diag *d) {
  const char *hex = NULL;
  const uint8_t *bin = NULL;
  size_t hex_len = 0, bin_len = 0;
  const msgpack_object *meta, *cubin;
  fm_diag why = {.text = "a field is missing or has the wrong type"};
  int err;

  if ((err = fm_msg_get_str(r, "key", &hex, &hex_len, &why)) != FM_OK) goto bad;
  if (fm_key_from_hex(hex, hex_len, &out->key) != FM_OK) {
    snprintf(why.text, sizeof why.text, "key is not 64 hex digits");
    goto bad;
  }
  if ((err = fm_msg_copy_str(r, "kind", out->kind, sizeof out->kind, &why)) != FM_OK) goto bad;
  if ((err = fm_msg_copy_str(r, "state", out->state, sizeof out->state, &why)) != FM_OK) goto bad;
  err = fm_msg_copy_str(r, "origin", out->origin, sizeof out->origin, &why);
  if (err == FM_ENOT_FOUND && strcmp(op, "lookup") == 0)
    snprintf(out->origin, sizeof out->origin, "hit"); /* lookup can only be a hit */
  else if (err)
    goto bad;
  meta = fm_msg_get(r, "meta");
  if (!meta) {
    snprintf(why.text, sizeof why.text, "no meta");
    goto bad;
  }
  if (fm_meta_unpack(meta, &out->meta, &why) != FM_OK) goto bad;
  /* A kind without device code (bypass) may come without a cubin. */
  cubin = fm_msg_get(r, "cubin");
  if (cubin && cubin->type != MSGPACK_OBJECT_NIL) {
    if ((err = fm_msg_get_bin(r, "cubin", &bin, &bin_len, &why)) != FM_OK) goto bad;
    if (bin_len > 0) {
      out->cubin = malloc(bin_len);
      if (!out->cubin) return fm_diag_set(d, FM_ENOMEM, "out of memory for a %zu-byte CUBIN", bin_len);
      memcpy(out->cubin, bin, bin_len);
      out->cubin_len = bin_len;
    }
  }
  return FM_OK;

bad:
  return fm_diag_set(d, FM_EPROTOCOL, "fusemld's %s reply: %s", op, why.text);
}

static int fm_fragment_request(fm_client *c, const char *op, const uint8_t *fragment, size_t len, fm_compiled *out,
                               fm_diag *d) {
  msgpack_zone zone;
  msgpack_object reply;
  fm_frag_ctx ctx = {fragment, len};
  fm_diag scratch;
  int err;

  if (!d) d = &scratch;
  if (out) memset(out, 0, sizeof *out);
  if (!c || !fragment || !out || len == 0) return fm_diag_set(d, FM_EINVAL, "fm_client_%s: bad argument", op);
  if (!fm_is_map_byte(fragment[0])) return fm_diag_set(d, FM_EINVAL, "fragment must be a msgpack map");
  err = fm_msg_check(fragment, len, &fm_msg_request_limits, d);
  if (err) {
    fm_diag why = *d;
    return fm_diag_set(d, err, "fragment: %s", why.text);
  }
  if (!msgpack_zone_init(&zone, MSGPACK_ZONE_CHUNK_SIZE)) return fm_diag_set(d, FM_ENOMEM, "out of memory");
  err = fm_client_call(c, op, 1, fm_pack_fragment, &ctx, &zone, &reply, d);
  if (err == FM_OK) err = fm_parse_compiled(&reply, op, out, d);
  if (err) fm_compiled_free(out);
  msgpack_zone_destroy(&zone);
  return err;
}

int fm_client_compile(fm_client *c, const uint8_t *fragment, size_t len, fm_compiled *out, fm_diag *d) {
  return fm_fragment_request(c, "compile", fragment, len, out, d);
}

int fm_client_lookup(fm_client *c, const uint8_t *fragment, size_t len, fm_compiled *out, fm_diag *d) {
  return fm_fragment_request(c, "lookup", fragment, len, out, d);
}
