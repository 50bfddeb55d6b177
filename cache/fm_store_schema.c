/* fm_store_schema.c: opening the kernel store: integrity check (a damaged file is moved
 * aside, never patched), connection settings, schema migration, statement preparation.
 * The on-disk format itself is described in fm_store.c's header comment. */
#include "fm_store_int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---- schema and migrations ---------------------------------------------------------- */

/* Version 1. Column order matters: SQLite stores a row's columns in declaration order and
 * must walk a blob's overflow pages to reach any column after it, so everything the LRU
 * and list paths read sits before the blobs, and the largest blob (cubin) is last. */
static const char schema_v1[] =
    "CREATE TABLE kernels("
    "  key       BLOB    NOT NULL CHECK (length(key) = 32),"
    "  device    TEXT    NOT NULL,"
    "  kind      TEXT    NOT NULL,"
    "  state     INTEGER NOT NULL,"
    "  size      INTEGER NOT NULL,"
    "  created   INTEGER NOT NULL,"
    "  last_used INTEGER NOT NULL,"
    "  hits      INTEGER NOT NULL DEFAULT 0,"
    "  checksum  BLOB    NOT NULL CHECK (length(checksum) = 32),"
    "  canonical BLOB    NOT NULL,"
    "  meta      BLOB    NOT NULL,"
    "  source    TEXT,"
    "  timings   BLOB,"
    "  cubin     BLOB    NOT NULL,"
    "  PRIMARY KEY (key, device));"
    "CREATE INDEX kernels_lru ON kernels(last_used, created);"
    "CREATE TABLE stats(id INTEGER PRIMARY KEY, value INTEGER NOT NULL);";

static int exec_sql(sqlite3 *db, const char *sql, const char *what, fm_diag *d) {
  char *msg = NULL;
  if (sqlite3_exec(db, sql, NULL, NULL, &msg) == SQLITE_OK) return FM_OK;
  fm_diag_set(d, FM_ESTORE, "%s: %s", what, msg ? msg : sqlite3_errmsg(db));
  sqlite3_free(msg);
  return FM_ESTORE;
}

/* Version 0 is what SQLite creates for a new or empty file: no tables at all. Plain CREATE
 * (not IF NOT EXISTS): a version-0 file holding someone else's "kernels" table must fail
 * loudly here, not be half-adopted. */
static int migrate_0_to_1(sqlite3 *db, fm_diag *d) { return exec_sql(db, schema_v1, "creating schema version 1", d); }

/* Version 2 keeps version 1's tables; only the checksum changed: version 1's covered the
 * canonical fragment, the cubin and the meta, not the key, device, kind, state, source or
 * timings (fm_store.c's grammar has both). Version 1 entries are dropped, not rehashed:
 * their checksum cannot vouch for the fields it never covered (a state edited from untuned
 * to tuned, a row moved under another key), so rehashing them would bless exactly the edits
 * the new checksum exists to catch; and rehashing rewrites every blob through the WAL at
 * startup, more work than rebuilding the entries that are still used, on their first
 * request. The count dropped is reported in d (a notice: FM_OK). */
static int migrate_1_to_2(sqlite3 *db, fm_diag *d) {
  int err = exec_sql(db, "DELETE FROM kernels", "dropping version 1 entries", d);
  sqlite3_int64 n = sqlite3_changes64(db);
  if (err == FM_OK && n > 0)
    fm_diag_set(d, FM_OK,
                "dropped %lld entries written by an older fusemld (their checksum did not cover "
                "state and key); each is rebuilt on its next request",
                (long long)n);
  return err;
}

/* migrations[n] takes the schema from version n to n + 1. */
typedef int (*migration_fn)(sqlite3 *db, fm_diag *d);
static const migration_fn migrations[FM_STORE_SCHEMA_VERSION] = {migrate_0_to_1, migrate_1_to_2};

static int read_user_version(sqlite3 *db, int *v, fm_diag *d) {
  sqlite3_stmt *st = NULL;
  int rc = sqlite3_prepare_v2(db, "PRAGMA user_version", -1, &st, NULL);
  if (rc == SQLITE_OK && (rc = sqlite3_step(st)) == SQLITE_ROW) {
    *v = sqlite3_column_int(st, 0);
    sqlite3_finalize(st);
    return FM_OK;
  }
  fm_diag_set(d, FM_ESTORE, "reading the schema version: %s", sqlite3_errmsg(db));
  sqlite3_finalize(st);
  return FM_ESTORE;
}

static int refuse_newer(const char *path, int v, fm_diag *d) {
  return fm_diag_set(d, FM_ESTORE,
                     "%s has schema version %d but this fusemld knows only up to %d; "
                     "refusing to modify it (run a newer fusemld or use another database path)",
                     path, v, FM_STORE_SCHEMA_VERSION);
}

