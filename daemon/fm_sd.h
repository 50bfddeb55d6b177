/* fm_sd.h: the pieces of systemd integration fusemld uses.
 *  - socket activation (LISTEN_PID/LISTEN_FDS, the listening socket as fd 3) and the watchdog
 *    interval (WATCHDOG_USEC/WATCHDOG_PID): libsystemd's sd_listen_fds and
 *    sd_watchdog_enabled (fm_sd_libsystemd.c). Built without libsystemd (pkg-config finds
 *    none, or -DFM_LIBSYSTEMD=OFF), both are unavailable and a daemon that systemd starts
 *    with either refuses to start, saying so (fm_sd_none.c), rather than ignore its socket or
 *    be killed by a watchdog it never pings.
 *  - sd_notify ("READY=1", "STATUS=...", "STOPPING=1", "WATCHDOG=1" as datagrams to
 *    $NOTIFY_SOCKET, a path or an abstract '@' name), in every build (fm_sd.c): libsystemd's
 *    sd_notify blocks while the receiver's queue is full (systemd 252: still blocked after
 *    3 s), which would freeze the event loop, so the datagram is sent here with MSG_DONTWAIT.
 *    systemd documents the protocol as stable for exactly such independent senders. */
#ifndef FM_SD_H
#define FM_SD_H

#include <stdint.h>

#include "fm_error.h"

#define FM_SD_LISTEN_FDS_START 3

/* Whether the environment variable name holds this process's pid. */
int fm_sd_names_us(const char *name);

/* True when this process is the one systemd started (then the daemon never forks into the
 * background): LISTEN_PID or SYSTEMD_EXEC_PID is our pid, or NOTIFY_SOCKET is set where
 * systemd (before 248) sets no SYSTEMD_EXEC_PID. A descendant of a service, which inherits
 * INVOCATION_ID and the rest, is not. Call before fm_sd_listen_fd, which clears LISTEN_PID. */
int fm_sd_under_systemd(void);

/* *fd: the first passed listening fd (3) when LISTEN_PID is our pid and LISTEN_FDS >= 1, else
 * -1. Clears LISTEN_PID/LISTEN_FDS/LISTEN_FDNAMES so children do not inherit them, and sets
 * FD_CLOEXEC on the passed fds. FM_EUNSUPPORTED, saying why, when a socket was passed to a
 * build without libsystemd. */
int fm_sd_listen_fd(int *fd, fm_diag *d);

/* Sends state (newline-separated assignments) to $NOTIFY_SOCKET without blocking (a full
 * receiver queue drops it: FM_EIO). 0 when NOTIFY_SOCKET is unset,
 * 1 when sent, a negative fm_err on failure. */
int fm_sd_notify(const char *state);

/* *usec: the watchdog interval systemd asks for (WatchdogSec= gives WATCHDOG_USEC, and
 * WATCHDOG_PID when set must be our pid), 0 when there is none. Clears both variables so
 * children (the tuner worker) do not inherit them. The daemon pings "WATCHDOG=1" every half
 * interval from its event loop, so a stuck loop is what the watchdog catches.
 * FM_EUNSUPPORTED, saying why, when a build without libsystemd is asked for one. */
int fm_sd_watchdog_usec(uint64_t *usec, fm_diag *d);

#endif
