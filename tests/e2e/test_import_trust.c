/* test_import_trust.c: what an import may plant, and what a stored entry must prove before it
 * is served, against real fusemld daemons (compile-only) on real sockets and SQLite files.
 *   - import is refused without a configured secret, and a forged entry (another kernel's
 *     cubin, state tuned, sum and tag recomputed without the secret, or signed with another
 *     one) is refused with one: the fragment is then compiled, never served from the plant;
 *   - an entry exported with the secret imports and is served; an import never replaces a
 *     local tuned entry and never imports a "bad" verdict (skipped, said in the reply);
 *   - imported content is checked like generated content (meta, fragment, timings);
 *   - import and evict from a uid that is neither root nor the daemon's are refused
 *     (permission_denied) while that peer is still served compiles (needs root; else skipped
 *     with the reason printed);
 *   - the stored checksum covers state and key: a row edited from untuned to tuned, or moved
 *     under another fragment's key, is refused (corrupt_entry) and rebuilt, never served; a
 *     row whose checksum is valid but whose key is not its fragment's fingerprint is refused
 *     by lookup {key}.
 * usage: test_import_trust PATH/TO/fusemld */
#define _GNU_SOURCE
#include <grp.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "e2e_util.h"
#include "fm_msg.h"
#include "fm_remote_entry.h"
#include "fm_store.h"
#include "fm_test.h"

#define NOBODY 65534

static const char *fusemld;
static char secret_path[320], other_path[320];
static fm_remote_secret secret, other;
static e2e_daemon A, B, N; /* A, B: the same secret; N: none */
static int fa = -1, fb = -1, fn = -1;

/* ---- requests ---- */

typedef struct reply {
  msgpack_zone zone;
  msgpack_object o;
  char code[32], detail[512];
  int ok;
} reply;

/* Sends r on fd and reads its reply into *out (reply_free after). 0, or -1 with no reply. */
static int call(int fd, e2e_req *r, reply *out) {
  memset(out, 0, sizeof *out);
  msgpack_zone_init(&out->zone, 1 << 16);
  if (e2e_req_send(r, fd) || e2e_recv(fd, 60000, &out->zone, &out->o) != 0) return -1;
  out->ok = e2e_is_ok(&out->o);
  e2e_str(&out->o, "code", out->code, sizeof out->code);
  e2e_str(&out->o, "detail", out->detail, sizeof out->detail);
  return 0;
}

static void reply_free(reply *r) { msgpack_zone_destroy(&r->zone); }

/* The daemon's portable value of key (malloc'd), or NULL. */
static uint8_t *export_value(int fd, const char *key, size_t *len) {
  e2e_req r;
  reply rep;
  uint8_t *val = NULL;
  const uint8_t *p;
  e2e_req_begin(&r, "export", 9, 1);
  fm_pack_kv_cstr(&r.pk, "key", key);
  if (call(fd, &r, &rep) == 0 && rep.ok && fm_msg_get_bin(&rep.o, "entry", &p, len, NULL) == FM_OK &&
      (val = malloc(*len)))
    memcpy(val, p, *len);
  reply_free(&rep);
  return val;
}

/* import val on fd; *imported and skipped (may be NULL) from an ok reply. */
static void import_value(int fd, const uint8_t *val, size_t len, reply *rep) {
  e2e_req r;
  e2e_req_begin(&r, "import", 10, 1);
  fm_pack_cstr(&r.pk, "entry");
  fm_pack_bin(&r.pk, val, len);
  if (call(fd, &r, rep)) snprintf(rep->code, sizeof rep->code, "no reply");
}

static int imported(const reply *rep) {
  bool b = false;
  return rep->ok && fm_msg_get_bool(&rep->o, "imported", &b, NULL) == FM_OK && b;
}

/* lookup {key}: the reply's code ("" if ok), state and cubin (copied into *cubin if asked). */
static void lookup_key(int fd, const char *key, char code[32], char state[16], uint8_t **cubin, size_t *cubin_len) {
  e2e_req r;
  reply rep;
  const uint8_t *p;
  size_t n = 0;
  e2e_req_begin(&r, "lookup", 11, 1);
  fm_pack_kv_cstr(&r.pk, "key", key);
  code[0] = state[0] = '\0';
  if (cubin) *cubin = NULL;
  if (call(fd, &r, &rep)) snprintf(code, 32, "no reply");
  snprintf(code, 32, "%s", rep.code);
  e2e_str(&rep.o, "state", state, 16);
  if (cubin && rep.ok && fm_msg_get_bin(&rep.o, "cubin", &p, &n, NULL) == FM_OK && (*cubin = malloc(n ? n : 1))) {
    memcpy(*cubin, p, n);
    *cubin_len = n;
  }
  reply_free(&rep);
}

