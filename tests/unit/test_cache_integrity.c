/* test_cache_integrity.c: the kernel store under damage: bit-flipped blobs, edited fields
 * (state, key, device, kind, source), a file that is not a database, a corrupted page, a
 * schema from the future, version-0 and version-1 files, a writer killed with SIGKILL
 * mid-stream, and a disk that fills up during a put. */
#include "test_cache_util.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>

#include "fm_test.h"

static char g_dir[512];

static void path_of(char *out, size_t cap, const char *name) { snprintf(out, cap, "%s/%s", g_dir, name); }

/* Runs one statement through a separate connection, as an outside tool would. */
static int raw_exec(const char *path, const char *sql) {
  sqlite3 *db = NULL;
  int rc = sqlite3_open(path, &db);
  if (rc == SQLITE_OK) {
    sqlite3_busy_timeout(db, 5000);
    char *msg = NULL;
    rc = sqlite3_exec(db, sql, NULL, NULL, &msg);
    if (rc != SQLITE_OK) fprintf(stderr, "  raw_exec %s: %s\n", sql, msg ? msg : "?");
    sqlite3_free(msg);
  }
  sqlite3_close(db);
  return rc;
}

/* First column of the first row of a query, as text ("" when none). */
static void raw_query(const char *path, const char *sql, char *out, size_t cap) {
  sqlite3 *db = NULL;
  sqlite3_stmt *st = NULL;
  out[0] = '\0';
  if (sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL) == SQLITE_OK &&
      sqlite3_prepare_v2(db, sql, -1, &st, NULL) == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW) {
    const unsigned char *t = sqlite3_column_text(st, 0);
    snprintf(out, cap, "%s", t ? (const char *)t : "");
  } else {
    snprintf(out, cap, "error: %s", db ? sqlite3_errmsg(db) : "open failed");
  }
  sqlite3_finalize(st);
  sqlite3_close(db);
}

static int count_corrupt_files(const char *base) {
  DIR *dir = opendir(g_dir);
  int n = 0;
  char prefix[128];
  snprintf(prefix, sizeof prefix, "%s.corrupt-", base);
  for (struct dirent *de; dir && (de = readdir(dir));)
    if (strncmp(de->d_name, prefix, strlen(prefix)) == 0) n++;
  if (dir) closedir(dir);
  return n;
}

static void write_file(const char *path, const void *data, size_t n) {
  FILE *f = fopen(path, "wb");
  CHECK(f != NULL);
  if (!f) return;
  CHECK_EQ_INT(fwrite(data, 1, n, f), n);
  fclose(f);
}

static fm_store *open_ok(const char *path, uint64_t cap, fm_diag *d) {
  fm_store *s = NULL;
  int err = fm_store_open(path, cap, &s, d);
  if (err != FM_OK) fprintf(stderr, "  open %s: %s: %s\n", path, fm_strerror(err), d->text);
  CHECK_EQ_INT(err, FM_OK);
  return s;
}

static void put_seed(fm_store *s, unsigned seed, size_t cubin_len) {
  fm_entry e;
  tc_entry(&e, seed, 0, cubin_len);
  CHECK_EQ_INT(fm_store_put(s, &e), FM_OK);
  fm_entry_free(&e);
}

static int get_seed(fm_store *s, unsigned seed) {
  fm_key k = tc_key(seed);
  fm_entry got;
  int err = fm_store_get(s, &k, TC_DEVICE, 0, &got);
  if (err == FM_OK) {
    fm_entry want;
    tc_entry(&want, seed, 0, got.cubin_len);
    CHECK(tc_same_content(&want, &got));
    fm_entry_free(&want);
  }
  fm_entry_free(&got);
  return err;
}

/* Expects get of key+device to find the entry damaged, delete and count it. */
static void expect_corrupt(fm_store *s, const fm_key *k, const char *device, int64_t corrupt_before) {
  fm_entry got;
  CHECK_EQ_INT(fm_store_get(s, k, device, 1, &got), FM_ECORRUPT);
  CHECK(got.cubin == NULL);
  fm_diag d;
  fm_store_last_error(s, &d);
  CHECK(d.text[0] != '\0');
  CHECK_EQ_INT(fm_store_get(s, k, device, 0, &got), FM_ENOT_FOUND);
  int64_t st[FM_STAT__COUNT];
  CHECK_EQ_INT(fm_store_stats(s, st), FM_OK);
  CHECK_EQ_INT(st[FM_STAT_CORRUPT], corrupt_before + 1);
}

