/* test_daemon_config.c: sizes, settings, the config file grammar and its errors. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fm_codegen.h"
#include "fm_config.h"
#include "fm_test.h"

static char dir[] = "/tmp/fm-test-config-XXXXXX";

static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  fputs(text, f);
  fclose(f);
}

static void test_parse_size(void) {
  uint64_t v = 0;
  CHECK_EQ_INT(fm_config_parse_size("2G", &v), FM_OK);
  CHECK(v == 2ull << 30);
  CHECK_EQ_INT(fm_config_parse_size("512M", &v), FM_OK);
  CHECK(v == 512ull << 20);
  CHECK_EQ_INT(fm_config_parse_size("64k", &v), FM_OK);
  CHECK(v == 64ull << 10);
  CHECK_EQ_INT(fm_config_parse_size("1GiB", &v), FM_OK);
  CHECK(v == 1ull << 30);
  CHECK_EQ_INT(fm_config_parse_size("3MB", &v), FM_OK);
  CHECK(v == 3ull << 20);
  CHECK_EQ_INT(fm_config_parse_size("1048576", &v), FM_OK);
  CHECK(v == 1048576);
  CHECK_EQ_INT(fm_config_parse_size("0", &v), FM_OK);
  CHECK(v == 0);
  const char *bad[] = {"", "G", "12X", "-1", "1.5G", "99999999999T", "2 G", "2GG", "0x10"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) CHECK_EQ_INT(fm_config_parse_size(bad[i], &v), FM_EINVAL);
}

static void test_set(void) {
  fm_config c;
  fm_diag d = {{0}};
  fm_config_defaults(&c);
  CHECK(c.cache_size == 2ull << 30);
  CHECK(strcmp(c.arch, "sm_90a") == 0);
  CHECK_EQ_INT(c.max_clients, 1024);
  CHECK_EQ_INT(c.idle_timeout_s, 600);
  CHECK(c.jobs >= 1);
  CHECK_EQ_INT(fm_config_set(&c, "jobs", "4", &d), FM_OK);
  CHECK_EQ_INT(c.jobs, 4);
  CHECK_EQ_INT(fm_config_set(&c, "jobs", "0", &d), FM_EINVAL);
  CHECK_STR_CONTAINS(d.text, "jobs");
  CHECK_EQ_INT(fm_config_set(&c, "log-level", "debug", &d), FM_OK);
  CHECK_EQ_INT(c.log_level, FM_LOG_DEBUG);
  CHECK_EQ_INT(fm_config_set(&c, "log-level", "verbose", &d), FM_EINVAL);
  CHECK_EQ_INT(fm_config_set(&c, "arch", "gfx90a", &d), FM_EINVAL);
  CHECK_EQ_INT(fm_config_set(&c, "arch", "sm_80", &d), FM_OK);
  CHECK(strcmp(c.arch, "sm_80") == 0);
  CHECK_EQ_INT(fm_config_set(&c, "idle-timeout", "0", &d), FM_OK);
  CHECK_EQ_INT(c.idle_timeout_s, 0);
  CHECK_EQ_INT(fm_config_set(&c, "max-clients", "12abc", &d), FM_EINVAL);
  CHECK_EQ_INT(fm_config_set(&c, "cache-size", "1T", &d), FM_OK);
  CHECK(c.cache_size == 1ull << 40);
  CHECK_EQ_INT(fm_config_set(&c, "frobs", "1", &d), FM_EINVAL);
  CHECK_STR_CONTAINS(d.text, "unknown setting \"frobs\"");
  CHECK(c.tune_only[0] == '\0'); /* default: every candidate */
  CHECK_EQ_INT(fm_config_set(&c, "tune-only", "cublaslt", &d), FM_OK);
  CHECK(strcmp(c.tune_only, "cublaslt") == 0);
  CHECK_EQ_INT(fm_config_set(&c, "tune-only", "", &d), FM_EINVAL);
  CHECK_STR_CONTAINS(d.text, "tune-only");
  char longer[100];
  memset(longer, 'x', sizeof longer - 1);
  longer[sizeof longer - 1] = '\0';
  CHECK_EQ_INT(fm_config_set(&c, "tune-only", longer, &d), FM_EINVAL);
  CHECK_EQ_INT(c.exit_when_idle_s, 0); /* default: never */
  CHECK_EQ_INT(fm_config_set(&c, "exit-when-idle", "600", &d), FM_OK);
  CHECK_EQ_INT(c.exit_when_idle_s, 600);
  const char *bad_idle[] = {"", "-1", "1.5", "10s", "604801"};
  for (size_t i = 0; i < sizeof bad_idle / sizeof bad_idle[0]; i++) {
    CHECK_EQ_INT(fm_config_set(&c, "exit-when-idle", bad_idle[i], &d), FM_EINVAL);
    CHECK_STR_CONTAINS(d.text, "exit-when-idle");
  }
}

