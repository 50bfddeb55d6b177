/* fm_sd.c: what every build has (fm_sd.h): whether systemd started us, and a notify that
 * never blocks. */
#include "fm_sd.h"

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "fm_error.h"

/* systemd's way of addressing one process, where the others its environment reaches (every
 * descendant of a service) must not take it as theirs. */
int fm_sd_names_us(const char *name) {
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
  if (fm_sd_names_us("LISTEN_PID") || fm_sd_names_us("SYSTEMD_EXEC_PID")) return 1;
  return getenv("NOTIFY_SOCKET") && !getenv("SYSTEMD_EXEC_PID");
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
