/* fusectl_cmds.c: the inspection commands: ping, stats, ls, show, evict; and shutdown. Each asks the
 * daemon and renders its reply; with --json the reply map itself is printed. */
#include "fusectl.h"

#include <getopt.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fm_msg.h"
#include "fm_text.h"

/* Parses the options of a command that takes no argument: --json and, when flag is not NULL,
 * --<flag> (which sets *set). */
static int fm_ctl_flag_only(fm_ctl *ctl, int argc, char **argv, const char *flag, int *set) {
  struct option lo[] = {{"json", no_argument, NULL, 'j'}, {flag, no_argument, NULL, 'f'}, {NULL, 0, NULL, 0}};
  int c;
  optind = 0;
  while ((c = getopt_long(argc, argv, ":j", lo, NULL)) != -1) {
    if (c == 'j')
      ctl->json = 1;
    else if (c == 'f')
      *set = 1;
    else
      return fm_ctl_bad_option(ctl, c, argv);
  }
  if (optind < argc) return fm_ctl_usage_error(ctl, "unexpected argument '%s'", argv[optind]);
  return FM_CTL_EXIT_OK;
}

static int64_t fm_ctl_i64(const msgpack_object *map, const char *key) {
  int64_t v = 0;
  uint64_t u = 0;
  if (fm_msg_get_i64(map, key, &v, NULL) == FM_OK) return v;
  if (fm_msg_get_u64(map, key, &u, NULL) == FM_OK) return (int64_t)u;
  return 0;
}

/* A device as the daemon describes it: a map {name, cc, sm_count, arch} or a label. */
static void fm_ctl_fmt_device(const msgpack_object *dev, char *out, size_t cap) {
  char name[160] = "", arch[32] = "";
  if (!dev) {
    snprintf(out, cap, "?");
    return;
  }
  if (dev->type != MSGPACK_OBJECT_MAP) {
    fm_ctl_fmt_scalar(dev, out, cap);
    return;
  }
  fm_ctl_fmt_scalar(fm_msg_get(dev, "name"), name, sizeof name);
  fm_ctl_fmt_scalar(fm_msg_get(dev, "arch"), arch, sizeof arch);
  if (fm_ctl_i64(dev, "sm_count") <= 0) /* compile-only mode: a target, not a device */
    snprintf(out, cap, "no GPU (compiling for %s)", arch[0] ? arch : "?");
  else
    snprintf(out, cap, "%s (%s, %" PRId64 " SMs)", name, arch[0] ? arch : "?", fm_ctl_i64(dev, "sm_count"));
}

static void fm_ctl_fmt_duration(int64_t s, char *out, size_t cap) {
  if (s < 60)
    snprintf(out, cap, "%" PRId64 "s", s);
  else if (s < 3600)
    snprintf(out, cap, "%" PRId64 "m %02" PRId64 "s", s / 60, s % 60);
  else if (s < 86400)
    snprintf(out, cap, "%" PRId64 "h %02" PRId64 "m", s / 3600, s / 60 % 60);
  else
    snprintf(out, cap, "%" PRId64 "d %02" PRId64 "h", s / 86400, s / 3600 % 24);
}

static void fm_ctl_fmt_time(int64_t t, char *out, size_t cap) {
  char when[32] = "-", age[32];
  time_t tt = (time_t)t;
  struct tm tm;
  if (t > 0 && localtime_r(&tt, &tm)) strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", &tm);
  fm_ctl_fmt_age(t, (int64_t)time(NULL), age, sizeof age);
  snprintf(out, cap, "%s (%s)", when, age);
}

/* ---- ping ---- */

