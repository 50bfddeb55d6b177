/* test_tuner.c: the tuner's worker management and judging, against a real SQLite store and a
 * stand-in worker process (tuner_standin.c) that answers ok, wrong, aborts, hangs or fails a
 * launch on cue. usage: test_tuner PATH/TO/tuner_standin */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fm_config.h"
#include "fm_meta.h"
#include "fm_msg.h"
#include "fm_test.h"
#include "fm_tuner.h"
#include "fm_tuner_worker.h"

static const char *standin;
static char tmpdir[256];

static int count_fds(void) {
  int n = 0;
  DIR *d = opendir("/proc/self/fd");
  if (!d) return -1;
  while (readdir(d)) n++;
  closedir(d);
  return n;
}

/* No child of ours is left, running or zombie. */
static int no_children(void) { return waitpid(-1, NULL, WNOHANG) < 0 && errno == ECHILD; }

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* A fake compiled candidate: the stand-in never looks inside the CUBIN. */
static fm_compile_job *fake_candidate(uint32_t i) {
  fm_compile_job *j = calloc(1, sizeof *j);
  msgpack_sbuffer sb;
  msgpack_packer pk;
  fm_kernel_meta m;
  memset(&m, 0, sizeof m);
  snprintf(m.kind, sizeof m.kind, "pointwise");
  snprintf(m.entry, sizeof m.entry, "fm_kernel");
  snprintf(m.grid_rule, sizeof m.grid_rule, "elementwise");
  m.block[0] = 128 * (i + 1);
  m.block[1] = m.block[2] = 1;
  m.inner = 256;
  m.items_per_block = 1024;
  m.max_blocks = 1000;
  m.outer = -1;
  m.n_inputs = m.n_outputs = 1;
  j->meta = m;
  msgpack_sbuffer_init(&sb);
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  fm_meta_pack(&m, &pk);
  j->meta_len = sb.size;
  j->meta_bytes = (uint8_t *)msgpack_sbuffer_release(&sb);
  j->cubin_len = 64;
  j->cubin = calloc(1, 64);
  j->canonical_len = 8;
  j->canonical = calloc(1, 8);
  for (int k = 0; k < 32; k++) j->key.bytes[k] = (uint8_t)(0x40 + k);
  snprintf(j->label, sizeof j->label, "stand-in");
  j->has_cand = 1;
  j->cand.tmpl = FM_TMPL_POINTWISE;
  j->cand.p[0] = 128 * (i + 1);
  j->cand.p[2] = 1;
  j->cand.p[3] = 8;
  return j;
}

static fm_tune_job *fake_job(size_t n, fm_store *store) {
  fm_tune_job *tj;
  if (fm_tune_job_new(&tj)) return NULL;
  for (size_t i = 0; i < n; i++) tj->cands[tj->n++] = fake_candidate((uint32_t)i);
  tj->store = store;
  return tj;
}

/* Runs one job through a fresh worker (stopped afterwards). */
static fm_tune_job *run_plan(const char *plan, size_t n, double deadline_s, fm_store *store) {
  fm_tworker w;
  fm_tuner_opts o = {.worker_exe = standin, .deadline_s = deadline_s, .seed = 7};
  setenv("FM_STANDIN_PLAN", plan, 1);
  fm_tworker_init(&w, standin);
  fm_tune_job *tj = fake_job(n, store);
  fm_tuner_run_job(&w, &o, tj);
  fm_tworker_stop(&w, 2000);
  return tj;
}

/* ---- tests ---- */

static void test_worker_start_call_kill(void) {
  int fds = count_fds();
  fm_tworker w;
  fm_diag d = {{0}};
  fm_tworker_init(&w, standin);
  CHECK_EQ_INT(fm_tworker_start(&w, 5000, &d), FM_OK);
  CHECK(fm_tworker_running(&w));
  CHECK_STR_CONTAINS(w.device, "stand-in");
  fm_tworker_kill(&w);
  CHECK(!fm_tworker_running(&w));
  CHECK(no_children());
  CHECK_EQ_INT(count_fds(), fds);
}

