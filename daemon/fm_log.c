/* fm_log.c: leveled, timestamped log lines to stderr or a reopenable file. */
#include "fm_log.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
static fm_log_level log_level = FM_LOG_INFO;
static int log_fd = -1; /* -1: stderr */
static char *log_path;  /* NULL: stderr */

static const char *const level_names[] = {"error", "warn", "info", "debug"};
static const char *const level_tags[] = {"ERROR", "WARN", "INFO", "DEBUG"};

int fm_log_parse_level(const char *s, fm_log_level *out) {
  for (int i = 0; i <= FM_LOG_DEBUG; i++) {
    if (strcmp(s, level_names[i]) == 0) {
      *out = (fm_log_level)i;
      return FM_OK;
    }
  }
  return FM_EINVAL;
}

const char *fm_log_level_name(fm_log_level level) {
  return (level >= FM_LOG_ERROR && level <= FM_LOG_DEBUG) ? level_names[level] : "?";
}

static int open_file(const char *path, int *fd, fm_diag *d) {
  *fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0640);
  if (*fd < 0) return fm_diag_set(d, FM_EIO, "cannot open log file %s: %s", path, strerror(errno));
  return FM_OK;
}

int fm_log_open(fm_log_level level, const char *path, fm_diag *d) {
  int fd = -1, err = FM_OK;
  char *copy = NULL;
  if (path && *path) {
    copy = strdup(path);
    if (!copy) return fm_diag_set(d, FM_ENOMEM, "out of memory");
    err = open_file(path, &fd, d);
    if (err) {
      free(copy);
      return err;
    }
  }
  pthread_mutex_lock(&log_mu);
  if (log_fd >= 0) close(log_fd);
  free(log_path);
  log_fd = fd;
  log_path = copy;
  log_level = level;
  pthread_mutex_unlock(&log_mu);
  return FM_OK;
}

int fm_log_reopen(fm_diag *d) {
  int err = FM_OK, fd = -1;
  pthread_mutex_lock(&log_mu);
  if (log_path) {
    err = open_file(log_path, &fd, d);
    if (!err) {
      close(log_fd);
      log_fd = fd;
    }
  }
  pthread_mutex_unlock(&log_mu);
  return err;
}

int fm_log_fd(void) {
  pthread_mutex_lock(&log_mu);
  int fd = log_fd;
  pthread_mutex_unlock(&log_mu);
  return fd;
}

void fm_log_close(void) {
  pthread_mutex_lock(&log_mu);
  if (log_fd >= 0) close(log_fd);
  log_fd = -1;
  free(log_path);
  log_path = NULL;
  pthread_mutex_unlock(&log_mu);
}

int fm_log_enabled(fm_log_level level) {
  /* A racy read is harmless: the level only changes at startup. */
  return level <= log_level;
}

void fm_log_write(fm_log_level level, const char *fmt, ...) {
  if (!fm_log_enabled(level)) return;
  char line[4096];
  struct timeval tv;
  struct tm tm;
  gettimeofday(&tv, NULL);
  gmtime_r(&tv.tv_sec, &tm);
  int n = snprintf(line, sizeof line, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ fusemld[%ld] %s: ", tm.tm_year + 1900,
                   tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, (int)(tv.tv_usec / 1000),
                   (long)getpid(), level_tags[level]);
  if (n < 0) return;
  va_list ap;
  va_start(ap, fmt);
  int m = vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
  va_end(ap);
  size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
  if (len > sizeof line - 2) len = sizeof line - 2; /* truncated: keep the newline */
  line[len++] = '\n';
  pthread_mutex_lock(&log_mu);
  int fd = log_fd >= 0 ? log_fd : STDERR_FILENO;
  /* One write per line; a short write to a full disk loses the rest of the line, which is
   * all a logger can do without blocking the loop. */
  ssize_t w;
  do {
    w = write(fd, line, len);
  } while (w < 0 && errno == EINTR);
  pthread_mutex_unlock(&log_mu);
}