/* ---- entries the test builds ---- */

/* A genuine value of fragment (salt, 2 ops) compiled by A, decoded with the secret. */
static int genuine(double salt, char key[65], fm_entry *e, fm_remote_build *b) {
  char origin[16];
  uint8_t *val;
  size_t len;
  fm_diag d = {{0}};
  if (e2e_compile(fa, 1, salt, 2, origin, key) != 0 || !(val = export_value(fa, key, &len))) return -1;
  int err = fm_remote_entry_decode(val, len, &secret, e, b, &d);
  free(val);
  if (err) fprintf(stderr, "  decoding A's export: %s\n", d.text);
  return err ? -1 : 0;
}

/* e encoded with s (NULL: unsigned, the sum and tag recomputed as anyone can). */
static uint8_t *encode(const fm_entry *e, const fm_remote_build *b, const fm_remote_secret *s, size_t *len) {
  fm_remote_secret none = {.len = 0};
  uint8_t *val = NULL;
  if (fm_remote_entry_encode(e, b, s ? s : &none, &val, len) != FM_OK) return NULL;
  return val;
}

/* e signed with the secret and imported into B: accepted, but skipped for a reason with why. */
static void expect_skipped(const fm_entry *e, const fm_remote_build *b, const char *why) {
  reply rep;
  size_t len;
  char reason[160];
  uint8_t *val = encode(e, b, &secret, &len);
  import_value(fb, val, len, &rep);
  CHECK(rep.ok && !imported(&rep));
  e2e_str(&rep.o, "skipped", reason, sizeof reason);
  CHECK_STR_CONTAINS(reason, why);
  reply_free(&rep);
  free(val);
}

static void swap_blob(uint8_t **p, size_t *n, const uint8_t *with, size_t with_len) {
  free(*p);
  *p = malloc(with_len ? with_len : 1);
  memcpy(*p, with, with_len);
  *n = with_len;
}

/* ---- import ---- */

static void test_import_needs_a_secret(void) {
  fm_entry e;
  fm_remote_build b;
  char key[65], origin[16];
  reply rep;
  size_t len;
  CHECK_EQ_INT(genuine(1.0, key, &e, &b), 0);
  /* Even a genuine signed value: N has no secret to check it with. */
  uint8_t *val = encode(&e, &b, &secret, &len);
  import_value(fn, val, len, &rep);
  CHECK(strcmp(rep.code, "permission_denied") == 0);
  CHECK_STR_CONTAINS(rep.detail, "remote-secret-file");
  reply_free(&rep);
  free(val);
  /* A forgery: state tuned, unsigned, its sum and digest recomputed. */
  e.state = FM_STATE_TUNED;
  val = encode(&e, &b, NULL, &len);
  import_value(fn, val, len, &rep);
  CHECK(strcmp(rep.code, "permission_denied") == 0);
  reply_free(&rep);
  free(val);
  CHECK_EQ_INT(e2e_stat(fn, NULL, "entries"), 0);
  CHECK_EQ_INT(e2e_compile(fn, 2, 1.0, 2, origin, NULL), 0);
  CHECK(strcmp(origin, "compiled") == 0);
  fm_entry_free(&e);
}

static void test_forged_entry_refused(void) {
  fm_entry e, donor;
  fm_remote_build b, bd;
  char key[65], donor_key[65], code[32], state[16], origin[16];
  reply rep;
  size_t len;
  CHECK_EQ_INT(genuine(2.0, key, &e, &b), 0);
  CHECK_EQ_INT(genuine(3.0, donor_key, &donor, &bd), 0);
  CHECK(donor.cubin_len != e.cubin_len || memcmp(donor.cubin, e.cubin, e.cubin_len) != 0);
  /* Another kernel's cubin planted under this fragment, claimed tuned. */
  swap_blob(&e.cubin, &e.cubin_len, donor.cubin, donor.cubin_len);
  e.state = FM_STATE_TUNED;
  const fm_remote_secret *forgers[] = {NULL, &other};
  for (int i = 0; i < 2; i++) {
    uint8_t *val = encode(&e, &b, forgers[i], &len);
    import_value(fb, val, len, &rep);
    CHECK(strcmp(rep.code, "permission_denied") == 0);
    CHECK_STR_CONTAINS(rep.detail, i == 0 ? "not signed" : "HMAC");
    reply_free(&rep);
    free(val);
  }
  lookup_key(fb, key, code, state, NULL, NULL);
  CHECK(strcmp(code, "not_found") == 0);
  CHECK_EQ_INT(e2e_compile(fb, 3, 2.0, 2, origin, NULL), 0);
  CHECK(strcmp(origin, "compiled") == 0);
  fm_entry_free(&e);
  fm_entry_free(&donor);
}

