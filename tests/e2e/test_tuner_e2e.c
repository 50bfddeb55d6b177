/* test_tuner_e2e.c: a real fusemld tuning with a stand-in worker (no GPU): --tuner-worker
 * enables tuning, the stand-in (tests/unit/tuner_standin.c) aborts, hangs, fails launches and
 * answers wrong on cue. The daemon must pick the fastest ok candidate, restart the worker
 * within the deadline, store a fragment none of whose candidates verify as bad (and refuse
 * to serve it), keep serving, count it all, and leave no process behind.
 * usage: test_tuner_e2e PATH/TO/fusemld PATH/TO/tuner_standin PATH/TO/fusectl */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "e2e_util.h"
#include "fm_msg.h"
#include "fm_test.h"

static e2e_daemon D;
static const char *standin, *fusectl;
static char piddir[400];

static int client(void) {
  int fd = e2e_connect(D.sock);
  if (fd >= 0 && e2e_hello(fd) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

/* compile the salted fragment; copies state/origin (or the error code) and the key. */
static int compile(int fd, uint64_t id, double salt, char state[16], char key[65], char detail[256]) {
  e2e_req r;
  msgpack_zone z;
  msgpack_object o;
  int rc = -1;
  e2e_req_begin(&r, "compile", id, 1);
  fm_pack_cstr(&r.pk, "fragment");
  e2e_pack_fragment(&r.pk, salt, 3);
  state[0] = key[0] = detail[0] = '\0';
  if (e2e_req_send(&r, fd)) return -1;
  msgpack_zone_init(&z, 65536);
  if (e2e_recv(fd, 90000, &z, &o) == 0) {
    if (e2e_is_ok(&o)) {
      e2e_str(&o, "state", state, 16);
      e2e_str(&o, "key", key, 65);
      rc = 0;
    } else {
      e2e_str(&o, "code", state, 16);
      e2e_str(&o, "detail", detail, 256);
      rc = 1;
    }
  }
  msgpack_zone_destroy(&z);
  return rc;
}

/* Pids the stand-in recorded; for each: alive (not a zombie) counts in *alive, a zombie in
 * *zombies. */
static int scan_workers(int *alive, int *zombies) {
  int n = 0;
  *alive = *zombies = 0;
  DIR *d = opendir(piddir);
  if (!d) return -1;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    n++;
    char path[300], buf[512];
    snprintf(path, sizeof path, "/proc/%s/stat", e->d_name);
    FILE *f = fopen(path, "r");
    if (!f) continue; /* gone and reaped */
    size_t got = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[got] = '\0';
    const char *paren = strrchr(buf, ')');
    if (paren && paren[1] == ' ' && paren[2] == 'Z')
      (*zombies)++;
    else
      (*alive)++;
  }
  closedir(d);
  return n;
}

/* Runs fusectl show KEY and returns its output (malloc'd). */
static char *show(const char *key) {
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "%s --socket %s show %.16s 2>&1", fusectl, D.sock, key);
  FILE *p = popen(cmd, "r");
  if (!p) return NULL;
  size_t cap = 1 << 16, len = 0;
  char *out = calloc(1, cap);
  size_t got;
  while (out && (got = fread(out + len, 1, cap - 1 - len, p)) > 0) len += got;
  pclose(p);
  return out;
}

static int start(const char *plan, const char *deadline) {
  setenv("FM_STANDIN_PLAN", plan, 1);
  setenv("FM_STANDIN_PIDDIR", piddir, 1);
  /* every candidate judged before the reply: tests/e2e/test_bgtune_e2e.c covers background */
  const char *extra[] = {"--tuner-worker", standin, "--tune-deadline", deadline, "--tune", "eager", NULL};
  return e2e_start(&D, extra);
}

static void test_tunes_and_isolates_bad_candidates(void) {
  char state[16], key[65], detail[256];
  int fd = client(), alive, zombies;
  CHECK(fd >= 0);
  if (fd < 0) return;
  time_t t0 = time(NULL);
  CHECK_EQ_INT(compile(fd, 1, 1.0, state, key, detail), 0);
  CHECK(strcmp(state, "tuned") == 0);
  /* The hanging stand-in never returns, so finishing at all proves the watchdog; the bound
   * (one 1 s deadline + 50 x 3 ms, plus 24 NVRTC compiles under ASan on a loaded 2-core CI
   * machine, which alone took ~10 s once) only guards against a watchdog that waits far
   * longer than its deadline. */
  CHECK(time(NULL) - t0 < 60);

  /* Four bad candidates: abort (fault), hang (timeout), wrong, launch_failed; the worker
   * restarted after each of the first two and, when more candidates follow, the last. */
  char *out = show(key);
  CHECK(out != NULL);
  if (out) {
    CHECK_STR_CONTAINS(out, "candidates (tuned on stand-in");
    CHECK_STR_CONTAINS(out, "fault");
    CHECK_STR_CONTAINS(out, "timeout");
    CHECK_STR_CONTAINS(out, "wrong");
    CHECK_STR_CONTAINS(out, "launch_failed");
    CHECK_STR_CONTAINS(out, "*  3 "); /* the 1 ms candidate is chosen */
    CHECK_STR_CONTAINS(out, "1.0000");
    CHECK_STR_CONTAINS(out, "pointwise block=");
  }
  int n_cands = 0;
  for (const char *p = out; p && (p = strstr(p, "pointwise block=")); p++) n_cands++;
  free(out);
  CHECK(n_cands >= 6);
  CHECK_EQ_INT(e2e_stat(fd, "stats", "tunes"), 1);
  CHECK_EQ_INT(e2e_stat(fd, "stats", "bad_candidates"), 4);
  CHECK_EQ_INT(e2e_stat(fd, "stats", "worker_restarts"), n_cands > 6 ? 3 : 2);
  CHECK_EQ_INT(scan_workers(&alive, &zombies), n_cands > 6 ? 4 : 3);
  CHECK_EQ_INT(zombies, 0);
  CHECK(alive <= 1);

  /* Still serving: a hit is tuned, a new fragment tunes again on the same worker. */
  CHECK_EQ_INT(compile(fd, 2, 1.0, state, key, detail), 0);
  CHECK(strcmp(state, "tuned") == 0);
  CHECK_EQ_INT(compile(fd, 3, 2.0, state, key, detail), 0);
  CHECK(strcmp(state, "tuned") == 0);
  CHECK_EQ_INT(e2e_stat(fd, "stats", "tunes"), 2);
  CHECK_EQ_INT(e2e_stat(fd, "stats", "hits"), 1);
  scan_workers(&alive, &zombies);
  CHECK_EQ_INT(zombies, 0);
  close(fd);
}

