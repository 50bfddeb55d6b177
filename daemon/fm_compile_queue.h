/* fm_compile_queue.h: compile jobs waiting for a worker thread, taken in turn by owner.
 *
 * libuv's pool runs work in the order it was queued, so one client's hundred compiles would
 * stand in front of another client's one. Here each owner (the connection whose request
 * started the build) has its own line, and a worker that frees up goes to the next owner in
 * turn that has work: a client waits for at most one compile per other client, however much
 * they have queued. At most `workers` jobs are on the pool at once (the pool's size).
 *
 * Background compiles (the candidates of a background tune) wait in a line of their own that
 * is served only when no owner has a job waiting, and never on every worker at once (one is
 * kept for the owners when there are two or more): a client's compile waits for at most one
 * background compile, and only with a single worker. Loop thread only. */
#ifndef FM_COMPILE_QUEUE_H
#define FM_COMPILE_QUEUE_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "fm_compile.h"

typedef struct fm_cqueue fm_cqueue;

int fm_cqueue_new(uv_loop_t *loop, uint32_t workers, fm_cqueue **out);
/* Frees the queue's own records; jobs still waiting (a shutdown past its deadline) are left
 * to their owners, as the pool leaves the ones it still holds. */
void fm_cqueue_free(fm_cqueue *q);

/* Queues job behind owner's earlier ones (owner: any pointer that tells clients apart);
 * done(job) runs on the loop thread when it ends, as with fm_compile_submit. A job the pool
 * refuses ends with err FM_EIO. FM_ENOMEM. */
int fm_cqueue_submit(fm_cqueue *q, const void *owner, fm_compile_job *job, fm_compile_done_fn done, void *ctx);

/* Queues job in the background line (above); done(job) as with fm_cqueue_submit. */
void fm_cqueue_submit_background(fm_cqueue *q, fm_compile_job *job, fm_compile_done_fn done, void *ctx);

/* Jobs waiting for a worker (not yet on the pool), background ones included. */
size_t fm_cqueue_waiting(const fm_cqueue *q);

#endif
