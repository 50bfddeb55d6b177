/* e2e_remote.c: the remote tier against a real redis-server on loopback (docs/REMOTE.md).
 *
 * Two daemons with separate stores share one Redis: what the first compiles is a remote hit
 * on the second, with no compile. Tampered, wrong-secret and wrong-device values are refused
 * (and the request still served, by compiling). Redis killed mid-run: every request is still
 * answered, the stats show the outage, and the daemon reconnects once Redis is back. Then
 * fusectl export from one store and import into another gives identical lookups. Prints the
 * figures docs/SCALING.md uses (value sizes, loopback GET latency).
 *
 * Skips (exit 77) where redis-server is not installed. argv: fusemld fusectl. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "e2e_util.h"
#include "fm_msg.h"
#include "fm_test.h"

#define SKIP 77

static const char *fusemld, *fusectl;
static char redis_exe[512], dir[256], secret[320], secret2[320];
static int redis_port;
static pid_t redis_pid;

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

static int find_redis(void) {
  const char *env = getenv("FM_REDIS_SERVER");
  if (env && *env) {
    snprintf(redis_exe, sizeof redis_exe, "%s", env);
    return access(redis_exe, X_OK) == 0;
  }
  const char *path = getenv("PATH");
  char buf[4096];
  snprintf(buf, sizeof buf, "%s:/usr/sbin:/usr/bin:/usr/local/bin", path ? path : "");
  for (char *save = NULL, *p = strtok_r(buf, ":", &save); p; p = strtok_r(NULL, ":", &save)) {
    snprintf(redis_exe, sizeof redis_exe, "%s/redis-server", p);
    if (access(redis_exe, X_OK) == 0) return 1;
  }
  return 0;
}

static int free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t n = sizeof a;
  if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) || getsockname(fd, (struct sockaddr *)&a, &n)) return -1;
  close(fd);
  return ntohs(a.sin_port);
}

static int tcp_connect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {
      .sin_family = AF_INET, .sin_port = htons((uint16_t)port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  if (fd < 0) return -1;
  if (connect(fd, (struct sockaddr *)&a, sizeof a)) {
    close(fd);
    return -1;
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

/* A redis-server on port with extra arguments (NULL-terminated; a later --bind replaces the
 * first), once it accepts connections;
 * its pid, or -1. */
static pid_t redis_spawn(int port, const char *const *extra) {
  char port_s[16];
  const char *argv[32] = {redis_exe, "--port",       port_s, "--bind", "127.0.0.1", "--save",
                          "",        "--appendonly", "no",   "--dir",  dir};
  size_t n = 11;
  for (; extra && *extra && n < 31; extra++) argv[n++] = *extra;
  argv[n] = NULL;
  snprintf(port_s, sizeof port_s, "%d", port);
  pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    int null = open("/dev/null", O_WRONLY);
    dup2(null, 1);
    dup2(null, 2);
    execv(redis_exe, (char *const *)argv);
    _exit(127);
  }
  for (int i = 0; pid > 0 && i < 250; i++) {
    int fd = tcp_connect(port);
    if (fd >= 0) {
      close(fd);
      return pid;
    }
    sleep_ms(20);
  }
  if (pid > 0) {
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
  }
  return -1;
}

static int redis_start(void) {
  redis_pid = redis_spawn(redis_port, NULL);
  return redis_pid > 0 ? 0 : -1;
}

static void redis_kill(void) {
  if (redis_pid > 0) {
    kill(redis_pid, SIGKILL);
    waitpid(redis_pid, NULL, 0);
  }
  redis_pid = 0;
}

/* ---- a minimal RESP client: the test reads and writes values directly ---- */

static int write_all(int fd, const void *p, size_t n) {
  const char *c = p;
  while (n) {
    ssize_t w = write(fd, c, n);
    if (w <= 0) return -1;
    c += w, n -= (size_t)w;
  }
  return 0;
}