static void test_stop_leaves_no_worker(void) {
  int alive, zombies;
  CHECK_EQ_INT(e2e_stop(&D, SIGTERM, 10000), 0);
  CHECK(scan_workers(&alive, &zombies) > 0);
  CHECK_EQ_INT(alive, 0);
  CHECK_EQ_INT(zombies, 0);
}

static void test_none_verified_is_bad(void) {
  char state[16], key[65], detail[256], plan[256] = "";
  for (int i = 0; i < 24; i++) strcat(plan, i ? ",wrong" : "wrong");
  CHECK_EQ_INT(start(plan, "1"), 0);
  int fd = client();
  CHECK(fd >= 0);
  if (fd < 0) return;
  CHECK_EQ_INT(compile(fd, 1, 5.0, state, key, detail), 1);
  CHECK(strcmp(state, "unsupported") == 0);
  CHECK_STR_CONTAINS(detail, "no candidate verified: wrong wrong");
  /* Stored as bad: the next request is answered from the store, still refused. */
  CHECK_EQ_INT(compile(fd, 2, 5.0, state, key, detail), 1);
  CHECK(strcmp(state, "unsupported") == 0);
  CHECK_STR_CONTAINS(detail, "no candidate verified on this device");
  CHECK_EQ_INT(e2e_stat(fd, "session", "hits"), 1);
  CHECK_EQ_INT(e2e_stat(fd, "session", "worker_restarts"), 0);
  /* Persisted counters carry the first run's too. */
  CHECK(e2e_stat(fd, "stats", "bad_candidates") >= 4 + 6);
  close(fd);
  CHECK_EQ_INT(e2e_stop(&D, SIGTERM, 10000), 0);
}

static void test_worker_without_gpu_serves_untuned(void) {
  char state[16], key[65], detail[256];
  setenv("FM_STANDIN_NOGPU", "1", 1);
  CHECK_EQ_INT(start("", "1"), 0);
  unsetenv("FM_STANDIN_NOGPU");
  int fd = client();
  CHECK(fd >= 0);
  if (fd < 0) return;
  CHECK_EQ_INT(compile(fd, 1, 7.0, state, key, detail), 0);
  CHECK(strcmp(state, "untuned") == 0);
  CHECK(e2e_log_contains(&D, "serving the default configuration untuned"));
  close(fd);
  CHECK_EQ_INT(e2e_stop(&D, SIGTERM, 10000), 0);
}

/* --no-tune wins over --tuner-worker: the default, untuned, and no worker ever started. */
static void test_no_tune(void) {
  char state[16], key[65], detail[256];
  int alive, zombies, before = scan_workers(&alive, &zombies);
  setenv("FM_STANDIN_PIDDIR", piddir, 1);
  const char *extra[] = {"--tuner-worker", standin, "--no-tune", NULL};
  CHECK_EQ_INT(e2e_start(&D, extra), 0);
  int fd = client();
  CHECK(fd >= 0);
  if (fd < 0) return;
  CHECK_EQ_INT(compile(fd, 1, 9.0, state, key, detail), 0);
  CHECK(strcmp(state, "untuned") == 0);
  CHECK_EQ_INT(scan_workers(&alive, &zombies), before);
  close(fd);
  CHECK_EQ_INT(e2e_stop(&D, SIGTERM, 10000), 0);
}

int main(int argc, char **argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: %s PATH/TO/fusemld PATH/TO/tuner_standin PATH/TO/fusectl\n", argv[0]);
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  standin = argv[2];
  fusectl = argv[3];
  if (e2e_setup(&D, argv[1]) != 0) return 2;
  snprintf(piddir, sizeof piddir, "%s/pids", D.dir);
  if (mkdir(piddir, 0700) != 0) return 2;
  if (start("ok:3,abort,hang,ok:1,wrong,launch", "1") != 0) {
    fprintf(stderr, "cannot start %s\n", argv[1]);
    e2e_teardown(&D, 1);
    printf("0 passed, 1 failed\n");
    return 1;
  }
  RUN(test_tunes_and_isolates_bad_candidates);
  RUN(test_stop_leaves_no_worker);
  RUN(test_none_verified_is_bad);
  RUN(test_worker_without_gpu_serves_untuned);
  RUN(test_no_tune);
  char cmd[512];
  snprintf(cmd, sizeof cmd, "rm -rf %s", piddir);
  if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", piddir);
  e2e_teardown(&D, fm_test_failed_ != 0);
  return FM_TEST_DONE();
}
