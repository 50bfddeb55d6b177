/* fm_sd_none.c: a build without libsystemd: no socket activation and no watchdog. A daemon
 * that systemd starts with either refuses to start, saying why: serving on a socket of its
 * own would leave systemd's unanswered, and a watchdog never pinged kills the service. */
#include <stdlib.h>

#include "fm_sd.h"

#define REBUILD "rebuild fusemld with libsystemd (apt-get install libsystemd-dev; scripts/setup does)"

int fm_sd_listen_fd(int *fd, fm_diag *d) {
  int passed = fm_sd_names_us("LISTEN_PID") && getenv("LISTEN_FDS");
  unsetenv("LISTEN_PID");
  unsetenv("LISTEN_FDS");
  unsetenv("LISTEN_FDNAMES");
  *fd = -1;
  if (passed)
    return fm_diag_set(d, FM_EUNSUPPORTED,
                       "systemd passed a listening socket (LISTEN_FDS), but this fusemld was "
                       "built without libsystemd: no socket activation; " REBUILD);
  return FM_OK;
}

int fm_sd_watchdog_usec(uint64_t *usec, fm_diag *d) {
  int asked = getenv("WATCHDOG_USEC") && (!getenv("WATCHDOG_PID") || fm_sd_names_us("WATCHDOG_PID"));
  unsetenv("WATCHDOG_USEC");
  unsetenv("WATCHDOG_PID");
  *usec = 0;
  if (asked)
    return fm_diag_set(d, FM_EUNSUPPORTED,
                       "systemd asks for a watchdog (WATCHDOG_USEC), but this fusemld was "
                       "built without libsystemd: no watchdog; " REBUILD);
  return FM_OK;
}
