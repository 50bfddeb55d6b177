/* fm_config.c: settings from defaults, a `key = value` file and the command line. */
#include "fm_config.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fm_codegen.h"
#include "fm_paths.h"

static const char *const tune_mode_names[] = {
#define FM_TUNE_NAME_(name, str) [FM_TUNE_##name] = str,
    FM_TUNE_MODE_MAP(FM_TUNE_NAME_)
#undef FM_TUNE_NAME_
};

const char *fm_tune_mode_name(fm_tune_mode m) {
  return (unsigned)m < sizeof tune_mode_names / sizeof tune_mode_names[0] ? tune_mode_names[m] : "unknown";
}

void fm_config_defaults(fm_config *c) {
  memset(c, 0, sizeof *c);
  c->cache_size = FM_CONFIG_DEFAULT_CACHE_SIZE;
  c->log_level = FM_LOG_INFO;
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  c->jobs = ncpu > 0 ? (uint32_t)(ncpu > 1024 ? 1024 : ncpu) : 1;
  c->compile_deadline_s = FM_CONFIG_DEFAULT_COMPILE_DEADLINE;
  c->compile_memory = FM_CONFIG_DEFAULT_COMPILE_MEMORY;
  c->max_client_compiles = FM_CONFIG_DEFAULT_MAX_CLIENT_COMPILES;
  c->max_compile_cost = FM_CODEGEN_MAX_COST;
  snprintf(c->arch, sizeof c->arch, "%s", FM_CONFIG_DEFAULT_ARCH);
  c->max_clients = FM_CONFIG_DEFAULT_MAX_CLIENTS;
  c->idle_timeout_s = FM_CONFIG_DEFAULT_IDLE_TIMEOUT;
  c->tune_deadline_s = 5;
  /* The first step of a job waits for one verified candidate per fragment, not 33 timed ones
   * (a Llama's first step: 64 s eager); the tuned kernels replace them as they come. */
  c->tune = FM_TUNE_BACKGROUND;
  c->max_output = FM_CONFIG_DEFAULT_MAX_OUTPUT;
  c->max_output_total = FM_CONFIG_DEFAULT_MAX_OUTPUT_TOTAL;
  c->frame_deadline_s = FM_CONFIG_DEFAULT_FRAME_DEADLINE;
}

int fm_config_parse_size(const char *s, uint64_t *out) {
  if (!s || !isdigit((unsigned char)*s)) return FM_EINVAL;
  errno = 0;
  char *end;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno) return FM_EINVAL;
  unsigned shift = 0;
  switch (toupper((unsigned char)*end)) {
    case 'K':
      shift = 10;
      end++;
      break;
    case 'M':
      shift = 20;
      end++;
      break;
    case 'G':
      shift = 30;
      end++;
      break;
    case 'T':
      shift = 40;
      end++;
      break;
    default:
      break;
  }
  /* Accept "G", "GB" and "GiB" alike: all mean binary multiples here. */
  if (shift && (end[0] == 'i' || end[0] == 'I') && (end[1] == 'B' || end[1] == 'b'))
    end += 2;
  else if (shift && (*end == 'B' || *end == 'b'))
    end++;
  if (*end) return FM_EINVAL;
  if (shift && v > (UINT64_MAX >> shift)) return FM_EINVAL;
  *out = (uint64_t)v << shift;
  return FM_OK;
}

static int parse_u32(const char *s, uint32_t lo, uint32_t hi, uint32_t *out) {
  if (!s || !isdigit((unsigned char)*s)) return FM_EINVAL;
  errno = 0;
  char *end;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || *end || v < lo || v > hi) return FM_EINVAL;
  *out = (uint32_t)v;
  return FM_OK;
}

/* "1000,1001" appended to ids (at most FM_CONFIG_MAX_ALLOW in all). Ids are numeric: a name
 * would need NSS lookups in the daemon, and a name that fails to resolve must not widen access. */