static int read_line(int fd, char *out, size_t cap) {
  size_t n = 0;
  while (n + 1 < cap) {
    if (read(fd, out + n, 1) != 1) return -1;
    if (n && out[n - 1] == '\r' && out[n] == '\n') {
      out[n - 1] = '\0';
      return 0;
    }
    n++;
  }
  return -1;
}

/* Sends argv (binary-safe); returns the reply: a bulk string (malloc'd, *len), NULL for nil or
 * a status (*len = 0 for status, SIZE_MAX for nil/error). */
static uint8_t *resp(int fd, int argc, const void *const *argv, const size_t *lens, size_t *len) {
  char hdr[64], line[256];
  snprintf(hdr, sizeof hdr, "*%d\r\n", argc);
  write_all(fd, hdr, strlen(hdr));
  for (int i = 0; i < argc; i++) {
    snprintf(hdr, sizeof hdr, "$%zu\r\n", lens[i]);
    write_all(fd, hdr, strlen(hdr));
    write_all(fd, argv[i], lens[i]);
    write_all(fd, "\r\n", 2);
  }
  *len = SIZE_MAX;
  if (read_line(fd, line, sizeof line)) return NULL;
  if (line[0] == '+') {
    *len = 0;
    return NULL;
  }
  if (line[0] != '$' || atol(line + 1) < 0) return NULL;
  size_t n = (size_t)atol(line + 1);
  uint8_t *v = malloc(n + 2);
  size_t got = 0;
  while (v && got < n + 2) {
    ssize_t r = read(fd, v + got, n + 2 - got);
    if (r <= 0) {
      free(v);
      return NULL;
    }
    got += (size_t)r;
  }
  *len = n;
  return v;
}

static uint8_t *rget(const char *key, size_t *len) {
  int fd = tcp_connect(redis_port);
  if (fd < 0) return NULL;
  const void *argv[] = {"GET", key};
  size_t lens[] = {3, strlen(key)};
  uint8_t *v = resp(fd, 2, argv, lens, len);
  close(fd);
  return v;
}

static int rset(const char *key, const uint8_t *val, size_t n) {
  int fd = tcp_connect(redis_port);
  if (fd < 0) return -1;
  const void *argv[] = {"SET", key, val};
  size_t lens[] = {3, strlen(key), n}, len;
  free(resp(fd, 3, argv, lens, &len));
  close(fd);
  return len == 0 ? 0 : -1;
}

static void rkey_for(const char *arch, const char *hex, char *out, size_t cap) {
  snprintf(out, cap, "fusemld:v1:none_%s:%s", arch, hex);
}

/* ---- daemons ---- */

static int start_daemon(e2e_daemon *d, const char *secret_path, const char *arch) {
  char url[64];
  snprintf(url, sizeof url, "redis://127.0.0.1:%d/0", redis_port);
  const char *args[] = {"--remote", url, "--remote-secret-file", secret_path, "--arch", arch, NULL};
  if (e2e_setup(d, fusemld)) return -1;
  return e2e_start(d, args);
}

/* Waits until the daemon has published n entries (publishing is asynchronous). */
static int wait_published(int fd, int64_t n) {
  for (int i = 0; i < 1000; i++) { /* 10 s: a loaded CI machine under ASan */
    if (e2e_stat(fd, "remote", "published") >= n) return 0;
    sleep_ms(10);
  }
  return -1;
}

/* Only what was set up (a start may stop at the first daemon that fails). */
static void teardown(e2e_daemon *d, int dump_log) {
  if (d->dir[0]) e2e_teardown(d, dump_log);
}

static int count_in_log(const e2e_daemon *d, const char *text) {
  FILE *f = fopen(d->log, "r");
  char line[4096];
  int n = 0;
  while (f && fgets(line, sizeof line, f)) n += strstr(line, text) != NULL;
  if (f) fclose(f);
  return n;
}

static e2e_daemon A, B, C, D;
static int fa = -1, fb = -1, fc = -1, fd_ = -1;

