/* fm_connlog.h: connection events, logged without letting a connection storm flood the log.
 *
 * Every event (a connection opened, closed, refused, cut) is counted, and its line is written
 * at debug level. The first event of a kind that an operator must see (a refusal, a client
 * cut off) in each summary interval is written at warn or info as well; the rest of them are
 * only counted. fm_connlog_summary writes the counts as one info line:
 *   "connections in the last 60 s: 1200 opened, 1199 closed; 3 refused busy, 40 closed mid-frame"
 * So at the info level a connection costs no bytes of its own: 100k connections write a
 * handful of lines. Loop thread only. */
#ifndef FM_CONNLOG_H
#define FM_CONNLOG_H

#include <stdint.h>

typedef enum {
  FM_CONN_OPENED,
  FM_CONN_CLOSED,   /* every close, whatever its reason (the reasons below are counted too) */
  FM_CONN_BUSY,     /* refused at max-clients */
  FM_CONN_DENIED,   /* refused by the allow-list */
  FM_CONN_TOOBIG,   /* a frame header over the size limit */
  FM_CONN_MIDFRAME, /* hung up, or stalled, in the middle of a frame */
  FM_CONN_DEADLINE, /* a frame not complete within the frame deadline */
  FM_CONN_IDLE,
  FM_CONN_UNREAD, /* cut off for replies queued unread */
  FM_CONN__EVENTS
} fm_conn_event;

typedef struct fm_connlog {
  uint64_t count[FM_CONN__EVENTS]; /* in this interval */
  uint64_t started_ns;             /* the interval's start (CLOCK_MONOTONIC) */
} fm_connlog;

void fm_connlog_init(fm_connlog *l);
/* Counts e and writes the line (fmt) at the level the rules above give it. */
void fm_connlog_event(fm_connlog *l, fm_conn_event e, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Writes the counts of the interval at info, if anything happened, and starts a new one. */
void fm_connlog_summary(fm_connlog *l);

#endif
