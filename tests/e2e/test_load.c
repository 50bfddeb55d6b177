/* test_load.c: 256 concurrent clients against a real fusemld for a bounded time, mixing hits
 * (cached fragments), misses (new fragments: real compiles) and junk (malformed frames, frames
 * over the size limit, half frames then a hang-up); meanwhile a flood of connections beyond
 * --max-clients. Passes when the daemon never crashes, every reply is the expected one, the
 * flood gets busy while the 256 keep being served, and the daemon's RSS (VmRSS) stays bounded.
 * Prints p50/p99 hit latency, request counts and RSS before/after.
 * usage: test_load PATH/TO/fusemld   (FM_LOAD_SECONDS: duration, default 30) */
#define _GNU_SOURCE
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "e2e_util.h"
#include "fm_msg.h"
#include "fm_test.h"

#define N_CLIENTS         256
#define MAX_CLIENTS       320    /* the daemon's --max-clients: room for the 256 and a few more */
#define N_FLOOD           400    /* connections opened beyond it */
#define N_WARM            8      /* cached fragments the hits cycle through */
#define MISS_EVERY        16     /* every 16th client also asks for new fragments */
#define MAX_LAT           200000 /* hit latencies kept per client */
#define RSS_GROWTH_MAX_KB (256 * 1024)

static e2e_daemon D;
static double g_deadline;
static atomic_long g_hits, g_misses, g_junk, g_reconnects, g_busy_retries, g_failures;

typedef struct client_state {
  int idx;
  unsigned seed;
  int fd;
  double *lat;
  size_t n_lat;
} client_state;

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void fail(const client_state *c, const char *what) {
  atomic_fetch_add(&g_failures, 1);
  if (atomic_load(&g_failures) <= 10) fprintf(stderr, "  client %d: %s\n", c->idx, what);
}

/* Connects and says hello. During the flood every slot may be taken: a busy refusal is the
 * daemon doing its job, so retry (counted) until the deadline. */
static int reconnect(client_state *c) {
  if (c->fd >= 0) close(c->fd);
  atomic_fetch_add(&g_reconnects, 1);
  for (;;) {
    c->fd = e2e_connect(D.sock);
    if (c->fd >= 0 && e2e_hello(c->fd) == 0) return 0;
    if (c->fd >= 0) close(c->fd);
    c->fd = -1;
    atomic_fetch_add(&g_busy_retries, 1);
    if (now_ms() > g_deadline + 5000) break;
    usleep(20000);
  }
  fail(c, "cannot reconnect");
  return -1;
}

/* Reads one reply and returns its code ("" for ok) in code. */
static int reply_code(int fd, char code[32]) {
  msgpack_zone z;
  msgpack_object o;
  msgpack_zone_init(&z, 4096);
  int rc = e2e_recv(fd, 30000, &z, &o);
  code[0] = '\0';
  if (rc == 0) e2e_str(&o, "code", code, 32);
  msgpack_zone_destroy(&z);
  return rc;
}

static void do_junk(client_state *c) {
  atomic_fetch_add(&g_junk, 1);
  uint32_t kind = (uint32_t)rand_r(&c->seed) % 10;
  char code[32];
  if (kind == 0) {
    /* A header over the limit: frame_too_large, then the daemon closes the connection. */
    const uint8_t big[4] = {0x7f, 0xff, 0xff, 0xff};
    if (e2e_send_raw(c->fd, big, 4) || reply_code(c->fd, code) || strcmp(code, "frame_too_large") != 0)
      fail(c, "oversized frame not refused");
    reconnect(c);
    return;
  }
  if (kind == 1) {
    /* Half a frame, then a hang-up. */
    const uint8_t half[6] = {0, 0, 0, 40, 0x82, 0xa2};
    e2e_send_raw(c->fd, half, sizeof half);
    reconnect(c);
    return;
  }
  /* Random bytes in a well-formed frame: an error reply, and the connection stays usable. */
  uint8_t junk[64];
  size_t n = 1 + (size_t)rand_r(&c->seed) % sizeof junk;
  for (size_t i = 0; i < n; i++) junk[i] = (uint8_t)rand_r(&c->seed);
  junk[0] = 0xc1; /* never valid msgpack, so the reply is always an error */
  if (e2e_send_frame(c->fd, junk, n) || reply_code(c->fd, code) || code[0] == '\0') fail(c, "junk not refused");
}

