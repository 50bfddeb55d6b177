/* fm_detach.c: fork into the background, with the parent waiting for the child's verdict. */
#define _GNU_SOURCE /* pipe2 */
#include "fm_detach.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

int fm_detach_start(int *ready_fd, int *exit_status, fm_diag *d) {
  int p[2];
  if (pipe2(p, O_CLOEXEC) != 0) return fm_diag_set(d, FM_EIO, "pipe: %s", strerror(errno));
  pid_t pid = fork();
  if (pid < 0) {
    close(p[0]);
    close(p[1]);
    return fm_diag_set(d, FM_EIO, "fork: %s", strerror(errno));
  }
  if (pid == 0) {
    close(p[0]);
    setsid(); /* leave the terminal's session: no SIGHUP when it closes */
    *ready_fd = p[1];
    return FM_OK;
  }
  close(p[1]);
  char byte = 0;
  ssize_t n;
  do {
    n = read(p[0], &byte, 1);
  } while (n < 0 && errno == EINTR);
  close(p[0]);
  if (n == 1 && byte == 'R') {
    *exit_status = 0;
  } else {
    /* The child failed (its message is already on stderr): collect it and report its status. */
    int st = 0;
    *exit_status = (waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st)) ? WEXITSTATUS(st) : 1;
  }
  return 1;
}

void fm_detach_ready(int ready_fd, int log_fd) {
  int null_fd = open("/dev/null", O_RDWR | O_CLOEXEC);
  if (null_fd >= 0) {
    dup2(null_fd, STDIN_FILENO);
    dup2(null_fd, STDOUT_FILENO);
    dup2(log_fd >= 0 ? log_fd : null_fd, STDERR_FILENO);
    if (null_fd > STDERR_FILENO) close(null_fd);
  }
  ssize_t n;
  do {
    n = write(ready_fd, "R", 1);
  } while (n < 0 && errno == EINTR);
  close(ready_fd);
}
