/* test_client_fusectl.c: fusectl's documented exit codes and messages for everything that
 * can be decided without a daemon (usage errors, an unreachable socket, bad input files).
 * Runs the built binary ($FM_BINARY_DIR/client/fusectl) through the shell. */
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fm_test.h"

static char fusectl[1024], tmpdir[64], sock[128];
static char out[8192]; /* stdout + stderr of the last run */

/* Runs `fusectl ARGS` with FUSEML_SOCKET at a socket that does not exist; returns the exit
 * status and leaves the output in out. */
static int run(const char *args) {
  char cmd[4096], outpath[128];
  FILE *f;
  size_t n;
  int st;
  snprintf(outpath, sizeof outpath, "%s/out", tmpdir);
  snprintf(cmd, sizeof cmd, "FUSEML_SOCKET=%s %s %s >%s 2>&1", sock, fusectl, args, outpath);
  st = system(cmd);
  out[0] = '\0';
  f = fopen(outpath, "r");
  if (f) {
    n = fread(out, 1, sizeof out - 1, f);
    out[n] = '\0';
    fclose(f);
  }
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void write_file(const char *name, const char *text) {
  char path[256];
  snprintf(path, sizeof path, "%s/%s", tmpdir, name);
  FILE *f = fopen(path, "w");
  if (f) {
    fputs(text, f);
    fclose(f);
  }
}

static void test_help_and_version(void) {
  CHECK_EQ_INT(run("--help"), 0);
  CHECK_STR_CONTAINS(out, "exit status:");
  CHECK_STR_CONTAINS(out, "3  cannot reach the daemon");
  CHECK_STR_CONTAINS(out, "warm MANIFEST");
  CHECK_EQ_INT(run("--version"), 0);
  CHECK_STR_CONTAINS(out, "fusectl 0.1.0");
}

static void test_usage_errors(void) {
  CHECK_EQ_INT(run(""), 2);
  CHECK_STR_CONTAINS(out, "no command");
  CHECK_EQ_INT(run("frobnicate"), 2);
  CHECK_STR_CONTAINS(out, "unknown command 'frobnicate'");
  CHECK_EQ_INT(run("--bogus ping"), 2);
  CHECK_EQ_INT(run("--timeout abc ping"), 2);
  CHECK_STR_CONTAINS(out, "--timeout");
  CHECK_EQ_INT(run("ping extra"), 2);
  CHECK_EQ_INT(run("show"), 2);
  CHECK_STR_CONTAINS(out, "usage: fusectl [options] show KEY [--source]");
  CHECK_EQ_INT(run("show xyz!"), 2);
  CHECK_EQ_INT(run("show 12"), 2); /* fewer than 4 hex digits */
  CHECK_EQ_INT(run("evict 1234 --all"), 2);
  CHECK_EQ_INT(run("ls --limit 0"), 2);
  CHECK_EQ_INT(run("compile"), 2);
}

static void test_unreachable(void) {
  CHECK_EQ_INT(run("ping"), 3);
  CHECK_STR_CONTAINS(out, sock); /* names the socket */
  CHECK_STR_CONTAINS(out, "Start it with `fusemld`");
  CHECK_EQ_INT(run("--json stats"), 3);
  char args[256];
  snprintf(args, sizeof args, "--socket %s/other.sock ls", tmpdir);
  CHECK_EQ_INT(run(args), 3);
  CHECK_STR_CONTAINS(out, "other.sock"); /* --socket wins over FUSEML_SOCKET */
}

static void test_bad_input(void) {
  char args[512];
  /* Input files are read before connecting: a bad file is 4 even with no daemon. */
  snprintf(args, sizeof args, "compile %s/missing.json", tmpdir);
  CHECK_EQ_INT(run(args), 4);
  CHECK_STR_CONTAINS(out, "missing.json");

  write_file("broken.json", "{\"vocab\": 1,\n \"ops\": [1,,2]}\n");
  snprintf(args, sizeof args, "compile %s/broken.json", tmpdir);
  CHECK_EQ_INT(run(args), 4);
  CHECK_STR_CONTAINS(out, "broken.json:2:");

  write_file("array.json", "[1, 2]\n");
  snprintf(args, sizeof args, "compile %s/array.json", tmpdir);
  CHECK_EQ_INT(run(args), 4);
  CHECK_STR_CONTAINS(out, "must be a JSON object");

  snprintf(args, sizeof args, "warm %s/no.manifest", tmpdir);
  CHECK_EQ_INT(run(args), 4);
  write_file("empty.manifest", "# nothing here\n\n   \n");
  snprintf(args, sizeof args, "warm %s/empty.manifest", tmpdir);
  CHECK_EQ_INT(run(args), 4);
  CHECK_STR_CONTAINS(out, "lists no fragments");
}

int main(void) {
  const char *bin = getenv("FM_BINARY_DIR");
  snprintf(fusectl, sizeof fusectl, "%s/client/fusectl", bin ? bin : ".");
  snprintf(tmpdir, sizeof tmpdir, "/tmp/fm_test_fusectl_XXXXXX");
  if (!mkdtemp(tmpdir)) return 1;
  snprintf(sock, sizeof sock, "%s/absent.sock", tmpdir);
  RUN(test_help_and_version);
  RUN(test_usage_errors);
  RUN(test_unreachable);
  RUN(test_bad_input);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
  return FM_TEST_DONE();
}
