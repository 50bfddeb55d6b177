/* fm_remote_entry.c: the portable entry value: encode, decode (framing, sum, tag), verify. */
#include "fm_remote_entry.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <msgpack.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "fm_msg.h"

#define MAGIC_LEN 4
#define N_FIELDS  16

int fm_remote_secret_load(const char *path, fm_remote_secret *s, fm_diag *d) {
  memset(s, 0, sizeof *s);
  FILE *f = fopen(path, "rb");
  if (!f) return fm_diag_set(d, FM_EIO, "cannot read the remote secret %s: %s", path, strerror(errno));
  size_t n = fread(s->bytes, 1, sizeof s->bytes, f);
  int more = fgetc(f) != EOF, bad = ferror(f);
  fclose(f);
  if (bad) return fm_diag_set(d, FM_EIO, "cannot read the remote secret %s", path);
  if (more) return fm_diag_set(d, FM_EINVAL, "remote secret %s is larger than %d bytes", path, FM_REMOTE_SECRET_MAX);
  /* Files written by echo end in a newline; the secret is the line. */
  while (n > 0 && (s->bytes[n - 1] == '\n' || s->bytes[n - 1] == '\r')) n--;
  if (n == 0) return fm_diag_set(d, FM_EINVAL, "remote secret %s is empty", path);
  s->len = n;
  return FM_OK;
}

static void put_len(EVP_MD_CTX *c, size_t n) {
  uint8_t le[8];
  for (int i = 0; i < 8; i++) le[i] = (uint8_t)((uint64_t)n >> (8 * i));
  EVP_DigestUpdate(c, le, sizeof le);
}

/* The sum over the blobs that decide what runs; lengths keep the boundaries unambiguous. */
static int blob_sum(const fm_entry *e, uint8_t out[32]) {
  EVP_MD_CTX *c = EVP_MD_CTX_new();
  unsigned len = 0;
  int ok = c && EVP_DigestInit_ex(c, EVP_sha256(), NULL);
  const struct {
    const void *p;
    size_t n;
  } parts[] = {{e->canonical, e->canonical_len}, {e->meta, e->meta_len}, {e->cubin, e->cubin_len}};
  for (size_t i = 0; ok && i < 3; i++) {
    put_len(c, parts[i].n);
    if (parts[i].n) ok = EVP_DigestUpdate(c, parts[i].p, parts[i].n);
  }
  ok = ok && EVP_DigestFinal_ex(c, out, &len) && len == 32;
  EVP_MD_CTX_free(c);
  return ok ? FM_OK : FM_ENOMEM;
}

static int make_tag(const uint8_t *p, size_t n, const fm_remote_secret *secret, uint8_t out[32]) {
  if (secret && secret->len) {
    unsigned len = 0;
    if (!HMAC(EVP_sha256(), secret->bytes, (int)secret->len, p, n, out, &len) || len != 32) return FM_ENOMEM;
    return FM_OK;
  }
  fm_sha256(p, n, out);
  return FM_OK;
}

int fm_remote_entry_encode(const fm_entry *e, const fm_remote_build *b, const fm_remote_secret *secret, uint8_t **out,
                           size_t *out_len) {
  uint8_t sum[32], tag[32];
  msgpack_sbuffer sb;
  msgpack_packer pk;
  int err = blob_sum(e, sum);
  if (err) return err;
  msgpack_sbuffer_init(&sb);
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  msgpack_sbuffer_write(&sb, FM_REMOTE_MAGIC, MAGIC_LEN);
  msgpack_pack_map(&pk, N_FIELDS);
  fm_pack_cstr(&pk, "key");
  fm_pack_bin(&pk, e->key.bytes, sizeof e->key.bytes);
  fm_pack_kv_cstr(&pk, "device", e->device);
  fm_pack_kv_cstr(&pk, "arch", b->arch);
  fm_pack_kv_cstr(&pk, "kind", e->kind);
  fm_pack_kv_u64(&pk, "state", (uint64_t)e->state);
  fm_pack_kv_u64(&pk, "codegen", b->codegen_version);
  fm_pack_cstr(&pk, "nvrtc");
  msgpack_pack_array(&pk, 2);
  msgpack_pack_uint32(&pk, b->nvrtc_major);
  msgpack_pack_uint32(&pk, b->nvrtc_minor);
  fm_pack_kv_u64(&pk, "vocab", b->vocab_version);
  fm_pack_cstr(&pk, "canonical");
  fm_pack_bin(&pk, e->canonical, e->canonical_len);
  fm_pack_cstr(&pk, "meta");
  fm_pack_bin(&pk, e->meta, e->meta_len);
  fm_pack_cstr(&pk, "cubin");
  fm_pack_bin(&pk, e->cubin, e->cubin_len);
  fm_pack_kv_cstr(&pk, "source", e->source ? e->source : "");
  fm_pack_cstr(&pk, "timings");
  fm_pack_bin(&pk, e->timings, e->timings_len);
  fm_pack_kv_i64(&pk, "created", e->created);
  fm_pack_cstr(&pk, "sum");
  fm_pack_bin(&pk, sum, sizeof sum);
  fm_pack_kv_bool(&pk, "signed", secret && secret->len);
  if (!sb.data || make_tag((const uint8_t *)sb.data, sb.size, secret, tag)) {
    msgpack_sbuffer_destroy(&sb);
    return FM_ENOMEM;
  }
  msgpack_sbuffer_write(&sb, (const char *)tag, sizeof tag);
  if (!sb.data) return FM_ENOMEM;
  *out_len = sb.size;
  *out = (uint8_t *)msgpack_sbuffer_release(&sb);
  return FM_OK;
}

