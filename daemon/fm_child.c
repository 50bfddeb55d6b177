/* fm_child.c: spawn a worker child, talk frames to it with deadlines, reap it (fm_child.h). */
#define _GNU_SOURCE
#include "fm_child.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int64_t fm_child_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int fm_child_spawn(const char *exe, char *const argv[], char *const envp[], int *fd, pid_t *pid, fm_diag *d) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
    return fm_diag_set(d, FM_EIO, "socketpair: %s", strerror(errno));
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old); /* no handler of ours runs in the child */
  pid_t p = fork();
  if (p == 0) {
    /* The child: async-signal-safe calls only. */
    sigset_t none;
    sigemptyset(&none);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    signal(SIGPIPE, SIG_DFL);
    sigprocmask(SIG_SETMASK, &none, NULL);
    if (sv[1] == FM_CHILD_FD) {
      fcntl(sv[1], F_SETFD, 0);
    } else if (dup2(sv[1], FM_CHILD_FD) < 0) {
      _exit(126);
    }
    execve(exe, argv, envp);
    _exit(127);
  }
  int fork_errno = errno;
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  close(sv[1]);
  if (p < 0) {
    close(sv[0]);
    return fm_diag_set(d, FM_EIO, "fork: %s", strerror(fork_errno));
  }
  *fd = sv[0];
  *pid = p;
  return FM_OK;
}

int fm_child_read_frame(int fd, fm_frame_reader *rd, int64_t deadline_ms, const uint8_t **payload, size_t *len) {
  for (;;) {
    if (fm_frame_reader_next(rd, payload, len)) return 1;
    int64_t left = deadline_ms - fm_child_now_ms();
    if (left <= 0) return FM_ETIMEOUT;
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int r = poll(&p, 1, left > 1000000 ? 1000000 : (int)left);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return FM_ECLOSED;
    if (r == 0) continue;
    uint8_t buf[65536];
    ssize_t got = read(fd, buf, sizeof buf);
    if (got < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (got <= 0) return FM_ECLOSED;
    int err = fm_frame_reader_feed(rd, buf, (size_t)got);
    if (err) return err;
  }
}

int fm_child_write(int fd, const void *buf, size_t n, int64_t deadline_ms) {
  const uint8_t *p = buf;
  while (n > 0) {
    int64_t left = deadline_ms - fm_child_now_ms();
    if (left <= 0) return FM_ETIMEOUT;
    struct pollfd pf = {.fd = fd, .events = POLLOUT};
    int r = poll(&pf, 1, left > 1000000 ? 1000000 : (int)left);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) continue;
    ssize_t put = send(fd, p, n, MSG_NOSIGNAL);
    if (put < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (put <= 0) return FM_ECLOSED;
    p += put;
    n -= (size_t)put;
  }
  return FM_OK;
}

void fm_child_describe(int status, char *how, size_t cap) {
  if (WIFSIGNALED(status))
    snprintf(how, cap, "killed by signal %d (%s)", WTERMSIG(status), strsignal(WTERMSIG(status)));
  else if (WIFEXITED(status))
    snprintf(how, cap, "exited with status %d", WEXITSTATUS(status));
  else
    snprintf(how, cap, "ended (wait status %d)", status);
}

int fm_child_reap(pid_t pid, int sig, char *how, size_t cap) {
  int status = 0;
  if (pid <= 0) return 0;
  if (sig) kill(pid, sig);
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (how && cap) fm_child_describe(status, how, cap);
  return status;
}
