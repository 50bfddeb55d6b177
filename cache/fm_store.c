/* fm_store.c: the kernel store: entries (put/get/find/list/evict), LRU eviction and the
 * persistent statistics. Opening, integrity and migration are in fm_store_schema.c.
 *
 * On-disk format: one SQLite database in WAL mode, schema version in PRAGMA user_version.
 *
 *   database   := user_version(2) kernels kernels_lru stats
 *   kernels    := entry*                          PRIMARY KEY (key, device)
 *   entry      := key       BLOB[32]   fm_fingerprint of the fragment and toolchain
 *                 device    TEXT       fm_device_label ("none/sm_90a" in compile-only mode)
 *                 kind      TEXT       "pointwise" | ...
 *                 state     INTEGER    fm_kstate: 0 untuned | 1 tuned | 2 bad | 3 verified
 *                 size      INTEGER    cubin bytes (what the size cap counts)
 *                 created   INTEGER    unix seconds
 *                 last_used INTEGER    unix seconds, set by put and by get with touch
 *                 hits      INTEGER    gets with touch
 *                 checksum  BLOB[32]   SHA-256("fusemld-entry-2" field(key) field(device)
 *                                              field(kind) field(u64be(state)) field(canonical)
 *                                              field(meta) field(cubin) field(source)
 *                                              field(timings)),  field(x) := u64be(|x|) x,
 *                                      a NULL source hashed as u64be(2^64-1) alone
 *                 canonical BLOB       canonical fragment bytes (compared by the daemon on a hit)
 *                 meta      BLOB       fm_meta_pack bytes
 *                 source    TEXT|NULL  the generated CUDA C
 *                 timings   BLOB|NULL  msgpack from the tuner
 *                 cubin     BLOB
 *   kernels_lru:= INDEX kernels(last_used, created)     eviction order, oldest first;
 *                                                       ties fall to rowid (insertion order)
 *   stats      := (id INTEGER PRIMARY KEY, value INTEGER)*   id = an FM_STAT_MAP number
 *
 * The checksum covers every field that is served (compile/lookup replies, show, export) with
 * lengths, so a torn or bit-flipped blob, bytes shifted between two blobs, a state edited to
 * "tuned" or a row moved under another key or device are detected at get; only the
 * bookkeeping columns (size, which get compares with the cubin, created, last_used, hits)
 * change without rehashing. It guards against damage and stray edits, not against someone
 * who can write the file (they can recompute it). Versions: 0 = no tables (a new file); 1 = the same tables with a checksum over
 * u64be(|canonical|) canonical u64be(|cubin|) cubin u64be(|meta|) meta only; 2 = the above.
 * A new version adds a migrate_N_to_N+1 in fm_store_schema.c (1 to 2 drops the version 1
 * entries: why is there). */
#include "fm_store_int.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <openssl/evp.h>

/* ---- names, entries, errors --------------------------------------------------------- */

const char *fm_stat_name(fm_stat s) {
  switch (s) {
#define FM_STAT_NAME_(n, name, str) \
  case FM_STAT_##name:              \
    return str;
    FM_STAT_MAP(FM_STAT_NAME_)
#undef FM_STAT_NAME_
    default:
      break;
  }
  return "unknown";
}

const char *fm_kstate_name(fm_kstate s) {
  switch (s) {
    case FM_STATE_UNTUNED:
      return "untuned";
    case FM_STATE_TUNED:
      return "tuned";
    case FM_STATE_BAD:
      return "bad";
    case FM_STATE_VERIFIED:
      return "verified";
  }
  return "unknown";
}

int fm_kstate_valid(int64_t s) {
  return s == FM_STATE_UNTUNED || s == FM_STATE_TUNED || s == FM_STATE_BAD || s == FM_STATE_VERIFIED;
}

void fm_entry_free(fm_entry *e) {
  if (!e) return;
  free(e->canonical);
  free(e->cubin);
  free(e->meta);
  free(e->source);
  free(e->timings);
  e->canonical = e->cubin = e->meta = e->timings = NULL;
  e->source = NULL;
  e->canonical_len = e->cubin_len = e->meta_len = e->timings_len = 0;
}

/* Callers hold s->mu. */
int fm_store_fail(fm_store *s, int err, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(s->err, sizeof s->err, fmt, ap);
  va_end(ap);
  return err;
}

int fm_store_fail_sqlite(fm_store *s, const char *what) {
  return fm_store_fail(s, FM_ESTORE, "%s: %s (sqlite error %d)", what, sqlite3_errmsg(s->db),
                       sqlite3_extended_errcode(s->db));
}

