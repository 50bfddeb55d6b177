/* test_bgtune_e2e.c: serve first, tune in the background (--tune background, the default),
 * with a real fusemld, real sockets and SQLite, and the stand-in tuner worker
 * (tests/unit/tuner_standin.c; FM_STANDIN_TRACE records what it was asked, in order,
 * FM_STANDIN_RUN_MS makes each candidate slow).
 *
 * The first reply for a fragment is "verified" after one candidate was judged; the full tune
 * follows and replaces the entry ("tuned", counted in upgrades); concurrent clients share one
 * build per key; a client that hangs up leaves nothing behind; a foreground request waits for
 * at most one background candidate; a worker or daemon killed mid-tune leaves the verified
 * entry served. Asserts count, never time (bounds are only give-up limits).
 * usage: test_bgtune_e2e PATH/TO/fusemld PATH/TO/tuner_standin PATH/TO/fusectl [EXAMPLES_DIR] */
#define _GNU_SOURCE
#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "e2e_util.h"
#include "fm_msg.h"
#include "fm_test.h"

#define GIVE_UP_MS 120000 /* how long a background tune may take under ASan on a busy machine */

static e2e_daemon D;
static const char *standin, *fusectl, *examples;
static char piddir[400], trace_path[400];

/* One compile or lookup: 0 with state and key, 1 with the error code in state, -1 no reply. */
static int request(int fd, const char *op, uint64_t id, double salt, const char *by_key, char state[16], char key[65]) {
  e2e_req r;
  msgpack_zone z;
  msgpack_object o;
  int rc = -1;
  e2e_req_begin(&r, op, id, 1);
  if (by_key) {
    fm_pack_kv_cstr(&r.pk, "key", by_key);
  } else {
    fm_pack_cstr(&r.pk, "fragment");
    e2e_pack_fragment(&r.pk, salt, 3);
  }
  state[0] = '\0';
  if (key) key[0] = '\0';
  if (e2e_req_send(&r, fd)) return -1;
  msgpack_zone_init(&z, 65536);
  if (e2e_recv(fd, GIVE_UP_MS, &z, &o) == 0) {
    rc = e2e_is_ok(&o) ? 0 : 1;
    e2e_str(&o, rc ? "code" : "state", state, 16);
    if (key && !rc) e2e_str(&o, "key", key, 65);
  }
  msgpack_zone_destroy(&z);
  return rc;
}

static int compile(int fd, uint64_t id, double salt, char state[16], char key[65]) {
  return request(fd, "compile", id, salt, NULL, state, key);
}

/* Polls lookup by key until the entry is tuned: 1, or 0 after GIVE_UP_MS. */
static int wait_tuned(int fd, const char *key) {
  char state[16];
  for (double t0 = e2e_now_ms(); e2e_now_ms() - t0 < GIVE_UP_MS; e2e_sleep_ms(50))
    if (request(fd, "lookup", 900, 0, key, state, NULL) == 0 && strcmp(state, "tuned") == 0) return 1;
  return 0;
}

/* Polls a since-start counter or gauge until it reaches want: 1, or 0 after GIVE_UP_MS. */
static int wait_stat(int fd, const char *section, const char *name, int64_t want) {
  for (double t0 = e2e_now_ms(); e2e_now_ms() - t0 < GIVE_UP_MS; e2e_sleep_ms(50))
    if (e2e_stat(fd, section, name) == want) return 1;
  return 0;
}

/* The stand-in's trace, one request a line (malloc'd, "" if none yet). */
static char *trace(void) {
  size_t len = 0;
  char *t = e2e_slurp(trace_path, &len);
  return t ? t : calloc(1, 1);
}

static int count_lines(const char *text, const char *prefix) {
  int n = 0;
  for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
    n += strncmp(p, prefix, strlen(prefix)) == 0;
  return n;
}

/* Waits until the stand-in has been asked `prepares` prepares and a run after the last: the
 * background round of the fragment asked last is on the worker. 1, or 0 after GIVE_UP_MS. */
