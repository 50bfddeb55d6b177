/* e2e_valgrind_session.c: one short daemon session with fusemld under valgrind memcheck
 * (RELIABILITY.md section 7; ctest label `valgrind`, only in a build without sanitizers:
 * -DFM_VALGRIND=ON). Start, hello, stats, a malformed frame, a compile (NVRTC), the same
 * compile again (hit), a lookup miss, a client that hangs up mid-frame, SIGTERM: the daemon
 * exits 0 and valgrind reports no error and no definite leak (--error-exitcode).
 *
 * usage: e2e_valgrind_session <fusemld> <valgrind> <suppressions file> */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "e2e_util.h"
#include "fm_msg.h"
#include "fm_test.h"

#define VG_EXIT 99

static const char *fusemld, *valgrind, *supp;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void dump_file(const char *path) {
  FILE *f = fopen(path, "r");
  char line[1024];
  if (!f) return;
  fprintf(stderr, "---- %s ----\n", path);
  while (fgets(line, sizeof line, f)) fputs(line, stderr);
  fclose(f);
}

static void test_session_under_memcheck(void) {
  e2e_daemon d;
  char wrapper[400], vglog[400];
  CHECK_EQ_INT(e2e_setup(&d, fusemld), 0);
  /* fusemld through a wrapper, so e2e_util starts it as it starts any daemon. */
  snprintf(wrapper, sizeof wrapper, "%s/fusemld-vg.sh", d.dir);
  snprintf(vglog, sizeof vglog, "%s/valgrind.log", d.dir);
  FILE *f = fopen(wrapper, "w");
  CHECK(f != NULL);
  if (!f) return;
  fprintf(f,
          "#!/bin/sh\nexec '%s' -q --error-exitcode=%d --leak-check=full --errors-for-leak-kinds=definite "
          "--show-leak-kinds=definite --track-origins=yes --suppressions='%s' --log-file='%s' '%s' \"$@\"\n",
          valgrind, VG_EXIT, supp, vglog, fusemld);
  fclose(f);
  chmod(wrapper, 0700);
  d.exe = wrapper;

  /* Under memcheck fusemld takes about a minute to start (valgrind reads the 500 MB of
   * cuBLASLt it links): e2e_start gives up after 20 s with the daemon still starting, so
   * keep waiting for it here. */
  double t_start = now_s();
  int started = e2e_start(&d, NULL) == 0;
  for (int waited = 0; !started && d.pid && waited < 240000; waited += 200) {
    int st;
    if (waitpid(d.pid, &st, WNOHANG) == d.pid) {
      d.pid = 0;
      break;
    }
    int probe = e2e_connect(d.sock);
    if (probe >= 0) {
      close(probe);
      started = 1;
    } else {
      usleep(200 * 1000);
    }
  }
  CHECK(started);
  printf("  start under memcheck: %.0f s\n", now_s() - t_start);
  if (!started) {
    dump_file(vglog);
    e2e_teardown(&d, 1);
    return;
  }
  int fd = e2e_connect(d.sock);
  CHECK(fd >= 0);
  CHECK_EQ_INT(e2e_hello(fd), 0);
  CHECK(e2e_stat(fd, "session", "requests") >= 1);
  e2e_req r;

  /* a frame that is not msgpack: an error reply, the connection stays usable */
  static const uint8_t junk[] = {0xc1, 0xc1, 0xc1, 0xc1};
  CHECK_EQ_INT(e2e_send_frame(fd, junk, sizeof junk), 0);
  msgpack_zone z;
  msgpack_object o;
  msgpack_zone_init(&z, 4096);
  CHECK(e2e_recv(fd, 60000, &z, &o) == 0 && !e2e_is_ok(&o));
  msgpack_zone_destroy(&z);

  /* NVRTC under memcheck: its first compile takes a minute or more, past e2e_compile's
   * 60 s, so this one waits longer. */
  double t0 = now_s();
  e2e_req_begin(&r, "compile", 10, 1);
  fm_pack_cstr(&r.pk, "fragment");
  e2e_pack_fragment(&r.pk, 0.25, 2);
  CHECK_EQ_INT(e2e_req_send(&r, fd), 0);
  msgpack_zone_init(&z, 65536);
  char origin[16] = "";
  CHECK(e2e_recv(fd, 400000, &z, &o) == 0 && e2e_is_ok(&o));
  e2e_str(&o, "origin", origin, sizeof origin);
  CHECK(strcmp(origin, "compiled") == 0);
  msgpack_zone_destroy(&z);
  printf("  compile under memcheck: %.0f s\n", now_s() - t0);
  CHECK_EQ_INT(e2e_compile(fd, 11, 0.25, 2, origin, NULL), 0);
  CHECK(strcmp(origin, "hit") == 0);

  /* lookup of a fragment never compiled: a miss, not a compile */
  e2e_req_begin(&r, "lookup", 12, 1);
  fm_pack_cstr(&r.pk, "fragment");
  e2e_pack_fragment(&r.pk, 77.0, 3);
  CHECK_EQ_INT(e2e_req_send(&r, fd), 0);
  msgpack_zone_init(&z, 4096);
  char code[32] = "";
  CHECK(e2e_recv(fd, 60000, &z, &o) == 0);
  e2e_str(&o, "code", code, sizeof code);
  CHECK(strcmp(code, "not_found") == 0);
  msgpack_zone_destroy(&z);

  /* half a frame, then a hang-up */
  int fd2 = e2e_connect(d.sock);
  static const uint8_t half[] = {0, 0, 1, 0, 0x82};
  CHECK(fd2 >= 0 && e2e_send_raw(fd2, half, sizeof half) == 0);
  close(fd2);
  close(fd);

  t0 = now_s();
  int st = e2e_stop(&d, SIGTERM, 120000);
  printf("  shutdown + leak check: %.0f s\n", now_s() - t0);
  CHECK(st >= 0 && WIFEXITED(st));
  if (st >= 0 && WIFEXITED(st)) {
    if (WEXITSTATUS(st) != 0) {
      fprintf(stderr, "  exit status %d (%d: valgrind found errors)\n", WEXITSTATUS(st), VG_EXIT);
      dump_file(vglog);
    }
    CHECK_EQ_INT(WEXITSTATUS(st), 0);
  }
  unlink(wrapper);
  unlink(vglog);
  e2e_teardown(&d, fm_test_failed_checks_ > 0);
}

int main(int argc, char **argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: %s <fusemld> <valgrind> <suppressions>\n", argv[0]);
    return 2;
  }
  fusemld = argv[1];
  valgrind = argv[2];
  supp = argv[3];
  signal(SIGPIPE, SIG_IGN);
  RUN(test_session_under_memcheck);
  return FM_TEST_DONE();
}
