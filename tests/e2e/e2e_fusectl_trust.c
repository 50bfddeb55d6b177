/* e2e_fusectl_trust.c: what fusectl shows and whom it talks to, against a real fusemld.
 *  - planted control characters (an entry whose kind, device and source carry ESC, BEL, a C1
 *    CSI, invalid UTF-8, written through the store's own API so the entry is otherwise sound)
 *    reach no terminal: `ls`, `show` and `show --source` print them escaped, --json as \u;
 *  - a daemon that refuses the connection (permission_denied) and closes before fusectl has
 *    sent anything: fusectl shows that reply, not a failed write. fusectl is held (ptrace) at
 *    its first send until the daemon has closed, so the order is certain, not a race;
 *  - `export` exits 1 when an entry could not be exported (failed its checksum), after
 *    exporting the others;
 *  - a socket whose directory is owned by another user (directly, or reached through a
 *    symlinked $XDG_RUNTIME_DIR) is refused before connecting (needs root to make such a
 *    directory; skipped otherwise).
 * usage: e2e_fusectl_trust <fusemld> <fusectl> */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ptrace.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "e2e_util.h"
#include "fm_store.h"
#include "fm_test.h"

static const char *fusemld, *fusectl;
static e2e_daemon D;

/* Runs fusectl --socket sock ARGS...; stdout and stderr land in D.dir/out and D.dir/err and
 * are returned (malloc'd) in *out and *err when those are not NULL. Returns the exit code. */
