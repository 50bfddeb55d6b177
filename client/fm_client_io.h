/* fm_client_io.h: private to libfusemld (not installed): blocking I/O with a deadline on a
 * non-blocking Unix stream socket. Every wait is a poll() bounded by the deadline, so no
 * call can hang past the caller's timeout; EINTR is retried; writes use MSG_NOSIGNAL so a
 * daemon that went away is an FM_ECLOSED return, never a SIGPIPE. */
#ifndef FM_CLIENT_IO_H
#define FM_CLIENT_IO_H

#include <stddef.h>
#include <stdint.h>

#include "fm_error.h"

/* Absolute CLOCK_MONOTONIC deadline in ms for a timeout from now; -1 (never) when
 * timeout_ms <= 0. */
int64_t fm_client_io_deadline(int timeout_ms);

/* Connects a non-blocking, close-on-exec socket to path before the deadline. FM_ELIMIT
 * (path too long for sun_path), FM_EIO (no socket there, refused, ...), FM_ETIMEOUT. */
int fm_client_io_connect(const char *path, int64_t deadline, int *fd_out, fm_diag *d);

/* Writes all n bytes. FM_ECLOSED (peer gone), FM_ETIMEOUT, FM_EIO. */
int fm_client_io_send_all(int fd, const void *buf, size_t n, int64_t deadline, fm_diag *d);

/* Reads exactly n bytes. FM_ECLOSED on end of stream (d says how many of n arrived),
 * FM_ETIMEOUT, FM_EIO. what names the thing being read, for d. */
int fm_client_io_recv_exact(int fd, void *buf, size_t n, int64_t deadline, const char *what, fm_diag *d);

#endif
