/* fm_compile_queue.c: one line of waiting jobs per owner, served in turn (fm_compile_queue.h). */
#include "fm_compile_queue.h"

#include <stdlib.h>

/* An owner with jobs waiting: its line, and its place in the turn. */
typedef struct owner_line {
  struct owner_line *next; /* the next owner in turn */
  const void *owner;
  fm_compile_job *head, *tail; /* linked through queue_next */
} owner_line;

struct fm_cqueue {
  uv_loop_t *loop;
  uint32_t workers, running;
  owner_line *turn, *last; /* owners with work, the next to be served first */
  size_t waiting;
  owner_line background; /* served only when turn is empty (fm_compile_queue.h) */
  uint32_t background_running, background_max;
};

int fm_cqueue_new(uv_loop_t *loop, uint32_t workers, fm_cqueue **out) {
  fm_cqueue *q = calloc(1, sizeof *q);
  if (!q) return FM_ENOMEM;
  q->loop = loop;
  q->workers = workers ? workers : 1;
  q->background_max = q->workers > 1 ? q->workers - 1 : 1;
  *out = q;
  return FM_OK;
}

void fm_cqueue_free(fm_cqueue *q) {
  if (!q) return;
  while (q->turn) {
    owner_line *next = q->turn->next;
    free(q->turn);
    q->turn = next;
  }
  free(q);
}

size_t fm_cqueue_waiting(const fm_cqueue *q) { return q->waiting; }

static void pump(fm_cqueue *q);

/* The pool finished job: give the caller its result, then the worker to the next owner. */
static void on_job_done(fm_compile_job *job) {
  fm_cqueue *q = job->ctx;
  q->running--;
  if (job->queue_background) q->background_running--;
  job->done = job->queue_done;
  job->ctx = job->queue_ctx;
  job->done(job); /* may free job, and may queue more */
  pump(q);
}

/* The next background job, when the owners have none waiting and it may take a worker. */
static fm_compile_job *take_background(fm_cqueue *q) {
  fm_compile_job *job = q->background.head;
  if (!job || q->turn || q->background_running >= q->background_max) return NULL;
  q->background.head = job->queue_next;
  if (!q->background.head) q->background.tail = NULL;
  job->queue_next = NULL;
  q->background_running++;
  return job;
}

/* Moves jobs to the pool while it has room: the first owner in turn gives one, then goes to
 * the back of the turn if it has more; background jobs only when no owner waits. */
static void pump(fm_cqueue *q) {
  while (q->running < q->workers && (q->turn || q->background.head)) {
    owner_line *line = q->turn;
    fm_compile_job *job = line ? NULL : take_background(q);
    if (!line && !job) return;
    if (line) {
      job = line->head;
      line->head = job->queue_next;
      job->queue_next = NULL;
      q->turn = line->next;
      if (!q->turn) q->last = NULL;
      if (line->head) {
        line->next = NULL;
        if (q->last)
          q->last->next = line;
        else
          q->turn = line;
        q->last = line;
      } else {
        free(line);
      }
    }
    q->waiting--;
    q->running++;
    if (fm_compile_submit(q->loop, job, on_job_done, q)) {
      job->err = fm_diag_set(&job->diag, FM_EIO, "cannot queue the compile on the worker pool");
      on_job_done(job);
      return; /* on_job_done pumped */
    }
  }
}

int fm_cqueue_submit(fm_cqueue *q, const void *owner, fm_compile_job *job, fm_compile_done_fn done, void *ctx) {
  owner_line *line = q->turn;
  while (line && line->owner != owner) line = line->next;
  if (!line) {
    if (!(line = calloc(1, sizeof *line))) return FM_ENOMEM;
    line->owner = owner;
    if (q->last)
      q->last->next = line;
    else
      q->turn = line;
    q->last = line;
  }
  job->queue_done = done;
  job->queue_ctx = ctx;
  job->queue_next = NULL;
  job->queue_background = 0;
  if (line->tail && line->head)
    line->tail->queue_next = job;
  else
    line->head = job;
  line->tail = job;
  q->waiting++;
  pump(q);
  return FM_OK;
}

void fm_cqueue_submit_background(fm_cqueue *q, fm_compile_job *job, fm_compile_done_fn done, void *ctx) {
  job->queue_done = done;
  job->queue_ctx = ctx;
  job->queue_next = NULL;
  job->queue_background = 1;
  if (q->background.tail)
    q->background.tail->queue_next = job;
  else
    q->background.head = job;
  q->background.tail = job;
  q->waiting++;
  pump(q);
}