static void test_share(void) {
  char origin[16], key[65], key2[65];
  CHECK_EQ_INT(e2e_compile(fa, 1, 1.0, 3, origin, key), 0);
  CHECK(strcmp(origin, "compiled") == 0);
  CHECK_EQ_INT(wait_published(fa, 1), 0);
  CHECK_EQ_INT(e2e_compile(fb, 2, 1.0, 3, origin, key2), 0);
  CHECK(strcmp(origin, "remote") == 0);
  CHECK(strcmp(key, key2) == 0);
  CHECK_EQ_INT(e2e_stat(fb, "session", "compiles"), 0);
  CHECK_EQ_INT(e2e_stat(fb, "remote", "hits"), 1);
  CHECK_EQ_INT(e2e_stat(fb, "remote", "refused"), 0);
  /* Stored locally: the next request is a local hit that does not ask Redis. */
  CHECK_EQ_INT(e2e_compile(fb, 3, 1.0, 3, origin, key2), 0);
  CHECK(strcmp(origin, "hit") == 0);
  CHECK_EQ_INT(e2e_stat(fb, "remote", "lookups"), 1);

  /* The figures for docs/SCALING.md. */
  char rk[160];
  size_t len = 0;
  rkey_for("sm_90a", key, rk, sizeof rk);
  free(rget(rk, &len));
  int r = tcp_connect(redis_port);
  const void *argv[] = {"GET", rk};
  size_t lens[] = {3, strlen(rk)}, n;
  double t0 = now_ms();
  for (int i = 0; i < 2000; i++) free(resp(r, 2, argv, lens, &n));
  double per = (now_ms() - t0) / 2000;
  close(r);
  printf(
      "figure: value %zu bytes for a 3-op pointwise fragment; loopback GET %.1f us (2000 sequential); "
      "daemon lookup latency avg %lld us\n",
      len, per * 1e3, (long long)e2e_stat(fb, "remote", "latency_us_avg"));
}

static void test_tampered(void) {
  char origin[16], key[65], rk[160];
  size_t len;
  CHECK_EQ_INT(e2e_compile(fa, 10, 2.0, 2, origin, key), 0);
  CHECK_EQ_INT(wait_published(fa, 2), 0);
  rkey_for("sm_90a", key, rk, sizeof rk);
  uint8_t *v = rget(rk, &len);
  CHECK(v != NULL && len > 200);
  if (!v) return;
  v[len / 2] ^= 0x01; /* one bit, inside the blobs */
  CHECK_EQ_INT(rset(rk, v, len), 0);
  free(v);
  int64_t before = e2e_stat(fb, "remote", "refused");
  CHECK_EQ_INT(e2e_compile(fb, 11, 2.0, 2, origin, key), 0);
  CHECK(strcmp(origin, "compiled") == 0);
  CHECK_EQ_INT(e2e_stat(fb, "remote", "refused"), before + 1);
  CHECK(e2e_log_contains(&B, "refused"));
}

static void test_wrong_secret(void) {
  /* C shares the Redis but signs with another secret: its entries are refused by B, and
   * B's (published after B compiled) refused by C. */
  char origin[16], key[65];
  CHECK_EQ_INT(e2e_compile(fc, 20, 3.0, 2, origin, key), 0);
  CHECK(strcmp(origin, "compiled") == 0);
  CHECK_EQ_INT(wait_published(fc, 1), 0);
  int64_t before = e2e_stat(fb, "remote", "refused");
  CHECK_EQ_INT(e2e_compile(fb, 21, 3.0, 2, origin, key), 0);
  CHECK(strcmp(origin, "compiled") == 0);
  CHECK_EQ_INT(e2e_stat(fb, "remote", "refused"), before + 1);
  CHECK(e2e_log_contains(&B, "HMAC does not match"));
}

