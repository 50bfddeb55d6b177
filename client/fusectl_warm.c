/* fusectl_warm.c: warm: compile every fragment a manifest lists, so that a node's cache is
 * filled before the first job asks. Several requests are kept in flight (--jobs, by default
 * the daemon's compile workers), each on its own connection, so that warming uses every
 * compile worker instead of taking the sum of single compiles; results keep the manifest's
 * order. */
#include "fusectl.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fm_msg.h"

#define FM_CTL_WARM_MAX_JOBS     64
#define FM_CTL_WARM_DEFAULT_JOBS 4 /* when the daemon does not say how many workers it has */

typedef struct fm_ctl_warm_item {
  char *path; /* resolved against the manifest's folder */
  char key[FM_KEY_HEX];
  char origin[16];
  char error[sizeof(fm_diag) + 32]; /* "slug: message: detail"; "" when it succeeded */
  int bad_input;                    /* error: the file, not the daemon */
} fm_ctl_warm_item;

/* Reads the manifest: one path per line; blank lines and lines starting with '#' (after
 * leading blanks) are skipped; relative paths are relative to the manifest's folder, so a
 * manifest works from any working directory. */
static int fm_ctl_read_manifest(const char *manifest, fm_ctl_warm_item **items, size_t *n, fm_diag *d) {
  FILE *f;
  char *text = NULL, *line, *save = NULL, *dir = NULL, *slash;
  size_t len, cap = 0;
  int err = FM_OK;

  *items = NULL;
  *n = 0;
  f = fopen(manifest, "rb");
  if (!f) return fm_diag_set(d, FM_EIO, "cannot open %s: %s", manifest, strerror(errno));
  text = malloc(FM_CTL_JSON_MAX_FILE + 1);
  dir = strdup(manifest);
  if (!text || !dir) {
    err = fm_diag_set(d, FM_ENOMEM, "out of memory");
    goto out;
  }
  len = fread(text, 1, FM_CTL_JSON_MAX_FILE, f);
  if (ferror(f)) {
    err = fm_diag_set(d, FM_EIO, "cannot read %s: %s", manifest, strerror(errno));
    goto out;
  }
  if (len == FM_CTL_JSON_MAX_FILE && fgetc(f) != EOF) {
    err = fm_diag_set(d, FM_ELIMIT, "%s is larger than 1 MiB", manifest);
    goto out;
  }
  text[len] = '\0';
  slash = strrchr(dir, '/');
  if (slash)
    slash[slash == dir ? 1 : 0] = '\0'; /* keep "/" for a manifest at the root */
  else
    strcpy(dir, ".");

  for (line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
    char *end;
    fm_ctl_warm_item *it;
    while (*line == ' ' || *line == '\t') line++;
    end = line + strlen(line);
    while (end > line && (end[-1] == ' ' || end[-1] == '\t' || end[-1] == '\r')) *--end = '\0';
    if (*line == '\0' || *line == '#') continue;
    if (*n == cap) {
      size_t ncap = cap ? 2 * cap : 16;
      fm_ctl_warm_item *grown = realloc(*items, ncap * sizeof *grown);
      if (!grown) {
        err = fm_diag_set(d, FM_ENOMEM, "out of memory");
        goto out;
      }
      *items = grown;
      cap = ncap;
    }
    it = &(*items)[*n];
    memset(it, 0, sizeof *it);
    if (line[0] == '/') {
      it->path = strdup(line);
    } else {
      size_t plen = strlen(dir) + 1 + strlen(line) + 1;
      it->path = malloc(plen);
      if (it->path) snprintf(it->path, plen, "%s/%s", dir, line);
    }
    if (!it->path) {
      err = fm_diag_set(d, FM_ENOMEM, "out of memory");
      goto out;
    }
    (*n)++;
  }
  if (*n == 0) err = fm_diag_set(d, FM_ESCHEMA, "%s lists no fragments", manifest);

out:
  free(text);
  free(dir);
  fclose(f);
  return err;
}

static void fm_ctl_progress(size_t done, size_t total, const char *path) {
  enum { W = 30 };
  const char *base = strrchr(path, '/');
  size_t fill = total ? done * W / total : W;
  base = base ? base + 1 : path;
  fprintf(stderr, "\r\033[K[");
  for (size_t i = 0; i < W; i++) fputc(i < fill ? '#' : '.', stderr);
  fprintf(stderr, "] %zu/%zu %.40s", done, total, base);
  fflush(stderr);
}

