/* e2e_fulldisk.c: a full disk under the kernel store (RELIABILITY.md section 3). Stores fail
 * with a logged error and a counted store_errors while every compile still gets its kernel
 * (served uncached); when space returns, the daemon stores again without a restart.
 *
 * Two ways to fill the store:
 *  - portable: FM_TEST_DB_MAX_PAGES (a testing-only variable read by the store) caps the
 *    database with PRAGMA max_page_count, so SQLite answers SQLITE_FULL as on a full disk;
 *    space returns with `evict all` (freed pages are reused);
 *  - real: the database lives on a small tmpfs (mounted in a private mount namespace, a user
 *    namespace when not root) filled up by a file the test writes; space returns when the
 *    test deletes that file. Skipped, with a line saying why, where no namespace can be made.
 *
 * usage: e2e_fulldisk <fusemld> */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "e2e_util.h"
#include "fm_msg.h"
#include "fm_test.h"

#define MAX_FILL_COMPILES 400

static const char *exe;

/* Compiles fresh fragments (salts from *salt on) until the session counts a store error.
 * Every reply must be a compiled kernel. Returns the salt whose store failed, or -1. */
static double fill_until_store_error(int fd, double *salt) {
  int64_t errors0 = e2e_stat(fd, "session", "store_errors");
  CHECK(errors0 >= 0);
  for (int i = 0; i < MAX_FILL_COMPILES; i++) {
    char origin[16], key[65];
    double s = (*salt)++;
    if (e2e_compile(fd, 100 + (uint64_t)i, s, 6, origin, key) != 0) {
      fprintf(stderr, "  compile %d refused: %s\n", i, origin);
      CHECK(0);
      return -1;
    }
    CHECK(strcmp(origin, "compiled") == 0);
    if (e2e_stat(fd, "session", "store_errors") > errors0) {
      printf("  store full after %d compiles\n", i + 1);
      return s;
    }
  }
  fprintf(stderr, "  the store never filled up in %d compiles\n", MAX_FILL_COMPILES);
  CHECK(0);
  return -1;
}

/* With the store full: the same fragment again is compiled again (it was not stored) and
 * served; the log says why. */
static void check_served_uncached(e2e_daemon *d, int fd, double failed_salt) {
  char origin[16];
  int64_t errors = e2e_stat(fd, "session", "store_errors");
  CHECK_EQ_INT(e2e_compile(fd, 900, failed_salt, 6, origin, NULL), 0);
  CHECK(strcmp(origin, "compiled") == 0);
  CHECK(e2e_stat(fd, "session", "store_errors") > errors);
  CHECK(e2e_log_contains(d, "serving it uncached"));
  /* hits and everything else keep working */
  CHECK(e2e_stat(fd, "session", "requests") > 0);
}

/* Space is back: a new fragment is stored (its second request is a hit) without new errors. */
static void check_recovered(int fd, double salt) {
  char origin[16];
  int64_t errors = e2e_stat(fd, "session", "store_errors");
  CHECK_EQ_INT(e2e_compile(fd, 950, salt, 6, origin, NULL), 0);
  CHECK(strcmp(origin, "compiled") == 0);
  CHECK_EQ_INT(e2e_compile(fd, 951, salt, 6, origin, NULL), 0);
  CHECK(strcmp(origin, "hit") == 0);
  CHECK_EQ_INT(e2e_stat(fd, "session", "store_errors"), errors);
}

