/* fm_server.h: the listening Unix socket and its connections (libuv, loop thread only).
 *
 * Each connection reads length-prefixed frames (fm_frame.h, at most max_frame bytes) and hands
 * every complete frame to on_frame. Replies go out through fm_conn_send, queued per
 * connection; a peer that lets more than max_pending_output bytes pile up unread is closed.
 * Across all connections at most max_total_output bytes are queued: a reply that would pass
 * it first closes the connections with the most bytes queued (the slowest readers), which
 * may be the one the reply is for.
 * A frame header declaring more than max_frame gets a frame_too_large error reply and the
 * connection is closed once it is written (the stream cannot be resynchronized).
 *
 * Connections are reference counted: a request waiting on a compile holds a reference
 * (fm_conn_ref), so when its peer hangs up the connection object outlives the socket and the
 * late reply is dropped (fm_conn_send on a closed connection) instead of touching freed memory.
 *
 * Access control: every peer is identified with SO_PEERCRED when accepted (uid, gid, pid go
 * into its log name). With an allow-list, a peer whose uid is not in allow_uids and whose
 * primary and supplementary gids (SO_PEERGROUPS) are not in allow_gids gets one
 * permission_denied error reply and is closed, before anything it sent is read and before the
 * max_clients check.
 *
 * Idle clients are closed after idle_timeout_s (0: never); a client that stalls in the middle
 * of a frame is closed after stall_timeout_s, and one whose frame is not complete
 * frame_deadline_s after its first byte is closed however steadily the bytes come. A
 * connection with requests still being compiled is never idle.
 *
 * Connection storms: at most a batch of connections (32) is accepted per loop turn, so
 * hang-ups are read between batches; at max_clients, connections whose peer has already
 * hung up are closed before a new one is answered busy. Connection events are logged through
 * fm_connlog.h: one line each at debug, a summary per minute at info. */
#ifndef FM_SERVER_H
#define FM_SERVER_H

#include <stddef.h>
#include <stdint.h>
#include <msgpack.h>
#include <uv.h>

#include "fm_error.h"

typedef struct fm_server fm_server;
typedef struct fm_conn fm_conn;

/* One complete frame; payload is valid only during the call. */
typedef void (*fm_server_frame_fn)(fm_conn *c, const uint8_t *payload, size_t len, void *ctx);
/* A frame the server refused by itself (FM_ETOOBIG; FM_EBUSY at max clients; FM_EDENIED for a
 * peer not in the allow-list), for counting. */
typedef void (*fm_server_refused_fn)(int err, void *ctx);

typedef struct fm_server_opts {
  const char *socket_path; /* bound unless listen_fd >= 0 */
  int listen_fd;           /* an already listening socket (systemd activation), or -1 */
  int system_mode;         /* socket mode 0660 instead of 0600 */
  uint32_t max_clients;
  uint32_t idle_timeout_s;    /* 0: never */
  uint32_t stall_timeout_s;   /* partial frame pending, no byte for this long */
  uint32_t frame_deadline_s;  /* partial frame pending this long since its first byte; 0: none */
  size_t max_frame;           /* FM_FRAME_MAX_REQUEST */
  size_t max_pending_output;  /* bytes queued unread before the connection is dropped (a
                                  reply is always queued when nothing else is) */
  size_t max_total_output;    /* bytes queued across all connections; 0: no bound */
  const uint32_t *allow_uids; /* both lists empty: every peer that can connect is served */
  uint32_t n_allow_uids;
  const uint32_t *allow_gids;
  uint32_t n_allow_gids;
  fm_server_frame_fn on_frame;
  fm_server_refused_fn on_refused; /* may be NULL */
  void *ctx;
} fm_server_opts;

/* Binds (or adopts listen_fd) and listens. A socket file left by a dead daemon is replaced
 * only after a connect() to it is refused; if a daemon answers there, FM_EBUSY ("already
 * running"). The socket is created with umask 0177 (0600), or 0117 (0660) in system mode. */
int fm_server_start(uv_loop_t *loop, const fm_server_opts *opts, fm_server **out, fm_diag *d);
/* Stops accepting: closes the listener, which removes the socket file if we created it. */
void fm_server_stop_listening(fm_server *s);
/* Closes every connection once its queued replies are written (shutdown). */
void fm_server_close_all(fm_server *s);
/* Closes every connection now, dropping unwritten replies (a shutdown whose flush timed out). */
void fm_server_abort_all(fm_server *s);
/* Frees the server after the loop has closed all of its handles (uv_run returned). Connections
 * still referenced (never, after a clean shutdown) are left alone. */
void fm_server_free(fm_server *s);
uint32_t fm_server_clients(const fm_server *s);

void fm_conn_ref(fm_conn *c);
void fm_conn_unref(fm_conn *c);
/* False once the peer hung up or the connection is being closed. */
int fm_conn_is_open(const fm_conn *c);
/* Queues one frame whose payload is sb's bytes; takes them (sb is left empty). FM_ECLOSED if
 * the connection is closed (the bytes are freed), FM_ELIMIT if the peer is not reading (the
 * connection is then closed). */
int fm_conn_send(fm_conn *c, msgpack_sbuffer *sb);
/* Stops reading and closes the connection after everything queued has been written. */
void fm_conn_close_after_flush(fm_conn *c);

/* Handshake state, kept on the connection for dispatch. */
int fm_conn_hello_done(const fm_conn *c);
void fm_conn_set_hello(fm_conn *c, const char *client_name, uint64_t pid);
/* "#12 python/4242" for log lines. */
const char *fm_conn_name(const fm_conn *c);
/* The peer's uid as the kernel gave it when the connection was accepted (SO_PEERCRED);
 * FM_ENOT_FOUND if it could not be read. */
int fm_conn_peer_uid(const fm_conn *c, uint32_t *uid);

#endif