int fm_ctl_cmd_ping(fm_ctl *ctl, int argc, char **argv) {
  msgpack_zone zone;
  msgpack_object reply;
  const msgpack_object *hello;
  char version[64], mode[32], dev[256];
  int rc = fm_ctl_flag_only(ctl, argc, argv, NULL, NULL);

  if (rc) return rc;
  msgpack_zone_init(&zone, 4096);
  rc = fm_ctl_call(ctl, "ping", 0, NULL, NULL, &zone, &reply);
  if (rc) goto out;
  if (ctl->json) {
    fm_ctl_print_reply(ctl, &reply, 2, NULL);
    goto out;
  }
  hello = fm_client_hello(ctl->client);
  fm_ctl_fmt_scalar(fm_msg_get(hello, "version"), version, sizeof version);
  fm_ctl_fmt_scalar(fm_msg_get(hello, "mode"), mode, sizeof mode);
  fm_ctl_fmt_device(fm_msg_get(hello, "device"), dev, sizeof dev);
  printf("pong from fusemld %s at %s (%s; %s)\n", version, ctl->socket_path, mode, dev);
out:
  msgpack_zone_destroy(&zone);
  return rc;
}

/* ---- stats ---- */

/* "93.2%" of hits among hits + misses in counters (a stats map), "-" before any lookup. */
static void fm_ctl_fmt_hit_rate(const msgpack_object *counters, char *out, size_t cap) {
  int64_t hits = counters ? fm_ctl_i64(counters, "hits") : 0;
  int64_t misses = counters ? fm_ctl_i64(counters, "misses") : 0;
  if (hits + misses <= 0)
    snprintf(out, cap, "-");
  else
    snprintf(out, cap, "%.1f%%", 100.0 * (double)hits / (double)(hits + misses));
}

