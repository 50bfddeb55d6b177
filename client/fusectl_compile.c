/* fusectl_compile.c: compile (one fragment file) and warm (every fragment in a manifest, so
 * a node's cache is filled before the first job asks). */
#include "fusectl.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fm_msg.h"

typedef struct fm_ctl_compile_req {
  const char *fragment;        /* msgpack map */
  size_t len;
  const char *arch;            /* NULL: the daemon's own */
} fm_ctl_compile_req;

static void fm_ctl_pack_compile(msgpack_packer *pk, void *ctx) {
  const fm_ctl_compile_req *r = ctx;
  fm_pack_cstr(pk, "fragment");
  pk->callback(pk->data, r->fragment, r->len);  /* already msgpack */
  if (r->arch) fm_pack_kv_cstr(pk, "arch", r->arch);
}

/* Reads a fragment file into sb (msgpack). FM_EIO/FM_ELIMIT/FM_EMALFORMED from the reader,
 * FM_ESCHEMA when the document is not an object. */
static int fm_ctl_load_fragment(const char *path, msgpack_sbuffer *sb, fm_diag *d) {
  int err = fm_ctl_json_file_to_msgpack(path, sb, d);
  if (err) return err;
  /* A JSON object always becomes a map header: fixmap, map16 or map32. */
  if (sb->size == 0 || !(((uint8_t)sb->data[0] & 0xf0) == 0x80 || (uint8_t)sb->data[0] == 0xde ||
                         (uint8_t)sb->data[0] == 0xdf))
    return fm_diag_set(d, FM_ESCHEMA, "%s: a fragment must be a JSON object", path);
  return FM_OK;
}

/* ---- compile ---- */

int fm_ctl_cmd_compile(fm_ctl *ctl, int argc, char **argv) {
  static const struct option lo[] = {
    {"json", no_argument, NULL, 'j'}, {"arch", required_argument, NULL, 'a'}, {NULL, 0, NULL, 0}};
  msgpack_sbuffer sb;
  msgpack_zone zone;
  msgpack_object reply;
  fm_ctl_compile_req req = {0};
  fm_diag d = {{0}};
  const char *path;
  int c, rc;

  optind = 0;
  while ((c = getopt_long(argc, argv, ":j", lo, NULL)) != -1) {
    if (c == 'j') ctl->json = 1;
    else if (c == 'a') req.arch = optarg;
    else return fm_ctl_bad_option(ctl, c, argv);
  }
  if (argc - optind != 1) return fm_ctl_usage_error(ctl, "compile wants one FRAGMENT.json");
  path = argv[optind];

  msgpack_sbuffer_init(&sb);
  msgpack_zone_init(&zone, 4096);
  if (fm_ctl_load_fragment(path, &sb, &d) != FM_OK) {
    rc = fm_ctl_error(ctl, FM_CTL_EXIT_INPUT, NULL, "%s", d.text);
    goto out;
  }
  req.fragment = sb.data;
  req.len = sb.size;
  rc = fm_ctl_call(ctl, "compile", req.arch ? 2 : 1, fm_ctl_pack_compile, &req, &zone, &reply);
  if (rc) goto out;
  if (ctl->json) {
    fm_ctl_print_reply(ctl, &reply, 2, "cubin");  /* the CUBIN is binary: left out */
    goto out;
  }
  {
    static const char *fields[] = {"key", "origin", "state", "kind"};
    const msgpack_object *cubin = fm_msg_get(&reply, "cubin");
    char v[128];
    fm_ctl_table t;
    fm_ctl_table_init(&t, 2, 0);
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
      const char *row[2] = {fields[i], v};
      fm_ctl_fmt_scalar(fm_msg_get(&reply, fields[i]), v, sizeof v);
      fm_ctl_table_row(&t, row);
    }
    {
      const char *row[2] = {"cubin", v};
      snprintf(v, sizeof v, "%" PRIu32 " bytes",
               cubin && cubin->type == MSGPACK_OBJECT_BIN ? cubin->via.bin.size : 0);
      fm_ctl_table_row(&t, row);
    }
    fm_ctl_table_print(&t, stdout);
  }
out:
  msgpack_zone_destroy(&zone);
  msgpack_sbuffer_destroy(&sb);
  return rc;
}

/* ---- warm ---- */

typedef struct fm_ctl_warm_item {
  char *path;                  /* resolved against the manifest's folder */
  char key[FM_KEY_HEX];
  char origin[16];
  char error[sizeof(fm_diag) + 32]; /* "slug: message: detail"; "" when it succeeded */
} fm_ctl_warm_item;

/* Reads the manifest: one path per line; blank lines and lines starting with '#' (after
 * leading blanks) are skipped; relative paths are relative to the manifest's folder, so a
 * manifest works from any working directory. */
