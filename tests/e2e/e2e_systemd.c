/* e2e_systemd.c: fusemld under a stand-in for systemd's notify protocol (RELIABILITY.md
 * section 6). The test owns a datagram socket, passes it as NOTIFY_SOCKET with WATCHDOG_USEC
 * set, and asserts: READY=1 once serving, WATCHDOG=1 pings at half the interval (never a gap
 * near the full interval, even while compiles run), STOPPING=1 on SIGTERM and a clean exit.
 * A WATCHDOG_PID naming another process means no pings (the variable was not ours). A notify
 * socket nobody reads (its queue full) never blocks the daemon's loop.
 *
 * usage: e2e_systemd <fusemld> */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "e2e_util.h"
#include "fm_test.h"

#define WATCHDOG_MS 400
#define LISTEN_MS   3000

static const char *exe;

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int notify_socket(const e2e_daemon *d, char *path, size_t cap) {
  struct sockaddr_un sa;
  memset(&sa, 0, sizeof sa);
  sa.sun_family = AF_UNIX;
  snprintf(path, cap, "%s/notify.sock", d->dir);
  size_t n = strlen(path);
  if (n >= sizeof sa.sun_path) return -1; /* the temp dir is short: never truncate */
  memcpy(sa.sun_path, path, n + 1);
  int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
    if (fd >= 0) close(fd);
    return -1;
  }
  return fd;
}

/* One datagram within timeout_ms: its length (text NUL-terminated), or -1. */
static int recv_msg(int fd, char *buf, size_t cap, int timeout_ms) {
  struct pollfd p = {.fd = fd, .events = POLLIN};
  if (poll(&p, 1, timeout_ms) <= 0) return -1;
  ssize_t n = recv(fd, buf, cap - 1, 0);
  if (n < 0) return -1;
  buf[n] = '\0';
  return (int)n;
}

/* Starts fusemld with the notify socket and the watchdog variables (pid_s NULL: no
 * WATCHDOG_PID). */
static int start_notified(e2e_daemon *d, int *nfd, const char *pid_s) {
  char path[400], usec[32];
  if (e2e_setup(d, exe) != 0) return -1;
  *nfd = notify_socket(d, path, sizeof path);
  if (*nfd < 0) return -1;
  const char *ms = getenv("FM_E2E_WATCHDOG_MS"); /* a test's own interval */
  snprintf(usec, sizeof usec, "%d", (ms ? atoi(ms) : WATCHDOG_MS) * 1000);
  setenv("NOTIFY_SOCKET", path, 1);
  setenv("WATCHDOG_USEC", usec, 1);
  if (pid_s) setenv("WATCHDOG_PID", pid_s, 1);
  int rc = e2e_start(d, NULL);
  unsetenv("NOTIFY_SOCKET");
  unsetenv("WATCHDOG_USEC");
  unsetenv("WATCHDOG_PID");
  return rc;
}

static void test_ready_watchdog_stopping(void) {
  e2e_daemon d;
  int nfd = -1;
  CHECK_EQ_INT(start_notified(&d, &nfd, NULL), 0);
  char msg[512];
  /* READY=1 first (e2e_start already saw the socket accept, so it is queued) */
  int ready = 0;
  double t_ready = 0;
  while (!ready && recv_msg(nfd, msg, sizeof msg, 5000) >= 0) {
    ready = strstr(msg, "READY=1") != NULL;
    if (ready) {
      t_ready = now_ms();
      CHECK_STR_CONTAINS(msg, "STATUS=serving");
    }
  }
  CHECK(ready);
  /* Pings for LISTEN_MS, with compiles running on a client meanwhile in a child. */
  pid_t client = fork();
  if (client == 0) {
    int fd = e2e_connect(d.sock);
    char origin[16];
    if (fd < 0 || e2e_hello(fd) != 0) _exit(1);
    for (int i = 0; i < 6; i++)
      if (e2e_compile(fd, 10 + (uint64_t)i, 300.0 + i, 8, origin, NULL) != 0) _exit(1);
    _exit(0);
  }
  int pings = 0, other = 0, st = -1, client_done = 0;
  double last = t_ready, max_gap = 0, first = 0, listened = 0;
  /* Listen for LISTEN_MS and until the client is done (compiles are slow under ASan). */
  while ((listened = now_ms() - t_ready) < LISTEN_MS || !client_done) {
    if (!client_done && waitpid(client, &st, WNOHANG) == client) client_done = 1;
    if (listened > 120000) break;
    if (recv_msg(nfd, msg, sizeof msg, 100) < 0) continue;
    if (strcmp(msg, "WATCHDOG=1") == 0) {
      double t = now_ms();
      if (pings++ == 0)
        first = t - t_ready;
      else if (t - last > max_gap)
        max_gap = t - last;
      last = t;
    } else {
      other++;
      fprintf(stderr, "  unexpected notification: %s\n", msg);
    }
  }
  CHECK(client_done && WIFEXITED(st) && WEXITSTATUS(st) == 0);
  int expected = (int)(listened / (WATCHDOG_MS / 2));
  printf("  WATCHDOG_USEC %d ms: %d pings in %.0f ms (expected %d), first after %.0f ms, largest gap %.0f ms\n",
         WATCHDOG_MS, pings, listened, expected, first, max_gap);
  /* every WATCHDOG_MS / 2; generous bounds for a loaded CI machine */
  CHECK(pings >= expected - 5 && pings <= expected + 2);
  CHECK(max_gap < WATCHDOG_MS * 0.9);
  CHECK_EQ_INT(other, 0);
  CHECK(e2e_log_contains(&d, "systemd watchdog: 400 ms, pinging every 200 ms"));
  /* SIGTERM: STOPPING=1, then a clean exit */
  kill(d.pid, SIGTERM);
  int stopping = 0;
  while (!stopping && recv_msg(nfd, msg, sizeof msg, 5000) >= 0) stopping = strstr(msg, "STOPPING=1") != NULL;
  CHECK(stopping);
  st = e2e_stop(&d, 0, 20000); /* signal 0: only wait for the exit */
  CHECK(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0);
  close(nfd);
  e2e_teardown(&d, fm_test_failed_checks_ > 0);
}

