/* fm_server.c: the listening socket, per-connection framing, write queues and timers. */
#define _GNU_SOURCE /* struct ucred, SO_PEERCRED */
#include "fm_server.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "fm_connlog.h"
#include "fm_frame.h"
#include "fm_log.h"
#include "fm_msg.h"

#define FM_SERVER_BACKLOG         128
#define FM_SERVER_READ_CHUNK      65536
#define FM_SERVER_DRAIN_TIMEOUT_S 10 /* a draining peer that never reads its last reply */
#define FM_CONN_NAME_SAFE         72
#define FM_PEER_GROUPS_MAX        256 /* supplementary groups looked at (NGROUPS_MAX is 65536) */
/* Connections accepted before the listener pauses for one loop turn. libuv accepts until the
 * backlog is empty, and a storm of connects and closes refills it as fast: without a pause,
 * no hang-up would be read (and no slot freed) while the storm lasts. */
#define FM_SERVER_ACCEPT_BATCH    32
#define FM_SERVER_SUMMARY_MS      60000 /* the connection summary's interval (fm_connlog.h) */

struct fm_server {
  uv_loop_t *loop;
  uv_pipe_t listener;
  uv_idle_t accept_resume; /* resumes accepting at the next loop turn */
  uv_timer_t summary;      /* writes the connection summary */
  int listening;           /* listener open */
  int open_handles;        /* listener, accept_resume, summary: close callbacks not yet run */
  uint32_t accepted;       /* since accepting last paused */
  fm_server_opts opts;
  char *socket_path;
  fm_conn *conns; /* open connections (not yet closing) */
  uint32_t n_clients;
  size_t pending_total; /* bytes queued for writing on the open connections */
  uint64_t next_id;
  fm_connlog connlog;
  /* Reads are consumed synchronously by on_read (copied into the connection's frame reader),
   * so one buffer serves every connection. */
  char readbuf[FM_SERVER_READ_CHUNK];
};

struct fm_conn {
  fm_server *srv;
  fm_conn *next, *prev;
  uv_pipe_t pipe;
  uv_timer_t timer;
  int handles;    /* libuv handles not yet closed (pipe, timer) */
  int refs;       /* fm_conn_ref holders (requests waiting on a compile) */
  int closing;    /* uv_close issued */
  int draining;   /* close once the write queue is empty */
  size_t pending; /* payload bytes queued for writing */
  uint32_t n_writes;
  fm_frame_reader reader;
  uint64_t frame_started_ms; /* when the incomplete frame's first byte came (uv_now) */
  int hello;
  uint64_t id;
  int have_cred; /* SO_PEERCRED answered */
  struct ucred cred;
  char name[128];
};

typedef struct fm_wreq {
  uv_write_t req;
  fm_conn *c;
  uint8_t header[FM_FRAME_HEADER_BYTES];
  char *payload;
  size_t len;
} fm_wreq;

static void conn_close(fm_conn *c);

/* ---- connection lifetime ---- */

static void conn_maybe_free(fm_conn *c) {
  if (c->handles > 0 || c->refs > 0) return;
  fm_frame_reader_free(&c->reader);
  free(c);
}

static void on_conn_handle_closed(uv_handle_t *h) {
  fm_conn *c = h->data;
  c->handles--;
  conn_maybe_free(c);
}

static void conn_unlink(fm_conn *c) {
  fm_server *s = c->srv;
  if (c->prev)
    c->prev->next = c->next;
  else if (s->conns == c)
    s->conns = c->next;
  if (c->next) c->next->prev = c->prev;
  c->next = c->prev = NULL;
  s->n_clients--;
  /* Its queued replies are freed as the close cancels them, in this loop turn. */
  s->pending_total -= c->pending;
}

static void conn_close(fm_conn *c) {
  if (c->closing) return;
  c->closing = 1;
  fm_connlog *log = &c->srv->connlog;
  size_t partial = fm_frame_reader_pending(&c->reader);
  if (partial)
    fm_connlog_event(log, FM_CONN_MIDFRAME, "%s: closed with %zu bytes of an incomplete frame", c->name, partial);
  fm_connlog_event(log, FM_CONN_CLOSED, "%s: closed", c->name);
  conn_unlink(c);
  /* Pending writes are cancelled by libuv before these close callbacks run, so the write
   * callbacks still find the connection alive. */
  uv_close((uv_handle_t *)&c->pipe, on_conn_handle_closed);
  uv_close((uv_handle_t *)&c->timer, on_conn_handle_closed);
}