static void fm_ctl_warm_json(fm_ctl *ctl, const fm_ctl_warm_item *items, size_t n, size_t compiled, size_t hits,
                             size_t failed) {
  msgpack_sbuffer sb;
  msgpack_packer pk;
  msgpack_sbuffer_init(&sb);
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, 4);
  fm_pack_kv_u64(&pk, "compiled", compiled);
  fm_pack_kv_u64(&pk, "hits", hits);
  fm_pack_kv_u64(&pk, "failed", failed);
  fm_pack_cstr(&pk, "results");
  msgpack_pack_array(&pk, n);
  for (size_t i = 0; i < n; i++) {
    const fm_ctl_warm_item *it = &items[i];
    if (it->error[0]) {
      msgpack_pack_map(&pk, 2);
      fm_pack_kv_cstr(&pk, "path", it->path);
      fm_pack_kv_cstr(&pk, "error", it->error);
    } else {
      msgpack_pack_map(&pk, 3);
      fm_pack_kv_cstr(&pk, "path", it->path);
      fm_pack_kv_cstr(&pk, "key", it->key);
      fm_pack_kv_cstr(&pk, "origin", it->origin);
    }
  }
  fm_ctl_print_packed(ctl, &sb, 2);
}

/* One warm run, shared by its workers under mu. */
typedef struct fm_ctl_warm_run {
  fm_ctl_warm_item *items;
  size_t n, next, done;
  size_t compiled, hits, failed, bad_input;
  int tty;
  int lost_err; /* a connection lost (the daemon gone or hung): no more sent */
  fm_diag lost_diag;
  const char *lost_path;
  pthread_mutex_t mu;
} fm_ctl_warm_run;

typedef struct fm_ctl_warm_worker {
  fm_ctl_warm_run *run;
  fm_client *client;
  pthread_t thread;
} fm_ctl_warm_worker;

/* Compiles one item on client: 0, or a transport error (with d) that ends the run. The item's
 * own failure (bad file, the daemon's refusal) is kept in it->error. */
static int fm_ctl_warm_one(fm_ctl_warm_run *run, fm_client *client, fm_ctl_warm_item *it, fm_diag *d) {
  msgpack_sbuffer sb;
  msgpack_zone zone;
  msgpack_object reply;
  fm_ctl_compile_req req = {0};
  int err, lost = 0;

  msgpack_sbuffer_init(&sb);
  msgpack_zone_init(&zone, 4096);
  /* The JSON reader is not assumed thread-safe: files are read one at a time. */
  pthread_mutex_lock(&run->mu);
  err = fm_ctl_load_fragment(it->path, &sb, d);
  pthread_mutex_unlock(&run->mu);
  if (err) {
    snprintf(it->error, sizeof it->error, "%s", d->text);
    it->bad_input = 1;
  } else {
    req.fragment = sb.data;
    req.len = sb.size;
    reply.type = MSGPACK_OBJECT_NIL;
    err = fm_client_call(client, "compile", 1, fm_ctl_pack_compile, &req, &zone, &reply, d);
    if (err == FM_OK) {
      fm_ctl_fmt_scalar(fm_msg_get(&reply, "key"), it->key, sizeof it->key);
      fm_ctl_fmt_scalar(fm_msg_get(&reply, "origin"), it->origin, sizeof it->origin);
    } else if (reply.type == MSGPACK_OBJECT_MAP) {
      snprintf(it->error, sizeof it->error, "%s: %s", fm_err_slug(err), d->text);
    } else {
      lost = err;
    }
  }
  msgpack_zone_destroy(&zone);
  msgpack_sbuffer_destroy(&sb);
  return lost;
}

static void *fm_ctl_warm_worker_main(void *arg) {
  fm_ctl_warm_worker *w = arg;
  fm_ctl_warm_run *run = w->run;
  for (;;) {
    fm_diag d = {{0}};
    pthread_mutex_lock(&run->mu);
    if (run->lost_err || run->next == run->n) {
      pthread_mutex_unlock(&run->mu);
      return NULL;
    }
    fm_ctl_warm_item *it = &run->items[run->next++];
    pthread_mutex_unlock(&run->mu);

    int lost = fm_ctl_warm_one(run, w->client, it, &d);

    pthread_mutex_lock(&run->mu);
    if (lost) {
      /* The daemon is gone or hung: the rest would fail the same way. */
      if (!run->lost_err) {
        run->lost_err = lost;
        run->lost_diag = d;
        run->lost_path = it->path;
      }
      pthread_mutex_unlock(&run->mu);
      return NULL;
    }
    run->done++;
    if (it->error[0]) {
      run->failed++;
      if (it->bad_input) run->bad_input++;
      if (run->tty) fputs("\r\033[K", stderr);
      if (!strstr(it->error, it->path))
        fprintf(stderr, "fusectl: %s: %s\n", it->path, it->error);
      else
        fprintf(stderr, "fusectl: %s\n", it->error);
    } else if (strcmp(it->origin, "hit") == 0) {
      run->hits++;
    } else {
      run->compiled++;
    }
    if (run->tty) fm_ctl_progress(run->done, run->n, it->path);
    pthread_mutex_unlock(&run->mu);
  }
}

