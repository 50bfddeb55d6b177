/* fusectl_compile.c: compile (one fragment file), and the fragment reading and request
 * packing that warm (fusectl_warm.c) shares. */
#include "fusectl.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fm_msg.h"

void fm_ctl_pack_compile(msgpack_packer *pk, void *ctx) {
  const fm_ctl_compile_req *r = ctx;
  fm_pack_cstr(pk, "fragment");
  pk->callback(pk->data, r->fragment, r->len); /* already msgpack */
  if (r->arch) fm_pack_kv_cstr(pk, "arch", r->arch);
}

int fm_ctl_load_fragment(const char *path, msgpack_sbuffer *sb, fm_diag *d) {
  int err = fm_ctl_json_file_to_msgpack(path, sb, d);
  if (err) return err;
  /* A JSON object always becomes a map header: fixmap, map16 or map32. */
  if (sb->size == 0 ||
      !(((uint8_t)sb->data[0] & 0xf0) == 0x80 || (uint8_t)sb->data[0] == 0xde || (uint8_t)sb->data[0] == 0xdf))
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
    if (c == 'j')
      ctl->json = 1;
    else if (c == 'a')
      req.arch = optarg;
    else
      return fm_ctl_bad_option(ctl, c, argv);
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
    fm_ctl_print_reply(ctl, &reply, 2, "cubin"); /* the CUBIN is binary: left out */
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
      snprintf(v, sizeof v, "%" PRIu32 " bytes", cubin && cubin->type == MSGPACK_OBJECT_BIN ? cubin->via.bin.size : 0);
      fm_ctl_table_row(&t, row);
    }
    fm_ctl_table_print(&t, stdout);
  }
out:
  msgpack_zone_destroy(&zone);
  msgpack_sbuffer_destroy(&sb);
  return rc;
}