static int add_id_list(uint32_t *ids, uint32_t *n, const char *key, const char *value, fm_diag *d) {
  const char *p = value ? value : "";
  if (!*p) return fm_diag_set(d, FM_EINVAL, "%s: empty list", key);
  while (*p) {
    char item[24];
    size_t len = strcspn(p, ",");
    uint32_t id;
    if (len == 0 || len >= sizeof item)
      return fm_diag_set(d, FM_EINVAL, "%s: \"%s\" is not a comma-separated list of numeric ids", key, value);
    memcpy(item, p, len);
    item[len] = '\0';
    if (parse_u32(item, 0, UINT32_MAX - 1, &id))
      return fm_diag_set(d, FM_EINVAL, "%s: \"%s\" is not a numeric id", key, item);
    if (*n >= FM_CONFIG_MAX_ALLOW) return fm_diag_set(d, FM_EINVAL, "%s: more than %d ids", key, FM_CONFIG_MAX_ALLOW);
    ids[(*n)++] = id;
    p += len;
    if (*p == ',') {
      p++;
      if (!*p) return fm_diag_set(d, FM_EINVAL, "%s: \"%s\" ends with a comma", key, value);
    }
  }
  return FM_OK;
}

/* Seconds, 0 < s <= 3600 (fractions allowed: tests use short deadlines). */
static int parse_seconds(const char *value, double *out) {
  char *end = NULL;
  errno = 0;
  double v = value ? strtod(value, &end) : 0;
  if (!value || end == value || *end || errno || !(v > 0 && v <= 3600)) return FM_EINVAL;
  *out = v;
  return FM_OK;
}

static int set_path(char *dst, const char *key, const char *value, fm_diag *d) {
  size_t n = strlen(value);
  if (n == 0) return fm_diag_set(d, FM_EINVAL, "%s: empty path", key);
  if (n >= FM_CONFIG_PATH_MAX) return fm_diag_set(d, FM_EINVAL, "%s: path too long", key);
  memcpy(dst, value, n + 1);
  return FM_OK;
}