static void test_access_and_output(void) {
  fm_config c;
  fm_diag d = {{0}};
  fm_config_defaults(&c);
  CHECK_EQ_INT(c.n_allow_uids, 0);
  CHECK_EQ_INT(c.n_allow_gids, 0);
  CHECK(c.max_output == 512ull << 20);
  CHECK_EQ_INT(fm_config_set(&c, "allow-uid", "1000,0,65534", &d), FM_OK);
  CHECK_EQ_INT(fm_config_set(&c, "allow-uid", "1001", &d), FM_OK); /* lists add up */
  CHECK_EQ_INT(c.n_allow_uids, 4);
  CHECK(c.allow_uids[0] == 1000 && c.allow_uids[1] == 0 && c.allow_uids[2] == 65534 && c.allow_uids[3] == 1001);
  CHECK_EQ_INT(fm_config_set(&c, "allow-gid", "27", &d), FM_OK);
  CHECK(c.n_allow_gids == 1 && c.allow_gids[0] == 27);
  /* Names, empty items, signs and ids that do not fit are refused: never widen access. */
  const char *bad[] = {"", "root", "1,", ",1", "1,,2", "-1", "4294967295", "99999999999", "1 2", "0x10"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    CHECK_EQ_INT(fm_config_set(&c, "allow-gid", bad[i], &d), FM_EINVAL);
    CHECK_STR_CONTAINS(d.text, "allow-gid");
  }
  fm_config_defaults(&c);
  char many[1024] = "";
  for (int i = 0; i <= FM_CONFIG_MAX_ALLOW; i++)
    snprintf(many + strlen(many), sizeof many - strlen(many), "%s%d", i ? "," : "", i);
  CHECK_EQ_INT(fm_config_set(&c, "allow-uid", many, &d), FM_EINVAL);
  CHECK_STR_CONTAINS(d.text, "more than");
  CHECK_EQ_INT(fm_config_set(&c, "max-output", "64K", &d), FM_OK);
  CHECK(c.max_output == 64u << 10);
  CHECK_EQ_INT(fm_config_set(&c, "max-output", "1K", &d), FM_EINVAL);
  CHECK_EQ_INT(fm_config_set(&c, "max-output", "lots", &d), FM_EINVAL);
}

static void test_connection_bounds(void) {
  fm_config c;
  fm_diag d = {{0}};
  fm_config_defaults(&c);
  CHECK(c.max_output_total == 1ull << 30);
  CHECK_EQ_INT(c.frame_deadline_s, 30);
  CHECK_EQ_INT(fm_config_set(&c, "max-output-total", "16M", &d), FM_OK);
  CHECK(c.max_output_total == 16u << 20);
  CHECK_EQ_INT(fm_config_set(&c, "max-output-total", "1K", &d), FM_EINVAL);
  CHECK_STR_CONTAINS(d.text, "max-output-total");
  CHECK_EQ_INT(fm_config_set(&c, "frame-deadline", "2", &d), FM_OK);
  CHECK_EQ_INT(c.frame_deadline_s, 2);
  const char *bad[] = {"0", "3601", "-1", "1.5", "soon", ""};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    CHECK_EQ_INT(fm_config_set(&c, "frame-deadline", bad[i], &d), FM_EINVAL);
    CHECK_STR_CONTAINS(d.text, "frame-deadline");
  }
}

static void test_compile_limits(void) {
  fm_config c;
  fm_diag d = {{0}};
  fm_config_defaults(&c);
  CHECK(c.compile_deadline_s == 60.0);
  CHECK(c.compile_memory == 2ull << 30);
  CHECK_EQ_INT(c.max_client_compiles, 256);
  CHECK_EQ_INT(c.max_compile_cost, FM_CODEGEN_MAX_COST);
  CHECK(c.compile_worker[0] == '\0');
  CHECK_EQ_INT(fm_config_set(&c, "compile-deadline", "0.25", &d), FM_OK);
  CHECK(c.compile_deadline_s == 0.25);
  const char *bad_secs[] = {"0", "-1", "3601", "soon", "", "1s"};
  for (size_t i = 0; i < sizeof bad_secs / sizeof bad_secs[0]; i++) {
    CHECK_EQ_INT(fm_config_set(&c, "compile-deadline", bad_secs[i], &d), FM_EINVAL);
    CHECK_STR_CONTAINS(d.text, "compile-deadline");
  }
  CHECK_EQ_INT(fm_config_set(&c, "compile-memory", "0", &d), FM_OK); /* unbounded */
  CHECK(c.compile_memory == 0);
  CHECK_EQ_INT(fm_config_set(&c, "compile-memory", "512M", &d), FM_OK);
  CHECK(c.compile_memory == 512ull << 20);
  CHECK_EQ_INT(fm_config_set(&c, "compile-memory", "1M", &d), FM_EINVAL);
  CHECK_STR_CONTAINS(d.text, "compile-memory");
  CHECK_EQ_INT(fm_config_set(&c, "max-client-compiles", "1", &d), FM_OK);
  CHECK_EQ_INT(c.max_client_compiles, 1);
  CHECK_EQ_INT(fm_config_set(&c, "max-client-compiles", "0", &d), FM_EINVAL);
  CHECK_EQ_INT(fm_config_set(&c, "max-compile-cost", "50", &d), FM_OK);
  CHECK_EQ_INT(c.max_compile_cost, 50);
  CHECK_EQ_INT(fm_config_set(&c, "max-compile-cost", "0", &d), FM_EINVAL);
  CHECK_EQ_INT(fm_config_set(&c, "compile-worker", "/opt/fusemld-nvrtc", &d), FM_OK);
  CHECK(strcmp(c.compile_worker, "/opt/fusemld-nvrtc") == 0);
  /* tune-deadline shares the seconds parser */
  CHECK_EQ_INT(fm_config_set(&c, "tune-deadline", "0", &d), FM_EINVAL);
  CHECK_STR_CONTAINS(d.text, "tune-deadline");
}