static void *client_main(void *arg) {
  client_state *c = arg;
  uint64_t id = 1, miss_no = 0;
  if (reconnect(c)) return NULL;
  while (now_ms() < g_deadline && c->fd >= 0) {
    uint32_t r = (uint32_t)rand_r(&c->seed) % 100;
    char origin[16];
    if (c->idx % MISS_EVERY == 0 && r < 10) {
      double salt = 1000.0 + c->idx * 100000.0 + (double)(miss_no++);
      if (e2e_compile(c->fd, id++, salt, 2, origin, NULL) != 0)
        fail(c, "miss failed");
      else
        atomic_fetch_add(&g_misses, 1);
    } else if (r < 10) {
      do_junk(c);
    } else {
      double t0 = now_ms();
      int rc = e2e_compile(c->fd, id++, 1.0 + (double)(r % N_WARM), 3, origin, NULL);
      double t = now_ms() - t0;
      if (rc != 0 || strcmp(origin, "hit") != 0) {
        fail(c, "hit failed");
        continue;
      }
      atomic_fetch_add(&g_hits, 1);
      if (c->n_lat < MAX_LAT) c->lat[c->n_lat++] = t;
    }
  }
  if (c->fd >= 0) close(c->fd);
  return NULL;
}

/* Opens N_FLOOD connections at once; returns how many were answered busy within 3 s (those
 * that got a slot are simply never answered). */