static void test_signed_entry_imported(void) {
  char key[65], origin[16], hit_key[65];
  reply rep;
  size_t len;
  CHECK_EQ_INT(e2e_compile(fa, 4, 4.0, 2, origin, key), 0);
  uint8_t *val = export_value(fa, key, &len);
  CHECK(val != NULL);
  if (!val) return;
  import_value(fb, val, len, &rep);
  CHECK(imported(&rep));
  reply_free(&rep);
  free(val);
  CHECK_EQ_INT(e2e_compile(fb, 5, 4.0, 2, origin, hit_key), 0);
  CHECK(strcmp(origin, "hit") == 0);
  CHECK(strcmp(key, hit_key) == 0);
}

static void test_local_entries_kept(void) {
  fm_entry e;
  fm_remote_build b;
  char key[65], code[32], state[16], origin[16];
  reply rep;
  size_t len;
  uint8_t *cubin = NULL;
  size_t cubin_len = 0;
  CHECK_EQ_INT(genuine(5.0, key, &e, &b), 0);
  CHECK_EQ_INT(e2e_compile(fb, 6, 5.0, 2, origin, NULL), 0); /* B's own, untuned */
  CHECK(strcmp(origin, "compiled") == 0);
  /* The same kernel tuned elsewhere improves on B's untuned one: replaced. */
  e.state = FM_STATE_TUNED;
  uint8_t *val = encode(&e, &b, &secret, &len);
  import_value(fb, val, len, &rep);
  CHECK(imported(&rep));
  reply_free(&rep);
  free(val);
  lookup_key(fb, key, code, state, NULL, NULL);
  CHECK(strcmp(state, "tuned") == 0);
  /* Another tuned value for the same key never replaces the local tuned entry. */
  uint8_t planted[64];
  memset(planted, 0x5a, sizeof planted);
  uint8_t *kept = malloc(e.cubin_len);
  size_t kept_len = e.cubin_len;
  memcpy(kept, e.cubin, kept_len);
  swap_blob(&e.cubin, &e.cubin_len, planted, sizeof planted);
  expect_skipped(&e, &b, "local tuned entry is kept");
  lookup_key(fb, key, code, state, &cubin, &cubin_len);
  CHECK(strcmp(state, "tuned") == 0);
  CHECK(cubin && cubin_len == kept_len && memcmp(cubin, kept, kept_len) == 0);
  free(cubin);
  free(kept);
  /* A "bad" verdict is never imported: the fragment stays compilable. */
  fm_entry_free(&e);
  CHECK_EQ_INT(genuine(6.0, key, &e, &b), 0);
  e.state = FM_STATE_BAD;
  expect_skipped(&e, &b, "bad verdict");
  CHECK_EQ_INT(e2e_compile(fb, 7, 6.0, 2, origin, NULL), 0);
  CHECK(strcmp(origin, "compiled") == 0);
  fm_entry_free(&e);
}

