/* fm_remote_tier.h: the daemon's use of the remote tier (fm_remote.h) and of portable entries
 * (fm_remote_entry.h): lookups before compiling, publishing after, and the import/export
 * requests, all verified the same way.
 *
 * Lookup: on a local miss, a job on the worker pool GETs the entry, decodes it (sum, HMAC),
 * verifies it against the request (key, device, arch, codegen/NVRTC/vocabulary versions,
 * canonical fragment), and stores it locally; done() then runs on the loop thread. Anything
 * short of a verified entry (down, absent, refused) reports found == 0: the caller compiles.
 * Publish: after a local build is stored, a job reads the stored entry back and SETs it. */
#ifndef FM_REMOTE_TIER_H
#define FM_REMOTE_TIER_H

#include <stddef.h>
#include <stdint.h>
#include <msgpack.h>
#include <uv.h>

#include "fm_device.h"
#include "fm_error.h"
#include "fm_fingerprint.h"
#include "fm_remote.h"
#include "fm_remote_entry.h"
#include "fm_store.h"

typedef struct fm_remote_tier {
  fm_remote *remote;       /* NULL: no --remote (import/export still work) */
  fm_remote_secret secret; /* len 0: none */
  fm_store *store;
  const fm_devinfo *dev;
} fm_remote_tier;

/* url and secret_path may be "" (none). --remote needs a secret: FM_EINVAL otherwise. */
int fm_remote_tier_new(const char *url, const char *secret_path, fm_store *store, const fm_devinfo *dev,
                       fm_remote_tier **out, fm_diag *d);
void fm_remote_tier_free(fm_remote_tier *t);

typedef struct fm_remote_lookup fm_remote_lookup;
struct fm_remote_lookup {
  uv_work_t work;
  fm_remote_tier *tier;
  fm_key key;
  char label[192];
  char arch[16];
  const uint8_t *canonical; /* borrowed: alive until done() */
  size_t canonical_len;
  int found; /* 1: e is a verified entry (stored locally unless store_err) */
  fm_entry e;
  int store_err;
  void (*done)(fm_remote_lookup *lk);
  void *ctx;
};

/* Queues lk (filled by the caller: tier, key, label, arch, canonical). FM_EIO if it could
 * not be queued. */
int fm_remote_lookup_submit(uv_loop_t *loop, fm_remote_lookup *lk, void (*done)(fm_remote_lookup *), void *ctx);

/* Publishes the stored entry key+label built for arch; fire and forget (logged at debug). */
void fm_remote_publish(uv_loop_t *loop, fm_remote_tier *t, const fm_key *key, const char *label, const char *arch);

/* The portable value of stored entry key (any device): FM_ENOT_FOUND, FM_ENOMEM. */
int fm_remote_tier_export(fm_remote_tier *t, const fm_key *key, uint8_t **val, size_t *len, fm_diag *d);
/* Decodes, verifies as a remote hit (the HMAC with this node's secret, the key recomputed
 * from the canonical fragment for this daemon's device and versions, the content checked by
 * fm_entry_check_content) and stores a portable value, under the import rule in
 * fm_remote_tier.c: a "bad" entry, or one that would displace a local entry it does not
 * improve on, is skipped (FM_OK, *skipped says why; NULL when stored). FM_EDENIED (no secret
 * configured, unsigned, HMAC mismatch), FM_ECORRUPT, FM_EINVAL (not for this daemon, invalid
 * content), FM_ESTORE. *key_out: the entry's key. */
int fm_remote_tier_import(fm_remote_tier *t, const uint8_t *val, size_t len, fm_key *key_out, const char **skipped,
                          fm_diag *d);

/* The "remote" map of the stats reply. */
void fm_remote_tier_pack_stats(fm_remote_tier *t, msgpack_packer *pk);

/* The arch part of a device label ("none/sm_90a", "NAME/sm_90a/132sm"). */
void fm_remote_label_arch(const char *label, char *arch, size_t cap);

#endif
