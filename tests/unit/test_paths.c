/* test_paths.c: default socket, database and config paths under different
 * environments, the private /tmp directory check, fm_mkdirs. */
#define _GNU_SOURCE
#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "fm_error.h"
#include "fm_paths.h"
#include "fm_test.h"

static char tmp[256];

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st;
  (void)flag;
  (void)ftw;
  return remove(path);
}

static void rm_rf(const char *path) { nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS); }

static int is_dir_mode(const char *path, unsigned mode) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISDIR(st.st_mode) && (st.st_mode & 07777) == mode;
}

static void test_socket_path_env(void) {
  char out[512], want[512];
  fm_diag d = {{0}};
  setenv("XDG_RUNTIME_DIR", "/run/user/4242", 1);
  setenv("FUSEML_SOCKET", "/srv/custom.sock", 1);
  CHECK_EQ_INT(fm_default_socket_path(out, sizeof out, 1, 0, &d), FM_OK);
  CHECK(strcmp(out, "/srv/custom.sock") == 0);
  CHECK_EQ_INT(fm_default_socket_path(out, sizeof out, 0, 0, &d), FM_OK);
  CHECK(strcmp(out, "/run/user/4242/fusemld.sock") == 0);
  setenv("FUSEML_SOCKET", "", 1); /* empty means unset */
  CHECK_EQ_INT(fm_default_socket_path(out, sizeof out, 1, 0, &d), FM_OK);
  CHECK(strcmp(out, "/run/user/4242/fusemld.sock") == 0);
  unsetenv("FUSEML_SOCKET");
  /* too small a buffer */
  CHECK_EQ_INT(fm_default_socket_path(out, 10, 0, 0, &d), FM_ELIMIT);
  /* a relative XDG_RUNTIME_DIR is invalid per the XDG spec: the /tmp fallback is used */
  setenv("XDG_RUNTIME_DIR", "relative/dir", 1);
  snprintf(want, sizeof want, "/tmp/fusemld-%u", (unsigned)getuid());
  int rc = fm_default_socket_path(out, sizeof out, 0, 0, &d);
  /* the real /tmp directory may or may not exist; if it exists it must be ours */
  CHECK(rc == FM_OK || rc == FM_EDENIED);
  if (rc == FM_OK) CHECK(strncmp(out, want, strlen(want)) == 0 && strstr(out, "/fusemld.sock"));
  unsetenv("XDG_RUNTIME_DIR");
}

/* The /tmp fallback: created 0700, and refused when it is not a private directory. Only
 * exercised when the directory does not exist yet, so a real one is never disturbed. */
static void test_socket_private_tmp_dir(void) {
  char dir[64], out[512];
  fm_diag d = {{0}};
  snprintf(dir, sizeof dir, "/tmp/fusemld-%u", (unsigned)getuid());
  unsetenv("XDG_RUNTIME_DIR");
  struct stat st;
  if (lstat(dir, &st) == 0) {
    printf("     (skipped the creation checks: %s exists)\n", dir);
    return;
  }
  mode_t old = umask(0077 | 0200); /* even with a strange umask the result is 0700 */
  CHECK_EQ_INT(fm_default_socket_path(out, sizeof out, 0, 1, &d), FM_OK);
  umask(old);
  CHECK(is_dir_mode(dir, 0700));
  CHECK(strstr(out, "/fusemld.sock") != NULL);
  /* idempotent */
  CHECK_EQ_INT(fm_default_socket_path(out, sizeof out, 0, 1, &d), FM_OK);

  chmod(dir, 0755);
  CHECK_EQ_INT(fm_default_socket_path(out, sizeof out, 0, 1, &d), FM_EDENIED);
  CHECK_STR_CONTAINS(d.text, "mode 0755");
  CHECK_EQ_INT(fm_default_socket_path(out, sizeof out, 0, 0, &d), FM_EDENIED);
  chmod(dir, 0700);
  if (getuid() == 0) { /* only root can give the directory away */
    CHECK(chown(dir, 1, (gid_t)-1) == 0);
    CHECK_EQ_INT(fm_default_socket_path(out, sizeof out, 0, 1, &d), FM_EDENIED);
    CHECK_STR_CONTAINS(d.text, "owned by uid 1");
    CHECK(chown(dir, 0, (gid_t)-1) == 0);
  }
  if (rmdir(dir) != 0) return; /* someone else started using it meanwhile: leave it */
  /* a symlink planted in its place (even to a 0700 directory of ours) is refused */
  snprintf(out, sizeof out, "%s/real", tmp);
  mkdir(out, 0700);
  CHECK(symlink(out, dir) == 0);
  CHECK_EQ_INT(fm_default_socket_path(out, sizeof out, 0, 1, &d), FM_EDENIED);
  CHECK_STR_CONTAINS(d.text, "not a directory");
  unlink(dir);
}