int fm_ctl_cmd_stats(fm_ctl *ctl, int argc, char **argv) {
  msgpack_zone zone;
  msgpack_object reply;
  fm_ctl_table t;
  const msgpack_object *stats, *session;
  char val[FM_CTL_PATH_TEXT], tmp[64], tmp2[64];
  int zero = 0, rc = fm_ctl_flag_only(ctl, argc, argv, "zero", &zero);

  if (rc) return rc;
  msgpack_zone_init(&zone, 4096);
  if (zero) {
    rc = fm_ctl_call(ctl, "stats_zero", 0, NULL, NULL, &zone, &reply);
    if (rc) goto out;
    if (ctl->json)
      fm_ctl_print_reply(ctl, &reply, 2, NULL);
    else
      printf("counters zeroed\n");
    goto out;
  }
  rc = fm_ctl_call(ctl, "stats", 0, NULL, NULL, &zone, &reply);
  if (rc) goto out;
  if (ctl->json) {
    fm_ctl_print_reply(ctl, &reply, 2, NULL);
    goto out;
  }
  fm_ctl_table_init(&t, 2, 0);
#define ROW(name, value)                     \
  do {                                       \
    const char *row_[2] = {(name), (value)}; \
    fm_ctl_table_row(&t, row_);              \
  } while (0)
  fm_ctl_fmt_scalar(fm_msg_get(&reply, "mode"), val, sizeof val);
  ROW("mode", val);
  fm_ctl_fmt_device(fm_msg_get(&reply, "device"), val, sizeof val);
  ROW("device", val);
  snprintf(val, sizeof val, "%" PRId64, fm_ctl_i64(&reply, "pid"));
  ROW("pid", val);
  fm_ctl_fmt_duration(fm_ctl_i64(&reply, "uptime_s"), val, sizeof val);
  ROW("uptime", val);
  fm_ctl_fmt_scalar(fm_msg_get(&reply, "db"), val, sizeof val);
  ROW("database", val);
  snprintf(val, sizeof val, "%" PRId64, fm_ctl_i64(&reply, "clients"));
  ROW("clients", val);
  snprintf(val, sizeof val, "%" PRId64, fm_ctl_i64(&reply, "inflight"));
  ROW("inflight", val);
  if (fm_msg_get(&reply, "tune")) { /* an older daemon has no tuning modes */
    fm_ctl_fmt_scalar(fm_msg_get(&reply, "tune"), tmp, sizeof tmp);
    snprintf(val, sizeof val, "%s (%" PRId64 " background tune(s) queued or running)", tmp,
             fm_ctl_i64(&reply, "background_tunes"));
    ROW("tuning", val);
  }
  snprintf(val, sizeof val, "%" PRId64, fm_ctl_i64(&reply, "entries"));
  ROW("entries", val);
  {
    uint64_t bytes = (uint64_t)fm_ctl_i64(&reply, "bytes"), cap = (uint64_t)fm_ctl_i64(&reply, "cache_size");
    fm_ctl_fmt_bytes(bytes, tmp, sizeof tmp);
    fm_ctl_fmt_bytes(cap, tmp2, sizeof tmp2);
    if (cap)
      snprintf(val, sizeof val, "%s of %s (%.1f%%)", tmp, tmp2, 100.0 * (double)bytes / (double)cap);
    else
      snprintf(val, sizeof val, "%s (no cap)", tmp);
    ROW("size", val);
  }
  fm_ctl_fmt_hit_rate(fm_msg_get(&reply, "stats"), tmp, sizeof tmp);
  fm_ctl_fmt_hit_rate(fm_msg_get(&reply, "session"), tmp2, sizeof tmp2);
  snprintf(val, sizeof val, "%s (this session: %s)", tmp, tmp2);
  ROW("hit rate", val);

  /* Persistent counters, each with its since-start value beside it; then any counter only
   * the session map has. */
  stats = fm_msg_get(&reply, "stats");
  session = fm_msg_get(&reply, "session");
  if (stats && stats->type == MSGPACK_OBJECT_MAP) {
    for (uint32_t i = 0; i < stats->via.map.size; i++) {
      const msgpack_object_kv *kv = &stats->via.map.ptr[i];
      char name[64], total[32], now[32];
      const msgpack_object *s = NULL;
      fm_ctl_fmt_scalar(&kv->key, name, sizeof name);
      fm_ctl_fmt_scalar(&kv->val, total, sizeof total);
      if (session && kv->key.type == MSGPACK_OBJECT_STR) s = fm_msg_get(session, name);
      if (s) {
        fm_ctl_fmt_scalar(s, now, sizeof now);
        snprintf(val, sizeof val, "%s (this session: %s)", total, now);
      } else {
        snprintf(val, sizeof val, "%s", total);
      }
      ROW(name, val);
    }
  }
  if (session && session->type == MSGPACK_OBJECT_MAP) {
    for (uint32_t i = 0; i < session->via.map.size; i++) {
      const msgpack_object_kv *kv = &session->via.map.ptr[i];
      char name[64], now[32];
      fm_ctl_fmt_scalar(&kv->key, name, sizeof name);
      if (stats && fm_msg_get(stats, name)) continue;
      fm_ctl_fmt_scalar(&kv->val, now, sizeof now);
      snprintf(val, sizeof val, "%s (this session)", now);
      ROW(name, val);
    }
  }
  /* The remote tier (docs/REMOTE.md), when the daemon has one: "remote.<counter>" rows. */
  const msgpack_object *remote = fm_msg_get(&reply, "remote");
  if (remote && remote->type == MSGPACK_OBJECT_MAP) {
    for (uint32_t i = 0; i < remote->via.map.size; i++) {
      const msgpack_object_kv *kv = &remote->via.map.ptr[i];
      char name[64], key[48];
      fm_ctl_fmt_scalar(&kv->key, key, sizeof key);
      snprintf(name, sizeof name, "remote.%s", key);
      fm_ctl_fmt_scalar(&kv->val, val, sizeof val);
      ROW(name, val);
    }
  }
#undef ROW
  if (fm_ctl_table_print(&t, stdout)) rc = fm_ctl_error(ctl, FM_CTL_EXIT_DAEMON, "out_of_memory", "out of memory");
out:
  msgpack_zone_destroy(&zone);
  return rc;
}

