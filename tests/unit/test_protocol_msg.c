/* test_protocol_msg.c: fm_msg_check on every msgpack type and every hostile shape, the
 * unpack path, typed getters and the error reply. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fm_error.h"
#include "fm_msg.h"
#include "fm_test.h"

typedef struct {
  const char *name;
  const char *bytes; /* a value, placed as the value of {"a": ...} */
  size_t len;
} typed_value;

#define V(name, lit) \
  { name, lit, sizeof(lit) - 1 }

static const typed_value every_type[] = {
    V("positive fixint", "\x05"),
    V("negative fixint", "\xff"),
    V("nil", "\xc0"),
    V("false", "\xc2"),
    V("true", "\xc3"),
    V("bin8", "\xc4\x02\xaa\xbb"),
    V("bin16", "\xc5\x00\x01\xaa"),
    V("bin32", "\xc6\x00\x00\x00\x01\xaa"),
    V("ext8", "\xc7\x01\x05\xaa"),
    V("ext16", "\xc8\x00\x01\x05\xaa"),
    V("ext32", "\xc9\x00\x00\x00\x01\x05\xaa"),
    V("float32", "\xca\x3f\x80\x00\x00"),
    V("float64", "\xcb\x3f\xf0\x00\x00\x00\x00\x00\x00"),
    V("uint8", "\xcc\xff"),
    V("uint16", "\xcd\xff\xff"),
    V("uint32", "\xce\xff\xff\xff\xff"),
    V("uint64", "\xcf\xff\xff\xff\xff\xff\xff\xff\xff"),
    V("int8", "\xd0\x80"),
    V("int16", "\xd1\x80\x00"),
    V("int32", "\xd2\x80\x00\x00\x00"),
    V("int64", "\xd3\x80\x00\x00\x00\x00\x00\x00\x00"),
    V("fixext1", "\xd4\x05\xaa"),
    V("fixext2", "\xd5\x05\xaa\xbb"),
    V("fixext4", "\xd6\x05\xaa\xbb\xcc\xdd"),
    V("fixext8", "\xd7\x05\x01\x02\x03\x04\x05\x06\x07\x08"),
    V("fixext16", "\xd8\x05\x01\x02\x03\x04\x05\x06\x07\x08\x01\x02\x03\x04\x05\x06\x07\x08"),
    V("fixstr",
      "\xa3"
      "abc"),
    V("empty fixstr", "\xa0"),
    V("str8",
      "\xd9\x03"
      "abc"),
    V("str16",
      "\xda\x00\x03"
      "abc"),
    V("str32",
      "\xdb\x00\x00\x00\x03"
      "abc"),
    V("fixarray", "\x92\x01\x02"),
    V("empty fixarray", "\x90"),
    V("array16", "\xdc\x00\x02\x01\x02"),
    V("array32", "\xdd\x00\x00\x00\x02\x01\x02"),
    V("fixmap",
      "\x81\xa1"
      "b"
      "\x01"),
    V("empty fixmap", "\x80"),
    V("map16",
      "\xde\x00\x01\xa1"
      "b"
      "\x01"),
    V("map32",
      "\xdf\x00\x00\x00\x01\xa1"
      "b"
      "\x01"),
};

/* {"a": value} */
static size_t wrap(uint8_t *out, const typed_value *v) {
  memcpy(out,
         "\x81\xa1"
         "a",
         3);
  memcpy(out + 3, v->bytes, v->len);
  return 3 + v->len;
}

static void test_every_type_accepted_and_unpacked(void) {
  uint8_t buf[64];
  for (size_t i = 0; i < sizeof every_type / sizeof *every_type; i++) {
    size_t n = wrap(buf, &every_type[i]);
    fm_diag d = {{0}};
    int rc = fm_msg_check(buf, n, &fm_msg_request_limits, &d);
    if (rc) fprintf(stderr, "  %s: %s\n", every_type[i].name, d.text);
    CHECK_EQ_INT(rc, FM_OK);
    msgpack_zone zone;
    msgpack_object obj;
    msgpack_zone_init(&zone, 256);
    CHECK_EQ_INT(fm_msg_unpack(buf, n, &fm_msg_request_limits, &zone, &obj, &d), FM_OK);
    CHECK(fm_msg_get(&obj, "a") != NULL);
    msgpack_zone_destroy(&zone);
  }
}

