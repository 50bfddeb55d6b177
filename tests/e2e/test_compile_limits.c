/* test_compile_limits.c: what one client's compiles may cost everyone else, against a real
 * fusemld and real NVRTC (compile-only mode, no GPU needed):
 *   - a client that pipelines 4 pathological fragments (255 chained general pows, ~50 s of
 *     NVRTC each) and hangs up: its work is cancelled (queued jobs dropped, running NVRTC
 *     workers killed, nothing stored), and another client's small compile, sent while they
 *     hold both compile threads, finishes within 2 s of its normal time;
 *   - the same fragment under the default --max-compile-cost: refused at once with
 *     limit_exceeded, while the largest fragments real models send pass;
 *   - --compile-deadline: a compile past it answers compile_timeout, its worker is killed,
 *     nothing is stored, and the daemon keeps serving;
 *   - --compile-memory: a compile that needs more is answered out_of_memory, not served;
 *   - --max-client-compiles: the request past the limit is answered busy, the connection
 *     stays usable, another connection is not affected;
 *   - compiles wait in one line per client, served in turn: a client that queued 6 slow
 *     compiles delays another client's one by at most the compiles already running.
 * usage: test_compile_limits PATH/TO/fusemld */
#define _GNU_SOURCE
#include <ctype.h>
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "e2e_util.h"
#include "fm_msg.h"
#include "fm_test.h"

#define PATHOLOGICAL_POWS 255
#define NO_COST_BOUND     "100000000" /* --max-compile-cost that lets every fragment through */

static e2e_daemon D;

static int restart(const char *const *extra) {
  if (D.pid) e2e_stop(&D, SIGTERM, 60000);
  return e2e_start(&D, extra);
}

static int send_pow_chain(int fd, uint64_t id, double exponent, int n_pows) {
  e2e_req r;
  e2e_req_begin(&r, "compile", id, 1);
  fm_pack_cstr(&r.pk, "fragment");
  e2e_pack_pow_chain(&r.pk, exponent, n_pows);
  return e2e_req_send(&r, fd);
}

/* Reads replies until the one for id: 0 with its code ("" when ok) and detail; -1 if none
 * came within timeout_ms. */
static int reply_for(int fd, uint64_t id, int timeout_ms, char code[32], char detail[512]) {
  double end = e2e_now_ms() + timeout_ms;
  code[0] = detail[0] = '\0';
  while (e2e_now_ms() < end) {
    msgpack_zone z;
    msgpack_object o;
    uint64_t got = 0;
    msgpack_zone_init(&z, 65536);
    int rc = e2e_recv(fd, (int)(end - e2e_now_ms()) + 1, &z, &o);
    if (rc == 0 && fm_msg_get_u64(&o, "id", &got, NULL) == FM_OK && got == id) {
      if (!e2e_is_ok(&o)) {
        e2e_str(&o, "code", code, 32);
        e2e_str(&o, "detail", detail, 512);
      }
      msgpack_zone_destroy(&z);
      return 0;
    }
    msgpack_zone_destroy(&z);
    if (rc != 0) return -1;
  }
  return -1;
}

/* lookup of a pow chain: 1 if the daemon has it stored. */
static int stored(int fd, uint64_t id, double exponent, int n_pows) {
  char code[32], detail[512];
  e2e_req r;
  e2e_req_begin(&r, "lookup", id, 1);
  fm_pack_cstr(&r.pk, "fragment");
  e2e_pack_pow_chain(&r.pk, exponent, n_pows);
  if (e2e_req_send(&r, fd) || reply_for(fd, id, 10000, code, detail)) return -1;
  return code[0] == '\0';
}