/* Damages one entry with raw SQL, then expects get to notice, delete and count it. */
static void corrupt_and_check(const char *path, fm_store *s, unsigned seed, const char *set_clause,
                              int64_t corrupt_before) {
  char sql[512], hex[FM_KEY_HEX];
  fm_key k = tc_key(seed);
  fm_key_to_hex(&k, hex);
  snprintf(sql, sizeof sql, "UPDATE kernels SET %s WHERE key = x'%s'", set_clause, hex);
  CHECK_EQ_INT(raw_exec(path, sql), SQLITE_OK);
  expect_corrupt(s, &k, TC_DEVICE, corrupt_before);
}

static void test_corrupt_blob(void) {
  char path[600];
  fm_diag d;
  path_of(path, sizeof path, "corrupt.db");
  fm_store *s = open_ok(path, 0, &d);
  for (unsigned i = 1; i <= 5; i++) put_seed(s, i, 3000);
  /* Same length, one byte changed: only the checksum can tell. */
  corrupt_and_check(path, s, 1, "cubin = substr(cubin, 1, 99) || x'00' || substr(cubin, 101)", 0);
  fm_store_last_error(s, &d);
  corrupt_and_check(path, s, 2, "canonical = x'00' || substr(canonical, 2)", 1);
  corrupt_and_check(path, s, 3, "meta = substr(meta, 1, length(meta) - 1)", 2);
  /* Bytes moved from one blob to its neighbour: the lengths are hashed too. */
  corrupt_and_check(path, s, 4, "meta = canonical || meta, canonical = x''", 3);
  /* A truncated cubin disagrees with size before any hashing. */
  corrupt_and_check(path, s, 5, "cubin = substr(cubin, 1, 10)", 4);
  uint64_t n = 9;
  CHECK_EQ_INT(fm_store_usage(s, &n, NULL), FM_OK);
  CHECK_EQ_INT(n, 0);
  /* The caller rebuilds: a fresh put serves again. */
  put_seed(s, 1, 3000);
  CHECK_EQ_INT(get_seed(s, 1), FM_OK);
  fm_store_close(s);
}

/* Every served field is under the checksum, not only the blobs: an untuned entry edited to
 * "tuned", a row moved under another key or device, an edited kind, source or timings are
 * each refused, never served. */
static void test_checksum_covers_served_fields(void) {
  char path[600], sql[512], hex[FM_KEY_HEX], other[FM_KEY_HEX];
  fm_diag d;
  path_of(path, sizeof path, "fields.db");
  fm_store *s = open_ok(path, 0, &d);
  for (unsigned i = 1; i <= 7; i++) {
    fm_entry e;
    tc_entry(&e, i, 0, 2000);
    e.state = FM_STATE_UNTUNED;
    CHECK_EQ_INT(fm_store_put(s, &e), FM_OK);
    fm_entry_free(&e);
  }
  corrupt_and_check(path, s, 1, "state = 1", 0);
  corrupt_and_check(path, s, 2, "kind = 'rows'", 1);
  corrupt_and_check(path, s, 3, "source = source || ' '", 2);
  corrupt_and_check(path, s, 4, "timings = x'00' || timings", 3);
  corrupt_and_check(path, s, 5, "source = NULL", 4);
  /* Moved under the key of a fragment the store does not hold (seed 99). */
  fm_key k6 = tc_key(6), k99 = tc_key(99);
  fm_key_to_hex(&k6, hex);
  fm_key_to_hex(&k99, other);
  snprintf(sql, sizeof sql, "UPDATE kernels SET key = x'%s' WHERE key = x'%s'", other, hex);
  CHECK_EQ_INT(raw_exec(path, sql), SQLITE_OK);
  expect_corrupt(s, &k99, TC_DEVICE, 5);
  /* Moved under another device label. */
  fm_key k7 = tc_key(7);
  fm_key_to_hex(&k7, hex);
  snprintf(sql, sizeof sql, "UPDATE kernels SET device = 'none/sm_80' WHERE key = x'%s'", hex);
  CHECK_EQ_INT(raw_exec(path, sql), SQLITE_OK);
  expect_corrupt(s, &k7, "none/sm_80", 6);
  /* An untouched entry with a NULL source and no timings still verifies. */
  fm_entry e;
  tc_entry(&e, 8, 0, 100);
  free(e.source);
  free(e.timings);
  e.source = NULL;
  e.timings = NULL;
  e.timings_len = 0;
  CHECK_EQ_INT(fm_store_put(s, &e), FM_OK);
  fm_entry got;
  CHECK_EQ_INT(fm_store_get(s, &e.key, TC_DEVICE, 0, &got), FM_OK);
  CHECK(got.source == NULL && got.timings_len == 0);
  fm_entry_free(&got);
  fm_entry_free(&e);
  fm_store_close(s);
}

