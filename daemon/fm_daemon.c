/* fm_daemon.c: startup, signals, and an orderly shutdown that loses nothing. */
#include "fm_daemon.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fm_bgtune.h"
#include "fm_commands.h"
#include "fm_compile_queue.h"
#include "fm_detach.h"
#include "fm_dispatch.h"
#include "fm_frame.h"
#include "fm_log.h"
#include "fm_proto.h"
#include "fm_remote_tier.h"
#include "fm_sd.h"
#include "fm_tuner.h"

#define FM_STATS_SAVE_MS           1000
/* A database on a read-only location: kernels are kept in memory, at most this many bytes of
 * CUBINs (or --cache-size, if smaller). */
#define FM_DAEMON_MEMORY_STORE_MAX (256ull << 20)

void fm_daemon_count(fm_daemon *dd, fm_stat stat, int64_t delta) {
  dd->session[stat] += delta;
  dd->unsaved[stat] += delta;
}

void fm_daemon_save_stats(fm_daemon *dd) {
  if (!dd->store) return;
  for (int s = 1; s < FM_STAT__COUNT; s++) {
    if (!dd->unsaved[s]) continue;
    int err = fm_store_stat_add(dd->store, (fm_stat)s, dd->unsaved[s]);
    if (err) {
      /* Keep the delta for the next try (the disk may have filled up for a moment). */
      fm_log_debug("saving statistic %s: %s", fm_stat_name((fm_stat)s), fm_strerror(err));
      continue;
    }
    dd->unsaved[s] = 0;
  }
}

static void on_stats_timer(uv_timer_t *t) { fm_daemon_save_stats(t->data); }

/* The server tells nobody when a peer hangs up, so the builds it waited for are found here
 * (a walk of the in-flight table, nothing when it is empty). */
static void on_sweep_timer(uv_timer_t *t) { fm_cmd_sweep_abandoned(t->data); }

/* Pinged from the loop itself: a loop that stops turning stops the pings, and systemd
 * restarts the service (Restart=on-failure covers a watchdog timeout). */
static void on_watchdog_timer(uv_timer_t *t) {
  (void)t;
  fm_sd_notify("WATCHDOG=1");
}

/* ---- shutdown ---- */

static void on_flush_deadline(uv_timer_t *t) {
  fm_daemon *dd = t->data;
  if (!dd->drained)
    fm_log_error("%u compile(s) still running after %d s; exiting without them", dd->jobs_running, FM_DAEMON_DRAIN_S);
  else
    fm_log_warn("some clients did not read their last replies within %d s; closing them", FM_DAEMON_FLUSH_S);
  uv_stop(dd->loop);
}

/* Once nothing is compiling any more: close the connections after their replies are written
 * and let the loop run out of handles. */
static void maybe_drained(fm_daemon *dd) {
  if (!dd->stopping || dd->drained || dd->jobs_running > 0) return;
  dd->drained = 1;
  fm_log_info("no compiles in flight; closing %u connection(s)", fm_server_clients(dd->server));
  fm_server_close_all(dd->server);
  /* Unreferenced, these no longer keep the loop alive: it ends as soon as the last
   * connection closes. The signals still answer (a second SIGTERM stops at once), and the
   * deadline only matters if a client never reads. */
  uv_unref((uv_handle_t *)&dd->sig_term);
  uv_unref((uv_handle_t *)&dd->sig_int);
  uv_unref((uv_handle_t *)&dd->sig_hup);
  uv_timer_start(&dd->deadline, on_flush_deadline, FM_DAEMON_FLUSH_S * 1000, 0);
  uv_unref((uv_handle_t *)&dd->deadline);
}

void fm_daemon_job_ended(fm_daemon *dd) { maybe_drained(dd); }

void fm_daemon_shutdown(fm_daemon *dd, const char *why) {
  if (dd->stopping) return;
  dd->stopping = 1;
  fm_sd_notify("STOPPING=1");
  fm_log_info("%s: shutting down; %u compile(s) in flight", why, dd->jobs_running);
  /* Background tunes are nobody's answer: those not started are dropped (their fragments'
   * verified entries are tuned again on their next request), the compiling ones are
   * cancelled, the one on the tuner ends at its next candidate. */
  if (dd->bgtune) {
    size_t dropped = fm_bgtune_stop(dd->bgtune);
    if (dropped) fm_log_info("%zu background tune(s) not started are dropped", dropped);
  }
  fm_server_stop_listening(dd->server);
  uv_timer_start(&dd->deadline, on_flush_deadline, FM_DAEMON_DRAIN_S * 1000, 0);
  maybe_drained(dd);
}

