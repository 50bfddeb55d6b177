/* e2e_store_location.c: where the daemon keeps its kernels (RELIABILITY.md section 3).
 *  - a new database file (and its -wal, -shm) is created 0600 whatever the umask;
 *  - a database on a read-only location does not stop the daemon: it starts, warns once and
 *    serves, keeping kernels in memory only (a hit while it runs, nothing written there).
 *    Made read-only by a read-only bind mount in a private mount namespace (a user namespace
 *    when not root), else, when not root, by a directory of mode 0555; skipped, with a line
 *    saying why, where neither works (root without namespaces: chmod does not stop root).
 * usage: e2e_store_location <fusemld> */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "e2e_util.h"
#include "fm_test.h"

#define SKIPPED 77

static const char *exe;

static int count_in_log(const e2e_daemon *d, const char *text) {
  char *log = e2e_slurp(d->log, NULL);
  int n = 0;
  for (const char *p = log; p && (p = strstr(p, text)); p += strlen(text)) n++;
  free(log);
  return n;
}

static void test_db_created_0600(void) {
  e2e_daemon d;
  CHECK_EQ_INT(e2e_setup(&d, exe), 0);
  mode_t old = umask(022); /* SQLite alone would create 0644 under it */
  CHECK_EQ_INT(e2e_start(&d, NULL), 0);
  umask(old);
  int fd = e2e_connect(d.sock);
  char origin[16];
  CHECK(fd >= 0 && e2e_hello(fd) == 0);
  CHECK_EQ_INT(e2e_compile(fd, 1, 0.25, 2, origin, NULL), 0); /* something written */
  close(fd);
  const char *suffix[] = {"", "-wal", "-shm"};
  for (int i = 0; i < 3; i++) {
    char path[400];
    struct stat st;
    snprintf(path, sizeof path, "%s%s", d.db, suffix[i]);
    if (stat(path, &st) != 0) {
      CHECK(i > 0); /* the database itself must exist */
      continue;
    }
    printf("  %s: mode %04o\n", path, (unsigned)(st.st_mode & 07777));
    CHECK_EQ_INT(st.st_mode & 0777, 0600);
  }
  e2e_teardown(&d, fm_test_failed_checks_ > 0);
}

/* Makes dir read-only for the daemon: 0 done (how in *how), SKIPPED with why. Call
 * e2e_private_mounts first (its failure in ns_why). */
static int make_read_only(const char *dir, const char *ns_why, const char **how, char *why, size_t cap) {
  if (!ns_why[0]) {
    if (mount(dir, dir, NULL, MS_BIND, NULL) == 0 &&
        mount(NULL, dir, NULL, MS_REMOUNT | MS_BIND | MS_RDONLY, NULL) == 0) {
      *how = "read-only bind mount";
      return 0;
    }
    snprintf(why, cap, "read-only bind mount of %s: %s", dir, strerror(errno));
  } else {
    snprintf(why, cap, "%s", ns_why);
  }
  if (geteuid() != 0 && chmod(dir, 0555) == 0) {
    *how = "directory of mode 0555";
    return 0;
  }
  snprintf(why + strlen(why), cap - strlen(why), "; and chmod does not stop root");
  return SKIPPED;
}