void fm_conn_ref(fm_conn *c) { c->refs++; }

void fm_conn_unref(fm_conn *c) {
  c->refs--;
  conn_maybe_free(c);
}

int fm_conn_is_open(const fm_conn *c) { return !c->closing && !c->draining; }

/* ---- timers ---- */

static void on_timer(uv_timer_t *t);

/* Milliseconds until the incomplete frame's deadline; 0 once it has passed. */
static uint64_t frame_ms_left(const fm_conn *c) {
  uint64_t due = c->frame_started_ms + (uint64_t)c->srv->opts.frame_deadline_s * 1000, now = uv_now(c->srv->loop);
  return due > now ? due - now : 0;
}

static void arm_timer(fm_conn *c) {
  if (c->closing) return;
  const fm_server_opts *o = &c->srv->opts;
  uint64_t ms;
  if (c->draining) {
    ms = FM_SERVER_DRAIN_TIMEOUT_S * 1000;
  } else if (fm_frame_reader_pending(&c->reader) > 0) {
    uint32_t secs =
        o->idle_timeout_s && o->idle_timeout_s < o->stall_timeout_s ? o->idle_timeout_s : o->stall_timeout_s;
    ms = (uint64_t)secs * 1000;
    /* The stall timer starts again with every byte; the frame's deadline does not, so a
     * trickle of bytes cannot hold the connection forever. */
    uint64_t left = frame_ms_left(c);
    if (o->frame_deadline_s && (ms == 0 || left < ms)) ms = left ? left : 1;
  } else {
    ms = (uint64_t)o->idle_timeout_s * 1000;
  }
  if (ms == 0) {
    uv_timer_stop(&c->timer);
    return;
  }
  uv_timer_start(&c->timer, on_timer, ms, 0);
}

static void on_timer(uv_timer_t *t) {
  fm_conn *c = t->data;
  size_t partial = fm_frame_reader_pending(&c->reader);
  if (!c->draining && !partial && c->refs > 0) {
    /* Waiting on our own compile is not idleness. */
    arm_timer(c);
    return;
  }
  fm_connlog *log = &c->srv->connlog;
  if (c->draining)
    fm_connlog_event(log, FM_CONN_UNREAD, "%s: peer did not read its last reply; closing", c->name);
  else if (partial && c->srv->opts.frame_deadline_s && frame_ms_left(c) == 0)
    fm_connlog_event(log, FM_CONN_DEADLINE,
                     "%s: frame not complete %u s after its first byte (%zu bytes so far); closing", c->name,
                     c->srv->opts.frame_deadline_s, partial);
  else if (partial)
    fm_log_debug("%s: stalled in the middle of a frame; closing", c->name);
  else
    fm_connlog_event(log, FM_CONN_IDLE, "%s: idle; closing", c->name);
  conn_close(c);
}

/* ---- writing ---- */

static void on_write(uv_write_t *req, int status) {
  fm_wreq *w = req->data;
  fm_conn *c = w->c;
  c->pending -= w->len;
  if (!c->closing) c->srv->pending_total -= w->len; /* a closing one was taken off at once */
  c->n_writes--;
  free(w->payload);
  free(w);
  if (status < 0 && status != UV_ECANCELED) {
    fm_log_debug("%s: write failed: %s", c->name, uv_strerror(status));
    conn_close(c);
  } else if (c->draining && c->n_writes == 0) {
    conn_close(c);
  }
}

/* Makes room for len more bytes under the bound on all clients' queued replies by cutting
 * the clients with the most bytes queued unread: replies pile up at a client that does not
 * read, never at one that does. 0 if c itself is the one to cut (counted with len, so one big
 * reply is not sent at the price of several small ones). A reply is queued when nothing else
 * is, whatever its size. */