/* put_unless keeps an entry whose state is in the mask, and replaces any other. */
static void test_put_unless(void) {
  char path[600];
  fm_diag d;
  path_of(path, sizeof path, "unless.db");
  fm_store *s = open_ok(path, 0, &d);
  fm_entry tuned, untuned, got;
  tc_entry(&tuned, 1, 0, 300);
  tc_entry(&untuned, 1, 1, 300);
  untuned.state = FM_STATE_UNTUNED;
  int kept = 5;
  const unsigned keep = FM_STATE_BIT(FM_STATE_TUNED) | FM_STATE_BIT(FM_STATE_BAD);
  CHECK_EQ_INT(fm_store_put_unless(s, &untuned, keep, &kept), FM_OK); /* none: stored */
  CHECK_EQ_INT(kept, -1);
  CHECK_EQ_INT(fm_store_put_unless(s, &tuned, keep, &kept), FM_OK); /* untuned: replaced */
  CHECK_EQ_INT(kept, -1);
  CHECK_EQ_INT(fm_store_put_unless(s, &untuned, keep, &kept), FM_OK); /* tuned: kept */
  CHECK_EQ_INT(kept, FM_STATE_TUNED);
  CHECK_EQ_INT(fm_store_get(s, &tuned.key, TC_DEVICE, 0, &got), FM_OK);
  CHECK(tc_same_content(&tuned, &got));
  fm_entry_free(&got);
  fm_entry_free(&tuned);
  fm_entry_free(&untuned);
  fm_store_close(s);
}

static void test_checksum_reason(void) {
  char path[600];
  fm_diag d;
  path_of(path, sizeof path, "reason.db");
  fm_store *s = open_ok(path, 0, &d);
  put_seed(s, 9, 500);
  char sql[256], hex[FM_KEY_HEX];
  fm_key k = tc_key(9);
  fm_key_to_hex(&k, hex);
  snprintf(sql, sizeof sql, "UPDATE kernels SET cubin = zeroblob(500) WHERE key = x'%s'", hex);
  CHECK_EQ_INT(raw_exec(path, sql), SQLITE_OK);
  CHECK_EQ_INT(get_seed(s, 9), FM_ECORRUPT);
  fm_store_last_error(s, &d);
  CHECK_STR_CONTAINS(d.text, "checksum");
  fm_store_close(s);
}

