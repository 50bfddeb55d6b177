/* test_connections.c: bounds on what connections can cost a real fusemld.
 *   - --max-output-total: eight clients that pipeline hits and never read are cut (the ones
 *     with the most bytes queued first) before the daemon's memory grows past the bound, and
 *     a client that reads is still served;
 *   - a connect/close storm (four threads, at most four live sockets) never makes a real
 *     client `busy`, even at --max-clients 16;
 *   - at the info level, connections cost no log line each: a periodic summary counts them
 *     (FM_CONN_LOG_COUNT connections, default 3000; the figure is extrapolated to 100k);
 *   - --frame-deadline: a client trickling one byte a second is cut when its frame is not
 *     complete in time, though each byte comes well within the stall timeout.
 * usage: test_connections PATH/TO/fusemld */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "e2e_util.h"
#include "fm_msg.h"
#include "fm_test.h"

static e2e_daemon D;

static long log_bytes(void) {
  struct stat st;
  return stat(D.log, &st) == 0 ? (long)st.st_size : -1;
}

/* ---- the total of queued replies ---- */

#define NON_READERS 8

/* The hit request, framed, sent whole or not at all (so a cut-off client never leaves half
 * a frame behind that would be counted instead). */
typedef struct framed {
  uint8_t *bytes;
  size_t len;
} framed;

static framed hit_request(void) {
  e2e_req r;
  e2e_req_begin(&r, "compile", 1000, 1);
  fm_pack_cstr(&r.pk, "fragment");
  e2e_pack_fragment(&r.pk, 1.5, 3);
  framed f = {malloc(r.sb.size + 4), r.sb.size + 4};
  f.bytes[0] = (uint8_t)(r.sb.size >> 24);
  f.bytes[1] = (uint8_t)(r.sb.size >> 16);
  f.bytes[2] = (uint8_t)(r.sb.size >> 8);
  f.bytes[3] = (uint8_t)r.sb.size;
  memcpy(f.bytes + 4, r.sb.data, r.sb.size);
  msgpack_sbuffer_destroy(&r.sb);
  return f;
}

/* Sends as many whole requests as the socket takes now; -1 once the daemon has cut us off. */
static int pipeline(int fd, const framed *req, int *sent) {
  for (int i = 0; i < 64; i++) {
    ssize_t w = send(fd, req->bytes, req->len, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w == (ssize_t)req->len) {
      (*sent)++;
      continue;
    }
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
    if (w < 0) return -1;
    /* A partial send: finish the frame blocking, or learn that we were cut. */
    if (e2e_send_raw(fd, req->bytes + w, req->len - (size_t)w) != 0) return -1;
    (*sent)++;
  }
  return 0;
}

static void test_non_readers_bounded_total(void) {
  /* The per-client cap alone would let the eight queue 8 x 64M; the total bound is 16M. ASan
   * keeps freed memory in quarantine (256 MB by default), which would read as growth. */
  const long bound_kb = 16 << 10, margin_kb = 96 << 10;
  const char *asan = getenv("ASAN_OPTIONS");
  char *saved = asan ? strdup(asan) : NULL, opts[512];
  snprintf(opts, sizeof opts, "%s%squarantine_size_mb=8", saved ? saved : "", saved ? ":" : "");
  setenv("ASAN_OPTIONS", opts, 1);
  const char *extra[] = {"--max-output", "64M", "--max-output-total", "16M", NULL};
  CHECK_EQ_INT(e2e_restart(&D, extra), 0);
  if (saved)
    setenv("ASAN_OPTIONS", saved, 1);
  else
    unsetenv("ASAN_OPTIONS");
  free(saved);
  int good = e2e_connect(D.sock);
  CHECK(good >= 0 && e2e_hello(good) == 0);
  char origin[16];
  CHECK_EQ_INT(e2e_compile(good, 1, 1.5, 3, origin, NULL), 0); /* now a hit */
  for (int i = 0; i < 20; i++) CHECK_EQ_INT(e2e_compile(good, 2 + (uint64_t)i, 1.5, 3, origin, NULL), 0);
  long base_kb = e2e_rss_kb(D.pid);
  CHECK(base_kb > 0);

  framed req = hit_request();
  int fds[NON_READERS], sent[NON_READERS] = {0}, cut[NON_READERS] = {0}, n_cut = 0, good_hits = 0;
  for (int i = 0; i < NON_READERS; i++) {
    fds[i] = e2e_connect(D.sock);
    CHECK(fds[i] >= 0 && e2e_hello(fds[i]) == 0);
  }
  long peak_kb = base_kb;
  double t0 = e2e_now_ms();
  for (int round = 0; n_cut < NON_READERS && e2e_now_ms() - t0 < 120000; round++) {
    for (int i = 0; i < NON_READERS; i++)
      if (!cut[i] && pipeline(fds[i], &req, &sent[i]) < 0) cut[i] = 1, n_cut++;
    long kb = e2e_rss_kb(D.pid);
    if (kb > peak_kb) peak_kb = kb;
    if (round % 50 == 49) { /* the client that reads, meanwhile */
      CHECK_EQ_INT(e2e_compile(good, 100000 + (uint64_t)round, 1.5, 3, origin, NULL), 0);
      good_hits++;
    }
    e2e_sleep_ms(1);
  }
  long total_sent = 0;
  for (int i = 0; i < NON_READERS; i++) total_sent += sent[i], close(fds[i]);
  free(req.bytes);
  CHECK_EQ_INT(n_cut, NON_READERS);
  CHECK(e2e_log_contains(&D, "queued output of all clients"));
  CHECK_EQ_INT(e2e_compile(good, 999999, 1.5, 3, origin, NULL), 0);
  CHECK(strcmp(origin, "hit") == 0);
  printf(
      "  %d non-readers: %ld hits pipelined, %d cut in %.1f s; daemon VmRSS %ld MB -> peak %ld MB "
      "(bound 16 MB + margin %ld MB); the reading client got %d hits meanwhile\n",
      NON_READERS, total_sent, n_cut, (e2e_now_ms() - t0) / 1e3, base_kb >> 10, peak_kb >> 10, margin_kb >> 10,
      good_hits);
  CHECK(peak_kb - base_kb < bound_kb + margin_kb);
  close(good);
}

