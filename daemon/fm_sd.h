/* fm_sd.h: the two pieces of systemd integration fusemld uses, written by hand (no libsystemd):
 *  - socket activation: systemd passes the listening socket as fd 3 with LISTEN_PID/LISTEN_FDS;
 *  - sd_notify: "READY=1", "STATUS=...", "STOPPING=1", "WATCHDOG=1" as datagrams to
 *    $NOTIFY_SOCKET (a path, or an abstract name written with a leading '@'). */
#ifndef FM_SD_H
#define FM_SD_H

#include <stdint.h>

#define FM_SD_LISTEN_FDS_START 3

/* True when this process is the one systemd started (then the daemon never forks into the
 * background): LISTEN_PID or SYSTEMD_EXEC_PID is our pid, or NOTIFY_SOCKET is set where
 * systemd (before 248) sets no SYSTEMD_EXEC_PID. A descendant of a service, which inherits
 * INVOCATION_ID and the rest, is not. Call before fm_sd_listen_fd, which clears LISTEN_PID. */
int fm_sd_under_systemd(void);

/* The first passed listening fd (3) when LISTEN_PID is our pid and LISTEN_FDS >= 1, else -1.
 * Clears LISTEN_PID/LISTEN_FDS/LISTEN_FDNAMES so children do not inherit them, and sets
 * FD_CLOEXEC on the passed fds. */
int fm_sd_listen_fd(void);

/* Sends state (newline-separated assignments) to $NOTIFY_SOCKET without blocking (a full
 * receiver queue drops it: FM_EIO). 0 when NOTIFY_SOCKET is unset,
 * 1 when sent, a negative fm_err on failure. */
int fm_sd_notify(const char *state);

/* The watchdog interval systemd asks for (WatchdogSec= gives WATCHDOG_USEC, and WATCHDOG_PID
 * when set must be our pid), in microseconds; 0 when there is none. Clears both variables so
 * children (the tuner worker) do not inherit them. The daemon pings "WATCHDOG=1" every half
 * interval from its event loop, so a stuck loop is what the watchdog catches. */
uint64_t fm_sd_watchdog_usec(void);

#endif
