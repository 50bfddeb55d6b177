/* test_tuner_env.c: the tuner worker never inherits CUDA MPS settings (RELIABILITY.md
 * section 4). A worker sharing an MPS server's context would let a faulting candidate take
 * other clients' GPU work down with it, so fm_tworker_start scrubs CUDA_MPS_* from the
 * worker's environment and passes everything else through. The "worker" here is a shell
 * script that writes its environment to a file and exits (so the start itself fails). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fm_test.h"
#include "fm_tuner_worker.h"

static char dir[64], script[128], dump[160];

static char *read_all(const char *path) {
  FILE *f = fopen(path, "r");
  if (!f) return NULL;
  static char buf[1 << 16];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  buf[n] = '\0';
  fclose(f);
  return buf;
}

static void test_mps_variables_scrubbed(void) {
  snprintf(dir, sizeof dir, "/tmp/fm-tenv-XXXXXX");
  CHECK(mkdtemp(dir) != NULL);
  snprintf(script, sizeof script, "%s/worker.sh", dir);
  snprintf(dump, sizeof dump, "%s/worker.sh.env", dir);
  FILE *f = fopen(script, "w");
  CHECK(f != NULL);
  if (!f) return;
  fputs("#!/bin/sh\nenv > \"$0.env\"\nexit 0\n", f);
  fclose(f);
  chmod(script, 0700);
  setenv("CUDA_MPS_PIPE_DIRECTORY", "/tmp/mps-pipe", 1);
  setenv("CUDA_MPS_LOG_DIRECTORY", "/tmp/mps-log", 1);
  setenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "25", 1);
  setenv("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "0=1G", 1);
  setenv("CUDA_VISIBLE_DEVICES", "0", 1);
  setenv("FM_TENV_MARK", "kept", 1);

  fm_tworker w;
  fm_diag d = {{0}};
  fm_tworker_init(&w, script);
  int err = fm_tworker_start(&w, 10000, &d);
  CHECK(err != FM_OK);            /* it never said ready */
  CHECK(!fm_tworker_running(&w)); /* and nothing is left running */
  const char *env = read_all(dump);
  CHECK(env != NULL);
  if (env) {
    CHECK_STR_CONTAINS(env, "FM_TENV_MARK=kept");
    CHECK_STR_CONTAINS(env, "CUDA_VISIBLE_DEVICES=0");
    CHECK(strstr(env, "CUDA_MPS_") == NULL);
  }
  /* the daemon's own environment is untouched */
  CHECK(getenv("CUDA_MPS_PIPE_DIRECTORY") != NULL);
  unlink(dump);
  unlink(script);
  rmdir(dir);
}

int main(void) {
  RUN(test_mps_variables_scrubbed);
  return FM_TEST_DONE();
}
