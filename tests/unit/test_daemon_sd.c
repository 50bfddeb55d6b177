/* test_daemon_sd.c: sd_notify to real datagram sockets (path and abstract), socket activation
 * and the watchdog interval (through libsystemd, or refused by a build without it). */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "fm_sd.h"
#include "fm_test.h"

static int bind_dgram(const char *name, int abstract) {
  struct sockaddr_un sa;
  memset(&sa, 0, sizeof sa);
  sa.sun_family = AF_UNIX;
  size_t n = strlen(name);
  memcpy(sa.sun_path + (abstract ? 1 : 0), name, n);
  /* +1: the path's NUL terminator, or the abstract name's leading NUL. */
  socklen_t len = (socklen_t)(sizeof sa.sun_family + n + 1);
  int fd = socket(AF_UNIX, SOCK_DGRAM, 0);
  if (fd < 0 || bind(fd, (struct sockaddr *)&sa, len) != 0) return -1;
  return fd;
}

static void recv_text(int fd, char *out, size_t cap) {
  ssize_t n = recv(fd, out, cap - 1, MSG_DONTWAIT);
  out[n > 0 ? n : 0] = '\0';
}

static void test_notify_unset(void) {
  unsetenv("NOTIFY_SOCKET");
  CHECK_EQ_INT(fm_sd_notify("READY=1"), 0);
}

static void test_notify_path(void) {
  char path[108], got[128];
  snprintf(path, sizeof path, "/tmp/fm-test-notify-%ld", (long)getpid());
  unlink(path);
  int fd = bind_dgram(path, 0);
  CHECK(fd >= 0);
  setenv("NOTIFY_SOCKET", path, 1);
  CHECK_EQ_INT(fm_sd_notify("READY=1\nSTATUS=serving"), 1);
  recv_text(fd, got, sizeof got);
  CHECK(strcmp(got, "READY=1\nSTATUS=serving") == 0);
  close(fd);
  unlink(path);
  unsetenv("NOTIFY_SOCKET");
}

static void test_notify_abstract(void) {
  char name[64], env[80], got[128];
  snprintf(name, sizeof name, "fm-test-notify-%ld", (long)getpid());
  int fd = bind_dgram(name, 1);
  CHECK(fd >= 0);
  snprintf(env, sizeof env, "@%s", name);
  setenv("NOTIFY_SOCKET", env, 1);
  CHECK_EQ_INT(fm_sd_notify("STOPPING=1"), 1);
  recv_text(fd, got, sizeof got);
  CHECK(strcmp(got, "STOPPING=1") == 0);
  close(fd);
  setenv("NOTIFY_SOCKET", "relative/path", 1);
  CHECK(fm_sd_notify("READY=1") < 0);
  unsetenv("NOTIFY_SOCKET");
}

static void test_listen_fds(void) {
  char pid[32];
  int fd = 0;
  fm_diag d = {{0}};
  unsetenv("INVOCATION_ID");
  unsetenv("NOTIFY_SOCKET");
  snprintf(pid, sizeof pid, "%ld", (long)getpid() + 1);
  setenv("LISTEN_PID", pid, 1);
  setenv("LISTEN_FDS", "1", 1);
  CHECK(!fm_sd_under_systemd()); /* another process's socket: not ours to serve as systemd's */
  /* Meant for another process (inherited): ignored, and cleared, in every build. */
  CHECK_EQ_INT(fm_sd_listen_fd(&fd, &d), FM_OK);
  CHECK_EQ_INT(fd, -1);
  CHECK(getenv("LISTEN_PID") == NULL && getenv("LISTEN_FDS") == NULL);
  CHECK(!fm_sd_under_systemd());
  snprintf(pid, sizeof pid, "%ld", (long)getpid());
  setenv("LISTEN_PID", pid, 1);
  setenv("LISTEN_FDS", "1", 1);
  setenv("LISTEN_FDNAMES", "fusemld.socket", 1);
  /* As systemd passes it: a listening socket at fd 3, close-on-exec cleared. */
  int lfd = socket(AF_UNIX, SOCK_STREAM, 0);
  CHECK(lfd >= 0 && dup2(lfd, FM_SD_LISTEN_FDS_START) == FM_SD_LISTEN_FDS_START);
  if (lfd != FM_SD_LISTEN_FDS_START) close(lfd);
#if FM_HAVE_LIBSYSTEMD
  CHECK_EQ_INT(fm_sd_listen_fd(&fd, &d), FM_OK);
  CHECK_EQ_INT(fd, FM_SD_LISTEN_FDS_START);
  CHECK(fcntl(FM_SD_LISTEN_FDS_START, F_GETFD) & FD_CLOEXEC); /* the daemon's children never hold it */
#else
  CHECK_EQ_INT(fm_sd_listen_fd(&fd, &d), FM_EUNSUPPORTED);
  CHECK_STR_CONTAINS(d.text, "built without libsystemd");
#endif
  CHECK(getenv("LISTEN_PID") == NULL && getenv("LISTEN_FDS") == NULL && getenv("LISTEN_FDNAMES") == NULL);
  CHECK_EQ_INT(fm_sd_listen_fd(&fd, &d), FM_OK); /* asked again: nothing passed any more */
  CHECK_EQ_INT(fd, -1);
  close(FM_SD_LISTEN_FDS_START);
}