static int fm_ctl_read_manifest(const char *manifest, fm_ctl_warm_item **items, size_t *n,
                                fm_diag *d) {
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
  if (slash) slash[slash == dir ? 1 : 0] = '\0';  /* keep "/" for a manifest at the root */
  else strcpy(dir, ".");

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

static void fm_ctl_warm_json(const fm_ctl_warm_item *items, size_t n, size_t compiled,
                             size_t hits, size_t failed) {
  msgpack_sbuffer sb;
  msgpack_packer pk;
  msgpack_zone zone;
  msgpack_object obj;

  /* Built as msgpack and printed by the one JSON writer, so escaping is done in one place. */
  msgpack_sbuffer_init(&sb);
  msgpack_zone_init(&zone, 4096);
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
  if (msgpack_unpack(sb.data, sb.size, NULL, &zone, &obj) == MSGPACK_UNPACK_SUCCESS)
    fm_ctl_print_json(stdout, &obj, 2, NULL);
  msgpack_zone_destroy(&zone);
  msgpack_sbuffer_destroy(&sb);
}

int fm_ctl_cmd_warm(fm_ctl *ctl, int argc, char **argv) {
  static const struct option lo[] = {{"json", no_argument, NULL, 'j'}, {NULL, 0, NULL, 0}};
  fm_ctl_warm_item *items = NULL;
  size_t n = 0, compiled = 0, hits = 0, failed = 0, bad_input = 0;
  int tty = isatty(STDERR_FILENO), c, rc;
  fm_diag d = {{0}};

  optind = 0;
  while ((c = getopt_long(argc, argv, ":j", lo, NULL)) != -1) {
    if (c == 'j') ctl->json = 1;
    else return fm_ctl_bad_option(ctl, c, argv);
  }
  if (argc - optind != 1) return fm_ctl_usage_error(ctl, "warm wants one MANIFEST");
  if (fm_ctl_read_manifest(argv[optind], &items, &n, &d) != FM_OK) {
    rc = fm_ctl_error(ctl, FM_CTL_EXIT_INPUT, NULL, "%s", d.text);
    goto out;
  }
  rc = fm_ctl_connect(ctl);
  if (rc) goto out;

  for (size_t i = 0; i < n; i++) {
    fm_ctl_warm_item *it = &items[i];
    msgpack_sbuffer sb;
    msgpack_zone zone;
    msgpack_object reply;
    fm_ctl_compile_req req = {0};
    int err;

    if (tty) fm_ctl_progress(i, n, it->path);
    msgpack_sbuffer_init(&sb);
    msgpack_zone_init(&zone, 4096);
    err = fm_ctl_load_fragment(it->path, &sb, &d);
    if (err) {
      bad_input++;
      snprintf(it->error, sizeof it->error, "%s", d.text);
    } else {
      req.fragment = sb.data;
      req.len = sb.size;
      reply.type = MSGPACK_OBJECT_NIL;
      err = fm_client_call(ctl->client, "compile", 1, fm_ctl_pack_compile, &req, &zone, &reply, &d);
      if (err == FM_OK) {
        fm_ctl_fmt_scalar(fm_msg_get(&reply, "key"), it->key, sizeof it->key);
        fm_ctl_fmt_scalar(fm_msg_get(&reply, "origin"), it->origin, sizeof it->origin);
        if (strcmp(it->origin, "hit") == 0) hits++;
        else compiled++;
      } else if (reply.type == MSGPACK_OBJECT_MAP) {
        snprintf(it->error, sizeof it->error, "%s: %s", fm_err_slug(err), d.text);
      } else {
        /* The daemon is gone or hung: the rest would fail the same way. */
        if (tty) fputs("\r\033[K", stderr);
        rc = fm_ctl_report(ctl, it->path, err, &reply, &d);
        msgpack_zone_destroy(&zone);
        msgpack_sbuffer_destroy(&sb);
        goto out;
      }
    }
    if (it->error[0]) {
      failed++;
      if (tty) fputs("\r\033[K", stderr);
      if (!strstr(it->error, it->path))
        fprintf(stderr, "fusectl: %s: %s\n", it->path, it->error);
      else
        fprintf(stderr, "fusectl: %s\n", it->error);
    }
    msgpack_zone_destroy(&zone);
    msgpack_sbuffer_destroy(&sb);
  }
  if (tty) fputs("\r\033[K", stderr);

  if (ctl->json) {
    fm_ctl_warm_json(items, n, compiled, hits, failed);
    ctl->json_done = 1;
  }
  else printf("%zu compiled, %zu hits, %zu failed\n", compiled, hits, failed);
  /* A refusal by the daemon outranks unreadable files in the exit status. */
  if (failed > bad_input) rc = FM_CTL_EXIT_DAEMON;
  else if (bad_input) rc = FM_CTL_EXIT_INPUT;
  else rc = FM_CTL_EXIT_OK;

out:
  for (size_t i = 0; i < n; i++) free(items[i].path);
  free(items);
  return rc;
}