static void test_missing_executable(void) {
  int fds = count_fds();
  fm_tworker w;
  fm_diag d = {{0}};
  fm_tworker_init(&w, "/nonexistent/fusemld-tuner");
  CHECK_EQ_INT(fm_tworker_start(&w, 5000, &d), FM_ECLOSED);
  CHECK_STR_CONTAINS(d.text, "exited with status 127");
  CHECK(no_children());
  CHECK_EQ_INT(count_fds(), fds);
}

static void test_no_gpu_in_worker(void) {
  fm_tworker w;
  fm_diag d = {{0}};
  setenv("FM_STANDIN_NOGPU", "1", 1);
  fm_tworker_init(&w, standin);
  CHECK_EQ_INT(fm_tworker_start(&w, 5000, &d), FM_ENOGPU);
  CHECK_STR_CONTAINS(d.text, "no GPU here");
  unsetenv("FM_STANDIN_NOGPU");
  CHECK(no_children());
  /* A whole job: nothing judged, the default served untuned. */
  setenv("FM_STANDIN_NOGPU", "1", 1);
  fm_tune_job *tj = run_plan("", 3, 1, NULL);
  unsetenv("FM_STANDIN_NOGPU");
  CHECK_EQ_INT(tj->tuned, 0);
  CHECK_EQ_INT(tj->winner, -1);
  CHECK_STR_CONTAINS(tj->diag.text, "no GPU here");
  fm_tune_job_free(tj);
  CHECK(no_children());
}

static void test_fastest_ok_wins(void) {
  int fds = count_fds();
  fm_tune_job *tj = run_plan("ok:3.0,ok:1.5,ok:2.0,ok:1.75", 4, 1, NULL);
  CHECK_EQ_INT(tj->tuned, 1);
  CHECK_EQ_INT(tj->winner, 1);
  CHECK_EQ_INT(tj->bad, 0);
  CHECK_EQ_INT(tj->restarts, 0);
  for (int i = 0; i < 4; i++) CHECK_EQ_INT(tj->res[i].verdict, FM_VERDICT_OK);
  CHECK(tj->res[0].ms == 3.0);
  /* The timings list every candidate with its description and verdict. */
  msgpack_zone z;
  msgpack_object o;
  msgpack_zone_init(&z, 4096);
  CHECK_EQ_INT(fm_msg_unpack(tj->timings, tj->timings_len, &fm_msg_reply_limits, &z, &o, NULL), FM_OK);
  int64_t chosen = -2;
  double def = 0;
  fm_msg_get_i64(&o, "chosen", &chosen, NULL);
  fm_msg_get_f64(&o, "default_ms", &def, NULL);
  CHECK_EQ_INT(chosen, 1);
  CHECK(def == 3.0);
  const msgpack_object *c = fm_msg_get(&o, "candidates");
  CHECK(c && c->type == MSGPACK_OBJECT_ARRAY && c->via.array.size == 4);
  if (c && c->via.array.size == 4) {
    char desc[128] = "", verdict[32] = "";
    fm_msg_copy_str(&c->via.array.ptr[1], "candidate", desc, sizeof desc, NULL);
    fm_msg_copy_str(&c->via.array.ptr[1], "verdict", verdict, sizeof verdict, NULL);
    CHECK_STR_CONTAINS(desc, "pointwise block=256");
    CHECK(strcmp(verdict, "ok") == 0);
  }
  msgpack_zone_destroy(&z);
  fm_tune_job_free(tj);
  CHECK(no_children());
  CHECK_EQ_INT(count_fds(), fds);
}