/* Processes whose parent is pid (the daemon's NVRTC workers; it starts no others here). */
static int children_of(pid_t pid) {
  int n = 0;
  DIR *dir = opendir("/proc");
  struct dirent *e;
  while (dir && (e = readdir(dir))) {
    if (!isdigit((unsigned char)e->d_name[0])) continue;
    char path[300], buf[512];
    snprintf(path, sizeof path, "/proc/%s/stat", e->d_name);
    FILE *f = fopen(path, "r");
    if (!f) continue;
    size_t len = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[len] = '\0';
    char *paren = strrchr(buf, ')'); /* the name may hold spaces: fields follow its ')' */
    int ppid = 0;
    if (paren && sscanf(paren + 1, " %*c %d", &ppid) == 1 && ppid == pid) n++;
  }
  if (dir) closedir(dir);
  return n;
}

/* The time of one small compile (a fragment not seen before), in ms; -1 if it failed. */
static double small_compile_ms(int fd, uint64_t id, double salt) {
  char origin[16];
  double t0 = e2e_now_ms();
  if (e2e_compile(fd, id, salt, 3, origin, NULL) != 0 || strcmp(origin, "compiled") != 0) return -1;
  return e2e_now_ms() - t0;
}

static void test_departing_client_work_cancelled(void) {
  const char *extra[] = {"--jobs", "2", "--max-compile-cost", NO_COST_BOUND, NULL};
  CHECK_EQ_INT(restart(extra), 0);
  int b = e2e_client(D.sock);
  CHECK(b >= 0);
  /* The normal time first: the slowest of three small compiles, the machine as it is now. */
  double normal = 0;
  for (int i = 0; i < 3; i++) {
    double t = small_compile_ms(b, 10 + (uint64_t)i, 50.25 + i);
    CHECK(t >= 0);
    if (t > normal) normal = t;
  }
  /* A sends four pathological fragments in one go; two of them take both compile threads. */
  int a = e2e_client(D.sock);
  CHECK(a >= 0);
  for (int i = 0; i < 4; i++)
    CHECK_EQ_INT(send_pow_chain(a, 100 + (uint64_t)i, 1.25 + i * 0.125, PATHOLOGICAL_POWS), 0);
  for (int i = 0; i < 250 && e2e_stat(b, NULL, "inflight") != 4; i++) e2e_sleep_ms(20);
  CHECK_EQ_INT(e2e_stat(b, NULL, "inflight"), 4);
  e2e_sleep_ms(300); /* well into NVRTC */
  /* B's small compile is queued behind A's work; then A hangs up. */
  double t0 = e2e_now_ms();
  e2e_req r;
  e2e_req_begin(&r, "compile", 20, 1);
  fm_pack_cstr(&r.pk, "fragment");
  e2e_pack_fragment(&r.pk, 60.5, 3);
  CHECK_EQ_INT(e2e_req_send(&r, b), 0);
  close(a);
  char code[32], detail[512];
  CHECK_EQ_INT(reply_for(b, 20, 120000, code, detail), 0);
  double took = e2e_now_ms() - t0;
  CHECK(code[0] == '\0');
  printf("  small compile: normal %.0f ms, behind a departed client's 4 pathological fragments %.0f ms\n", normal,
         took);
  CHECK(took <= normal + 2000);
  /* None of A's work went on or was stored; no worker is left. */
  for (int i = 0; i < 250 && (e2e_stat(b, NULL, "inflight") != 0 || children_of(D.pid) != 0); i++) e2e_sleep_ms(20);
  CHECK_EQ_INT(e2e_stat(b, NULL, "inflight"), 0);
  CHECK_EQ_INT(children_of(D.pid), 0);
  for (int i = 0; i < 4; i++) CHECK_EQ_INT(stored(b, 200 + (uint64_t)i, 1.25 + i * 0.125, PATHOLOGICAL_POWS), 0);
  CHECK(e2e_log_contains(&D, "cancelled 4 build(s) whose requesters all hung up")); /* one sweep, one line */
  close(b);
}

