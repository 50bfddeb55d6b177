/* fm_child.h: a worker executable run as a child process the daemon can kill: started with
 * fork+exec, one end of a socketpair as its fd 3, frames (fm_frame.h) both ways, every wait
 * with a deadline. Used by the tuner worker (fm_tuner_worker.h) and the NVRTC worker
 * (fm_nvrtc_child.h). Blocking calls, for worker threads.
 *
 * fork+exec, never fork alone: the daemon is multithreaded (a forked copy could inherit a
 * lock some other thread held, and a forked child cannot initialise CUDA). Between fork and
 * exec the child makes async-signal-safe calls only: it asks for SIGKILL when the thread that
 * started it ends (a daemon killed with -9 leaves no worker behind), unblocks signals and
 * moves its socket to fd 3. */
#ifndef FM_CHILD_H
#define FM_CHILD_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "fm_error.h"
#include "fm_frame.h"

#define FM_CHILD_FD 3 /* the child's end of the socketpair, after exec */

/* Starts exe with argv (argv[0] included, NULL-terminated) and envp; *fd is the daemon's end
 * of the socketpair (close-on-exec), *pid the child. FM_EIO / FM_ENOMEM with the reason in d. */
int fm_child_spawn(const char *exe, char *const argv[], char *const envp[], int *fd, pid_t *pid, fm_diag *d);

/* CLOCK_MONOTONIC in milliseconds: the clock every deadline here is on. */
int64_t fm_child_now_ms(void);

/* Reads from fd into rd until a frame is complete or deadline_ms passes. 1: *payload set
 * (valid until the next call on rd); FM_ETIMEOUT; FM_ECLOSED (EOF or error); FM_ETOOBIG. */
int fm_child_read_frame(int fd, fm_frame_reader *rd, int64_t deadline_ms, const uint8_t **payload, size_t *len);

/* Writes the whole buffer before deadline_ms. FM_OK, FM_ETIMEOUT, FM_ECLOSED. */
int fm_child_write(int fd, const void *p, size_t n, int64_t deadline_ms);

/* How a wait status ended: "exited with status 1", "killed by signal 9 (Killed)". */
void fm_child_describe(int status, char *how, size_t cap);

/* Waits for pid (sending sig first unless 0) and says how it ended in how (may be NULL).
 * Returns the wait status. */
int fm_child_reap(pid_t pid, int sig, char *how, size_t cap);

#endif