static int wait_background_running(int prepares) {
  for (double t0 = e2e_now_ms(); e2e_now_ms() - t0 < GIVE_UP_MS; e2e_sleep_ms(20)) {
    char *t = trace();
    const char *last = NULL;
    for (const char *p = strstr(t, "prepare "); p; p = strstr(p + 1, "prepare ")) last = p;
    int ok = count_lines(t, "prepare ") >= prepares && last && strstr(last, "\nrun ");
    free(t);
    if (ok) return 1;
  }
  return 0;
}

/* The stand-in processes alive now (not zombies), their pids in pids[]. */
static int live_workers(pid_t *pids, int cap) {
  int n = 0;
  DIR *d = opendir(piddir);
  struct dirent *e;
  while (d && (e = readdir(d))) {
    char path[300], buf[512];
    if (e->d_name[0] == '.') continue;
    snprintf(path, sizeof path, "/proc/%s/stat", e->d_name);
    FILE *f = fopen(path, "r");
    if (!f) continue;
    size_t got = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[got] = '\0';
    const char *paren = strrchr(buf, ')');
    if (paren && paren[1] == ' ' && paren[2] == 'Z') continue;
    if (n < cap) pids[n] = (pid_t)atol(e->d_name);
    n++;
  }
  if (d) closedir(d);
  return n;
}

static char *fusectl_out(const char *args);

static char *show(const char *key) {
  char args[64];
  snprintf(args, sizeof args, "show %.16s", key);
  return fusectl_out(args);
}

/* Runs fusectl with args and returns its output (malloc'd). */
static char *fusectl_out(const char *args) {
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "%s --socket %s %s 2>&1", fusectl, D.sock, args);
  FILE *p = popen(cmd, "r");
  if (!p) return NULL;
  size_t cap = 1 << 16, len = 0, got;
  char *out = calloc(1, cap);
  while (out && (got = fread(out + len, 1, cap - 1 - len, p)) > 0) len += got;
  pclose(p);
  return out;
}

static int start(const char *plan, const char *run_ms, const char *mode) {
  setenv("FM_STANDIN_PLAN", plan, 1);
  setenv("FM_STANDIN_PIDDIR", piddir, 1);
  setenv("FM_STANDIN_TRACE", trace_path, 1);
  if (run_ms)
    setenv("FM_STANDIN_RUN_MS", run_ms, 1);
  else
    unsetenv("FM_STANDIN_RUN_MS");
  unlink(trace_path);
  const char *extra[] = {"--tuner-worker", standin, "--tune-deadline", "5", mode ? "--tune" : NULL, mode, NULL};
  return e2e_start(&D, extra);
}

/* The first reply is verified after one candidate; the background tune replaces it with the
 * fastest candidate (index 2 of the plan), counted as an upgrade, and later requests get it. */