/* WATCHDOG_PID of another process: the watchdog is not ours, nothing is pinged. */
static void test_watchdog_pid_not_ours(void) {
  e2e_daemon d;
  int nfd = -1;
  CHECK_EQ_INT(start_notified(&d, &nfd, "1"), 0);
  char msg[512];
  int ready = 0, pings = 0;
  double t0 = now_ms();
  while (now_ms() - t0 < 1500) {
    if (recv_msg(nfd, msg, sizeof msg, 100) < 0) continue;
    ready |= strstr(msg, "READY=1") != NULL;
    pings += strcmp(msg, "WATCHDOG=1") == 0;
  }
  CHECK(ready);
  CHECK_EQ_INT(pings, 0);
  CHECK(!e2e_log_contains(&d, "systemd watchdog"));
  int st = e2e_stop(&d, SIGTERM, 20000);
  CHECK(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0);
  close(nfd);
  e2e_teardown(&d, fm_test_failed_checks_ > 0);
}

/* Nobody reads the notify socket (a stalled systemd): its queue fills within a second of
 * 10 ms pings, and the daemon must keep serving (notifications are sent without blocking). */
static void test_unread_notify_socket_never_blocks(void) {
  e2e_daemon d;
  int nfd = -1;
  setenv("FM_E2E_WATCHDOG_MS", "20", 1);
  CHECK_EQ_INT(start_notified(&d, &nfd, NULL), 0);
  unsetenv("FM_E2E_WATCHDOG_MS");
  usleep(1500 * 1000);
  int fd = e2e_connect(d.sock);
  double t0 = now_ms();
  CHECK(fd >= 0 && e2e_hello(fd) == 0);
  CHECK(e2e_stat(fd, "session", "requests") >= 1);
  double t = now_ms() - t0;
  printf("  with the notify queue full: hello + stats in %.1f ms\n", t);
  CHECK(t < 1000);
  close(fd);
  int st = e2e_stop(&d, SIGTERM, 20000);
  CHECK(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0);
  close(nfd);
  e2e_teardown(&d, fm_test_failed_checks_ > 0);
}

/* A build without libsystemd asked for a watchdog refuses to start, saying why, rather than be
 * killed for pings it never sends. */
static void test_no_libsystemd_refuses_watchdog(void) {
  e2e_daemon d;
  CHECK_EQ_INT(e2e_setup(&d, exe), 0);
  setenv("WATCHDOG_USEC", "400000", 1);
  int st = e2e_run(&d, NULL, 20000);
  unsetenv("WATCHDOG_USEC");
  CHECK(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) != 0);
  CHECK(e2e_log_contains(&d, "built without libsystemd: no watchdog"));
  e2e_teardown(&d, 0);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s <fusemld>\n", argv[0]);
    return 2;
  }
  exe = argv[1];
  signal(SIGPIPE, SIG_IGN);
  if (FM_HAVE_LIBSYSTEMD) {
    RUN(test_ready_watchdog_stopping);
    RUN(test_watchdog_pid_not_ours);
    RUN(test_unread_notify_socket_never_blocks);
  } else {
    RUN(test_no_libsystemd_refuses_watchdog);
  }
  return FM_TEST_DONE();
}