int fm_config_set(fm_config *c, const char *key, const char *value, fm_diag *d) {
  if (strcmp(key, "socket") == 0) return set_path(c->socket_path, key, value, d);
  if (strcmp(key, "db") == 0) return set_path(c->db_path, key, value, d);
  if (strcmp(key, "log-file") == 0) return set_path(c->log_file, key, value, d);
  if (strcmp(key, "cache-size") == 0) {
    if (fm_config_parse_size(value, &c->cache_size))
      return fm_diag_set(d, FM_EINVAL, "cache-size: \"%s\" is not a size (bytes, or with K/M/G/T)", value);
    return FM_OK;
  }
  if (strcmp(key, "log-level") == 0) {
    if (fm_log_parse_level(value, &c->log_level))
      return fm_diag_set(d, FM_EINVAL, "log-level: \"%s\" is not one of error, warn, info, debug", value);
    return FM_OK;
  }
  if (strcmp(key, "jobs") == 0) {
    /* libuv's pool holds at most 1024 threads. */
    if (parse_u32(value, 1, 1024, &c->jobs))
      return fm_diag_set(d, FM_EINVAL, "jobs: \"%s\" is not a number from 1 to 1024", value);
    return FM_OK;
  }
  if (strcmp(key, "compile-worker") == 0) return set_path(c->compile_worker, key, value, d);
  if (strcmp(key, "compile-deadline") == 0) {
    if (parse_seconds(value, &c->compile_deadline_s))
      return fm_diag_set(d, FM_EINVAL, "compile-deadline: \"%s\" is not a number of seconds (0 < s <= 3600)",
                         value ? value : "");
    return FM_OK;
  }
  if (strcmp(key, "compile-memory") == 0) {
    /* 0 means unbounded; below 16M not even a small compile fits. */
    if (fm_config_parse_size(value, &c->compile_memory) || (c->compile_memory && c->compile_memory < (16u << 20)))
      return fm_diag_set(d, FM_EINVAL, "compile-memory: \"%s\" is not 0 or a size of at least 16M", value);
    return FM_OK;
  }
  if (strcmp(key, "max-client-compiles") == 0) {
    if (parse_u32(value, 1, 1000000, &c->max_client_compiles))
      return fm_diag_set(d, FM_EINVAL, "max-client-compiles: \"%s\" is not a number from 1 to 1000000", value);
    return FM_OK;
  }
  if (strcmp(key, "max-compile-cost") == 0) {
    if (parse_u32(value, 1, 100000000, &c->max_compile_cost))
      return fm_diag_set(d, FM_EINVAL, "max-compile-cost: \"%s\" is not a number from 1 to 100000000", value);
    return FM_OK;
  }
  if (strcmp(key, "arch") == 0) {
    size_t n = strlen(value);
    if (n < 4 || n >= sizeof c->arch || strncmp(value, "sm_", 3) != 0)
      return fm_diag_set(d, FM_EINVAL, "arch: \"%s\" is not an architecture like sm_90a", value);
    memcpy(c->arch, value, n + 1);
    return FM_OK;
  }
  if (strcmp(key, "max-clients") == 0) {
    if (parse_u32(value, 1, 1000000, &c->max_clients))
      return fm_diag_set(d, FM_EINVAL, "max-clients: \"%s\" is not a number from 1 to 1000000", value);
    return FM_OK;
  }
  if (strcmp(key, "idle-timeout") == 0) {
    if (parse_u32(value, 0, 7 * 86400, &c->idle_timeout_s))
      return fm_diag_set(d, FM_EINVAL, "idle-timeout: \"%s\" is not a number of seconds (0 to 604800)", value);
    return FM_OK;
  }
  if (strcmp(key, "max-output") == 0) {
    /* Below 64K even one ordinary reply would cut a client off. */
    if (fm_config_parse_size(value, &c->max_output) || c->max_output < (64u << 10))
      return fm_diag_set(d, FM_EINVAL, "max-output: \"%s\" is not a size of at least 64K", value);
    return FM_OK;
  }
  if (strcmp(key, "max-output-total") == 0) {
    if (fm_config_parse_size(value, &c->max_output_total) || c->max_output_total < (64u << 10))
      return fm_diag_set(d, FM_EINVAL, "max-output-total: \"%s\" is not a size of at least 64K", value);
    return FM_OK;
  }
  if (strcmp(key, "frame-deadline") == 0) {
    if (parse_u32(value, 1, 3600, &c->frame_deadline_s))
      return fm_diag_set(d, FM_EINVAL, "frame-deadline: \"%s\" is not a number of seconds (1 to 3600)", value);
    return FM_OK;
  }
  if (strcmp(key, "allow-uid") == 0) return add_id_list(c->allow_uids, &c->n_allow_uids, key, value, d);
  if (strcmp(key, "allow-gid") == 0) return add_id_list(c->allow_gids, &c->n_allow_gids, key, value, d);
  if (strcmp(key, "tuner-worker") == 0) return set_path(c->tuner_worker, key, value, d);
  if (strcmp(key, "remote") == 0) return set_path(c->remote, key, value, d);
  if (strcmp(key, "remote-secret-file") == 0) return set_path(c->remote_secret_file, key, value, d);
  if (strcmp(key, "tune") == 0) {
    for (size_t m = 0; value && m < sizeof tune_mode_names / sizeof tune_mode_names[0]; m++) {
      if (strcmp(value, tune_mode_names[m]) == 0) {
        c->tune = (fm_tune_mode)m;
        return FM_OK;
      }
    }
    return fm_diag_set(d, FM_EINVAL, "tune: \"%s\" is not one of eager, background, off", value ? value : "");
  }
  if (strcmp(key, "no-tune") == 0) {
    /* A flag on the command line (no value), yes/no in the file: the older spelling of
     * tune = off ("no" takes the default back, unless another mode was chosen). */
    if (!value || !*value || strcmp(value, "yes") == 0 || strcmp(value, "true") == 0 || strcmp(value, "1") == 0)
      c->tune = FM_TUNE_OFF;
    else if (strcmp(value, "no") == 0 || strcmp(value, "false") == 0 || strcmp(value, "0") == 0)
      c->tune = c->tune == FM_TUNE_OFF ? FM_TUNE_BACKGROUND : c->tune;
    else
      return fm_diag_set(d, FM_EINVAL, "no-tune: \"%s\" is not yes or no", value);
    return FM_OK;
  }
  if (strcmp(key, "tune-deadline") == 0) {
    if (parse_seconds(value, &c->tune_deadline_s))
      return fm_diag_set(d, FM_EINVAL, "tune-deadline: \"%s\" is not a number of seconds (0 < s <= 3600)",
                         value ? value : "");
    return FM_OK;
  }
  if (strcmp(key, "tune-only") == 0) {
    if (!value || !value[0] || strlen(value) >= sizeof c->tune_only)
      return fm_diag_set(d, FM_EINVAL, "tune-only: \"%s\" is not 1..%zu characters", value ? value : "",
                         sizeof c->tune_only - 1);
    snprintf(c->tune_only, sizeof c->tune_only, "%s", value);
    return FM_OK;
  }
  if (strcmp(key, "exit-when-idle") == 0) {
    if (parse_u32(value, 0, 7 * 86400, &c->exit_when_idle_s))
      return fm_diag_set(d, FM_EINVAL, "exit-when-idle: \"%s\" is not a number of seconds (0 to 604800)",
                         value ? value : "");
    return FM_OK;
  }
  return fm_diag_set(d, FM_EINVAL, "unknown setting \"%s\"", key);
}