static void test_max_page_count(void) {
  e2e_daemon d;
  CHECK_EQ_INT(e2e_setup(&d, exe), 0);
  /* A fresh store is a handful of pages; 48 leave room for a few entries. */
  setenv("FM_TEST_DB_MAX_PAGES", "48", 1);
  int started = e2e_start(&d, NULL);
  unsetenv("FM_TEST_DB_MAX_PAGES");
  CHECK_EQ_INT(started, 0);
  int fd = e2e_connect(d.sock);
  CHECK(fd >= 0 && e2e_hello(fd) == 0);
  double salt = 1;
  double failed = fill_until_store_error(fd, &salt);
  if (failed >= 0) {
    check_served_uncached(&d, fd, failed);
    CHECK(e2e_log_contains(&d, "full"));
    /* space returns: evict everything, the freed pages are reused */
    e2e_req r;
    e2e_req_begin(&r, "evict", 40, 1);
    fm_pack_cstr(&r.pk, "all");
    msgpack_pack_true(&r.pk);
    CHECK_EQ_INT(e2e_req_send(&r, fd), 0);
    msgpack_zone z;
    msgpack_object o;
    msgpack_zone_init(&z, 4096);
    CHECK(e2e_recv(fd, 10000, &z, &o) == 0 && e2e_is_ok(&o));
    msgpack_zone_destroy(&z);
    check_recovered(fd, salt + 1000);
  }
  close(fd);
  /* a clean shutdown despite the failed stores */
  int st = e2e_stop(&d, SIGTERM, 20000);
  CHECK(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0);
  e2e_teardown(&d, fm_test_failed_checks_ > 0);
}

/* Writes a file until the filesystem is full. */
static long fill_file(const char *path) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd < 0) return -1;
  static char block[4096];
  long total = 0;
  for (;;) {
    ssize_t n = write(fd, block, sizeof block);
    if (n <= 0) break;
    total += n;
  }
  close(fd);
  return total;
}

/* Runs in a child (the namespaces are its own); exit status: failed checks, 77 skipped. */
static int tmpfs_child(void) {
  char why[256];
  if (e2e_private_mounts(why, sizeof why) != 0) {
    printf("  SKIP tmpfs variant: %s\n", why);
    fflush(stdout);
    return 77;
  }
  e2e_daemon d;
  if (e2e_setup(&d, exe) != 0) return 1;
  char fs[300], filler[340];
  snprintf(fs, sizeof fs, "%s/fs", d.dir);
  mkdir(fs, 0700);
  if (mount("fm-fulldisk", fs, "tmpfs", 0, "size=2m,mode=0700") != 0) {
    printf("  SKIP tmpfs variant: mounting a tmpfs: %s\n", strerror(errno));
    fflush(stdout);
    rmdir(fs);
    e2e_teardown(&d, 0);
    return 77;
  }
  snprintf(d.db, sizeof d.db, "%s/kernels.db", fs);
  snprintf(filler, sizeof filler, "%s/filler", fs);
  CHECK_EQ_INT(e2e_start(&d, NULL), 0);
  int fd = e2e_connect(d.sock);
  CHECK(fd >= 0 && e2e_hello(fd) == 0);
  /* One entry stored while there is room, then the disk fills up. */
  char origin[16];
  CHECK_EQ_INT(e2e_compile(fd, 1, 0.5, 6, origin, NULL), 0);
  long filled = fill_file(filler);
  printf("  tmpfs 2 MiB: filler of %ld bytes\n", filled);
  CHECK(filled > 0);
  double salt = 1;
  double failed = fill_until_store_error(fd, &salt);
  if (failed >= 0) {
    check_served_uncached(&d, fd, failed);
    /* what was stored before still hits */
    CHECK_EQ_INT(e2e_compile(fd, 2, 0.5, 6, origin, NULL), 0);
    CHECK(strcmp(origin, "hit") == 0);
    CHECK_EQ_INT(unlink(filler), 0); /* space returns */
    check_recovered(fd, salt + 1000);
  }
  close(fd);
  int st = e2e_stop(&d, SIGTERM, 20000);
  CHECK(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0);
  umount2(fs, MNT_DETACH);
  rmdir(fs);
  e2e_teardown(&d, fm_test_failed_checks_ > 0);
  fflush(stdout);
  return fm_test_failed_checks_ > 0;
}

static void test_tmpfs(void) {
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) _exit(tmpfs_child());
  int st = 0;
  CHECK(pid > 0 && waitpid(pid, &st, 0) == pid);
  CHECK(WIFEXITED(st) && (WEXITSTATUS(st) == 0 || WEXITSTATUS(st) == 77));
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s <fusemld>\n", argv[0]);
    return 2;
  }
  exe = argv[1];
  RUN(test_max_page_count);
  RUN(test_tmpfs);
  return FM_TEST_DONE();
}