void fm_store_last_error(fm_store *s, fm_diag *d) {
  if (!d) return;
  if (!s) {
    d->text[0] = '\0';
    return;
  }
  pthread_mutex_lock(&s->mu);
  snprintf(d->text, sizeof d->text, "%s", s->err);
  pthread_mutex_unlock(&s->mu);
}

/* ---- statement helpers (s->mu held) ------------------------------------------------- */

/* Every statement is reset right after use: a statement left mid-walk holds a read
 * transaction open, which pins the WAL and blocks checkpoints. */
static void reset(sqlite3_stmt *st) {
  sqlite3_reset(st);
  sqlite3_clear_bindings(st);
}

/* sqlite3_bind_blob with a NULL pointer binds SQL NULL, which NOT NULL columns refuse:
 * an empty blob must be bound as a zero-length zeroblob. */
static int bind_blob(sqlite3_stmt *st, int i, const void *p, size_t n) {
  return n == 0 ? sqlite3_bind_zeroblob(st, i, 0) : sqlite3_bind_blob64(st, i, p, n, SQLITE_STATIC);
}

static int step_done(fm_store *s, sqlite3_stmt *st, const char *what) {
  int err = sqlite3_step(st) == SQLITE_DONE ? FM_OK : fm_store_fail_sqlite(s, what);
  reset(st);
  return err;
}

static int bind_key_device(fm_store *s, sqlite3_stmt *st, const fm_key *key, const char *device) {
  if (sqlite3_bind_blob(st, 1, key->bytes, FM_KEY_BYTES, SQLITE_STATIC) == SQLITE_OK &&
      sqlite3_bind_text(st, 2, device, -1, SQLITE_STATIC) == SQLITE_OK)
    return FM_OK;
  int err = fm_store_fail_sqlite(s, "binding a key");
  reset(st);
  return err;
}

/* SQLite rolls some failures (FULL, IOERR, NOMEM) back by itself; roll back only what is
 * still open, and keep the first error as the one reported. */
static void tx_abort(fm_store *s) {
  if (sqlite3_get_autocommit(s->db)) return;
  sqlite3_step(s->st[FM_ST_ROLLBACK]);
  reset(s->st[FM_ST_ROLLBACK]);
}

/* A transaction still open here means an earlier ROLLBACK failed; clear it first, or every
 * later BEGIN would fail with "cannot start a transaction within a transaction". */
static int tx_begin(fm_store *s) {
  tx_abort(s);
  return step_done(s, s->st[FM_ST_BEGIN], "BEGIN IMMEDIATE");
}
static int tx_commit(fm_store *s) { return step_done(s, s->st[FM_ST_COMMIT], "COMMIT"); }

static int stat_add_locked(fm_store *s, fm_stat stat, int64_t delta) {
  sqlite3_stmt *st = s->st[FM_ST_STAT_ADD];
  if (sqlite3_bind_int(st, 1, (int)stat) != SQLITE_OK || sqlite3_bind_int64(st, 2, delta) != SQLITE_OK) {
    int err = fm_store_fail_sqlite(s, "binding a statistic");
    reset(st);
    return err;
  }
  return step_done(s, st, "updating a statistic");
}

static int usage_locked(fm_store *s, uint64_t *entries, uint64_t *bytes) {
  sqlite3_stmt *st = s->st[FM_ST_USAGE];
  int err = FM_OK;
  if (sqlite3_step(st) == SQLITE_ROW) {
    *entries = (uint64_t)sqlite3_column_int64(st, 0);
    *bytes = (uint64_t)sqlite3_column_int64(st, 1);
  } else {
    err = fm_store_fail_sqlite(s, "measuring the store");
  }
  reset(st);
  return err;
}

/* ---- checksum ----------------------------------------------------------------------- */

static void put_u64be(uint8_t *p, uint64_t v) {
  for (int i = 7; i >= 0; i--, v >>= 8) p[i] = (uint8_t)v;
}

/* The fields the grammar's checksum covers, in its order. */
enum {
  SUM_KEY,
  SUM_DEVICE,
  SUM_KIND,
  SUM_STATE,
  SUM_CANONICAL,
  SUM_META,
  SUM_CUBIN,
  SUM_SOURCE,
  SUM_TIMINGS,
  SUM__COUNT
};