static void test_garbage_file(void) {
  char path[600], wal[620], buf[8192];
  path_of(path, sizeof path, "garbage.db");
  snprintf(wal, sizeof wal, "%s-wal", path);
  for (size_t i = 0; i < sizeof buf; i++) buf[i] = "this is not a database\n"[i % 23];
  write_file(path, buf, sizeof buf);
  write_file(wal, "GARBAGE-WAL", 11);

  fm_diag d = {{0}};
  fm_store *s = open_ok(path, 0, &d);
  CHECK_STR_CONTAINS(d.text, "moved it to");
  CHECK_STR_CONTAINS(d.text, "garbage.db.corrupt-");
  CHECK_EQ_INT(count_corrupt_files("garbage.db"), 1);
  put_seed(s, 1, 100);
  CHECK_EQ_INT(get_seed(s, 1), FM_OK);
  fm_store_close(s);

  /* The old WAL went with the damaged file; the moved file kept its bytes. */
  char head[16] = {0};
  FILE *f = fopen(wal, "rb");
  if (f) {
    CHECK(fread(head, 1, 11, f) < 11 || memcmp(head, "GARBAGE-WAL", 11) != 0);
    fclose(f);
  }
  char moved[700];
  const char *to = strstr(d.text, "moved it to ");
  snprintf(moved, sizeof moved, "%s", to ? to + strlen("moved it to ") : "");
  char *end = strstr(moved, " and started");
  CHECK(end != NULL);
  if (end) *end = '\0';
  struct stat sb;
  CHECK(stat(moved, &sb) == 0 && sb.st_size == (off_t)sizeof buf);

  /* A second damaged file in the same second gets its own name. */
  write_file(path, buf, sizeof buf);
  s = open_ok(path, 0, &d);
  CHECK_STR_CONTAINS(d.text, "moved it to");
  CHECK_EQ_INT(count_corrupt_files("garbage.db"), 2);
  CHECK_EQ_INT(get_seed(s, 1), FM_ENOT_FOUND);
  fm_store_close(s);
}

/* A real database whose pages are damaged fails quick_check and is moved aside too. */
static void test_damaged_pages(void) {
  char path[600];
  fm_diag d;
  path_of(path, sizeof path, "pages.db");
  fm_store *s = open_ok(path, 0, &d);
  for (unsigned i = 0; i < 40; i++) put_seed(s, 100 + i, 2000);
  fm_store_close(s); /* checkpoints: everything is in the main file now */

  int fd = open(path, O_WRONLY);
  CHECK(fd >= 0);
  uint8_t junk[4096];
  memset(junk, 0xA5, sizeof junk);
  for (off_t off = 4096; off < 4096 * 6; off += 4096) /* pages 2..6 keep the header valid */
    CHECK_EQ_INT(pwrite(fd, junk, sizeof junk, off), (ssize_t)sizeof junk);
  close(fd);

  s = open_ok(path, 0, &d);
  CHECK_STR_CONTAINS(d.text, "moved it to");
  CHECK_EQ_INT(count_corrupt_files("pages.db"), 1);
  uint64_t n = 9;
  CHECK_EQ_INT(fm_store_usage(s, &n, NULL), FM_OK);
  CHECK_EQ_INT(n, 0);
  fm_store_close(s);
}

/* A healthy file that another process holds locked past the busy timeout is an error to
 * report, never damage: it must not be moved aside. */
static void test_locked_not_moved(void) {
  char path[600];
  path_of(path, sizeof path, "locked.db");
  sqlite3 *db = NULL;
  CHECK_EQ_INT(sqlite3_open(path, &db), SQLITE_OK);
  CHECK_EQ_INT(sqlite3_exec(db, "CREATE TABLE t(x); BEGIN EXCLUSIVE; INSERT INTO t VALUES(1);", NULL, NULL, NULL),
               SQLITE_OK);
  fm_store *s = NULL;
  fm_diag d = {{0}};
  CHECK_EQ_INT(fm_store_open(path, 0, &s, &d), FM_ESTORE); /* after the 5 s busy timeout */
  CHECK(s == NULL);
  CHECK_STR_CONTAINS(d.text, "locked");
  CHECK_EQ_INT(count_corrupt_files("locked.db"), 0);
  CHECK_EQ_INT(sqlite3_exec(db, "COMMIT", NULL, NULL, NULL), SQLITE_OK);
  sqlite3_close(db);
  s = open_ok(path, 0, &d);
  fm_store_close(s);
}

static void test_newer_version_refused(void) {
  char path[600], v[64];
  path_of(path, sizeof path, "future.db");
  CHECK_EQ_INT(raw_exec(path, "CREATE TABLE kernels(x); PRAGMA user_version = 7;"), SQLITE_OK);
  fm_store *s = (fm_store *)v;
  fm_diag d = {{0}};
  CHECK_EQ_INT(fm_store_open(path, 0, &s, &d), FM_ESTORE);
  CHECK(s == NULL);
  CHECK_STR_CONTAINS(d.text, "schema version 7");
  CHECK_STR_CONTAINS(d.text, "newer");
  /* Not clobbered: same version, same table, nothing moved aside. */
  raw_query(path, "PRAGMA user_version", v, sizeof v);
  CHECK(strcmp(v, "7") == 0);
  raw_query(path, "SELECT sql FROM sqlite_master WHERE name = 'kernels'", v, sizeof v);
  CHECK_STR_CONTAINS(v, "kernels(x)");
  CHECK_EQ_INT(count_corrupt_files("future.db"), 0);
}