static int dup_blob(const msgpack_object *m, const char *k, uint8_t **p, size_t *n, fm_diag *d) {
  const uint8_t *src;
  int err = fm_msg_get_bin(m, k, &src, n, d);
  if (err) return err == FM_ENOT_FOUND ? fm_diag_set(d, FM_EMALFORMED, "entry has no \"%s\"", k) : err;
  *p = NULL;
  if (*n == 0) return FM_OK;
  if (!(*p = malloc(*n))) return fm_diag_set(d, FM_ENOMEM, "out of memory");
  memcpy(*p, src, *n);
  return FM_OK;
}

static int get_u32(const msgpack_object *m, const char *k, uint32_t *v, fm_diag *d) {
  uint64_t u;
  int err = fm_msg_get_u64(m, k, &u, d);
  if (err || u > UINT32_MAX) return fm_diag_set(d, FM_EMALFORMED, "entry field \"%s\" missing or invalid", k);
  *v = (uint32_t)u;
  return FM_OK;
}

static int get_cstr(const msgpack_object *m, const char *k, char *out, size_t cap, fm_diag *d) {
  if (fm_msg_copy_str(m, k, out, cap, d))
    return fm_diag_set(d, FM_EMALFORMED, "entry field \"%s\" missing or invalid", k);
  return FM_OK;
}

static int decode_map(const msgpack_object *m, fm_entry *e, fm_remote_build *b, fm_diag *d) {
  const uint8_t *p;
  size_t n;
  uint64_t state;
  int err;
  if (fm_msg_get_bin(m, "key", &p, &n, d) || n != sizeof e->key.bytes)
    return fm_diag_set(d, FM_EMALFORMED, "entry key missing or not 32 bytes");
  memcpy(e->key.bytes, p, n);
  if ((err = get_cstr(m, "device", e->device, sizeof e->device, d))) return err;
  if ((err = get_cstr(m, "arch", b->arch, sizeof b->arch, d))) return err;
  if ((err = get_cstr(m, "kind", e->kind, sizeof e->kind, d))) return err;
  if (fm_msg_get_u64(m, "state", &state, d) || state > FM_STATE_BAD)
    return fm_diag_set(d, FM_EMALFORMED, "entry state missing or invalid");
  e->state = (fm_kstate)state;
  if ((err = get_u32(m, "codegen", &b->codegen_version, d))) return err;
  if ((err = get_u32(m, "vocab", &b->vocab_version, d))) return err;
  const msgpack_object *nv = fm_msg_get(m, "nvrtc");
  if (!nv || nv->type != MSGPACK_OBJECT_ARRAY || nv->via.array.size != 2 ||
      nv->via.array.ptr[0].type != MSGPACK_OBJECT_POSITIVE_INTEGER ||
      nv->via.array.ptr[1].type != MSGPACK_OBJECT_POSITIVE_INTEGER)
    return fm_diag_set(d, FM_EMALFORMED, "entry nvrtc missing or invalid");
  b->nvrtc_major = (uint32_t)nv->via.array.ptr[0].via.u64;
  b->nvrtc_minor = (uint32_t)nv->via.array.ptr[1].via.u64;
  if ((err = dup_blob(m, "canonical", &e->canonical, &e->canonical_len, d))) return err;
  if ((err = dup_blob(m, "meta", &e->meta, &e->meta_len, d))) return err;
  if ((err = dup_blob(m, "cubin", &e->cubin, &e->cubin_len, d))) return err;
  if ((err = dup_blob(m, "timings", &e->timings, &e->timings_len, d))) return err;
  const char *src;
  if (fm_msg_get_str(m, "source", &src, &n, d)) return fm_diag_set(d, FM_EMALFORMED, "entry source missing");
  if (n) {
    if (!(e->source = malloc(n + 1))) return fm_diag_set(d, FM_ENOMEM, "out of memory");
    memcpy(e->source, src, n);
    e->source[n] = '\0';
  }
  if (fm_msg_get_i64(m, "created", &e->created, d)) return fm_diag_set(d, FM_EMALFORMED, "entry created missing");
  uint8_t sum[32];
  if (fm_msg_get_bin(m, "sum", &p, &n, d) || n != sizeof sum)
    return fm_diag_set(d, FM_EMALFORMED, "entry sum missing or not 32 bytes");
  if ((err = blob_sum(e, sum))) return fm_diag_set(d, err, "out of memory");
  if (memcmp(sum, p, sizeof sum) != 0) return fm_diag_set(d, FM_ECORRUPT, "entry failed its checksum");
  return FM_OK;
}