static void test_served_verified_then_upgraded(void) {
  char state[16], key[65];
  int fd = e2e_client(D.sock);
  CHECK(fd >= 0);
  if (fd < 0) return;
  CHECK_EQ_INT(e2e_stat(fd, NULL, "background_tunes"), 0);
  CHECK_EQ_INT(compile(fd, 1, 1.0, state, key), 0);
  CHECK_STR_CONTAINS(state, "verified");
  /* Only the served candidate was judged before the reply: the background round needs its
   * other candidates compiled (one at a time: --jobs 2 keeps a worker for clients) and 300 ms
   * a candidate on the stand-in before its first run. */
  char *t = trace();
  CHECK_EQ_INT(count_lines(t, "run "), 1);
  CHECK_EQ_INT(count_lines(t, "run 0"), 1); /* the heuristic default */
  free(t);
  char *out = show(key);
  CHECK(out != NULL);
  if (out) {
    CHECK_STR_CONTAINS(out, "verified");
    CHECK_STR_CONTAINS(out, "background tune"); /* the served one and the one being tuned */
  }
  free(out);
  CHECK_EQ_INT(e2e_stat(fd, "session", "verified"), 1);
  CHECK_EQ_INT(e2e_stat(fd, NULL, "background_tunes"), 1);
  out = fusectl_out("stats");
  CHECK(out != NULL);
  if (out) CHECK_STR_CONTAINS(out, "background (1 background tune(s) queued or running)");
  free(out);

  CHECK(wait_tuned(fd, key));
  CHECK_EQ_INT(e2e_stat(fd, "session", "upgrades"), 1);
  CHECK_EQ_INT(e2e_stat(fd, "session", "tunes"), 1);
  CHECK_EQ_INT(e2e_stat(fd, "session", "compiles"), 1);
  CHECK(wait_stat(fd, NULL, "background_tunes", 0));
  out = fusectl_out("stats");
  CHECK(out != NULL);
  const char *row = out ? strstr(out, "\nupgrades ") : NULL; /* its own row of the table */
  CHECK(row != NULL);
  if (row) CHECK(strncmp(row + strspn(row + 1, "upgrades ") + 1, "1 (this session: 1)", 19) == 0);
  free(out);
  out = show(key);
  CHECK(out != NULL);
  if (out) {
    CHECK_STR_CONTAINS(out, "candidates (tuned on stand-in");
    CHECK_STR_CONTAINS(out, "*  2 "); /* the 1 ms candidate */
    CHECK(strstr(out, "background tune") == NULL);
  }
  free(out);
  /* A later compile is a hit on the tuned entry, and queues nothing. */
  CHECK_EQ_INT(compile(fd, 2, 1.0, state, key), 0);
  CHECK_STR_CONTAINS(state, "tuned");
  CHECK_EQ_INT(e2e_stat(fd, NULL, "background_tunes"), 0);
  close(fd);
}

/* Clients asking for the same fragments at once: one build per key, all answered. */
#define N_CLIENTS 6
#define N_FRAGS   3
typedef struct client_run {
  int answered;
  char states[N_FRAGS][16];
} client_run;

static void *client_main(void *arg) {
  client_run *cr = arg;
  int fd = e2e_client(D.sock);
  if (fd < 0) return NULL;
  for (int k = 0; k < N_FRAGS; k++) { /* pipelined, as the Python client sends a graph */
    e2e_req r;
    e2e_req_begin(&r, "compile", 10 + (uint64_t)k, 1);
    fm_pack_cstr(&r.pk, "fragment");
    e2e_pack_fragment(&r.pk, 20.0 + k, 3);
    if (e2e_req_send(&r, fd)) break;
  }
  for (int k = 0; k < N_FRAGS; k++) {
    msgpack_zone z;
    msgpack_object o;
    uint64_t id = 0;
    msgpack_zone_init(&z, 65536);
    if (e2e_recv(fd, GIVE_UP_MS, &z, &o) == 0 && e2e_is_ok(&o) && fm_msg_get_u64(&o, "id", &id, NULL) == FM_OK &&
        id >= 10 && id < 10 + N_FRAGS) {
      e2e_str(&o, "state", cr->states[id - 10], 16);
      cr->answered++;
    }
    msgpack_zone_destroy(&z);
  }
  close(fd);
  return NULL;
}

static void test_concurrent_clients_one_build_per_key(void) {
  pthread_t th[N_CLIENTS];
  client_run runs[N_CLIENTS];
  int fd = e2e_client(D.sock);
  CHECK(fd >= 0);
  if (fd < 0) return;
  int64_t compiles = e2e_stat(fd, "session", "compiles"), joined = e2e_stat(fd, "session", "joined_inflight"),
          hits = e2e_stat(fd, "session", "hits"), upgrades = e2e_stat(fd, "session", "upgrades"),
          tunes = e2e_stat(fd, "session", "tunes");
  memset(runs, 0, sizeof runs);
  for (int i = 0; i < N_CLIENTS; i++) pthread_create(&th[i], NULL, client_main, &runs[i]);
  for (int i = 0; i < N_CLIENTS; i++) pthread_join(th[i], NULL);
  for (int i = 0; i < N_CLIENTS; i++) {
    CHECK_EQ_INT(runs[i].answered, N_FRAGS);
    for (int k = 0; k < N_FRAGS; k++)
      CHECK(strcmp(runs[i].states[k], "verified") == 0 || strcmp(runs[i].states[k], "tuned") == 0);
  }
  CHECK_EQ_INT(e2e_stat(fd, "session", "compiles") - compiles, N_FRAGS);
  CHECK_EQ_INT(e2e_stat(fd, "session", "joined_inflight") - joined + e2e_stat(fd, "session", "hits") - hits,
               N_CLIENTS * N_FRAGS - N_FRAGS);
  /* and one background tune per key, however many hits of the verified entries came */
  CHECK(wait_stat(fd, "session", "upgrades", upgrades + N_FRAGS));
  CHECK(wait_stat(fd, NULL, "background_tunes", 0));
  CHECK_EQ_INT(e2e_stat(fd, "session", "tunes") - tunes, N_FRAGS);
  CHECK_EQ_INT(e2e_stat(fd, NULL, "inflight"), 0);
  close(fd);
}