static void test_wrong_device(void) {
  /* D (same secret) builds for sm_80; its correctly signed value put where B looks for the
   * sm_90a kernel of the same fragment is refused for its device. */
  char origin[16], key_d[65], key_a[65], rk_d[160], rk_a[160];
  size_t len;
  CHECK_EQ_INT(e2e_compile(fd_, 30, 4.0, 2, origin, key_d), 0);
  CHECK_EQ_INT(wait_published(fd_, 1), 0);
  CHECK_EQ_INT(e2e_compile(fa, 31, 4.0, 2, origin, key_a), 0);
  CHECK_EQ_INT(wait_published(fa, 3), 0);
  CHECK(strcmp(key_d, key_a) != 0);
  rkey_for("sm_80", key_d, rk_d, sizeof rk_d);
  rkey_for("sm_90a", key_a, rk_a, sizeof rk_a);
  uint8_t *v = rget(rk_d, &len);
  CHECK(v != NULL);
  if (!v) return;
  CHECK_EQ_INT(rset(rk_a, v, len), 0);
  free(v);
  int64_t before = e2e_stat(fb, "remote", "refused");
  CHECK_EQ_INT(e2e_compile(fb, 32, 4.0, 2, origin, key_a), 0);
  CHECK(strcmp(origin, "compiled") == 0);
  CHECK_EQ_INT(e2e_stat(fb, "remote", "refused"), before + 1);
  CHECK(e2e_log_contains(&B, "entry is for device none/sm_80"));
}

static void test_outage(void) {
  char origin[16], key[65];
  int failed = 0;
  redis_kill();
  double worst = 0;
  for (int i = 0; i < 6; i++) {
    double t0 = now_ms();
    if (e2e_compile(fb, 40 + (uint64_t)i, 50.0 + i, 2, origin, key) != 0) failed++;
    double t = now_ms() - t0;
    if (t > worst) worst = t;
  }
  CHECK_EQ_INT(failed, 0);
  CHECK_EQ_INT(e2e_stat(fb, "remote", "outages"), 1);
  CHECK(e2e_stat(fb, "remote", "errors") >= 1);
  CHECK_EQ_INT(count_in_log(&B, "unreachable"), 1); /* one line per change of state */
  printf("figure: compiles during the outage: worst %.0f ms (local compile included)\n", worst);

  CHECK_EQ_INT(redis_start(), 0);
  sleep_ms(1300); /* past FM_REMOTE_RETRY_MS */
  CHECK_EQ_INT(e2e_compile(fb, 50, 60.0, 2, origin, key), 0);
  CHECK_EQ_INT(e2e_compile(fb, 51, 61.0, 2, origin, key), 0);
  CHECK_EQ_INT(wait_published(fb, 1), 0);       /* B publishes again: it reconnected */
  CHECK(count_in_log(&B, "/0 reachable") == 2); /* at the first lookup, and after the restart */
  CHECK_EQ_INT(count_in_log(&B, "unreachable"), 1);
  CHECK_EQ_INT(e2e_stat(fb, "remote", "outages"), 1);
  /* An entry published after the restart is shared again. */
  CHECK_EQ_INT(e2e_compile(fa, 52, 61.0, 2, origin, key), 0);
  CHECK(strcmp(origin, "remote") == 0);
}

