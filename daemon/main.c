/* main.c: fusemld: flags, config file, logging, then the daemon (fm_daemon.h). */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fm_config.h"
#include "fm_daemon.h"
#include "fm_detach.h"
#include "fm_log.h"
#include "fm_proto.h"
#include "fm_remote.h"
#include "fm_sd.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: fusemld [options]\n"
          "Serves fused GPU kernels to local clients over a Unix socket.\n\n"
          "  --socket PATH         listening socket (default $FUSEML_SOCKET, else\n"
          "                        $XDG_RUNTIME_DIR/fusemld.sock)\n"
          "  --db PATH             kernel database (default ~/.cache/fusemld/kernels.db)\n"
          "  --cache-size SIZE     cubin bytes kept, with K/M/G suffix (default 2G; 0 = unlimited)\n"
          "  --log-level LEVEL     error, warn, info or debug (default info)\n"
          "  --log-file PATH       log here instead of stderr (reopened on SIGHUP)\n"
          "  --foreground          do not detach (always so under systemd)\n"
          "  --jobs N              compile threads (default: number of CPUs)\n"
          "  --compile-deadline SECS  a compile still in NVRTC after this is killed and answered\n"
          "                        compile_timeout (default 60)\n"
          "  --compile-memory SIZE memory each compile's NVRTC worker may take (default 2G; 0 = unbounded)\n"
          "  --compile-worker PATH NVRTC worker executable (default: fusemld-nvrtc beside fusemld)\n"
          "  --max-client-compiles N  compiles one connection may have waiting; past it: busy (default 256)\n"
          "  --max-compile-cost N  refuse fragments whose code costs more to compile (default 1024;\n"
          "                        a general pow costs 32, erf 6, an add 1; real models stay under 60)\n"
          "  --arch ARCH           target when there is no GPU (default sm_90a)\n"
          "  --system              system mode: %s (0660), %s\n"
          "  --config PATH         config file of `key = value` lines (flags override it)\n"
          "  --max-clients N       concurrent clients (default 1024)\n"
          "  --idle-timeout SECS   close idle clients after this (default 600; 0 = never)\n"
          "  --max-output SIZE     reply bytes queued unread before a client is cut off (default 512M)\n"
          "  --max-output-total SIZE  the same for all clients together; the slowest readers are cut\n"
          "                        first (default 1G)\n"
          "  --frame-deadline SECS a request must arrive whole this long after its first byte (default 30)\n"
          "  --allow-uid LIST      serve only these uids (comma-separated; with --allow-gid: either)\n"
          "  --allow-gid LIST      serve only peers in these groups (primary or supplementary)\n"
          "  --tune MODE           eager: time every candidate before the first reply; background\n"
          "                        (default): answer with one candidate verified on the GPU, time\n"
          "                        the rest afterwards, a tuned kernel replaces it; off: untuned\n"
          "  --no-tune             the same as --tune off\n"
          "  --tuner-worker PATH   tuner worker executable (default: fusemld-tuner beside fusemld);\n"
          "                        given, it tunes even without a GPU (tests use stand-ins)\n"
          "  --tune-deadline SECS  per-candidate deadline: SECS + 50x the default's time (default 5)\n"
          "  --tune-only TEXT      tune only the candidates whose description (fusectl show) contains\n"
          "                        TEXT, e.g. \"cublaslt\" (experiments and tests)\n"
          "  --remote URL          share kernels through Redis: redis://[[user]:password@]host[:port][/db]\n"
          "                        (docs/REMOTE.md; a password belongs in the config file, not here)\n"
          "  --remote-secret-file PATH  the cluster secret that signs shared and exported entries\n"
          "  --exit-when-idle SECS exit after SECS with no client connected and no compile running\n"
          "                        (default 0: never; clients that start a daemon pass it)\n"
          "  --help, --version\n",
          "/run/fusemld/fusemld.sock", "/var/lib/fusemld/kernels.db");
}

/* Flags that are settings (key = long option name), kept to apply after the config file. */
typedef struct setting {
  const char *key, *value;
} setting;

/* A password given in --remote is in /proc/PID/cmdline, which every local user can read. */
static void warn_password_in_argv(const char *url) {
  fm_redis_url u;
  fm_diag ignored = {{0}};
  if (fm_remote_parse_url(url, &u, &ignored) == FM_OK && u.password[0])
    fm_log_warn(
        "--remote %s: a password on the command line can be read by every user of this machine (ps); "
        "put `remote = URL` in the config file instead, readable by fusemld's user only",
        u.shown);
  explicit_bzero(&u, sizeof u);
}