static int ctl_run(const char *sock, char **out, char **err, const char *const *args) {
  const char *argv[16] = {fusectl, "--socket", sock};
  int n = 3;
  for (int i = 0; args[i] && n < 15; i++) argv[n++] = args[i];
  argv[n] = NULL;
  char out_path[400], err_path[400];
  snprintf(out_path, sizeof out_path, "%s/out", D.dir);
  snprintf(err_path, sizeof err_path, "%s/err", D.dir);
  int st = e2e_run_tool(argv, out_path, err_path, 30000);
  if (out) *out = e2e_slurp(out_path, NULL);
  if (err) *err = e2e_slurp(err_path, NULL);
  return st >= 0 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* No byte a terminal acts on: C0 controls but newline and tab, DEL, C1 (as UTF-8), bytes that are
 * never UTF-8. */
static int terminal_safe(const char *s) {
  for (const unsigned char *p = (const unsigned char *)s; p && *p; p++) {
    if ((*p < 0x20 && *p != '\n' && *p != '\t') || *p == 0x7f || *p == 0xff) return 0;
    if (p[0] == 0xc2 && p[1] >= 0x80 && p[1] < 0xa0) return 0;
  }
  return 1;
}

/* ---- planted escapes ---- */

#define HOSTILE_KIND "pw\x1b[31m\xff"
#define HOSTILE_SOURCE                      \
  "int x; /* \x1b]0;owned\x07 */\n\xc2\x9b" \
  "2J\tdone\n"
#define HOSTILE_DEVICE "none/sm_90a\x1b[2J"

static void plant(const char *key_hex, int new_device) {
  fm_store *s = NULL;
  fm_entry meta, e;
  fm_diag d = {{0}};
  CHECK_EQ_INT(fm_store_open(D.db, 0, &s, &d), FM_OK);
  if (!s) return;
  CHECK_EQ_INT(fm_store_find_prefix(s, key_hex, &meta), FM_OK);
  CHECK_EQ_INT(fm_store_get(s, &meta.key, meta.device, 0, &e), FM_OK);
  if (new_device) {
    snprintf(e.device, sizeof e.device, "%s", HOSTILE_DEVICE);
  } else {
    snprintf(e.kind, sizeof e.kind, "%s", HOSTILE_KIND);
    free(e.source);
    e.source = strdup(HOSTILE_SOURCE);
  }
  CHECK_EQ_INT(fm_store_put(s, &e), FM_OK);
  if (new_device) CHECK_EQ_INT(fm_store_evict(s, &meta.key), FM_OK); /* only the planted row */
  if (new_device) CHECK_EQ_INT(fm_store_put(s, &e), FM_OK);
  fm_entry_free(&meta);
  fm_entry_free(&e);
  fm_store_close(s);
}

static void test_planted_escapes(void) {
  char k1[65], k2[65], origin[16];
  int fd = e2e_connect(D.sock);
  CHECK(fd >= 0 && e2e_hello(fd) == 0);
  CHECK_EQ_INT(e2e_compile(fd, 1, 0.5, 2, origin, k1), 0);
  CHECK_EQ_INT(e2e_compile(fd, 2, 0.75, 2, origin, k2), 0);
  close(fd);
  plant(k1, 0);
  plant(k2, 1);

  char *out = NULL, *err = NULL;
  CHECK_EQ_INT(ctl_run(D.sock, &out, &err, (const char *[]){"ls", NULL}), 0);
  CHECK(terminal_safe(out) && terminal_safe(err));
  CHECK_STR_CONTAINS(out, "pw\\x1b[31m\\xff");
  CHECK_STR_CONTAINS(out, "none/sm_90a\\x1b[2J");
  free(out), free(err);

  CHECK_EQ_INT(ctl_run(D.sock, &out, &err, (const char *[]){"show", k1, NULL}), 0);
  CHECK(terminal_safe(out) && terminal_safe(err));
  CHECK_STR_CONTAINS(out, "pw\\x1b[31m\\xff");
  free(out), free(err);

  /* Lines and tabs kept (the file still compiles); the rest escaped. */
  CHECK_EQ_INT(ctl_run(D.sock, &out, &err, (const char *[]){"show", k1, "--source", NULL}), 0);
  CHECK(terminal_safe(out) && terminal_safe(err));
  CHECK_STR_CONTAINS(out, "int x; /* \\x1b]0;owned\\x07 */\n\\u009b2J\tdone\n");
  free(out), free(err);

  CHECK_EQ_INT(ctl_run(D.sock, &out, &err, (const char *[]){"--json", "ls", NULL}), 0);
  CHECK(terminal_safe(out));
  CHECK_STR_CONTAINS(out, "\"pw\\u001b[31m\\ufffd\"");
  CHECK_STR_CONTAINS(out, "none/sm_90a\\u001b[2J");
  free(out), free(err);

  CHECK_EQ_INT(ctl_run(D.sock, &out, &err, (const char *[]){"--json", "show", k1, NULL}), 0);
  CHECK(terminal_safe(out));
  CHECK_STR_CONTAINS(out, "\\u001b]0;owned\\u0007 */\\n\\u009b2J\\tdone");
  free(out), free(err);
}

/* ---- export with a corrupt entry ---- */

static void test_export_skips_corrupt(void) {
  char origin[16], key[65];
  int fd = e2e_connect(D.sock);
  CHECK(fd >= 0 && e2e_hello(fd) == 0);
  CHECK_EQ_INT(e2e_compile(fd, 3, 1.5, 2, origin, key), 0);
  close(fd);
  /* The cubin's bytes zeroed, its length kept: only the checksum can tell. */
  sqlite3 *db = NULL;
  char sql[256];
  snprintf(sql, sizeof sql, "UPDATE kernels SET cubin = zeroblob(length(cubin)) WHERE hex(key) = upper('%s')", key);
  CHECK_EQ_INT(sqlite3_open(D.db, &db), SQLITE_OK);
  sqlite3_busy_timeout(db, 5000);
  CHECK_EQ_INT(sqlite3_exec(db, sql, NULL, NULL, NULL), SQLITE_OK);
  CHECK_EQ_INT(sqlite3_changes(db), 1);
  sqlite3_close(db);

  char snap[400], *out = NULL, *err = NULL;
  snprintf(snap, sizeof snap, "%s/snap.fmx", D.dir);
  CHECK_EQ_INT(ctl_run(D.sock, &out, &err, (const char *[]){"export", snap, NULL}), 1);
  CHECK_STR_CONTAINS(err, "corrupt_entry");
  CHECK_STR_CONTAINS(out, "exported 2 entries"); /* the two sound ones of the test before */
  CHECK_STR_CONTAINS(out, "1 skipped");
  free(out), free(err);
  /* The corrupt entry was dropped when read: the next export is whole, and says so. */
  CHECK_EQ_INT(ctl_run(D.sock, &out, &err, (const char *[]){"export", snap, NULL}), 0);
  free(out), free(err);
}

/* ---- a refusal that comes before our first byte ---- */

/* Stops the traced child at the entry of its first sendto and returns the fd it sends on, or
 * -1 (the child ran to its end or something failed: why says it). */
static int stop_at_first_send(pid_t pid, char *why, size_t cap) {
  int st;
  if (waitpid(pid, &st, 0) != pid || !WIFSTOPPED(st)) return snprintf(why, cap, "no exec stop"), -1;
  if (ptrace(PTRACE_SETOPTIONS, pid, 0, PTRACE_O_TRACESYSGOOD | PTRACE_O_EXITKILL) != 0)
    return snprintf(why, cap, "PTRACE_SETOPTIONS: %s", strerror(errno)), -1;
  int sig = 0;
  for (;;) {
    if (ptrace(PTRACE_SYSCALL, pid, 0, sig) != 0) return snprintf(why, cap, "PTRACE_SYSCALL: %s", strerror(errno)), -1;
    sig = 0;
    if (waitpid(pid, &st, 0) != pid || !WIFSTOPPED(st)) return snprintf(why, cap, "fusectl ended first"), -1;
    if (WSTOPSIG(st) != (SIGTRAP | 0x80)) {
      sig = WSTOPSIG(st) == SIGTRAP ? 0 : WSTOPSIG(st); /* pass real signals on */
      continue;
    }
    struct __ptrace_syscall_info info;
    if (ptrace(PTRACE_GET_SYSCALL_INFO, pid, sizeof info, &info) <= 0)
      return snprintf(why, cap, "PTRACE_GET_SYSCALL_INFO: %s", strerror(errno)), -1;
    if (info.op == PTRACE_SYSCALL_INFO_ENTRY && info.entry.nr == SYS_sendto) return (int)info.entry.args[0];
  }
}

static void test_refusal_shown(void) {
  char list[32];
  snprintf(list, sizeof list, "%u", (unsigned)getuid() + 1);
  const char *extra[] = {"--allow-uid", list, NULL};
  e2e_stop(&D, SIGTERM, 20000);
  CHECK_EQ_INT(e2e_start(&D, extra), 0);

  char err_path[400], why[128] = "";
  snprintf(err_path, sizeof err_path, "%s/err", D.dir);
  pid_t pid = fork();
  if (pid == 0) {
    int fd = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(fd, 2);
    ptrace(PTRACE_TRACEME, 0, 0, 0);
    execl(fusectl, fusectl, "--socket", D.sock, "ping", (char *)NULL);
    _exit(127);
  }
  int target = stop_at_first_send(pid, why, sizeof why);
  if (target >= 0) {
    /* Our copy of fusectl's socket shows when the daemon has answered and closed. */
    int pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
    int sock = pidfd >= 0 ? (int)syscall(SYS_pidfd_getfd, pidfd, target, 0) : -1;
    if (sock >= 0) {
      struct pollfd p = {.fd = sock, .events = POLLRDHUP};
      CHECK(poll(&p, 1, 20000) == 1 && (p.revents & (POLLHUP | POLLRDHUP)));
      close(sock);
    } else {
      snprintf(why, sizeof why, "pidfd_getfd: %s", strerror(errno));
    }
    if (pidfd >= 0) close(pidfd);
    ptrace(PTRACE_DETACH, pid, 0, 0);
  } else {
    kill(pid, SIGKILL);
  }
  int st = 0;
  waitpid(pid, &st, 0);
  if (why[0]) {
    /* No way to hold it: the plain run still must show the reply, whatever the order. */
    printf("  note: fusectl not held at its first send (%s); plain run instead\n", why);
    CHECK_EQ_INT(ctl_run(D.sock, NULL, NULL, (const char *[]){"ping", NULL}), 3);
  } else {
    printf("  fusectl held at its first send until fusemld had refused and closed\n");
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 3);
  }
  char *err = e2e_slurp(err_path, NULL);
  CHECK_STR_CONTAINS(err, "permission_denied");
  CHECK_STR_CONTAINS(err, "is not allowed to use this daemon");
  CHECK(err && !strstr(err, "while we were sending") && !strstr(err, "is fusemld running"));
  free(err);
  e2e_stop(&D, SIGTERM, 20000);
  CHECK_EQ_INT(e2e_start(&D, NULL), 0);
}