/* Signed with the right secret, but content the generator never writes: refused. */
static void test_invalid_content_refused(void) {
  fm_entry e;
  fm_remote_build b;
  char key[65], origin[16];
  reply rep;
  size_t len;
  CHECK_EQ_INT(genuine(7.0, key, &e, &b), 0);
  const uint8_t garbage_meta[] = {0x81, 0xa1, 'k', 0x02}; /* {"k": 2} */
  const uint8_t not_a_map[] = {0x92, 0x01, 0x02};
  struct {
    const char *what, *want;
    int field; /* 0 meta, 1 timings, 2 meta with a trailing byte, 3 canonical with a trailing byte */
    const uint8_t *bytes;
    size_t n;
  } cases[] = {{"garbage meta", "metadata", 0, garbage_meta, sizeof garbage_meta},
               {"timings not a map", "timings", 1, not_a_map, sizeof not_a_map},
               {"meta with a trailing byte", "metadata", 2, NULL, 0},
               {"fragment with a trailing byte", "fragment", 3, NULL, 0}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    fm_entry f = e;
    uint8_t *copy = NULL;
    if (cases[i].field == 0) f.meta = (uint8_t *)cases[i].bytes, f.meta_len = cases[i].n;
    if (cases[i].field == 1) f.timings = (uint8_t *)cases[i].bytes, f.timings_len = cases[i].n;
    if (cases[i].field >= 2) {
      const uint8_t *src = cases[i].field == 2 ? e.meta : e.canonical;
      size_t n = cases[i].field == 2 ? e.meta_len : e.canonical_len;
      copy = malloc(n + 1);
      memcpy(copy, src, n);
      copy[n] = 0xc0;
      if (cases[i].field == 2)
        f.meta = copy, f.meta_len = n + 1;
      else
        f.canonical = copy, f.canonical_len = n + 1;
    }
    uint8_t *val = encode(&f, &b, &secret, &len);
    import_value(fb, val, len, &rep);
    if (rep.ok) fprintf(stderr, "  %s was imported\n", cases[i].what);
    CHECK(!rep.ok && strcmp(rep.code, "permission_denied") != 0);
    CHECK_STR_CONTAINS(rep.detail, cases[i].want);
    reply_free(&rep);
    free(val);
    free(copy);
  }
  CHECK_EQ_INT(e2e_compile(fb, 8, 7.0, 2, origin, NULL), 0);
  CHECK(strcmp(origin, "compiled") == 0);
  fm_entry_free(&e);
}

/* ---- admin commands from another uid ---- */

/* The child, as uid NOBODY: 1 bit per expectation that failed. */
static int other_uid_child(const uint8_t *val, size_t len, const char *key) {
  int fail = 0;
  reply rep;
  e2e_req r;
  char origin[16];
  if (setgroups(0, NULL) || setgid(NOBODY) || setuid(NOBODY)) return 64;
  int fd = e2e_connect_hello(&B);
  if (fd < 0) return 128;
  import_value(fd, val, len, &rep);
  if (strcmp(rep.code, "permission_denied") != 0 || !strstr(rep.detail, "uid 65534")) fail |= 1;
  reply_free(&rep);
  e2e_req_begin(&r, "evict", 12, 1);
  fm_pack_kv_bool(&r.pk, "all", true);
  if (call(fd, &r, &rep) || strcmp(rep.code, "permission_denied") != 0) fail |= 2;
  reply_free(&rep);
  e2e_req_begin(&r, "evict", 13, 1);
  fm_pack_kv_cstr(&r.pk, "key", key);
  if (call(fd, &r, &rep) || strcmp(rep.code, "permission_denied") != 0) fail |= 4;
  reply_free(&rep);
  /* Still a client like any other: its compiles are served. */
  if (e2e_compile(fd, 14, 4.0, 2, origin, NULL) != 0 || strcmp(origin, "hit") != 0) fail |= 8;
  close(fd);
  return fail;
}

static void test_other_uid_refused(void) {
  if (geteuid() != 0) {
    printf("  SKIP test_other_uid_refused: needs root to run a client as another uid (running as uid %u)\n",
           (unsigned)geteuid());
    return;
  }
  char key[65], origin[16];
  size_t len;
  CHECK_EQ_INT(e2e_compile(fa, 20, 20.0, 2, origin, key), 0);
  uint8_t *val = export_value(fa, key, &len);
  CHECK(val != NULL);
  if (!val) return;
  int64_t entries = e2e_stat(fb, NULL, "entries");
  /* As in system mode, where the socket's group reaches it: open the socket to the child. */
  CHECK_EQ_INT(chmod(B.dir, 0755), 0);
  CHECK_EQ_INT(chmod(B.sock, 0666), 0);
  char b_key[65];
  CHECK_EQ_INT(e2e_compile(fb, 21, 4.0, 2, origin, b_key), 0); /* one entry the child tries to evict */
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) _exit(other_uid_child(val, len, b_key));
  int st = 0;
  CHECK_EQ_INT(waitpid(pid, &st, 0), pid);
  CHECK(WIFEXITED(st));
  if (WEXITSTATUS(st)) fprintf(stderr, "  child failed expectations 0x%x\n", WEXITSTATUS(st));
  CHECK_EQ_INT(WEXITSTATUS(st), 0);
  CHECK_EQ_INT(e2e_stat(fb, NULL, "entries"), entries);
  CHECK(e2e_log_contains(&B, "refused: uid 65534 is neither root nor the daemon's uid"));
  /* Root (here also the daemon's uid) may. */
  reply rep;
  import_value(fb, val, len, &rep);
  CHECK(imported(&rep));
  reply_free(&rep);
  free(val);
  e2e_req r;
  e2e_req_begin(&r, "evict", 22, 1);
  fm_pack_kv_cstr(&r.pk, "key", key);
  CHECK_EQ_INT(call(fb, &r, &rep), 0);
  CHECK(rep.ok);
  reply_free(&rep);
}

