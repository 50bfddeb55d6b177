/* fusectl_remote.c: export and import: a portable snapshot of the store (docs/REMOTE.md).
 *
 *   file  := "FMX1" record*
 *   record := u32be(len) value          (value: one portable entry, fm_remote_entry.h)
 *
 * export lists the store and asks the daemon for each entry's value (signed with the cluster
 * secret when the daemon has one); import sends each value back, and the daemon verifies it
 * like a remote hit (it accepts only values signed with its own secret) and stores it, or
 * skips it where a local entry is kept (counted apart from refusals: not an error). */
#include "fusectl.h"

#include <errno.h>
#include <getopt.h>
#include <stdlib.h>
#include <string.h>

#include "fm_msg.h"

#define FM_CTL_SNAPSHOT_MAGIC     "FMX1"
#define FM_CTL_SNAPSHOT_MAX_ENTRY (64u << 20)

typedef struct key_arg {
  const char *hex;
  size_t len;
} key_arg;

static void pack_key(msgpack_packer *pk, void *ctx) {
  key_arg *k = ctx;
  fm_pack_cstr(pk, "key");
  fm_pack_strn(pk, k->hex, k->len);
}

static void pack_all(msgpack_packer *pk, void *ctx) {
  (void)ctx;
  fm_pack_kv_u64(pk, "limit", 0);
}

static int parse_file_args(fm_ctl *ctl, int argc, char **argv, const char **device, const char **file) {
  static const struct option lo[] = {
      {"json", no_argument, NULL, 'j'}, {"device", required_argument, NULL, 'd'}, {NULL, 0, NULL, 0}};
  int c;
  optind = 0;
  while ((c = getopt_long(argc, argv, ":jd:", lo, NULL)) != -1) {
    if (c == 'j')
      ctl->json = 1;
    else if (c == 'd' && device)
      *device = optarg;
    else
      return fm_ctl_bad_option(ctl, c, argv);
  }
  if (optind + 1 != argc) return fm_ctl_usage_error(ctl, "wants one FILE");
  *file = argv[optind];
  return FM_CTL_EXIT_OK;
}

static int write_u32(FILE *f, size_t n) {
  uint8_t b[4] = {(uint8_t)(n >> 24), (uint8_t)(n >> 16), (uint8_t)(n >> 8), (uint8_t)n};
  return fwrite(b, 1, 4, f) == 4 ? 0 : -1;
}

int fm_ctl_cmd_export(fm_ctl *ctl, int argc, char **argv) {
  const char *device = NULL, *path = NULL;
  msgpack_zone zone, ez;
  msgpack_object reply, er;
  uint32_t n = 0, vanished = 0, skipped = 0;
  FILE *f = NULL;
  int rc = parse_file_args(ctl, argc, argv, &device, &path);
  if (rc) return rc;
  msgpack_zone_init(&zone, 4096);
  rc = fm_ctl_call(ctl, "list", 1, pack_all, NULL, &zone, &reply);
  if (rc) goto out;
  const msgpack_object *entries = fm_msg_get(&reply, "entries");
  if (!entries || entries->type != MSGPACK_OBJECT_ARRAY) {
    rc = fm_ctl_error(ctl, FM_CTL_EXIT_DAEMON, "protocol_error", "export: fusemld's reply has no entries array");
    goto out;
  }
  if (!(f = fopen(path, "wb")) || fwrite(FM_CTL_SNAPSHOT_MAGIC, 1, 4, f) != 4) {
    rc = fm_ctl_error(ctl, FM_CTL_EXIT_INPUT, NULL, "export: cannot write %s: %s", path, strerror(errno));
    goto out;
  }
  for (uint32_t i = 0; i < entries->via.array.size; i++) {
    const msgpack_object *e = &entries->via.array.ptr[i];
    char dev[192] = "";
    key_arg k;
    fm_diag d = {{0}};
    fm_msg_copy_str(e, "device", dev, sizeof dev, NULL);
    if (device && strcmp(dev, device) != 0) continue;
    if (fm_msg_get_str(e, "key", &k.hex, &k.len, NULL)) continue;
    msgpack_zone_init(&ez, 1 << 16);
    er.type = MSGPACK_OBJECT_NIL;
    int err = fm_client_call(ctl->client, "export", 1, pack_key, &k, &ez, &er, &d);
    const uint8_t *val;
    size_t len;
    if (err == FM_ENOT_FOUND) {
      vanished++; /* evicted since the list: not an error */
    } else if (err && er.type == MSGPACK_OBJECT_MAP) {
      /* The daemon could not give this entry (it failed its checksum, say): said here, the
       * others still exported, and the exit status tells that the snapshot lacks it. */
      fm_ctl_report(ctl, "export", err, &er, &d);
      skipped++;
    } else if (err) {
      rc = fm_ctl_report(ctl, "export", err, &er, &d);
    } else if (fm_msg_get_bin(&er, "entry", &val, &len, NULL) == FM_OK) {
      if (write_u32(f, len) || fwrite(val, 1, len, f) != len)
        rc = fm_ctl_error(ctl, FM_CTL_EXIT_INPUT, NULL, "export: cannot write %s: %s", path, strerror(errno));
      n++;
    }
    msgpack_zone_destroy(&ez);
    if (rc) goto out;
  }
  if (fclose(f) != 0) {
    f = NULL;
    rc = fm_ctl_error(ctl, FM_CTL_EXIT_INPUT, NULL, "export: cannot write %s: %s", path, strerror(errno));
    goto out;
  }
  f = NULL;
  if (ctl->json) {
    printf("{\"exported\": %u, \"vanished\": %u, \"skipped\": %u}\n", n, vanished, skipped);
    ctl->json_done = 1;
  } else {
    printf("exported %u entr%s to %s%s", n, n == 1 ? "y" : "ies", path, vanished ? " (some vanished meanwhile)" : "");
    if (skipped) printf("; %u skipped (see above)", skipped);
    putchar('\n');
  }
  if (skipped) rc = FM_CTL_EXIT_DAEMON;
out:
  if (f) fclose(f);
  msgpack_zone_destroy(&zone);
  return rc;
}