/* Every strict prefix of every valid message is truncated, and one byte more is trailing. */
static void test_every_prefix_truncated_and_trailing(void) {
  uint8_t buf[64];
  for (size_t i = 0; i < sizeof every_type / sizeof *every_type; i++) {
    size_t n = wrap(buf, &every_type[i]);
    for (size_t k = 1; k < n; k++) {
      fm_diag d = {{0}};
      int rc = fm_msg_check(buf, k, &fm_msg_request_limits, &d);
      if (rc != FM_EMALFORMED) fprintf(stderr, "  %s prefix %zu: rc %d\n", every_type[i].name, k, rc);
      CHECK_EQ_INT(rc, FM_EMALFORMED);
    }
    buf[n] = 0xc0;
    fm_diag d = {{0}};
    CHECK_EQ_INT(fm_msg_check(buf, n + 1, &fm_msg_request_limits, &d), FM_EMALFORMED);
    CHECK_STR_CONTAINS(d.text, "trailing");
  }
  fm_diag d = {{0}};
  CHECK_EQ_INT(fm_msg_check((const uint8_t *)"", 0, &fm_msg_request_limits, &d), FM_EMALFORMED);
  CHECK_STR_CONTAINS(d.text, "empty");
}

static void test_reserved_c1(void) {
  fm_diag d = {{0}};
  CHECK_EQ_INT(fm_msg_check((const uint8_t *)"\xc1", 1, &fm_msg_request_limits, &d), FM_EMALFORMED);
  CHECK_STR_CONTAINS(d.text, "0xc1");
  /* nested inside an array inside a map */
  const uint8_t nested[] = {0x81, 0xa1, 'a', 0x92, 0x01, 0xc1};
  CHECK_EQ_INT(fm_msg_check(nested, sizeof nested, &fm_msg_request_limits, &d), FM_EMALFORMED);
  CHECK_STR_CONTAINS(d.text, "offset 5");
}

/* Counts and lengths beyond the buffer, refused without reading or allocating them. */
static void test_hostile_counts(void) {
  fm_diag d = {{0}};
  const uint8_t arr32[] = {0xdd, 0xff, 0xff, 0xff, 0xff, 0x01, 0x02, 0x03};
  clock_t t0 = clock();
  CHECK_EQ_INT(fm_msg_check(arr32, sizeof arr32, &fm_msg_request_limits, &d), FM_EMALFORMED);
  CHECK((clock() - t0) < CLOCKS_PER_SEC / 10);
  CHECK_STR_CONTAINS(d.text, "4294967295 elements");
  /* msgpack_unpack would try to allocate ~100 GB for this: fm_msg_unpack never lets it */
  msgpack_zone zone;
  msgpack_object obj;
  msgpack_zone_init(&zone, 256);
  CHECK_EQ_INT(fm_msg_unpack(arr32, sizeof arr32, &fm_msg_request_limits, &zone, &obj, &d), FM_EMALFORMED);
  msgpack_zone_destroy(&zone);

  const uint8_t map32[] = {0xdf, 0x80, 0x00, 0x00, 0x00, 0xa1, 'a', 0x01};
  CHECK_EQ_INT(fm_msg_check(map32, sizeof map32, &fm_msg_request_limits, &d), FM_EMALFORMED);
  const uint8_t map16[] = {0xde, 0xff, 0xff, 0xa1, 'a', 0x01};
  CHECK_EQ_INT(fm_msg_check(map16, sizeof map16, &fm_msg_request_limits, &d), FM_EMALFORMED);
  /* a count that fits the bytes but elements that do not parse: still caught */
  const uint8_t arr2[] = {0x92, 0xa5, 'a'};
  CHECK_EQ_INT(fm_msg_check(arr2, sizeof arr2, &fm_msg_request_limits, &d), FM_EMALFORMED);
  /* str32/bin32/ext32 lengths past the end */
  const uint8_t s32[] = {0xdb, 0x00, 0x00, 0x10, 0x00, 'a'};
  CHECK_EQ_INT(fm_msg_check(s32, sizeof s32, &fm_msg_request_limits, &d), FM_EMALFORMED);
  const uint8_t b32[] = {0xc6, 0x00, 0x00, 0x00, 0x02, 'a'};
  CHECK_EQ_INT(fm_msg_check(b32, sizeof b32, &fm_msg_request_limits, &d), FM_EMALFORMED);
  const uint8_t e32[] = {0xc9, 0x00, 0x00, 0x00, 0x01, 0x05};
  CHECK_EQ_INT(fm_msg_check(e32, sizeof e32, &fm_msg_request_limits, &d), FM_EMALFORMED);
}