/* ---- ls ---- */

static void fm_ctl_pack_limit(msgpack_packer *pk, void *ctx) { fm_pack_kv_u64(pk, "limit", *(const uint32_t *)ctx); }

int fm_ctl_cmd_ls(fm_ctl *ctl, int argc, char **argv) {
  static const struct option lo[] = {
      {"json", no_argument, NULL, 'j'}, {"limit", required_argument, NULL, 'n'}, {NULL, 0, NULL, 0}};
  static const char *header[] = {"KEY", "KIND", "STATE", "SIZE", "HITS", "LAST-USED", "DEVICE"};
  msgpack_zone zone;
  msgpack_object reply;
  const msgpack_object *entries;
  fm_ctl_table t;
  uint32_t limit = 0;
  int64_t now = (int64_t)time(NULL);
  int c, rc;

  optind = 0;
  while ((c = getopt_long(argc, argv, ":jn:", lo, NULL)) != -1) {
    char *end;
    unsigned long v;
    switch (c) {
      case 'j':
        ctl->json = 1;
        break;
      case 'n':
        v = strtoul(optarg, &end, 10);
        if (end == optarg || *end || v == 0 || v > UINT32_MAX || optarg[0] == '-')
          return fm_ctl_usage_error(ctl, "--limit wants a positive integer, got '%s'", optarg);
        limit = (uint32_t)v;
        break;
      default:
        return fm_ctl_bad_option(ctl, c, argv);
    }
  }
  if (optind < argc) return fm_ctl_usage_error(ctl, "unexpected argument '%s'", argv[optind]);

  msgpack_zone_init(&zone, 4096);
  rc = fm_ctl_call(ctl, "list", limit ? 1 : 0, limit ? fm_ctl_pack_limit : NULL, &limit, &zone, &reply);
  if (rc) goto out;
  if (ctl->json) {
    fm_ctl_print_reply(ctl, &reply, 3, NULL);
    goto out;
  }
  entries = fm_msg_get(&reply, "entries");
  if (!entries || entries->type != MSGPACK_OBJECT_ARRAY) {
    rc = fm_ctl_error(ctl, FM_CTL_EXIT_UNREACHABLE, "protocol_error", "list: fusemld's reply has no entries array");
    goto out;
  }
  if (entries->via.array.size == 0) {
    printf("no cached kernels\n");
    goto out;
  }
  /* SIZE (3) and HITS (4) are numbers: right-aligned. */
  fm_ctl_table_init(&t, 7, 1u << 3 | 1u << 4);
  fm_ctl_table_row(&t, header);
  for (uint32_t i = 0; i < entries->via.array.size; i++) {
    const msgpack_object *e = &entries->via.array.ptr[i];
    char key[FM_KEY_HEX], kind[32], state[32], size[32], hits[32], used[32], dev[256];
    const char *row[7] = {key, kind, state, size, hits, used, dev};
    fm_ctl_fmt_scalar(fm_msg_get(e, "key"), key, sizeof key);
    key[16] = '\0'; /* the first 16 hex digits tell entries apart at a glance */
    fm_ctl_fmt_scalar(fm_msg_get(e, "kind"), kind, sizeof kind);
    fm_ctl_fmt_scalar(fm_msg_get(e, "state"), state, sizeof state);
    fm_ctl_fmt_bytes((uint64_t)fm_ctl_i64(e, "size"), size, sizeof size);
    snprintf(hits, sizeof hits, "%" PRId64, fm_ctl_i64(e, "hits"));
    fm_ctl_fmt_age(fm_ctl_i64(e, "last_used"), now, used, sizeof used);
    fm_ctl_fmt_scalar(fm_msg_get(e, "device"), dev, sizeof dev);
    fm_ctl_table_row(&t, row);
  }
  if (fm_ctl_table_print(&t, stdout)) rc = fm_ctl_error(ctl, FM_CTL_EXIT_DAEMON, "out_of_memory", "out of memory");
out:
  msgpack_zone_destroy(&zone);
  return rc;
}

