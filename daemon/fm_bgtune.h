/* fm_bgtune.h: the background tunes, waiting and running (--tune background).
 *
 * A fragment served with one verified candidate has its full tune queued here. At most
 * `max_active` of them are started at once (their candidates compiling or their round on the
 * tuner): two, so that the next fragment's candidates compile while the tuner times the
 * current one's, and the tuner itself runs one background round at a time. The rest wait in
 * the order they came, their compiled candidates not yet built, so a graph of a hundred
 * fragments holds one or two fragments' CUBINs, not a hundred. A key is queued once. Loop
 * thread only. */
#ifndef FM_BGTUNE_H
#define FM_BGTUNE_H

#include <stddef.h>

#include "fm_fingerprint.h"
#include "fm_tuner.h"

#define FM_BGTUNE_ACTIVE 2

typedef enum { FM_BG_QUEUED, FM_BG_COMPILING, FM_BG_TUNING } fm_bg_phase;
const char *fm_bg_phase_name(fm_bg_phase p);

typedef struct fm_bgtune fm_bgtune;
/* Starts a job whose turn came (its phase is FM_BG_COMPILING from now). */
typedef void (*fm_bgtune_start_fn)(fm_tune_job *tj, void *ctx);

int fm_bgtune_new(size_t max_active, fm_bgtune_start_fn start, void *ctx, fm_bgtune **out);
/* Frees the jobs still waiting; started ones belong to the compile queue or the tuner. */
void fm_bgtune_free(fm_bgtune *b);

/* Queues tj (its key: cands[0]'s), taking it, and starts it if there is room: 1. If its key
 * is queued or running already: 0, and tj stays the caller's. FM_ENOMEM. */
int fm_bgtune_add(fm_bgtune *b, fm_tune_job *tj);
/* A started job moves on (FM_BG_TUNING once its candidates are compiled). */
void fm_bgtune_set_phase(fm_bgtune *b, const fm_tune_job *tj, fm_bg_phase phase);
/* A started job ended (the caller frees it): the next waiting one starts. */
void fm_bgtune_done(fm_bgtune *b, const fm_tune_job *tj);
/* Shutdown: drops the jobs not started yet and cancels the compiles of those compiling (they
 * end at once, so the pool drains); returns how many were dropped. */
size_t fm_bgtune_stop(fm_bgtune *b);

/* Jobs queued or running. */
size_t fm_bgtune_pending(const fm_bgtune *b);
/* Whether key is queued or running: its phase, the jobs before it, its candidates. */
int fm_bgtune_find(const fm_bgtune *b, const fm_key *key, fm_bg_phase *phase, size_t *ahead, size_t *candidates);

#endif
