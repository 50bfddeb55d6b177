/* fm_fingerprint.c: the cache key, exactly the stream grammar in fm_fingerprint.h. */
#include "fm_fingerprint.h"

#include <stdio.h>
#include <string.h>

#include <openssl/evp.h>

#include "fm_error.h"

#define KEY_MAGIC "fusemld-key"

/* Tags of the key fields (fm_fingerprint.h); never renumber, only append. */
enum {
  TAG_CANONICAL = 1,
  TAG_GPU_NAME = 2,
  TAG_CC_MAJOR = 3,
  TAG_CC_MINOR = 4,
  TAG_SM_COUNT = 5,
  TAG_ARCH = 6,
  TAG_CODEGEN = 7,
  TAG_NVRTC_MAJOR = 8,
  TAG_NVRTC_MINOR = 9,
  TAG_NVRTC_OPTIONS = 10,
  TAG_VOCAB = 11,
  TAG_CUBLASLT = 12,
};

static void put_be64(uint8_t out[8], uint64_t v) {
  for (int i = 7; i >= 0; i--, v >>= 8) out[i] = (uint8_t)v;
}

/* field := u8(tag) u8(type) u64be(len) bytes[len]; returns nonzero on a digest failure. */
static int field(EVP_MD_CTX *ctx, uint8_t tag, char type, const void *p, size_t len) {
  uint8_t head[10];
  head[0] = tag;
  head[1] = (uint8_t)type;
  put_be64(head + 2, len);
  if (!EVP_DigestUpdate(ctx, head, sizeof head)) return 1;
  return len && !EVP_DigestUpdate(ctx, p, len);
}

static int field_u(EVP_MD_CTX *ctx, uint8_t tag, uint64_t v) {
  uint8_t b[8];
  put_be64(b, v);
  return field(ctx, tag, 'u', b, sizeof b);
}

static int field_s(EVP_MD_CTX *ctx, uint8_t tag, const char *s) { return field(ctx, tag, 's', s, strlen(s)); }

int fm_fingerprint(const fm_key_inputs *in, fm_key *out) {
  if (!in || !out || !in->device || !in->nvrtc_options || (!in->canonical && in->canonical_len)) return FM_EINVAL;
  const fm_device_id *dev = in->device;
  /* The fixed-size char arrays must be terminated within their size. */
  if (!memchr(dev->name, '\0', sizeof dev->name) || !memchr(dev->arch, '\0', sizeof dev->arch)) return FM_EINVAL;

  EVP_MD_CTX *ctx = EVP_MD_CTX_new();
  if (!ctx) return FM_ENOMEM;
  int rc = FM_ENOMEM;
  uint8_t format = FM_KEY_FORMAT;
  unsigned int n = 0;
  int bad = !EVP_DigestInit_ex(ctx, EVP_sha256(), NULL);
  bad = bad || !EVP_DigestUpdate(ctx, KEY_MAGIC, sizeof KEY_MAGIC - 1);
  bad = bad || !EVP_DigestUpdate(ctx, &format, 1);
  bad = bad || field(ctx, TAG_CANONICAL, 'b', in->canonical, in->canonical_len);
  bad = bad || field_s(ctx, TAG_GPU_NAME, dev->name);
  bad = bad || field_u(ctx, TAG_CC_MAJOR, dev->cc_major);
  bad = bad || field_u(ctx, TAG_CC_MINOR, dev->cc_minor);
  bad = bad || field_u(ctx, TAG_SM_COUNT, dev->sm_count);
  bad = bad || field_s(ctx, TAG_ARCH, dev->arch);
  bad = bad || field_u(ctx, TAG_CODEGEN, in->codegen_version);
  bad = bad || field_u(ctx, TAG_NVRTC_MAJOR, in->nvrtc_major);
  bad = bad || field_u(ctx, TAG_NVRTC_MINOR, in->nvrtc_minor);
  bad = bad || field_s(ctx, TAG_NVRTC_OPTIONS, in->nvrtc_options);
  bad = bad || field_u(ctx, TAG_VOCAB, in->vocab_version);
  bad = bad || field_u(ctx, TAG_CUBLASLT, in->cublaslt_version);
  bad = bad || !EVP_DigestFinal_ex(ctx, out->bytes, &n) || n != FM_KEY_BYTES;
  if (bad) goto done;
  rc = FM_OK;
done:
  EVP_MD_CTX_free(ctx);
  return rc;
}

void fm_key_to_hex(const fm_key *k, char out[FM_KEY_HEX]) {
  static const char digits[] = "0123456789abcdef";
  for (int i = 0; i < FM_KEY_BYTES; i++) {
    out[2 * i] = digits[k->bytes[i] >> 4];
    out[2 * i + 1] = digits[k->bytes[i] & 15];
  }
  out[2 * FM_KEY_BYTES] = '\0';
}

static int hexval(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

int fm_key_from_hex(const char *s, size_t len, fm_key *out) {
  if (!s || !out || len != 2 * FM_KEY_BYTES) return FM_EINVAL;
  fm_key k;
  for (int i = 0; i < FM_KEY_BYTES; i++) {
    int hi = hexval(s[2 * i]), lo = hexval(s[2 * i + 1]);
    if (hi < 0 || lo < 0) return FM_EINVAL;
    k.bytes[i] = (uint8_t)(hi << 4 | lo);
  }
  *out = k;
  return FM_OK;
}

void fm_device_label(const fm_device_id *dev, char *out, size_t cap) {
  if (!out || cap == 0) return;
  /* Compile-only mode has no GPU name or SM count: the arch alone names the target. */
  if (dev->name[0] == '\0' || strncmp(dev->name, "none", sizeof dev->name) == 0)
    snprintf(out, cap, "none/%.*s", (int)sizeof dev->arch, dev->arch);
  else
    snprintf(out, cap, "%.*s/%.*s/%usm", (int)sizeof dev->name, dev->name, (int)sizeof dev->arch, dev->arch,
             dev->sm_count);
}

void fm_sha256(const void *data, size_t len, uint8_t out[32]) {
  unsigned int n = 0;
  /* EVP_Digest fails only on allocation failure; a zero digest then can never match a
   * stored checksum, so the entry is treated as corrupt rather than trusted. */
  if (!EVP_Digest(len ? data : "", len, out, &n, EVP_sha256(), NULL) || n != 32) memset(out, 0, 32);
}