int fm_remote_entry_decode(const uint8_t *val, size_t len, const fm_remote_secret *secret, fm_entry *e,
                           fm_remote_build *b, fm_diag *d) {
  msgpack_zone zone;
  msgpack_object m;
  uint8_t tag[32];
  bool is_signed = false;
  int err;
  memset(e, 0, sizeof *e);
  memset(b, 0, sizeof *b);
  if (len < MAGIC_LEN + FM_REMOTE_TAG_LEN + 1 || memcmp(val, FM_REMOTE_MAGIC, MAGIC_LEN) != 0)
    return fm_diag_set(d, FM_EMALFORMED, "not a fusemld entry (bad magic or too short)");
  size_t body = len - FM_REMOTE_TAG_LEN;
  if (!msgpack_zone_init(&zone, 4096)) return fm_diag_set(d, FM_ENOMEM, "out of memory");
  if ((err = fm_msg_unpack(val + MAGIC_LEN, body - MAGIC_LEN, &fm_msg_reply_limits, &zone, &m, d))) goto out;
  /* The tag first: an unauthenticated value is not looked into further. */
  if (fm_msg_get_bool(&m, "signed", &is_signed, d)) {
    err = fm_diag_set(d, FM_EMALFORMED, "entry has no \"signed\"");
    goto out;
  }
  if (secret && secret->len) {
    if (!is_signed) {
      err = fm_diag_set(d, FM_EDENIED, "entry is not signed; this node requires the cluster secret");
      goto out;
    }
    if ((err = make_tag(val, body, secret, tag))) goto out;
    if (CRYPTO_memcmp(tag, val + body, sizeof tag) != 0) {
      err = fm_diag_set(d, FM_EDENIED, "entry HMAC does not match the cluster secret");
      goto out;
    }
  } else if (!is_signed) {
    fm_sha256(val, body, tag);
    if (memcmp(tag, val + body, sizeof tag) != 0) {
      err = fm_diag_set(d, FM_ECORRUPT, "entry failed its digest");
      goto out;
    }
  }
  err = decode_map(&m, e, b, d);
out:
  msgpack_zone_destroy(&zone);
  if (err) fm_entry_free(e);
  return err;
}

int fm_remote_entry_verify(const fm_entry *e, const fm_remote_build *b, const fm_key *key, const char *label,
                           const fm_remote_build *mine, const uint8_t *canonical, size_t canonical_len, fm_diag *d) {
  if (strcmp(e->device, label) != 0)
    return fm_diag_set(d, FM_EINVAL, "entry is for device %.64s, not %.64s", e->device, label);
  if (strcmp(b->arch, mine->arch) != 0)
    return fm_diag_set(d, FM_EINVAL, "entry is for arch %s, not %s", b->arch, mine->arch);
  if (b->codegen_version != mine->codegen_version)
    return fm_diag_set(d, FM_EINVAL, "entry is from codegen %u, this is %u", b->codegen_version, mine->codegen_version);
  if (b->nvrtc_major != mine->nvrtc_major || b->nvrtc_minor != mine->nvrtc_minor)
    return fm_diag_set(d, FM_EINVAL, "entry is from NVRTC %u.%u, this is %u.%u", b->nvrtc_major, b->nvrtc_minor,
                       mine->nvrtc_major, mine->nvrtc_minor);
  if (b->vocab_version != mine->vocab_version)
    return fm_diag_set(d, FM_EINVAL, "entry is from vocabulary %u, this is %u", b->vocab_version, mine->vocab_version);
  if (memcmp(e->key.bytes, key->bytes, sizeof key->bytes) != 0)
    return fm_diag_set(d, FM_EINVAL, "entry is for another key");
  if (canonical && (e->canonical_len != canonical_len || memcmp(e->canonical, canonical, canonical_len) != 0))
    return fm_diag_set(d, FM_EINVAL, "entry holds a different canonical fragment");
  /* a direct cuBLASLt plan (kind "cublaslt") is metadata alone: no CUBIN */
  if (e->state != FM_STATE_BAD && ((!e->cubin_len && strcmp(e->kind, "cublaslt") != 0) || !e->meta_len))
    return fm_diag_set(d, FM_EINVAL, "entry has no kernel");
  return FM_OK;
}

void fm_remote_entry_rkey(const char *label, const fm_key *key, char *out, size_t cap) {
  char dev[192], hex[FM_KEY_HEX];
  size_t i = 0;
  for (; label[i] && i + 1 < sizeof dev; i++) {
    char c = label[i];
    int keep =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '-' || c == '_';
    dev[i] = keep ? c : '_';
  }
  dev[i] = '\0';
  fm_key_to_hex(key, hex);
  snprintf(out, cap, "fusemld:%s:%s:%s", FM_REMOTE_FORMAT, dev, hex);
}
