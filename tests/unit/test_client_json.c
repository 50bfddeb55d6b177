/* test_client_json.c: fusectl's JSON -> msgpack reader and its JSON writer, and the shipped
 * example fragments (they must parse and pass the protocol's own decode + validation). */
#include <dirent.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fm_fragment.h"
#include "fm_msg.h"
#include "fm_test.h"
#include "fusectl.h"

/* Converts text; on success unpacks into zone and returns the root object. */
static int convert(const char *text, msgpack_sbuffer *sb, msgpack_zone *zone, msgpack_object *obj, fm_diag *d) {
  int err = fm_ctl_json_to_msgpack(text, strlen(text), "t.json", sb, d);
  if (err) return err;
  size_t off = 0;
  return msgpack_unpack(sb->data, sb->size, &off, zone, obj) == MSGPACK_UNPACK_SUCCESS && off == sb->size ? FM_OK
                                                                                                          : -999;
}

static void test_types(void) {
  msgpack_sbuffer sb;
  msgpack_zone zone;
  msgpack_object o;
  fm_diag d = {{0}};
  msgpack_sbuffer_init(&sb);
  msgpack_zone_init(&zone, 1024);
  int err = convert(
      "{\"i\": -7, \"u\": 42, \"big\": 9007199254740993, \"r\": 0.5, \"r0\": 1.0,"
      " \"s\": \"h\\u00e9\", \"t\": true, \"f\": false, \"n\": null,"
      " \"a\": [1, [2, {}], []]}",
      &sb, &zone, &o, &d);
  CHECK_EQ_INT(err, FM_OK);
  CHECK(o.type == MSGPACK_OBJECT_MAP);
  CHECK_EQ_INT(o.via.map.size, 10);
  /* Key order is the document's. */
  CHECK(fm_msg_str_eq(&o.via.map.ptr[0].key, "i"));
  CHECK(fm_msg_str_eq(&o.via.map.ptr[9].key, "a"));
  const msgpack_object *v;
  v = fm_msg_get(&o, "i");
  CHECK(v && v->type == MSGPACK_OBJECT_NEGATIVE_INTEGER && v->via.i64 == -7);
  v = fm_msg_get(&o, "u");
  CHECK(v && v->type == MSGPACK_OBJECT_POSITIVE_INTEGER && v->via.u64 == 42);
  v = fm_msg_get(&o, "big"); /* beyond a double's exact range: must stay an exact integer */
  CHECK(v && v->type == MSGPACK_OBJECT_POSITIVE_INTEGER && v->via.u64 == 9007199254740993ull);
  v = fm_msg_get(&o, "r");
  CHECK(v && v->type == MSGPACK_OBJECT_FLOAT64 && v->via.f64 == 0.5);
  v = fm_msg_get(&o, "r0"); /* 1.0 is a real in JSON, so a float on the wire */
  CHECK(v && v->type == MSGPACK_OBJECT_FLOAT64 && v->via.f64 == 1.0);
  v = fm_msg_get(&o, "s");
  CHECK(v && v->type == MSGPACK_OBJECT_STR && v->via.str.size == 3 && memcmp(v->via.str.ptr, "h\xc3\xa9", 3) == 0);
  v = fm_msg_get(&o, "t");
  CHECK(v && v->type == MSGPACK_OBJECT_BOOLEAN && v->via.boolean);
  v = fm_msg_get(&o, "f");
  CHECK(v && v->type == MSGPACK_OBJECT_BOOLEAN && !v->via.boolean);
  v = fm_msg_get(&o, "n");
  CHECK(v && v->type == MSGPACK_OBJECT_NIL);
  v = fm_msg_get(&o, "a");
  CHECK(v && v->type == MSGPACK_OBJECT_ARRAY && v->via.array.size == 3);
  if (v && v->type == MSGPACK_OBJECT_ARRAY && v->via.array.size == 3) {
    const msgpack_object *inner = &v->via.array.ptr[1];
    CHECK(inner->type == MSGPACK_OBJECT_ARRAY && inner->via.array.size == 2);
    CHECK(inner->via.array.ptr[1].type == MSGPACK_OBJECT_MAP);
    CHECK(v->via.array.ptr[2].type == MSGPACK_OBJECT_ARRAY && v->via.array.ptr[2].via.array.size == 0);
  }
  msgpack_zone_destroy(&zone);
  msgpack_sbuffer_destroy(&sb);
}

static char *nested(int depth) {
  char *s = malloc((size_t)depth * 2 + 1);
  for (int i = 0; i < depth; i++) s[i] = '[';
  for (int i = 0; i < depth; i++) s[depth + i] = ']';
  s[2 * depth] = '\0';
  return s;
}