/* A signal: a second one stops at once. why: the signal's name. */
static void begin_shutdown(fm_daemon *dd, const char *why) {
  if (dd->stopping) {
    fm_log_warn("second %s: stopping now", why);
    uv_stop(dd->loop);
    return;
  }
  fm_daemon_shutdown(dd, why);
}

static void on_signal(uv_signal_t *h, int signum) {
  fm_daemon *dd = h->data;
  if (signum == SIGHUP) {
    fm_diag d = {{0}};
    if (fm_log_reopen(&d))
      fm_log_error("SIGHUP: %s", d.text);
    else
      fm_log_info("SIGHUP: log reopened");
    return;
  }
  begin_shutdown(dd, strsignal(signum));
}

/* --exit-when-idle: a daemon a client started goes away once nobody has used it for a while
 * (its kernels stay in the store). A connected client, even a quiet one, or a compile or
 * tuning job still running, background tunes included, keeps it up. */
static void on_idle_exit_timer(uv_timer_t *t) {
  fm_daemon *dd = t->data;
  uint64_t now = uv_now(dd->loop);
  if (dd->stopping) return;
  if (fm_server_clients(dd->server) > 0 || dd->jobs_running > 0 || fm_bgtune_pending(dd->bgtune) > 0) {
    dd->busy_ms = now;
    return;
  }
  if (now - dd->busy_ms >= (uint64_t)dd->cfg->exit_when_idle_s * 1000) {
    char why[96];
    snprintf(why, sizeof why, "no client and no compile for %u s (--exit-when-idle)", dd->cfg->exit_when_idle_s);
    fm_daemon_shutdown(dd, why);
  }
}

/* ---- startup ---- */

static int start_handles(fm_daemon *dd, fm_diag *d) {
  uv_signal_t *sigs[] = {&dd->sig_term, &dd->sig_int, &dd->sig_hup};
  int nums[] = {SIGTERM, SIGINT, SIGHUP};
  for (int i = 0; i < 3; i++) {
    uv_signal_init(dd->loop, sigs[i]);
    sigs[i]->data = dd;
  }
  uv_timer_init(dd->loop, &dd->deadline);
  uv_timer_init(dd->loop, &dd->stats_timer);
  uv_timer_init(dd->loop, &dd->sweep_timer);
  dd->deadline.data = dd->stats_timer.data = dd->sweep_timer.data = dd;
  dd->handles_ready = 1;
  for (int i = 0; i < 3; i++) {
    int r = uv_signal_start(sigs[i], on_signal, nums[i]);
    if (r < 0) return fm_diag_set(d, FM_EIO, "cannot handle %s: %s", strsignal(nums[i]), uv_strerror(r));
  }
  uv_timer_start(&dd->stats_timer, on_stats_timer, FM_STATS_SAVE_MS, FM_STATS_SAVE_MS);
  uv_unref((uv_handle_t *)&dd->stats_timer);
  uv_timer_start(&dd->sweep_timer, on_sweep_timer, FM_DAEMON_SWEEP_MS, FM_DAEMON_SWEEP_MS);
  uv_unref((uv_handle_t *)&dd->sweep_timer);
  if (dd->watchdog_usec) {
    /* Half the interval, as sd_watchdog_enabled(3) recommends; it keeps pinging through a
     * drain (unreferenced, it never holds the loop open). */
    uint64_t ms = dd->watchdog_usec / 2000;
    if (ms == 0) ms = 1;
    uv_timer_init(dd->loop, &dd->watchdog);
    uv_timer_start(&dd->watchdog, on_watchdog_timer, ms, ms);
    uv_unref((uv_handle_t *)&dd->watchdog);
    fm_log_info("systemd watchdog: %llu ms, pinging every %llu ms", (unsigned long long)(dd->watchdog_usec / 1000),
                (unsigned long long)ms);
  }
  if (dd->cfg->exit_when_idle_s) {
    /* Unreferenced: it never holds the loop open (a shutdown ends as it otherwise would). */
    dd->busy_ms = uv_now(dd->loop);
    uv_timer_init(dd->loop, &dd->idle_exit);
    dd->idle_exit.data = dd;
    uv_timer_start(&dd->idle_exit, on_idle_exit_timer, 1000, 1000);
    uv_unref((uv_handle_t *)&dd->idle_exit);
    fm_log_info("exits after %u s with no client and no compile (--exit-when-idle)", dd->cfg->exit_when_idle_s);
  }
  return FM_OK;
}