/* The daemon on d.db, whose directory is read-only: it starts, warns once, serves from memory. */
static void check_served_from_memory(e2e_daemon *d) {
  CHECK_EQ_INT(e2e_start(d, NULL), 0);
  CHECK_EQ_INT(count_in_log(d, "WARN: kernel store"), 1);
  CHECK_EQ_INT(count_in_log(d, "is on a read-only location"), 1);
  int fd = e2e_connect(d->sock);
  char origin[16];
  CHECK(fd >= 0 && e2e_hello(fd) == 0);
  CHECK_EQ_INT(e2e_compile(fd, 1, 0.5, 2, origin, NULL), 0);
  CHECK(strcmp(origin, "compiled") == 0);
  CHECK_EQ_INT(e2e_compile(fd, 2, 0.5, 2, origin, NULL), 0);
  CHECK(strcmp(origin, "hit") == 0); /* kept in memory while it runs */
  CHECK_EQ_INT(e2e_stat(fd, "stats", "store_errors"), 0);
  close(fd);
  /* Still that one warning: no store error per compile (as on a full disk). */
  CHECK_EQ_INT(count_in_log(d, "WARN: kernel store"), 1);
  CHECK_EQ_INT(count_in_log(d, "ERROR"), 0);
  int st = e2e_stop(d, SIGTERM, 20000);
  CHECK(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

/* In a child: the namespace is its own. Exit status: failed checks, or SKIPPED. Two read-only
 * directories: an empty one (no database yet) and one holding a database written before. */
static int read_only_child(void) {
  e2e_daemon fresh, old;
  if (e2e_setup(&fresh, exe) != 0 || e2e_setup(&old, exe) != 0) return 1;
  char ns_why[256] = "", why[600] = "";
  const char *how = "";
  char origin[16];
  if (e2e_private_mounts(ns_why, sizeof ns_why) != 0 && !ns_why[0]) snprintf(ns_why, sizeof ns_why, "?");
  /* old: a database with one entry in it, written while the directory was writable */
  CHECK_EQ_INT(e2e_start(&old, NULL), 0);
  int fd = e2e_connect(old.sock);
  CHECK(fd >= 0 && e2e_hello(fd) == 0);
  CHECK_EQ_INT(e2e_compile(fd, 1, 9.0, 2, origin, NULL), 0);
  close(fd);
  CHECK_EQ_INT(e2e_stop(&old, SIGTERM, 20000), 0);
  struct stat before, after;
  CHECK_EQ_INT(stat(old.db, &before), 0);

  int skipped = 0;
  e2e_daemon *ds[2] = {&fresh, &old};
  for (int i = 0; i < 2 && !skipped; i++) {
    if (make_read_only(ds[i]->dir, ns_why, &how, why, sizeof why) != 0) {
      printf("  SKIP read-only location: %s\n", why);
      skipped = 1;
      break;
    }
    /* The socket and log must stay writable: they move to a directory of their own. */
    char run[300];
    snprintf(run, sizeof run, "%s-run", ds[i]->dir);
    mkdir(run, 0700);
    snprintf(ds[i]->sock, sizeof ds[i]->sock, "%s/fusemld.sock", run);
    snprintf(ds[i]->log, sizeof ds[i]->log, "%s/daemon.log", run);
    printf("  read-only location (%s), %s\n", how, i == 0 ? "no database yet" : "a database in it");
    check_served_from_memory(ds[i]);
  }
  if (!skipped) {
    CHECK(access(fresh.db, F_OK) != 0); /* nothing written there */
    CHECK_EQ_INT(stat(old.db, &after), 0);
    CHECK(after.st_size == before.st_size && after.st_mtime == before.st_mtime);
  }
  for (int i = 0; i < 2; i++) {
    char run[300];
    umount2(ds[i]->dir, MNT_DETACH);
    chmod(ds[i]->dir, 0700);
    snprintf(run, sizeof run, "%s-run", ds[i]->dir);
    e2e_teardown(ds[i], fm_test_failed_checks_ > 0);
    unlink(ds[i]->log);
    rmdir(run);
  }
  fflush(stdout);
  return skipped ? SKIPPED : fm_test_failed_checks_ > 0;
}

static void test_read_only_location(void) {
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) _exit(read_only_child());
  int st = 0;
  CHECK(pid > 0 && waitpid(pid, &st, 0) == pid);
  CHECK(WIFEXITED(st) && (WEXITSTATUS(st) == 0 || WEXITSTATUS(st) == SKIPPED));
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s <fusemld>\n", argv[0]);
    return 2;
  }
  exe = argv[1];
  RUN(test_db_created_0600);
  RUN(test_read_only_location);
  return FM_TEST_DONE();
}
