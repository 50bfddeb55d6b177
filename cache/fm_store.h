/* fm_store.h: the SQLite kernel store. Thread-safe: any function from any thread
 * (one connection, serialized). The schema grammar is in fm_store.c's header comment. */
#ifndef FM_STORE_H
#define FM_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "fm_error.h"
#include "fm_fingerprint.h"

/* Numbered statistics (as ccache): the numbers are stable; tests and fusectl rely on them. */
#define FM_STAT_MAP(XX)                      \
  XX(1, HITS, "hits")                        \
  XX(2, MISSES, "misses")                    \
  XX(3, COMPILES, "compiles")                \
  XX(4, COMPILE_ERRORS, "compile_errors")    \
  XX(5, EVICTIONS, "evictions")              \
  XX(6, CORRUPT, "corrupt_entries")          \
  XX(7, STORE_ERRORS, "store_errors")        \
  XX(8, JOINED, "joined_inflight")           \
  XX(9, REQUESTS, "requests")                \
  XX(10, BAD_REQUESTS, "bad_requests")       \
  XX(11, TUNES, "tunes")                     \
  XX(12, BAD_CANDIDATES, "bad_candidates")   \
  XX(13, WORKER_RESTARTS, "worker_restarts") \
  XX(14, VERIFIED, "verified")               \
  XX(15, UPGRADES, "upgrades")

typedef enum {
#define FM_STAT_ENUM_(n, name, str) FM_STAT_##name = (n),
  FM_STAT_MAP(FM_STAT_ENUM_)
#undef FM_STAT_ENUM_
      FM_STAT__COUNT
} fm_stat;

const char *fm_stat_name(fm_stat s);

/* untuned: compiled, never run on a GPU. tuned: every candidate verified and timed, the
 * fastest kept. bad: none verified (never served). verified: one candidate (the heuristic
 * default, or the library plan) verified on the GPU and served while the others are timed in
 * the background; a tuned entry replaces it. */
typedef enum { FM_STATE_UNTUNED = 0, FM_STATE_TUNED = 1, FM_STATE_BAD = 2, FM_STATE_VERIFIED = 3 } fm_kstate;
const char *fm_kstate_name(fm_kstate s);
/* Whether s is one of the states above (a stored or received number is checked with it). */
int fm_kstate_valid(int64_t s);

/* One cache entry. For put, the caller owns the buffers; for get/show they are malloc'd and
 * released by fm_entry_free (an empty blob comes back as NULL with length 0). */
typedef struct fm_entry {
  fm_key key;
  char device[192]; /* fm_device_label */
  char kind[16];    /* "pointwise" ... */
  uint8_t *canonical;
  size_t canonical_len; /* canonical fragment bytes */
  uint8_t *cubin;
  size_t cubin_len;
  uint8_t *meta;
  size_t meta_len; /* fm_meta_pack bytes */
  char *source;    /* generated CUDA C (for `fusectl show --source`), may be NULL */
  fm_kstate state;
  uint8_t *timings;
  size_t timings_len;         /* msgpack, may be empty */
  int64_t created, last_used; /* unix seconds */
  int64_t hits;
} fm_entry;

void fm_entry_free(fm_entry *e);

typedef struct fm_store fm_store;

/* Opens or creates the database (WAL, busy timeout), migrating older schemas. A file that is
 * not a database (or fails integrity) is renamed to PATH.corrupt-<unix time> and a fresh one
 * created, reported in d (on FM_OK d->text is empty unless that happened, or entries of an
 * older format were dropped: log it). A schema
 * newer than this build knows is refused (FM_ESTORE), never modified. The directory must
 * exist. size_cap: bytes of cubins kept (0 = unlimited). FM_STORE_MEMORY as the path: a store
 * in memory only (SQLite's ":memory:"), gone when closed. */
#define FM_STORE_MEMORY ":memory:"
int fm_store_open(const char *path, uint64_t size_cap, fm_store **out, fm_diag *d);
void fm_store_close(fm_store *s);

/* Calls that return only a code keep the reason for their failure (SQLite's message, what
 * was being done) on the store: this copies the most recent one into d ("" if none). The
 * store is shared by threads, so read it right after the failing call; a miss
 * (FM_ENOT_FOUND) is not a failure and leaves it unchanged. */
void fm_store_last_error(fm_store *s, fm_diag *d);

/* Inserts or replaces (atomically: a transaction). Evicts least-recently-used entries
 * beyond the size cap afterwards (counted in FM_STAT_EVICTIONS). created/last_used of 0
 * mean now; hits is stored as given. */
int fm_store_put(fm_store *s, const fm_entry *e);

/* fm_store_put, unless key+device already has an entry whose state is in keep_states (a mask
 * of FM_STATE_BIT(state)): that entry is then left as it is and *kept_state (may be NULL) is
 * its state, else -1. The check and the write are one transaction, so an entry written
 * meanwhile by another thread is never replaced against the mask. */
#define FM_STATE_BIT(state) (1u << (state))
int fm_store_put_unless(fm_store *s, const fm_entry *e, unsigned keep_states, int *kept_state);

/* Looks up key+device. On a hit the checksum (over every served field: key, device, kind,
 * state, the blobs and the source) is verified; a mismatch deletes the entry,
 * counts FM_STAT_CORRUPT and returns FM_ECORRUPT (the caller rebuilds). With touch,
 * last_used and hits are updated. FM_ENOT_FOUND on a miss. Does not count hits/misses:
 * the caller does (it knows what a request was). */
int fm_store_get(fm_store *s, const fm_key *key, const char *device, int touch, fm_entry *out);

/* Finds entries whose hex key starts with prefix (>= 4 hex digits), for fusectl:
 * FM_ENOT_FOUND, FM_EINVAL if ambiguous, else fills out (any device). */
int fm_store_find_prefix(fm_store *s, const char *hex_prefix, fm_entry *out);

/* Calls fn for every entry (metadata only: blobs NULL, *_len set), most recently used
 * first, up to limit (0 = all). fn returning nonzero stops the walk. */
typedef int (*fm_store_list_fn)(const fm_entry *e, void *ctx);
int fm_store_list(fm_store *s, uint32_t limit, fm_store_list_fn fn, void *ctx);

/* Deletes one entry (any device): FM_ENOT_FOUND if absent. */
int fm_store_evict(fm_store *s, const fm_key *key);
/* Deletes all entries; *n = how many. */
int fm_store_evict_all(fm_store *s, uint64_t *n);

/* Persistent counters (survive restarts). */
int fm_store_stat_add(fm_store *s, fm_stat stat, int64_t delta);
int fm_store_stats(fm_store *s, int64_t out[FM_STAT__COUNT]);
/* Sets every persistent counter back to 0 (`fusectl stats --zero`). */
int fm_store_stats_zero(fm_store *s);
/* Entry count and total cubin bytes. */
int fm_store_usage(fm_store *s, uint64_t *entries, uint64_t *bytes);

#endif