/* ---- connect/close storms ---- */

static atomic_int storm_stop;
static atomic_long storm_conns;

static void *storm(void *arg) {
  (void)arg;
  while (!atomic_load(&storm_stop)) {
    int fd = e2e_connect(D.sock);
    if (fd >= 0) {
      close(fd);
      atomic_fetch_add(&storm_conns, 1);
    }
  }
  return NULL;
}

/* connect + hello + ping, as `fusectl ping` does; 0 if answered ok, else the error code. */
static int ping(char code[32], int64_t *clients) {
  int fd = e2e_connect(D.sock);
  code[0] = '\0';
  if (fd < 0) {
    snprintf(code, 32, "connect");
    return -1;
  }
  msgpack_zone z;
  msgpack_object o;
  int rc = -1;
  e2e_req r;
  e2e_req_begin(&r, "hello", 1, 3);
  fm_pack_kv_u64(&r.pk, "proto", 1);
  fm_pack_kv_cstr(&r.pk, "client", "ping");
  fm_pack_kv_u64(&r.pk, "pid", (uint64_t)getpid());
  msgpack_zone_init(&z, 4096);
  if (e2e_req_send(&r, fd) == 0 && e2e_recv(fd, 10000, &z, &o) == 0) {
    if (e2e_is_ok(&o)) {
      e2e_req_begin(&r, "ping", 2, 0);
      msgpack_zone_clear(&z);
      if (e2e_req_send(&r, fd) == 0 && e2e_recv(fd, 10000, &z, &o) == 0 && e2e_is_ok(&o)) rc = 0;
      int64_t n = e2e_stat(fd, NULL, "clients");
      if (n > *clients) *clients = n;
    }
    if (rc) e2e_str(&o, "code", code, 32);
  }
  if (rc && !code[0]) snprintf(code, 32, "no reply");
  msgpack_zone_destroy(&z);
  close(fd);
  return rc;
}

static void test_connect_close_storm(void) {
  const char *extra[] = {"--max-clients", "16", "--log-level", "info", NULL};
  CHECK_EQ_INT(e2e_restart(&D, extra), 0);
  pthread_t threads[4];
  atomic_store(&storm_stop, 0);
  atomic_store(&storm_conns, 0);
  for (int i = 0; i < 4; i++) CHECK_EQ_INT(pthread_create(&threads[i], NULL, storm, NULL), 0);
  e2e_sleep_ms(300);
  int answered = 0;
  int64_t clients = 0;
  char code[32], first_failure[32] = "";
  for (int i = 0; i < 40; i++) {
    if (ping(code, &clients) == 0)
      answered++;
    else if (!first_failure[0])
      snprintf(first_failure, sizeof first_failure, "%s", code);
    e2e_sleep_ms(50);
  }
  atomic_store(&storm_stop, 1);
  for (int i = 0; i < 4; i++) pthread_join(threads[i], NULL);
  printf("  storm: %ld connections opened and closed; %d of 40 pings answered%s%s; `clients` at most %lld\n",
         atomic_load(&storm_conns), answered, first_failure[0] ? ", first failure: " : "", first_failure,
         (long long)clients);
  CHECK_EQ_INT(answered, 40);
  CHECK(atomic_load(&storm_conns) > 1000); /* it was a storm */
}