typedef struct sum_part {
  const void *p;
  size_t n;
  int absent; /* a NULL source: hashed as the length 2^64-1 and no bytes */
} sum_part;

/* The grammar's checksum, streamed through one digest (no copy of the blobs). */
static int entry_checksum(const sum_part part[SUM__COUNT], uint8_t out[32]) {
  static const char domain[] = "fusemld-entry-2"; /* the grammar's format 2 */
  EVP_MD_CTX *c = EVP_MD_CTX_new();
  unsigned len = 0;
  int ok = c && EVP_DigestInit_ex(c, EVP_sha256(), NULL) && EVP_DigestUpdate(c, domain, sizeof domain - 1);
  for (int i = 0; ok && i < SUM__COUNT; i++) {
    uint8_t be[8];
    put_u64be(be, part[i].absent ? UINT64_MAX : (uint64_t)part[i].n);
    ok = EVP_DigestUpdate(c, be, sizeof be) &&
         (part[i].absent || !part[i].n || EVP_DigestUpdate(c, part[i].p, part[i].n));
  }
  ok = ok && EVP_DigestFinal_ex(c, out, &len) && len == 32;
  EVP_MD_CTX_free(c);
  return ok ? FM_OK : FM_ENOMEM;
}

/* The parts of an entry about to be put; state_be is the storage for its state. */
static void entry_parts(const fm_entry *e, uint8_t state_be[8], sum_part part[SUM__COUNT]) {
  put_u64be(state_be, (uint64_t)(int64_t)e->state);
  part[SUM_KEY] = (sum_part){e->key.bytes, FM_KEY_BYTES, 0};
  part[SUM_DEVICE] = (sum_part){e->device, strlen(e->device), 0};
  part[SUM_KIND] = (sum_part){e->kind, strlen(e->kind), 0};
  part[SUM_STATE] = (sum_part){state_be, 8, 0};
  part[SUM_CANONICAL] = (sum_part){e->canonical, e->canonical_len, 0};
  part[SUM_META] = (sum_part){e->meta, e->meta_len, 0};
  part[SUM_CUBIN] = (sum_part){e->cubin, e->cubin_len, 0};
  part[SUM_SOURCE] = (sum_part){e->source, e->source ? strlen(e->source) : 0, !e->source};
  part[SUM_TIMINGS] = (sum_part){e->timings, e->timings_len, 0};
}

/* ---- put ---------------------------------------------------------------------------- */

/* A reason the entry cannot be stored, or NULL. */
static const char *invalid_entry(const fm_entry *e) {
  if (!memchr(e->device, '\0', sizeof e->device) || !e->device[0]) return "device label is empty or not NUL-terminated";
  if (!memchr(e->kind, '\0', sizeof e->kind) || !e->kind[0]) return "kind is empty or not NUL-terminated";
  if ((e->canonical_len && !e->canonical) || (e->cubin_len && !e->cubin) || (e->meta_len && !e->meta) ||
      (e->timings_len && !e->timings))
    return "a blob has a length but no data";
  if (!fm_kstate_valid(e->state)) return "state is not an fm_kstate";
  if (e->cubin_len > (uint64_t)INT64_MAX) return "cubin too large";
  return NULL;
}

/* Deletes least-recently-used entries other than keep_rowid until the cubins fit the cap.
 * Runs inside put's transaction, so a crash never leaves a half-evicted store. */
static int evict_lru(fm_store *s, sqlite3_int64 keep_rowid) {
  uint64_t entries = 0, bytes = 0;
  int64_t evicted = 0;
  int err = usage_locked(s, &entries, &bytes);
  while (err == FM_OK && bytes > s->size_cap) {
    sqlite3_stmt *st = s->st[FM_ST_LRU_VICTIM];
    sqlite3_bind_int64(st, 1, keep_rowid);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_DONE) { /* only the new entry is left: it stays even if over the cap */
      reset(st);
      break;
    }
    if (rc != SQLITE_ROW) {
      err = fm_store_fail_sqlite(s, "finding an entry to evict");
      reset(st);
      break;
    }
    sqlite3_int64 victim = sqlite3_column_int64(st, 0);
    uint64_t size = (uint64_t)sqlite3_column_int64(st, 1);
    reset(st);
    sqlite3_stmt *del = s->st[FM_ST_DEL_ROWID];
    sqlite3_bind_int64(del, 1, victim);
    if ((err = step_done(s, del, "evicting an entry")) != FM_OK) break;
    bytes = size < bytes ? bytes - size : 0;
    evicted++;
  }
  if (err == FM_OK && evicted) err = stat_add_locked(s, FM_STAT_EVICTIONS, evicted);
  return err;
}