static void test_costly_fragment_refused(void) {
  CHECK_EQ_INT(restart(NULL), 0);
  int fd = e2e_client(D.sock);
  CHECK(fd >= 0);
  char code[32], detail[512], origin[16];
  double t0 = e2e_now_ms();
  CHECK_EQ_INT(send_pow_chain(fd, 30, 1.375, PATHOLOGICAL_POWS), 0);
  CHECK_EQ_INT(reply_for(fd, 30, 10000, code, detail), 0);
  CHECK(strcmp(code, "limit_exceeded") == 0);
  CHECK(strstr(detail, "too costly to compile") && strstr(detail, "--max-compile-cost"));
  CHECK(e2e_now_ms() - t0 < 5000); /* refused, not compiled */
  CHECK_EQ_INT(children_of(D.pid), 0);
  /* A fragment the size of the largest real ones (30 ops, 10 of them transcendental) passes;
   * so does a short pow chain. */
  CHECK_EQ_INT(e2e_compile(fd, 31, 7.5, 30, origin, NULL), 0);
  CHECK(strcmp(origin, "compiled") == 0);
  CHECK_EQ_INT(send_pow_chain(fd, 32, 1.375, 2), 0);
  CHECK_EQ_INT(reply_for(fd, 32, 60000, code, detail), 0);
  CHECK(code[0] == '\0');
  close(fd);
}

static void test_compile_deadline(void) {
  const char *extra[] = {"--compile-deadline", "0.5", "--max-compile-cost", NO_COST_BOUND, NULL};
  CHECK_EQ_INT(restart(extra), 0);
  int fd = e2e_client(D.sock);
  CHECK(fd >= 0);
  char code[32], detail[512];
  double t0 = e2e_now_ms();
  CHECK_EQ_INT(send_pow_chain(fd, 40, 1.625, 64), 0); /* ~10 s of NVRTC */
  CHECK_EQ_INT(reply_for(fd, 40, 60000, code, detail), 0);
  double took = e2e_now_ms() - t0;
  CHECK(strcmp(code, "compile_timeout") == 0);
  CHECK(strstr(detail, "0.5 s compile deadline") != NULL);
  CHECK(took < 5000);
  printf("  compile_timeout after %.0f ms (deadline 500 ms)\n", took);
  /* The daemon serves on: nothing stored, no worker left, a ping answered. */
  CHECK_EQ_INT(stored(fd, 41, 1.625, 64), 0);
  for (int i = 0; i < 100 && children_of(D.pid) != 0; i++) e2e_sleep_ms(20);
  CHECK_EQ_INT(children_of(D.pid), 0);
  e2e_req r;
  e2e_req_begin(&r, "ping", 42, 0);
  CHECK_EQ_INT(e2e_req_send(&r, fd), 0);
  CHECK_EQ_INT(reply_for(fd, 42, 10000, code, detail), 0);
  CHECK(code[0] == '\0');
  CHECK(e2e_stat(fd, "session", "compile_errors") >= 1);
  close(fd);
}

static void test_compile_memory_bound(void) {
  const char *extra[] = {"--compile-memory", "16M", NULL};
  CHECK_EQ_INT(restart(extra), 0);
  int fd = e2e_client(D.sock);
  CHECK(fd >= 0);
  char origin[16];
  CHECK_EQ_INT(e2e_compile(fd, 50, 70.5, 3, origin, NULL), -1);
  CHECK(strcmp(origin, "out_of_memory") == 0);
  CHECK(e2e_log_contains(&D, "16 MiB memory bound"));
  CHECK_EQ_INT(children_of(D.pid), 0);
  /* Served on: the same connection still gets answers. */
  CHECK(e2e_stat(fd, "session", "compile_errors") >= 1);
  close(fd);
}

