/* fm_paths.c: default locations (fm_paths.h), following the XDG base directory rules:
 * a variable that is unset, empty or not an absolute path is ignored. */
#include "fm_paths.h"

#include <errno.h>
#include <limits.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *env_abs(const char *name) {
  const char *v = getenv(name);
  return v && v[0] == '/' ? v : NULL;
}

static int os_err(int e) { return (e == EACCES || e == EPERM || e == EROFS) ? FM_EDENIED : FM_EIO; }

static int fmt_path(char *out, size_t cap, fm_diag *d, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int fmt_path(char *out, size_t cap, fm_diag *d, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = out && cap ? vsnprintf(out, cap, fmt, ap) : -1;
  va_end(ap);
  if (n < 0 || (size_t)n >= cap) return fm_diag_set(d, FM_ELIMIT, "path does not fit in %zu bytes", cap);
  return FM_OK;
}

/* $HOME, else the password database (a daemon started without an environment). */
static int home_dir(char *buf, size_t cap, fm_diag *d) {
  const char *h = env_abs("HOME");
  if (h) return fmt_path(buf, cap, d, "%s", h);
  struct passwd pw, *res = NULL;
  char tmp[4096];
  int e = getpwuid_r(getuid(), &pw, tmp, sizeof tmp, &res);
  if (e || !res || !pw.pw_dir || pw.pw_dir[0] != '/')
    return fm_diag_set(d, FM_EINVAL, "no home directory: HOME is unset and uid %u has no entry", (unsigned)getuid());
  return fmt_path(buf, cap, d, "%s", pw.pw_dir);
}

/* st is a socket's directory: whoever owns it can put a socket of their own there (or
 * rename ours away), so it must be ours, or root's where root_ok (/run/fusemld). */
static int check_dir_owner(const char *dir, const struct stat *st, int root_ok, fm_diag *d) {
  if (!S_ISDIR(st->st_mode))
    return fm_diag_set(d, FM_EDENIED, "%s is not a directory (a symlink or a file): refusing it", dir);
  if (st->st_uid != getuid() && !(root_ok && st->st_uid == 0))
    return fm_diag_set(d, FM_EDENIED, "%s is owned by uid %u, not by us (uid %u)%s: refusing it", dir,
                       (unsigned)st->st_uid, (unsigned)getuid(), root_ok ? " or root" : "");
  return FM_OK;
}

/* The /tmp fallback directory must be a real directory that only we can use: another user
 * who created it first could otherwise read our traffic or plant a socket of their own. */
static int check_private_dir(const char *dir, int must_exist, fm_diag *d) {
  struct stat st;
  if (lstat(dir, &st) != 0) {
    if (errno == ENOENT && !must_exist) return FM_OK;
    return fm_diag_set(d, os_err(errno), "%s: %s", dir, strerror(errno));
  }
  int rc = check_dir_owner(dir, &st, 0, d);
  if (rc) return rc;
  if ((st.st_mode & 07777) != 0700)
    return fm_diag_set(d, FM_EDENIED, "%s has mode %04o, it must be 0700: refusing it", dir,
                       (unsigned)(st.st_mode & 07777));
  return FM_OK;
}

int fm_check_socket_dir(const char *socket_path, fm_diag *d) {
  char dir[PATH_MAX];
  int rc = fmt_path(dir, sizeof dir, d, "%s", socket_path ? socket_path : "");
  if (rc) return rc;
  char *slash = strrchr(dir, '/');
  if (!slash)
    snprintf(dir, sizeof dir, ".");
  else if (slash == dir)
    slash[1] = '\0';
  else
    *slash = '\0';
  /* stat, not lstat: the directory as the connect will reach it, through any symlink (a
   * symlinked $XDG_RUNTIME_DIR is judged by where it leads). */
  struct stat st;
  if (stat(dir, &st) != 0) return FM_OK; /* nothing there: connect says so in its own words */
  rc = check_dir_owner(dir, &st, 1, d);
  /* A directory others may write into (/tmp): the socket itself must be ours or root's too. */
  struct stat sock;
  if (!rc && (st.st_mode & (S_IWGRP | S_IWOTH)) && lstat(socket_path, &sock) == 0 && sock.st_uid != getuid() &&
      sock.st_uid != 0)
    rc = fm_diag_set(d, FM_EDENIED,
                     "%s may be written by others and the socket is owned by uid %u, "
                     "not by us (uid %u) or root: refusing it",
                     dir, (unsigned)sock.st_uid, (unsigned)getuid());
  if (rc) {
    fm_diag why = *d;
    return fm_diag_set(d, rc, "the socket %s: %s (another user could have put an impostor there)", socket_path,
                       why.text);
  }
  return FM_OK;
}

int fm_default_socket_path(char *out, size_t cap, int from_env, int create_dirs, fm_diag *d) {
  if (from_env) {
    const char *s = getenv("FUSEML_SOCKET");
    if (s && s[0]) return fmt_path(out, cap, d, "%s", s);
  }
  const char *run = env_abs("XDG_RUNTIME_DIR");
  if (run) return fmt_path(out, cap, d, "%s/fusemld.sock", run);

  char dir[64];
  snprintf(dir, sizeof dir, "/tmp/fusemld-%u", (unsigned)getuid());
  if (create_dirs) {
    if (mkdir(dir, 0700) == 0) {
      /* mkdir's mode is filtered by the umask; make it exactly 0700 */
      if (chmod(dir, 0700) != 0) return fm_diag_set(d, os_err(errno), "chmod %s: %s", dir, strerror(errno));
    } else if (errno != EEXIST) {
      return fm_diag_set(d, os_err(errno), "mkdir %s: %s", dir, strerror(errno));
    }
  }
  int rc = check_private_dir(dir, create_dirs, d);
  if (rc) return rc;
  return fmt_path(out, cap, d, "%s/fusemld.sock", dir);
}

/* base/rel, where base is $var if set, else $HOME/home_rel. */
static int xdg_path(char *out, size_t cap, const char *var, const char *home_rel, const char *rel, fm_diag *d) {
  const char *base = env_abs(var);
  if (base) return fmt_path(out, cap, d, "%s/%s", base, rel);
  char home[PATH_MAX];
  int rc = home_dir(home, sizeof home, d);
  if (rc) return rc;
  return fmt_path(out, cap, d, "%s/%s/%s", home, home_rel, rel);
}

int fm_default_db_path(char *out, size_t cap, int create_dirs, fm_diag *d) {
  int rc = xdg_path(out, cap, "XDG_CACHE_HOME", ".cache", "fusemld/kernels.db", d);
  if (rc || !create_dirs) return rc;
  char dir[PATH_MAX];
  if ((rc = fmt_path(dir, sizeof dir, d, "%s", out))) return rc;
  char *slash = strrchr(dir, '/');
  if (slash) *slash = '\0';
  return fm_mkdirs(dir, 0700, d);
}

int fm_default_config_path(char *out, size_t cap, fm_diag *d) {
  return xdg_path(out, cap, "XDG_CONFIG_HOME", ".config", "fusemld/fusemld.conf", d);
}

/* Creates one directory, accepting one that already exists as a directory. */
static int mkdir_one(const char *path, int mode, fm_diag *d) {
  if (mkdir(path, (mode_t)mode) == 0) return FM_OK;
  int e = errno;
  struct stat st;
  if (e == EEXIST && stat(path, &st) == 0) {
    if (S_ISDIR(st.st_mode)) return FM_OK;
    return fm_diag_set(d, FM_EIO, "mkdir %s: exists and is not a directory", path);
  }
  return fm_diag_set(d, os_err(e), "mkdir %s: %s", path, strerror(e));
}

int fm_mkdirs(const char *path, int mode, fm_diag *d) {
  if (!path || !path[0]) return fm_diag_set(d, FM_EINVAL, "mkdir: empty path");
  char buf[PATH_MAX];
  int rc = fmt_path(buf, sizeof buf, d, "%s", path);
  if (rc) return rc;
  for (char *p = buf + 1; *p; p++) {
    if (*p != '/') continue;
    *p = '\0';
    rc = p[-1] == '/' ? FM_OK : mkdir_one(buf, mode, d); /* "a//b": nothing to create */
    *p = '/';
    if (rc) return rc;
  }
  size_t n = strlen(buf);
  if (buf[n - 1] == '/') return FM_OK;
  return mkdir_one(buf, mode, d);
}