static char *trim(char *s) {
  while (isspace((unsigned char)*s)) s++;
  size_t n = strlen(s);
  while (n > 0 && isspace((unsigned char)s[n - 1])) s[--n] = '\0';
  return s;
}

/* Cuts a comment: '#' at the start or after whitespace (a path like /a#b keeps its '#'). */
static void cut_comment(char *s) {
  for (char *p = s; *p; p++) {
    if (*p == '#' && (p == s || isspace((unsigned char)p[-1]))) {
      *p = '\0';
      return;
    }
  }
}

int fm_config_load_file(fm_config *c, const char *path, int must_exist, fm_diag *d) {
  int err = FM_OK;
  unsigned lineno = 0;
  char line[FM_CONFIG_PATH_MAX + 64];
  FILE *f = fopen(path, "r");
  if (!f) {
    if (errno == ENOENT && !must_exist) return FM_OK;
    return fm_diag_set(d, FM_EIO, "cannot read config file %s: %s", path, strerror(errno));
  }
  while (fgets(line, sizeof line, f)) {
    lineno++;
    size_t n = strlen(line);
    if (n == sizeof line - 1 && line[n - 1] != '\n' && !feof(f)) {
      err = fm_diag_set(d, FM_EINVAL, "%s:%u: line too long", path, lineno);
      goto out;
    }
    cut_comment(line);
    char *s = trim(line);
    if (!*s) continue;
    char *eq = strchr(s, '=');
    if (!eq) {
      err = fm_diag_set(d, FM_EINVAL, "%s:%u: expected \"key = value\", got \"%s\"", path, lineno, s);
      goto out;
    }
    *eq = '\0';
    char *key = trim(s), *value = trim(eq + 1);
    fm_diag why = {{0}};
    if (fm_config_set(c, key, value, &why)) {
      err = fm_diag_set(d, FM_EINVAL, "%s:%u: %s", path, lineno, why.text);
      goto out;
    }
  }
  if (ferror(f)) err = fm_diag_set(d, FM_EIO, "error reading config file %s", path);
out:
  if (!err) snprintf(c->config_path, sizeof c->config_path, "%s", path);
  fclose(f);
  return err;
}

int fm_config_default_path(int system_mode, char *out, size_t cap, fm_diag *d) {
  if (system_mode) {
    if ((size_t)snprintf(out, cap, "%s", FM_SYSTEM_CONFIG) >= cap)
      return fm_diag_set(d, FM_ELIMIT, "config path too long");
    return FM_OK;
  }
  return fm_default_config_path(out, cap, d);
}

/* Creates the parent directory of path (mode) if missing. */
static int make_parent(const char *path, int mode, fm_diag *d) {
  char dir[FM_CONFIG_PATH_MAX];
  snprintf(dir, sizeof dir, "%s", path);
  char *slash = strrchr(dir, '/');
  if (!slash || slash == dir) return FM_OK; /* relative name in cwd, or under "/" */
  *slash = '\0';
  return fm_mkdirs(dir, mode, d);
}

int fm_config_finish(fm_config *c, fm_diag *d) {
  int err;
  /* System mode: the group may reach the socket (0660), so its directory must be searchable;
   * per-user everything stays private. */
  int dir_mode = c->system_mode ? 0755 : 0700;
  if (!c->socket_path[0]) {
    if (c->system_mode)
      snprintf(c->socket_path, sizeof c->socket_path, "%s", FM_SYSTEM_SOCKET);
    else if ((err = fm_default_socket_path(c->socket_path, sizeof c->socket_path, 0, 1, d)))
      return err;
  }
  if (!c->db_path[0]) {
    if (c->system_mode)
      snprintf(c->db_path, sizeof c->db_path, "%s", FM_SYSTEM_DB);
    else if ((err = fm_default_db_path(c->db_path, sizeof c->db_path, 1, d)))
      return err;
  }
  if ((err = make_parent(c->socket_path, dir_mode, d))) return err;
  if ((err = make_parent(c->db_path, c->system_mode ? 0750 : 0700, d))) return err;
  if (c->log_file[0] && (err = make_parent(c->log_file, dir_mode, d))) return err;
  return FM_OK;
}