static void test_client_compile_limit(void) {
  const char *extra[] = {"--max-client-compiles", "2", "--max-compile-cost", NO_COST_BOUND, NULL};
  CHECK_EQ_INT(restart(extra), 0);
  int fd = e2e_client(D.sock), other = e2e_client(D.sock);
  CHECK(fd >= 0 && other >= 0);
  char code[32], detail[512], origin[16];
  /* Two slow compiles wait; the third request on the same connection is over the limit. */
  for (int i = 0; i < 3; i++) CHECK_EQ_INT(send_pow_chain(fd, 60 + (uint64_t)i, 1.3 + i * 0.1, 16), 0);
  CHECK_EQ_INT(reply_for(fd, 62, 10000, code, detail), 0);
  CHECK(strcmp(code, "busy") == 0);
  CHECK(strstr(detail, "--max-client-compiles 2") != NULL);
  /* The connection stays: the two compiles are answered (in either order), then a new one
   * is accepted. */
  int answered = 0;
  for (int i = 0; i < 2; i++) {
    msgpack_zone z;
    msgpack_object o;
    uint64_t id = 0;
    msgpack_zone_init(&z, 65536);
    if (e2e_recv(fd, 120000, &z, &o) == 0 && e2e_is_ok(&o) && fm_msg_get_u64(&o, "id", &id, NULL) == FM_OK &&
        (id == 60 || id == 61))
      answered++;
    msgpack_zone_destroy(&z);
  }
  CHECK_EQ_INT(answered, 2);
  CHECK_EQ_INT(e2e_compile(fd, 63, 80.5, 3, origin, NULL), 0);
  /* Another connection has a limit of its own. */
  CHECK_EQ_INT(e2e_compile(other, 64, 81.5, 3, origin, NULL), 0);
  close(fd);
  close(other);
}

/* Compiles this daemon finished (its log's "compiled" lines since it started) before the
 * one of key; -1 if key's is not there. */
static int compiled_before(const char *key) {
  FILE *f = fopen(D.log, "r");
  char line[1024];
  int n = -1;
  while (f && fgets(line, sizeof line, f)) {
    if (strstr(line, " serving "))
      n = 0; /* this daemon's start: count afresh */
    else if (n >= 0 && strstr(line, "INFO: compiled ")) {
      if (strstr(line, key)) break;
      n++;
    }
  }
  if (f) fclose(f);
  return n;
}

static void test_clients_served_in_turn(void) {
  const char *extra[] = {"--jobs", "2", NULL};
  CHECK_EQ_INT(restart(extra), 0);
  int a = e2e_client(D.sock), b = e2e_client(D.sock);
  CHECK(a >= 0 && b >= 0);
  /* A queues six slow compiles (16 chained pows, about a second each); two run at once. */
  for (int i = 0; i < 6; i++) CHECK_EQ_INT(send_pow_chain(a, 70 + (uint64_t)i, 1.51 + i * 0.01, 16), 0);
  for (int i = 0; i < 250 && e2e_stat(b, NULL, "inflight") != 6; i++) e2e_sleep_ms(20);
  CHECK_EQ_INT(e2e_stat(b, NULL, "inflight"), 6);
  /* B's one compile takes the first worker that frees up, not the seventh. */
  char origin[16], key[65];
  CHECK_EQ_INT(e2e_compile(b, 80, 90.5, 3, origin, key), 0);
  key[16] = '\0';
  int before = compiled_before(key);
  printf("  the other client's compile finished after %d of the 6 queued ahead of it\n", before);
  CHECK(before >= 0 && before <= 3);
  close(a);
  close(b);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s PATH/TO/fusemld\n", argv[0]);
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  if (e2e_setup(&D, argv[1]) != 0) {
    printf("0 passed, 1 failed\n");
    return 1;
  }
  RUN(test_departing_client_work_cancelled);
  RUN(test_costly_fragment_refused);
  RUN(test_compile_deadline);
  RUN(test_compile_memory_bound);
  RUN(test_client_compile_limit);
  RUN(test_clients_served_in_turn);
  e2e_teardown(&D, fm_test_failed_ != 0);
  return FM_TEST_DONE();
}
