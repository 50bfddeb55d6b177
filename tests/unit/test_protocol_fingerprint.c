/* test_protocol_fingerprint.c: the cache key: the stream grammar, sensitivity to every
 * field, hex, device labels, SHA-256 itself. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fm_error.h"
#include "fm_fingerprint.h"
#include "fm_test.h"
#include "test_protocol_util.h"

static const fm_device_id h100 = {
    .name = "NVIDIA H100 80GB HBM3", .cc_major = 9, .cc_minor = 0, .sm_count = 132, .arch = "sm_90a"};
static const uint8_t canon[] = {0x84, 0xa5, 'v', 'o', 'c', 'a', 'b', 0x01};

static fm_key_inputs base_inputs(const fm_device_id *dev) {
  return (fm_key_inputs){.canonical = canon,
                         .canonical_len = sizeof canon,
                         .device = dev,
                         .codegen_version = 1,
                         .nvrtc_major = 13,
                         .nvrtc_minor = 0,
                         .nvrtc_options = "--gpu-architecture=sm_90a -default-device --std=c++17",
                         .vocab_version = 1,
                         .cublaslt_version = 130100};
}

static void test_sha256_known_answer(void) {
  uint8_t out[32];
  fm_key k;
  char hex[FM_KEY_HEX];
  fm_sha256("abc", 3, out);
  memcpy(k.bytes, out, 32);
  fm_key_to_hex(&k, hex);
  CHECK(strcmp(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad") == 0);
  fm_sha256(NULL, 0, out);
  memcpy(k.bytes, out, 32);
  fm_key_to_hex(&k, hex);
  CHECK(strcmp(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855") == 0);
}

/* The grammar written out by hand, independently of fm_fingerprint.c. */
static size_t put_field(uint8_t *p, uint8_t tag, char type, const void *data, uint64_t len) {
  p[0] = tag;
  p[1] = (uint8_t)type;
  for (int i = 0; i < 8; i++) p[2 + i] = (uint8_t)(len >> (56 - 8 * i));
  memcpy(p + 10, data, len);
  return 10 + len;
}

static size_t put_u(uint8_t *p, uint8_t tag, uint64_t v) {
  uint8_t b[8];
  for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (56 - 8 * i));
  return put_field(p, tag, 'u', b, 8);
}

static void test_stream_grammar(void) {
  fm_key_inputs in = base_inputs(&h100);
  uint8_t s[512];
  size_t n = 0;
  memcpy(s, "fusemld-key", 11);
  n = 11;
  s[n++] = FM_KEY_FORMAT;
  n += put_field(s + n, 1, 'b', canon, sizeof canon);
  n += put_field(s + n, 2, 's', h100.name, strlen(h100.name));
  n += put_u(s + n, 3, 9);
  n += put_u(s + n, 4, 0);
  n += put_u(s + n, 5, 132);
  n += put_field(s + n, 6, 's', "sm_90a", 6);
  n += put_u(s + n, 7, 1);
  n += put_u(s + n, 8, 13);
  n += put_u(s + n, 9, 0);
  n += put_field(s + n, 10, 's', in.nvrtc_options, strlen(in.nvrtc_options));
  n += put_u(s + n, 11, 1);
  n += put_u(s + n, 12, 130100);
  uint8_t want[32];
  fm_sha256(s, n, want);
  fm_key k;
  CHECK_EQ_INT(fm_fingerprint(&in, &k), FM_OK);
  CHECK(memcmp(k.bytes, want, 32) == 0);
}

