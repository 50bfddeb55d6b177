/* fm_client_io.c: socket primitives for libfusemld (see fm_client_io.h). */
#include "fm_client_io.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

static int64_t fm_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t fm_client_io_deadline(int timeout_ms) { return timeout_ms <= 0 ? -1 : fm_now_ms() + timeout_ms; }

/* Milliseconds left for poll(): -1 (forever), or >= 0. */
static int fm_left_ms(int64_t deadline) {
  int64_t left;
  if (deadline < 0) return -1;
  left = deadline - fm_now_ms();
  if (left <= 0) return 0;
  return left > 1000000000 ? 1000000000 : (int)left;
}

/* Waits for events on fd: FM_OK when ready (including error/hang-up states, which the
 * following read/write then reports precisely), FM_ETIMEOUT, FM_EIO. */
static int fm_wait(int fd, short events, int64_t deadline, const char *what, fm_diag *d) {
  for (;;) {
    struct pollfd p = {.fd = fd, .events = events, .revents = 0};
    int left = fm_left_ms(deadline);
    int n = poll(&p, 1, left);
    if (n > 0) return FM_OK;
    if (n == 0) return fm_diag_set(d, FM_ETIMEOUT, "timed out %s", what);
    if (errno != EINTR) return fm_diag_set(d, FM_EIO, "poll failed %s: %s", what, strerror(errno));
  }
}

int fm_client_io_connect(const char *path, int64_t deadline, int *fd_out, fm_diag *d) {
  struct sockaddr_un sa;
  size_t plen = path ? strlen(path) : 0;
  int fd = -1, err = FM_OK, so_err = 0;
  socklen_t so_len = sizeof so_err;

  *fd_out = -1;
  if (plen == 0) return fm_diag_set(d, FM_EINVAL, "empty socket path");
  if (plen >= sizeof sa.sun_path)
    return fm_diag_set(d, FM_ELIMIT,
                       "socket path is %zu bytes, longer than the %zu a Unix "
                       "socket allows: %s",
                       plen, sizeof sa.sun_path - 1, path);
  memset(&sa, 0, sizeof sa);
  sa.sun_family = AF_UNIX;
  memcpy(sa.sun_path, path, plen + 1);

  fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return fm_diag_set(d, FM_EIO, "socket(AF_UNIX) failed: %s", strerror(errno));

  for (;;) {
    if (connect(fd, (const struct sockaddr *)&sa, sizeof sa) == 0) break;
    if (errno == EINTR) continue;
    if (errno == EAGAIN) {
      /* A Unix socket's listen backlog is full: unlike TCP there is no pending connect to
       * poll for, so back off briefly and try again until the deadline. */
      struct timespec nap = {0, 10 * 1000 * 1000};
      if (deadline >= 0 && fm_left_ms(deadline) == 0) {
        err = fm_diag_set(d, FM_ETIMEOUT, "timed out connecting to %s (listen backlog full)", path);
        goto fail;
      }
      nanosleep(&nap, NULL);
      continue;
    }
    if (errno == EINPROGRESS) {
      err = fm_wait(fd, POLLOUT, deadline, "connecting", d);
      if (err) goto fail;
      if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &so_err, &so_len) < 0) so_err = errno;
      if (so_err == 0) break;
      errno = so_err;
    }
    err = fm_diag_set(d, FM_EIO, "cannot connect to %s: %s", path, strerror(errno));
    goto fail;
  }
  *fd_out = fd;
  return FM_OK;

fail:
  close(fd);
  return err;
}

int fm_client_io_send_all(int fd, const void *buf, size_t n, int64_t deadline, fm_diag *d) {
  const char *p = buf;
  while (n > 0) {
    ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
    if (w > 0) {
      p += w;
      n -= (size_t)w;
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      int err = fm_wait(fd, POLLOUT, deadline, "sending a request", d);
      if (err) return err;
      continue;
    }
    if (w < 0 && (errno == EPIPE || errno == ECONNRESET))
      return fm_diag_set(d, FM_ECLOSED, "fusemld closed the connection while we were sending");
    return fm_diag_set(d, FM_EIO, "send failed: %s", w < 0 ? strerror(errno) : "wrote 0 bytes");
  }
  return FM_OK;
}

int fm_client_io_recv_exact(int fd, void *buf, size_t n, int64_t deadline, const char *what, fm_diag *d) {
  char *p = buf;
  size_t got = 0;
  while (got < n) {
    ssize_t r = recv(fd, p + got, n - got, 0);
    if (r > 0) {
      got += (size_t)r;
      continue;
    }
    if (r == 0 || (r < 0 && errno == ECONNRESET)) {
      if (got == 0) return fm_diag_set(d, FM_ECLOSED, "fusemld closed the connection before sending %s", what);
      return fm_diag_set(d, FM_ECLOSED,
                         "fusemld closed the connection in the middle of %s "
                         "(%zu of %zu bytes)",
                         what, got, n);
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      int err = fm_wait(fd, POLLIN, deadline, "waiting for fusemld's reply", d);
      if (err) return err;
      continue;
    }
    return fm_diag_set(d, FM_EIO, "recv failed while reading %s: %s", what, strerror(errno));
  }
  return FM_OK;
}