static void test_file(void) {
  char path[128], conf[512];
  fm_config c;
  fm_diag d = {{0}};
  snprintf(path, sizeof path, "%s/good.conf", dir);
  write_file(path,
             "# fusemld settings\n"
             "\n"
             "  socket = /tmp/odd#name/s.sock   # a '#' inside a path is kept\n"
             "cache-size=512M\n"
             "jobs = 3\n"
             "log-level = warn\n");
  fm_config_defaults(&c);
  CHECK_EQ_INT(fm_config_load_file(&c, path, 1, &d), FM_OK);
  CHECK(strcmp(c.socket_path, "/tmp/odd#name/s.sock") == 0);
  CHECK(c.cache_size == 512ull << 20);
  CHECK_EQ_INT(c.jobs, 3);
  CHECK_EQ_INT(c.log_level, FM_LOG_WARN);
  CHECK(strcmp(c.config_path, path) == 0);
  /* Flags are applied after the file and win. */
  CHECK_EQ_INT(fm_config_set(&c, "jobs", "7", &d), FM_OK);
  CHECK_EQ_INT(c.jobs, 7);

  snprintf(path, sizeof path, "%s/bad.conf", dir);
  write_file(path, "jobs = 2\n# comment\njobs 4\n");
  fm_config_defaults(&c);
  CHECK_EQ_INT(fm_config_load_file(&c, path, 1, &d), FM_EINVAL);
  snprintf(conf, sizeof conf, "%s:3:", path);
  CHECK_STR_CONTAINS(d.text, conf);
  write_file(path, "jobs = 2\nmax-clients = lots\n");
  CHECK_EQ_INT(fm_config_load_file(&c, path, 1, &d), FM_EINVAL);
  snprintf(conf, sizeof conf, "%s:2: max-clients", path);
  CHECK_STR_CONTAINS(d.text, conf);

  snprintf(path, sizeof path, "%s/missing.conf", dir);
  CHECK_EQ_INT(fm_config_load_file(&c, path, 0, &d), FM_OK);
  CHECK(fm_config_load_file(&c, path, 1, &d) < 0);
  CHECK_STR_CONTAINS(d.text, "missing.conf");
}

static void test_finish_creates_dirs(void) {
  fm_config c;
  fm_diag d = {{0}};
  char p[256];
  struct stat st;
  fm_config_defaults(&c);
  snprintf(c.socket_path, sizeof c.socket_path, "%s/run/s.sock", dir);
  snprintf(c.db_path, sizeof c.db_path, "%s/cache/deep/k.db", dir);
  CHECK_EQ_INT(fm_config_finish(&c, &d), FM_OK);
  snprintf(p, sizeof p, "%s/cache/deep", dir);
  CHECK(stat(p, &st) == 0 && S_ISDIR(st.st_mode) && (st.st_mode & 0777) == 0700);
  snprintf(p, sizeof p, "%s/run", dir);
  CHECK(stat(p, &st) == 0 && (st.st_mode & 0777) == 0700);
  rmdir(p);
  snprintf(p, sizeof p, "%s/cache/deep", dir);
  rmdir(p);
  snprintf(p, sizeof p, "%s/cache", dir);
  rmdir(p);
}

int main(void) {
  if (!mkdtemp(dir)) return 1;
  RUN(test_parse_size);
  RUN(test_set);
  RUN(test_access_and_output);
  RUN(test_connection_bounds);
  RUN(test_compile_limits);
  RUN(test_file);
  RUN(test_finish_creates_dirs);
  char p[128];
  snprintf(p, sizeof p, "%s/good.conf", dir);
  unlink(p);
  snprintf(p, sizeof p, "%s/bad.conf", dir);
  unlink(p);
  rmdir(dir);
  return FM_TEST_DONE();
}