static void test_depth_limit(void) {
  msgpack_sbuffer sb;
  fm_diag d = {{0}};
  char *ok = nested(FM_CTL_JSON_MAX_DEPTH), *deep = nested(FM_CTL_JSON_MAX_DEPTH + 1);
  msgpack_sbuffer_init(&sb);
  CHECK_EQ_INT(fm_ctl_json_to_msgpack(ok, strlen(ok), "ok.json", &sb, &d), FM_OK);
  size_t before = sb.size;
  CHECK_EQ_INT(fm_ctl_json_to_msgpack(deep, strlen(deep), "deep.json", &sb, &d), FM_ELIMIT);
  CHECK_STR_CONTAINS(d.text, "deep.json");
  CHECK_STR_CONTAINS(d.text, "16");
  CHECK_EQ_INT(sb.size, before); /* a refused document leaves no partial output */
  free(ok);
  free(deep);
  msgpack_sbuffer_destroy(&sb);
}

static void test_bad_json(void) {
  msgpack_sbuffer sb;
  fm_diag d = {{0}};
  const char *bad = "{\n  \"vocab\": 1,\n  \"ops\": [1, 2,]\n}\n";
  msgpack_sbuffer_init(&sb);
  CHECK_EQ_INT(fm_ctl_json_to_msgpack(bad, strlen(bad), "frag.json", &sb, &d), FM_EMALFORMED);
  /* file:line:column, pointing at line 3 where the stray ']' is */
  CHECK_STR_CONTAINS(d.text, "frag.json:3:");
  CHECK_EQ_INT(sb.size, 0);
  const char *dup = "{\"a\": 1, \"a\": 2}";
  CHECK_EQ_INT(fm_ctl_json_to_msgpack(dup, strlen(dup), "dup.json", &sb, &d), FM_EMALFORMED);
  CHECK_STR_CONTAINS(d.text, "dup.json:");
  CHECK_EQ_INT(fm_ctl_json_to_msgpack("", 0, "empty.json", &sb, &d), FM_EMALFORMED);
  msgpack_sbuffer_destroy(&sb);
}

static void test_file_limits(void) {
  char dir[] = "/tmp/fm_test_json_XXXXXX", path[128];
  msgpack_sbuffer sb;
  fm_diag d = {{0}};
  FILE *f;
  CHECK(mkdtemp(dir) != NULL);
  msgpack_sbuffer_init(&sb);

  snprintf(path, sizeof path, "%s/missing.json", dir);
  CHECK_EQ_INT(fm_ctl_json_file_to_msgpack(path, &sb, &d), FM_EIO);
  CHECK_STR_CONTAINS(d.text, "missing.json");

  /* Valid JSON just over 1 MiB: refused for its size, not parsed. */
  snprintf(path, sizeof path, "%s/big.json", dir);
  f = fopen(path, "w");
  CHECK(f != NULL);
  if (f) {
    fputc('"', f);
    for (unsigned i = 0; i < FM_CTL_JSON_MAX_FILE; i++) fputc('x', f);
    fputc('"', f);
    fclose(f);
  }
  CHECK_EQ_INT(fm_ctl_json_file_to_msgpack(path, &sb, &d), FM_ELIMIT);
  CHECK_STR_CONTAINS(d.text, "1 MiB");
  CHECK_EQ_INT(sb.size, 0);
  unlink(path);

  snprintf(path, sizeof path, "%s/small.json", dir);
  f = fopen(path, "w");
  if (f) {
    fputs("[true]", f);
    fclose(f);
  }
  CHECK_EQ_INT(fm_ctl_json_file_to_msgpack(path, &sb, &d), FM_OK);
  CHECK_EQ_INT(sb.size, 2);
  CHECK(sb.size == 2 && (uint8_t)sb.data[0] == 0x91 && (uint8_t)sb.data[1] == 0xc3);
  unlink(path);
  rmdir(dir);
  msgpack_sbuffer_destroy(&sb);
}

/* Renders o with fm_ctl_print_json into a string (caller frees). */
static char *render(const msgpack_object *o, int inline_depth, const char *const *omit) {
  char *text = NULL;
  size_t len = 0;
  FILE *m = open_memstream(&text, &len);
  fm_ctl_print_json(m, o, inline_depth, omit);
  fclose(m);
  return text;
}