/* A socket's directory must be ours or root's, judged where a symlink leads. */
static void test_socket_dir_owner(void) {
  char dir[300], sock[340], link[300], lsock[340];
  fm_diag d = {{0}};
  snprintf(dir, sizeof dir, "%s/sockdir", tmp);
  snprintf(sock, sizeof sock, "%s/fusemld.sock", dir);
  snprintf(link, sizeof link, "%s/sockdir-link", tmp);
  snprintf(lsock, sizeof lsock, "%s/fusemld.sock", link);
  CHECK_EQ_INT(fm_check_socket_dir(sock, &d), FM_OK); /* no directory yet: connect will say */
  CHECK_EQ_INT(mkdir(dir, 0755), 0);
  CHECK_EQ_INT(fm_check_socket_dir(sock, &d), FM_OK);            /* ours */
  CHECK_EQ_INT(fm_check_socket_dir("/fusemld.sock", &d), FM_OK); /* root's */
  CHECK_EQ_INT(symlink(dir, link), 0);
  CHECK_EQ_INT(fm_check_socket_dir(lsock, &d), FM_OK); /* a symlink to ours */
  if (getuid() == 0) {                                 /* only root can give the directory away */
    CHECK(chown(dir, 4242, (gid_t)-1) == 0);
    CHECK_EQ_INT(fm_check_socket_dir(sock, &d), FM_EDENIED);
    CHECK_STR_CONTAINS(d.text, "owned by uid 4242");
    CHECK_STR_CONTAINS(d.text, sock);
    CHECK_EQ_INT(fm_check_socket_dir(lsock, &d), FM_EDENIED);
    CHECK_STR_CONTAINS(d.text, "owned by uid 4242");
    CHECK(chown(dir, 0, (gid_t)-1) == 0);
    /* A directory anyone may write (as /tmp): a socket there owned by another user is not. */
    CHECK_EQ_INT(chmod(dir, 01777), 0);
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    CHECK(strlen(sock) < sizeof sa.sun_path);
    memcpy(sa.sun_path, sock, strlen(sock) + 1 < sizeof sa.sun_path ? strlen(sock) + 1 : 0);
    CHECK(fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0);
    CHECK_EQ_INT(fm_check_socket_dir(sock, &d), FM_OK); /* ours */
    CHECK(chown(sock, 4242, (gid_t)-1) == 0);
    CHECK_EQ_INT(fm_check_socket_dir(sock, &d), FM_EDENIED);
    CHECK_STR_CONTAINS(d.text, "socket is owned by uid 4242");
    close(fd);
    unlink(sock);
  }
  unlink(link);
  rmdir(dir);
}