int main(int argc, char **argv) {
  enum {
    OPT_SOCKET = 256,
    OPT_DB,
    OPT_CACHE,
    OPT_LEVEL,
    OPT_LOGFILE,
    OPT_JOBS,
    OPT_ARCH,
    OPT_MAXCLIENTS,
    OPT_IDLE,
    OPT_MAXOUTPUT,
    OPT_ALLOWUID,
    OPT_ALLOWGID,
    OPT_NOTUNE,
    OPT_TUNE,
    OPT_TUNER,
    OPT_TUNEDL,
    OPT_TUNEONLY,
    OPT_FOREGROUND,
    OPT_SYSTEM,
    OPT_CONFIG,
    OPT_HELP,
    OPT_VERSION,
    OPT_REMOTE,
    OPT_REMOTE_SECRET,
    OPT_MAXOUTPUT_TOTAL,
    OPT_FRAME_DEADLINE,
    OPT_COMPILE_DEADLINE,
    OPT_COMPILE_MEMORY,
    OPT_COMPILE_WORKER,
    OPT_MAX_CLIENT_COMPILES,
    OPT_MAX_COMPILE_COST,
    OPT_EXIT_WHEN_IDLE
  };
  static const struct option longopts[] = {
      {"socket", required_argument, NULL, OPT_SOCKET},
      {"db", required_argument, NULL, OPT_DB},
      {"cache-size", required_argument, NULL, OPT_CACHE},
      {"log-level", required_argument, NULL, OPT_LEVEL},
      {"log-file", required_argument, NULL, OPT_LOGFILE},
      {"jobs", required_argument, NULL, OPT_JOBS},
      {"compile-deadline", required_argument, NULL, OPT_COMPILE_DEADLINE},
      {"compile-memory", required_argument, NULL, OPT_COMPILE_MEMORY},
      {"compile-worker", required_argument, NULL, OPT_COMPILE_WORKER},
      {"max-client-compiles", required_argument, NULL, OPT_MAX_CLIENT_COMPILES},
      {"max-compile-cost", required_argument, NULL, OPT_MAX_COMPILE_COST},
      {"arch", required_argument, NULL, OPT_ARCH},
      {"max-clients", required_argument, NULL, OPT_MAXCLIENTS},
      {"idle-timeout", required_argument, NULL, OPT_IDLE},
      {"max-output", required_argument, NULL, OPT_MAXOUTPUT},
      {"max-output-total", required_argument, NULL, OPT_MAXOUTPUT_TOTAL},
      {"frame-deadline", required_argument, NULL, OPT_FRAME_DEADLINE},
      {"allow-uid", required_argument, NULL, OPT_ALLOWUID},
      {"allow-gid", required_argument, NULL, OPT_ALLOWGID},
      {"tune", required_argument, NULL, OPT_TUNE},
      {"no-tune", no_argument, NULL, OPT_NOTUNE},
      {"tuner-worker", required_argument, NULL, OPT_TUNER},
      {"tune-deadline", required_argument, NULL, OPT_TUNEDL},
      {"tune-only", required_argument, NULL, OPT_TUNEONLY},
      {"foreground", no_argument, NULL, OPT_FOREGROUND},
      {"system", no_argument, NULL, OPT_SYSTEM},
      {"config", required_argument, NULL, OPT_CONFIG},
      {"remote", required_argument, NULL, OPT_REMOTE},
      {"remote-secret-file", required_argument, NULL, OPT_REMOTE_SECRET},
      {"exit-when-idle", required_argument, NULL, OPT_EXIT_WHEN_IDLE},
      {"help", no_argument, NULL, OPT_HELP},
      {"version", no_argument, NULL, OPT_VERSION},
      {NULL, 0, NULL, 0},
  };
  static fm_config cfg; /* large (paths): not on the stack */
  setting *settings = calloc((size_t)argc + 1, sizeof *settings);
  size_t n_settings = 0;
  const char *config_file = NULL;
  int foreground = 0, system_mode = 0, opt, status = 1;
  fm_diag d = {{0}};

  /* A client that hangs up must cost us an EPIPE, not the process. */
  signal(SIGPIPE, SIG_IGN);
  if (!settings) {
    fprintf(stderr, "fusemld: out of memory\n");
    return 1;
  }
  opterr = 0; /* one line of our own below, not getopt's and then the whole usage */
  while ((opt = getopt_long(argc, argv, ":", longopts, NULL)) != -1) {
    switch (opt) {
      case OPT_FOREGROUND:
        foreground = 1;
        break;
      case OPT_SYSTEM:
        system_mode = 1;
        break;
      case OPT_CONFIG:
        config_file = optarg;
        break;
      case OPT_HELP:
        usage(stdout);
        status = 0;
        goto out;
      case OPT_VERSION:
        printf("fusemld %s (protocol %d)\n", FM_VERSION_STRING, FM_PROTO_VERSION);
        status = 0;
        goto out;
      case ':':
      case '?':
        fprintf(stderr, "fusemld: %s '%s'; see `fusemld --help`\n",
                opt == ':' ? "missing argument for" : "unknown option", argv[optind - 1]);
        status = 2;
        goto out;
      default:
        for (const struct option *o = longopts; o->name; o++)
          if (o->val == opt) settings[n_settings++] = (setting){o->name, optarg};
        break;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "fusemld: unexpected argument '%s'; see `fusemld --help`\n", argv[optind]);
    status = 2;
    goto out;
  }

  fm_config_defaults(&cfg);
  cfg.system_mode = system_mode;
  cfg.foreground = foreground;
  /* The file first, then the flags over it. An explicit --config must exist; the default one
   * is optional. */
  char default_conf[FM_CONFIG_PATH_MAX];
  if (config_file) {
    if (fm_config_load_file(&cfg, config_file, 1, &d)) goto fail;
  } else if (fm_config_default_path(system_mode, default_conf, sizeof default_conf, &d) == FM_OK) {
    if (fm_config_load_file(&cfg, default_conf, 0, &d)) goto fail;
  }
  /* FUSEML_SOCKET, which the clients read: over the file, under --socket, so that one variable
   * points the daemon and its clients at the same socket. */
  const char *env_socket = getenv("FUSEML_SOCKET");
  fm_diag env_why = {{0}};
  if (env_socket && env_socket[0] && fm_config_set(&cfg, "socket", env_socket, &env_why)) {
    fm_diag_set(&d, FM_EINVAL, "FUSEML_SOCKET: %s", env_why.text);
    goto fail;
  }
  for (size_t i = 0; i < n_settings; i++) {
    fm_diag why = {{0}};
    if (fm_config_set(&cfg, settings[i].key, settings[i].value, &why)) {
      fm_diag_set(&d, FM_EINVAL, "--%s", why.text);
      goto fail;
    }
  }
  if (fm_config_finish(&cfg, &d)) goto fail;
  if (!cfg.foreground && !fm_sd_under_systemd() && !cfg.log_file[0]) {
    /* In the background there is no terminal: log beside the database unless told otherwise. */
    const char *slash = strrchr(cfg.db_path, '/');
    int dir_len = slash ? (int)(slash - cfg.db_path) : 1;
    const char *dir = slash ? cfg.db_path : ".";
    if (snprintf(cfg.log_file, sizeof cfg.log_file, "%.*s/fusemld.log", dir_len, dir) >= (int)sizeof cfg.log_file)
      cfg.log_file[0] = '\0'; /* too long to say: stay silent rather than log to a truncated path */
  }
  if (fm_log_open(cfg.log_level, cfg.log_file, &d)) goto fail;
  for (size_t i = 0; i < n_settings; i++)
    if (strcmp(settings[i].key, "remote") == 0) warn_password_in_argv(settings[i].value);

  /* libuv reads this when its pool first starts (the first compile), never again. */
  char jobs[16];
  snprintf(jobs, sizeof jobs, "%u", cfg.jobs);
  setenv("UV_THREADPOOL_SIZE", jobs, 1);

  int ready_fd = -1;
  if (!cfg.foreground && !fm_sd_under_systemd()) {
    /* Fork before any thread or event loop exists; the parent returns once we serve. */
    int r = fm_detach_start(&ready_fd, &status, &d);
    if (r < 0) goto fail;
    if (r == 1) goto out;
  }
  status = fm_daemon_run(&cfg, ready_fd, &d);
  if (status != 0) goto fail;
  goto out;

fail:
  if (status == 0) status = 1;
  fm_log_error("%s", d.text[0] ? d.text : "startup failed");
  /* Before the log is open (or when it is a file) the terminal still deserves the reason. */
  if (fm_log_fd() >= 0 || !d.text[0]) fprintf(stderr, "fusemld: %s\n", d.text[0] ? d.text : "startup failed");
out:
  fm_log_close();
  free(settings);
  return status;
}