static int run_fusectl(const char *sock, const char *cmd, const char *file) {
  pid_t pid = fork();
  if (pid == 0) {
    int null = open("/dev/null", O_WRONLY);
    dup2(null, 1);
    execl(fusectl, fusectl, "--socket", sock, cmd, file, (char *)NULL);
    _exit(127);
  }
  int st;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_export_import(void) {
  e2e_daemon E;
  char snap[320], origin[16], ka[65], ke[65];
  snprintf(snap, sizeof snap, "%s/snap.fmx", dir);
  CHECK_EQ_INT(run_fusectl(A.sock, "export", snap), 0);
  /* E: the same secret, no remote. */
  const char *args[] = {"--remote-secret-file", secret, NULL};
  CHECK_EQ_INT(e2e_setup(&E, fusemld), 0);
  CHECK_EQ_INT(e2e_start(&E, args), 0);
  CHECK_EQ_INT(run_fusectl(E.sock, "import", snap), 0);
  /* Again: every entry is already here (untuned), so each is skipped, which is no error. */
  CHECK_EQ_INT(run_fusectl(E.sock, "import", snap), 0);
  CHECK(e2e_log_contains(&E, "skipped: a local untuned entry is kept"));
  int fe = e2e_connect_hello(&E);
  CHECK(fe >= 0);
  double salts[] = {1.0, 2.0, 4.0};
  int ops[] = {3, 2, 2};
  for (int i = 0; i < 3; i++) {
    CHECK_EQ_INT(e2e_compile(fa, 60 + (uint64_t)i, salts[i], ops[i], origin, ka), 0);
    CHECK_EQ_INT(e2e_compile(fe, 70 + (uint64_t)i, salts[i], ops[i], origin, ke), 0);
    CHECK(strcmp(origin, "hit") == 0);
    CHECK(strcmp(ka, ke) == 0);
  }
  CHECK_EQ_INT(e2e_stat(fe, "session", "compiles"), 0);
  close(fe);
  e2e_teardown(&E, 0);
  /* A daemon with another secret refuses the whole snapshot. */
  const char *args2[] = {"--remote-secret-file", secret2, NULL};
  CHECK_EQ_INT(e2e_setup(&E, fusemld), 0);
  CHECK_EQ_INT(e2e_start(&E, args2), 0);
  CHECK_EQ_INT(run_fusectl(E.sock, "import", snap), 1);
  fe = e2e_connect_hello(&E);
  CHECK_EQ_INT(e2e_stat(fe, NULL, "entries"), 0);
  close(fe);
  e2e_teardown(&E, 0);
}

static void test_needs_secret(void) {
  e2e_daemon X;
  char url[64];
  snprintf(url, sizeof url, "redis://127.0.0.1:%d", redis_port);
  const char *args[] = {"--remote", url, NULL};
  CHECK_EQ_INT(e2e_setup(&X, fusemld), 0);
  int st = e2e_run(&X, args, 10000);
  CHECK(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) != 0);
  CHECK(e2e_log_contains(&X, "remote-secret-file"));
  e2e_teardown(&X, 0);
}

/* ---- AUTH (a Redis 6 ACL user, and the default user's requirepass), IPv6, no password shown ---- */

#define ACL_PW     "alice@pw" /* '@' travels percent-encoded in the URL */
#define DEFAULT_PW "defaultpw"
#define WRONG_PW   "wrongpw"

static int auth_port;
static pid_t auth_pid;

/* 1 if path's contents hold any of the passwords. */
static int shows_password(const char *path) {
  char *text = e2e_slurp(path, NULL);
  int found = text && (strstr(text, "alice@pw") || strstr(text, "alice%40pw") || strstr(text, DEFAULT_PW) ||
                       strstr(text, WRONG_PW));
  free(text);
  return found;
}

/* fusectl stats (text, then --json) on d: the output shows the redacted URL, never a password. */
static void check_stats_output(const e2e_daemon *d) {
  char out[320];
  snprintf(out, sizeof out, "%s/stats.out", dir);
  const char *text[] = {fusectl, "--socket", d->sock, "stats", NULL};
  const char *json[] = {fusectl, "--socket", d->sock, "--json", "stats", NULL};
  const char *const *runs[] = {text, json};
  for (int i = 0; i < 2; i++) {
    CHECK_EQ_INT(e2e_run_tool(runs[i], out, out, 10000), 0);
    char *o = e2e_slurp(out, NULL);
    CHECK_STR_CONTAINS(o, ":***@");
    free(o);
    CHECK(!shows_password(out));
  }
}

static int start_auth_daemon(e2e_daemon *d, const char *url) {
  const char *args[] = {"--remote", url, "--remote-secret-file", secret, "--arch", "sm_90a", NULL};
  if (e2e_setup(d, fusemld)) return -1;
  return e2e_start(d, args);
}

