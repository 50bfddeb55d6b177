/* e2e_idle_exit.c: a daemon that a client started goes away by itself (--exit-when-idle), and
 * one started from inside a systemd service detaches as anywhere else.
 *
 *  - --exit-when-idle 1: a quiet client kept connected for three periods keeps the daemon
 *    serving; once it hangs up, the daemon shuts down cleanly (status 0) and says why.
 *  - without the option, an idle daemon stays up.
 *  - started without --foreground with INVOCATION_ID set (and a SYSTEMD_EXEC_PID naming
 *    another process), as a client inside a systemd service starts it: the command returns 0
 *    while the daemon serves in the background, which then exits once idle.
 *
 * usage: e2e_idle_exit <fusemld> */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "e2e_util.h"
#include "fm_test.h"

static const char *exe;

static int still_running(e2e_daemon *d) {
  int st;
  return waitpid(d->pid, &st, WNOHANG) == 0;
}

static int ping(int fd) {
  e2e_req r;
  e2e_req_begin(&r, "ping", 7, 0);
  if (e2e_req_send(&r, fd) != 0) return -1;
  msgpack_zone zone;
  msgpack_object o;
  msgpack_zone_init(&zone, 1024);
  int rc = e2e_recv(fd, 10000, &zone, &o);
  int ok = rc == 0 && e2e_is_ok(&o);
  msgpack_zone_destroy(&zone);
  return ok ? 0 : -1;
}

static void test_exits_once_idle(void) {
  e2e_daemon d;
  const char *extra[] = {"--exit-when-idle", "1", NULL};
  CHECK(e2e_setup(&d, exe) == 0);
  CHECK(e2e_start(&d, extra) == 0);
  int fd = e2e_connect_hello(&d);
  CHECK(fd >= 0);
  e2e_sleep_ms(3000); /* three idle periods, but a client is connected */
  CHECK(still_running(&d));
  CHECK(ping(fd) == 0);
  close(fd);
  double left = e2e_now_ms();
  int st = e2e_stop(&d, 0, 30000); /* signal 0: only waits (killed, -1, after 30 s) */
  fprintf(stderr, "  exited %.0f ms after its last client left (--exit-when-idle 1)\n", e2e_now_ms() - left);
  CHECK(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0);
  CHECK(e2e_log_contains(&d, "no client and no compile for 1 s (--exit-when-idle): shutting down"));
  CHECK(access(d.sock, F_OK) != 0); /* the socket file went with it */
  e2e_teardown(&d, fm_test_failed_checks_ > 0);
}

static void test_default_stays(void) {
  e2e_daemon d;
  CHECK(e2e_setup(&d, exe) == 0);
  CHECK(e2e_start(&d, NULL) == 0);
  e2e_sleep_ms(2500);
  CHECK(still_running(&d));
  int fd = e2e_connect_hello(&d);
  CHECK(fd >= 0 && ping(fd) == 0);
  if (fd >= 0) close(fd);
  CHECK(!e2e_log_contains(&d, "exit-when-idle"));
  e2e_teardown(&d, fm_test_failed_checks_ > 0);
}

static void test_detaches_inside_a_service(void) {
  e2e_daemon d;
  CHECK(e2e_setup(&d, exe) == 0);
  char other[32];
  snprintf(other, sizeof other, "%ld", (long)getppid());
  setenv("INVOCATION_ID", "0123456789abcdef0123456789abcdef", 1);
  setenv("SYSTEMD_EXEC_PID", other, 1);
  /* Three seconds of grace: the detached daemon must still serve when we connect. */
  const char *argv[] = {exe,           "--socket", d.sock,      "--db",   d.db, "--log-file",       d.log,
                        "--log-level", "debug",    "--no-tune", "--jobs", "1",  "--exit-when-idle", "3",
                        NULL};
  double t0 = e2e_now_ms();
  int st = e2e_run_tool(argv, NULL, NULL, 60000);
  fprintf(stderr, "  under INVOCATION_ID: returned %d after %.0f ms\n", st, e2e_now_ms() - t0);
  unsetenv("INVOCATION_ID");
  unsetenv("SYSTEMD_EXEC_PID");
  /* Returned 0, and the daemon serves on: it went into the background. Staying in the
   * foreground, it would have returned only after its idle exit, with nothing serving. */
  CHECK(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0);
  int fd = e2e_connect_hello(&d);
  CHECK(fd >= 0 && ping(fd) == 0);
  if (fd >= 0) close(fd);
  /* It is not our child: it ends by itself once idle, taking its socket file along. */
  int gone = 0;
  for (int waited = 0; waited <= 30000 && !gone; waited += 50) {
    gone = access(d.sock, F_OK) != 0;
    if (!gone) e2e_sleep_ms(50);
  }
  CHECK(gone);
  CHECK(e2e_log_contains(&d, "(--exit-when-idle): shutting down"));
  e2e_teardown(&d, fm_test_failed_checks_ > 0);
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s <fusemld>\n", argv[0]);
    return 2;
  }
  exe = argv[1];
  signal(SIGPIPE, SIG_IGN);
  /* A user's own config must not leak into the daemons run here. */
  setenv("XDG_CONFIG_HOME", "/nonexistent-fm-e2e", 1);
  RUN(test_exits_once_idle);
  RUN(test_default_stays);
  RUN(test_detaches_inside_a_service);
  return FM_TEST_DONE();
}