static int make_room(fm_conn *c, size_t len) {
  fm_server *s = c->srv;
  size_t bound = s->opts.max_total_output;
  while (bound && s->pending_total > 0 && s->pending_total + len > bound) {
    fm_conn *worst = c;
    size_t most = c->pending + len;
    for (fm_conn *o = s->conns; o; o = o->next)
      if (o != c && o->pending > most) worst = o, most = o->pending;
    fm_connlog_event(&s->connlog, FM_CONN_UNREAD,
                     "%s: the queued output of all clients would pass %zu bytes, and %zu of them are this "
                     "client's, the most of any; dropping the client",
                     worst->name, bound, most);
    conn_close(worst);
    if (worst == c) return 0;
  }
  return 1;
}

static int conn_write(fm_conn *c, char *payload, size_t len) {
  const fm_server_opts *o = &c->srv->opts;
  if (c->closing) {
    free(payload);
    return FM_ECLOSED;
  }
  /* A reply larger than the cap still goes out when nothing else is queued: the cap is about
   * replies piling up unread, not about one big CUBIN. */
  if (len > UINT32_MAX || (c->pending > 0 && c->pending + len > o->max_pending_output)) {
    fm_connlog_event(&c->srv->connlog, FM_CONN_UNREAD,
                     "%s: %zu bytes of replies queued unread (cap %zu); dropping the client", c->name, c->pending + len,
                     o->max_pending_output);
    free(payload);
    conn_close(c);
    return FM_ELIMIT;
  }
  if (!make_room(c, len)) {
    free(payload);
    return FM_ELIMIT;
  }
  fm_wreq *w = malloc(sizeof *w);
  if (!w) {
    free(payload);
    conn_close(c);
    return FM_ENOMEM;
  }
  w->req.data = w;
  w->c = c;
  w->payload = payload;
  w->len = len;
  fm_frame_header(w->header, (uint32_t)len);
  uv_buf_t bufs[2] = {uv_buf_init((char *)w->header, FM_FRAME_HEADER_BYTES), uv_buf_init(payload, (unsigned)len)};
  int r = uv_write(&w->req, (uv_stream_t *)&c->pipe, bufs, 2, on_write);
  if (r < 0) {
    fm_log_debug("%s: write: %s", c->name, uv_strerror(r));
    free(payload);
    free(w);
    conn_close(c);
    return FM_EIO;
  }
  c->pending += len;
  c->srv->pending_total += len;
  c->n_writes++;
  return FM_OK;
}

int fm_conn_send(fm_conn *c, msgpack_sbuffer *sb) {
  size_t len = sb->size;
  char *payload = msgpack_sbuffer_release(sb);
  if (!payload) return FM_ENOMEM;
  if (c->draining) {
    free(payload);
    return FM_ECLOSED;
  }
  return conn_write(c, payload, len);
}

void fm_conn_close_after_flush(fm_conn *c) {
  if (c->closing || c->draining) return;
  c->draining = 1;
  uv_read_stop((uv_stream_t *)&c->pipe);
  if (c->n_writes == 0)
    conn_close(c);
  else
    arm_timer(c);
}

/* An error reply the server sends by itself (no request was decoded: id 0). */
static void send_error(fm_conn *c, int err, const char *detail) {
  msgpack_sbuffer sb;
  msgpack_packer pk;
  msgpack_sbuffer_init(&sb);
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  fm_pack_error_reply(&pk, 0, err, detail);
  if (fm_conn_send(c, &sb) == FM_ENOMEM) conn_close(c);
  msgpack_sbuffer_destroy(&sb);
}

/* ---- reading ---- */

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  fm_conn *c = h->data;
  buf->base = c->srv->readbuf;
  buf->len = sizeof c->srv->readbuf;
}

