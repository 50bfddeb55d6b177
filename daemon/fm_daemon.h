/* fm_daemon.h: the running daemon: its state, shared by dispatch and the command handlers,
 * and its lifecycle (start, serve, shut down on a signal).
 *
 * Shutdown (SIGTERM/SIGINT, or the admin request "shutdown"): stop accepting (the socket file goes away), answer the requests
 * waiting on compiles already running (up to FM_DAEMON_DRAIN_S), flush and close the
 * connections, close the store, and return 0. New compiles meanwhile get shutting_down. */
#ifndef FM_DAEMON_H
#define FM_DAEMON_H

#include <stdint.h>
#include <uv.h>

#include "fm_config.h"
#include "fm_device.h"
#include "fm_error.h"
#include "fm_inflight.h"
#include "fm_nvrtc_child.h"
#include "fm_server.h"
#include "fm_store.h"

#define FM_DAEMON_DRAIN_S  30  /* how long running compiles may delay a shutdown */
#define FM_DAEMON_FLUSH_S  2   /* then how long the last replies may take to be written */
#define FM_DAEMON_STALL_S  10  /* a client stalled mid-frame */
#define FM_DAEMON_SWEEP_MS 100 /* how soon a build nobody waits for is cancelled */

typedef struct fm_daemon {
  uv_loop_t *loop;
  const fm_config *cfg;
  fm_store *store;
  fm_devinfo dev;
  fm_server *server;
  fm_inflight *inflight;
  struct fm_cqueue *cqueue;      /* compiles waiting for a worker, owners in turn */
  struct fm_tuner *tuner;        /* NULL: no tuning (compile-only, --tune off) */
  struct fm_bgtune *bgtune;      /* full tunes after a verified first answer (with tuner) */
  struct fm_remote_tier *remote; /* import/export; its remote is NULL without --remote */
  fm_nvrtc_limits nvrtc;         /* exe NULL: no fusemld-nvrtc, NVRTC runs in-process */
  char nvrtc_exe[FM_CONFIG_PATH_MAX];
  uint32_t jobs_running;           /* compile jobs queued or running on the pool */
  int64_t session[FM_STAT__COUNT]; /* counters since this start (FM_STAT_MAP) */
  int64_t unsaved[FM_STAT__COUNT]; /* counted but not yet added to the store's counters */
  uint64_t started_ms;             /* uv_now at start */
  int stopping;                    /* a shutdown signal arrived */
  int drained;                     /* in-flight work finished; connections closing */
  uv_signal_t sig_term, sig_int, sig_hup;
  uv_timer_t deadline;
  uv_timer_t stats_timer; /* saves the counters once a second */
  uv_timer_t sweep_timer; /* cancels builds nobody waits for (fm_cmd_sweep_abandoned) */
  uv_timer_t watchdog;    /* WATCHDOG=1 every half WATCHDOG_USEC (fm_sd.h) */
  uint64_t watchdog_usec; /* 0: systemd set no watchdog */
  int handles_ready;      /* signals and timer initialized */
  uv_timer_t idle_exit;   /* --exit-when-idle: looks once a second */
  uint64_t busy_ms;       /* uv_now when a client or a compile was last seen */
} fm_daemon;

/* Runs the daemon until a shutdown signal (or, with --exit-when-idle, until it has had no
 * client and no compile for that long: then it shuts down as on SIGTERM); ready_fd (>= 0 when detaching, fm_detach.h) is told
 * once it is serving. Returns the process exit status; startup errors are reported in d. */
int fm_daemon_run(const fm_config *cfg, int ready_fd, fm_diag *d);

/* Counts an event in the session and persistent statistics. The persistent ones are saved in
 * batches (a store write per request would cost a transaction each): once a second, before a
 * stats reply and at shutdown; a kill -9 loses at most the last second of counts. */
void fm_daemon_count(fm_daemon *dd, fm_stat stat, int64_t delta);
/* Saves the counted deltas to the store now. */
void fm_daemon_save_stats(fm_daemon *dd);

/* Begins the orderly shutdown above (why goes to the log); nothing if one has begun. */
void fm_daemon_shutdown(fm_daemon *dd, const char *why);

/* Called by the compile path when a job ends: during a shutdown, the last one lets it finish. */
void fm_daemon_job_ended(fm_daemon *dd);

#endif