/* {"a": [[...]]} with `arrays` nested arrays: depth = 1 + arrays. */
static size_t nested(uint8_t *buf, int arrays) {
  size_t n = 0;
  buf[n++] = 0x81;
  buf[n++] = 0xa1;
  buf[n++] = 'a';
  for (int i = 0; i < arrays; i++) buf[n++] = (uint8_t)(i + 1 < arrays ? 0x91 : 0x90);
  return n;
}

static void test_depth_limit(void) {
  uint8_t buf[64];
  fm_diag d = {{0}};
  size_t n = nested(buf, 7); /* depth 8: the request limit */
  CHECK_EQ_INT(fm_msg_check(buf, n, &fm_msg_request_limits, &d), FM_OK);
  n = nested(buf, 8); /* depth 9 */
  CHECK_EQ_INT(fm_msg_check(buf, n, &fm_msg_request_limits, &d), FM_ELIMIT);
  CHECK_STR_CONTAINS(d.text, "nested 9 deep");
  CHECK_EQ_INT(fm_msg_check(buf, n, &fm_msg_reply_limits, &d), FM_OK);
  n = nested(buf, 40); /* far deeper than msgpack-c's own parser stack */
  CHECK_EQ_INT(fm_msg_check(buf, n, &fm_msg_reply_limits, &d), FM_ELIMIT);
  /* generous limits are still capped at what msgpack-c can unpack (32 levels) */
  fm_msg_limits deep = fm_msg_reply_limits;
  deep.max_depth = 1000;
  CHECK_EQ_INT(fm_msg_check(buf, n, &deep, &d), FM_ELIMIT);
  CHECK_STR_CONTAINS(d.text, "exceeds the limit 32");
  n = nested(buf, 31); /* depth 32: accepted, and msgpack-c unpacks it */
  CHECK_EQ_INT(fm_msg_check(buf, n, &deep, &d), FM_OK);
  msgpack_zone zone;
  msgpack_object obj;
  msgpack_zone_init(&zone, 1024);
  CHECK_EQ_INT(fm_msg_unpack(buf, n, &deep, &zone, &obj, &d), FM_OK);
  msgpack_zone_destroy(&zone);
}

static void test_object_and_size_limits(void) {
  fm_msg_limits lim = {.max_depth = 4, .max_objects = 10, .max_str = 3, .max_bin = 2};
  fm_diag d = {{0}};
  /* map of 4 entries: 1 + 8 = 9 objects: ok; 5 entries: 11: refused before descending */
  const uint8_t m4[] = {0x84, 1, 1, 2, 2, 3, 3, 4, 4};
  CHECK_EQ_INT(fm_msg_check(m4, sizeof m4, &lim, &d), FM_OK);
  const uint8_t m5[] = {0x85, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5};
  CHECK_EQ_INT(fm_msg_check(m5, sizeof m5, &lim, &d), FM_ELIMIT);
  CHECK_STR_CONTAINS(d.text, "objects");
  /* objects counted across nesting: [[1,2,3],[4,5,6],[7]] = 1 + 3 + 7 = 11 */
  const uint8_t nest[] = {0x93, 0x93, 1, 2, 3, 0x93, 4, 5, 6, 0x91, 7};
  CHECK_EQ_INT(fm_msg_check(nest, sizeof nest, &lim, &d), FM_ELIMIT);
  const uint8_t s3[] = {0xa3, 'a', 'b', 'c'}, s4[] = {0xd9, 4, 'a', 'b', 'c', 'd'};
  CHECK_EQ_INT(fm_msg_check(s3, sizeof s3, &lim, &d), FM_OK);
  CHECK_EQ_INT(fm_msg_check(s4, sizeof s4, &lim, &d), FM_ELIMIT);
  CHECK_STR_CONTAINS(d.text, "max_str");
  const uint8_t b2[] = {0xc4, 2, 0, 0}, b3[] = {0xc4, 3, 0, 0, 0};
  CHECK_EQ_INT(fm_msg_check(b2, sizeof b2, &lim, &d), FM_OK);
  CHECK_EQ_INT(fm_msg_check(b3, sizeof b3, &lim, &d), FM_ELIMIT);
  CHECK_STR_CONTAINS(d.text, "max_bin");
  /* a huge declared str length is a limit problem, reported without reading it */
  const uint8_t huge[] = {0xdb, 0x7f, 0xff, 0xff, 0xff};
  CHECK_EQ_INT(fm_msg_check(huge, sizeof huge, &fm_msg_request_limits, &d), FM_ELIMIT);
}