/* A client that hangs up before its answer: the flight is gone, nothing runs on for it
 * except what had started, and the next client is served. */
static void test_hangup_before_answer(void) {
  char state[16], key[65];
  int fd = e2e_client(D.sock), gone = e2e_client(D.sock);
  CHECK(fd >= 0 && gone >= 0);
  if (fd < 0 || gone < 0) return;
  e2e_req r;
  e2e_req_begin(&r, "compile", 5, 1);
  fm_pack_cstr(&r.pk, "fragment");
  e2e_pack_fragment(&r.pk, 30.0, 3);
  CHECK_EQ_INT(e2e_req_send(&r, gone), 0);
  CHECK(wait_stat(fd, NULL, "inflight", 1));
  close(gone);
  CHECK(wait_stat(fd, NULL, "inflight", 0));
  /* Whatever its build had done is kept or dropped, never left waiting: a new request is
   * answered, and every background tune ends. */
  CHECK_EQ_INT(compile(fd, 6, 30.0, state, key), 0);
  CHECK(strcmp(state, "verified") == 0 || strcmp(state, "tuned") == 0);
  CHECK(wait_tuned(fd, key));
  CHECK(wait_stat(fd, NULL, "background_tunes", 0));
  CHECK_EQ_INT(e2e_stat(fd, NULL, "inflight"), 0);
  pid_t pids[8];
  CHECK(live_workers(pids, 8) <= 1);
  close(fd);
}

/* The n-th (0-based) "prepare <hash>" line of the trace from `from`: its hash in out. */
static int nth_prepare(const char *from, int n, char out[17]) {
  for (const char *p = strstr(from, "prepare "); p; p = strstr(p + 1, "prepare "))
    if ((p == from || p[-1] == '\n') && n-- == 0) return sscanf(p, "prepare %16s", out) == 1;
  return 0;
}

/* What the daemon logged of the foreground tune of key: how many background candidates the
 * tuner started while it waited (-1: no such line). */
static int waited_behind(const char *key) {
  char want[96], *log = e2e_slurp(D.log, NULL);
  int n = -1;
  snprintf(want, sizeof want, "foreground tune of %.16s waited for ", key);
  const char *p = log ? strstr(log, want) : NULL;
  if (p) n = atoi(p + strlen(want));
  free(log);
  return n;
}

/* A foreground request that comes while a background round runs waits for at most the one
 * background candidate in progress (the tuner counts those it starts meanwhile), and the
 * round goes on afterwards (its fragment prepared again after the foreground one). */