/* ---- the stored checksum and lookup by key ---- */

static int db_exec(const char *path, const char *sql) {
  sqlite3 *db = NULL;
  char *msg = NULL;
  int rc = sqlite3_open(path, &db);
  if (rc == SQLITE_OK) rc = sqlite3_exec(db, sql, NULL, NULL, &msg);
  if (rc != SQLITE_OK) fprintf(stderr, "  %s: %s\n", sql, msg ? msg : sqlite3_errmsg(db));
  sqlite3_free(msg);
  sqlite3_close(db);
  return rc;
}

/* The device string a row of `hex_key` is stored under: "none/sm_90a" on a host without a GPU,
 * the GPU's identity on one with. Empty when there is no such row. */
static void db_device(const char *path, const char *hex_key, char *out, size_t cap) {
  sqlite3 *db = NULL;
  sqlite3_stmt *st = NULL;
  char sql[160];
  out[0] = '\0';
  snprintf(sql, sizeof sql, "SELECT device FROM kernels WHERE key = x'%s'", hex_key);
  if (sqlite3_open(path, &db) == SQLITE_OK && sqlite3_prepare_v2(db, sql, -1, &st, NULL) == SQLITE_OK &&
      sqlite3_step(st) == SQLITE_ROW)
    snprintf(out, cap, "%s", (const char *)sqlite3_column_text(st, 0));
  sqlite3_finalize(st);
  sqlite3_close(db);
}