static void test_print_json(void) {
  msgpack_sbuffer sb;
  msgpack_packer pk;
  msgpack_zone zone;
  msgpack_object o;
  msgpack_sbuffer_init(&sb);
  msgpack_zone_init(&zone, 1024);
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, 7);
  fm_pack_kv_cstr(&pk, "s", "a\"b\\\n\x01\xff");
  fm_pack_kv_u64(&pk, "id", 7);
  fm_pack_kv_f64(&pk, "x", 0.1);
  fm_pack_kv_u64(&pk, "u", UINT64_MAX);
  fm_pack_cstr(&pk, "cubin");
  fm_pack_bin(&pk, "abc", 3);
  fm_pack_cstr(&pk, "b");
  fm_pack_bin(&pk, "abcd", 4);
  fm_pack_kv_f64(&pk, "nan", NAN);
  size_t off = 0;
  CHECK(msgpack_unpack(sb.data, sb.size, &off, &zone, &o) == MSGPACK_UNPACK_SUCCESS);
  char *t = render(&o, 0, (const char *const[]){"id", "cubin", NULL});
  CHECK_STR_CONTAINS(t, "\"s\": \"a\\\"b\\\\\\n\\u0001\\ufffd\"");
  CHECK_STR_CONTAINS(t, "\"x\": 0.1,"); /* shortest round trip */
  CHECK_STR_CONTAINS(t, "\"u\": 18446744073709551615");
  CHECK_STR_CONTAINS(t, "\"b\": {\"bin_bytes\": 4}");
  CHECK_STR_CONTAINS(t, "\"nan\": null");
  CHECK(t && !strstr(t, "cubin") && !strstr(t, "\"id\""));
  free(t);

  /* And what it writes reads back through the JSON reader to the same values. */
  msgpack_sbuffer back;
  msgpack_zone z2;
  msgpack_object o2;
  fm_diag d = {{0}};
  msgpack_sbuffer_init(&back);
  msgpack_zone_init(&z2, 1024);
  const char *doc = "{\"vocab\": 1, \"shape\": [-1, 4096], \"v\": 1.5e-07, \"s\": \"x\"}";
  CHECK_EQ_INT(convert(doc, &back, &z2, &o2, &d), FM_OK);
  t = render(&o2, 1, NULL);
  CHECK_STR_CONTAINS(t, "\n  \"shape\": [-1, 4096],\n");
  CHECK_STR_CONTAINS(t, "\"v\": 1.5e-07");
  free(t);
  msgpack_zone_destroy(&z2);
  msgpack_sbuffer_destroy(&back);
  msgpack_zone_destroy(&zone);
  msgpack_sbuffer_destroy(&sb);
}

static void test_table(void) {
  fm_ctl_table t;
  char *text = NULL;
  size_t len = 0;
  FILE *m = open_memstream(&text, &len);
  const char *r1[] = {"KEY", "SIZE", "DEVICE"};
  const char *r2[] = {"abcdef", "1.5 KiB", "none/sm_90a"};
  const char *r3[] = {"ab", "12 B", "x"};
  fm_ctl_table_init(&t, 3, 1u << 1);
  fm_ctl_table_row(&t, r1);
  fm_ctl_table_row(&t, r2);
  fm_ctl_table_row(&t, r3);
  CHECK_EQ_INT(fm_ctl_table_print(&t, m), FM_OK);
  fclose(m);
  CHECK(text && strcmp(text,
                       "KEY        SIZE  DEVICE\n"
                       "abcdef  1.5 KiB  none/sm_90a\n"
                       "ab         12 B  x\n") == 0);
  free(text);
  char buf[32];
  fm_ctl_fmt_bytes(1536, buf, sizeof buf);
  CHECK(strcmp(buf, "1.5 KiB") == 0);
  fm_ctl_fmt_age(1000, 1000 + 7200, buf, sizeof buf);
  CHECK(strcmp(buf, "2h ago") == 0);
}

/* Every examples/NAME.json is a valid fragment by the protocol's own rules. */
static void test_examples_decode(void) {
  const char *src = getenv("FM_SOURCE_DIR");
  char dir[1024];
  DIR *dp;
  struct dirent *de;
  int n = 0;
  snprintf(dir, sizeof dir, "%s/examples", src ? src : ".");
  dp = opendir(dir);
  CHECK(dp != NULL);
  if (!dp) return;
  while ((de = readdir(dp))) {
    size_t len = strlen(de->d_name);
    if (len < 6 || strcmp(de->d_name + len - 5, ".json") != 0) continue;
    char path[2048];
    msgpack_sbuffer sb;
    msgpack_zone zone;
    msgpack_object o;
    fm_diag d = {{0}};
    static fm_fragment frag; /* large: not on the stack */
    snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
    msgpack_sbuffer_init(&sb);
    msgpack_zone_init(&zone, 4096);
    int err = fm_ctl_json_file_to_msgpack(path, &sb, &d);
    if (err) fprintf(stderr, "  %s: %s\n", de->d_name, d.text);
    CHECK_EQ_INT(err, FM_OK);
    if (!err) {
      err = fm_msg_unpack((const uint8_t *)sb.data, sb.size, &fm_msg_request_limits, &zone, &o, &d);
      CHECK_EQ_INT(err, FM_OK);
      if (!err) err = fm_fragment_decode(&o, &frag, &d);
      if (err) fprintf(stderr, "  %s: %s\n", de->d_name, d.text);
      CHECK_EQ_INT(err, FM_OK);
      CHECK(fm_fragment_is_symbolic(&frag));
    }
    msgpack_zone_destroy(&zone);
    msgpack_sbuffer_destroy(&sb);
    n++;
  }
  closedir(dp);
  CHECK(n >= 5);
}

int main(void) {
  RUN(test_types);
  RUN(test_depth_limit);
  RUN(test_bad_json);
  RUN(test_file_limits);
  RUN(test_print_json);
  RUN(test_table);
  RUN(test_examples_decode);
  return FM_TEST_DONE();
}