/* The state of key+device's entry, or -1 when there is none (within the caller's transaction,
 * so that what is decided on it still holds when the put commits). */
static int state_locked(fm_store *s, const fm_key *key, const char *device, int *state) {
  sqlite3_stmt *st = s->st[FM_ST_STATE];
  int err = bind_key_device(s, st, key, device);
  if (err != FM_OK) return err;
  int rc = sqlite3_step(st);
  *state = rc == SQLITE_ROW ? sqlite3_column_int(st, 0) : -1;
  if (rc != SQLITE_ROW && rc != SQLITE_DONE) err = fm_store_fail_sqlite(s, "put: reading the current state");
  reset(st);
  return err;
}

int fm_store_put(fm_store *s, const fm_entry *e) { return fm_store_put_unless(s, e, 0, NULL); }

int fm_store_put_unless(fm_store *s, const fm_entry *e, unsigned keep_states, int *kept_state) {
  if (kept_state) *kept_state = -1;
  if (!s) return FM_EINVAL;
  const char *why = e ? invalid_entry(e) : "entry is NULL";
  uint8_t sum[32], state_be[8];
  sum_part part[SUM__COUNT];
  if (!why) entry_parts(e, state_be, part);
  int err = why ? FM_EINVAL : entry_checksum(part, sum);
  int64_t now = (int64_t)time(NULL);

  pthread_mutex_lock(&s->mu);
  if (err != FM_OK) {
    fm_store_fail(s, err, "put: %s", why ? why : "out of memory computing the checksum");
    goto out;
  }
  if ((err = tx_begin(s)) != FM_OK) goto out;
  if (keep_states) {
    int have;
    if ((err = state_locked(s, &e->key, e->device, &have)) != FM_OK) goto out;
    if (have >= 0 && have < 32 && (keep_states & (1u << have))) {
      if (kept_state) *kept_state = have;
      err = tx_commit(s);
      goto out;
    }
  }
  sqlite3_stmt *st = s->st[FM_ST_PUT];
  int rc = sqlite3_bind_blob(st, FM_COL_KEY + 1, e->key.bytes, FM_KEY_BYTES, SQLITE_STATIC);
  if (rc == SQLITE_OK) rc = sqlite3_bind_text(st, FM_COL_DEVICE + 1, e->device, -1, SQLITE_STATIC);
  if (rc == SQLITE_OK) rc = sqlite3_bind_text(st, FM_COL_KIND + 1, e->kind, -1, SQLITE_STATIC);
  if (rc == SQLITE_OK) rc = sqlite3_bind_int(st, FM_COL_STATE + 1, (int)e->state);
  if (rc == SQLITE_OK) rc = sqlite3_bind_int64(st, FM_COL_SIZE + 1, (sqlite3_int64)e->cubin_len);
  if (rc == SQLITE_OK) rc = sqlite3_bind_int64(st, FM_COL_CREATED + 1, e->created ? e->created : now);
  if (rc == SQLITE_OK) rc = sqlite3_bind_int64(st, FM_COL_LAST_USED + 1, e->last_used ? e->last_used : now);
  if (rc == SQLITE_OK) rc = sqlite3_bind_int64(st, FM_COL_HITS + 1, e->hits);
  if (rc == SQLITE_OK) rc = sqlite3_bind_blob(st, FM_COL_CHECKSUM + 1, sum, 32, SQLITE_STATIC);
  if (rc == SQLITE_OK) rc = bind_blob(st, FM_COL_CANONICAL + 1, e->canonical, e->canonical_len);
  if (rc == SQLITE_OK) rc = bind_blob(st, FM_COL_META + 1, e->meta, e->meta_len);
  if (rc == SQLITE_OK) /* NULL source binds SQL NULL, as the schema allows */
    rc = sqlite3_bind_text(st, FM_COL_SOURCE + 1, e->source, -1, SQLITE_STATIC);
  if (rc == SQLITE_OK)
    rc = e->timings_len ? bind_blob(st, FM_COL_TIMINGS + 1, e->timings, e->timings_len)
                        : sqlite3_bind_null(st, FM_COL_TIMINGS + 1);
  if (rc == SQLITE_OK) rc = bind_blob(st, FM_COL_CUBIN + 1, e->cubin, e->cubin_len);
  if (rc != SQLITE_OK) {
    err = fm_store_fail_sqlite(s, "put: binding the entry");
    reset(st);
    goto out;
  }
  if ((err = step_done(s, st, "put: writing the entry")) != FM_OK) goto out;
  if (s->size_cap && (err = evict_lru(s, sqlite3_last_insert_rowid(s->db))) != FM_OK) goto out;
  err = tx_commit(s);
out:
  if (err != FM_OK) tx_abort(s);
  pthread_mutex_unlock(&s->mu);
  return err;
}

