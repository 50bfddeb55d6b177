/* fm_connlog.c: counted connection events, one summary line per interval. */
#include "fm_connlog.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "fm_log.h"

/* How each event is named in the summary, and the level of its first line in an interval
 * (debug: never more than debug). */
static const struct {
  const char *label;
  fm_log_level first;
} events[FM_CONN__EVENTS] = {
    [FM_CONN_OPENED] = {"opened", FM_LOG_DEBUG},
    [FM_CONN_CLOSED] = {"closed", FM_LOG_DEBUG},
    [FM_CONN_BUSY] = {"refused busy", FM_LOG_WARN},
    [FM_CONN_DENIED] = {"refused by the allow-list", FM_LOG_WARN},
    [FM_CONN_TOOBIG] = {"sent a frame over the size limit", FM_LOG_INFO},
    [FM_CONN_MIDFRAME] = {"closed mid-frame", FM_LOG_INFO},
    [FM_CONN_DEADLINE] = {"cut at the frame deadline", FM_LOG_WARN},
    [FM_CONN_IDLE] = {"closed idle", FM_LOG_DEBUG},
    [FM_CONN_UNREAD] = {"cut for replies queued unread", FM_LOG_WARN},
};

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void fm_connlog_init(fm_connlog *l) {
  memset(l, 0, sizeof *l);
  l->started_ns = now_ns();
}

void fm_connlog_event(fm_connlog *l, fm_conn_event e, const char *fmt, ...) {
  fm_log_level level = l->count[e]++ == 0 ? events[e].first : FM_LOG_DEBUG;
  if (!fm_log_enabled(level)) return;
  char line[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  if (level == FM_LOG_DEBUG)
    fm_log_write(level, "%s", line);
  else
    fm_log_write(level, "%s (more like this are only counted, until the next summary)", line);
}

void fm_connlog_summary(fm_connlog *l) {
  uint64_t any = 0;
  for (int e = 0; e < FM_CONN__EVENTS; e++) any |= l->count[e];
  if (any) {
    char line[1024];
    size_t n = (size_t)snprintf(line, sizeof line, "connections in the last %.0f s: %llu opened, %llu closed",
                                (double)(now_ns() - l->started_ns) / 1e9, (unsigned long long)l->count[FM_CONN_OPENED],
                                (unsigned long long)l->count[FM_CONN_CLOSED]);
    const char *sep = "; ";
    for (int e = FM_CONN_CLOSED + 1; e < FM_CONN__EVENTS && n < sizeof line; e++) {
      if (!l->count[e]) continue;
      n += (size_t)snprintf(line + n, sizeof line - n, "%s%llu %s", sep, (unsigned long long)l->count[e],
                            events[e].label);
      sep = ", ";
    }
    fm_log_info("%s", line);
  }
  fm_connlog_init(l);
}