/* ---- show ---- */

static int fm_ctl_is_hex(const char *s, size_t min_len, size_t max_len) {
  size_t n = strlen(s);
  if (n < min_len || n > max_len) return 0;
  for (size_t i = 0; i < n; i++)
    if (!strchr("0123456789abcdefABCDEF", s[i])) return 0;
  return 1;
}

static void fm_ctl_pack_key(msgpack_packer *pk, void *ctx) { fm_pack_kv_cstr(pk, "key", ctx); }

/* Asks show for a key prefix; *entry points into zone. */
static int fm_ctl_show_entry(fm_ctl *ctl, const char *key, msgpack_zone *zone, msgpack_object *reply,
                             const msgpack_object **entry) {
  int rc = fm_ctl_call(ctl, "show", 1, fm_ctl_pack_key, (void *)key, zone, reply);
  if (rc) return rc;
  *entry = fm_msg_get(reply, "entry");
  if (!*entry || (*entry)->type != MSGPACK_OBJECT_MAP) {
    return fm_ctl_error(ctl, FM_CTL_EXIT_UNREACHABLE, "protocol_error", "show: fusemld's reply has no entry");
  }
  return FM_CTL_EXIT_OK;
}

/* The tuner's timings (fm_tuner.h): one row per candidate, the chosen one marked. */
/* state: the entry's; a verified entry's table has the served candidate judged, the others
 * pending (their background tune replaces the entry). */
static void fm_ctl_print_timings(const msgpack_object *o, const char *state) {
  const msgpack_object *cands = fm_msg_get(o, "candidates");
  if (!cands || cands->type != MSGPACK_OBJECT_ARRAY) {
    printf("\ntimings:\n");
    fm_ctl_print_json(stdout, o, 1, NULL);
    return;
  }
  static const char *header[] = {"", "#", "CANDIDATE", "VERDICT", "MS", "REL-ERR", "DETAIL"};
  int64_t chosen = fm_ctl_i64(o, "chosen");
  double tune_ms = 0;
  char dev[192] = "";
  fm_msg_get_f64(o, "tune_ms", &tune_ms, NULL);
  fm_ctl_fmt_scalar(fm_msg_get(o, "device"), dev, sizeof dev);
  if (strcmp(state, "verified") == 0)
    printf(
        "\ncandidates (served one verified on %s in %.0f ms; the pending ones are timed in the "
        "background; * = served):\n",
        dev[0] ? dev : "?", tune_ms);
  else
    printf("\ncandidates (tuned on %s in %.0f ms; * = chosen):\n", dev[0] ? dev : "?", tune_ms);
  fm_ctl_table t;
  fm_ctl_table_init(&t, 7, 0);
  fm_ctl_table_row(&t, header);
  for (uint32_t i = 0; i < cands->via.array.size; i++) {
    const msgpack_object *c = &cands->via.array.ptr[i];
    char mark[4], idx[16], desc[160] = "", verdict[32] = "", ms[32] = "-", rel[32] = "-", detail[96] = "";
    double v;
    const char *row[7] = {mark, idx, desc, verdict, ms, rel, detail};
    snprintf(mark, sizeof mark, "%s", (int64_t)i == chosen ? "*" : "");
    snprintf(idx, sizeof idx, "%u", i);
    fm_ctl_fmt_scalar(fm_msg_get(c, "candidate"), desc, sizeof desc);
    fm_ctl_fmt_scalar(fm_msg_get(c, "verdict"), verdict, sizeof verdict);
    if (fm_msg_get_f64(c, "ms", &v, NULL) == FM_OK && v >= 0) snprintf(ms, sizeof ms, "%.4f", v);
    if (fm_msg_get_f64(c, "rel_err", &v, NULL) == FM_OK && v >= 0) snprintf(rel, sizeof rel, "%.2e", v);
    fm_ctl_fmt_scalar(fm_msg_get(c, "detail"), detail, sizeof detail);
    fm_ctl_table_row(&t, row);
  }
  fm_ctl_table_print(&t, stdout);
}

