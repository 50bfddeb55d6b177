/* fm_nvrtc_child.h: one NVRTC compile in a fusemld-nvrtc child process (fm_child.h), with a
 * wall-clock deadline, a memory bound and cancellation. Blocking: called by compile workers
 * (fm_compile.h) on libuv's pool threads.
 *
 * Why a process: NVRTC cannot be interrupted inside a thread, and one generated source can
 * hold it for a minute and take half a gigabyte. A child is killed at its deadline or when
 * nobody waits for its result any more; the kernel bounds its memory (RLIMIT_AS, set by the
 * child on what it adds after starting, so sanitizer builds work the same).
 *
 * Protocol (frames, fm_frame.h): the daemon sends one frame whose payload is the source's
 * bytes; the worker compiles with `--arch` and `--name` from its command line and answers
 * one frame, the msgpack map {rc: int (fm_err), log: str (NVRTC's, capped), cubin: bin},
 * then exits. */
#ifndef FM_NVRTC_CHILD_H
#define FM_NVRTC_CHILD_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "fm_error.h"

typedef struct fm_nvrtc_limits {
  const char *exe;   /* the fusemld-nvrtc executable */
  double deadline_s; /* wall clock for the whole compile, worker start included */
  uint64_t memory;   /* bytes of address space the worker may add; 0 = unbounded */
} fm_nvrtc_limits;

/* As fm_nvrtc_compile (fm_nvrtc.h), in a child. Beyond its results:
 *   FM_ECOMPILE_TIMEOUT  the deadline passed; the worker was killed
 *   FM_ECLOSED           *cancel became nonzero; the worker was killed
 *   FM_ENOMEM            the worker ran out of memory (NVRTC said so, or it died while its
 *                        memory bound was set)
 *   FM_EIO               the worker could not be started, or it died or answered nonsense
 * with the reason in d for each of them (and for the fm_nvrtc_compile errors, "" there). */
int fm_nvrtc_child_compile(const fm_nvrtc_limits *lim, const char *src, const char *name, const char *arch,
                           const atomic_int *cancel, uint8_t **cubin, size_t *cubin_len, char **log, fm_diag *d);

#endif