static void log_startup(fm_daemon *dd, int activated) {
  const fm_config *cfg = dd->cfg;
  uint64_t entries = 0, bytes = 0;
  fm_store_usage(dd->store, &entries, &bytes);
  if (dd->dev.gpu)
    fm_log_info("fusemld %s serving %s%s (pid %ld): GPU mode on %s", FM_VERSION_STRING, cfg->socket_path,
                activated ? " (socket from systemd)" : "", (long)getpid(), dd->dev.label);
  else
    fm_log_info("fusemld %s serving %s%s (pid %ld): compile-only mode for %s (kernels stored untuned): %s",
                FM_VERSION_STRING, cfg->socket_path, activated ? " (socket from systemd)" : "", (long)getpid(),
                dd->dev.id.arch, dd->dev.why_no_gpu);
  fm_log_info("db %s (%llu entries, %llu bytes, cap %llu); NVRTC %u.%u; cuBLASLt %llu; %u compile threads",
              cfg->db_path, (unsigned long long)entries, (unsigned long long)bytes, (unsigned long long)cfg->cache_size,
              dd->dev.nvrtc_major, dd->dev.nvrtc_minor, (unsigned long long)dd->dev.cublaslt_version, cfg->jobs);
  if (dd->nvrtc.exe)
    fm_log_info(
        "compiles in %s: deadline %.1f s, memory %llu MiB (0 = unbounded), %u waiting per client, "
        "cost bound %u",
        dd->nvrtc.exe, cfg->compile_deadline_s, (unsigned long long)(cfg->compile_memory >> 20),
        cfg->max_client_compiles, cfg->max_compile_cost);
}

/* name beside this executable (installed together), in out. 0 if that path cannot be made. */
static int beside_self(const char *name, char *out, size_t cap) {
  ssize_t n = readlink("/proc/self/exe", out, cap - 1);
  char *slash = n > 0 ? (out[n] = '\0', strrchr(out, '/')) : NULL;
  if (!slash || (size_t)(slash - out) + 1 + strlen(name) + 1 > cap) return 0;
  snprintf(slash + 1, cap - (size_t)(slash + 1 - out), "%s", name);
  return 1;
}

/* The tuner (fm_tuner.h): in GPU mode unless --no-tune, or wherever --tuner-worker names a
 * worker (CI's stand-ins, without a GPU). The default worker is fusemld-tuner beside this
 * executable (installed together). */
static int start_tuner(fm_daemon *dd, fm_diag *d) {
  const fm_config *cfg = dd->cfg;
  char exe[FM_CONFIG_PATH_MAX];
  if (cfg->tuner_worker[0]) {
    snprintf(exe, sizeof exe, "%s", cfg->tuner_worker);
  } else {
    if (!dd->dev.gpu || cfg->tune == FM_TUNE_OFF) return FM_OK;
    if (!beside_self("fusemld-tuner", exe, sizeof exe)) {
      fm_log_warn("cannot find fusemld-tuner beside this executable; kernels are served untuned");
      return FM_OK;
    }
  }
  if (cfg->tune == FM_TUNE_OFF) return FM_OK;
  fm_tuner_opts o = {.worker_exe = exe, .deadline_s = cfg->tune_deadline_s};
  int err = fm_tuner_new(dd->loop, &o, &dd->tuner, d);
  if (err) return err;
  if (fm_cmd_bgtune_new(dd)) return fm_diag_set(d, FM_ENOMEM, "out of memory");
  fm_log_info("tuning with %s (--tune %s; per-candidate deadline %.1f s + 50x the default's time)", exe,
              fm_tune_mode_name(cfg->tune), cfg->tune_deadline_s);
  return FM_OK;
}

/* Whether the database's place refuses our writes: a read-only mount, or a directory or
 * existing file we may not write (SQLite needs the directory too, for its -wal file). */