/* ---- a socket in someone else's directory ---- */

static void test_foreign_socket_dir(void) {
  if (geteuid() != 0) {
    printf("  SKIP foreign socket directory: making a directory another user owns needs root\n");
    return;
  }
  /* An impostor: a real fusemld, serving from a directory uid 4242 owns. */
  e2e_daemon imp;
  CHECK_EQ_INT(e2e_setup(&imp, fusemld), 0);
  char dir[300], link[300];
  snprintf(dir, sizeof dir, "%s/theirs", imp.dir);
  snprintf(link, sizeof link, "%s/runtime", D.dir);
  CHECK_EQ_INT(mkdir(dir, 0755), 0);
  CHECK_EQ_INT(chown(dir, 4242, 4242), 0);
  snprintf(imp.sock, sizeof imp.sock, "%s/fusemld.sock", dir);
  CHECK_EQ_INT(e2e_start(&imp, NULL), 0);

  char *err = NULL;
  CHECK_EQ_INT(ctl_run(imp.sock, NULL, &err, (const char *[]){"ping", NULL}), 3);
  CHECK_STR_CONTAINS(err, "is owned by uid 4242");
  free(err);
  /* The same through $XDG_RUNTIME_DIR, a symlink to that directory. */
  CHECK_EQ_INT(symlink(dir, link), 0);
  const char *argv[] = {fusectl, "ping", NULL};
  char err_path[400];
  snprintf(err_path, sizeof err_path, "%s/err", D.dir);
  unsetenv("FUSEML_SOCKET");
  setenv("XDG_RUNTIME_DIR", link, 1);
  int st = e2e_run_tool(argv, NULL, err_path, 30000);
  unsetenv("XDG_RUNTIME_DIR");
  CHECK(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 3);
  err = e2e_slurp(err_path, NULL);
  CHECK_STR_CONTAINS(err, "is owned by uid 4242");
  free(err);
  /* Nothing reached the impostor: no hello from fusectl in its log. */
  CHECK(!e2e_log_contains(&imp, "fusectl["));
  CHECK_EQ_INT(e2e_stop(&imp, SIGTERM, 20000), 0);
  unlink(link);
  rmdir(dir);
  e2e_teardown(&imp, fm_test_failed_checks_ > 0);
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s <fusemld> <fusectl>\n", argv[0]);
    return 2;
  }
  fusemld = argv[1];
  fusectl = argv[2];
  if (e2e_setup(&D, fusemld) != 0 || e2e_start(&D, NULL) != 0) {
    fprintf(stderr, "cannot start fusemld\n");
    e2e_teardown(&D, 1);
    return 1;
  }
  RUN(test_planted_escapes);
  RUN(test_export_skips_corrupt);
  RUN(test_refusal_shown);
  RUN(test_foreign_socket_dir);
  const char *ours[] = {"out", "err", "snap.fmx"};
  for (int i = 0; i < 3; i++) {
    char path[400];
    snprintf(path, sizeof path, "%s/%s", D.dir, ours[i]);
    unlink(path);
  }
  e2e_teardown(&D, fm_test_failed_checks_ > 0);
  return FM_TEST_DONE();
}