/* ---- get ---------------------------------------------------------------------------- */

static int dup_blob(const void *p, size_t n, uint8_t **out) {
  *out = NULL;
  if (n == 0) return FM_OK;
  if (!(*out = malloc(n))) return FM_ENOMEM;
  memcpy(*out, p, n);
  return FM_OK;
}

static void copy_text(char *dst, size_t cap, const unsigned char *src) {
  snprintf(dst, cap, "%s", src ? (const char *)src : "");
}

/* Fills out from a row in FM_ST_GET's column order and verifies it. FM_ECORRUPT (reason in
 * s->err) for a row that is not what put wrote: wrong key/checksum shape, a cubin whose
 * length disagrees with size, or a checksum mismatch. */
static int read_entry(fm_store *s, sqlite3_stmt *st, fm_entry *out) {
  const void *key = sqlite3_column_blob(st, FM_COL_KEY);
  int key_len = sqlite3_column_bytes(st, FM_COL_KEY);
  const void *sum = sqlite3_column_blob(st, FM_COL_CHECKSUM);
  int sum_len = sqlite3_column_bytes(st, FM_COL_CHECKSUM);
  if (key_len != FM_KEY_BYTES || sum_len != 32)
    return fm_store_fail(s, FM_ECORRUPT, "entry has a %d-byte key and a %d-byte checksum", key_len, sum_len);
  memcpy(out->key.bytes, key, FM_KEY_BYTES);
  copy_text(out->device, sizeof out->device, sqlite3_column_text(st, FM_COL_DEVICE));
  copy_text(out->kind, sizeof out->kind, sqlite3_column_text(st, FM_COL_KIND));
  out->state = (fm_kstate)sqlite3_column_int(st, FM_COL_STATE);
  int64_t size = sqlite3_column_int64(st, FM_COL_SIZE);
  out->created = sqlite3_column_int64(st, FM_COL_CREATED);
  out->last_used = sqlite3_column_int64(st, FM_COL_LAST_USED);
  out->hits = sqlite3_column_int64(st, FM_COL_HITS);

  const uint8_t *canonical = sqlite3_column_blob(st, FM_COL_CANONICAL);
  size_t canonical_len = (size_t)sqlite3_column_bytes(st, FM_COL_CANONICAL);
  const uint8_t *meta = sqlite3_column_blob(st, FM_COL_META);
  size_t meta_len = (size_t)sqlite3_column_bytes(st, FM_COL_META);
  const uint8_t *timings = sqlite3_column_blob(st, FM_COL_TIMINGS);
  size_t timings_len = (size_t)sqlite3_column_bytes(st, FM_COL_TIMINGS);
  const unsigned char *source = sqlite3_column_text(st, FM_COL_SOURCE);
  size_t source_len = (size_t)sqlite3_column_bytes(st, FM_COL_SOURCE);
  const uint8_t *cubin = sqlite3_column_blob(st, FM_COL_CUBIN);
  size_t cubin_len = (size_t)sqlite3_column_bytes(st, FM_COL_CUBIN);
  if (sqlite3_errcode(s->db) == SQLITE_NOMEM) return fm_store_fail(s, FM_ENOMEM, "reading an entry");

  if (size < 0 || (uint64_t)size != cubin_len)
    return fm_store_fail(s, FM_ECORRUPT, "entry's cubin is %zu bytes but its size says %lld", cubin_len,
                         (long long)size);
  if (!fm_kstate_valid(out->state)) return fm_store_fail(s, FM_ECORRUPT, "entry has unknown state %d", (int)out->state);
  /* Hashed as the row holds them (device and kind before any truncation to out's fields). */
  uint8_t want[32], state_be[8];
  put_u64be(state_be, (uint64_t)sqlite3_column_int64(st, FM_COL_STATE));
  const sum_part part[SUM__COUNT] = {
      [SUM_KEY] = {key, FM_KEY_BYTES, 0},
      [SUM_DEVICE] = {sqlite3_column_text(st, FM_COL_DEVICE), (size_t)sqlite3_column_bytes(st, FM_COL_DEVICE), 0},
      [SUM_KIND] = {sqlite3_column_text(st, FM_COL_KIND), (size_t)sqlite3_column_bytes(st, FM_COL_KIND), 0},
      [SUM_STATE] = {state_be, 8, 0},
      [SUM_CANONICAL] = {canonical, canonical_len, 0},
      [SUM_META] = {meta, meta_len, 0},
      [SUM_CUBIN] = {cubin, cubin_len, 0},
      [SUM_SOURCE] = {source, source_len, !source},
      [SUM_TIMINGS] = {timings, timings_len, 0},
  };
  if (entry_checksum(part, want) != FM_OK) return fm_store_fail(s, FM_ENOMEM, "out of memory verifying an entry");
  if (memcmp(want, sum, 32) != 0) return fm_store_fail(s, FM_ECORRUPT, "entry failed its checksum");

  if (dup_blob(canonical, canonical_len, &out->canonical) != FM_OK || dup_blob(meta, meta_len, &out->meta) != FM_OK ||
      dup_blob(timings, timings_len, &out->timings) != FM_OK || dup_blob(cubin, cubin_len, &out->cubin) != FM_OK)
    return fm_store_fail(s, FM_ENOMEM, "out of memory copying an entry");
  out->canonical_len = canonical_len;
  out->meta_len = meta_len;
  out->timings_len = timings_len;
  out->cubin_len = cubin_len;
  if (source) {
    if (!(out->source = malloc(source_len + 1))) return fm_store_fail(s, FM_ENOMEM, "out of memory copying an entry");
    memcpy(out->source, source, source_len + 1);
  }
  return FM_OK;
}

