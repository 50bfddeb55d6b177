/* fm_remote_tier.c: remote lookups and publishes on the worker pool; import and export. */
#include "fm_remote_tier.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fm_codegen.h"
#include "fm_entry_check.h"
#include "fm_fragment.h"
#include "fm_log.h"
#include "fm_msg.h"

int fm_remote_tier_new(const char *url, const char *secret_path, fm_store *store, const fm_devinfo *dev,
                       fm_remote_tier **out, fm_diag *d) {
  int err = FM_OK;
  fm_remote_tier *t = calloc(1, sizeof *t);
  if (!t) return fm_diag_set(d, FM_ENOMEM, "out of memory");
  t->store = store;
  t->dev = dev;
  if (secret_path && secret_path[0] && (err = fm_remote_secret_load(secret_path, &t->secret, d))) goto fail;
  if (url && url[0]) {
    /* Unsigned entries would let any host that can reach Redis serve code to every node. */
    if (!t->secret.len) {
      err =
          fm_diag_set(d, FM_EINVAL, "--remote needs --remote-secret-file (the cluster secret entries are signed with)");
      goto fail;
    }
    if ((err = fm_remote_new(url, &t->remote, d))) goto fail;
  }
  *out = t;
  return FM_OK;
fail:
  fm_remote_tier_free(t);
  return err;
}

void fm_remote_tier_free(fm_remote_tier *t) {
  if (!t) return;
  fm_remote_free(t->remote);
  memset(&t->secret, 0, sizeof t->secret);
  free(t);
}

void fm_remote_label_arch(const char *label, char *arch, size_t cap) {
  const char *a = label, *end;
  if (strncmp(label, "none/", 5) == 0) {
    a = label + 5;
    end = a + strlen(a);
  } else {
    end = strrchr(label, '/');
    if (!end) end = label + strlen(label);
    a = end;
    while (a > label && a[-1] != '/') a--;
  }
  snprintf(arch, cap, "%.*s", (int)(end - a), a);
}

static void my_build(const fm_remote_tier *t, const char *arch, fm_remote_build *b) {
  memset(b, 0, sizeof *b);
  snprintf(b->arch, sizeof b->arch, "%s", arch);
  b->codegen_version = FM_CODEGEN_VERSION;
  b->nvrtc_major = t->dev->nvrtc_major;
  b->nvrtc_minor = t->dev->nvrtc_minor;
  b->vocab_version = FM_VOCAB_KEY;
}

/* ---- lookup ---- */

static void lookup_work(uv_work_t *req) {
  fm_remote_lookup *lk = req->data;
  fm_remote_tier *t = lk->tier;
  char rkey[320], hex[FM_KEY_HEX];
  uint8_t *val = NULL;
  size_t len = 0;
  fm_remote_build b, mine;
  fm_diag why = {{0}};
  fm_remote_entry_rkey(lk->label, &lk->key, rkey, sizeof rkey);
  fm_key_to_hex(&lk->key, hex);
  if (fm_remote_get(t->remote, rkey, &val, &len) != FM_OK) return;
  my_build(t, lk->arch, &mine);
  int err = fm_remote_entry_decode(val, len, &t->secret, &lk->e, &b, &why);
  if (!err) {
    err = fm_remote_entry_verify(&lk->e, &b, &lk->key, lk->label, &mine, lk->canonical, lk->canonical_len, &why);
    if (!err) err = fm_entry_check_content(&lk->e, &why);
    if (err) fm_entry_free(&lk->e);
  }
  free(val);
  if (err) {
    fm_remote_count_refused(t->remote);
    fm_log_warn("remote entry %.16s refused: %s; compiling locally", hex, why.text);
    return;
  }
  lk->found = 1;
  lk->e.hits = 0;
  lk->e.created = lk->e.last_used = 0; /* now, locally */
  lk->store_err = fm_store_put(t->store, &lk->e);
}

static void lookup_after(uv_work_t *req, int status) {
  fm_remote_lookup *lk = req->data;
  (void)status; /* never cancelled; a job that did not run simply found nothing */
  lk->done(lk);
}