/* One transaction per step, so a crash mid-migration leaves a consistent older version
 * that the next open migrates again. The version is re-read under the write lock because
 * another process may have migrated the same file meanwhile. */
static int migrate(sqlite3 *db, const char *path, fm_diag *d) {
  for (;;) {
    int v = 0, err;
    if ((err = exec_sql(db, "BEGIN IMMEDIATE", "starting a migration", d)) != FM_OK) return err;
    if ((err = read_user_version(db, &v, d)) != FM_OK) goto rollback;
    if (v > FM_STORE_SCHEMA_VERSION || v < 0) {
      err = refuse_newer(path, v, d);
      goto rollback;
    }
    if (v == FM_STORE_SCHEMA_VERSION) return exec_sql(db, "COMMIT", "finishing the schema check", d);
    if ((err = migrations[v](db, d)) != FM_OK) goto rollback;
    char sql[64];
    snprintf(sql, sizeof sql, "PRAGMA user_version = %d", v + 1);
    if ((err = exec_sql(db, sql, "recording the schema version", d)) != FM_OK) goto rollback;
    if ((err = exec_sql(db, "COMMIT", "committing a migration", d)) != FM_OK) goto rollback;
    continue;
  rollback:
    sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
    return err;
  }
}

/* ---- integrity ---------------------------------------------------------------------- */

enum { CHECK_OK, CHECK_DAMAGED, CHECK_FAILED };

/* quick_check (the O(size) subset of integrity_check that skips index/table agreement).
 * Only "not a database" and "corrupt" count as damage: BUSY, IOERR, NOMEM and the like are
 * someone else's problem and must never get a good file renamed away. */
static int check_integrity(sqlite3 *db, char *why, size_t cap) {
  sqlite3_stmt *st = NULL;
  int rc = sqlite3_prepare_v2(db, "PRAGMA quick_check", -1, &st, NULL);
  int verdict = CHECK_OK;
  why[0] = '\0';
  while (rc == SQLITE_OK && (rc = sqlite3_step(st)) == SQLITE_ROW) {
    const char *row = (const char *)sqlite3_column_text(st, 0);
    if (!row || strcmp(row, "ok") != 0) {
      if (verdict == CHECK_OK) snprintf(why, cap, "quick_check: %s", row ? row : "(null)");
      verdict = CHECK_DAMAGED;
    }
    rc = SQLITE_OK; /* next row */
  }
  if (rc != SQLITE_OK && rc != SQLITE_DONE) {
    int primary = sqlite3_errcode(db) & 0xff;
    snprintf(why, cap, "%s", sqlite3_errmsg(db));
    verdict = (primary == SQLITE_NOTADB || primary == SQLITE_CORRUPT) ? CHECK_DAMAGED : CHECK_FAILED;
  }
  sqlite3_finalize(st);
  return verdict;
}

static void remove_sidecar(const char *path, const char *suffix) {
  char name[4096];
  if ((size_t)snprintf(name, sizeof name, "%s%s", path, suffix) >= sizeof name) return;
  unlink(name); /* ENOENT is the usual case; anything else surfaces at the reopen */
}

/* Renames path to path.corrupt-<unix time> (suffixed -N if that name is taken) and drops
 * its -wal/-shm, which belong to the damaged file and would be replayed into the new one. */
static int move_aside(const char *path, const char *why, fm_diag *d) {
  char dest[4096];
  long long now = (long long)time(NULL);
  for (int n = 0;; n++) {
    size_t len = n == 0 ? (size_t)snprintf(dest, sizeof dest, "%s.corrupt-%lld", path, now)
                        : (size_t)snprintf(dest, sizeof dest, "%s.corrupt-%lld-%d", path, now, n);
    if (len >= sizeof dest) return fm_diag_set(d, FM_ESTORE, "path too long: %s", path);
    if (access(dest, F_OK) != 0) break;
    if (n == 100) return fm_diag_set(d, FM_ESTORE, "cannot find a free name for %s", dest);
  }
  if (rename(path, dest) != 0)
    return fm_diag_set(d, FM_ESTORE, "%s is damaged (%s) and could not be moved to %s: %s", path, why, dest,
                       strerror(errno));
  remove_sidecar(path, "-wal");
  remove_sidecar(path, "-shm");
  fm_diag_set(d, FM_OK, "kernel store %s was damaged (%s); moved it to %s and started an empty one", path, why, dest);
  return FM_OK;
}

/* ---- open --------------------------------------------------------------------------- */

/* The caller creates the directory; say so when it did not, rather than SQLite's bare
 * "unable to open database file". */