/* A damaged entry is deleted and counted in one transaction; the caller rebuilds it. */
static void drop_corrupt(fm_store *s, const fm_key *key, const char *device) {
  char reason[sizeof s->err];
  memcpy(reason, s->err, sizeof reason);
  int err = tx_begin(s);
  if (err == FM_OK && (err = bind_key_device(s, s->st[FM_ST_DEL_KEY_DEV], key, device)) == FM_OK)
    err = step_done(s, s->st[FM_ST_DEL_KEY_DEV], "deleting a corrupt entry");
  if (err == FM_OK) err = stat_add_locked(s, FM_STAT_CORRUPT, 1);
  if (err == FM_OK) err = tx_commit(s);
  if (err != FM_OK) {
    tx_abort(s);
    return; /* s->err now says why the delete failed; the next get finds it corrupt again */
  }
  memcpy(s->err, reason, sizeof reason);
}

static int get_locked(fm_store *s, const fm_key *key, const char *device, int touch, fm_entry *out) {
  sqlite3_stmt *st = s->st[FM_ST_GET];
  int err = bind_key_device(s, st, key, device);
  if (err != FM_OK) return err;
  int rc = sqlite3_step(st);
  if (rc == SQLITE_DONE) {
    reset(st);
    return FM_ENOT_FOUND; /* a miss is not a failure: s->err keeps the last real one */
  }
  err = rc == SQLITE_ROW ? read_entry(s, st, out) : fm_store_fail_sqlite(s, "get: reading the entry");
  reset(st);
  if (err != FM_OK) {
    fm_entry_free(out);
    if (err == FM_ECORRUPT) drop_corrupt(s, key, device);
    return err;
  }
  if (touch) {
    int64_t now = (int64_t)time(NULL);
    sqlite3_stmt *t = s->st[FM_ST_TOUCH];
    /* A failed touch (disk full) still serves the verified entry: losing an LRU bump costs
     * little, a needless recompile costs much. The reason stays in s->err. */
    if (bind_key_device(s, t, key, device) == FM_OK && sqlite3_bind_int64(t, 3, now) == SQLITE_OK &&
        step_done(s, t, "get: updating last_used") == FM_OK) {
      out->last_used = now;
      out->hits++;
    } else {
      reset(t);
    }
  }
  return FM_OK;
}

int fm_store_get(fm_store *s, const fm_key *key, const char *device, int touch, fm_entry *out) {
  if (out) memset(out, 0, sizeof *out);
  if (!s) return FM_EINVAL;
  pthread_mutex_lock(&s->mu);
  int err = (!key || !device || !out) ? fm_store_fail(s, FM_EINVAL, "get: NULL argument")
                                      : get_locked(s, key, device, touch, out);
  pthread_mutex_unlock(&s->mu);
  return err;
}