static void test_migrate_from_v0(void) {
  char path[600], v[256];
  fm_diag d = {{0}};

  /* An empty file is a version-0 database. */
  path_of(path, sizeof path, "empty.db");
  write_file(path, "", 0);
  fm_store *s = open_ok(path, 0, &d);
  CHECK_EQ_INT(d.text[0], 0);
  put_seed(s, 1, 100);
  CHECK_EQ_INT(get_seed(s, 1), FM_OK);
  fm_store_close(s);
  raw_query(path, "PRAGMA user_version", v, sizeof v);
  CHECK(strcmp(v, "2") == 0);
  raw_query(path, "PRAGMA journal_mode", v, sizeof v);
  CHECK(strcmp(v, "wal") == 0);
  CHECK_EQ_INT(count_corrupt_files("empty.db"), 0);

  /* Version 0 with unrelated tables: they are left alone. */
  path_of(path, sizeof path, "v0.db");
  CHECK_EQ_INT(raw_exec(path, "CREATE TABLE notes(t TEXT); INSERT INTO notes VALUES('keep me');"), SQLITE_OK);
  s = open_ok(path, 0, &d);
  put_seed(s, 2, 100);
  CHECK_EQ_INT(get_seed(s, 2), FM_OK);
  fm_store_close(s);
  raw_query(path, "SELECT t FROM notes", v, sizeof v);
  CHECK(strcmp(v, "keep me") == 0);
  raw_query(path, "PRAGMA user_version", v, sizeof v);
  CHECK(strcmp(v, "2") == 0);
  /* Reopening a current file migrates nothing and keeps the data. */
  s = open_ok(path, 0, &d);
  CHECK_EQ_INT(get_seed(s, 2), FM_OK);
  fm_store_close(s);

  /* Version 0 holding a foreign "kernels" table: the migration fails, the file is untouched. */
  path_of(path, sizeof path, "foreign.db");
  CHECK_EQ_INT(raw_exec(path, "CREATE TABLE kernels(a, b); INSERT INTO kernels VALUES(1, 2);"), SQLITE_OK);
  fm_store *t = NULL;
  CHECK_EQ_INT(fm_store_open(path, 0, &t, &d), FM_ESTORE);
  CHECK(t == NULL);
  CHECK_STR_CONTAINS(d.text, "kernels");
  raw_query(path, "SELECT b FROM kernels", v, sizeof v);
  CHECK(strcmp(v, "2") == 0);
  raw_query(path, "PRAGMA user_version", v, sizeof v);
  CHECK(strcmp(v, "0") == 0);
}

/* A version 1 file (the same tables, a checksum over the blobs alone) opens as version 2 with
 * its entries dropped and reported, its statistics kept: an old entry is rebuilt, never
 * served on a checksum that did not cover its state or key. */
static void test_migrate_from_v1(void) {
  char path[600], v[64];
  fm_diag d = {{0}};
  path_of(path, sizeof path, "v1.db");
  fm_store *s = open_ok(path, 0, &d);
  for (unsigned i = 1; i <= 3; i++) put_seed(s, i, 500);
  CHECK_EQ_INT(fm_store_stat_add(s, FM_STAT_COMPILES, 3), FM_OK);
  fm_store_close(s);
  CHECK_EQ_INT(raw_exec(path, "PRAGMA user_version = 1"), SQLITE_OK);
  s = open_ok(path, 0, &d);
  CHECK_STR_CONTAINS(d.text, "dropped 3 entries");
  raw_query(path, "PRAGMA user_version", v, sizeof v);
  CHECK(strcmp(v, "2") == 0);
  CHECK_EQ_INT(get_seed(s, 1), FM_ENOT_FOUND);
  int64_t st[FM_STAT__COUNT];
  CHECK_EQ_INT(fm_store_stats(s, st), FM_OK);
  CHECK_EQ_INT(st[FM_STAT_COMPILES], 3);
  CHECK_EQ_INT(st[FM_STAT_CORRUPT], 0);
  put_seed(s, 1, 500);
  CHECK_EQ_INT(get_seed(s, 1), FM_OK);
  fm_store_close(s);
  /* Reopened: nothing more to drop, nothing reported. */
  s = open_ok(path, 0, &d);
  CHECK_EQ_INT(d.text[0], 0);
  CHECK_EQ_INT(get_seed(s, 1), FM_OK);
  fm_store_close(s);
}

