/* test_crashloop.c: SIGKILL a real fusemld at random moments while it compiles and stores,
 * FM_CRASH_KILLS times (default 100). After every kill the database passes
 * PRAGMA integrity_check; every 25 kills (and at the end) a restarted daemon is asked for every
 * fragment ever sent: each is either served (its checksum verified on the read) or not found,
 * never corrupt_entry, and the daemon counts no corrupt entries. Finally a database file of
 * garbage is moved aside, with a log line, and the daemon serves from a fresh one.
 * usage: test_crashloop PATH/TO/fusemld */
#define _GNU_SOURCE
#include <dirent.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "e2e_util.h"
#include "fm_msg.h"
#include "fm_test.h"

#define PER_ROUND        6 /* compiles in flight at each kill */
#define CALIBRATION_SALT 1e6

static e2e_daemon D;
static const char *const g_extra[] = {"--log-level", "warn", NULL};

static int integrity_ok(const char *db) {
  sqlite3 *h = NULL;
  sqlite3_stmt *st = NULL;
  int ok = 0;
  if (sqlite3_open_v2(db, &h, SQLITE_OPEN_READWRITE, NULL) == SQLITE_OK &&
      sqlite3_prepare_v2(h, "PRAGMA integrity_check", -1, &st, NULL) == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW) {
    const unsigned char *t = sqlite3_column_text(st, 0);
    ok = t && strcmp((const char *)t, "ok") == 0;
  }
  sqlite3_finalize(st);
  sqlite3_close(h);
  return ok;
}

static double salt_of(int round, int j) { return 10.0 + round * PER_ROUND + j; }

/* Asks for every fragment sent in rounds [0, rounds): counts served and not found; anything
 * else (corrupt_entry above all) is a failure. */