static void stop_n(void) {
  close(fn);
  fn = -1;
  int st = e2e_stop(&N, SIGTERM, 30000);
  CHECK(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

static void start_n(void) {
  CHECK_EQ_INT(e2e_start(&N, NULL), 0);
  fn = e2e_connect_hello(&N);
  CHECK(fn >= 0);
}

static void test_state_edit_refused(void) {
  char key[65], origin[16], code[32], state[16], sql[256];
  CHECK_EQ_INT(e2e_compile(fn, 30, 30.0, 2, origin, key), 0);
  int64_t corrupt = e2e_stat(fn, "stats", "corrupt_entries");
  stop_n();
  snprintf(sql, sizeof sql, "UPDATE kernels SET state = 1 WHERE key = x'%s'", key);
  CHECK_EQ_INT(db_exec(N.db, sql), SQLITE_OK);
  start_n();
  lookup_key(fn, key, code, state, NULL, NULL);
  CHECK(strcmp(code, "corrupt_entry") == 0);
  CHECK_EQ_INT(e2e_stat(fn, "stats", "corrupt_entries"), corrupt + 1);
  /* Rebuilt, and the same edit again, seen by compile this time: rebuilt again, untuned as it
   * really is. */
  CHECK_EQ_INT(e2e_compile(fn, 31, 30.0, 2, origin, NULL), 0);
  CHECK(strcmp(origin, "compiled") == 0);
  stop_n();
  CHECK_EQ_INT(db_exec(N.db, sql), SQLITE_OK);
  start_n();
  CHECK_EQ_INT(e2e_compile(fn, 32, 30.0, 2, origin, NULL), 0);
  CHECK(strcmp(origin, "compiled") == 0);
  lookup_key(fn, key, code, state, NULL, NULL);
  CHECK(code[0] == '\0' && strcmp(state, "untuned") == 0);
}

static void test_moved_row_refused(void) {
  char p_key[65], q_key[65], origin[16], code[32], state[16], sql[512];
  CHECK_EQ_INT(e2e_compile(fn, 40, 40.0, 2, origin, p_key), 0);
  CHECK_EQ_INT(e2e_compile(fn, 41, 41.0, 3, origin, q_key), 0);
  stop_n();
  snprintf(sql, sizeof sql, "DELETE FROM kernels WHERE key = x'%s'; UPDATE kernels SET key = x'%s' WHERE key = x'%s'",
           q_key, q_key, p_key);
  CHECK_EQ_INT(db_exec(N.db, sql), SQLITE_OK);
  start_n();
  lookup_key(fn, q_key, code, state, NULL, NULL);
  CHECK(strcmp(code, "corrupt_entry") == 0);
  CHECK_EQ_INT(e2e_compile(fn, 42, 41.0, 3, origin, NULL), 0);
  CHECK(strcmp(origin, "compiled") == 0);

  /* A row put under Q's key through the store itself (its checksum valid): only the
   * fingerprint of its fragment tells. P is built again first (its row went above). */
  CHECK_EQ_INT(e2e_compile(fn, 43, 40.0, 2, origin, NULL), 0);
  CHECK(strcmp(origin, "compiled") == 0);
  stop_n();
  fm_store *s = NULL;
  fm_diag d = {{0}};
  fm_entry e;
  fm_key p, q;
  CHECK_EQ_INT(fm_key_from_hex(p_key, 64, &p), FM_OK);
  CHECK_EQ_INT(fm_key_from_hex(q_key, 64, &q), FM_OK);
  char device[128];
  db_device(N.db, p_key, device, sizeof device);
  CHECK(device[0] != '\0');
  CHECK_EQ_INT(fm_store_open(N.db, 0, &s, &d), FM_OK);
  CHECK_EQ_INT(fm_store_get(s, &p, device, 0, &e), FM_OK);
  e.key = q;
  e.state = FM_STATE_TUNED;
  CHECK_EQ_INT(fm_store_put(s, &e), FM_OK);
  fm_entry_free(&e);
  fm_store_close(s);
  start_n();
  lookup_key(fn, q_key, code, state, NULL, NULL);
  CHECK(strcmp(code, "corrupt_entry") == 0);
  CHECK(e2e_log_contains(&N, "does not hold the fragment its key names"));
  lookup_key(fn, q_key, code, state, NULL, NULL);
  CHECK(strcmp(code, "not_found") == 0); /* removed */
  lookup_key(fn, p_key, code, state, NULL, NULL);
  CHECK(code[0] == '\0' && strcmp(state, "untuned") == 0); /* the real one is untouched */
}

static int write_secret(const char *path, const char *text, fm_remote_secret *s) {
  FILE *f = fopen(path, "w");
  if (!f) return -1;
  fputs(text, f);
  fclose(f);
  fm_diag d;
  return fm_remote_secret_load(path, s, &d) == FM_OK ? 0 : -1;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s PATH/TO/fusemld\n", argv[0]);
    return 2;
  }
  fusemld = argv[1];
  signal(SIGPIPE, SIG_IGN);
  int setup = e2e_setup(&A, fusemld) || e2e_setup(&B, fusemld) || e2e_setup(&N, fusemld);
  snprintf(secret_path, sizeof secret_path, "%s/secret", A.dir);
  snprintf(other_path, sizeof other_path, "%s/other", A.dir);
  const char *args[] = {"--remote-secret-file", secret_path, NULL};
  if (setup || write_secret(secret_path, "this node's secret\n", &secret) ||
      write_secret(other_path, "someone else's secret\n", &other) || e2e_start(&A, args) || e2e_start(&B, args) ||
      e2e_start(&N, NULL) || (fa = e2e_connect_hello(&A)) < 0 || (fb = e2e_connect_hello(&B)) < 0 ||
      (fn = e2e_connect_hello(&N)) < 0) {
    fprintf(stderr, "cannot start the daemons\n");
    e2e_teardown(&A, 1);
    e2e_teardown(&B, 1);
    e2e_teardown(&N, 1);
    printf("0 passed, 1 failed\n");
    return 1;
  }
  RUN(test_import_needs_a_secret);
  RUN(test_forged_entry_refused);
  RUN(test_signed_entry_imported);
  RUN(test_local_entries_kept);
  RUN(test_invalid_content_refused);
  RUN(test_other_uid_refused);
  RUN(test_state_edit_refused);
  RUN(test_moved_row_refused);
  int failed = fm_test_failed_ != 0;
  close(fa);
  close(fb);
  if (fn >= 0) close(fn);
  e2e_teardown(&A, failed);
  e2e_teardown(&B, failed);
  e2e_teardown(&N, failed);
  return FM_TEST_DONE();
}
