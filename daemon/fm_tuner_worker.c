/* fm_tuner_worker.c: spawn, talk to and kill the fusemld-tuner process (fm_tuner_worker.h). */
#define _GNU_SOURCE
#include "fm_tuner_worker.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fm_child.h"
#include "fm_msg.h"

_Static_assert(FM_TWORKER_FD == FM_CHILD_FD, "the worker's fd is where fm_child_spawn puts it");

extern char **environ;

void fm_tworker_init(fm_tworker *w, const char *exe) {
  memset(w, 0, sizeof *w);
  snprintf(w->exe, sizeof w->exe, "%s", exe);
  w->fd = -1;
  w->next_id = 1;
}

int fm_tworker_running(const fm_tworker *w) { return w->pid > 0; }

static int64_t now_ms(void) { return fm_child_now_ms(); }

static int reap(fm_tworker *w, int sig, char *how, size_t cap) {
  if (w->pid <= 0) return 0;
  int status = fm_child_reap(w->pid, sig, how, cap);
  w->pid = 0;
  return status;
}

static void close_fd(fm_tworker *w) {
  if (w->fd >= 0) close(w->fd);
  w->fd = -1;
  fm_frame_reader_free(&w->rd);
}

void fm_tworker_kill(fm_tworker *w) {
  close_fd(w);
  reap(w, SIGKILL, NULL, 0);
}

void fm_tworker_stop(fm_tworker *w, int timeout_ms) {
  if (w->pid <= 0) {
    close_fd(w);
    return;
  }
  close_fd(w);
  int64_t end = now_ms() + timeout_ms;
  int status;
  while (now_ms() < end) {
    pid_t r = waitpid(w->pid, &status, WNOHANG);
    if (r == w->pid || (r < 0 && errno != EINTR)) {
      w->pid = 0;
      return;
    }
    struct timespec ts = {0, 10 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  reap(w, SIGKILL, NULL, 0);
}

/* The environment without CUDA_MPS_*: the worker must own a plain context of its own, not
 * share an MPS server's (a fault there would take other clients' work down with it). Built
 * before fork, since only async-signal-safe calls are allowed in the child. */
static char **scrubbed_env(void) {
  size_t n = 0, k = 0;
  while (environ && environ[n]) n++;
  char **env = calloc(n + 1, sizeof *env);
  if (!env) return NULL;
  for (size_t i = 0; i < n; i++)
    if (strncmp(environ[i], "CUDA_MPS_", 9) != 0) env[k++] = environ[i];
  return env;
}

/* The worker is gone (EOF): reap it and say how it ended. */
static int lost(fm_tworker *w, const char *when, fm_diag *d) {
  char how[128] = "ended";
  close_fd(w);
  /* It closed its end, so it is exiting: a blocking wait is short. SIGKILL in case it only
   * closed the fd and lives on. */
  int status = 0;
  if (w->pid > 0) {
    pid_t r = waitpid(w->pid, &status, WNOHANG);
    if (r == w->pid) {
      fm_child_describe(status, how, sizeof how);
      w->pid = 0;
    } else {
      struct timespec ts = {0, 200 * 1000 * 1000};
      nanosleep(&ts, NULL);
      reap(w, SIGKILL, how, sizeof how);
    }
  }
  return fm_diag_set(d, FM_ECLOSED, "the tuner worker %s %s", how, when);
}

int fm_tworker_start(fm_tworker *w, int timeout_ms, fm_diag *d) {
  int err;
  char fdarg[16];
  msgpack_zone zone;
  msgpack_object msg;
  const uint8_t *payload;
  size_t len;

  if (w->pid > 0) return FM_OK;
  char **env = scrubbed_env();
  if (!env) return fm_diag_set(d, FM_ENOMEM, "out of memory");
  snprintf(fdarg, sizeof fdarg, "%d", FM_TWORKER_FD);
  char fdflag[] = "--fd";
  char *argv[] = {w->exe, fdflag, fdarg, NULL};
  /* A worker stuck in a hung kernel must not outlive the thread that owns it (fm_child.h). */
  err = fm_child_spawn(w->exe, argv, env, &w->fd, &w->pid, d);
  free(env);
  if (err) return err;
  fm_frame_reader_init(&w->rd, FM_FRAME_MAX_REPLY);

  int r = fm_child_read_frame(w->fd, &w->rd, now_ms() + timeout_ms, &payload, &len);
  if (r == FM_ETIMEOUT) {
    fm_tworker_kill(w);
    return fm_diag_set(d, FM_ETIMEOUT, "the tuner worker %s did not become ready within %d ms", w->exe, timeout_ms);
  }
  if (r != 1) return lost(w, "before it was ready (is it executable?)", d);
  msgpack_zone_init(&zone, 4096);
  err = fm_msg_unpack(payload, len, &fm_msg_reply_limits, &zone, &msg, d);
  if (!err) {
    bool ok = false;
    char detail[512] = "";
    fm_msg_get_bool(&msg, "ok", &ok, NULL);
    fm_msg_copy_str(&msg, "detail", detail, sizeof detail, NULL);
    fm_msg_copy_str(&msg, "device", w->device, sizeof w->device, NULL);
    if (!fm_msg_str_eq(fm_msg_get(&msg, "op"), "ready"))
      err = fm_diag_set(d, FM_EPROTOCOL, "the tuner worker's first message is not \"ready\"");
    else if (!ok)
      err = fm_diag_set(d, FM_ENOGPU, "the tuner worker cannot use the GPU: %s", detail);
  }
  msgpack_zone_destroy(&zone);
  if (err) fm_tworker_kill(w);
  return err;
}

int fm_tworker_call(fm_tworker *w, const uint8_t *req, size_t len, uint64_t id, int timeout_ms, msgpack_zone *zone,
                    msgpack_object *reply, fm_diag *d) {
  uint8_t hdr[FM_FRAME_HEADER_BYTES];
  int64_t deadline = now_ms() + timeout_ms;
  const uint8_t *payload;
  size_t plen;
  int r;

  if (w->pid <= 0 || w->fd < 0) return fm_diag_set(d, FM_ECLOSED, "the tuner worker is not running");
  fm_frame_header(hdr, (uint32_t)len);
  if ((r = fm_child_write(w->fd, hdr, sizeof hdr, deadline)) == FM_OK) r = fm_child_write(w->fd, req, len, deadline);
  if (r == FM_ECLOSED) return lost(w, "while being sent a request", d);
  if (r == FM_ETIMEOUT)
    return fm_diag_set(d, FM_ETIMEOUT, "the tuner worker did not take a request within %d ms", timeout_ms);
  for (;;) {
    r = fm_child_read_frame(w->fd, &w->rd, deadline, &payload, &plen);
    if (r == FM_ETIMEOUT) return fm_diag_set(d, FM_ETIMEOUT, "no answer within %.1f s", timeout_ms / 1000.0);
    if (r == FM_ECLOSED) return lost(w, "mid-request", d);
    if (r != 1) return fm_diag_set(d, FM_EPROTOCOL, "the tuner worker sent an oversized frame");
    int err = fm_msg_unpack(payload, plen, &fm_msg_reply_limits, zone, reply, d);
    if (err) return fm_diag_set(d, FM_EPROTOCOL, "the tuner worker sent a bad reply");
    uint64_t got = 0;
    if (fm_msg_get_u64(reply, "id", &got, NULL) == FM_OK && got == id) return FM_OK;
    /* A stale answer (to a request that timed out on a worker since replaced cannot reach
     * us: a new worker has a new socket). Anything else is skipped. */
  }
}