typedef struct val_arg {
  const uint8_t *p;
  size_t len;
} val_arg;

static void pack_entry(msgpack_packer *pk, void *ctx) {
  val_arg *v = ctx;
  fm_pack_cstr(pk, "entry");
  fm_pack_bin(pk, v->p, v->len);
}

int fm_ctl_cmd_import(fm_ctl *ctl, int argc, char **argv) {
  const char *path = NULL;
  uint32_t ok = 0, refused = 0, skipped = 0;
  uint8_t hdr[4], *val = NULL;
  int rc = parse_file_args(ctl, argc, argv, NULL, &path);
  if (rc) return rc;
  FILE *f = fopen(path, "rb");
  if (!f || fread(hdr, 1, 4, f) != 4 || memcmp(hdr, FM_CTL_SNAPSHOT_MAGIC, 4) != 0) {
    int why = errno;
    if (f) fclose(f);
    return fm_ctl_error(ctl, FM_CTL_EXIT_INPUT, NULL, "import: %s is not a fusectl export%s%s", path, f ? "" : ": ",
                        f ? "" : strerror(why));
  }
  for (;;) {
    size_t got = fread(hdr, 1, 4, f);
    if (got == 0 && feof(f)) break;
    size_t len = (size_t)hdr[0] << 24 | (size_t)hdr[1] << 16 | (size_t)hdr[2] << 8 | hdr[3];
    if (got != 4 || len == 0 || len > FM_CTL_SNAPSHOT_MAX_ENTRY || !(val = malloc(len)) ||
        fread(val, 1, len, f) != len) {
      rc = fm_ctl_error(ctl, FM_CTL_EXIT_INPUT, NULL, "import: %s is truncated or corrupt after %u entries", path,
                        ok + refused);
      break;
    }
    msgpack_zone zone;
    msgpack_object reply;
    val_arg v = {val, len};
    msgpack_zone_init(&zone, 4096);
    rc = fm_ctl_call(ctl, "import", 1, pack_entry, &v, &zone, &reply);
    free(val);
    val = NULL;
    if (rc == FM_CTL_EXIT_DAEMON) {
      msgpack_zone_destroy(&zone);
      refused++; /* fm_ctl_call printed why */
      rc = FM_CTL_EXIT_OK;
      continue;
    }
    bool imported = true;
    char why[160] = "", key[FM_KEY_HEX] = "";
    if (!rc && fm_msg_get_bool(&reply, "imported", &imported, NULL) == FM_OK && !imported) {
      /* Kept by the daemon's import rule (a local entry it does not replace): not an error. */
      fm_msg_copy_str(&reply, "skipped", why, sizeof why, NULL);
      fm_msg_copy_str(&reply, "key", key, sizeof key, NULL);
      if (!ctl->json) printf("skipped %.16s: %s\n", key, why);
      skipped++;
    } else if (!rc) {
      ok++;
    }
    msgpack_zone_destroy(&zone);
    if (rc) break;
  }
  free(val);
  fclose(f);
  if (!rc) {
    if (ctl->json) {
      printf("{\"imported\": %u, \"skipped\": %u, \"refused\": %u}\n", ok, skipped, refused);
      ctl->json_done = 1;
    } else
      printf("imported %u entr%s from %s; %u skipped, %u refused\n", ok, ok == 1 ? "y" : "ies", path, skipped, refused);
    if (refused) rc = FM_CTL_EXIT_DAEMON;
  }
  return rc;
}
