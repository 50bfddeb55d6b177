/* test_access.c: access control and per-client limits of a real fusemld.
 *   - the socket is created 0600 (per-user mode), never wider;
 *   - --allow-uid / --allow-gid: a peer not listed gets permission_denied and is closed before
 *     anything it sent is read; a listed uid or primary gid is served; a bad list is a startup
 *     error; the peer's uid and pid are in the log;
 *   - --max-output: a client that never reads its replies is cut off, while another client's
 *     hits stay fast.
 * usage: test_access PATH/TO/fusemld */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "e2e_util.h"
#include "fm_msg.h"
#include "fm_test.h"

static e2e_daemon D;

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int read_code(int fd, char code[32], char detail[256]) {
  msgpack_zone z;
  msgpack_object o;
  msgpack_zone_init(&z, 4096);
  int rc = e2e_recv(fd, 10000, &z, &o);
  code[0] = detail[0] = '\0';
  if (rc == 0) {
    e2e_str(&o, "code", code, 32);
    e2e_str(&o, "detail", detail, 256);
  }
  msgpack_zone_destroy(&z);
  return rc;
}

static int restart(const char *const *extra) {
  if (D.pid) e2e_stop(&D, SIGTERM, 30000);
  return e2e_start(&D, extra);
}

static void test_socket_mode(void) {
  struct stat st;
  CHECK_EQ_INT(stat(D.sock, &st), 0);
  CHECK(S_ISSOCK(st.st_mode));
  CHECK_EQ_INT(st.st_mode & 07777, 0600);
}

static void test_peer_logged(void) {
  int fd = e2e_connect(D.sock);
  CHECK(fd >= 0 && e2e_hello(fd) == 0);
  char want[64];
  snprintf(want, sizeof want, "pid %ld uid %ld", (long)getpid(), (long)getuid());
  CHECK(e2e_log_contains(&D, want));
  close(fd);
}

static void test_not_allowed_refused(void) {
  char list[64];
  /* Two ids, neither ours (nor our group, which is not listed at all). */
  snprintf(list, sizeof list, "%u,%u", (unsigned)getuid() + 1, (unsigned)getuid() + 2);
  const char *extra[] = {"--allow-uid", list, NULL};
  CHECK_EQ_INT(restart(extra), 0);
  int fd = e2e_connect(D.sock);
  CHECK(fd >= 0);
  /* The refusal comes before anything is read: even a hello gets no answer but the refusal. */
  char code[32], detail[256];
  CHECK_EQ_INT(read_code(fd, code, detail), 0);
  CHECK(strcmp(code, "permission_denied") == 0);
  char uid[32];
  snprintf(uid, sizeof uid, "uid %ld", (long)getuid());
  CHECK_STR_CONTAINS(detail, uid);
  CHECK(e2e_wait_closed(fd, 5000));
  close(fd);
  CHECK(e2e_log_contains(&D, "refused: uid"));
}

static void test_allowed_uid_served(void) {
  char list[64];
  snprintf(list, sizeof list, "%u,%u", (unsigned)getuid() + 1, (unsigned)getuid());
  const char *extra[] = {"--allow-uid", list, NULL};
  CHECK_EQ_INT(restart(extra), 0);
  int fd = e2e_connect(D.sock);
  CHECK(fd >= 0);
  CHECK_EQ_INT(e2e_hello(fd), 0);
  CHECK(e2e_stat(fd, "session", "requests") >= 1);
  close(fd);
}

static void test_allowed_gid_served(void) {
  char uids[32], gids[32];
  snprintf(uids, sizeof uids, "%u", (unsigned)getuid() + 1);
  snprintf(gids, sizeof gids, "%u", (unsigned)getgid());
  const char *extra[] = {"--allow-uid", uids, "--allow-gid", gids, NULL};
  CHECK_EQ_INT(restart(extra), 0);
  int fd = e2e_connect(D.sock);
  CHECK(fd >= 0);
  CHECK_EQ_INT(e2e_hello(fd), 0);
  close(fd);
}

