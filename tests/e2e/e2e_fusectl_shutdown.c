/* e2e_fusectl_shutdown.c: `fusectl shutdown` (and `stats --zero`, admin only like it) against
 * real fusemlds (compile-only, no GPU).
 *  - another uid (65534, as in system mode where the socket's group reaches it) is refused
 *    permission_denied for both, the counters stay and the daemon keeps serving (needs root
 *    to be another uid; skipped otherwise);
 *  - the daemon on the socket, and only it, stops: a compile in flight when it was asked is
 *    finished and answered, fusectl returns once the daemon is done, the daemon exits 0, its
 *    socket file is gone, its database passes SQLite's integrity check and holds the compiled
 *    kernel after a restart; a second daemon beside it keeps serving.
 * usage: e2e_fusectl_shutdown <fusemld> <fusectl> */
#define _GNU_SOURCE
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "e2e_util.h"
#include "fm_msg.h"
#include "fm_test.h"

#define NOBODY    65534
#define SLOW_POWS 30 /* chained general pows (cost 32 each: under the 1024 bound): a compile that lasts */

static const char *fusemld, *fusectl;
static e2e_daemon A, B;

/* fusectl --socket sock CMD [ARG]; its output in A.dir/out and A.dir/err. As uid (when not
 * the current one) after dropping to it. Returns the exit code, -1 if killed. */
static int ctl_as(const char *sock, uid_t uid, char **out, char **err, const char *cmd, const char *arg) {
  char out_path[400], err_path[400];
  snprintf(out_path, sizeof out_path, "%s/out", A.dir);
  snprintf(err_path, sizeof err_path, "%s/err", A.dir);
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    int o = open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int e = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (o < 0 || e < 0 || dup2(o, 1) < 0 || dup2(e, 2) < 0) _exit(126);
    if (uid != getuid() && (setgroups(0, NULL) || setgid(uid) || setuid(uid))) _exit(125);
    execl(fusectl, fusectl, "--socket", sock, cmd, arg, (char *)NULL);
    _exit(127);
  }
  int st = -1;
  for (int waited = 0; waited < 90000; waited += 20) {
    if (waitpid(pid, &st, WNOHANG) == pid) break;
    e2e_sleep_ms(20);
    st = -1;
  }
  if (st == -1) {
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
  }
  if (out) *out = e2e_slurp(out_path, NULL);
  if (err) *err = e2e_slurp(err_path, NULL);
  return st != -1 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int answers(const e2e_daemon *d) {
  int fd = e2e_connect_hello(d);
  if (fd >= 0) close(fd);
  return fd >= 0;
}

static void test_other_uid_refused(void) {
  if (geteuid() != 0) {
    printf("  SKIP test_other_uid_refused: needs root to run fusectl as another uid (running as uid %u)\n",
           (unsigned)geteuid());
    return;
  }
  /* As in system mode, where the socket's group reaches it: open the socket to uid 65534. */
  CHECK_EQ_INT(chmod(A.dir, 0755), 0);
  CHECK_EQ_INT(chmod(A.sock, 0666), 0);
  char *out = NULL, *err = NULL, origin[16];
  int fd = e2e_connect_hello(&A);
  CHECK_EQ_INT(e2e_compile(fd, 1, 0.5, 2, origin, NULL), 0); /* a miss to count */
  CHECK_EQ_INT(ctl_as(A.sock, NOBODY, &out, &err, "stats", "--zero"), 1);
  CHECK_STR_CONTAINS(err, "permission_denied");
  free(out), free(err);
  CHECK_EQ_INT(e2e_stat(fd, "stats", "misses"), 1);
  CHECK_EQ_INT(e2e_stat(fd, "session", "misses"), 1);
  CHECK_EQ_INT(ctl_as(A.sock, NOBODY, &out, &err, "shutdown", NULL), 1);
  CHECK_STR_CONTAINS(err, "permission_denied");
  CHECK_STR_CONTAINS(err, "uid 65534");
  free(out), free(err);
  CHECK(e2e_log_contains(&A, "\"shutdown\" refused: uid 65534"));
  CHECK(e2e_log_contains(&A, "\"stats_zero\" refused: uid 65534"));
  CHECK(answers(&A));
  /* Its own uid may zero them. */
  CHECK_EQ_INT(ctl_as(A.sock, getuid(), &out, &err, "stats", "--zero"), 0);
  free(out), free(err);
  CHECK_EQ_INT(e2e_stat(fd, "stats", "misses"), 0);
  CHECK_EQ_INT(e2e_stat(fd, "session", "misses"), 0);
  if (fd >= 0) close(fd);
  CHECK_EQ_INT(chmod(A.sock, 0600), 0);
  CHECK_EQ_INT(chmod(A.dir, 0700), 0);
}

