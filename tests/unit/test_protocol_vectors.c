/* test_protocol_vectors.c: the shared vectors in protocol/vectors (manifest.json), produced by
 * make_vectors.py independently of this implementation: every outcome, every canonical byte
 * and every key must agree. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fm_error.h"
#include "fm_fingerprint.h"
#include "fm_fragment.h"
#include "fm_msg.h"
#include "fm_test.h"
#include "test_protocol_util.h"

static char dir[1024];
static json_t *manifest;
static fm_device_id device;
static fm_key_inputs key_in;
static char options[256];

static uint8_t *read_file(const char *name, size_t *len) {
  char path[1400];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "  cannot open %s\n", path);
    return NULL;
  }
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *buf = malloc(n > 0 ? (size_t)n : 1);
  *len = fread(buf, 1, (size_t)n, f);
  fclose(f);
  return buf;
}

static const char *str_at(json_t *o, const char *key) {
  json_t *v = json_object_get(o, key);
  return json_is_string(v) ? json_string_value(v) : NULL;
}

static int load_manifest(void) {
  const char *src = getenv("FM_SOURCE_DIR");
  snprintf(dir, sizeof dir, "%s/protocol/vectors", src ? src : ".");
  char path[1100];
  snprintf(path, sizeof path, "%s/manifest.json", dir);
  json_error_t err;
  manifest = json_load_file(path, 0, &err);
  if (!manifest) {
    fprintf(stderr, "cannot load %s: %s (set FM_SOURCE_DIR)\n", path, err.text);
    return -1;
  }
  json_t *k = json_object_get(manifest, "key_inputs");
  json_t *dev = json_object_get(k, "device");
  snprintf(device.name, sizeof device.name, "%s", str_at(dev, "name"));
  snprintf(device.arch, sizeof device.arch, "%s", str_at(dev, "arch"));
  device.cc_major = (uint32_t)json_integer_value(json_array_get(json_object_get(dev, "cc"), 0));
  device.cc_minor = (uint32_t)json_integer_value(json_array_get(json_object_get(dev, "cc"), 1));
  device.sm_count = (uint32_t)json_integer_value(json_object_get(dev, "sm_count"));
  snprintf(options, sizeof options, "%s", str_at(k, "options"));
  key_in.device = &device;
  key_in.codegen_version = (uint32_t)json_integer_value(json_object_get(k, "codegen"));
  key_in.nvrtc_major = (uint32_t)json_integer_value(json_array_get(json_object_get(k, "nvrtc"), 0));
  key_in.nvrtc_minor = (uint32_t)json_integer_value(json_array_get(json_object_get(k, "nvrtc"), 1));
  key_in.nvrtc_options = options;
  key_in.vocab_version = (uint32_t)json_integer_value(json_object_get(k, "vocab"));
  key_in.cublaslt_version = (uint64_t)json_integer_value(json_object_get(k, "cublaslt"));
  return 0;
}

static fm_fragment frag;

/* Decodes bytes; on success returns the canonical bytes (malloc'd) through *canon. */
static int outcome(const uint8_t *mp, size_t len, fm_diag *d, uint8_t **canon, size_t *clen) {
  *canon = NULL;
  *clen = 0;
  int rc = tp_decode_mp(mp, len, &frag, d);
  if (rc == FM_OK) rc = fm_fragment_canonical_bytes(&frag, canon, clen);
  return rc;
}