/* Every kind of bad candidate, each followed by a good one on a restarted worker. */
static void test_bad_candidates_isolated(void) {
  int fds = count_fds();
  double t0 = now_s();
  fm_tune_job *tj = run_plan("ok:2.0,abort,ok:4.0,hang,ok:1.0,launch,wrong,load,ok:3.0", 9, 0.5, NULL);
  double took = now_s() - t0;
  CHECK_EQ_INT(tj->tuned, 1);
  CHECK_EQ_INT(tj->res[0].verdict, FM_VERDICT_OK);
  CHECK_EQ_INT(tj->res[1].verdict, FM_VERDICT_FAULT);
  CHECK_STR_CONTAINS(tj->res[1].detail, "signal 6");
  CHECK_EQ_INT(tj->res[2].verdict, FM_VERDICT_OK);
  CHECK_EQ_INT(tj->res[3].verdict, FM_VERDICT_TIMEOUT);
  CHECK_EQ_INT(tj->res[4].verdict, FM_VERDICT_OK);
  CHECK_EQ_INT(tj->res[5].verdict, FM_VERDICT_LAUNCH_FAILED);
  CHECK_EQ_INT(tj->res[6].verdict, FM_VERDICT_WRONG);
  CHECK_EQ_INT(tj->res[7].verdict, FM_VERDICT_LOAD_FAILED);
  CHECK_EQ_INT(tj->res[8].verdict, FM_VERDICT_OK);
  CHECK_EQ_INT(tj->winner, 4);
  CHECK_EQ_INT(tj->bad, 5);
  CHECK_EQ_INT(tj->restarts, 3); /* after abort, hang and launch_failed */
  /* The hang cost its deadline: 0.5 s + 50 x 2 ms, not more than a few seconds. */
  CHECK(took > 0.5 && took < 5.0);
  fm_tune_job_free(tj);
  CHECK(no_children());
  CHECK_EQ_INT(count_fds(), fds);
}

static void test_none_verified_stored_bad(void) {
  char db[512];
  fm_store *s = NULL;
  fm_diag d = {{0}};
  snprintf(db, sizeof db, "%s/bad.db", tmpdir);
  CHECK_EQ_INT(fm_store_open(db, 0, &s, &d), FM_OK);
  if (!s) return;
  fm_tune_job *tj = run_plan("wrong,abort,wrong", 3, 1, s);
  CHECK_EQ_INT(tj->tuned, 1);
  CHECK_EQ_INT(tj->winner, -1);
  CHECK_EQ_INT(tj->store_err, FM_OK);
  CHECK_STR_CONTAINS(tj->diag.text, "no candidate verified: wrong fault wrong");
  fm_entry e;
  CHECK_EQ_INT(fm_store_get(s, &tj->cands[0]->key, "stand-in", 0, &e), FM_OK);
  CHECK_EQ_INT(e.state, FM_STATE_BAD);
  CHECK(e.timings_len > 0);
  fm_entry_free(&e);
  fm_tune_job_free(tj);

  /* And a tuned one replaces it, storing the winner's metadata. */
  tj = run_plan("ok:5,ok:1", 2, 1, s);
  CHECK_EQ_INT(tj->winner, 1);
  CHECK_EQ_INT(fm_store_get(s, &tj->cands[0]->key, "stand-in", 0, &e), FM_OK);
  CHECK_EQ_INT(e.state, FM_STATE_TUNED);
  CHECK(e.meta_len == tj->cands[1]->meta_len && memcmp(e.meta, tj->cands[1]->meta_bytes, e.meta_len) == 0);
  fm_entry_free(&e);
  fm_tune_job_free(tj);
  fm_store_close(s);
  CHECK(no_children());
}

static void test_compile_failures_skipped(void) {
  fm_tworker w;
  fm_tuner_opts o = {.worker_exe = standin, .deadline_s = 1};
  setenv("FM_STANDIN_PLAN", "ok:1,ok:2", 1);
  fm_tworker_init(&w, standin);
  fm_tune_job *tj = fake_job(2, NULL);
  tj->cands[0]->err = FM_ECOMPILE;
  fm_diag_set(&tj->cands[0]->diag, FM_ECOMPILE, "NVRTC said no");
  fm_tuner_run_job(&w, &o, tj);
  fm_tworker_stop(&w, 2000);
  CHECK_EQ_INT(tj->res[0].verdict, FM_VERDICT_COMPILE_FAILED);
  CHECK_STR_CONTAINS(tj->res[0].detail, "NVRTC said no");
  CHECK_EQ_INT(tj->winner, 1);
  CHECK_EQ_INT(tj->bad, 0);
  fm_tune_job_free(tj);
  CHECK(no_children());
}

