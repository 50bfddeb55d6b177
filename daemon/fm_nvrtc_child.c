/* fm_nvrtc_child.c: NVRTC in a fusemld-nvrtc child, killed at its deadline or on cancel
 * (fm_nvrtc_child.h). */
#include "fm_nvrtc_child.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <msgpack.h>

#include "fm_child.h"
#include "fm_frame.h"
#include "fm_msg.h"

/* How often a waiting worker thread looks at its cancel flag: a compile nobody waits for
 * any more is stopped within this. */
#define FM_NVRTC_CANCEL_POLL_MS 50

extern char **environ;

static char *dup_bytes(const char *s, size_t n) {
  char *p = malloc(n + 1);
  if (!p) return NULL;
  memcpy(p, s, n);
  p[n] = '\0';
  return p;
}

/* The worker's answer -> the caller's buffers. */
static int take_reply(const fm_nvrtc_limits *lim, const uint8_t *payload, size_t len, uint8_t **cubin,
                      size_t *cubin_len, char **log, fm_diag *d) {
  msgpack_zone zone;
  msgpack_object msg;
  int64_t rc = 0;
  const char *lg = NULL;
  const uint8_t *bin = NULL;
  size_t lg_len = 0, bin_len = 0;
  int err;
  if (!msgpack_zone_init(&zone, 4096)) return fm_diag_set(d, FM_ENOMEM, "out of memory");
  err = fm_msg_unpack(payload, len, &fm_msg_reply_limits, &zone, &msg, NULL);
  if (!err) err = fm_msg_get_i64(&msg, "rc", &rc, NULL);
  if (!err) err = fm_msg_get_str(&msg, "log", &lg, &lg_len, NULL);
  if (!err) err = fm_msg_get_bin(&msg, "cubin", &bin, &bin_len, NULL);
  if (err || rc > 0 || rc < -1000) {
    err = fm_diag_set(d, FM_EIO, "the NVRTC worker sent a reply that does not parse");
    goto out;
  }
  if (lg_len && log && !(*log = dup_bytes(lg, lg_len))) {
    err = fm_diag_set(d, FM_ENOMEM, "out of memory");
    goto out;
  }
  err = (int)rc;
  if (err == FM_ENOMEM && lim->memory)
    fm_diag_set(d, FM_ENOMEM,
                "NVRTC ran out of memory: the compile needs more than its %llu MiB memory bound "
                "(--compile-memory)",
                (unsigned long long)(lim->memory >> 20));
  if (err == FM_OK) {
    if (!(*cubin = malloc(bin_len ? bin_len : 1))) {
      err = fm_diag_set(d, FM_ENOMEM, "out of memory");
      goto out;
    }
    memcpy(*cubin, bin, bin_len);
    *cubin_len = bin_len;
  }
out:
  msgpack_zone_destroy(&zone);
  return err;
}

int fm_nvrtc_child_compile(const fm_nvrtc_limits *lim, const char *src, const char *name, const char *arch,
                           const atomic_int *cancel, uint8_t **cubin, size_t *cubin_len, char **log, fm_diag *d) {
  char fd_s[16], mem_s[32], cpu_s[32], how[128] = "";
  int64_t start = fm_child_now_ms();
  int64_t deadline = lim->deadline_s > 0 ? start + (int64_t)(lim->deadline_s * 1000) : INT64_MAX / 2;
  int fd = -1, err;
  pid_t pid = 0;
  size_t src_len = strlen(src);
  uint8_t hdr[FM_FRAME_HEADER_BYTES];
  fm_frame_reader rd;

  *cubin = NULL;
  *cubin_len = 0;
  if (log) *log = NULL;
  if (src_len > FM_FRAME_MAX_REPLY) return fm_diag_set(d, FM_ELIMIT, "generated source of %zu bytes", src_len);
  snprintf(fd_s, sizeof fd_s, "%d", FM_CHILD_FD);
  snprintf(mem_s, sizeof mem_s, "%llu", (unsigned long long)lim->memory);
  /* RLIMIT_CPU is only a backstop for a worker the daemon can no longer kill. */
  snprintf(cpu_s, sizeof cpu_s, "%llu", lim->deadline_s > 0 ? (unsigned long long)lim->deadline_s + 2 : 0ull);
  char *argv[] = {(char *)lim->exe, "--fd",     fd_s,  "--arch", (char *)arch, "--name",
                  (char *)name,     "--memory", mem_s, "--cpu",  cpu_s,        NULL};
  if ((err = fm_child_spawn(lim->exe, argv, environ, &fd, &pid, d))) return err;
  fm_frame_reader_init(&rd, FM_FRAME_MAX_REPLY);

  fm_frame_header(hdr, (uint32_t)src_len);
  err = fm_child_write(fd, hdr, sizeof hdr, deadline);
  if (!err) err = fm_child_write(fd, src, src_len, deadline);
  for (;;) {
    const uint8_t *payload;
    size_t len;
    int64_t now = fm_child_now_ms();
    int r = err ? err
                : fm_child_read_frame(
                      fd, &rd, now + FM_NVRTC_CANCEL_POLL_MS < deadline ? now + FM_NVRTC_CANCEL_POLL_MS : deadline,
                      &payload, &len);
    if (r == 1) {
      err = take_reply(lim, payload, len, cubin, cubin_len, log, d);
      fm_child_reap(pid, SIGKILL, NULL, 0); /* it is exiting; nothing of it may linger */
      break;
    }
    if (r == FM_ETIMEOUT && cancel && atomic_load(cancel)) {
      fm_child_reap(pid, SIGKILL, NULL, 0);
      err = fm_diag_set(d, FM_ECLOSED, "cancelled after %.1f s: nobody waits for it any more",
                        (fm_child_now_ms() - start) / 1000.0);
      break;
    }
    if (r == FM_ETIMEOUT && fm_child_now_ms() >= deadline) {
      fm_child_reap(pid, SIGKILL, NULL, 0);
      err = fm_diag_set(d, FM_ECOMPILE_TIMEOUT, "NVRTC did not finish within the %.1f s compile deadline; abandoned",
                        lim->deadline_s);
      break;
    }
    if (r == FM_ETIMEOUT) continue;
    /* It hung up without an answer: it died. Exit statuses 126 and 127 are fm_child_spawn's
     * exec failures; a death by signal with a memory bound set is most likely the bound (an
     * allocation NVRTC could not handle aborts it). */
    int status = fm_child_reap(pid, SIGKILL, how, sizeof how);
    if (WIFEXITED(status) && WEXITSTATUS(status) >= 126)
      err = fm_diag_set(d, FM_EIO, "cannot run the NVRTC worker %s (%s)", lim->exe, how);
    else if (lim->memory && WIFSIGNALED(status))
      err = fm_diag_set(d, FM_ENOMEM,
                        "the NVRTC worker was %s: the compile needs more than its %llu MiB "
                        "memory bound (--compile-memory), or NVRTC crashed",
                        how, (unsigned long long)(lim->memory >> 20));
    else
      err = fm_diag_set(d, FM_EIO, "the NVRTC worker %s without an answer", how);
    break;
  }
  fm_frame_reader_free(&rd);
  close(fd);
  return err;
}