static void test_foreground_first(void) {
  char state[16], key_a[65], key_b[65], hash_a[17] = "", hash_b[17] = "", again[17] = "";
  int fd = e2e_client(D.sock);
  CHECK(fd >= 0);
  if (fd < 0) return;
  char *t = trace();
  int prepares = count_lines(t, "prepare ");
  free(t);
  CHECK_EQ_INT(compile(fd, 1, 40.0, state, key_a), 0);
  CHECK_STR_CONTAINS(state, "verified");
  /* its foreground prepare, then its background one with a run after it */
  CHECK(wait_background_running(prepares + 2));
  CHECK_EQ_INT(compile(fd, 2, 41.0, state, key_b), 0);
  CHECK_STR_CONTAINS(state, "verified");
  int waited = waited_behind(key_b);
  CHECK(waited >= 0 && waited <= 1);
  printf("  the foreground tune waited for %d background candidate(s)\n", waited);
  CHECK(wait_tuned(fd, key_a));
  CHECK(wait_tuned(fd, key_b));
  /* A's round was running when B came: after B's foreground prepare, A is prepared again. */
  t = trace();
  CHECK(nth_prepare(t, prepares, hash_a));
  CHECK(nth_prepare(t, prepares + 2, hash_b));
  CHECK(strcmp(hash_a, hash_b) != 0);
  CHECK(nth_prepare(t, prepares + 3, again));
  CHECK_STR_CONTAINS(again, hash_a);
  free(t);
  close(fd);
}

/* The tuner worker killed mid-round: the verified entry is served meanwhile, the round goes
 * on with a new worker (the killed candidate counted as a fault) and upgrades the entry. */
static void test_worker_killed_mid_background(void) {
  char state[16], key[65];
  pid_t pids[8];
  int fd = e2e_client(D.sock);
  CHECK(fd >= 0);
  if (fd < 0) return;
  char *t = trace();
  int prepares = count_lines(t, "prepare ");
  free(t);
  int64_t restarts = e2e_stat(fd, "session", "worker_restarts");
  CHECK_EQ_INT(compile(fd, 1, 50.0, state, key), 0);
  CHECK_STR_CONTAINS(state, "verified");
  CHECK(wait_background_running(prepares + 2));
  CHECK_EQ_INT(live_workers(pids, 8), 1);
  CHECK_EQ_INT(kill(pids[0], SIGKILL), 0);
  CHECK_EQ_INT(request(fd, "lookup", 2, 0, key, state, NULL), 0);
  CHECK(strcmp(state, "verified") == 0 || strcmp(state, "tuned") == 0);
  CHECK(wait_tuned(fd, key));
  CHECK(e2e_stat(fd, "session", "worker_restarts") >= restarts + 1);
  close(fd);
}

/* The daemon killed mid-round: the store still serves the verified entry after a restart,
 * and the next compile of the fragment queues its tune again. */
static void test_daemon_killed_mid_background(void) {
  char state[16], key[65];
  int fd = e2e_client(D.sock);
  CHECK(fd >= 0);
  if (fd < 0) return;
  char *t = trace();
  int prepares = count_lines(t, "prepare ");
  free(t);
  CHECK_EQ_INT(compile(fd, 1, 60.0, state, key), 0);
  CHECK_STR_CONTAINS(state, "verified");
  CHECK(wait_background_running(prepares + 2));
  close(fd);
  CHECK(e2e_stop(&D, SIGKILL, 10000) != -1);
  CHECK_EQ_INT(start("ok:5,ok:4,ok:1", "300", NULL), 0);
  fd = e2e_client(D.sock);
  CHECK(fd >= 0);
  if (fd < 0) return;
  CHECK_EQ_INT(request(fd, "lookup", 2, 0, key, state, NULL), 0);
  CHECK_STR_CONTAINS(state, "verified");
  CHECK_EQ_INT(compile(fd, 3, 60.0, state, key), 0); /* a hit, which queues the tune */
  CHECK_STR_CONTAINS(state, "verified");
  CHECK_EQ_INT(e2e_stat(fd, "session", "hits"), 1);
  CHECK(wait_tuned(fd, key));
  CHECK_EQ_INT(e2e_stat(fd, "session", "upgrades"), 1);
  CHECK_EQ_INT(e2e_stat(fd, "stats", "corrupt_entries"), 0);
  close(fd);
}

/* The candidate served first answers wrong: the request waits for the full tune and gets
 * its verified winner, never the wrong kernel. */
