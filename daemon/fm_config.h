/* fm_config.h: the daemon's settings, from defaults, a config file, then flags.
 *
 * Config file grammar (one setting per line; flags given on the command line win):
 *   file    := line*
 *   line    := ws* ( key ws* "=" ws* value ws* )? comment? "\n"
 *   comment := "#" any*          (at line start or after whitespace, so paths may hold '#')
 *   key     := socket | db | cache-size | log-level | log-file | jobs | arch
 *            | compile-worker | compile-deadline | compile-memory | max-client-compiles
 *            | max-compile-cost
 *            | max-clients | idle-timeout | tune | no-tune | tuner-worker | tune-deadline | tune-only
 *            | max-output | max-output-total | frame-deadline
 *            | allow-uid | allow-gid | remote | remote-secret-file | exit-when-idle
 *                                (the long option names; tune = eager|background|off; no-tune = yes|no,
 *                                 yes being tune = off)
 * allow-uid / allow-gid take a comma-separated list of numeric ids; given more than once (file
 * and flags) the lists add up.
 * A line that does not parse, an unknown key or a bad value is a startup error naming
 * file:line. */
#ifndef FM_CONFIG_H
#define FM_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "fm_error.h"
#include "fm_log.h"

#define FM_CONFIG_PATH_MAX                    4096
#define FM_CONFIG_DEFAULT_CACHE_SIZE          (2ull << 30)
#define FM_CONFIG_DEFAULT_ARCH                "sm_90a"
#define FM_CONFIG_DEFAULT_MAX_CLIENTS         1024u
#define FM_CONFIG_DEFAULT_IDLE_TIMEOUT        600u
#define FM_CONFIG_DEFAULT_MAX_OUTPUT          (512ull << 20)
#define FM_CONFIG_DEFAULT_MAX_OUTPUT_TOTAL    (1ull << 30)
#define FM_CONFIG_DEFAULT_FRAME_DEADLINE      30u
#define FM_CONFIG_MAX_ALLOW                   64   /* ids in each allow-list */
#define FM_CONFIG_DEFAULT_COMPILE_DEADLINE    60.0 /* s; the slowest real compiles take ~7 s */
#define FM_CONFIG_DEFAULT_COMPILE_MEMORY      (2ull << 30)
#define FM_CONFIG_DEFAULT_MAX_CLIENT_COMPILES 256u /* a model's whole graph is sent at once */

/* When a fragment is tuned (GPU mode, or wherever a tuner worker is named). */
#define FM_TUNE_MODE_MAP(XX)                                                                   \
  XX(EAGER, "eager")           /* every candidate verified and timed before the first reply */ \
  XX(BACKGROUND, "background") /* one candidate verified, served, the rest timed afterwards */ \
  XX(OFF, "off")               /* the heuristic configuration, never run on the GPU: untuned */

typedef enum {
#define FM_TUNE_ENUM_(name, str) FM_TUNE_##name,
  FM_TUNE_MODE_MAP(FM_TUNE_ENUM_)
#undef FM_TUNE_ENUM_
} fm_tune_mode;

const char *fm_tune_mode_name(fm_tune_mode m);

typedef struct fm_config {
  char socket_path[FM_CONFIG_PATH_MAX]; /* "" until fm_config_finish fills the default */
  char db_path[FM_CONFIG_PATH_MAX];
  char log_file[FM_CONFIG_PATH_MAX];    /* "": stderr */
  char config_path[FM_CONFIG_PATH_MAX]; /* the file that was read, "" if none */
  uint64_t cache_size;                  /* bytes of cubins kept; 0 = unlimited */
  fm_log_level log_level;
  uint32_t jobs;                           /* compile worker threads */
  char compile_worker[FM_CONFIG_PATH_MAX]; /* "": fusemld-nvrtc beside fusemld */
  double compile_deadline_s;               /* a compile's NVRTC worker is killed after this */
  uint64_t compile_memory;                 /* bytes each NVRTC worker may add; 0 = unbounded */
  uint32_t max_client_compiles;            /* compile requests one connection may have waiting */
  uint32_t max_compile_cost;               /* fm_codegen_cost bound; larger fragments refused */
  char arch[16];                           /* compile-only target */
  uint32_t max_clients;
  uint32_t idle_timeout_s; /* 0 = never time out idle clients */
  int foreground;
  int system_mode;
  fm_tune_mode tune;                     /* default background */
  char tuner_worker[FM_CONFIG_PATH_MAX]; /* "": fusemld-tuner beside fusemld (GPU mode only);
                                             set: tune with it even without a GPU (tests) */
  double tune_deadline_s;                /* base per-candidate deadline (+50x the default's time) */
  char tune_only[64];                    /* "": every candidate; else only those whose
                                             description contains it (experiments, tests) */
  uint64_t max_output;                   /* reply bytes queued unread before a client is cut off */
  uint64_t max_output_total;             /* the same across all clients: the slowest are cut */
  uint32_t frame_deadline_s;             /* a request frame's time from its first byte to its last */
  /* Access control: when either list is non-empty, only peers whose uid is in allow_uids or
   * whose gid (primary or supplementary) is in allow_gids are served. */
  uint32_t allow_uids[FM_CONFIG_MAX_ALLOW], n_allow_uids;
  uint32_t allow_gids[FM_CONFIG_MAX_ALLOW], n_allow_gids;
  /* The remote tier (fm_remote_tier.h): "" = off. The secret signs remote and exported entries. */
  char remote[FM_CONFIG_PATH_MAX]; /* redis://host:port/db */
  char remote_secret_file[FM_CONFIG_PATH_MAX];
  uint32_t exit_when_idle_s; /* 0: never; else exit after this long with no client
                                             connected and no compile in flight (autostart) */
} fm_config;

/* Defaults: 2G cache, info, jobs = online CPUs, sm_90a, 1024 clients, 600 s idle, tuning in
 * the background. */
void fm_config_defaults(fm_config *c);

/* Sets one setting by its long option name ("cache-size", "2G"). FM_EINVAL with the reason in
 * d for an unknown key or a bad value. */
int fm_config_set(fm_config *c, const char *key, const char *value, fm_diag *d);

/* Reads a config file (grammar above). With must_exist == 0 a missing file is not an error.
 * Errors name "path:line". */
int fm_config_load_file(fm_config *c, const char *path, int must_exist, fm_diag *d);

/* Fills the socket and database paths not given (system or per-user defaults, fm_paths.h)
 * and creates their directories. */
int fm_config_finish(fm_config *c, fm_diag *d);

/* "2G", "512M", "64k", "1048576", "1GiB" (binary multiples) -> bytes. FM_EINVAL otherwise. */
int fm_config_parse_size(const char *s, uint64_t *out);

/* The config file read when --config is not given. */
int fm_config_default_path(int system_mode, char *out, size_t cap, fm_diag *d);

#endif