static void on_read(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf) {
  fm_conn *c = stream->data;
  fm_server *s = c->srv;
  if (nread < 0) {
    if (nread != UV_EOF) fm_log_debug("%s: read: %s", c->name, uv_strerror((int)nread));
    conn_close(c);
    return;
  }
  if (nread == 0) return;
  size_t partial_before = fm_frame_reader_pending(&c->reader);
  int err = fm_frame_reader_feed(&c->reader, buf->base, (size_t)nread);
  if (err == FM_ETOOBIG) {
    char detail[128];
    snprintf(detail, sizeof detail, "a frame may hold at most %zu bytes; closing the connection", s->opts.max_frame);
    fm_connlog_event(&s->connlog, FM_CONN_TOOBIG, "%s: frame header over the %zu-byte limit", c->name,
                     s->opts.max_frame);
    if (s->opts.on_refused) s->opts.on_refused(FM_ETOOBIG, s->opts.ctx);
    send_error(c, FM_ETOOBIG, detail);
    fm_conn_close_after_flush(c);
    return;
  }
  if (err) {
    fm_log_warn("%s: %s; closing", c->name, fm_strerror(err));
    conn_close(c);
    return;
  }
  const uint8_t *payload;
  size_t len;
  int frames = 0;
  /* A handler may close the connection (protocol_version): stop at once then. */
  while (!c->closing && !c->draining && fm_frame_reader_next(&c->reader, &payload, &len) == 1) {
    s->opts.on_frame(c, payload, len, s->opts.ctx);
    frames++;
  }
  /* A frame left incomplete began in this read unless it was already pending before. */
  if ((partial_before == 0 || frames > 0) && fm_frame_reader_pending(&c->reader) > 0)
    c->frame_started_ms = uv_now(s->loop);
  arm_timer(c);
}

/* ---- accepting ---- */

static void describe_peer(fm_conn *c) {
  uv_os_fd_t fd;
  socklen_t n = sizeof c->cred;
  c->have_cred =
      uv_fileno((uv_handle_t *)&c->pipe, &fd) == 0 && getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &c->cred, &n) == 0;
  if (c->have_cred)
    snprintf(c->name, sizeof c->name, "#%llu pid %ld uid %ld", (unsigned long long)c->id, (long)c->cred.pid,
             (long)c->cred.uid);
  else
    snprintf(c->name, sizeof c->name, "#%llu", (unsigned long long)c->id);
}

static int id_listed(const uint32_t *ids, uint32_t n, uint32_t id) {
  for (uint32_t i = 0; i < n; i++)
    if (ids[i] == id) return 1;
  return 0;
}

/* Whether the allow-list (if any) admits the peer. A peer whose credentials cannot be read
 * is refused when there is a list: failing open would defeat it. */
static int peer_allowed(const fm_conn *c) {
  const fm_server_opts *o = &c->srv->opts;
  if (o->n_allow_uids == 0 && o->n_allow_gids == 0) return 1;
  if (!c->have_cred) return 0;
  if (id_listed(o->allow_uids, o->n_allow_uids, (uint32_t)c->cred.uid)) return 1;
  if (o->n_allow_gids == 0) return 0;
  if (id_listed(o->allow_gids, o->n_allow_gids, (uint32_t)c->cred.gid)) return 1;
#ifdef SO_PEERGROUPS
  /* Supplementary groups as of connect(): how `usermod -aG` grants access to a socket. */
  gid_t groups[FM_PEER_GROUPS_MAX];
  socklen_t len = sizeof groups;
  uv_os_fd_t fd;
  if (uv_fileno((const uv_handle_t *)&c->pipe, &fd) == 0 &&
      getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups, &len) == 0) {
    for (size_t i = 0; i < len / sizeof groups[0]; i++)
      if (id_listed(o->allow_gids, o->n_allow_gids, (uint32_t)groups[i])) return 1;
  }
#endif
  return 0;
}

/* Closes the newest connections whose peer has hung up with nothing left for us to read.
 * Each loop turn reads the hang-ups of every connection that was ready when it polled, so
 * only those accepted since (at most two batches: the list is newest first) can be stale:
 * the hang-ups of a connect/close storm, which must not take the slots of live clients.
 * Called at max-clients only; one poll(2). */