static void test_bad_allow_list_refused(void) {
  e2e_stop(&D, SIGTERM, 30000);
  const char *bad[][3] = {{"--allow-uid", "root", NULL}, {"--allow-gid", "1,", NULL}, {"--max-output", "1k", NULL}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    int st = e2e_run(&D, bad[i], 20000);
    CHECK(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) != 0);
  }
  CHECK(e2e_log_contains(&D, "allow-uid"));
}

/* One hit's round trip on fd, in ms (-1 on failure). */
static double hit_ms(int fd, uint64_t id) {
  char origin[16];
  double t0 = now_ms();
  if (e2e_compile(fd, id, 1.5, 3, origin, NULL) != 0 || strcmp(origin, "hit") != 0) return -1;
  return now_ms() - t0;
}

static void test_reader_that_never_reads_is_cut_off(void) {
  const char *extra[] = {"--max-output", "64K", NULL};
  CHECK_EQ_INT(restart(extra), 0);
  int good = e2e_connect(D.sock), bad = e2e_connect(D.sock);
  CHECK(good >= 0 && bad >= 0 && e2e_hello(good) == 0 && e2e_hello(bad) == 0);
  char origin[16];
  CHECK_EQ_INT(e2e_compile(good, 1, 1.5, 3, origin, NULL), 0); /* now a hit */
  double before = 1e9;
  for (int i = 0; i < 5; i++) {
    double t = hit_ms(good, 10 + (uint64_t)i);
    if (t >= 0 && t < before) before = t;
  }
  /* bad pipelines hits and never reads; each reply carries a CUBIN, so its socket buffer and
   * then the 64K cap fill up. Non-blocking: once cut off, the sends fail. */
  e2e_req r;
  e2e_req_begin(&r, "compile", 1000, 1);
  fm_pack_cstr(&r.pk, "fragment");
  e2e_pack_fragment(&r.pk, 1.5, 3);
  uint8_t hdr[4] = {(uint8_t)(r.sb.size >> 24), (uint8_t)(r.sb.size >> 16), (uint8_t)(r.sb.size >> 8),
                    (uint8_t)r.sb.size};
  int sent = 0;
  double worst = 0;
  for (int i = 0; i < 20000; i++) {
    if (send(bad, hdr, 4, MSG_NOSIGNAL | MSG_DONTWAIT) != 4 ||
        send(bad, r.sb.data, r.sb.size, MSG_NOSIGNAL | MSG_DONTWAIT) != (ssize_t)r.sb.size)
      break;
    sent++;
    if (i % 10 == 9) { /* the well-behaved client, meanwhile */
      double t = hit_ms(good, 100000 + (uint64_t)i);
      CHECK(t >= 0);
      if (t > worst) worst = t;
    }
  }
  msgpack_sbuffer_destroy(&r.sb);
  int cut = 0;
  for (int i = 0; i < 100 && !cut; i++) {
    cut = e2e_log_contains(&D, "queued unread");
    if (!cut) usleep(50000);
  }
  CHECK(cut);
  double after = hit_ms(good, 999999);
  CHECK(after >= 0);
  printf(
      "  never-reading client: %d requests sent before the cut; good client's hit %.2f ms before, "
      "worst %.2f ms during, %.2f ms after\n",
      sent, before, worst, after);
  /* "Stays low": well under the 10 s reply timeout, and not dragged to the bad client's pace. */
  CHECK(worst < 1000 && after < 1000);
  close(bad);
  close(good);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s PATH/TO/fusemld\n", argv[0]);
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  if (e2e_setup(&D, argv[1]) != 0 || e2e_start(&D, NULL) != 0) {
    fprintf(stderr, "cannot start %s\n", argv[1]);
    e2e_teardown(&D, 1);
    printf("0 passed, 1 failed\n");
    return 1;
  }
  RUN(test_socket_mode);
  RUN(test_peer_logged);
  RUN(test_not_allowed_refused);
  RUN(test_allowed_uid_served);
  RUN(test_allowed_gid_served);
  RUN(test_bad_allow_list_refused);
  RUN(test_reader_that_never_reads_is_cut_off);
  e2e_teardown(&D, fm_test_failed_ != 0);
  return FM_TEST_DONE();
}
