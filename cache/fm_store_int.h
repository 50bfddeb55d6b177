/* fm_store_int.h: what fm_store.c (entries, stats) and fm_store_schema.c (open, integrity,
 * migration) share. Private to cache/: nothing outside this folder includes it. */
#ifndef FM_STORE_INT_H
#define FM_STORE_INT_H

#include <pthread.h>
#include <sqlite3.h>

#include "fm_store.h"

/* The schema version this build writes (PRAGMA user_version); see fm_store.c's grammar. */
#define FM_STORE_SCHEMA_VERSION 2

/* Every statement the store runs, prepared once at open and reused (SQLite parses and plans
 * each only once). The SQL text is in fm_store_schema.c next to the schema it depends on. */
typedef enum {
  FM_ST_BEGIN, /* BEGIN IMMEDIATE */
  FM_ST_COMMIT,
  FM_ST_ROLLBACK,
  FM_ST_PUT,        /* INSERT OR REPLACE one entry */
  FM_ST_STATE,      /* the state of one entry by key + device */
  FM_ST_USAGE,      /* count, total cubin bytes */
  FM_ST_LRU_VICTIM, /* least recently used entry other than ?1 (a rowid) */
  FM_ST_DEL_ROWID,
  FM_ST_GET, /* one entry by key + device, every column */
  FM_ST_TOUCH,
  FM_ST_DEL_KEY_DEV,
  FM_ST_PREFIX, /* keys within [?1, ?2], most recently used first */
  FM_ST_LIST,
  FM_ST_DEL_KEY,
  FM_ST_DEL_ALL,
  FM_ST_STAT_ADD,
  FM_ST_STATS,
  FM_ST__COUNT
} fm_store_stmt_id;

/* Column order of FM_ST_GET: the small fixed-size columns first, so reading them never
 * walks a blob's overflow pages (the table itself is laid out the same way). */
enum {
  FM_COL_KEY,
  FM_COL_DEVICE,
  FM_COL_KIND,
  FM_COL_STATE,
  FM_COL_SIZE,
  FM_COL_CREATED,
  FM_COL_LAST_USED,
  FM_COL_HITS,
  FM_COL_CHECKSUM,
  FM_COL_CANONICAL,
  FM_COL_META,
  FM_COL_SOURCE,
  FM_COL_TIMINGS,
  FM_COL_CUBIN
};

struct fm_store {
  sqlite3 *db; /* one connection, SQLITE_OPEN_FULLMUTEX */
  sqlite3_stmt *st[FM_ST__COUNT];
  /* SQLite serializes single calls; this serializes our multi-statement sequences (a put
   * and its evictions, a get and its touch) and guards st[] and err. */
  pthread_mutex_t mu;
  uint64_t size_cap;
  char err[512]; /* reason for the most recent failure (fm_store_last_error) */
};

/* Records "what: sqlite's message (code)" as the last error; returns FM_ESTORE. */
int fm_store_fail_sqlite(fm_store *s, const char *what);
/* Records a formatted reason as the last error; returns err. */
int fm_store_fail(fm_store *s, int err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* fm_store_schema.c: prepares s->st after the schema is current; finalizes them. */
int fm_store_prepare_all(fm_store *s, fm_diag *d);
void fm_store_finalize_all(fm_store *s);

#endif