static int flood(void) {
  static int fds[N_FLOOD];
  static struct pollfd p[N_FLOOD];
  int busy = 0;
  for (int i = 0; i < N_FLOOD; i++) {
    fds[i] = e2e_connect(D.sock);
    p[i] = (struct pollfd){.fd = fds[i], .events = POLLIN};
  }
  double end = now_ms() + 3000;
  for (double left; (left = end - now_ms()) > 0;) {
    if (poll(p, N_FLOOD, (int)left) <= 0) break;
    for (int i = 0; i < N_FLOOD; i++) {
      if (p[i].fd < 0 || !(p[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char code[32];
      if (reply_code(fds[i], code) == 0 && strcmp(code, "busy") == 0) busy++;
      p[i].fd = -1; /* answered (or closed): poll ignores it from now on */
    }
  }
  for (int i = 0; i < N_FLOOD; i++)
    if (fds[i] >= 0) close(fds[i]);
  return busy;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static void test_load(void) {
  const char *env = getenv("FM_LOAD_SECONDS");
  int secs = env && atoi(env) > 0 ? atoi(env) : 30;
  int warm = e2e_connect(D.sock);
  CHECK(warm >= 0 && e2e_hello(warm) == 0);
  char origin[16];
  for (int i = 0; i < N_WARM; i++) CHECK_EQ_INT(e2e_compile(warm, 1 + (uint64_t)i, 1.0 + i, 3, origin, NULL), 0);
  /* The baseline: one client alone. */
  static double idle[200];
  for (int i = 0; i < 200; i++) {
    double t0 = now_ms();
    CHECK_EQ_INT(e2e_compile(warm, 100 + (uint64_t)i, 1.0 + i % N_WARM, 3, origin, NULL), 0);
    idle[i] = now_ms() - t0;
  }
  qsort(idle, 200, sizeof(double), cmp_double);
  printf("  one client alone: hit p50 %.2f ms, p99 %.2f ms\n", idle[100], idle[198]);
  close(warm);
  long rss0 = e2e_rss_kb(D.pid);

  static client_state cs[N_CLIENTS];
  pthread_t th[N_CLIENTS];
  g_deadline = now_ms() + secs * 1000.0;
  for (int i = 0; i < N_CLIENTS; i++) {
    cs[i] = (client_state){.idx = i, .seed = 12345u + (unsigned)i, .fd = -1, .lat = malloc(MAX_LAT * sizeof(double))};
    CHECK(cs[i].lat && pthread_create(&th[i], NULL, client_main, &cs[i]) == 0);
  }
  usleep((useconds_t)(secs * 1000 * 1000 / 2)); /* half way: the flood */
  long hits_before = atomic_load(&g_hits), reconnects_before = atomic_load(&g_reconnects);
  int busy = flood();
  long reconnects_during = atomic_load(&g_reconnects) - reconnects_before;
  usleep(500000);
  long hits_during = atomic_load(&g_hits) - hits_before;
  for (int i = 0; i < N_CLIENTS; i++) pthread_join(th[i], NULL);
  long rss1 = e2e_rss_kb(D.pid);

  size_t n = 0;
  for (int i = 0; i < N_CLIENTS; i++) n += cs[i].n_lat;
  double *all = malloc((n ? n : 1) * sizeof(double));
  size_t k = 0;
  for (int i = 0; i < N_CLIENTS; i++) {
    memcpy(all + k, cs[i].lat, cs[i].n_lat * sizeof(double));
    k += cs[i].n_lat;
    free(cs[i].lat);
  }
  qsort(all, n, sizeof(double), cmp_double);
  double p50 = n ? all[n / 2] : -1, p99 = n ? all[(size_t)((double)n * 0.99)] : -1;
  free(all);
  printf(
      "  %d s, %d clients: %ld hits (p50 %.2f ms, p99 %.2f ms), %ld misses compiled, %ld junk, "
      "%ld reconnects (%ld retried while full), %ld failures\n",
      secs, N_CLIENTS, atomic_load(&g_hits), p50, p99, atomic_load(&g_misses), atomic_load(&g_junk),
      atomic_load(&g_reconnects), atomic_load(&g_busy_retries), atomic_load(&g_failures));
  printf(
      "  flood of %d connections beyond --max-clients %d: %d answered busy; %ld hits served and %ld clients "
      "reconnected meanwhile\n",
      N_FLOOD, MAX_CLIENTS, busy, hits_during, reconnects_during);
  printf("  daemon VmRSS: %ld kB after warm-up, %ld kB at the end\n", rss0, rss1);
  CHECK_EQ_INT(atomic_load(&g_failures), 0);
  CHECK(atomic_load(&g_hits) > 1000 && atomic_load(&g_misses) > 0 && atomic_load(&g_junk) > 100);
  /* The 256 hold their slots, so at most MAX_CLIENTS - 256 flood connections get in, and one
   * more for each slot a client gives up meanwhile (reconnecting after junk: the daemon reads
   * its hang-up between two batches of accepts, and the next connection takes the slot). */
  CHECK(busy >= N_FLOOD - (MAX_CLIENTS - N_CLIENTS) - reconnects_during);
  CHECK(hits_during > 0);
  CHECK(rss0 > 0 && rss1 > 0 && rss1 - rss0 < RSS_GROWTH_MAX_KB);
  CHECK(kill(D.pid, 0) == 0);
  int fd = e2e_connect(D.sock);
  CHECK(fd >= 0 && e2e_hello(fd) == 0);
  if (fd >= 0) close(fd);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s PATH/TO/fusemld\n", argv[0]);
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  /* In an ASan build the daemon holds up to 256 MB of freed memory in quarantine. NVRTC's
   * churn used to fill it during the warm-up; with NVRTC in worker processes it fills during
   * the run and would read as growth. A small quarantine keeps the RSS check about the
   * daemon's own memory (other builds ignore the variable). */
  char asan[512];
  const char *was = getenv("ASAN_OPTIONS");
  snprintf(asan, sizeof asan, "%s%squarantine_size_mb=16", was ? was : "", was && *was ? ":" : "");
  setenv("ASAN_OPTIONS", asan, 1);
  const char *extra[] = {"--max-clients", "320", "--log-level", "warn", NULL};
  if (e2e_setup(&D, argv[1]) != 0 || e2e_start(&D, extra) != 0) {
    fprintf(stderr, "cannot start %s\n", argv[1]);
    e2e_teardown(&D, 1);
    printf("0 passed, 1 failed\n");
    return 1;
  }
  RUN(test_load);
  int st = e2e_stop(&D, SIGTERM, 30000);
  CHECK(st >= 0);
  e2e_teardown(&D, fm_test_failed_ != 0);
  return FM_TEST_DONE();
}