static void test_served_first_wrong_waits_for_all(void) {
  char state[16], key[65];
  CHECK_EQ_INT(e2e_stop(&D, SIGTERM, 30000), 0);
  CHECK_EQ_INT(start("wrong,ok:4,ok:1", NULL, NULL), 0);
  int fd = e2e_client(D.sock);
  CHECK(fd >= 0);
  if (fd < 0) return;
  CHECK_EQ_INT(compile(fd, 1, 90.0, state, key), 0);
  CHECK_STR_CONTAINS(state, "tuned");
  CHECK_EQ_INT(e2e_stat(fd, "session", "verified"), 0);
  CHECK_EQ_INT(e2e_stat(fd, "session", "tunes"), 1);
  CHECK(e2e_stat(fd, "session", "bad_candidates") >= 2); /* judged twice: alone, then with all */
  CHECK_EQ_INT(e2e_stat(fd, NULL, "background_tunes"), 0);
  char *out = show(key);
  CHECK(out != NULL);
  if (out) CHECK_STR_CONTAINS(out, "*  2 ");
  free(out);
  close(fd);
}

/* A GEMM fragment is served its cuBLASLt plan first; the stand-in answers it without the
 * algorithm a plan needs (a fault), so the heuristic default is judged next and served
 * verified, without waiting for every candidate. */
static void test_library_plan_then_default(void) {
  char cmd[1024], state[64] = "";
  if (!examples) {
    printf("  (no examples folder given: skipped)\n");
    return;
  }
  CHECK_EQ_INT(e2e_stop(&D, SIGTERM, 30000), 0);
  CHECK_EQ_INT(start("ok:5,ok:4,ok:1", NULL, NULL), 0);
  int fd = e2e_client(D.sock);
  CHECK(fd >= 0);
  if (fd < 0) return;
  int64_t bad = e2e_stat(fd, "session", "bad_candidates"), verified = e2e_stat(fd, "session", "verified");
  snprintf(cmd, sizeof cmd, "%s --socket %s --json compile %s/swiglu_bf16.json 2>&1", fusectl, D.sock, examples);
  FILE *p = popen(cmd, "r");
  CHECK(p != NULL);
  if (!p) return;
  char out[1 << 16];
  size_t n = fread(out, 1, sizeof out - 1, p);
  out[n] = '\0';
  pclose(p);
  const char *s = strstr(out, "\"state\"");
  if (s) sscanf(s, "\"state\": \"%63[a-z]", state);
  CHECK_STR_CONTAINS(state, "verified");
  CHECK_EQ_INT(e2e_stat(fd, "session", "bad_candidates") - bad, 1); /* the plan, alone */
  CHECK_EQ_INT(e2e_stat(fd, "session", "verified") - verified, 1);
  char *t = trace();
  CHECK_EQ_INT(count_lines(t, "run 1"), 1); /* the plan: right after the default */
  CHECK_EQ_INT(count_lines(t, "run 0"), 1);
  CHECK_EQ_INT(count_lines(t, "run "), 2);
  free(t);
  close(fd);
}

/* --tune eager answers tuned after every candidate; stats names the mode. */
static void test_eager_mode(void) {
  char state[16], key[65];
  CHECK_EQ_INT(e2e_stop(&D, SIGTERM, 30000), 0);
  CHECK_EQ_INT(start("ok:5,ok:4,ok:1", NULL, "eager"), 0);
  int fd = e2e_client(D.sock);
  CHECK(fd >= 0);
  if (fd < 0) return;
  CHECK_EQ_INT(compile(fd, 1, 70.0, state, key), 0);
  CHECK_STR_CONTAINS(state, "tuned");
  char *t = trace();
  CHECK(count_lines(t, "run ") >= 6); /* every candidate before the reply */
  free(t);
  CHECK_EQ_INT(e2e_stat(fd, "session", "verified"), 0);
  CHECK_EQ_INT(e2e_stat(fd, NULL, "background_tunes"), 0);
  close(fd);
  char *log = e2e_slurp(D.log, NULL);
  CHECK(log && strstr(log, "--tune eager"));
  free(log);
}

/* Stopping mid-round ends the round at its next candidate: the daemon exits promptly and
 * cleanly (ASan: nothing leaked), leaving no worker. */
