/* e2e_remote_entry.c: the portable entry value (fm_remote_entry.h) and the Redis key: a round
 * trip, then every way a value can be wrong (tampered, wrong secret, unsigned, another device,
 * another codegen/NVRTC, another fragment) refused with its reason. No Redis needed. */
#include <stdlib.h>
#include <string.h>

#include "fm_test.h"
#include "fm_remote.h"
#include "fm_remote_entry.h"

static uint8_t canon[] = {0x81, 0xa1, 'x', 0x01};
static uint8_t cubin[] = {0x7f, 'E', 'L', 'F', 1, 2, 3, 4, 5, 6, 7, 8};
static uint8_t meta[] = {0x81, 0xa1, 'k', 0x02};

static void sample(fm_entry *e, fm_remote_build *b, fm_remote_secret *s) {
  memset(e, 0, sizeof *e);
  memset(e->key.bytes, 0xab, sizeof e->key.bytes);
  snprintf(e->device, sizeof e->device, "none/sm_90a");
  snprintf(e->kind, sizeof e->kind, "pointwise");
  e->canonical = canon, e->canonical_len = sizeof canon;
  e->cubin = cubin, e->cubin_len = sizeof cubin;
  e->meta = meta, e->meta_len = sizeof meta;
  e->source = "__global__ void k() {}";
  e->state = FM_STATE_TUNED;
  e->created = 1700000000;
  memset(b, 0, sizeof *b);
  snprintf(b->arch, sizeof b->arch, "sm_90a");
  b->codegen_version = 4, b->nvrtc_major = 13, b->nvrtc_minor = 0, b->vocab_version = 1;
  memset(s, 0, sizeof *s);
  memcpy(s->bytes, "cluster-secret", 14);
  s->len = 14;
}

static void test_round_trip(void) {
  fm_entry e, out;
  fm_remote_build b, bout;
  fm_remote_secret s;
  fm_diag d = {{0}};
  uint8_t *val;
  size_t len;
  sample(&e, &b, &s);
  CHECK_EQ_INT(fm_remote_entry_encode(&e, &b, &s, &val, &len), FM_OK);
  CHECK_EQ_INT(fm_remote_entry_decode(val, len, &s, &out, &bout, &d), FM_OK);
  CHECK(memcmp(out.key.bytes, e.key.bytes, 32) == 0);
  CHECK(out.cubin_len == sizeof cubin && memcmp(out.cubin, cubin, sizeof cubin) == 0);
  CHECK(out.meta_len == sizeof meta && memcmp(out.meta, meta, sizeof meta) == 0);
  CHECK(out.source && strcmp(out.source, e.source) == 0);
  CHECK_EQ_INT(out.state, FM_STATE_TUNED);
  CHECK_EQ_INT(fm_remote_entry_verify(&out, &bout, &e.key, "none/sm_90a", &b, canon, sizeof canon, &d), FM_OK);
  fm_entry_free(&out);
  free(val);
}

static void test_tampered_and_wrong_secret(void) {
  fm_entry e, out;
  fm_remote_build b, bout;
  fm_remote_secret s, other;
  fm_diag d = {{0}};
  uint8_t *val;
  size_t len;
  sample(&e, &b, &s);
  CHECK_EQ_INT(fm_remote_entry_encode(&e, &b, &s, &val, &len), FM_OK);
  /* Every single-byte change anywhere is refused. */
  int refused = 0;
  for (size_t i = 0; i < len; i++) {
    val[i] ^= 0x20;
    d.text[0] = '\0';
    if (fm_remote_entry_decode(val, len, &s, &out, &bout, &d) != FM_OK)
      refused++;
    else
      fm_entry_free(&out);
    val[i] ^= 0x20;
  }
  CHECK_EQ_INT(refused, (long long)len);
  other = s;
  other.bytes[0] ^= 1;
  CHECK_EQ_INT(fm_remote_entry_decode(val, len, &other, &out, &bout, &d), FM_EDENIED);
  CHECK_STR_CONTAINS(d.text, "HMAC");
  free(val);
  /* Unsigned values are refused by a node with a secret. */
  fm_remote_secret none = {.len = 0};
  CHECK_EQ_INT(fm_remote_entry_encode(&e, &b, &none, &val, &len), FM_OK);
  CHECK_EQ_INT(fm_remote_entry_decode(val, len, &s, &out, &bout, &d), FM_EDENIED);
  CHECK_STR_CONTAINS(d.text, "not signed");
  CHECK_EQ_INT(fm_remote_entry_decode(val, len, &none, &out, &bout, &d), FM_OK);
  fm_entry_free(&out);
  val[len - 1] ^= 1;
  CHECK_EQ_INT(fm_remote_entry_decode(val, len, &none, &out, &bout, &d), FM_ECORRUPT);
  free(val);
  CHECK(fm_remote_entry_decode((const uint8_t *)"FMR1", 4, &s, &out, &bout, &d) == FM_EMALFORMED);
}

