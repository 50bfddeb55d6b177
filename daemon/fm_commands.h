/* fm_commands.h: the request handlers behind fm_dispatch's table (schemas in fm_proto.h).
 *
 * A handler either answers (now, or later for a compile) and returns FM_OK, or returns a
 * negative fm_err with the reason in d, and dispatch sends the error reply. */
#ifndef FM_COMMANDS_H
#define FM_COMMANDS_H

#include <stdint.h>
#include <msgpack.h>

#include "fm_daemon.h"
#include "fm_error.h"
#include "fm_server.h"

typedef struct fm_request {
  fm_daemon *dd;
  fm_conn *conn;
  uint64_t id;
  const msgpack_object *msg; /* the whole request map; valid during the call only */
} fm_request;

typedef int (*fm_command_fn)(fm_request *rq, fm_diag *d);

/* fm_cmd_kernel.c: the kernel path. */
int fm_cmd_compile(fm_request *rq, fm_diag *d);
int fm_cmd_lookup(fm_request *rq, fm_diag *d);
/* Cancels every build whose requesters have all hung up (queued ones never start, running
 * ones have their NVRTC worker killed); the daemon calls it on a timer. */
void fm_cmd_sweep_abandoned(fm_daemon *dd);
/* The background tunes (fm_bgtune.h) of a daemon that tunes: dd->bgtune. FM_ENOMEM. */
int fm_cmd_bgtune_new(fm_daemon *dd);

/* fm_cmd_admin.c: what fusectl shows and manages. */
int fm_cmd_stats(fm_request *rq, fm_diag *d);
/* Zeroes the persistent and since-start counters (admin only). */
int fm_cmd_stats_zero(fm_request *rq, fm_diag *d);
int fm_cmd_list(fm_request *rq, fm_diag *d);
int fm_cmd_show(fm_request *rq, fm_diag *d);
int fm_cmd_evict(fm_request *rq, fm_diag *d);
/* Answers {pid, inflight}, then begins the daemon's orderly shutdown (fm_daemon.h). */
int fm_cmd_shutdown(fm_request *rq, fm_diag *d);

/* fm_remote_cmd.c: portable entries (fusectl export / import, docs/REMOTE.md). */
int fm_cmd_export(fm_request *rq, fm_diag *d);
int fm_cmd_import(fm_request *rq, fm_diag *d);

#endif