static void test_unpack_requires_map(void) {
  msgpack_zone zone;
  msgpack_object obj;
  fm_diag d = {{0}};
  msgpack_zone_init(&zone, 256);
  CHECK_EQ_INT(fm_msg_unpack((const uint8_t *)"\x92\x01\x02", 3, &fm_msg_request_limits, &zone, &obj, &d), FM_ESCHEMA);
  CHECK_STR_CONTAINS(d.text, "must be a map");
  msgpack_zone_destroy(&zone);
}

static void pack_sample(msgpack_sbuffer *sb) {
  msgpack_packer pk;
  msgpack_sbuffer_init(sb);
  msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, 9);
  fm_pack_kv_cstr(&pk, "s", "hello");
  fm_pack_kv_u64(&pk, "u", 5);
  fm_pack_kv_i64(&pk, "i", -3);
  fm_pack_kv_u64(&pk, "big", (uint64_t)INT64_MAX + 2);
  fm_pack_kv_f64(&pk, "f", 1.5);
  fm_pack_kv_bool(&pk, "b", true);
  fm_pack_cstr(&pk, "bin");
  fm_pack_bin(&pk, "\x01\x02\x03", 3);
  fm_pack_cstr(&pk, "nul");
  fm_pack_strn(&pk, "a\0b", 3);
  fm_pack_kv_cstr(&pk, "empty", "");
}

static void test_getters(void) {
  msgpack_sbuffer sb;
  pack_sample(&sb);
  msgpack_zone zone;
  msgpack_object m;
  fm_diag d = {{0}};
  msgpack_zone_init(&zone, 1024);
  CHECK_EQ_INT(fm_msg_unpack((uint8_t *)sb.data, sb.size, &fm_msg_request_limits, &zone, &m, &d), FM_OK);

  const char *s;
  size_t n;
  CHECK_EQ_INT(fm_msg_get_str(&m, "s", &s, &n, &d), FM_OK);
  CHECK(n == 5 && memcmp(s, "hello", 5) == 0);
  CHECK(fm_msg_str_eq(fm_msg_get(&m, "s"), "hello"));
  CHECK(!fm_msg_str_eq(fm_msg_get(&m, "s"), "hell"));
  CHECK(!fm_msg_str_eq(fm_msg_get(&m, "u"), "5"));
  CHECK_EQ_INT(fm_msg_get_str(&m, "u", &s, &n, &d), FM_ESCHEMA);
  CHECK_STR_CONTAINS(d.text, "'u'");
  CHECK_EQ_INT(fm_msg_get_str(&m, "missing", &s, &n, &d), FM_ENOT_FOUND);

  uint64_t u;
  CHECK_EQ_INT(fm_msg_get_u64(&m, "u", &u, &d), FM_OK);
  CHECK(u == 5);
  CHECK_EQ_INT(fm_msg_get_u64(&m, "i", &u, &d), FM_ESCHEMA);
  CHECK_EQ_INT(fm_msg_get_u64(&m, "f", &u, &d), FM_ESCHEMA);

  int64_t i;
  CHECK_EQ_INT(fm_msg_get_i64(&m, "i", &i, &d), FM_OK);
  CHECK(i == -3);
  CHECK_EQ_INT(fm_msg_get_i64(&m, "u", &i, &d), FM_OK);
  CHECK(i == 5);
  CHECK_EQ_INT(fm_msg_get_i64(&m, "big", &i, &d), FM_ESCHEMA);

  double f;
  CHECK_EQ_INT(fm_msg_get_f64(&m, "f", &f, &d), FM_OK);
  CHECK(f == 1.5);
  CHECK_EQ_INT(fm_msg_get_f64(&m, "i", &f, &d), FM_OK);
  CHECK(f == -3.0);
  CHECK_EQ_INT(fm_msg_get_f64(&m, "s", &f, &d), FM_ESCHEMA);

  bool b = false;
  CHECK_EQ_INT(fm_msg_get_bool(&m, "b", &b, &d), FM_OK);
  CHECK(b);
  CHECK_EQ_INT(fm_msg_get_bool(&m, "u", &b, &d), FM_ESCHEMA);

  const uint8_t *p;
  CHECK_EQ_INT(fm_msg_get_bin(&m, "bin", &p, &n, &d), FM_OK);
  CHECK(n == 3 && p[2] == 3);
  CHECK_EQ_INT(fm_msg_get_bin(&m, "s", &p, &n, &d), FM_ESCHEMA);

  char small[6], tiny[5];
  CHECK_EQ_INT(fm_msg_copy_str(&m, "s", small, sizeof small, &d), FM_OK);
  CHECK(strcmp(small, "hello") == 0);
  CHECK_EQ_INT(fm_msg_copy_str(&m, "s", tiny, sizeof tiny, &d), FM_ELIMIT);
  CHECK_EQ_INT(fm_msg_copy_str(&m, "nul", small, sizeof small, &d), FM_ESCHEMA);
  CHECK_STR_CONTAINS(d.text, "NUL");
  CHECK_EQ_INT(fm_msg_copy_str(&m, "empty", small, sizeof small, &d), FM_OK);
  CHECK(small[0] == '\0');

  CHECK(fm_msg_get(NULL, "s") == NULL);
  CHECK(fm_msg_get(fm_msg_get(&m, "u"), "s") == NULL);
  msgpack_zone_destroy(&zone);
  msgpack_sbuffer_destroy(&sb);
}