/* ---- find, list, evict -------------------------------------------------------------- */

static int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/* The prefix becomes a range on the key blob ([prefix 000..., prefix fff...]), which the
 * primary key index answers directly, and no user text ever reaches the SQL. */
int fm_store_find_prefix(fm_store *s, const char *hex_prefix, fm_entry *out) {
  if (out) memset(out, 0, sizeof *out);
  if (!s) return FM_EINVAL;
  pthread_mutex_lock(&s->mu);
  int err = FM_OK;
  size_t n = hex_prefix ? strnlen(hex_prefix, 2 * FM_KEY_BYTES + 1) : 0;
  if (!out || n < 4 || n > 2 * FM_KEY_BYTES) {
    err = fm_store_fail(s, FM_EINVAL, "key prefix must be 4 to %d hex digits", 2 * FM_KEY_BYTES);
    goto out;
  }
  uint8_t lo[FM_KEY_BYTES] = {0}, hi[FM_KEY_BYTES];
  memset(hi, 0xff, sizeof hi);
  for (size_t i = 0; i < n; i++) {
    int v = hex_value(hex_prefix[i]);
    if (v < 0) {
      err = fm_store_fail(s, FM_EINVAL, "key prefix \"%.64s\" is not hexadecimal", hex_prefix);
      goto out;
    }
    int shift = (i % 2) ? 0 : 4;
    lo[i / 2] = (uint8_t)((lo[i / 2] & ~(0xf << shift)) | (v << shift));
    hi[i / 2] = (uint8_t)((hi[i / 2] & ~(0xf << shift)) | (v << shift));
  }

  sqlite3_stmt *st = s->st[FM_ST_PREFIX];
  fm_key found;
  char device[sizeof out->device];
  int matches = 0, rc;
  sqlite3_bind_blob(st, 1, lo, FM_KEY_BYTES, SQLITE_STATIC);
  sqlite3_bind_blob(st, 2, hi, FM_KEY_BYTES, SQLITE_STATIC);
  /* One key on several devices is one match (the most recently used row is shown). */
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    if (sqlite3_column_bytes(st, 0) != FM_KEY_BYTES) continue;
    const void *k = sqlite3_column_blob(st, 0);
    if (matches == 0) {
      memcpy(found.bytes, k, FM_KEY_BYTES);
      copy_text(device, sizeof device, sqlite3_column_text(st, 1));
      matches = 1;
    } else if (memcmp(found.bytes, k, FM_KEY_BYTES) != 0) {
      matches = 2;
      break;
    }
  }
  if (rc != SQLITE_ROW && rc != SQLITE_DONE) err = fm_store_fail_sqlite(s, "searching keys");
  reset(st);
  if (err != FM_OK) goto out;
  if (matches == 0) {
    err = FM_ENOT_FOUND;
  } else if (matches > 1) {
    err = fm_store_fail(s, FM_EINVAL, "key prefix %s matches more than one entry", hex_prefix);
  } else {
    err = get_locked(s, &found, device, 0, out);
  }
out:
  pthread_mutex_unlock(&s->mu);
  return err;
}

int fm_store_list(fm_store *s, uint32_t limit, fm_store_list_fn fn, void *ctx) {
  if (!s) return FM_EINVAL;
  fm_entry *rows = NULL;
  size_t n = 0, cap = 0;
  int err = FM_OK, rc;
  pthread_mutex_lock(&s->mu);
  if (!fn) {
    err = fm_store_fail(s, FM_EINVAL, "list: no callback");
    pthread_mutex_unlock(&s->mu);
    return err;
  }
  sqlite3_stmt *st = s->st[FM_ST_LIST];
  sqlite3_bind_int64(st, 1, limit ? (sqlite3_int64)limit : -1);
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    if (n == cap) {
      size_t ncap = cap ? 2 * cap : 64;
      fm_entry *grown = realloc(rows, ncap * sizeof *rows);
      if (!grown) {
        err = fm_store_fail(s, FM_ENOMEM, "list: out of memory");
        break;
      }
      rows = grown;
      cap = ncap;
    }
    fm_entry *e = &rows[n++];
    memset(e, 0, sizeof *e);
    if (sqlite3_column_bytes(st, 0) == FM_KEY_BYTES) memcpy(e->key.bytes, sqlite3_column_blob(st, 0), FM_KEY_BYTES);
    copy_text(e->device, sizeof e->device, sqlite3_column_text(st, 1));
    copy_text(e->kind, sizeof e->kind, sqlite3_column_text(st, 2));
    e->state = (fm_kstate)sqlite3_column_int(st, 3);
    e->cubin_len = (size_t)sqlite3_column_int64(st, 4);
    e->created = sqlite3_column_int64(st, 5);
    e->last_used = sqlite3_column_int64(st, 6);
    e->hits = sqlite3_column_int64(st, 7);
    e->canonical_len = (size_t)sqlite3_column_int64(st, 8);
    e->meta_len = (size_t)sqlite3_column_int64(st, 9);
    e->timings_len = (size_t)sqlite3_column_int64(st, 10);
  }
  if (err == FM_OK && rc != SQLITE_DONE) err = fm_store_fail_sqlite(s, "list: reading entries");
  reset(st);
  pthread_mutex_unlock(&s->mu);

  /* The callback runs unlocked, on a snapshot: it may call back into the store. */
  for (size_t i = 0; err == FM_OK && i < n; i++)
    if (fn(&rows[i], ctx)) break;
  free(rows);
  return err;
}