static void test_every_field_matters(void) {
  fm_key ref, k;
  fm_key_inputs in = base_inputs(&h100);
  CHECK_EQ_INT(fm_fingerprint(&in, &ref), FM_OK);
  CHECK_EQ_INT(fm_fingerprint(&in, &k), FM_OK);
  CHECK(memcmp(ref.bytes, k.bytes, 32) == 0); /* deterministic */

  fm_device_id dev;
  int changed = 0, variants = 0;
#define VARIANT(stmt)                                  \
  do {                                                 \
    dev = h100;                                        \
    in = base_inputs(&dev);                            \
    stmt;                                              \
    CHECK_EQ_INT(fm_fingerprint(&in, &k), FM_OK);      \
    variants++;                                        \
    if (memcmp(ref.bytes, k.bytes, 32) != 0)           \
      changed++;                                       \
    else                                               \
      fprintf(stderr, "  no change for: %s\n", #stmt); \
  } while (0)
  VARIANT(in.canonical_len--);
  VARIANT(strcpy(dev.name, "NVIDIA H100 PCIe"));
  VARIANT(dev.cc_major = 8);
  VARIANT(dev.cc_minor = 9);
  VARIANT(dev.sm_count = 114);
  VARIANT(strcpy(dev.arch, "sm_90"));
  VARIANT(in.codegen_version = 2);
  VARIANT(in.nvrtc_major = 12);
  VARIANT(in.nvrtc_minor = 8);
  VARIANT(in.nvrtc_options = "--gpu-architecture=sm_90a --std=c++17");
  VARIANT(in.vocab_version = 2);
  VARIANT(in.cublaslt_version = 130200);
#undef VARIANT
  CHECK_EQ_INT(changed, variants);
  CHECK_EQ_INT(variants, 12);
}

/* Delimited fields: moving bytes from one string field to the next changes the key. */
/* Equivalent fragments (other ids, reordered independent ops, a dead op, a broadcast dim's
 * stride, align above 16) get one key; a meaningful difference gets another. */
static void test_equivalents_share_key(void) {
  static const char *a =
      "{'vocab':1,'inputs':[{'id':0,'dtype':'f16','shape':[-1,64]},{'id':1,'dtype':'f16','shape':[1,64]}],"
      "'ops':[{'op':'mul','out':2,'args':[0,1]},{'op':'const','out':3,'value':0.5},"
      "{'op':'add','out':4,'args':[2,3]}],"
      "'outputs':[{'id':4,'dtype':'f16','shape':[-1,64]}]}";
  static const char *b =
      "{'vocab':1,'inputs':[{'id':9,'dtype':'f16','shape':[-1,64],'align':128},"
      "{'id':8,'dtype':'f16','shape':[1,64],'strides':[4096,1]}],"
      "'ops':[{'op':'const','out':30,'value':0.5},{'op':'exp','out':31,'args':[9]},"
      "{'op':'mul','out':20,'args':[9,8]},{'op':'add','out':40,'args':[20,30]}],"
      "'outputs':[{'id':40,'dtype':'f16','shape':[-1,64]}]}";
  static const char *c = /* 0.25 instead of 0.5 */
      "{'vocab':1,'inputs':[{'id':0,'dtype':'f16','shape':[-1,64]},{'id':1,'dtype':'f16','shape':[1,64]}],"
      "'ops':[{'op':'mul','out':2,'args':[0,1]},{'op':'const','out':3,'value':0.25},"
      "{'op':'add','out':4,'args':[2,3]}],"
      "'outputs':[{'id':4,'dtype':'f16','shape':[-1,64]}]}";
  const char *srcs[3] = {a, b, c};
  fm_key k[3];
  for (int i = 0; i < 3; i++) {
    size_t len = 0;
    uint8_t *cb = tp_canon_json(srcs[i], &len);
    CHECK(cb != NULL);
    fm_key_inputs in = base_inputs(&h100);
    in.canonical = cb;
    in.canonical_len = len;
    CHECK_EQ_INT(fm_fingerprint(&in, &k[i]), FM_OK);
    free(cb);
  }
  CHECK(memcmp(k[0].bytes, k[1].bytes, 32) == 0);
  CHECK(memcmp(k[0].bytes, k[2].bytes, 32) != 0);
}

static void test_fields_delimited(void) {
  fm_device_id a = h100, b = h100;
  strcpy(a.name, "GPUsm_");
  strcpy(a.arch, "90");
  strcpy(b.name, "GPU");
  strcpy(b.arch, "sm_90");
  fm_key_inputs ia = base_inputs(&a), ib = base_inputs(&b);
  fm_key ka, kb;
  CHECK_EQ_INT(fm_fingerprint(&ia, &ka), FM_OK);
  CHECK_EQ_INT(fm_fingerprint(&ib, &kb), FM_OK);
  CHECK(memcmp(ka.bytes, kb.bytes, 32) != 0);
}

static void test_bad_inputs(void) {
  fm_key k;
  fm_key_inputs in = base_inputs(NULL);
  CHECK_EQ_INT(fm_fingerprint(&in, &k), FM_EINVAL);
  in = base_inputs(&h100);
  in.nvrtc_options = NULL;
  CHECK_EQ_INT(fm_fingerprint(&in, &k), FM_EINVAL);
  in = base_inputs(&h100);
  in.canonical = NULL;
  CHECK_EQ_INT(fm_fingerprint(&in, &k), FM_EINVAL);
  fm_device_id unterminated = h100;
  memset(unterminated.arch, 'x', sizeof unterminated.arch);
  in = base_inputs(&unterminated);
  CHECK_EQ_INT(fm_fingerprint(&in, &k), FM_EINVAL);
}

static void test_hex(void) {
  fm_key k, back;
  for (int i = 0; i < FM_KEY_BYTES; i++) k.bytes[i] = (uint8_t)(i * 37 + 5);
  char hex[FM_KEY_HEX];
  fm_key_to_hex(&k, hex);
  CHECK_EQ_INT(strlen(hex), 64);
  for (int i = 0; i < 64; i++) CHECK((hex[i] >= '0' && hex[i] <= '9') || (hex[i] >= 'a' && hex[i] <= 'f'));
  CHECK_EQ_INT(fm_key_from_hex(hex, 64, &back), FM_OK);
  CHECK(memcmp(k.bytes, back.bytes, 32) == 0);
  char upper[FM_KEY_HEX];
  for (int i = 0; i < FM_KEY_HEX; i++) upper[i] = (char)(hex[i] >= 'a' ? hex[i] - 32 : hex[i]);
  CHECK_EQ_INT(fm_key_from_hex(upper, 64, &back), FM_OK);
  CHECK(memcmp(k.bytes, back.bytes, 32) == 0);
  CHECK_EQ_INT(fm_key_from_hex(hex, 63, &back), FM_EINVAL);
  CHECK_EQ_INT(fm_key_from_hex(hex, 4, &back), FM_EINVAL);
  hex[10] = 'g';
  CHECK_EQ_INT(fm_key_from_hex(hex, 64, &back), FM_EINVAL);
  hex[10] = ' ';
  CHECK_EQ_INT(fm_key_from_hex(hex, 64, &back), FM_EINVAL);
}

static void test_device_label(void) {
  char buf[192];
  fm_device_label(&h100, buf, sizeof buf);
  CHECK(strcmp(buf, "NVIDIA H100 80GB HBM3/sm_90a/132sm") == 0);
  fm_device_id none = {.name = "none", .arch = "sm_90a"};
  fm_device_label(&none, buf, sizeof buf);
  CHECK(strcmp(buf, "none/sm_90a") == 0);
  fm_device_label(&h100, buf, 8); /* truncates, terminated */
  CHECK(strcmp(buf, "NVIDIA ") == 0);
}

int main(void) {
  RUN(test_sha256_known_answer);
  RUN(test_stream_grammar);
  RUN(test_every_field_matters);
  RUN(test_equivalents_share_key);
  RUN(test_fields_delimited);
  RUN(test_bad_inputs);
  RUN(test_hex);
  RUN(test_device_label);
  return FM_TEST_DONE();
}
