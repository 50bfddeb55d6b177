/* fm_dispatch.c: the command table, the envelope, the handshake, hello and ping. */
#include "fm_dispatch.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "fm_codegen.h"
#include "fm_commands.h"
#include "fm_daemon.h"
#include "fm_frame.h"
#include "fm_fragment.h"
#include "fm_log.h"
#include "fm_msg.h"
#include "fm_proto.h"
#include "fm_reply.h"

#define FM_CMD_NEEDS_HELLO 1u
/* Changes what every client is served (import), drops what they share (evict, stats_zero)
 * or stops the daemon they share (shutdown): only the daemon's own uid and root. In system
 * mode every member of the socket's group can connect, and none of them may change what the
 * others run. */
#define FM_CMD_ADMIN       2u

static int cmd_hello(fm_request *rq, fm_diag *d);
static int cmd_ping(fm_request *rq, fm_diag *d);

static const struct fm_command {
  const char *name;
  fm_command_fn handler;
  unsigned flags;
} commands[] = {
    {"hello", cmd_hello, 0},
    {"ping", cmd_ping, 0},
    {"compile", fm_cmd_compile, FM_CMD_NEEDS_HELLO},
    {"lookup", fm_cmd_lookup, FM_CMD_NEEDS_HELLO},
    {"stats", fm_cmd_stats, FM_CMD_NEEDS_HELLO},
    {"stats_zero", fm_cmd_stats_zero, FM_CMD_NEEDS_HELLO | FM_CMD_ADMIN},
    {"list", fm_cmd_list, FM_CMD_NEEDS_HELLO},
    {"show", fm_cmd_show, FM_CMD_NEEDS_HELLO},
    {"evict", fm_cmd_evict, FM_CMD_NEEDS_HELLO | FM_CMD_ADMIN},
    {"export", fm_cmd_export, FM_CMD_NEEDS_HELLO},
    {"import", fm_cmd_import, FM_CMD_NEEDS_HELLO | FM_CMD_ADMIN},
    {"shutdown", fm_cmd_shutdown, FM_CMD_NEEDS_HELLO | FM_CMD_ADMIN},
};

static const struct fm_command *find_command(const char *name, size_t len) {
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    if (strlen(commands[i].name) == len && memcmp(commands[i].name, name, len) == 0) return &commands[i];
  return NULL;
}

int fm_dispatch_is_client_error(int err) {
  switch (err) {
    case FM_EINVAL:
    case FM_ETOOBIG:
    case FM_EMALFORMED:
    case FM_ESCHEMA:
    case FM_ELIMIT:
    case FM_EUNKNOWN_OP:
    case FM_EUNKNOWN_REQ:
    case FM_EHANDSHAKE:
    case FM_EPROTO_VERSION:
    case FM_EUNSUPPORTED:
      return 1;
    default:
      return 0;
  }
}

void fm_dispatch_refused(int err, void *ctx) {
  fm_daemon *dd = ctx;
  if (fm_dispatch_is_client_error(err)) fm_daemon_count(dd, FM_STAT_BAD_REQUESTS, 1);
}

/* A peer whose uid cannot be read is refused: failing open would defeat the rule. */
static int check_admin(const fm_conn *c, const char *op, fm_diag *d) {
  uint32_t uid;
  if (fm_conn_peer_uid(c, &uid) != FM_OK)
    return fm_diag_set(d, FM_EDENIED, "\"%s\" needs the peer's uid, which could not be read", op);
  if (uid == 0 || uid == (uint32_t)geteuid()) return FM_OK;
  fm_log_warn("%s: \"%s\" refused: uid %u is neither root nor the daemon's uid %u", fm_conn_name(c), op, (unsigned)uid,
              (unsigned)geteuid());
  return fm_diag_set(d, FM_EDENIED, "\"%s\" is allowed only to root and to the daemon's own uid %u, not uid %u", op,
                     (unsigned)geteuid(), (unsigned)uid);
}

