/* fm_log.h: the daemon's log: one line per event, "2025-01-31T12:00:00.123Z fusemld[pid] LEVEL: text".
 *
 * Process-wide (there is one log per daemon) and thread-safe: compile workers log too. Each
 * line is formatted first and written with one write(2), so lines from different threads
 * never interleave. Without a log file the lines go to stderr (journald under systemd). */
#ifndef FM_LOG_H
#define FM_LOG_H

#include "fm_error.h"

typedef enum { FM_LOG_ERROR = 0, FM_LOG_WARN = 1, FM_LOG_INFO = 2, FM_LOG_DEBUG = 3 } fm_log_level;

/* "error" | "warn" | "info" | "debug" -> level; FM_EINVAL for anything else. */
int fm_log_parse_level(const char *s, fm_log_level *out);
const char *fm_log_level_name(fm_log_level level);

/* Sets the level and opens path for appending (NULL or "": stderr). FM_EIO with the reason in d. */
int fm_log_open(fm_log_level level, const char *path, fm_diag *d);
/* Reopens the log file (SIGHUP, after logrotate moved it). A failure keeps the old file. */
int fm_log_reopen(fm_diag *d);
/* The fd lines go to (for redirecting stderr into the log file when detaching); -1 if stderr. */
int fm_log_fd(void);
void fm_log_close(void);

int fm_log_enabled(fm_log_level level);
void fm_log_write(fm_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define fm_log_error(...) fm_log_write(FM_LOG_ERROR, __VA_ARGS__)
#define fm_log_warn(...)  fm_log_write(FM_LOG_WARN, __VA_ARGS__)
#define fm_log_info(...)  fm_log_write(FM_LOG_INFO, __VA_ARGS__)
#define fm_log_debug(...)                                                      \
  do {                                                                         \
    if (fm_log_enabled(FM_LOG_DEBUG)) fm_log_write(FM_LOG_DEBUG, __VA_ARGS__); \
  } while (0)

#endif
