/* fm_tuner_worker.h: the tuner's worker process, seen from the daemon: start it, ask it one
 * thing with a deadline, kill it. Blocking calls, made by the tuner thread only.
 *
 * Why a process: a candidate kernel may write out of bounds (a sticky CUDA context error) or
 * never finish. Neither can be undone inside a process, so the CUDA context lives in a
 * separate executable (fusemld-tuner) that the daemon can kill and restart, while the daemon
 * itself never touches the GPU's context. fork+exec (never fork alone: a forked child cannot
 * initialise CUDA), with one end of a socketpair as its fd 3 (`--fd 3`), CUDA_MPS_* scrubbed
 * from its environment. The same framing (fm_frame.h) and msgpack maps as the client
 * protocol travel both ways.
 *
 * Worker protocol (each a frame holding one map):
 *   worker -> daemon, once at start:  {op: "ready", ok: bool, device: str, detail: str}
 *   {op: "prepare", id, canonical: bin, seed: u64}   -> {id, ok: bool, detail}
 *        decodes the fragment, makes fresh random inputs and the fp64 reference; kept for
 *        the following runs
 *   {op: "run", id, index: u32, cubin: bin, meta: map (fm_meta.h)}
 *        -> {id, verdict: "ok"|"wrong"|"load_failed"|"launch_failed", rel_err, ms, detail,
 *            algo?: bin(64)}
 *        a cuBLASLt plan without an algo (kind "cublaslt", fm_meta.h) is run with each of the
 *        heuristic's first choices at the timing size, each verified, and answered with the
 *        fastest one's time and its algo (the plan the daemon stores);
 *        after launch_failed the worker exits (its context is unusable).
 * A worker that sees EOF on its fd exits. */
#ifndef FM_TUNER_WORKER_H
#define FM_TUNER_WORKER_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <msgpack.h>

#include "fm_error.h"
#include "fm_frame.h"

#define FM_TWORKER_FD 3 /* the worker's end of the socketpair, after exec */

typedef struct fm_tworker {
  char exe[4096];
  pid_t pid; /* 0: not running */
  int fd;    /* -1: not running */
  fm_frame_reader rd;
  char device[192]; /* from its ready message */
  uint64_t next_id;
} fm_tworker;

void fm_tworker_init(fm_tworker *w, const char *exe);
/* Starts the worker and waits up to timeout_ms for its ready message. FM_ENOGPU (its reason
 * in d) if it started but has no usable GPU, FM_EIO / FM_ETIMEOUT otherwise; on any failure
 * nothing is left running. */
int fm_tworker_start(fm_tworker *w, int timeout_ms, fm_diag *d);
int fm_tworker_running(const fm_tworker *w);
/* Sends one request (a packed map) and waits up to timeout_ms for the reply with the same id
 * (the caller packed it; pass it as id). FM_ETIMEOUT: no reply in time (the caller kills the
 * worker); FM_ECLOSED: the worker died or hung up (it was reaped; d says how it ended);
 * FM_EPROTOCOL: a reply that does not parse. The reply is unpacked into zone. */
int fm_tworker_call(fm_tworker *w, const uint8_t *req, size_t len, uint64_t id, int timeout_ms, msgpack_zone *zone,
                    msgpack_object *reply, fm_diag *d);
/* SIGKILL, reap, close: nothing is left behind. No-op when not running. */
void fm_tworker_kill(fm_tworker *w);
/* Polite stop: closes its fd (it exits on EOF), waits up to timeout_ms, then kills. */
void fm_tworker_stop(fm_tworker *w, int timeout_ms);

#endif