static void test_auth(void) {
  char port[16], url[160], origin[16], key[65], key2[65];
  e2e_daemon P, Q, W;
  auth_port = free_port();
  snprintf(port, sizeof port, "%d", auth_port);
  const char *extra[] = {"--bind",   "127.0.0.1", "-::1", "--requirepass", DEFAULT_PW, "--user", "alice", "on",
                         ">" ACL_PW, "~*",        "&*",   "+@all",         NULL};
  auth_pid = redis_spawn(auth_port, extra);
  CHECK(auth_pid > 0);
  if (auth_pid <= 0) return;

  /* P: an ACL user; its publish succeeds only if AUTH user password was sent (NOAUTH else). */
  snprintf(url, sizeof url, "redis://alice:alice%%40pw@127.0.0.1:%d/0", auth_port);
  CHECK_EQ_INT(start_auth_daemon(&P, url), 0);
  int fp = e2e_connect_hello(&P);
  CHECK_EQ_INT(e2e_compile(fp, 100, 100.0, 2, origin, key), 0);
  CHECK(strcmp(origin, "compiled") == 0);
  CHECK_EQ_INT(wait_published(fp, 1), 0);

  /* Q: the default user's password, over IPv6 loopback where this machine has it. */
  int v6 = socket(AF_INET6, SOCK_STREAM, 0);
  struct sockaddr_in6 a6 = {
      .sin6_family = AF_INET6, .sin6_port = htons((uint16_t)auth_port), .sin6_addr = IN6ADDR_LOOPBACK_INIT};
  int have_v6 = v6 >= 0 && connect(v6, (struct sockaddr *)&a6, sizeof a6) == 0;
  if (v6 >= 0) close(v6);
  if (!have_v6) printf("note: no IPv6 loopback here; [::1] is tested by the unit test only\n");
  /* ... from the config file, where a password belongs (on the command line, ps shows it). */
  char conf[320];
  snprintf(conf, sizeof conf, "%s/auth.conf", dir);
  FILE *f = fopen(conf, "w");
  CHECK(f != NULL);
  if (!f) return;
  fprintf(f, "remote = redis://:%s@%s:%d/0\nremote-secret-file = %s\narch = sm_90a\n", DEFAULT_PW,
          have_v6 ? "[::1]" : "127.0.0.1", auth_port, secret);
  fclose(f);
  const char *conf_args[] = {"--config", conf, NULL};
  CHECK_EQ_INT(e2e_setup(&Q, fusemld), 0);
  CHECK_EQ_INT(e2e_start(&Q, conf_args), 0);
  int fq = e2e_connect_hello(&Q);
  CHECK_EQ_INT(e2e_compile(fq, 101, 100.0, 2, origin, key2), 0);
  CHECK(strcmp(origin, "remote") == 0); /* what P published, read with the default user */
  CHECK(strcmp(key, key2) == 0);

  /* W: a wrong password: down with Redis's reason, every request still served. */
  snprintf(url, sizeof url, "redis://alice:%s@127.0.0.1:%d/0", WRONG_PW, auth_port);
  CHECK_EQ_INT(start_auth_daemon(&W, url), 0);
  int fw = e2e_connect_hello(&W);
  CHECK_EQ_INT(e2e_compile(fw, 102, 100.0, 2, origin, key2), 0);
  CHECK(strcmp(origin, "compiled") == 0);
  CHECK_EQ_INT(e2e_stat(fw, "remote", "outages"), 1);
  CHECK(e2e_log_contains(&W, "AUTH failed: WRONGPASS"));

  CHECK(e2e_log_contains(&P, "a password on the command line can be read by every user"));
  CHECK(!e2e_log_contains(&Q, "a password on the command line"));
  /* Nowhere a password: not the logs (at debug level), not fusectl stats. */
  e2e_daemon *all[] = {&P, &Q, &W};
  for (int i = 0; i < 3; i++) {
    check_stats_output(all[i]);
    CHECK(!shows_password(all[i]->log));
    CHECK(e2e_log_contains(all[i], ":***@"));
  }
  close(fp), close(fq), close(fw);
  for (int i = 0; i < 3; i++) e2e_teardown(all[i], fm_test_failed_checks_ > 0);

  /* A URL the daemon refuses names what is wrong without the password. */
  e2e_daemon X;
  snprintf(url, sizeof url, "redis://alice:%s@127.0.0.1:0/0", WRONG_PW);
  const char *args[] = {"--remote", url, "--remote-secret-file", secret, NULL};
  CHECK_EQ_INT(e2e_setup(&X, fusemld), 0);
  int st = e2e_run(&X, args, 10000);
  CHECK(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) != 0);
  CHECK(e2e_log_contains(&X, "bad port"));
  CHECK(!shows_password(X.log));
  e2e_teardown(&X, 0);
  /* rediss:// is refused with its reason (no hiredis_ssl). */
  snprintf(url, sizeof url, "rediss://alice:%s@127.0.0.1:%d/0", WRONG_PW, auth_port);
  CHECK_EQ_INT(e2e_setup(&X, fusemld), 0);
  st = e2e_run(&X, args, 10000);
  CHECK(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) != 0);
  CHECK(e2e_log_contains(&X, "TLS (rediss://) is not supported"));
  CHECK(!shows_password(X.log));
  e2e_teardown(&X, 0);
  kill(auth_pid, SIGKILL);
  waitpid(auth_pid, NULL, 0);
}