int fm_remote_lookup_submit(uv_loop_t *loop, fm_remote_lookup *lk, void (*done)(fm_remote_lookup *), void *ctx) {
  lk->done = done;
  lk->ctx = ctx;
  lk->work.data = lk;
  return uv_queue_work(loop, &lk->work, lookup_work, lookup_after) ? FM_EIO : FM_OK;
}

/* ---- publish ---- */

typedef struct publish_job {
  uv_work_t work;
  fm_remote_tier *tier;
  fm_key key;
  char label[192], arch[16];
} publish_job;

static void publish_work(uv_work_t *req) {
  publish_job *pj = req->data;
  fm_remote_tier *t = pj->tier;
  fm_entry e;
  fm_remote_build mine;
  uint8_t *val = NULL;
  size_t len = 0;
  char rkey[320], hex[FM_KEY_HEX];
  fm_key_to_hex(&pj->key, hex);
  if (fm_store_get(t->store, &pj->key, pj->label, 0, &e) != FM_OK) return;
  my_build(t, pj->arch, &mine);
  int err = fm_remote_entry_encode(&e, &mine, &t->secret, &val, &len);
  fm_entry_free(&e);
  if (err) return;
  fm_remote_entry_rkey(pj->label, &pj->key, rkey, sizeof rkey);
  err = fm_remote_put(t->remote, rkey, val, len);
  fm_log_debug("publish %.16s (%zu bytes): %s", hex, len, err ? fm_strerror(err) : "ok");
  free(val);
}

static void publish_after(uv_work_t *req, int status) {
  (void)status;
  free(req->data);
}

void fm_remote_publish(uv_loop_t *loop, fm_remote_tier *t, const fm_key *key, const char *label, const char *arch) {
  if (!t || !t->remote) return;
  publish_job *pj = calloc(1, sizeof *pj);
  if (!pj) return;
  pj->tier = t;
  pj->key = *key;
  snprintf(pj->label, sizeof pj->label, "%s", label);
  snprintf(pj->arch, sizeof pj->arch, "%s", arch);
  pj->work.data = pj;
  if (uv_queue_work(loop, &pj->work, publish_work, publish_after)) free(pj);
}

/* ---- import / export ---- */

int fm_remote_tier_export(fm_remote_tier *t, const fm_key *key, uint8_t **val, size_t *len, fm_diag *d) {
  char hex[FM_KEY_HEX];
  fm_entry meta, e;
  fm_remote_build mine;
  fm_key_to_hex(key, hex);
  int err = fm_store_find_prefix(t->store, hex, &meta);
  if (err) return fm_diag_set(d, err, "no kernel with key %.16s", hex);
  err = fm_store_get(t->store, key, meta.device, 0, &e);
  char arch[16];
  fm_remote_label_arch(meta.device, arch, sizeof arch);
  fm_entry_free(&meta);
  if (err) return fm_diag_set(d, err, "cannot read kernel %.16s: %s", hex, fm_strerror(err));
  my_build(t, arch, &mine);
  err = fm_remote_entry_encode(&e, &mine, &t->secret, val, len);
  fm_entry_free(&e);
  if (err) return fm_diag_set(d, err, "out of memory");
  return FM_OK;
}

/* The import rule (docs/REMOTE.md, "Import"): a valid HMAC proves the entry came from a daemon
 * holding this node's secret, so its state is believed, with two limits. An import only ever
 * adds kernels: a "bad" verdict would make the fragment unsupported here without this node
 * ever trying it, so it is skipped. And it never displaces a local entry it does not improve
 * on: a tuned one replaces a local untuned or verified one only; anything else already here
 * is kept. (Entries travel untuned, tuned or bad: a verified one is never published.) */