static void test_stop_mid_background(void) {
  char state[16], key[65];
  pid_t pids[8];
  CHECK_EQ_INT(e2e_stop(&D, SIGTERM, 30000), 0);
  CHECK_EQ_INT(start("ok:5,ok:4,ok:1", "300", NULL), 0);
  int fd = e2e_client(D.sock);
  CHECK(fd >= 0);
  if (fd < 0) return;
  CHECK_EQ_INT(compile(fd, 1, 80.0, state, key), 0);
  CHECK_STR_CONTAINS(state, "verified");
  CHECK(wait_background_running(2));
  close(fd);
  CHECK_EQ_INT(e2e_stop(&D, SIGTERM, 30000), 0);
  CHECK_EQ_INT(live_workers(pids, 8), 0);
}

/* SIGTERM while a GEMM's background candidates compile (a line of ~20 NVRTC runs): they are
 * cancelled, so the daemon exits cleanly without compiling them (counted from its log: the
 * one served, and at most the one or two compiling at the signal), not after all of them. */
static void test_stop_while_background_compiles(void) {
  char cmd[1024];
  if (!examples) return;
  CHECK_EQ_INT(start("ok:5,ok:4,ok:1", NULL, NULL), 0);
  snprintf(cmd, sizeof cmd, "%s --socket %s compile %s/gelu_bias_bf16.json > /dev/null 2>&1", fusectl, D.sock,
           examples);
  CHECK_EQ_INT(system(cmd), 0);
  int fd = e2e_client(D.sock);
  CHECK(fd >= 0);
  if (fd >= 0) {
    CHECK_EQ_INT(e2e_stat(fd, NULL, "background_tunes"), 1);
    close(fd);
  }
  double t0 = e2e_now_ms();
  CHECK_EQ_INT(e2e_stop(&D, SIGTERM, 30000), 0);
  printf("  stopped %.1f s after SIGTERM with a background tune compiling\n", (e2e_now_ms() - t0) / 1000);
  char *log = e2e_slurp(D.log, NULL);
  const char *p = log ? strstr(log, "dropped at shutdown with ") : NULL;
  unsigned built = 0, n = 0;
  CHECK(p && sscanf(p, "dropped at shutdown with %u of %u", &built, &n) == 2);
  printf("  %u of %u candidates compiled\n", built, n);
  CHECK(n >= 8 && built <= 3);
  free(log);
}

int main(int argc, char **argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: %s PATH/TO/fusemld PATH/TO/tuner_standin PATH/TO/fusectl\n", argv[0]);
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  standin = argv[2];
  fusectl = argv[3];
  examples = argc > 4 ? argv[4] : NULL;
  if (e2e_setup(&D, argv[1]) != 0) return 2;
  snprintf(piddir, sizeof piddir, "%s/pids", D.dir);
  snprintf(trace_path, sizeof trace_path, "%s/trace", D.dir);
  if (mkdir(piddir, 0700) != 0) return 2;
  /* the default mode; 300 ms a candidate: a background round outlasts the checks made while
   * it runs */
  if (start("ok:5,ok:4,ok:1", "300", NULL) != 0) {
    fprintf(stderr, "cannot start %s\n", argv[1]);
    e2e_teardown(&D, 1);
    printf("0 passed, 1 failed\n");
    return 1;
  }
  RUN(test_served_verified_then_upgraded);
  RUN(test_concurrent_clients_one_build_per_key);
  RUN(test_hangup_before_answer);
  RUN(test_foreground_first);
  RUN(test_worker_killed_mid_background);
  RUN(test_daemon_killed_mid_background);
  RUN(test_served_first_wrong_waits_for_all);
  RUN(test_library_plan_then_default);
  RUN(test_eager_mode);
  RUN(test_stop_mid_background);
  RUN(test_stop_while_background_compiles);
  char cmd[512];
  unlink(trace_path);
  snprintf(cmd, sizeof cmd, "rm -rf %s", piddir);
  if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", piddir);
  e2e_teardown(&D, fm_test_failed_ != 0);
  return FM_TEST_DONE();
}