/* The child: puts (with replacement and eviction) as fast as it can until killed. */
static void writer_child(const char *path, int ready_fd, unsigned round) {
  fm_diag d;
  fm_store *s = NULL;
  if (fm_store_open(path, 200 * 1000, &s, &d) != FM_OK) _exit(3);
  for (unsigned i = 0;; i++) {
    fm_entry e;
    unsigned seed = (i * 7 + round) % 60;
    tc_entry(&e, seed, 0, 1000 + (i * 3301u + round * 977u) % 30000);
    if (fm_store_put(s, &e) != FM_OK) _exit(4);
    fm_entry_free(&e);
    if (i % 5 == 0) fm_store_stat_add(s, FM_STAT_COMPILES, 1);
    if (i % 3 == 0) {
      fm_key k = tc_key((seed + 11) % 60);
      fm_entry got;
      int err = fm_store_get(s, &k, TC_DEVICE, 1, &got);
      fm_entry_free(&got);
      if (err != FM_OK && err != FM_ENOT_FOUND) _exit(5);
    }
    if (i == 20 && write(ready_fd, "r", 1) != 1) _exit(6);
  }
}

typedef struct {
  fm_store *s;
  int checked, bad;
} verify_ctx;

/* Every listed entry must come back through get (checksum verified) with exactly the
 * blobs tc_entry derives for its seed: no torn or mixed-up writes. */
static int verify_one(const fm_entry *e, void *p) {
  verify_ctx *c = p;
  fm_entry got, want;
  int seed = -1;
  for (unsigned i = 0; i < 60 && seed < 0; i++) {
    fm_key k = tc_key(i);
    if (memcmp(k.bytes, e->key.bytes, FM_KEY_BYTES) == 0) seed = (int)i;
  }
  int err = fm_store_get(c->s, &e->key, e->device, 0, &got);
  if (err != FM_OK || seed < 0 || got.cubin_len != e->cubin_len) {
    c->bad++;
  } else {
    tc_entry(&want, (unsigned)seed, 0, got.cubin_len);
    if (!tc_same_content(&want, &got)) c->bad++;
    fm_entry_free(&want);
  }
  fm_entry_free(&got);
  c->checked++;
  return 0;
}

static void test_sigkill_writer(void) {
  char path[600], v[256];
  path_of(path, sizeof path, "killed.db");
  int64_t compiles_seen = 0;
  for (unsigned round = 0; round < 10; round++) {
    int fds[2];
    CHECK_EQ_INT(pipe(fds), 0);
    fflush(NULL);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
      close(fds[0]);
      writer_child(path, fds[1], round);
    }
    close(fds[1]);
    char c;
    CHECK_EQ_INT(read(fds[0], &c, 1), 1); /* the child is mid-stream */
    close(fds[0]);
    struct timespec ts = {0, 50 * 1000 * 1000};
    nanosleep(&ts, NULL);
    kill(pid, SIGKILL);
    int status = 0;
    CHECK_EQ_INT(waitpid(pid, &status, 0), pid);
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    if (WIFEXITED(status)) fprintf(stderr, "  writer exited early with %d\n", WEXITSTATUS(status));

    raw_query(path, "PRAGMA integrity_check", v, sizeof v);
    CHECK(strcmp(v, "ok") == 0);
    fm_diag d = {{0}};
    fm_store *s = open_ok(path, 200 * 1000, &d);
    if (!s) return;
    CHECK_EQ_INT(d.text[0], 0); /* recovered by WAL replay, not moved aside */
    verify_ctx vc = {s, 0, 0};
    CHECK_EQ_INT(fm_store_list(s, 0, verify_one, &vc), FM_OK);
    CHECK(vc.checked > 0);
    CHECK_EQ_INT(vc.bad, 0);
    uint64_t n = 0, bytes = 0;
    CHECK_EQ_INT(fm_store_usage(s, &n, &bytes), FM_OK);
    CHECK(bytes <= 200 * 1000 || n == 1);
    CHECK_EQ_INT((uint64_t)vc.checked, n);
    int64_t st[FM_STAT__COUNT];
    CHECK_EQ_INT(fm_store_stats(s, st), FM_OK);
    CHECK(st[FM_STAT_COMPILES] > compiles_seen); /* committed work from every round survives */
    CHECK_EQ_INT(st[FM_STAT_CORRUPT], 0);
    compiles_seen = st[FM_STAT_COMPILES];
    fm_store_close(s);
  }
  CHECK_EQ_INT(count_corrupt_files("killed.db"), 0);
}