/* The daemon's compile workers (stats "jobs"), else FM_CTL_WARM_DEFAULT_JOBS. */
static unsigned fm_ctl_daemon_jobs(fm_ctl *ctl) {
  msgpack_zone zone;
  msgpack_object reply;
  fm_diag d = {{0}};
  uint64_t jobs = 0;
  msgpack_zone_init(&zone, 4096);
  if (fm_client_call(ctl->client, "stats", 0, NULL, NULL, &zone, &reply, &d) != FM_OK ||
      fm_msg_get_u64(&reply, "jobs", &jobs, NULL) != FM_OK || jobs == 0)
    jobs = FM_CTL_WARM_DEFAULT_JOBS;
  msgpack_zone_destroy(&zone);
  return jobs > FM_CTL_WARM_MAX_JOBS ? FM_CTL_WARM_MAX_JOBS : (unsigned)jobs;
}

int fm_ctl_cmd_warm(fm_ctl *ctl, int argc, char **argv) {
  static const struct option lo[] = {
      {"json", no_argument, NULL, 'j'}, {"jobs", required_argument, NULL, 'J'}, {NULL, 0, NULL, 0}};
  fm_ctl_warm_run run = {.tty = isatty(STDERR_FILENO)};
  fm_ctl_warm_worker workers[FM_CTL_WARM_MAX_JOBS];
  unsigned jobs = 0, started = 0;
  int c, rc;
  fm_diag d = {{0}};

  optind = 0;
  while ((c = getopt_long(argc, argv, ":j", lo, NULL)) != -1) {
    char *end;
    unsigned long v;
    switch (c) {
      case 'j':
        ctl->json = 1;
        break;
      case 'J':
        errno = 0;
        v = strtoul(optarg, &end, 10);
        if (errno || end == optarg || *end || optarg[0] == '-' || v == 0 || v > FM_CTL_WARM_MAX_JOBS)
          return fm_ctl_usage_error(ctl, "--jobs wants 1 to %d, got '%s'", FM_CTL_WARM_MAX_JOBS, optarg);
        jobs = (unsigned)v;
        break;
      default:
        return fm_ctl_bad_option(ctl, c, argv);
    }
  }
  if (argc - optind != 1) return fm_ctl_usage_error(ctl, "warm wants one MANIFEST");
  if (fm_ctl_read_manifest(argv[optind], &run.items, &run.n, &d) != FM_OK) {
    rc = fm_ctl_error(ctl, FM_CTL_EXIT_INPUT, NULL, "%s", d.text);
    goto out;
  }
  rc = fm_ctl_connect(ctl);
  if (rc) goto out;
  if (!jobs) jobs = fm_ctl_daemon_jobs(ctl);
  if (jobs > run.n) jobs = (unsigned)run.n;
  pthread_mutex_init(&run.mu, NULL);

  /* The first worker uses the connection already made; the others make their own. One that
   * cannot (the daemon is at its client limit, say) only means fewer in flight. */
  workers[0] = (fm_ctl_warm_worker){.run = &run, .client = ctl->client};
  for (unsigned i = 1; i < jobs; i++) {
    fm_diag cd = {{0}};
    workers[i] = (fm_ctl_warm_worker){.run = &run};
    if (fm_client_connect(ctl->socket_path, "fusectl", ctl->timeout_ms, &workers[i].client, &cd) != FM_OK) {
      jobs = i;
      break;
    }
  }
  if (run.tty) fm_ctl_progress(0, run.n, run.items[0].path);
  for (started = 0; started < jobs; started++)
    if (pthread_create(&workers[started].thread, NULL, fm_ctl_warm_worker_main, &workers[started]) != 0) break;
  if (started == 0) fm_ctl_warm_worker_main(&workers[0]); /* no thread to be had: this one works */
  for (unsigned i = 0; i < started; i++) pthread_join(workers[i].thread, NULL);
  for (unsigned i = 1; i < jobs; i++) fm_client_close(workers[i].client);
  pthread_mutex_destroy(&run.mu);
  if (run.tty) fputs("\r\033[K", stderr);

  if (run.lost_err) {
    rc = fm_ctl_report(ctl, run.lost_path, run.lost_err, NULL, &run.lost_diag);
    goto out;
  }
  if (ctl->json)
    fm_ctl_warm_json(ctl, run.items, run.n, run.compiled, run.hits, run.failed);
  else
    printf("%zu compiled, %zu hits, %zu failed\n", run.compiled, run.hits, run.failed);
  /* A refusal by the daemon outranks unreadable files in the exit status. */
  if (run.failed > run.bad_input)
    rc = FM_CTL_EXIT_DAEMON;
  else if (run.bad_input)
    rc = FM_CTL_EXIT_INPUT;
  else
    rc = FM_CTL_EXIT_OK;

out:
  for (size_t i = 0; i < run.n; i++) free(run.items[i].path);
  free(run.items);
  return rc;
}
