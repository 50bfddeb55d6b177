/* test_daemon_e2e.c: a real fusemld on a temp socket and database, driven over raw sockets.
 * usage: test_daemon_e2e PATH/TO/fusemld */
#define _GNU_SOURCE
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "e2e_util.h"
#include "fm_msg.h"
#include "fm_proto.h"
#include "fm_test.h"

static e2e_daemon D;
static int failed_start;

/* A slow-to-compile fragment for the shutdown test: enough ops that NVRTC takes a while. */
#define SLOW_OPS 240

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

static int client(void) {
  int fd = e2e_connect(D.sock);
  if (fd >= 0 && e2e_hello(fd) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

/* Sends a request with no fields and returns the reply's "code" ("" for ok). */
static int simple_request(int fd, const char *op, uint64_t id, char code[32]) {
  e2e_req r;
  e2e_req_begin(&r, op, id, 0);
  if (e2e_req_send(&r, fd)) return -1;
  msgpack_zone z;
  msgpack_object o;
  msgpack_zone_init(&z, 4096);
  int rc = e2e_recv(fd, 10000, &z, &o);
  if (rc == 0) {
    uint64_t got_id = 0;
    fm_msg_get_u64(&o, "id", &got_id, NULL);
    if (got_id != id) rc = -4;
    e2e_str(&o, "code", code, 32);
  }
  msgpack_zone_destroy(&z);
  return rc;
}

static int read_code(int fd, char code[32], char detail[256]) {
  msgpack_zone z;
  msgpack_object o;
  msgpack_zone_init(&z, 4096);
  int rc = e2e_recv(fd, 10000, &z, &o);
  code[0] = '\0';
  if (detail) detail[0] = '\0';
  if (rc == 0) {
    e2e_str(&o, "code", code, 32);
    if (detail) e2e_str(&o, "detail", detail, 256);
  }
  msgpack_zone_destroy(&z);
  return rc;
}

/* ---- tests ---- */

static void test_compile_then_hit(void) {
  int fd = client();
  CHECK(fd >= 0);
  char origin[16], key1[65], key2[65];
  CHECK_EQ_INT(e2e_compile(fd, 10, 1.5, 3, origin, key1), 0);
  CHECK(strcmp(origin, "compiled") == 0);
  CHECK_EQ_INT(strlen(key1), 64);
  CHECK_EQ_INT(e2e_compile(fd, 11, 1.5, 3, origin, key2), 0);
  CHECK(strcmp(origin, "hit") == 0);
  CHECK(strcmp(key1, key2) == 0);
  CHECK_EQ_INT(e2e_stat(fd, "stats", "hits"), 1);
  CHECK_EQ_INT(e2e_stat(fd, "stats", "misses"), 1);
  CHECK_EQ_INT(e2e_stat(fd, "stats", "compiles"), 1);
  CHECK_EQ_INT(e2e_stat(fd, "session", "compiles"), 1);
  CHECK_EQ_INT(e2e_stat(fd, NULL, "entries"), 1);
  close(fd);
}

static void test_reply_shape(void) {
  /* The whole compile reply: every field of fm_proto.h with its type. */
  int fd = client();
  e2e_req r;
  e2e_req_begin(&r, "compile", 12, 1);
  fm_pack_cstr(&r.pk, "fragment");
  e2e_pack_fragment(&r.pk, 1.5, 3);
  CHECK_EQ_INT(e2e_req_send(&r, fd), 0);
  msgpack_zone z;
  msgpack_object o;
  msgpack_zone_init(&z, 65536);
  CHECK_EQ_INT(e2e_recv(fd, 10000, &z, &o), 0);
  char s[32];
  const uint8_t *cubin = NULL;
  size_t cubin_len = 0;
  e2e_str(&o, "kind", s, sizeof s);
  CHECK(strcmp(s, "pointwise") == 0);
  e2e_str(&o, "state", s, sizeof s);
  CHECK(strcmp(s, "untuned") == 0);
  CHECK_EQ_INT(fm_msg_get_bin(&o, "cubin", &cubin, &cubin_len, NULL), FM_OK);
  CHECK(cubin_len > 64);
  /* A CUBIN is an ELF file. */
  CHECK(cubin && memcmp(cubin, "\177ELF", 4) == 0);
  const msgpack_object *meta = fm_msg_get(&o, "meta");
  CHECK(meta && meta->type == MSGPACK_OBJECT_MAP);
  msgpack_zone_destroy(&z);
  close(fd);
}

typedef struct racer {
  pthread_barrier_t *barrier;
  int index;
  char origin[16];
  int rc;
} racer;

static void *race(void *arg) {
  racer *r = arg;
  int fd = client();
  pthread_barrier_wait(r->barrier);
  r->rc = fd < 0 ? -1 : e2e_compile(fd, 100 + (uint64_t)r->index, 2.25, 30, r->origin, NULL);
  if (fd >= 0) close(fd);
  return NULL;
}

static void test_concurrent_clients_one_compile(void) {
  enum { N = 32 };
  int fd = client();
  int64_t compiles0 = e2e_stat(fd, "stats", "compiles");
  int64_t joined0 = e2e_stat(fd, "stats", "joined_inflight");
  pthread_barrier_t barrier;
  pthread_barrier_init(&barrier, NULL, N);
  racer rs[N];
  pthread_t th[N];
  for (int i = 0; i < N; i++) {
    rs[i] = (racer){.barrier = &barrier, .index = i};
    pthread_create(&th[i], NULL, race, &rs[i]);
  }
  int compiled = 0, joined = 0, hits = 0;
  for (int i = 0; i < N; i++) {
    pthread_join(th[i], NULL);
    CHECK_EQ_INT(rs[i].rc, 0);
    compiled += strcmp(rs[i].origin, "compiled") == 0;
    joined += strcmp(rs[i].origin, "joined") == 0;
    hits += strcmp(rs[i].origin, "hit") == 0;
  }
  pthread_barrier_destroy(&barrier);
  CHECK_EQ_INT(compiled, 1);
  CHECK_EQ_INT(joined + hits, N - 1);
  CHECK_EQ_INT(e2e_stat(fd, "stats", "compiles") - compiles0, 1);
  CHECK_EQ_INT(e2e_stat(fd, "stats", "joined_inflight") - joined0, joined);
  printf("     (%d joined, %d hits)\n", joined, hits);
  close(fd);
}

static void test_malformed_frame_keeps_connection(void) {
  int fd = client();
  char code[32];
  int64_t bad0 = e2e_stat(fd, "stats", "bad_requests");
  const uint8_t junk[] = {0xc1, 0x00, 0x01}; /* 0xc1 is never valid msgpack */
  CHECK_EQ_INT(e2e_send_frame(fd, junk, sizeof junk), 0);
  CHECK_EQ_INT(read_code(fd, code, NULL), 0);
  CHECK(strcmp(code, "malformed") == 0);
  /* A map that is not a request: no id. */
  const uint8_t empty_map[] = {0x80};
  CHECK_EQ_INT(e2e_send_frame(fd, empty_map, sizeof empty_map), 0);
  CHECK_EQ_INT(read_code(fd, code, NULL), 0);
  CHECK(strcmp(code, "bad_request") == 0);
  CHECK_EQ_INT(simple_request(fd, "ping", 5, code), 0);
  CHECK(code[0] == '\0');
  CHECK_EQ_INT(e2e_stat(fd, "stats", "bad_requests") - bad0, 2);
  close(fd);
}

static void test_oversized_frame_closes(void) {
  int fd = client();
  const uint8_t header[4] = {0x80, 0, 0, 0}; /* 2^31 bytes */
  char code[32];
  CHECK_EQ_INT(e2e_send_raw(fd, header, 4), 0);
  CHECK_EQ_INT(read_code(fd, code, NULL), 0);
  CHECK(strcmp(code, "frame_too_large") == 0);
  CHECK(e2e_wait_closed(fd, 5000));
  close(fd);
  fd = client();
  CHECK(fd >= 0);
  CHECK_EQ_INT(simple_request(fd, "ping", 6, code), 0);
  close(fd);
}

static void test_truncated_frame_then_hangup(void) {
  int fd = client();
  const uint8_t part[] = {0, 0, 0, 100, 0x82, 0xa2, 'o', 'p'}; /* 4 of 100 bytes */
  CHECK_EQ_INT(e2e_send_raw(fd, part, sizeof part), 0);
  close(fd);
  fd = client();
  char code[32];
  CHECK(fd >= 0);
  CHECK_EQ_INT(simple_request(fd, "ping", 7, code), 0);
  CHECK(e2e_log_contains(&D, "closed with 8 bytes of an incomplete frame"));
  close(fd);
}

static void test_hangup_before_compile_reply(void) {
  int fd = client();
  e2e_req r;
  e2e_req_begin(&r, "compile", 20, 1);
  fm_pack_cstr(&r.pk, "fragment");
  e2e_pack_fragment(&r.pk, 3.75, 24);
  CHECK_EQ_INT(e2e_req_send(&r, fd), 0);
  close(fd); /* gone before the compile ends */
  fd = client();
  CHECK(fd >= 0);
  /* Wait for the abandoned compile to end: it is cancelled (test_compile_limits checks that),
   * or stored if NVRTC finished first; the same fragment is then compiled again or a hit. */
  for (int i = 0; i < 600 && e2e_stat(fd, NULL, "inflight") != 0; i++) sleep_ms(20);
  char origin[16];
  CHECK_EQ_INT(e2e_compile(fd, 21, 3.75, 24, origin, NULL), 0);
  CHECK(strcmp(origin, "hit") == 0 || strcmp(origin, "compiled") == 0);
  /* The late reply was dropped, not written to a freed connection (ASan builds check that). */
  CHECK(e2e_log_contains(&D, "reply dropped"));
  close(fd);
}

static void test_handshake_and_unknowns(void) {
  int fd = e2e_connect(D.sock);
  char code[32], detail[256];
  CHECK_EQ_INT(simple_request(fd, "ping", 1, code), 0); /* ping may precede hello */
  CHECK(code[0] == '\0');
  CHECK_EQ_INT(simple_request(fd, "stats", 2, code), 0);
  CHECK(strcmp(code, "handshake_required") == 0);
  CHECK_EQ_INT(e2e_hello(fd), 0);
  CHECK_EQ_INT(simple_request(fd, "frobnicate", 3, code), 0);
  CHECK(strcmp(code, "unknown_request") == 0);

  /* A fragment op outside the vocabulary. */
  e2e_req r;
  e2e_req_begin(&r, "compile", 4, 1);
  fm_pack_cstr(&r.pk, "fragment");
  msgpack_pack_map(&r.pk, 4);
  fm_pack_kv_u64(&r.pk, "vocab", 1);
  fm_pack_cstr(&r.pk, "inputs");
  msgpack_pack_array(&r.pk, 0);
  fm_pack_cstr(&r.pk, "ops");
  msgpack_pack_array(&r.pk, 1);
  msgpack_pack_map(&r.pk, 3);
  fm_pack_kv_cstr(&r.pk, "op", "frobnicate");
  fm_pack_kv_u64(&r.pk, "out", 1);
  fm_pack_cstr(&r.pk, "args");
  msgpack_pack_array(&r.pk, 0);
  fm_pack_cstr(&r.pk, "outputs");
  msgpack_pack_array(&r.pk, 0);
  CHECK_EQ_INT(e2e_req_send(&r, fd), 0);
  CHECK_EQ_INT(read_code(fd, code, detail), 0);
  CHECK(strcmp(code, "unknown_op") == 0);
  CHECK_STR_CONTAINS(detail, "frobnicate");

  /* A fragment that is not a map. */
  e2e_req_begin(&r, "compile", 5, 1);
  fm_pack_kv_cstr(&r.pk, "fragment", "gelu please");
  CHECK_EQ_INT(e2e_req_send(&r, fd), 0);
  CHECK_EQ_INT(read_code(fd, code, NULL), 0);
  CHECK(strcmp(code, "bad_request") == 0);

  /* show/lookup of something absent. */
  e2e_req_begin(&r, "show", 6, 1);
  fm_pack_kv_cstr(&r.pk, "key", "ffffffff");
  CHECK_EQ_INT(e2e_req_send(&r, fd), 0);
  CHECK_EQ_INT(read_code(fd, code, NULL), 0);
  CHECK(strcmp(code, "not_found") == 0);
  close(fd);

  /* Another protocol version: an error, then the connection is closed. */
  fd = e2e_connect(D.sock);
  e2e_req_begin(&r, "hello", 1, 2);
  fm_pack_kv_u64(&r.pk, "proto", FM_PROTO_VERSION + 41);
  fm_pack_kv_cstr(&r.pk, "client", "from-the-future");
  CHECK_EQ_INT(e2e_req_send(&r, fd), 0);
  CHECK_EQ_INT(read_code(fd, code, NULL), 0);
  CHECK(strcmp(code, "protocol_version") == 0);
  CHECK(e2e_wait_closed(fd, 5000));
  close(fd);
}

static void test_lookup_list_show_evict(void) {
  int fd = client();
  char origin[16], key[65], code[32];
  CHECK_EQ_INT(e2e_compile(fd, 30, 4.5, 3, origin, key), 0);
  /* lookup by key finds it without compiling. */
  e2e_req r;
  e2e_req_begin(&r, "lookup", 31, 1);
  fm_pack_kv_cstr(&r.pk, "key", key);
  CHECK_EQ_INT(e2e_req_send(&r, fd), 0);
  msgpack_zone z;
  msgpack_object o;
  msgpack_zone_init(&z, 65536);
  CHECK_EQ_INT(e2e_recv(fd, 10000, &z, &o), 0);
  CHECK(e2e_is_ok(&o));
  e2e_str(&o, "origin", origin, sizeof origin);
  CHECK(strcmp(origin, "hit") == 0);
  msgpack_zone_destroy(&z);
  /* show by prefix carries the canonical fragment as a map. */
  char prefix[9];
  memcpy(prefix, key, 8);
  prefix[8] = '\0';
  e2e_req_begin(&r, "show", 32, 1);
  fm_pack_kv_cstr(&r.pk, "key", prefix);
  CHECK_EQ_INT(e2e_req_send(&r, fd), 0);
  msgpack_zone_init(&z, 65536);
  CHECK_EQ_INT(e2e_recv(fd, 10000, &z, &o), 0);
  const msgpack_object *entry = fm_msg_get(&o, "entry");
  CHECK(entry && entry->type == MSGPACK_OBJECT_MAP);
  if (entry) {
    const msgpack_object *frag = fm_msg_get(entry, "fragment");
    CHECK(frag && frag->type == MSGPACK_OBJECT_MAP && fm_msg_get(frag, "ops"));
    const char *s = NULL;
    size_t n = 0;
    CHECK_EQ_INT(fm_msg_get_str(entry, "source", &s, &n, NULL), FM_OK);
    CHECK(n > 100 && memmem(s, n, "__global__", 10));
  }
  msgpack_zone_destroy(&z);
  /* evict it: lookup then misses, and never compiles. */
  int64_t compiles0 = e2e_stat(fd, "stats", "compiles");
  e2e_req_begin(&r, "evict", 33, 1);
  fm_pack_kv_cstr(&r.pk, "key", key);
  CHECK_EQ_INT(e2e_req_send(&r, fd), 0);
  CHECK_EQ_INT(read_code(fd, code, NULL), 0);
  CHECK(code[0] == '\0');
  e2e_req_begin(&r, "lookup", 34, 1);
  fm_pack_cstr(&r.pk, "fragment");
  e2e_pack_fragment(&r.pk, 4.5, 3);
  CHECK_EQ_INT(e2e_req_send(&r, fd), 0);
  CHECK_EQ_INT(read_code(fd, code, NULL), 0);
  CHECK(strcmp(code, "not_found") == 0);
  CHECK_EQ_INT(e2e_stat(fd, "stats", "compiles"), compiles0);
  close(fd);
}

static int integrity_ok(const char *db) {
  sqlite3 *h = NULL;
  sqlite3_stmt *st = NULL;
  int ok = 0;
  if (sqlite3_open_v2(db, &h, SQLITE_OPEN_READONLY, NULL) == SQLITE_OK &&
      sqlite3_prepare_v2(h, "PRAGMA integrity_check", -1, &st, NULL) == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW) {
    const unsigned char *t = sqlite3_column_text(st, 0);
    ok = t && strcmp((const char *)t, "ok") == 0;
  }
  sqlite3_finalize(st);
  sqlite3_close(h);
  return ok;
}

static void test_sigterm_during_compile(void) {
  int fd = client(), watcher = client();
  CHECK(fd >= 0 && watcher >= 0);
  e2e_req r;
  e2e_req_begin(&r, "compile", 40, 1);
  fm_pack_cstr(&r.pk, "fragment");
  e2e_pack_fragment(&r.pk, 5.125, SLOW_OPS);
  CHECK_EQ_INT(e2e_req_send(&r, fd), 0);
  int seen = 0;
  for (int i = 0; i < 500 && !seen; i++) {
    seen = e2e_stat(watcher, NULL, "inflight") >= 1;
    if (!seen) sleep_ms(2);
  }
  CHECK(seen); /* the signal really arrives mid-compile */
  close(watcher);
  kill(D.pid, SIGTERM);
  /* The waiter still gets its kernel. */
  msgpack_zone z;
  msgpack_object o;
  msgpack_zone_init(&z, 65536);
  CHECK_EQ_INT(e2e_recv(fd, 30000, &z, &o), 0);
  CHECK(e2e_is_ok(&o));
  char origin[16];
  e2e_str(&o, "origin", origin, sizeof origin);
  CHECK(strcmp(origin, "compiled") == 0);
  msgpack_zone_destroy(&z);
  close(fd);
  int st = e2e_stop(&D, 0, 30000); /* signal 0: just wait */
  CHECK(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0);
  struct stat sb;
  CHECK(stat(D.sock, &sb) != 0); /* the socket file went with it */
  CHECK(integrity_ok(D.db));
}

static void test_restart_persists(void) {
  failed_start = e2e_start(&D, NULL);
  CHECK_EQ_INT(failed_start, 0);
  int fd = client();
  char origin[16];
  CHECK_EQ_INT(e2e_compile(fd, 50, 5.125, SLOW_OPS, origin, NULL), 0);
  CHECK(strcmp(origin, "hit") == 0);
  CHECK_EQ_INT(e2e_compile(fd, 51, 1.5, 3, origin, NULL), 0);
  CHECK(strcmp(origin, "hit") == 0);
  /* Persistent counters survive; session ones start again. */
  CHECK(e2e_stat(fd, "stats", "compiles") >= 4);
  CHECK_EQ_INT(e2e_stat(fd, "session", "compiles"), 0);
  CHECK_EQ_INT(e2e_stat(fd, "session", "hits"), 2);
  close(fd);
}

static void test_second_daemon_refused(void) {
  int st = e2e_run(&D, NULL, 20000);
  CHECK(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) != 0);
  CHECK(e2e_log_contains(&D, "another fusemld is already serving"));
  int fd = client(); /* the first one is untouched */
  char code[32];
  CHECK(fd >= 0);
  CHECK_EQ_INT(simple_request(fd, "ping", 1, code), 0);
  close(fd);
}

static void test_kill9_then_restart(void) {
  int st = e2e_stop(&D, SIGKILL, 10000);
  CHECK(st >= 0 && WIFSIGNALED(st));
  struct stat sb;
  CHECK(stat(D.sock, &sb) == 0); /* stale socket left behind */
  CHECK(integrity_ok(D.db));
  const char *extra[] = {"--idle-timeout", "1", "--max-clients", "3", NULL};
  failed_start = e2e_start(&D, extra);
  CHECK_EQ_INT(failed_start, 0);
  int fd = client();
  char origin[16];
  CHECK_EQ_INT(e2e_compile(fd, 60, 1.5, 3, origin, NULL), 0);
  CHECK(strcmp(origin, "hit") == 0);
  close(fd);
}

static void test_limits_and_timeouts(void) {
  /* Runs on the daemon started with --idle-timeout 1 --max-clients 3. Let it see the earlier
   * connections close first. */
  sleep_ms(200);
  int a = client(), b = client(), c = client();
  CHECK(a >= 0 && b >= 0 && c >= 0);
  int d = e2e_connect(D.sock);
  char code[32];
  CHECK_EQ_INT(read_code(d, code, NULL), 0);
  CHECK(strcmp(code, "busy") == 0);
  CHECK(e2e_wait_closed(d, 5000));
  close(d);
  close(b);
  close(c);
  sleep_ms(200); /* let the daemon count them gone */
  /* A client stalled in the middle of a frame, and an idle one, are both dropped. */
  const uint8_t part[] = {0, 0, 0, 50, 0x81};
  CHECK_EQ_INT(e2e_send_raw(a, part, sizeof part), 0);
  int idle = client();
  CHECK(idle >= 0);
  CHECK(e2e_wait_closed(a, 5000));
  CHECK(e2e_wait_closed(idle, 5000));
  close(a);
  close(idle);
  int st = e2e_stop(&D, SIGTERM, 30000);
  CHECK(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

static int unix_socket(const char *path, int type) {
  struct sockaddr_un sa;
  memset(&sa, 0, sizeof sa);
  sa.sun_family = AF_UNIX;
  snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
  unlink(path);
  int fd = socket(AF_UNIX, type | SOCK_CLOEXEC, 0);
  if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0) return -1;
  if (type == SOCK_STREAM && listen(fd, 16) != 0) return -1;
  return fd;
}

/* Waits for a datagram on the notify socket containing text. */
static int notified(int fd, const char *text, int timeout_ms) {
  char buf[512];
  for (int waited = 0; waited < timeout_ms; waited += 50) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, 50) == 1) {
      ssize_t n = recv(fd, buf, sizeof buf - 1, 0);
      if (n > 0) {
        buf[n] = '\0';
        if (strstr(buf, text)) return 1;
      }
    }
  }
  return 0;
}