/* ---- the log's cost per connection ---- */

static void test_log_cost_per_connection(void) {
  const char *env = getenv("FM_CONN_LOG_COUNT");
  long n = env ? strtol(env, NULL, 10) : 3000;
  if (n < 100) n = 100;
  const char *extra[] = {"--log-level", "info", NULL};
  CHECK_EQ_INT(e2e_restart(&D, extra), 0);
  long before = log_bytes();
  const uint8_t half[] = {0, 0, 0, 50, 0x81};
  double t0 = e2e_now_ms();
  long connected = 0;
  for (long i = 0; i < n; i++) {
    int fd = e2e_connect(D.sock);
    if (fd < 0) continue;
    connected++;
    /* A third say hello, a third leave half a frame behind, a third just hang up. */
    if (i % 3 == 0)
      CHECK_EQ_INT(e2e_hello(fd), 0);
    else if (i % 3 == 1)
      CHECK_EQ_INT(e2e_send_raw(fd, half, sizeof half), 0);
    close(fd);
  }
  double secs = (e2e_now_ms() - t0) / 1e3;
  CHECK_EQ_INT(connected, n);
  /* The summary of the last interval is written at shutdown. */
  int st = e2e_stop(&D, SIGTERM, 30000);
  CHECK(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0);
  long grew = log_bytes() - before;
  double per_100k = (double)grew * 100000.0 / (double)n;
  printf(
      "  %ld connections in %.1f s: the info log grew %ld bytes (shutdown lines included), "
      "%.0f bytes per 100k connections\n",
      n, secs, grew, per_100k);
  CHECK(per_100k < 1e6);
  CHECK(e2e_log_contains(&D, "connections in the last"));
}

/* ---- a frame trickled in ---- */

static void test_frame_deadline(void) {
  const char *extra[] = {"--frame-deadline", "3", NULL};
  CHECK_EQ_INT(e2e_restart(&D, extra), 0);
  int fd = e2e_connect(D.sock);
  CHECK(fd >= 0 && e2e_hello(fd) == 0);
  /* A 50-byte frame, one byte a second: each byte is well within the 10 s stall timeout. */
  const uint8_t header[] = {0, 0, 0, 50};
  double t0 = e2e_now_ms(), closed_at = -1;
  CHECK_EQ_INT(e2e_send_raw(fd, header, sizeof header), 0);
  for (int i = 0; i < 14 && closed_at < 0; i++) {
    if (e2e_wait_closed(fd, 1000))
      closed_at = e2e_now_ms() - t0;
    else if (send(fd, "\x81", 1, MSG_NOSIGNAL) != 1)
      closed_at = e2e_now_ms() - t0;
  }
  if (closed_at < 0)
    printf("  one byte a second: not cut in 14 s (frame deadline 3 s, stall timeout 10 s)\n");
  else
    printf("  one byte a second: cut after %.1f s (frame deadline 3 s, stall timeout 10 s)\n", closed_at / 1e3);
  /* Never before the deadline; and before the 14 s the trickle would last (the stall timer,
   * re-armed by every byte, would never fire). */
  CHECK(closed_at >= 2900 && closed_at < 9000);
  CHECK(e2e_log_contains(&D, "not complete"));
  close(fd);
  /* Others are served meanwhile and after. */
  int other = e2e_connect(D.sock);
  CHECK(other >= 0 && e2e_hello(other) == 0);
  close(other);
}

int main(int argc, char **argv) {
  int status = e2e_main_start(&D, argc, argv);
  if (status) return status;
  const char *only = getenv("FM_CONN_ONLY");
#define RUN_SELECTED(fn) \
  if (!only || strstr(#fn, only)) RUN(fn)
  RUN_SELECTED(test_non_readers_bounded_total);
  RUN_SELECTED(test_connect_close_storm);
  RUN_SELECTED(test_log_cost_per_connection);
  RUN_SELECTED(test_frame_deadline);
  e2e_teardown(&D, fm_test_failed_ != 0 && !getenv("FM_CONN_QUIET"));
  return FM_TEST_DONE();
}