static const unsigned local_states_kept[] = {
    /* by the imported entry's state */
    [FM_STATE_UNTUNED] = FM_STATE_BIT(FM_STATE_UNTUNED) | FM_STATE_BIT(FM_STATE_TUNED) | FM_STATE_BIT(FM_STATE_BAD) |
                         FM_STATE_BIT(FM_STATE_VERIFIED),
    [FM_STATE_TUNED] = FM_STATE_BIT(FM_STATE_TUNED) | FM_STATE_BIT(FM_STATE_BAD),
};
static const char *const kept_reason[] = {
    /* by the local entry's state */
    [FM_STATE_UNTUNED] = "a local untuned entry is kept",
    [FM_STATE_TUNED] = "a local tuned entry is kept",
    [FM_STATE_BAD] = "a local bad entry is kept (evict it to take the import)",
    [FM_STATE_VERIFIED] = "a local verified entry is kept (its background tune replaces it)",
};

int fm_remote_tier_import(fm_remote_tier *t, const uint8_t *val, size_t len, fm_key *key_out, const char **skipped,
                          fm_diag *d) {
  fm_entry e;
  fm_remote_build b, mine;
  fm_key key;
  char arch[16];
  int kept = -1;
  *skipped = NULL;
  /* Without a secret nothing can tell an exported entry from a forged one: anyone can
   * recompute an unkeyed digest. */
  if (!t->secret.len)
    return fm_diag_set(d, FM_EDENIED,
                       "import is disabled: this daemon has no --remote-secret-file, and only "
                       "entries signed with this node's secret are accepted");
  int err = fm_remote_entry_decode(val, len, &t->secret, &e, &b, d);
  if (err) return err;
  *key_out = e.key;
  if ((err = fm_entry_check_content(&e, d))) goto out;
  /* Recompute the key from the canonical fragment for this daemon's device and versions:
   * an entry from another device, codegen or NVRTC cannot match it. */
  if ((err = fm_entry_expected_key(t->dev, e.device, e.canonical, e.canonical_len, &key, d))) goto out;
  fm_remote_label_arch(e.device, arch, sizeof arch);
  my_build(t, arch, &mine);
  if ((err = fm_remote_entry_verify(&e, &b, &key, e.device, &mine, NULL, 0, d))) goto out;
  if (e.state == FM_STATE_BAD) {
    *skipped = "a bad verdict is not imported (this node tunes the fragment itself)";
    goto out;
  }
  e.hits = 0;
  e.created = e.last_used = 0;
  if ((err = fm_store_put_unless(t->store, &e, local_states_kept[e.state], &kept))) {
    fm_diag why = {{0}};
    fm_store_last_error(t->store, &why);
    fm_diag_set(d, FM_ESTORE, "cannot store the entry: %s", why.text[0] ? why.text : fm_strerror(err));
    err = FM_ESTORE;
  } else if (kept >= 0) {
    *skipped = kept_reason[kept]; /* put_unless reports only states in the mask */
  }
out:
  fm_entry_free(&e);
  return err;
}

void fm_remote_tier_pack_stats(fm_remote_tier *t, msgpack_packer *pk) {
  fm_remote_stats s;
  fm_remote_get_stats(t->remote, &s);
  msgpack_pack_map(pk, 13);
  fm_pack_kv_cstr(pk, "url", fm_remote_url(t->remote));
  fm_pack_kv_cstr(pk, "state", s.up ? "up" : "down");
  fm_pack_kv_u64(pk, "hits", s.hits);
  fm_pack_kv_u64(pk, "misses", s.misses);
  fm_pack_kv_u64(pk, "errors", s.errors);
  fm_pack_kv_u64(pk, "refused", s.refused);
  fm_pack_kv_u64(pk, "published", s.published);
  fm_pack_kv_u64(pk, "publish_errors", s.publish_errors);
  fm_pack_kv_u64(pk, "outages", s.outages);
  fm_pack_kv_u64(pk, "lookups", s.lookups);
  fm_pack_kv_u64(pk, "latency_us_avg", s.lookups ? s.lookup_us_total / s.lookups : 0);
  fm_pack_kv_u64(pk, "latency_us_max", s.lookup_us_max);
  fm_pack_kv_bool(pk, "signed", t->secret.len > 0);
}