static int parent_missing(const char *path) {
  char dir[4096];
  if ((size_t)snprintf(dir, sizeof dir, "%s", path) >= sizeof dir) return 0;
  char *slash = strrchr(dir, '/');
  if (!slash) return 0;
  if (slash == dir)
    slash[1] = '\0';
  else
    *slash = '\0';
  struct stat sb;
  return stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode);
}

static int open_connection(const char *path, sqlite3 **db, fm_diag *d) {
  /* A new file is created 0600 here rather than by SQLite (0644 less the umask): the kernels
   * and sources are the user's alone. SQLite gives the -wal and -shm files the same mode. */
  if (strcmp(path, FM_STORE_MEMORY) != 0) {
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd >= 0) close(fd);
  }
  int rc = sqlite3_open_v2(path, db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX, NULL);
  if (rc != SQLITE_OK) {
    fm_diag_set(d, FM_ESTORE, "cannot open kernel store %s: %s%s", path, *db ? sqlite3_errmsg(*db) : sqlite3_errstr(rc),
                parent_missing(path) ? " (its directory does not exist)" : "");
    sqlite3_close(*db);
    *db = NULL;
    return FM_ESTORE;
  }
  /* Other processes (a second daemon, fusectl on the file) may hold the write lock briefly. */
  sqlite3_busy_timeout(*db, 5000);
  sqlite3_extended_result_codes(*db, 1);
  return FM_OK;
}

/* WAL: readers never block the writer and a kill -9 at any point leaves the last committed
 * state. synchronous=NORMAL in WAL mode loses at most the last commits on power loss, never
 * consistency; a cache can afford that. */
static int configure(sqlite3 *db, const char *path, fm_diag *d) {
  sqlite3_stmt *st = NULL;
  int rc = sqlite3_prepare_v2(db, "PRAGMA journal_mode=WAL", -1, &st, NULL);
  if (rc == SQLITE_OK) rc = sqlite3_step(st);
  if (rc != SQLITE_ROW) {
    fm_diag_set(d, FM_ESTORE, "%s: enabling WAL: %s", path, sqlite3_errmsg(db));
    sqlite3_finalize(st);
    return FM_ESTORE;
  }
  const char *mode = (const char *)sqlite3_column_text(st, 0);
  if (!mode || (strcmp(mode, "wal") != 0 && strcmp(path, FM_STORE_MEMORY) != 0)) {
    fm_diag_set(d, FM_ESTORE, "%s: journal mode is %s, not wal", path, mode ? mode : "(null)");
    sqlite3_finalize(st);
    return FM_ESTORE;
  }
  sqlite3_finalize(st);
  return exec_sql(db, "PRAGMA synchronous=NORMAL", "setting synchronous=NORMAL", d);
}

/* Testing only (RELIABILITY.md, "full disk"): FM_TEST_DB_MAX_PAGES=N caps the database at N
 * pages (PRAGMA max_page_count), so that a test can fill the store as a full disk would
 * (SQLITE_FULL) on any filesystem. Unset in production. */
static int test_max_pages(sqlite3 *db, const char *path, fm_diag *d) {
  const char *v = getenv("FM_TEST_DB_MAX_PAGES");
  if (!v || !*v) return FM_OK;
  char *end = NULL;
  unsigned long long n = strtoull(v, &end, 10);
  if (*end || n == 0 || n > 0x7fffffffull)
    return fm_diag_set(d, FM_EINVAL, "%s: FM_TEST_DB_MAX_PAGES=\"%s\" is not a page count", path, v);
  char sql[64];
  snprintf(sql, sizeof sql, "PRAGMA max_page_count=%llu", n);
  return exec_sql(db, sql, "setting FM_TEST_DB_MAX_PAGES", d);
}

static const char entry_columns[] =
    "key, device, kind, state, size, created, last_used, hits, checksum, canonical, meta, "
    "source, timings, cubin";