/* show --source --json: {"key": ..., "source": ...}, the source escaped as JSON. */
static void fm_ctl_print_source_json(fm_ctl *ctl, const msgpack_object *key, const msgpack_object *source) {
  msgpack_sbuffer sb;
  msgpack_packer pk;
  msgpack_sbuffer_init(&sb);
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, 2);
  fm_pack_cstr(&pk, "key");
  if (key)
    msgpack_pack_object(&pk, *key);
  else
    msgpack_pack_nil(&pk);
  fm_pack_cstr(&pk, "source");
  msgpack_pack_object(&pk, *source);
  fm_ctl_print_packed(ctl, &sb, 1);
}

int fm_ctl_cmd_show(fm_ctl *ctl, int argc, char **argv) {
  static const struct option lo[] = {
      {"json", no_argument, NULL, 'j'}, {"source", no_argument, NULL, 'S'}, {NULL, 0, NULL, 0}};
  msgpack_zone zone;
  msgpack_object reply;
  const msgpack_object *e = NULL, *o;
  int source = 0, c, rc;
  const char *key;

  optind = 0;
  while ((c = getopt_long(argc, argv, ":j", lo, NULL)) != -1) {
    if (c == 'j')
      ctl->json = 1;
    else if (c == 'S')
      source = 1;
    else
      return fm_ctl_bad_option(ctl, c, argv);
  }
  if (argc - optind != 1) return fm_ctl_usage_error(ctl, "show wants one KEY");
  key = argv[optind];
  if (!fm_ctl_is_hex(key, 4, 64)) return fm_ctl_usage_error(ctl, "KEY must be 4 to 64 hex digits, got '%s'", key);

  msgpack_zone_init(&zone, 4096);
  rc = fm_ctl_show_entry(ctl, key, &zone, &reply, &e);
  if (rc) goto out;
  if (source) {
    /* Only the source, so that `fusectl show KEY --source > k.cu` gives a compilable file.
     * Generated CUDA C holds no control character but newlines and tabs: any other one (a
     * planted escape sequence) is shown escaped, never sent to the terminal. */
    o = fm_msg_get(e, "source");
    if (!o || o->type != MSGPACK_OBJECT_STR) {
      rc = fm_ctl_error(ctl, FM_CTL_EXIT_DAEMON, "no_source", "entry %s has no stored source", key);
      goto out;
    }
    if (ctl->json) {
      fm_ctl_print_source_json(ctl, fm_msg_get(e, "key"), o);
      goto out;
    }
    fm_text_fwrite(stdout, o->via.str.ptr, o->via.str.size, FM_TEXT_KEEP_LINES);
    if (o->via.str.size && o->via.str.ptr[o->via.str.size - 1] != '\n') putchar('\n');
    goto out;
  }
  if (ctl->json) {
    fm_ctl_print_reply(ctl, &reply, 4, NULL);
    goto out;
  }
  {
    fm_ctl_table t;
    char v[256], tmp[64];
    static const char *plain[] = {"key", "device", "kind", "state"};
    fm_ctl_table_init(&t, 2, 0);
    for (size_t i = 0; i < sizeof plain / sizeof plain[0]; i++) {
      const char *row[2] = {plain[i], v};
      fm_ctl_fmt_scalar(fm_msg_get(e, plain[i]), v, sizeof v);
      fm_ctl_table_row(&t, row);
    }
    if ((o = fm_msg_get(e, "background")) && o->type == MSGPACK_OBJECT_MAP) {
      /* state is what is served now; this is the tune that will replace it */
      const char *row[2] = {"tuning", v};
      char phase[32];
      fm_ctl_fmt_scalar(fm_msg_get(o, "phase"), phase, sizeof phase);
      snprintf(v, sizeof v,
               "background tune %s (%" PRId64 " candidates; %" PRId64
               " tune(s) ahead); "
               "the served kernel is replaced when it ends",
               phase, fm_ctl_i64(o, "candidates"), fm_ctl_i64(o, "ahead"));
      fm_ctl_table_row(&t, row);
    }
    {
      const char *row[2] = {"size", v};
      fm_ctl_fmt_bytes((uint64_t)fm_ctl_i64(e, "size"), tmp, sizeof tmp);
      snprintf(v, sizeof v, "%s (%" PRId64 " bytes)", tmp, fm_ctl_i64(e, "size"));
      fm_ctl_table_row(&t, row);
    }
    {
      const char *row[2] = {"hits", v};
      snprintf(v, sizeof v, "%" PRId64, fm_ctl_i64(e, "hits"));
      fm_ctl_table_row(&t, row);
    }
    {
      const char *row[2] = {"created", v};
      fm_ctl_fmt_time(fm_ctl_i64(e, "created"), v, sizeof v);
      fm_ctl_table_row(&t, row);
    }
    {
      const char *row[2] = {"last used", v};
      fm_ctl_fmt_time(fm_ctl_i64(e, "last_used"), v, sizeof v);
      fm_ctl_table_row(&t, row);
    }
    fm_ctl_table_print(&t, stdout);
  }
  /* The canonical fragment one tensor/op per line: the form a person compares by eye. */
  if ((o = fm_msg_get(e, "fragment"))) {
    printf("\nfragment (canonical):\n");
    fm_ctl_print_json(stdout, o, 2, NULL);
  }
  if ((o = fm_msg_get(e, "meta"))) {
    printf("\nmeta:\n");
    fm_ctl_print_json(stdout, o, 1, NULL);
  }
  if ((o = fm_msg_get(e, "timings")) && o->type != MSGPACK_OBJECT_NIL) {
    char state[32];
    fm_ctl_fmt_scalar(fm_msg_get(e, "state"), state, sizeof state);
    fm_ctl_print_timings(o, state);
  }
  if ((o = fm_msg_get(e, "source")) && o->type == MSGPACK_OBJECT_STR)
    printf("\nsource: %u bytes of CUDA C (fusectl show %s --source)\n", o->via.str.size, key);
out:
  msgpack_zone_destroy(&zone);
  return rc;
}