static void reap_hung_up(fm_server *s) {
  struct pollfd fds[2 * FM_SERVER_ACCEPT_BATCH];
  fm_conn *conns[2 * FM_SERVER_ACCEPT_BATCH];
  nfds_t n = 0;
  for (fm_conn *c = s->conns; c && n < 2 * FM_SERVER_ACCEPT_BATCH; c = c->next) {
    uv_os_fd_t fd;
    if (uv_fileno((uv_handle_t *)&c->pipe, &fd) != 0) continue;
    fds[n] = (struct pollfd){.fd = fd, .events = POLLIN};
    conns[n++] = c;
  }
  if (n == 0 || poll(fds, n, 0) <= 0) return;
  for (nfds_t i = 0; i < n; i++) {
    int unread = 0;
    /* POLLHUP: the peer closed (or shut down both ways) and can read no reply. One that left
     * a request behind is read and answered the ordinary way. */
    if ((fds[i].revents & (POLLHUP | POLLERR)) && ioctl(fds[i].fd, FIONREAD, &unread) == 0 && unread == 0)
      conn_close(conns[i]);
  }
}

static void accept_one(fm_server *s);

static void on_accept_resume(uv_idle_t *h) {
  fm_server *s = h->data;
  uv_idle_stop(h);
  s->accepted = 0;
  accept_one(s);
}

static void on_connection(uv_stream_t *listener, int status) {
  fm_server *s = listener->data;
  if (status < 0) {
    fm_log_warn("accept: %s", uv_strerror(status));
    return;
  }
  /* Not accepting now pauses libuv's listener until accept_one takes this connection, at the
   * next loop turn, after the reads (hang-ups included) of those just accepted. */
  if (s->accepted >= FM_SERVER_ACCEPT_BATCH)
    uv_idle_start(&s->accept_resume, on_accept_resume);
  else
    accept_one(s);
}

/* Takes the connection libuv has accepted on the listener. */
static void accept_one(fm_server *s) {
  fm_conn *c = calloc(1, sizeof *c);
  if (!c) {
    /* Try again at the next turn; until then the listener stays paused. */
    fm_log_error("out of memory accepting a connection");
    uv_idle_start(&s->accept_resume, on_accept_resume);
    return;
  }
  s->accepted++;
  c->srv = s;
  c->id = ++s->next_id;
  fm_frame_reader_init(&c->reader, s->opts.max_frame);
  uv_pipe_init(s->loop, &c->pipe, 0);
  uv_timer_init(s->loop, &c->timer);
  c->pipe.data = c->timer.data = c;
  c->handles = 2;
  c->next = s->conns;
  if (s->conns) s->conns->prev = c;
  s->conns = c;
  s->n_clients++;
  int r = uv_accept((uv_stream_t *)&s->listener, (uv_stream_t *)&c->pipe);
  if (r < 0) {
    fm_log_warn("accept: %s", uv_strerror(r));
    conn_close(c);
    return;
  }
  describe_peer(c);
  fm_connlog_event(&s->connlog, FM_CONN_OPENED, "%s gid %ld: connected", c->name,
                   c->have_cred ? (long)c->cred.gid : -1L);
  if (!peer_allowed(c)) {
    char detail[128];
    if (c->have_cred)
      snprintf(detail, sizeof detail, "uid %ld (gid %ld) is not allowed to use this daemon (allow-uid/allow-gid)",
               (long)c->cred.uid, (long)c->cred.gid);
    else
      snprintf(detail, sizeof detail, "the peer's credentials cannot be read and an allow-list is set");
    fm_connlog_event(&s->connlog, FM_CONN_DENIED, "%s: refused: %s", c->name, detail);
    if (s->opts.on_refused) s->opts.on_refused(FM_EDENIED, s->opts.ctx);
    send_error(c, FM_EDENIED, detail);
    fm_conn_close_after_flush(c);
    return;
  }
  if (s->n_clients > s->opts.max_clients) {
    reap_hung_up(s);
    if (c->closing) return; /* this one was gone already */
  }
  if (s->n_clients > s->opts.max_clients) {
    char detail[96];
    snprintf(detail, sizeof detail, "the daemon serves at most %u clients at once", s->opts.max_clients);
    fm_connlog_event(&s->connlog, FM_CONN_BUSY, "%s: refused: %s", c->name, detail);
    if (s->opts.on_refused) s->opts.on_refused(FM_EBUSY, s->opts.ctx);
    send_error(c, FM_EBUSY, detail);
    fm_conn_close_after_flush(c);
    return;
  }
  r = uv_read_start((uv_stream_t *)&c->pipe, on_alloc, on_read);
  if (r < 0) {
    fm_log_warn("%s: read: %s", c->name, uv_strerror(r));
    conn_close(c);
    return;
  }
  arm_timer(c);
}