static void test_verify_refusals(void) {
  fm_entry e;
  fm_remote_build b, mine;
  fm_remote_secret s;
  fm_diag d = {{0}};
  fm_key other;
  sample(&e, &b, &s);
  mine = b;
  CHECK(fm_remote_entry_verify(&e, &b, &e.key, "H100/sm_90a/132sm", &mine, NULL, 0, &d) == FM_EINVAL);
  CHECK_STR_CONTAINS(d.text, "device");
  mine.codegen_version = 5;
  CHECK(fm_remote_entry_verify(&e, &b, &e.key, "none/sm_90a", &mine, NULL, 0, &d) == FM_EINVAL);
  CHECK_STR_CONTAINS(d.text, "codegen");
  mine = b;
  mine.nvrtc_minor = 1;
  CHECK(fm_remote_entry_verify(&e, &b, &e.key, "none/sm_90a", &mine, NULL, 0, &d) == FM_EINVAL);
  CHECK_STR_CONTAINS(d.text, "NVRTC");
  mine = b;
  snprintf(mine.arch, sizeof mine.arch, "sm_80");
  CHECK(fm_remote_entry_verify(&e, &b, &e.key, "none/sm_90a", &mine, NULL, 0, &d) == FM_EINVAL);
  CHECK_STR_CONTAINS(d.text, "arch");
  mine = b;
  other = e.key;
  other.bytes[0] ^= 1;
  CHECK(fm_remote_entry_verify(&e, &b, &other, "none/sm_90a", &mine, NULL, 0, &d) == FM_EINVAL);
  CHECK_STR_CONTAINS(d.text, "another key");
  uint8_t canon2[] = {0x81, 0xa1, 'x', 0x02};
  CHECK(fm_remote_entry_verify(&e, &b, &e.key, "none/sm_90a", &mine, canon2, sizeof canon2, &d) == FM_EINVAL);
  CHECK_STR_CONTAINS(d.text, "canonical");
  /* no CUBIN: refused for a kernel, accepted for a cuBLASLt plan (a direct plan has none) */
  e.cubin = NULL, e.cubin_len = 0;
  CHECK(fm_remote_entry_verify(&e, &b, &e.key, "none/sm_90a", &mine, NULL, 0, &d) == FM_EINVAL);
  CHECK_STR_CONTAINS(d.text, "no kernel");
  snprintf(e.kind, sizeof e.kind, "cublaslt");
  CHECK(fm_remote_entry_verify(&e, &b, &e.key, "none/sm_90a", &mine, NULL, 0, &d) == FM_OK);
  e.meta_len = 0;
  CHECK(fm_remote_entry_verify(&e, &b, &e.key, "none/sm_90a", &mine, NULL, 0, &d) == FM_EINVAL);
}

static void test_rkey(void) {
  fm_key k;
  char rkey[320];
  memset(k.bytes, 0x01, sizeof k.bytes);
  fm_remote_entry_rkey("NVIDIA H100 80GB HBM3/sm_90a/132sm", &k, rkey, sizeof rkey);
  CHECK_STR_CONTAINS(rkey, "fusemld:v1:NVIDIA_H100_80GB_HBM3_sm_90a_132sm:0101");
  CHECK(strchr(rkey, ' ') == NULL);
}

int main(void) {
  RUN(test_round_trip);
  RUN(test_tampered_and_wrong_secret);
  RUN(test_verify_refusals);
  RUN(test_rkey);
  return FM_TEST_DONE();
}