static void check_vector(json_t *v) {
  const char *name = str_at(v, "name");
  const char *expect = str_at(v, "expect");
  size_t len = 0, clen = 0;
  uint8_t *mp = read_file(str_at(v, "msgpack"), &len), *canon = NULL;
  CHECK(mp != NULL && name && expect);
  if (!mp || !name || !expect) return;
  fm_diag d = {{0}};
  int rc = outcome(mp, len, &d, &canon, &clen);

  if (strcmp(expect, "reject") == 0) {
    const char *code = str_at(v, "code"), *detail = str_at(v, "detail_contains");
    if (!code || strcmp(fm_err_slug(rc), code) != 0)
      fprintf(stderr, "  %s: got %s (%s), want %s\n", name, fm_err_slug(rc), d.text, code ? code : "?");
    CHECK(code && strcmp(fm_err_slug(rc), code) == 0);
    CHECK_STR_CONTAINS(d.text, detail ? detail : "?");
  } else {
    if (rc) fprintf(stderr, "  %s: refused: %s\n", name, d.text);
    CHECK_EQ_INT(rc, FM_OK);
    size_t elen = 0;
    uint8_t *expected = read_file(str_at(v, "canonical"), &elen);
    if (!tp_bytes_eq(canon, clen, expected, elen))
      fprintf(stderr, "  %s: canonical bytes differ from %s\n", name, str_at(v, "canonical"));
    CHECK(tp_bytes_eq(canon, clen, expected, elen));
    fm_key key;
    char hex[FM_KEY_HEX];
    key_in.canonical = canon;
    key_in.canonical_len = clen;
    CHECK_EQ_INT(fm_fingerprint(&key_in, &key), FM_OK);
    fm_key_to_hex(&key, hex);
    const char *want = str_at(v, "key");
    if (!want || strcmp(hex, want) != 0) fprintf(stderr, "  %s: key %s, want %s\n", name, hex, want ? want : "?");
    CHECK(want && strcmp(hex, want) == 0);
    /* the canonical bytes are themselves a valid fragment that canonicalizes to itself */
    uint8_t *again = NULL;
    size_t alen = 0;
    CHECK_EQ_INT(outcome(canon, clen, &d, &again, &alen), FM_OK);
    CHECK(tp_bytes_eq(again, alen, canon, clen));
    free(again);
    free(expected);

    const char *same = str_at(v, "same_canonical_as");
    if (same) {
      char other[256];
      snprintf(other, sizeof other, "%s.canon.mp", same);
      size_t olen = 0;
      uint8_t *ob = read_file(other, &olen);
      CHECK(tp_bytes_eq(canon, clen, ob, olen));
      free(ob);
    }
  }

  /* The JSON form is the same structure: converted here with jansson, it must give the
   * same bytes as the msgpack file, and so the same outcome. */
  const char *jname = str_at(v, "json");
  if (jname) {
    size_t jlen = 0;
    char *text = (char *)read_file(jname, &jlen);
    json_error_t err;
    json_t *j = text ? json_loadb(text, jlen, 0, &err) : NULL;
    CHECK(j != NULL);
    if (j) {
      msgpack_sbuffer sb;
      msgpack_packer pk;
      msgpack_sbuffer_init(&sb);
      msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
      CHECK_EQ_INT(tp_pack_json(&pk, j), 0);
      if (!tp_bytes_eq(sb.data, sb.size, mp, len)) fprintf(stderr, "  %s: JSON and msgpack differ\n", name);
      CHECK(tp_bytes_eq(sb.data, sb.size, mp, len));
      uint8_t *jc = NULL;
      size_t jclen = 0;
      fm_diag jd = {{0}};
      CHECK_EQ_INT(outcome((uint8_t *)sb.data, sb.size, &jd, &jc, &jclen), rc);
      if (rc == FM_OK) CHECK(tp_bytes_eq(jc, jclen, canon, clen));
      free(jc);
      msgpack_sbuffer_destroy(&sb);
      json_decref(j);
    }
    free(text);
  }
  free(canon);
  free(mp);
}

static void test_all_vectors(void) {
  json_t *vs = json_object_get(manifest, "vectors");
  CHECK(json_array_size(vs) >= 20);
  size_t i;
  json_t *v;
  int accepted = 0, rejected = 0;
  json_array_foreach(vs, i, v) {
    int before = fm_test_failed_checks_;
    check_vector(v);
    if (fm_test_failed_checks_ != before) fprintf(stderr, "  vector %s failed\n", str_at(v, "name"));
    if (strcmp(str_at(v, "expect"), "accept") == 0)
      accepted++;
    else
      rejected++;
  }
  CHECK(accepted >= 7 && rejected >= 13);
}

/* Random corruptions of every accepted vector: whatever the checker, unpacker, decoder and
 * validator make of them must be a clean answer (ASan/UBSan watch), and anything accepted
 * must canonicalize to bytes that decode again to the same canonical form. */
static void test_mutations(void) {
  json_t *vs = json_object_get(manifest, "vectors");
  size_t i;
  json_t *v;
  uint32_t x = 2024;
  int accepted = 0, refused = 0;
  json_array_foreach(vs, i, v) {
    if (strcmp(str_at(v, "expect"), "accept") != 0) continue;
    size_t len = 0;
    uint8_t *orig = read_file(str_at(v, "msgpack"), &len);
    if (!orig) continue;
    uint8_t *buf = malloc(len);
    for (int iter = 0; iter < 3000; iter++) {
      memcpy(buf, orig, len);
      size_t n = len;
      int edits = 1 + iter % 4;
      for (int e = 0; e < edits; e++) {
        x = x * 1103515245u + 12345u;
        size_t at = (x >> 8) % n;
        x = x * 1103515245u + 12345u;
        buf[at] = (iter & 1) ? (uint8_t)(x >> 16) : (uint8_t)(buf[at] ^ (1u << ((x >> 16) & 7)));
      }
      if (iter % 7 == 0) n -= (x >> 4) % n; /* and sometimes cut it short */
      fm_diag d;
      uint8_t *canon = NULL, *again = NULL;
      size_t clen = 0, alen = 0;
      int rc = outcome(buf, n, &d, &canon, &clen);
      if (rc == FM_OK) {
        accepted++;
        CHECK_EQ_INT(outcome(canon, clen, &d, &again, &alen), FM_OK);
        CHECK(tp_bytes_eq(again, alen, canon, clen));
      } else {
        refused++;
        CHECK(rc < 0 && strcmp(fm_err_slug(rc), "unknown") != 0 && d.text[0] != '\0');
      }
      free(canon);
      free(again);
    }
    free(buf);
    free(orig);
  }
  CHECK(accepted > 0 && refused > 0);
}

int main(void) {
  if (load_manifest()) return 1;
  RUN(test_all_vectors);
  RUN(test_mutations);
  json_decref(manifest);
  return FM_TEST_DONE();
}