/* ---- the listening socket ---- */

/* A socket file may be left by a daemon that died (kill -9). Replace it only if nothing
 * answers there: a live daemon would otherwise lose its socket to us. */
static int clear_stale_socket(const char *path, fm_diag *d) {
  struct stat st;
  if (lstat(path, &st) != 0) {
    if (errno == ENOENT) return FM_OK;
    return fm_diag_set(d, FM_EIO, "cannot stat %s: %s", path, strerror(errno));
  }
  if (!S_ISSOCK(st.st_mode))
    return fm_diag_set(d, FM_EIO, "%s exists and is not a socket; refusing to replace it", path);
  struct sockaddr_un sa;
  memset(&sa, 0, sizeof sa);
  sa.sun_family = AF_UNIX;
  memcpy(sa.sun_path, path, strlen(path));
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return fm_diag_set(d, FM_EIO, "socket: %s", strerror(errno));
  int r = connect(fd, (struct sockaddr *)&sa, sizeof sa);
  int e = errno;
  close(fd);
  /* EAGAIN: a live listener whose backlog is full is still a live daemon. */
  if (r == 0 || e == EAGAIN || e == EINPROGRESS)
    return fm_diag_set(d, FM_EBUSY, "another fusemld is already serving %s; stop it first or use --socket", path);
  if (e != ECONNREFUSED) return fm_diag_set(d, FM_EIO, "cannot probe the existing socket %s: %s", path, strerror(e));
  if (unlink(path) != 0 && errno != ENOENT)
    return fm_diag_set(d, FM_EIO, "cannot remove the stale socket %s: %s", path, strerror(errno));
  fm_log_info("removed stale socket %s (no daemon answered there)", path);
  return FM_OK;
}

static void on_server_handle_closed(uv_handle_t *h) {
  fm_server *s = h->data;
  s->open_handles--;
}

static void on_summary_timer(uv_timer_t *t) {
  fm_server *s = t->data;
  fm_connlog_summary(&s->connlog);
}

static void free_server_after_close(uv_handle_t *h) {
  fm_server *s = h->data;
  free(s->socket_path);
  free(s);
}

int fm_server_start(uv_loop_t *loop, const fm_server_opts *opts, fm_server **out, fm_diag *d) {
  int err = FM_OK, r;
  fm_server *s = calloc(1, sizeof *s);
  if (!s) return fm_diag_set(d, FM_ENOMEM, "out of memory");
  s->loop = loop;
  s->opts = *opts;
  fm_connlog_init(&s->connlog);
  s->socket_path = strdup(opts->socket_path ? opts->socket_path : "");
  if (!s->socket_path) {
    free(s);
    return fm_diag_set(d, FM_ENOMEM, "out of memory");
  }
  s->opts.socket_path = s->socket_path;
  if (opts->listen_fd < 0) {
    struct sockaddr_un sa;
    /* libuv 1.44 silently truncates a long path; refuse instead of binding somewhere else. */
    if (strlen(s->socket_path) == 0 || strlen(s->socket_path) >= sizeof sa.sun_path) {
      free(s->socket_path);
      free(s);
      return fm_diag_set(d, FM_EINVAL, "socket path \"%s\" is empty or longer than %zu bytes",
                         opts->socket_path ? opts->socket_path : "", sizeof sa.sun_path - 1);
    }
    if ((err = clear_stale_socket(s->socket_path, d))) {
      free(s->socket_path);
      free(s);
      return err;
    }
  }
  uv_pipe_init(loop, &s->listener, 0);
  s->listener.data = s;
  if (opts->listen_fd >= 0) {
    r = uv_pipe_open(&s->listener, opts->listen_fd);
    if (r < 0) {
      err = fm_diag_set(d, FM_EIO, "cannot use the socket passed by systemd (fd %d): %s", opts->listen_fd,
                        uv_strerror(r));
      goto fail;
    }
  } else {
    /* The umask decides the socket file's mode at bind time: 0600 for one user, 0660 for
     * a group in system mode. There is no window with looser permissions. */
    mode_t old = umask(opts->system_mode ? 0117 : 0177);
    r = uv_pipe_bind(&s->listener, s->socket_path);
    umask(old);
    if (r < 0) {
      err = fm_diag_set(d, FM_EIO, "cannot bind %s: %s", s->socket_path, uv_strerror(r));
      goto fail;
    }
  }
  r = uv_listen((uv_stream_t *)&s->listener, FM_SERVER_BACKLOG, on_connection);
  if (r < 0) {
    err = fm_diag_set(d, FM_EIO, "cannot listen on %s: %s", s->socket_path, uv_strerror(r));
    goto fail;
  }
  s->listening = 1;
  uv_idle_init(loop, &s->accept_resume);
  uv_timer_init(loop, &s->summary);
  s->accept_resume.data = s->summary.data = s;
  s->open_handles = 3;
  /* Unreferenced: the summary never keeps a stopping daemon alive. */
  uv_timer_start(&s->summary, on_summary_timer, FM_SERVER_SUMMARY_MS, FM_SERVER_SUMMARY_MS);
  uv_unref((uv_handle_t *)&s->summary);
  *out = s;
  return FM_OK;
fail:
  /* The listener must be closed through the loop before s is freed (the caller runs it). */
  uv_close((uv_handle_t *)&s->listener, free_server_after_close);
  return err;
}