static int db_location_read_only(const char *path) {
  char dir[FM_CONFIG_PATH_MAX];
  snprintf(dir, sizeof dir, "%s", path);
  char *slash = strrchr(dir, '/');
  if (!slash)
    snprintf(dir, sizeof dir, ".");
  else if (slash == dir)
    slash[1] = '\0';
  else
    *slash = '\0';
  if (faccessat(AT_FDCWD, path, W_OK, AT_EACCESS) != 0 && errno != ENOENT) return errno == EROFS || errno == EACCES;
  return faccessat(AT_FDCWD, dir, W_OK, AT_EACCESS) != 0 && (errno == EROFS || errno == EACCES);
}

/* The kernel store. On a read-only location the daemon still serves, from a store in memory
 * (capped: it is not where the user said kernels may go), rather than not at all: one warning
 * says so. Any other failure to open is a startup error. */
static int open_store(fm_daemon *dd, fm_diag *d) {
  const fm_config *cfg = dd->cfg;
  fm_diag why = {{0}};
  int err = fm_store_open(cfg->db_path, cfg->cache_size, &dd->store, &why);
  if (err && db_location_read_only(cfg->db_path)) {
    uint64_t cap = FM_DAEMON_MEMORY_STORE_MAX;
    if (cfg->cache_size && cfg->cache_size < cap) cap = cfg->cache_size;
    fm_diag mem = {{0}};
    if (fm_store_open(FM_STORE_MEMORY, cap, &dd->store, &mem) == FM_OK) {
      fm_log_warn(
          "kernel store %s is on a read-only location (%s): serving uncached, kernels kept in "
          "memory only (at most %llu MiB) until fusemld stops",
          cfg->db_path, why.text, (unsigned long long)(cap >> 20));
      return FM_OK;
    }
  }
  if (err) return fm_diag_set(d, err, "cannot open the kernel store %s: %s", cfg->db_path, why.text);
  if (why.text[0]) fm_log_warn("kernel store: %s", why.text);
  return FM_OK;
}

/* The NVRTC worker (fm_nvrtc_child.h): --compile-worker, else fusemld-nvrtc beside this
 * executable. Without one, compiles run in this process, where nothing can stop them: said
 * loudly, but still serving (a missing file must not take every client's kernels away). */
static void find_nvrtc_worker(fm_daemon *dd) {
  const fm_config *cfg = dd->cfg;
  if (cfg->compile_worker[0])
    snprintf(dd->nvrtc_exe, sizeof dd->nvrtc_exe, "%s", cfg->compile_worker);
  else if (!beside_self("fusemld-nvrtc", dd->nvrtc_exe, sizeof dd->nvrtc_exe))
    dd->nvrtc_exe[0] = '\0';
  if (!dd->nvrtc_exe[0] || access(dd->nvrtc_exe, X_OK) != 0) {
    fm_log_error(
        "cannot run the NVRTC worker %s: compiles run inside the daemon, with no deadline and no "
        "memory bound",
        dd->nvrtc_exe[0] ? dd->nvrtc_exe : "fusemld-nvrtc");
    return;
  }
  dd->nvrtc.exe = dd->nvrtc_exe;
  dd->nvrtc.deadline_s = cfg->compile_deadline_s;
  dd->nvrtc.memory = cfg->compile_memory;
}

static void close_walk_cb(uv_handle_t *h, void *arg) {
  if (!uv_is_closing(h)) uv_close(h, NULL);
}

/* Closes whatever is still open and lets the loop finish the close callbacks. */
static void close_loop(fm_daemon *dd) {
  if (dd->server) {
    fm_server_stop_listening(dd->server);
    fm_server_abort_all(dd->server);
  }
  uv_walk(dd->loop, close_walk_cb, NULL);
  uv_run(dd->loop, UV_RUN_DEFAULT);
}