/* The child writes until the file size limit makes SQLite's writes fail (EFBIG), as on a
 * full disk; it reports by exit status which expectation failed. */
static void full_child(const char *path) {
  fm_diag d;
  fm_store *s = NULL;
  if (fm_store_open(path, 0, &s, &d) != FM_OK) _exit(10);
  for (unsigned i = 0; i < 5; i++) {
    fm_entry e;
    tc_entry(&e, 200 + i, 0, 2000);
    if (fm_store_put(s, &e) != FM_OK) _exit(11);
    fm_entry_free(&e);
  }
  signal(SIGXFSZ, SIG_IGN);
  struct rlimit rl = {256 * 1024, 256 * 1024};
  if (setrlimit(RLIMIT_FSIZE, &rl) != 0) _exit(12);
  fm_entry big;
  tc_entry(&big, 300, 0, 1024 * 1024);
  if (fm_store_put(s, &big) != FM_ESTORE) _exit(13);
  fm_entry_free(&big);
  fm_store_last_error(s, &d);
  if (!strstr(d.text, "full") && !strstr(d.text, "I/O")) _exit(14);
  /* The store still serves what it had. */
  for (unsigned i = 0; i < 5; i++) {
    fm_key k = tc_key(200 + i);
    fm_entry got;
    if (fm_store_get(s, &k, TC_DEVICE, 0, &got) != FM_OK) _exit(15);
    fm_entry_free(&got);
  }
  fm_store_close(s);
  _exit(0);
}

static void test_disk_full(void) {
  char path[600], v[256];
  path_of(path, sizeof path, "full.db");
  fflush(NULL);
  pid_t pid = fork();
  CHECK(pid >= 0);
  if (pid == 0) full_child(path);
  int status = 0;
  CHECK_EQ_INT(waitpid(pid, &status, 0), pid);
  CHECK(WIFEXITED(status));
  CHECK_EQ_INT(WEXITSTATUS(status), 0);

  raw_query(path, "PRAGMA integrity_check", v, sizeof v);
  CHECK(strcmp(v, "ok") == 0);
  fm_diag d = {{0}};
  fm_store *s = open_ok(path, 0, &d);
  if (!s) return;
  CHECK_EQ_INT(d.text[0], 0);
  for (unsigned i = 0; i < 5; i++) CHECK_EQ_INT(get_seed(s, 200 + i), FM_OK);
  CHECK_EQ_INT(get_seed(s, 300), FM_ENOT_FOUND);
  put_seed(s, 300, 1024 * 1024); /* with room again, the same put works */
  CHECK_EQ_INT(get_seed(s, 300), FM_OK);
  fm_store_close(s);
}

int main(void) {
  tc_mkdtemp(g_dir, sizeof g_dir);
  RUN(test_corrupt_blob);
  RUN(test_checksum_covers_served_fields);
  RUN(test_put_unless);
  RUN(test_checksum_reason);
  RUN(test_garbage_file);
  RUN(test_damaged_pages);
  RUN(test_locked_not_moved);
  RUN(test_newer_version_refused);
  RUN(test_migrate_from_v0);
  RUN(test_migrate_from_v1);
  RUN(test_sigkill_writer);
  RUN(test_disk_full);
  tc_rmtree(g_dir);
  return FM_TEST_DONE();
}