static void test_db_and_config_paths(void) {
  char out[512], want[512], home[300];
  fm_diag d = {{0}};
  setenv("XDG_CACHE_HOME", tmp, 1);
  CHECK_EQ_INT(fm_default_db_path(out, sizeof out, 1, &d), FM_OK);
  snprintf(want, sizeof want, "%s/fusemld/kernels.db", tmp);
  CHECK(strcmp(out, want) == 0);
  snprintf(want, sizeof want, "%s/fusemld", tmp);
  CHECK(is_dir_mode(want, 0700));

  unsetenv("XDG_CACHE_HOME");
  snprintf(home, sizeof home, "%s/home", tmp);
  setenv("HOME", home, 1);
  CHECK_EQ_INT(fm_default_db_path(out, sizeof out, 0, &d), FM_OK);
  snprintf(want, sizeof want, "%s/.cache/fusemld/kernels.db", home);
  CHECK(strcmp(out, want) == 0);
  snprintf(want, sizeof want, "%s/.cache", home);
  CHECK(!is_dir_mode(want, 0700)); /* not created without create_dirs */
  CHECK_EQ_INT(fm_default_db_path(out, sizeof out, 1, &d), FM_OK);
  snprintf(want, sizeof want, "%s/.cache/fusemld", home);
  CHECK(is_dir_mode(want, 0700));
  setenv("XDG_CACHE_HOME", "", 1); /* empty: ignored */
  CHECK_EQ_INT(fm_default_db_path(out, sizeof out, 0, &d), FM_OK);
  CHECK(strncmp(out, home, strlen(home)) == 0);
  unsetenv("XDG_CACHE_HOME");
  CHECK_EQ_INT(fm_default_db_path(out, 20, 0, &d), FM_ELIMIT);

  setenv("XDG_CONFIG_HOME", "/etc/xdg-test", 1);
  CHECK_EQ_INT(fm_default_config_path(out, sizeof out, &d), FM_OK);
  CHECK(strcmp(out, "/etc/xdg-test/fusemld/fusemld.conf") == 0);
  unsetenv("XDG_CONFIG_HOME");
  CHECK_EQ_INT(fm_default_config_path(out, sizeof out, &d), FM_OK);
  snprintf(want, sizeof want, "%s/.config/fusemld/fusemld.conf", home);
  CHECK(strcmp(out, want) == 0);

  /* no HOME: the password database answers */
  unsetenv("HOME");
  CHECK_EQ_INT(fm_default_config_path(out, sizeof out, &d), FM_OK);
  CHECK(out[0] == '/' && strstr(out, "/.config/fusemld/fusemld.conf"));
}

static void test_mkdirs(void) {
  char p[512];
  fm_diag d = {{0}};
  snprintf(p, sizeof p, "%s/a/b//c/", tmp);
  CHECK_EQ_INT(fm_mkdirs(p, 0700, &d), FM_OK);
  snprintf(p, sizeof p, "%s/a/b/c", tmp);
  CHECK(is_dir_mode(p, 0700));
  CHECK_EQ_INT(fm_mkdirs(p, 0700, &d), FM_OK); /* exists: fine */
  snprintf(p, sizeof p, "%s/file", tmp);
  FILE *f = fopen(p, "w");
  CHECK(f != NULL);
  if (f) fclose(f);
  snprintf(p, sizeof p, "%s/file/sub", tmp);
  CHECK(fm_mkdirs(p, 0700, &d) < 0);
  CHECK_STR_CONTAINS(d.text, "file");
  CHECK_EQ_INT(fm_mkdirs("", 0700, &d), FM_EINVAL);
  if (getuid() != 0) { /* root may write anywhere */
    CHECK_EQ_INT(fm_mkdirs("/proc/fusemld-test/x", 0700, &d) < 0, 1);
  }
}

int main(void) {
  snprintf(tmp, sizeof tmp, "/tmp/fm_test_paths.XXXXXX");
  if (!mkdtemp(tmp)) {
    perror("mkdtemp");
    return 1;
  }
  RUN(test_socket_path_env);
  RUN(test_socket_private_tmp_dir);
  RUN(test_socket_dir_owner);
  RUN(test_db_and_config_paths);
  RUN(test_mkdirs);
  rm_rf(tmp);
  return FM_TEST_DONE();
}