int fm_store_prepare_all(fm_store *s, fm_diag *d) {
  char put[512], get[512];
  snprintf(put, sizeof put,
           "INSERT OR REPLACE INTO kernels(%s) "
           "VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)",
           entry_columns);
  snprintf(get, sizeof get, "SELECT %s FROM kernels WHERE key = ?1 AND device = ?2", entry_columns);
  /* Ties in LRU order fall to created, then rowid (insertion order, as REPLACE re-inserts). */
  const char *sql[FM_ST__COUNT] = {
      [FM_ST_BEGIN] = "BEGIN IMMEDIATE",
      [FM_ST_COMMIT] = "COMMIT",
      [FM_ST_ROLLBACK] = "ROLLBACK",
      [FM_ST_PUT] = put,
      [FM_ST_STATE] = "SELECT state FROM kernels WHERE key = ?1 AND device = ?2",
      [FM_ST_USAGE] = "SELECT count(*), COALESCE(SUM(size), 0) FROM kernels",
      [FM_ST_LRU_VICTIM] =
          "SELECT rowid, size FROM kernels WHERE rowid <> ?1 "
          "ORDER BY last_used, created, rowid LIMIT 1",
      [FM_ST_DEL_ROWID] = "DELETE FROM kernels WHERE rowid = ?1",
      [FM_ST_GET] = get,
      [FM_ST_TOUCH] =
          "UPDATE kernels SET last_used = ?3, hits = hits + 1 "
          "WHERE key = ?1 AND device = ?2",
      [FM_ST_DEL_KEY_DEV] = "DELETE FROM kernels WHERE key = ?1 AND device = ?2",
      [FM_ST_PREFIX] =
          "SELECT key, device FROM kernels WHERE key BETWEEN ?1 AND ?2 "
          "ORDER BY last_used DESC, created DESC, rowid DESC",
      /* length() of a blob column reads only the record header, not the blob. */
      [FM_ST_LIST] =
          "SELECT key, device, kind, state, size, created, last_used, hits, "
          "length(canonical), length(meta), length(timings) FROM kernels "
          "ORDER BY last_used DESC, created DESC, rowid DESC LIMIT ?1",
      [FM_ST_DEL_KEY] = "DELETE FROM kernels WHERE key = ?1",
      [FM_ST_DEL_ALL] = "DELETE FROM kernels",
      [FM_ST_STAT_ADD] =
          "INSERT INTO stats(id, value) VALUES(?1, ?2) "
          "ON CONFLICT(id) DO UPDATE SET value = value + excluded.value",
      [FM_ST_STATS] = "SELECT id, value FROM stats",
  };
  for (int i = 0; i < FM_ST__COUNT; i++) {
    if (sqlite3_prepare_v3(s->db, sql[i], -1, SQLITE_PREPARE_PERSISTENT, &s->st[i], NULL) != SQLITE_OK)
      return fm_diag_set(d, FM_ESTORE, "preparing \"%s\": %s", sql[i], sqlite3_errmsg(s->db));
  }
  return FM_OK;
}

void fm_store_finalize_all(fm_store *s) {
  for (int i = 0; i < FM_ST__COUNT; i++) {
    sqlite3_finalize(s->st[i]);
    s->st[i] = NULL;
  }
}

int fm_store_open(const char *path, uint64_t size_cap, fm_store **out, fm_diag *d) {
  if (d) d->text[0] = '\0';
  if (!out) return fm_diag_set(d, FM_EINVAL, "fm_store_open: out is NULL");
  *out = NULL;
  if (!path || !*path) return fm_diag_set(d, FM_EINVAL, "fm_store_open: empty database path");

  int err;
  fm_store *s = calloc(1, sizeof *s);
  if (!s) return fm_diag_set(d, FM_ENOMEM, "out of memory opening the kernel store");
  s->size_cap = size_cap;
  pthread_mutex_init(&s->mu, NULL);

  if ((err = open_connection(path, &s->db, d)) != FM_OK) goto fail;
  char why[512];
  int verdict = check_integrity(s->db, why, sizeof why);
  if (verdict == CHECK_FAILED) {
    err = fm_diag_set(d, FM_ESTORE, "checking kernel store %s: %s", path, why);
    goto fail;
  }
  fm_diag notice = {{0}}; /* the "moved aside" message, reported only if the rest succeeds */
  if (verdict == CHECK_DAMAGED) {
    sqlite3_close(s->db);
    s->db = NULL;
    if ((err = move_aside(path, why, &notice)) != FM_OK) {
      fm_diag_set(d, err, "%s", notice.text);
      goto fail;
    }
    if ((err = open_connection(path, &s->db, d)) != FM_OK) goto fail;
    if (check_integrity(s->db, why, sizeof why) != CHECK_OK) {
      err = fm_diag_set(d, FM_ESTORE, "fresh kernel store %s fails its check: %s", path, why);
      goto fail;
    }
  }
  if ((err = configure(s->db, path, d)) != FM_OK) goto fail;
  if ((err = migrate(s->db, path, d)) != FM_OK) goto fail;
  if ((err = test_max_pages(s->db, path, d)) != FM_OK) goto fail;
  if ((err = fm_store_prepare_all(s, d)) != FM_OK) goto fail;
  if (d && notice.text[0]) *d = notice;
  *out = s;
  return FM_OK;

fail:
  fm_store_close(s);
  return err;
}

void fm_store_close(fm_store *s) {
  if (!s) return;
  fm_store_finalize_all(s);
  /* The last connection to close checkpoints the WAL into the main file and removes it. */
  sqlite3_close(s->db);
  pthread_mutex_destroy(&s->mu);
  free(s);
}