static void verify_all(int rounds, int *served, int *missing) {
  CHECK_EQ_INT(e2e_start(&D, g_extra), 0);
  int fd = e2e_connect(D.sock);
  CHECK(fd >= 0 && e2e_hello(fd) == 0);
  *served = *missing = 0;
  for (int r = 0; r < rounds; r++) {
    for (int j = 0; j < PER_ROUND; j++) {
      e2e_req q;
      e2e_req_begin(&q, "lookup", (uint64_t)(r * PER_ROUND + j + 1), 1);
      fm_pack_cstr(&q.pk, "fragment");
      e2e_pack_fragment(&q.pk, salt_of(r, j), 1 + j % 2);
      CHECK_EQ_INT(e2e_req_send(&q, fd), 0);
      msgpack_zone z;
      msgpack_object o;
      msgpack_zone_init(&z, 65536);
      char code[32] = "";
      CHECK_EQ_INT(e2e_recv(fd, 30000, &z, &o), 0);
      if (e2e_is_ok(&o))
        (*served)++;
      else {
        e2e_str(&o, "code", code, sizeof code);
        if (strcmp(code, "not_found") == 0)
          (*missing)++;
        else {
          fprintf(stderr, "  round %d fragment %d: lookup answered %s\n", r, j, code);
          CHECK(0);
        }
      }
      msgpack_zone_destroy(&z);
    }
  }
  CHECK_EQ_INT(e2e_stat(fd, "stats", "corrupt_entries"), 0);
  close(fd);
  CHECK(e2e_stop(&D, SIGKILL, 10000) >= 0);
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* How long a freshly started daemon takes to compile and store one round (sanitizers and a
 * busy machine make it vary tenfold), so that the kills can land before, during and after the
 * stores. */
static int calibrate_ms(void) {
  CHECK_EQ_INT(e2e_start(&D, g_extra), 0);
  int fd = e2e_connect(D.sock);
  CHECK(fd >= 0 && e2e_hello(fd) == 0);
  double t0 = now_ms();
  char origin[16];
  for (int j = 0; j < PER_ROUND; j++)
    CHECK_EQ_INT(e2e_compile(fd, (uint64_t)j + 1, CALIBRATION_SALT + j, 1 + j % 2, origin, NULL), 0);
  int ms = (int)(now_ms() - t0);
  close(fd);
  CHECK(e2e_stop(&D, SIGKILL, 10000) >= 0);
  return ms > 50 ? ms : 50;
}

static void test_kill_loop(void) {
  const char *env = getenv("FM_CRASH_KILLS");
  int kills = env && atoi(env) > 0 ? atoi(env) : 100;
  int bad_integrity = 0, failed_starts = 0, served = 0, missing = 0;
  unsigned seed = 4242;
  /* A round's compiles run in parallel (--jobs), so they finish within the sequential time;
   * kills are spread over 0 .. 1.5x that (at most 1.2 s). */
  int max_kill_ms = calibrate_ms() * 3 / 2;
  if (max_kill_ms > 1200) max_kill_ms = 1200; /* a slow machine: keep the run bounded */
  for (int r = 0; r < kills; r++) {
    if (e2e_start(&D, g_extra) != 0) {
      failed_starts++;
      continue;
    }
    int fds[2] = {e2e_connect(D.sock), e2e_connect(D.sock)};
    for (int k = 0; k < 2; k++)
      if (fds[k] >= 0) e2e_hello(fds[k]);
    for (int j = 0; j < PER_ROUND; j++) {
      int fd = fds[j % 2];
      if (fd < 0) continue;
      e2e_req q;
      e2e_req_begin(&q, "compile", (uint64_t)j + 1, 1);
      fm_pack_cstr(&q.pk, "fragment");
      e2e_pack_fragment(&q.pk, salt_of(r, j), 1 + j % 2);
      e2e_req_send(&q, fd);
    }
    usleep((useconds_t)(rand_r(&seed) % (unsigned)max_kill_ms) * 1000);
    int st = e2e_stop(&D, SIGKILL, 10000);
    CHECK(st >= 0 && WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
    for (int k = 0; k < 2; k++)
      if (fds[k] >= 0) close(fds[k]);
    if (!integrity_ok(D.db)) bad_integrity++;
    if ((r + 1) % 25 == 0 || r + 1 == kills) verify_all(r + 1, &served, &missing);
  }
  printf(
      "  %d SIGKILLs during compiles and stores (at 0-%d ms): %d failed starts, %d failed integrity checks; "
      "afterwards %d fragments served (verified), %d never stored, 0 corrupt\n",
      kills, max_kill_ms, failed_starts, bad_integrity, served, missing);
  CHECK_EQ_INT(failed_starts, 0);
  CHECK_EQ_INT(bad_integrity, 0);
  CHECK(served > 0 && missing > 0); /* kills really landed both before and after stores */
}

static void remove_corrupt_copies(void) {
  DIR *dir = opendir(D.dir);
  struct dirent *e;
  char path[600];
  while (dir && (e = readdir(dir)))
    if (strstr(e->d_name, ".corrupt-")) {
      snprintf(path, sizeof path, "%s/%s", D.dir, e->d_name);
      unlink(path);
    }
  if (dir) closedir(dir);
}

static int corrupt_copies(void) {
  DIR *dir = opendir(D.dir);
  struct dirent *e;
  int n = 0;
  while (dir && (e = readdir(dir))) n += strstr(e->d_name, "kernels.db.corrupt-") != NULL;
  if (dir) closedir(dir);
  return n;
}

static void test_garbage_db_moved_aside(void) {
  char path[400];
  const char *side[] = {"-wal", "-shm"};
  for (int i = 0; i < 2; i++) {
    snprintf(path, sizeof path, "%s%s", D.db, side[i]);
    unlink(path);
  }
  FILE *f = fopen(D.db, "wb");
  CHECK(f != NULL);
  for (int i = 0; f && i < 8192; i++) fputc((i * 7919) & 0xff, f);
  if (f) fclose(f);
  CHECK_EQ_INT(e2e_start(&D, g_extra), 0);
  CHECK(e2e_log_contains(&D, "was damaged"));
  CHECK_EQ_INT(corrupt_copies(), 1);
  int fd = e2e_connect(D.sock);
  char origin[16];
  CHECK(fd >= 0 && e2e_hello(fd) == 0);
  CHECK_EQ_INT(e2e_compile(fd, 1, 3.25, 1, origin, NULL), 0);
  CHECK(strcmp(origin, "compiled") == 0);
  close(fd);
  CHECK(integrity_ok(D.db));
  e2e_stop(&D, SIGTERM, 30000);
  remove_corrupt_copies();
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
  RUN(test_kill_loop);
  RUN(test_garbage_db_moved_aside);
  e2e_teardown(&D, fm_test_failed_ != 0);
  return FM_TEST_DONE();
}