/* A clean stop with the tier in use exits 0 (under ASan: nothing leaked). */
static void test_clean_shutdown(void) {
  close(fb);
  fb = -1;
  int st = e2e_stop(&B, SIGTERM, 20000);
  CHECK(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: e2e_remote FUSEMLD FUSECTL\n");
    return 2;
  }
  fusemld = argv[1];
  fusectl = argv[2];
  signal(SIGPIPE, SIG_IGN);
  if (!find_redis()) {
    printf("SKIP: redis-server not found (apt-get install redis-server)\n");
    return SKIP;
  }
  snprintf(dir, sizeof dir, "/tmp/fm-e2e-remote-XXXXXX");
  if (!mkdtemp(dir)) return 1;
  snprintf(secret, sizeof secret, "%s/secret", dir);
  snprintf(secret2, sizeof secret2, "%s/secret2", dir);
  FILE *f = fopen(secret, "w");
  fputs("the cluster secret\n", f);
  fclose(f);
  f = fopen(secret2, "w");
  fputs("another cluster\n", f);
  fclose(f);
  if ((redis_port = free_port()) < 0 || redis_start()) {
    fprintf(stderr, "cannot start %s\n", redis_exe);
    return 1;
  }
  if (start_daemon(&A, secret, "sm_90a") || start_daemon(&B, secret, "sm_90a") || start_daemon(&C, secret2, "sm_90a") ||
      start_daemon(&D, secret, "sm_80") || (fa = e2e_connect_hello(&A)) < 0 || (fb = e2e_connect_hello(&B)) < 0 ||
      (fc = e2e_connect_hello(&C)) < 0 || (fd_ = e2e_connect_hello(&D)) < 0) {
    int no_tier = e2e_log_contains(&A, "built without hiredis");
    if (no_tier)
      printf("SKIP: this fusemld was built without hiredis\n");
    else
      fprintf(stderr, "cannot start the daemons\n");
    teardown(&A, !no_tier);
    teardown(&B, 1);
    teardown(&C, 1);
    teardown(&D, 1);
    redis_kill();
    return no_tier ? SKIP : 1;
  }
  RUN(test_share);
  RUN(test_tampered);
  RUN(test_wrong_secret);
  RUN(test_wrong_device);
  RUN(test_outage);
  RUN(test_export_import);
  RUN(test_needs_secret);
  RUN(test_auth);
  RUN(test_clean_shutdown);
  int failed = fm_test_failed_ > 0;
  close(fa), close(fc), close(fd_);
  if (fb >= 0) close(fb);
  teardown(&A, failed);
  teardown(&B, failed);
  teardown(&C, failed);
  teardown(&D, failed);
  redis_kill();
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", dir);
  return FM_TEST_DONE();
}
