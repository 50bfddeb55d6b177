/* fm_sd_libsystemd.c: socket activation and the watchdog interval through libsystemd. */
#include <systemd/sd-daemon.h>

#include "fm_sd.h"

int fm_sd_listen_fd(int *fd, fm_diag *d) {
  /* LISTEN_PID not ours (inherited by a child of the activated process) reads as none; the
   * variables are cleared either way. */
  int n = sd_listen_fds(1);
  (void)d;
  *fd = n >= 1 ? SD_LISTEN_FDS_START : -1;
  return FM_OK;
}

int fm_sd_watchdog_usec(uint64_t *usec, fm_diag *d) {
  /* WATCHDOG_PID, like LISTEN_PID, guards against a variable meant for another process; an
   * unreadable WATCHDOG_USEC (< 0) is no watchdog, as systemd never writes one. */
  (void)d;
  *usec = 0;
  if (sd_watchdog_enabled(1, usec) <= 0) *usec = 0;
  return FM_OK;
}