int fm_store_evict(fm_store *s, const fm_key *key) {
  if (!s) return FM_EINVAL;
  pthread_mutex_lock(&s->mu);
  int err;
  if (!key) {
    err = fm_store_fail(s, FM_EINVAL, "evict: NULL key");
  } else {
    sqlite3_stmt *st = s->st[FM_ST_DEL_KEY];
    sqlite3_bind_blob(st, 1, key->bytes, FM_KEY_BYTES, SQLITE_STATIC);
    err = step_done(s, st, "evict: deleting the entry");
    if (err == FM_OK && sqlite3_changes(s->db) == 0) err = FM_ENOT_FOUND;
  }
  pthread_mutex_unlock(&s->mu);
  return err;
}

int fm_store_evict_all(fm_store *s, uint64_t *n) {
  if (n) *n = 0;
  if (!s) return FM_EINVAL;
  pthread_mutex_lock(&s->mu);
  int err = step_done(s, s->st[FM_ST_DEL_ALL], "evict: deleting all entries");
  if (err == FM_OK && n) *n = (uint64_t)sqlite3_changes64(s->db);
  pthread_mutex_unlock(&s->mu);
  return err;
}

/* ---- statistics and usage ----------------------------------------------------------- */

int fm_store_stat_add(fm_store *s, fm_stat stat, int64_t delta) {
  if (!s) return FM_EINVAL;
  pthread_mutex_lock(&s->mu);
  int err = ((int)stat <= 0 || (int)stat >= FM_STAT__COUNT)
                ? fm_store_fail(s, FM_EINVAL, "stat_add: no statistic numbered %d", (int)stat)
                : stat_add_locked(s, stat, delta);
  pthread_mutex_unlock(&s->mu);
  return err;
}

int fm_store_stats(fm_store *s, int64_t out[FM_STAT__COUNT]) {
  if (!s || !out) return FM_EINVAL;
  memset(out, 0, sizeof(int64_t) * FM_STAT__COUNT);
  pthread_mutex_lock(&s->mu);
  sqlite3_stmt *st = s->st[FM_ST_STATS];
  int rc, err = FM_OK;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    int id = sqlite3_column_int(st, 0);
    if (id > 0 && id < FM_STAT__COUNT) out[id] = sqlite3_column_int64(st, 1);
    /* ids from a newer fusemld are kept in the file but not reported */
  }
  if (rc != SQLITE_DONE) err = fm_store_fail_sqlite(s, "reading statistics");
  reset(st);
  pthread_mutex_unlock(&s->mu);
  return err;
}

int fm_store_stats_zero(fm_store *s) {
  if (!s) return FM_EINVAL;
  pthread_mutex_lock(&s->mu);
  int err = sqlite3_exec(s->db, "DELETE FROM stats", NULL, NULL, NULL) == SQLITE_OK
                ? FM_OK
                : fm_store_fail_sqlite(s, "zeroing statistics");
  pthread_mutex_unlock(&s->mu);
  return err;
}

int fm_store_usage(fm_store *s, uint64_t *entries, uint64_t *bytes) {
  if (!s) return FM_EINVAL;
  uint64_t e = 0, b = 0;
  pthread_mutex_lock(&s->mu);
  int err = usage_locked(s, &e, &b);
  pthread_mutex_unlock(&s->mu);
  if (entries) *entries = e;
  if (bytes) *bytes = b;
  return err;
}