/* WATCHDOG_USEC is ours unless WATCHDOG_PID names another process; both are cleared. */
static void test_watchdog(void) {
  char me[32], other[32];
  snprintf(me, sizeof me, "%ld", (long)getpid());
  snprintf(other, sizeof other, "%ld", (long)getpid() + 1);
  static const struct {
    const char *usec, *pid;
    uint64_t want; /* with libsystemd */
  } cases[] = {
      {NULL, NULL, 0},        {"400000", NULL, 400000}, {"400000", "me", 400000},
      {"400000", "other", 0}, {"junk", NULL, 0},        {"0", NULL, 0},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    uint64_t usec = 1;
    fm_diag d = {{0}};
    const char *pid = cases[i].pid ? (strcmp(cases[i].pid, "me") == 0 ? me : other) : NULL;
    if (cases[i].usec)
      setenv("WATCHDOG_USEC", cases[i].usec, 1);
    else
      unsetenv("WATCHDOG_USEC");
    if (pid)
      setenv("WATCHDOG_PID", pid, 1);
    else
      unsetenv("WATCHDOG_PID");
    int err = fm_sd_watchdog_usec(&usec, &d);
#if FM_HAVE_LIBSYSTEMD
    int ok = err == FM_OK && usec == cases[i].want;
#else
    int meant_for_us = cases[i].usec && (!pid || pid == me);
    int ok = usec == 0 && err == (meant_for_us ? FM_EUNSUPPORTED : FM_OK);
#endif
    if (!ok || getenv("WATCHDOG_USEC") || getenv("WATCHDOG_PID")) {
      fprintf(stderr, "  case %zu: err %d, usec %llu (%s)\n", i, err, (unsigned long long)usec, d.text);
      CHECK(0);
    }
  }
}

/* Which environments make us the process systemd started (never detaching) and which are
 * only inherited from one: a job that systemd ran, and a daemon its client starts, carry
 * INVOCATION_ID and must detach as anywhere else. */
static void test_under_systemd(void) {
  char me[32], other[32];
  snprintf(me, sizeof me, "%ld", (long)getpid());
  snprintf(other, sizeof other, "%ld", (long)getpid() + 1);
  const char *vars[] = {"INVOCATION_ID", "NOTIFY_SOCKET", "LISTEN_PID", "SYSTEMD_EXEC_PID"};
  static const struct {
    const char *invocation, *notify, *listen_pid, *exec_pid;
    int under;
  } cases[] = {
      {NULL, NULL, NULL, NULL, 0},
      {"0123abcd", NULL, NULL, NULL, 0}, /* any descendant of a service */
      {"0123abcd", NULL, NULL, "other", 0},
      {"0123abcd", "/run/notify", NULL, "other", 0}, /* a child of a Type=notify service */
      {"0123abcd", NULL, NULL, "me", 1},             /* the service itself (systemd 248+) */
      {"0123abcd", "/run/notify", NULL, NULL, 1},    /* a Type=notify service, older systemd */
      {NULL, NULL, "me", NULL, 1},                   /* socket-activated */
      {NULL, NULL, "other", NULL, 0},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const char *values[] = {cases[i].invocation, cases[i].notify, cases[i].listen_pid, cases[i].exec_pid};
    for (size_t v = 0; v < 4; v++) {
      const char *val = values[v];
      if (val && strcmp(val, "me") == 0) val = me;
      if (val && strcmp(val, "other") == 0) val = other;
      if (val)
        setenv(vars[v], val, 1);
      else
        unsetenv(vars[v]);
    }
    if (fm_sd_under_systemd() != cases[i].under) {
      fprintf(stderr, "case %zu: fm_sd_under_systemd() != %d\n", i, cases[i].under);
      CHECK(0);
    }
  }
  for (size_t v = 0; v < 4; v++) unsetenv(vars[v]);
}

int main(void) {
  RUN(test_under_systemd);
  RUN(test_notify_unset);
  RUN(test_notify_path);
  RUN(test_notify_abstract);
  RUN(test_listen_fds);
  RUN(test_watchdog);
  return FM_TEST_DONE();
}