static void test_verdict_names(void) {
  for (int v = FM_VERDICT_OK; v <= FM_VERDICT_COMPILE_FAILED; v++) {
    const char *s = fm_verdict_name((fm_verdict)v);
    CHECK_EQ_INT(fm_verdict_parse(s, strlen(s)), v);
  }
  CHECK_EQ_INT(fm_verdict_parse("nope", 4), FM_VERDICT_PENDING);
}

static void test_config_options(void) {
  fm_config c;
  fm_diag d = {{0}};
  fm_config_defaults(&c);
  CHECK_EQ_INT(c.tune, FM_TUNE_BACKGROUND);
  CHECK(c.tune_deadline_s == 5);
  CHECK(c.tuner_worker[0] == '\0');
  CHECK_EQ_INT(fm_config_set(&c, "no-tune", NULL, &d), FM_OK); /* the bare flag */
  CHECK_EQ_INT(c.tune, FM_TUNE_OFF);
  CHECK_EQ_INT(fm_config_set(&c, "no-tune", "no", &d), FM_OK); /* the file's form */
  CHECK_EQ_INT(c.tune, FM_TUNE_BACKGROUND);
  CHECK_EQ_INT(fm_config_set(&c, "no-tune", "maybe", &d), FM_EINVAL);
  CHECK_EQ_INT(fm_config_set(&c, "tune", "eager", &d), FM_OK);
  CHECK_EQ_INT(c.tune, FM_TUNE_EAGER);
  CHECK_EQ_INT(fm_config_set(&c, "no-tune", "no", &d), FM_OK); /* "no" keeps a chosen mode */
  CHECK_EQ_INT(c.tune, FM_TUNE_EAGER);
  CHECK_EQ_INT(fm_config_set(&c, "tune", "off", &d), FM_OK);
  CHECK_EQ_INT(c.tune, FM_TUNE_OFF);
  CHECK_EQ_INT(fm_config_set(&c, "tune", "lazy", &d), FM_EINVAL);
  CHECK_STR_CONTAINS(d.text, "eager, background, off");
  CHECK_STR_CONTAINS(fm_tune_mode_name(FM_TUNE_BACKGROUND), "background");
  CHECK_EQ_INT(fm_config_set(&c, "tune-deadline", "0.5", &d), FM_OK);
  CHECK(c.tune_deadline_s == 0.5);
  CHECK_EQ_INT(fm_config_set(&c, "tune-deadline", "0", &d), FM_EINVAL);
  CHECK_EQ_INT(fm_config_set(&c, "tune-deadline", "5s", &d), FM_EINVAL);
  CHECK_STR_CONTAINS(d.text, "tune-deadline");
  CHECK_EQ_INT(fm_config_set(&c, "tuner-worker", "/opt/x/fusemld-tuner", &d), FM_OK);
  CHECK(strcmp(c.tuner_worker, "/opt/x/fusemld-tuner") == 0);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s PATH/TO/tuner_standin\n", argv[0]);
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  standin = argv[1];
  snprintf(tmpdir, sizeof tmpdir, "/tmp/fm-tuner-test-XXXXXX");
  if (!mkdtemp(tmpdir)) return 2;
  RUN(test_verdict_names);
  RUN(test_config_options);
  RUN(test_worker_start_call_kill);
  RUN(test_missing_executable);
  RUN(test_no_gpu_in_worker);
  RUN(test_fastest_ok_wins);
  RUN(test_bad_candidates_isolated);
  RUN(test_none_verified_stored_bad);
  RUN(test_compile_failures_skipped);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
  return FM_TEST_DONE();
}
