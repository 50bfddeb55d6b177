/* fm_detach.h: going into the background without losing startup errors.
 *
 * The process forks early (before libuv or any thread starts); the parent waits on a pipe
 * until the child reports that it is listening, and only then exits 0. A child that fails
 * during startup prints its error to the still-attached terminal and exits, the pipe reads
 * EOF, and the parent exits 1: `fusemld && echo up` means what it says. */
#ifndef FM_DETACH_H
#define FM_DETACH_H

#include "fm_error.h"

/* Forks. In the child (which also becomes a session leader) returns FM_OK with *ready_fd set.
 * In the parent, waits for the child's report and returns 1 with *exit_status for main to
 * return. Negative fm_err if the fork itself fails. */
int fm_detach_start(int *ready_fd, int *exit_status, fm_diag *d);

/* In the child, once serving: points stdin/stdout at /dev/null and stderr at log_fd (or
 * /dev/null when log_fd < 0), then tells the parent to exit 0. */
void fm_detach_ready(int ready_fd, int log_fd);

#endif