static void test_error_reply(void) {
  msgpack_sbuffer sb;
  msgpack_packer pk;
  msgpack_sbuffer_init(&sb);
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  fm_pack_error_reply(&pk, 42, FM_EUNKNOWN_OP, "ops[3].op: unknown op 'foo'");
  msgpack_zone zone;
  msgpack_object m;
  fm_diag d = {{0}};
  msgpack_zone_init(&zone, 1024);
  CHECK_EQ_INT(fm_msg_unpack((uint8_t *)sb.data, sb.size, &fm_msg_reply_limits, &zone, &m, &d), FM_OK);
  CHECK_EQ_INT(m.via.map.size, 5);
  bool ok = true;
  uint64_t id = 0;
  CHECK_EQ_INT(fm_msg_get_bool(&m, "ok", &ok, &d), FM_OK);
  CHECK(!ok);
  CHECK_EQ_INT(fm_msg_get_u64(&m, "id", &id, &d), FM_OK);
  CHECK(id == 42);
  CHECK(fm_msg_str_eq(fm_msg_get(&m, "code"), "unknown_op"));
  CHECK(fm_msg_str_eq(fm_msg_get(&m, "message"), fm_strerror(FM_EUNKNOWN_OP)));
  CHECK(fm_msg_str_eq(fm_msg_get(&m, "detail"), "ops[3].op: unknown op 'foo'"));
  const char *s;
  size_t n;
  CHECK_EQ_INT(fm_msg_get_str(&m, "code", &s, &n, &d), FM_OK);
  CHECK_EQ_INT(fm_err_from_slug(s, n), FM_EUNKNOWN_OP);
  msgpack_zone_destroy(&zone);
  msgpack_sbuffer_destroy(&sb);
}

/* Random bytes never crash the checker, and whatever it accepts msgpack-c unpacks. */
static void test_random_bytes(void) {
  uint32_t x = 12345;
  uint8_t buf[48];
  int accepted = 0;
  for (int iter = 0; iter < 200000; iter++) {
    size_t n = 1 + iter % sizeof buf;
    for (size_t i = 0; i < n; i++) {
      x = x * 1103515245u + 12345u;
      buf[i] = (uint8_t)(x >> 16);
    }
    buf[0] = (uint8_t)(0x80 | (buf[0] & 0x0f)); /* a fixmap, to reach deeper code more often */
    fm_diag d;
    if (fm_msg_check(buf, n, &fm_msg_request_limits, &d) == FM_OK) {
      msgpack_zone zone;
      msgpack_object obj;
      msgpack_zone_init(&zone, 256);
      size_t off = 0;
      CHECK_EQ_INT(msgpack_unpack((const char *)buf, n, &off, &zone, &obj), MSGPACK_UNPACK_SUCCESS);
      CHECK(off == n);
      msgpack_zone_destroy(&zone);
      accepted++;
    }
  }
  CHECK(accepted > 0);
}

int main(void) {
  RUN(test_every_type_accepted_and_unpacked);
  RUN(test_every_prefix_truncated_and_trailing);
  RUN(test_reserved_c1);
  RUN(test_hostile_counts);
  RUN(test_depth_limit);
  RUN(test_object_and_size_limits);
  RUN(test_unpack_requires_map);
  RUN(test_getters);
  RUN(test_error_reply);
  RUN(test_random_bytes);
  return FM_TEST_DONE();
}