void fm_dispatch_frame(fm_conn *c, const uint8_t *payload, size_t len, void *ctx) {
  fm_daemon *dd = ctx;
  msgpack_zone zone;
  msgpack_object msg;
  fm_diag d;
  d.text[0] = '\0';
  uint64_t id = 0;
  const char *op = "?";
  size_t op_len = 1;
  const struct fm_command *cmd = NULL;
  int err;

  fm_daemon_count(dd, FM_STAT_REQUESTS, 1);
  if (!msgpack_zone_init(&zone, 4096)) {
    fm_reply_error(c, 0, FM_ENOMEM, "out of memory");
    return;
  }
  err = fm_msg_unpack(payload, len, &fm_msg_request_limits, &zone, &msg, &d);
  if (err) goto reply_error;
  /* The id first, so that even a bad request is answered under its own id. */
  err = fm_msg_get_u64(&msg, "id", &id, &d);
  if (err == FM_ENOT_FOUND) err = fm_diag_set(&d, FM_ESCHEMA, "request has no \"id\"");
  if (err) goto reply_error;
  err = fm_msg_get_str(&msg, "op", &op, &op_len, &d);
  if (err == FM_ENOT_FOUND) err = fm_diag_set(&d, FM_ESCHEMA, "request has no \"op\"");
  if (err) goto reply_error;
  cmd = find_command(op, op_len);
  if (!cmd) {
    err = fm_diag_set(&d, FM_EUNKNOWN_REQ, "unknown request \"%.*s\"", (int)(op_len > 64 ? 64 : op_len), op);
    goto reply_error;
  }
  if ((cmd->flags & FM_CMD_NEEDS_HELLO) && !fm_conn_hello_done(c)) {
    err = fm_diag_set(&d, FM_EHANDSHAKE, "\"%s\" before hello: send hello first", cmd->name);
    goto reply_error;
  }
  if ((cmd->flags & FM_CMD_ADMIN) && (err = check_admin(c, cmd->name, &d))) goto reply_error;
  fm_request rq = {.dd = dd, .conn = c, .id = id, .msg = &msg};
  err = cmd->handler(&rq, &d);
  if (err) goto reply_error;
  goto out;

reply_error:
  if (fm_dispatch_is_client_error(err)) fm_daemon_count(dd, FM_STAT_BAD_REQUESTS, 1);
  if (!d.text[0]) snprintf(d.text, sizeof d.text, "%s", fm_strerror(err));
  fm_log_debug("%s: %s id %llu: %s: %s", fm_conn_name(c), cmd ? cmd->name : "request", (unsigned long long)id,
               fm_err_slug(err), d.text);
  fm_reply_error(c, id, err, d.text);
  /* A peer that speaks another protocol version cannot be understood further. */
  if (err == FM_EPROTO_VERSION) fm_conn_close_after_flush(c);
out:
  msgpack_zone_destroy(&zone);
}

static int cmd_hello(fm_request *rq, fm_diag *d) {
  fm_daemon *dd = rq->dd;
  uint64_t proto = 0, pid = 0;
  char client[FM_CLIENT_NAME_MAX + 1] = "";
  int err = fm_msg_get_u64(rq->msg, "proto", &proto, d);
  if (err == FM_ENOT_FOUND) return fm_diag_set(d, FM_ESCHEMA, "hello has no \"proto\"");
  if (err) return err;
  if (proto != FM_PROTO_VERSION)
    return fm_diag_set(d, FM_EPROTO_VERSION, "client speaks protocol %llu; this daemon speaks %d",
                       (unsigned long long)proto, FM_PROTO_VERSION);
  err = fm_msg_copy_str(rq->msg, "client", client, sizeof client, d);
  if (err && err != FM_ENOT_FOUND) return err;
  err = fm_msg_get_u64(rq->msg, "pid", &pid, d);
  if (err && err != FM_ENOT_FOUND) return err;
  fm_conn_set_hello(rq->conn, client, pid);
  fm_log_debug("%s: hello", fm_conn_name(rq->conn));

  fm_reply r;
  fm_reply_begin(&r, rq->id, 10);
  fm_pack_kv_u64(&r.pk, "proto", FM_PROTO_VERSION);
  fm_pack_kv_cstr(&r.pk, "server", "fusemld");
  fm_pack_kv_cstr(&r.pk, "version", FM_VERSION_STRING);
  fm_pack_kv_cstr(&r.pk, "mode", fm_device_mode(&dd->dev));
  fm_pack_cstr(&r.pk, "device");
  fm_reply_pack_device(&r.pk, &dd->dev.id);
  fm_pack_kv_u64(&r.pk, "vocab", FM_VOCAB_VERSION);
  fm_pack_kv_u64(&r.pk, "codegen", FM_CODEGEN_VERSION);
  fm_pack_cstr(&r.pk, "nvrtc");
  msgpack_pack_array(&r.pk, 2);
  msgpack_pack_uint32(&r.pk, dd->dev.nvrtc_major);
  msgpack_pack_uint32(&r.pk, dd->dev.nvrtc_minor);
  fm_pack_kv_u64(&r.pk, "max_frame", FM_FRAME_MAX_REQUEST);
  fm_pack_kv_u64(&r.pk, "cublaslt", dd->dev.cublaslt_version);
  fm_reply_send(&r, rq->conn, rq->id);
  return FM_OK;
}

static int cmd_ping(fm_request *rq, fm_diag *d) {
  fm_reply r;
  fm_reply_begin(&r, rq->id, 1);
  fm_pack_kv_bool(&r.pk, "pong", true);
  fm_reply_send(&r, rq->conn, rq->id);
  return FM_OK;
}