/* ---- evict ---- */

static void fm_ctl_pack_all(msgpack_packer *pk, void *ctx) { fm_pack_kv_bool(pk, "all", true); }

int fm_ctl_cmd_evict(fm_ctl *ctl, int argc, char **argv) {
  static const struct option lo[] = {
      {"json", no_argument, NULL, 'j'}, {"all", no_argument, NULL, 'a'}, {NULL, 0, NULL, 0}};
  msgpack_zone zone;
  msgpack_object reply;
  char full[FM_KEY_HEX] = "";
  uint64_t n = 0;
  int all = 0, c, rc;
  const char *key = NULL;

  optind = 0;
  while ((c = getopt_long(argc, argv, ":j", lo, NULL)) != -1) {
    if (c == 'j')
      ctl->json = 1;
    else if (c == 'a')
      all = 1;
    else
      return fm_ctl_bad_option(ctl, c, argv);
  }
  if (all && optind != argc) return fm_ctl_usage_error(ctl, "give either KEY or --all, not both");
  if (!all) {
    if (argc - optind != 1) return fm_ctl_usage_error(ctl, "evict wants one KEY, or --all");
    key = argv[optind];
    if (!fm_ctl_is_hex(key, 4, 64)) return fm_ctl_usage_error(ctl, "KEY must be 4 to 64 hex digits, got '%s'", key);
  }

  msgpack_zone_init(&zone, 4096);
  if (!all && strlen(key) < 64) {
    /* evict takes a full key; a prefix is resolved through show, which refuses an
     * ambiguous one, so a short prefix can never remove the wrong entry. */
    const msgpack_object *e;
    rc = fm_ctl_show_entry(ctl, key, &zone, &reply, &e);
    if (rc) goto out;
    fm_ctl_fmt_scalar(fm_msg_get(e, "key"), full, sizeof full);
    key = full;
  }
  if (all)
    rc = fm_ctl_call(ctl, "evict", 1, fm_ctl_pack_all, NULL, &zone, &reply);
  else
    rc = fm_ctl_call(ctl, "evict", 1, fm_ctl_pack_key, (void *)key, &zone, &reply);
  if (rc) goto out;
  if (ctl->json) {
    fm_ctl_print_reply(ctl, &reply, 2, NULL);
    goto out;
  }
  fm_msg_get_u64(&reply, "evicted", &n, NULL);
  if (all)
    printf("evicted %" PRIu64 " entr%s\n", n, n == 1 ? "y" : "ies");
  else
    printf("evicted %s\n", key);
out:
  msgpack_zone_destroy(&zone);
  return rc;
}