int fm_daemon_run(const fm_config *cfg, int ready_fd, fm_diag *d) {
  int err, status = 1;
  fm_daemon *dd = calloc(1, sizeof *dd);
  uv_loop_t *loop = malloc(sizeof *loop);
  if (!dd || !loop) {
    free(dd);
    free(loop);
    fm_diag_set(d, FM_ENOMEM, "out of memory");
    return 1;
  }
  if (uv_loop_init(loop) != 0) {
    free(dd);
    free(loop);
    fm_diag_set(d, FM_EIO, "cannot create the event loop");
    return 1;
  }
  dd->loop = loop;
  dd->cfg = cfg;

  /* Read (and cleared) before the tuner worker is forked: it must not inherit the watchdog. */
  if ((err = fm_sd_watchdog_usec(&dd->watchdog_usec, d))) goto out;
  if ((err = fm_device_init(&dd->dev, cfg->arch, d))) goto out;
  if ((err = open_store(dd, d))) goto out;
  if ((err = fm_inflight_new(&dd->inflight)) || (err = fm_cqueue_new(loop, cfg->jobs, &dd->cqueue))) {
    fm_diag_set(d, err, "out of memory");
    goto out;
  }
  if ((err = fm_remote_tier_new(cfg->remote, cfg->remote_secret_file, dd->store, &dd->dev, &dd->remote, d))) goto out;
  if (dd->remote->remote) {
    fm_diag why = {{0}};
    fm_log_info("remote tier %s (lookups time out after %d ms; entries signed)", fm_remote_url(dd->remote->remote),
                FM_REMOTE_IO_MS);
    /* Not fatal: the local tier serves on; but said now, not at the first lookup. */
    if (fm_remote_check_network(fm_remote_host(dd->remote->remote), &why)) fm_log_error("%s", why.text);
  }
  if ((err = start_tuner(dd, d))) goto out;
  find_nvrtc_worker(dd);
  int listen_fd;
  if ((err = fm_sd_listen_fd(&listen_fd, d))) goto out;
  fm_server_opts so = {
      .socket_path = cfg->socket_path,
      .listen_fd = listen_fd,
      .system_mode = cfg->system_mode,
      .max_clients = cfg->max_clients,
      .idle_timeout_s = cfg->idle_timeout_s,
      .stall_timeout_s = FM_DAEMON_STALL_S,
      .frame_deadline_s = cfg->frame_deadline_s,
      .max_frame = FM_FRAME_MAX_REQUEST,
      .max_pending_output = (size_t)cfg->max_output,
      .max_total_output = (size_t)cfg->max_output_total,
      .allow_uids = cfg->allow_uids,
      .n_allow_uids = cfg->n_allow_uids,
      .allow_gids = cfg->allow_gids,
      .n_allow_gids = cfg->n_allow_gids,
      .on_frame = fm_dispatch_frame,
      .on_refused = fm_dispatch_refused,
      .ctx = dd,
  };
  if ((err = fm_server_start(loop, &so, &dd->server, d))) goto out;
  if ((err = start_handles(dd, d))) goto out;
  dd->started_ms = uv_now(loop);

  log_startup(dd, listen_fd >= 0);
  char status_line[FM_CONFIG_PATH_MAX + 64];
  snprintf(status_line, sizeof status_line, "READY=1\nSTATUS=serving %s (%s, %s)", cfg->socket_path,
           fm_device_mode(&dd->dev), dd->dev.id.arch);
  fm_sd_notify(status_line);
  if (ready_fd >= 0) fm_detach_ready(ready_fd, fm_log_fd());

  uv_run(loop, UV_RUN_DEFAULT);

  status = 0;
  if (dd->jobs_running > 0) {
    /* A worker may still be inside NVRTC or the store: closing either under it would be
     * worse than exiting. SQLite's WAL keeps the database whole either way. */
    fm_daemon_save_stats(dd);
    fm_log_info("stopped (%u compile(s) abandoned)", dd->jobs_running);
    return status;
  }
  fm_daemon_save_stats(dd);
  fm_log_info("stopped");
out:
  fm_tuner_stop(dd->tuner); /* joins its thread, stops the worker, closes its handle */
  if (dd->handles_ready || dd->server || dd->tuner)
    close_loop(dd);
  else
    uv_run(loop, UV_RUN_DEFAULT); /* a server that failed to start closes its listener */
  if (dd->server) fm_server_free(dd->server);
  fm_tuner_free(dd->tuner);
  fm_bgtune_free(dd->bgtune); /* after the tuner: the jobs it held are freed there */
  fm_inflight_free(dd->inflight);
  fm_cqueue_free(dd->cqueue);
  fm_remote_tier_free(dd->remote); /* after close_loop: no lookup or publish still runs */
  if (dd->store) fm_store_close(dd->store);
  if (uv_loop_close(loop) != 0) fm_log_debug("event loop still had handles at exit");
  free(loop);
  free(dd);
  return status;
}
