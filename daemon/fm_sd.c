/* fm_sd.c: socket activation and sd_notify without libsystemd (the protocols are tiny). */
#include "fm_sd.h"

#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "fm_error.h"

/* Whether the variable holds our pid: systemd's way of addressing one process, where the
 * others its environment reaches (every descendant of a service) must not take it as theirs. */
static int names_us(const char *name) {
  const char *s = getenv(name);
  char *end;
  if (!s || !*s) return 0;
  long pid = strtol(s, &end, 10);
  return !*end && pid == (long)getpid();
}

int fm_sd_under_systemd(void) {
  /* INVOCATION_ID is not asked: every process of a service has it, so a shell, a notebook
   * or a job that systemd started, and the daemon its client autostarts, would all look like
   * the service, and the autostarted one would never detach. SYSTEMD_EXEC_PID (systemd 248+)
   * names the process systemd ran; before it, a Type=notify service is known by
   * NOTIFY_SOCKET alone. */
  if (names_us("LISTEN_PID") || names_us("SYSTEMD_EXEC_PID")) return 1;
  return getenv("NOTIFY_SOCKET") && !getenv("SYSTEMD_EXEC_PID");
}

int fm_sd_listen_fd(void) {
  const char *pid_s = getenv("LISTEN_PID"), *fds_s = getenv("LISTEN_FDS");
  int fd = -1;
  if (pid_s && fds_s) {
    char *end;
    long pid = strtol(pid_s, &end, 10);
    long n = strtol(fds_s, &end, 10);
    /* LISTEN_PID guards against a variable inherited by a child of the activated process. */
    if (pid == (long)getpid() && n >= 1 && n < 64) {
      for (long i = 0; i < n; i++)
        fcntl((int)(FM_SD_LISTEN_FDS_START + i), F_SETFD, FD_CLOEXEC);
      fd = FM_SD_LISTEN_FDS_START;
    }
  }
  unsetenv("LISTEN_PID");
  unsetenv("LISTEN_FDS");
  unsetenv("LISTEN_FDNAMES");
  return fd;
}

int fm_sd_notify(const char *state) {
  const char *path = getenv("NOTIFY_SOCKET");
  if (!path || !*path) return 0;
  size_t plen = strlen(path);
  struct sockaddr_un sa;
  memset(&sa, 0, sizeof sa);
  sa.sun_family = AF_UNIX;
  if ((path[0] != '/' && path[0] != '@') || plen >= sizeof sa.sun_path) return FM_EINVAL;
  memcpy(sa.sun_path, path, plen);
  /* An abstract name is a leading NUL; its length is exact (no terminator counts). */
  if (path[0] == '@') sa.sun_path[0] = '\0';
  socklen_t salen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + plen + (path[0] == '/'));
  int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return FM_EIO;
  ssize_t n;
  do {
    /* Never block the event loop: a receiver whose queue is full (systemd stalled, or a
     * test that stopped reading) loses this one notification instead. */
    n = sendto(fd, state, strlen(state), MSG_NOSIGNAL | MSG_DONTWAIT, (struct sockaddr *)&sa, salen);
  } while (n < 0 && errno == EINTR);
  close(fd);
  return n < 0 ? FM_EIO : 1;
}

uint64_t fm_sd_watchdog_usec(void) {
  const char *usec_s = getenv("WATCHDOG_USEC"), *pid_s = getenv("WATCHDOG_PID");
  uint64_t usec = 0;
  if (usec_s && *usec_s) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(usec_s, &end, 10);
    int ok = !errno && !*end && v > 0;
    /* WATCHDOG_PID guards, like LISTEN_PID, against a variable meant for another process. */
    if (ok && pid_s && *pid_s) ok = strtol(pid_s, &end, 10) == (long)getpid() && !*end;
    if (ok) usec = (uint64_t)v;
  }
  unsetenv("WATCHDOG_USEC");
  unsetenv("WATCHDOG_PID");
  return usec;
}