void fm_server_stop_listening(fm_server *s) {
  if (!s->listening) return;
  s->listening = 0;
  /* libuv unlinks the socket file it bound when the listener closes (and leaves a
   * systemd-passed socket alone), so a restarted daemon finds no stale file. A connection
   * held back by a paused accept is closed with it. */
  uv_close((uv_handle_t *)&s->listener, on_server_handle_closed);
  uv_close((uv_handle_t *)&s->accept_resume, on_server_handle_closed);
  uv_close((uv_handle_t *)&s->summary, on_server_handle_closed);
  fm_connlog_summary(&s->connlog);
}

void fm_server_close_all(fm_server *s) {
  fm_conn *c = s->conns;
  while (c) {
    fm_conn *next = c->next;
    fm_conn_close_after_flush(c);
    c = next;
  }
}

void fm_server_abort_all(fm_server *s) {
  while (s->conns) conn_close(s->conns);
}

void fm_server_free(fm_server *s) {
  if (!s) return;
  if (s->open_handles > 0 || s->conns) {
    /* Handles still open (a shutdown past its deadline): freeing would leave libuv pointing
     * into freed memory. The process is about to exit; leak instead. */
    return;
  }
  free(s->socket_path);
  free(s);
}

uint32_t fm_server_clients(const fm_server *s) { return s->n_clients; }

int fm_conn_hello_done(const fm_conn *c) { return c->hello; }

void fm_conn_set_hello(fm_conn *c, const char *client_name, uint64_t pid) {
  c->hello = 1;
  /* The name is the client's text: keep only printable ASCII so it cannot forge log lines. */
  char safe[FM_CONN_NAME_SAFE];
  size_t n = 0;
  for (const char *p = client_name ? client_name : ""; *p && n < sizeof safe - 1; p++)
    safe[n++] = (*p >= 0x20 && *p < 0x7f) ? *p : '?';
  safe[n] = '\0';
  /* The pid is the client's claim; the uid is the kernel's (SO_PEERCRED), kept in the name. */
  if (c->have_cred)
    snprintf(c->name, sizeof c->name, "#%llu %s[%llu] uid %ld", (unsigned long long)c->id, n ? safe : "client",
             (unsigned long long)pid, (long)c->cred.uid);
  else
    snprintf(c->name, sizeof c->name, "#%llu %s[%llu]", (unsigned long long)c->id, n ? safe : "client",
             (unsigned long long)pid);
}

const char *fm_conn_name(const fm_conn *c) { return c->name; }

int fm_conn_peer_uid(const fm_conn *c, uint32_t *uid) {
  if (!c->have_cred) return FM_ENOT_FOUND;
  *uid = (uint32_t)c->cred.uid;
  return FM_OK;
}