/* As systemd starts it: the listening socket as fd 3 (LISTEN_PID/LISTEN_FDS), readiness
 * through NOTIFY_SOCKET, and no forking into the background even without --foreground. */
static void test_systemd_activation(void) {
  char sock[400], notify[400];
  snprintf(sock, sizeof sock, "%s/activated.sock", D.dir);
  snprintf(notify, sizeof notify, "%s/notify.sock", D.dir);
  int lfd = unix_socket(sock, SOCK_STREAM), nfd = unix_socket(notify, SOCK_DGRAM);
  CHECK(lfd >= 0 && nfd >= 0);
  pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    char pidbuf[32];
    int log = open(D.log, O_WRONLY | O_APPEND);
    if (log >= 0) dup2(log, STDERR_FILENO);
    dup2(lfd, 3); /* dup2 clears close-on-exec on the copy */
    snprintf(pidbuf, sizeof pidbuf, "%ld", (long)getpid());
    setenv("LISTEN_PID", pidbuf, 1);
    setenv("LISTEN_FDS", "1", 1);
    setenv("NOTIFY_SOCKET", notify, 1);
    setenv("XDG_CONFIG_HOME", D.dir, 1);
    execl(D.exe, D.exe, "--socket", sock, "--db", D.db, (char *)NULL);
    _exit(127);
  }
  close(lfd);
  if (!FM_HAVE_LIBSYSTEMD) {
    /* No socket activation, and the daemon says so instead of serving a socket of its own
     * beside systemd's. */
    int st0 = 0;
    CHECK(waitpid(pid, &st0, 0) == pid && WIFEXITED(st0) && WEXITSTATUS(st0) != 0);
    CHECK(e2e_log_contains(&D, "built without libsystemd: no socket activation"));
    close(nfd);
    return;
  }
  CHECK(notified(nfd, "READY=1", 20000));
  int st = 0;
  CHECK(waitpid(pid, &st, WNOHANG) == 0); /* still ours: it did not fork away */
  int fd = e2e_connect(sock);
  char code[32], origin[16];
  CHECK(fd >= 0 && e2e_hello(fd) == 0);
  CHECK_EQ_INT(simple_request(fd, "ping", 2, code), 0);
  CHECK_EQ_INT(e2e_compile(fd, 3, 1.5, 3, origin, NULL), 0);
  CHECK(strcmp(origin, "hit") == 0);
  close(fd);
  kill(pid, SIGTERM);
  CHECK(notified(nfd, "STOPPING=1", 20000));
  CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0);
  struct stat sb;
  CHECK(stat(sock, &sb) == 0); /* systemd's socket file is systemd's to remove */
  close(nfd);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s PATH/TO/fusemld\n", argv[0]);
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  if (e2e_setup(&D, argv[1]) != 0 || e2e_start(&D, NULL) != 0) {
    fprintf(stderr, "cannot start %s\n", argv[1]);
    e2e_teardown(&D, 1);
    printf("0 passed, 1 failed\n");
    return 1;
  }
  RUN(test_compile_then_hit);
  RUN(test_reply_shape);
  RUN(test_concurrent_clients_one_compile);
  RUN(test_malformed_frame_keeps_connection);
  RUN(test_oversized_frame_closes);
  RUN(test_truncated_frame_then_hangup);
  RUN(test_hangup_before_compile_reply);
  RUN(test_handshake_and_unknowns);
  RUN(test_lookup_list_show_evict);
  RUN(test_sigterm_during_compile);
  RUN(test_restart_persists);
  if (!failed_start) RUN(test_second_daemon_refused);
  if (!failed_start) RUN(test_kill9_then_restart);
  if (!failed_start) RUN(test_limits_and_timeouts);
  RUN(test_systemd_activation);
  e2e_teardown(&D, fm_test_failed_ != 0);
  return FM_TEST_DONE();
}