/* ---- shutdown ---- */

#define FM_CTL_SHUTDOWN_WAIT_MS 60000 /* above the daemon's drain (30 s) and flush (2 s) */
#define FM_CTL_SHUTDOWN_POLL_MS 100

/* Until the daemon closes this connection: it does so once its compiles have finished. A
 * ping every so often is how a reply-matched client notices; 1 once it is closed. */
static int fm_ctl_wait_closed(fm_ctl *ctl) {
  struct timespec pause = {0, FM_CTL_SHUTDOWN_POLL_MS * 1000000L};
  for (int waited = 0; waited < FM_CTL_SHUTDOWN_WAIT_MS; waited += FM_CTL_SHUTDOWN_POLL_MS) {
    msgpack_zone zone;
    msgpack_object reply;
    fm_diag d = {{0}};
    msgpack_zone_init(&zone, 1024);
    int err = fm_client_call(ctl->client, "ping", 0, NULL, NULL, &zone, &reply, &d);
    msgpack_zone_destroy(&zone);
    if (err != FM_OK) return 1;
    nanosleep(&pause, NULL);
  }
  return 0;
}

int fm_ctl_cmd_shutdown(fm_ctl *ctl, int argc, char **argv) {
  msgpack_zone zone;
  msgpack_object reply;
  int no_wait = 0, rc = fm_ctl_flag_only(ctl, argc, argv, "no-wait", &no_wait), wait = !no_wait;

  if (rc) return rc;
  msgpack_zone_init(&zone, 1024);
  rc = fm_ctl_call(ctl, "shutdown", 0, NULL, NULL, &zone, &reply);
  if (rc) goto out;
  int64_t pid = fm_ctl_i64(&reply, "pid"), inflight = fm_ctl_i64(&reply, "inflight");
  if (!ctl->json)
    printf("fusemld (pid %" PRId64 ") at %s is stopping; %" PRId64 " compile(s) in flight finish first\n", pid,
           ctl->socket_path, inflight);
  if (wait && !fm_ctl_wait_closed(ctl)) {
    rc = fm_ctl_error(ctl, FM_CTL_EXIT_UNREACHABLE, "still_serving",
                      "fusemld (pid %" PRId64 ") still serves after %d s", pid, FM_CTL_SHUTDOWN_WAIT_MS / 1000);
  }
  if (ctl->json && !rc)
    fm_ctl_print_reply(ctl, &reply, 2, NULL);
  else if (wait && !rc)
    printf("fusemld (pid %" PRId64 ") has finished and closed its connections\n", pid);
out:
  msgpack_zone_destroy(&zone);
  return rc;
}
