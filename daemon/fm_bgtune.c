/* fm_bgtune.c: background tunes in arrival order, a few started at once (fm_bgtune.h). */
#include "fm_bgtune.h"

#include <stdlib.h>
#include <string.h>

/* One job, in a list kept in arrival order: the started ones stay where they were. The list
 * is searched by key on every hit of a verified entry: it holds a graph's fragments at most
 * (~100), and a 32-byte compare each costs less than the hit's SQLite read. */
typedef struct bg_rec {
  struct bg_rec *next;
  fm_tune_job *tj;
  fm_key key;
  fm_bg_phase phase;
} bg_rec;

struct fm_bgtune {
  bg_rec *head, **tail;
  size_t count, active, max_active;
  fm_bgtune_start_fn start;
  void *ctx;
};

static const char *const phase_names[] = {
    [FM_BG_QUEUED] = "queued",
    [FM_BG_COMPILING] = "compiling",
    [FM_BG_TUNING] = "tuning",
};

const char *fm_bg_phase_name(fm_bg_phase p) {
  return (unsigned)p < sizeof phase_names / sizeof phase_names[0] ? phase_names[p] : "unknown";
}

int fm_bgtune_new(size_t max_active, fm_bgtune_start_fn start, void *ctx, fm_bgtune **out) {
  fm_bgtune *b = calloc(1, sizeof *b);
  if (!b) return FM_ENOMEM;
  b->tail = &b->head;
  b->max_active = max_active ? max_active : 1;
  b->start = start;
  b->ctx = ctx;
  *out = b;
  return FM_OK;
}

void fm_bgtune_free(fm_bgtune *b) {
  if (!b) return;
  while (b->head) {
    bg_rec *next = b->head->next;
    if (b->head->phase == FM_BG_QUEUED) fm_tune_job_free(b->head->tj);
    free(b->head);
    b->head = next;
  }
  free(b);
}

static bg_rec *find(const fm_bgtune *b, const fm_key *key) {
  for (bg_rec *r = b->head; r; r = r->next)
    if (memcmp(r->key.bytes, key->bytes, FM_KEY_BYTES) == 0) return r;
  return NULL;
}

/* Starts waiting jobs while there is room. A start may end its job at once (nothing to
 * compile, the pool refusing): the walk begins again from the head each time. */
static void start_waiting(fm_bgtune *b) {
  while (b->active < b->max_active) {
    bg_rec *r = b->head;
    while (r && r->phase != FM_BG_QUEUED) r = r->next;
    if (!r) return;
    r->phase = FM_BG_COMPILING;
    b->active++;
    b->start(r->tj, b->ctx);
  }
}

int fm_bgtune_add(fm_bgtune *b, fm_tune_job *tj) {
  if (!tj->n || find(b, &tj->cands[0]->key)) return 0;
  bg_rec *r = calloc(1, sizeof *r);
  if (!r) return FM_ENOMEM;
  r->tj = tj;
  r->key = tj->cands[0]->key;
  r->phase = FM_BG_QUEUED;
  *b->tail = r;
  b->tail = &r->next;
  b->count++;
  start_waiting(b);
  return 1;
}

static bg_rec *find_job(const fm_bgtune *b, const fm_tune_job *tj) {
  for (bg_rec *r = b->head; r; r = r->next)
    if (r->tj == tj) return r;
  return NULL;
}

void fm_bgtune_set_phase(fm_bgtune *b, const fm_tune_job *tj, fm_bg_phase phase) {
  bg_rec *r = find_job(b, tj);
  if (r && r->phase != FM_BG_QUEUED) r->phase = phase;
}

void fm_bgtune_done(fm_bgtune *b, const fm_tune_job *tj) {
  for (bg_rec **pp = &b->head; *pp; pp = &(*pp)->next) {
    bg_rec *r = *pp;
    if (r->tj != tj) continue;
    *pp = r->next;
    if (b->tail == &r->next) b->tail = pp;
    if (r->phase != FM_BG_QUEUED) b->active--;
    b->count--;
    free(r);
    break;
  }
  start_waiting(b);
}

size_t fm_bgtune_stop(fm_bgtune *b) {
  size_t dropped = 0;
  for (bg_rec **pp = &b->head; *pp;) {
    bg_rec *r = *pp;
    if (r->phase == FM_BG_COMPILING)
      for (size_t i = 0; i < r->tj->n; i++) atomic_store(&r->tj->cands[i]->cancel, 1);
    if (r->phase != FM_BG_QUEUED) {
      pp = &r->next;
      continue;
    }
    *pp = r->next;
    if (b->tail == &r->next) b->tail = pp;
    fm_tune_job_free(r->tj);
    free(r);
    b->count--;
    dropped++;
  }
  return dropped;
}

size_t fm_bgtune_pending(const fm_bgtune *b) { return b ? b->count : 0; }

int fm_bgtune_find(const fm_bgtune *b, const fm_key *key, fm_bg_phase *phase, size_t *ahead, size_t *candidates) {
  size_t before = 0;
  if (!b) return 0;
  for (const bg_rec *r = b->head; r; r = r->next, before++) {
    if (memcmp(r->key.bytes, key->bytes, FM_KEY_BYTES) != 0) continue;
    *phase = r->phase;
    *ahead = before;
    *candidates = r->tj->n;
    return 1;
  }
  return 0;
}