static void test_graceful_stop(void) {
  int fd = e2e_connect_hello(&A), mon = e2e_connect_hello(&A);
  CHECK(fd >= 0 && mon >= 0);
  if (fd < 0 || mon < 0) return;
  e2e_req r;
  e2e_req_begin(&r, "compile", 41, 1);
  fm_pack_cstr(&r.pk, "fragment");
  e2e_pack_pow_chain(&r.pk, 1.375, SLOW_POWS);
  CHECK_EQ_INT(e2e_req_send(&r, fd), 0);
  int64_t inflight = 0;
  for (int i = 0; i < 500 && (inflight = e2e_stat(mon, NULL, "inflight")) < 1; i++) e2e_sleep_ms(10);
  CHECK_EQ_INT(inflight, 1);
  close(mon);

  double t0 = e2e_now_ms();
  char *out = NULL, *err = NULL;
  CHECK_EQ_INT(ctl_as(A.sock, getuid(), &out, &err, "shutdown", NULL), 0);
  printf("  fusectl shutdown returned after %.0f ms (one compile in flight)\n", e2e_now_ms() - t0);
  CHECK_STR_CONTAINS(out, "1 compile(s) in flight");
  CHECK_STR_CONTAINS(out, "has finished");
  free(out), free(err);

  /* The compile that was running was finished and answered. */
  msgpack_zone z;
  msgpack_object o;
  char origin[16] = "", code[32] = "";
  msgpack_zone_init(&z, 65536);
  CHECK_EQ_INT(e2e_recv(fd, 60000, &z, &o), 0);
  e2e_str(&o, "origin", origin, sizeof origin);
  e2e_str(&o, "code", code, sizeof code);
  if (code[0]) printf("  compile answered %s\n", code);
  CHECK(e2e_is_ok(&o) && strcmp(origin, "compiled") == 0);
  msgpack_zone_destroy(&z);
  close(fd);

  int st = e2e_stop(&A, 0, 20000);
  CHECK(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0);
  CHECK(access(A.sock, F_OK) != 0);
  CHECK(e2e_log_contains(&A, "asked to shut down"));
  CHECK(answers(&B)); /* the daemon beside it: untouched */

  sqlite3 *db = NULL;
  sqlite3_stmt *st_check = NULL;
  CHECK_EQ_INT(sqlite3_open_v2(A.db, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
  CHECK_EQ_INT(sqlite3_prepare_v2(db, "PRAGMA integrity_check", -1, &st_check, NULL), SQLITE_OK);
  CHECK_EQ_INT(sqlite3_step(st_check), SQLITE_ROW);
  CHECK_STR_CONTAINS((const char *)sqlite3_column_text(st_check, 0), "ok");
  sqlite3_finalize(st_check);
  sqlite3_close(db);

  CHECK_EQ_INT(e2e_start(&A, NULL), 0);
  int c = e2e_connect_hello(&A);
  CHECK_EQ_INT(e2e_stat(c, NULL, "entries"), geteuid() == 0 ? 2 : 1);
  if (c >= 0) close(c);
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s <fusemld> <fusectl>\n", argv[0]);
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  fusemld = argv[1];
  fusectl = argv[2];
  if (e2e_setup(&A, fusemld) || e2e_setup(&B, fusemld) || e2e_start(&A, NULL) || e2e_start(&B, NULL)) {
    fprintf(stderr, "cannot start fusemld\n");
    e2e_teardown(&A, 1);
    e2e_teardown(&B, 1);
    return 1;
  }
  RUN(test_other_uid_refused);
  RUN(test_graceful_stop);
  char path[400];
  snprintf(path, sizeof path, "%s/out", A.dir);
  unlink(path);
  snprintf(path, sizeof path, "%s/err", A.dir);
  unlink(path);
  e2e_teardown(&A, fm_test_failed_checks_ > 0);
  e2e_teardown(&B, fm_test_failed_checks_ > 0);
  return FM_TEST_DONE();
}
