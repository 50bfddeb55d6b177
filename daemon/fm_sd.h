/* fm_sd.h: the two pieces of systemd integration fusemld uses, written by hand (no libsystemd):
 *  - socket activation: systemd passes the listening socket as fd 3 with LISTEN_PID/LISTEN_FDS;
 *  - sd_notify: "READY=1", "STATUS=...", "STOPPING=1" as datagrams to $NOTIFY_SOCKET
 *    (a path, or an abstract name written with a leading '@'). */
#ifndef FM_SD_H
#define FM_SD_H

#define FM_SD_LISTEN_FDS_START 3

/* True when started by systemd (then the daemon never forks into the background). Call before
 * fm_sd_listen_fd, which clears LISTEN_PID. */
int fm_sd_under_systemd(void);

/* The first passed listening fd (3) when LISTEN_PID is our pid and LISTEN_FDS >= 1, else -1.
 * Clears LISTEN_PID/LISTEN_FDS/LISTEN_FDNAMES so children do not inherit them, and sets
 * FD_CLOEXEC on the passed fds. */
int fm_sd_listen_fd(void);

/* Sends state (newline-separated assignments) to $NOTIFY_SOCKET. 0 when NOTIFY_SOCKET is unset,
 * 1 when sent, a negative fm_err on failure. */
int fm_sd_notify(const char *state);

#endif
