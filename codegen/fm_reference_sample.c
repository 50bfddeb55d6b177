/* fm_reference_sample.c: the reference at a sample of blocks (fm_reference_sample.h). */
#include "fm_reference_sample.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "fm_reference.h"

/* Strips of STRIP_BLOCKS at the start, middle and end; RANDOM_BLOCKS drawn between. */
#define STRIP_BLOCKS  4
#define RANDOM_BLOCKS 12

int64_t fm_sample_dim(const fm_fragment *f, int64_t outer, uint32_t d) {
  const fm_tensor *o = &f->outputs[0];
  int64_t v = o->shape[d];
  if (d + 1 == o->rank && fm_fragment_is_rows(f)) /* the row's length: the longest last dim */
    for (uint32_t k = 0; k < f->n_inputs + f->n_outputs; k++) {
      const fm_tensor *t = k < f->n_inputs ? &f->inputs[k] : &f->outputs[k - f->n_inputs];
      if (t->rank == o->rank && t->shape[d] > v) v = t->shape[d];
    }
  return v == FM_DIM_SYMBOLIC ? outer : v;
}

int fm_sample_add(fm_sample *s, int64_t lead) {
  int i = 0;
  while (i < s->n && s->lead[i] < lead) i++;
  if (i < s->n && s->lead[i] == lead) return 0;
  if (s->n >= FM_SAMPLE_MAX_BLOCKS) return -1;
  memmove(&s->lead[i + 1], &s->lead[i], sizeof s->lead[0] * (size_t)(s->n - i));
  s->lead[i] = lead;
  s->n++;
  return 0;
}

static uint64_t splitmix(uint64_t *x) {
  uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* The most leading dims a block may fix: every one of a pointwise fragment, all but the
 * reduced last of a row fragment, those before the first cat's dim, those before a window
 * op's pooled two (its taps reach along them); 0 where none may (a scatter's rows land
 * anywhere, take_rows reads anywhere). */
static uint32_t max_cut(const fm_fragment *f) {
  if (fm_fragment_is_gemm(f) || fm_fragment_is_bmm(f) || fm_fragment_is_cols(f) || fm_fragment_is_scatter(f)) return 0;
  uint32_t rank = f->outputs[0].rank, cut = rank;
  if (fm_fragment_is_rows(f)) cut = rank ? rank - 1 : 0;
  /* an iota reads the element's index along the last dim, which a cut block would renumber */
  if (fm_fragment_has_iota(f) && rank && cut > rank - 1) cut = rank - 1;
  for (uint32_t i = 0; i < f->n_ops; i++)
    if (f->ops[i].op == FM_OP_CAT && f->ops[i].dim >= 0 && (uint32_t)f->ops[i].dim < cut)
      cut = (uint32_t)f->ops[i].dim;
    else if (fm_op_kind(f->ops[i].op) == FM_OPK_WINDOW && rank >= 2 && rank - 2 < cut)
      cut = rank - 2;
    else if (fm_op_kind(f->ops[i].op) == FM_OPK_GATHER)
      cut = 0; /* take_rows reads any of src's rows, which a block's offset would shift */
  return cut;
}

void fm_sample_choose(const fm_fragment *f, int64_t outer, uint64_t seed, fm_sample *s) {
  memset(s, 0, sizeof *s);
  uint32_t rank = f->n_outputs ? f->outputs[0].rank : 0, cmax = rank ? max_cut(f) : 0;
  if (cmax == 0) return;
  int64_t total = 1;
  for (uint32_t d = 0; d < rank; d++) total *= fm_sample_dim(f, outer, d);
  if (total < FM_SAMPLE_MIN_ELEMENTS) return;
  /* the fewest cut dims that bring a block under FM_SAMPLE_BLOCK_ELEMENTS */
  uint32_t cut = 1;
  int64_t lead = fm_sample_dim(f, outer, 0), inner = total / (lead ? lead : 1);
  while (cut < cmax && inner > FM_SAMPLE_BLOCK_ELEMENTS) {
    int64_t next = fm_sample_dim(f, outer, cut);
    lead *= next;
    inner /= next ? next : 1;
    cut++;
  }
  s->cut = cut;
  if (lead <= 2 * STRIP_BLOCKS * 3) { /* as few blocks as a sample holds: all of them */
    for (int64_t i = 0; i < lead && i < FM_SAMPLE_MAX_BLOCKS; i++) fm_sample_add(s, i);
    return;
  }
  for (int64_t i = 0; i < STRIP_BLOCKS; i++) {
    fm_sample_add(s, i);
    fm_sample_add(s, lead / 2 - STRIP_BLOCKS / 2 + i);
    fm_sample_add(s, lead - STRIP_BLOCKS + i);
  }
  /* one block from each of RANDOM_BLOCKS equal stretches of the space between the strips */
  uint64_t rng = seed ^ 0x5a3f0c1e2d4b6987ull;
  int64_t lo = STRIP_BLOCKS, span = lead - 2 * STRIP_BLOCKS;
  for (int64_t j = 0; j < RANDOM_BLOCKS; j++) {
    int64_t a = lo + span * j / RANDOM_BLOCKS, b = lo + span * (j + 1) / RANDOM_BLOCKS;
    if (b > a) fm_sample_add(s, a + (int64_t)(splitmix(&rng) % (uint64_t)(b - a)));
  }
}

/* Block b's index along each cut dim. */
static void block_index(const fm_fragment *f, int64_t outer, const fm_sample *s, int b, int64_t *idx) {
  int64_t rest = s->lead[b];
  for (int d = (int)s->cut - 1; d >= 0; d--) {
    int64_t size = fm_sample_dim(f, outer, (uint32_t)d);
    idx[d] = size > 0 ? rest % size : 0;
    rest = size > 0 ? rest / size : 0;
  }
}

static int64_t offset_at(const fm_tensor *t, uint32_t cut, const int64_t *idx) {
  int64_t off = 0;
  for (uint32_t d = 0; d < cut && d < t->rank; d++)
    if (t->shape[d] != 1) off += idx[d] * t->strides[d];
  return off;
}

int64_t fm_sample_offset(const fm_fragment *f, int64_t outer, const fm_sample *s, int b, const fm_tensor *t) {
  int64_t idx[FM_MAX_RANK] = {0};
  block_index(f, outer, s, b, idx);
  return offset_at(t, s->cut, idx);
}

/* What every job of the reference on threads has first: the fragment cut to its part (scratch),
 * and how its evaluation ended. */
typedef struct job_head {
  fm_fragment *cut;
  int rc;
  fm_diag d;
} job_head;

/* Runs main on each of n jobs (size bytes apart, each starting with a job_head), one thread
 * each (here, where no thread starts), and joins them; the first failure's reason goes to d. */
static int run_jobs(void *jobs, size_t size, int n, void *(*main)(void *), fm_diag *d) {
  pthread_t th[FM_SAMPLE_MAX_BLOCKS];
  int started[FM_SAMPLE_MAX_BLOCKS] = {0}, rc = FM_OK;
  if (n > FM_SAMPLE_MAX_BLOCKS) return fm_diag_set(d, FM_EINVAL, "%d parts to evaluate", n);
  for (int b = 0; b < n; b++) {
    job_head *h = (job_head *)((uint8_t *)jobs + (size_t)b * size);
    h->rc = FM_OK;
    h->cut = malloc(sizeof(fm_fragment));
    if (!h->cut) rc = fm_diag_set(d, FM_ENOMEM, "out of memory");
  }
  for (int b = 0; b < n && rc == FM_OK; b++) {
    void *job = (uint8_t *)jobs + (size_t)b * size;
    if (pthread_create(&th[b], NULL, main, job) == 0)
      started[b] = 1;
    else
      main(job); /* no thread: this one here */
  }
  for (int b = 0; b < n; b++) {
    job_head *h = (job_head *)((uint8_t *)jobs + (size_t)b * size);
    if (started[b]) pthread_join(th[b], NULL);
    if (rc == FM_OK && h->rc) rc = fm_diag_set(d, h->rc, "%s", h->d.text);
    free(h->cut);
  }
  return rc;
}

typedef struct block_job {
  job_head h;
  const fm_fragment *f;
  int64_t outer;
  const fm_sample *s;
  int b;
  uint32_t fixed;
  const void *const *ins;
  void *const *outs;
} block_job;

/* A tensor cut to the block at idx: its cut dims of size 1 (a symbolic one stays symbolic,
 * evaluated at outer 1); returns its element offset. */
static int64_t cut_tensor(fm_tensor *t, uint32_t cut, const int64_t *idx) {
  int64_t off = offset_at(t, cut, idx);
  for (uint32_t d = 0; d < cut && d < t->rank; d++)
    if (t->shape[d] != FM_DIM_SYMBOLIC) t->shape[d] = 1;
  return off;
}

static void *block_main(void *arg) {
  block_job *j = arg;
  const fm_fragment *f = j->f;
  const void *ins[FM_MAX_INPUTS];
  void *outs[FM_MAX_OUTPUTS];
  int64_t idx[FM_MAX_RANK] = {0};
  block_index(f, j->outer, j->s, j->b, idx);
  fm_fragment *cut = j->h.cut;
  memcpy(cut, f, sizeof *cut);
  for (uint32_t k = 0; k < f->n_inputs; k++) {
    size_t off = 0;
    if (!(j->fixed >> k & 1u))
      off = (size_t)cut_tensor(&cut->inputs[k], j->s->cut, idx) * fm_dtype_size(f->inputs[k].dtype);
    ins[k] = j->ins[k] ? (const uint8_t *)j->ins[k] + off : NULL;
  }
  for (uint32_t k = 0; k < f->n_outputs; k++) {
    size_t off = (size_t)cut_tensor(&cut->outputs[k], j->s->cut, idx) * fm_dtype_size(f->outputs[k].dtype);
    outs[k] = (uint8_t *)j->outs[k] + off;
  }
  j->h.rc = fm_reference_eval(cut, 1, ins, outs, &j->h.d);
  return NULL;
}

/* A part of the whole evaluation on a thread: the range [r0, r0 + len) of one dim. A column
 * fragment's stripe of columns (columns: the last dim of each tensor whose last dim is the
 * column space's n, one of size 1 there, a per-row value, left whole); a pointwise or row
 * fragment's band along iteration dim `dim` (each tensor that spans that dim, as cut_tensor
 * decides: size other than 1; a symbolic dim 0 is evaluated at outer = len). */
typedef struct range_job {
  job_head h;
  const fm_fragment *f;
  int64_t outer, r0, len;
  int columns;
  int64_t n;    /* columns: the column space */
  uint32_t dim; /* bands: the dim */
  const void *const *ins;
  void *const *outs;
} range_job;

/* Cuts t to the job's range (its element offset there), or leaves it whole (0). */
static int64_t range_tensor(fm_tensor *t, const range_job *j) {
  uint32_t dim = j->columns ? t->rank - 1 : j->dim;
  if (j->columns ? t->rank == 0 || t->shape[dim] != j->n : dim >= t->rank || t->shape[dim] == 1) return 0;
  if (t->shape[dim] != FM_DIM_SYMBOLIC) t->shape[dim] = j->len;
  return j->r0 * t->strides[dim];
}

static void *range_main(void *arg) {
  range_job *j = arg;
  const fm_fragment *f = j->f;
  const void *ins[FM_MAX_INPUTS];
  void *outs[FM_MAX_OUTPUTS];
  fm_fragment *cut = j->h.cut;
  memcpy(cut, f, sizeof *cut);
  for (uint32_t k = 0; k < f->n_inputs; k++) {
    size_t off = (size_t)range_tensor(&cut->inputs[k], j) * fm_dtype_size(f->inputs[k].dtype);
    ins[k] = j->ins[k] ? (const uint8_t *)j->ins[k] + off : NULL;
  }
  for (uint32_t k = 0; k < f->n_outputs; k++) {
    size_t off = (size_t)range_tensor(&cut->outputs[k], j) * fm_dtype_size(f->outputs[k].dtype);
    outs[k] = (uint8_t *)j->outs[k] + off;
  }
  int64_t outer = !j->columns && j->dim == 0 ? j->len : j->outer;
  j->h.rc = fm_reference_eval(cut, outer, ins, outs, &j->h.d);
  return NULL;
}

/* A column fragment has nothing to sample (every row reaches every output), but its columns
 * are independent: over FM_SAMPLE_THREADS_MIN_ELEMENTS, its reference runs in FM_SAMPLE_COL_STRIPES
 * stripes of columns, each on a thread of its own, every column summed in the order the
 * whole evaluation sums it. Batch norm's statistics over [802816, 64] kept the tuner ~10 s
 * on one core per fragment, and a ResNet-50 training graph has dozens of them. */
static int cols_reference(const fm_fragment *f, int64_t outer, const void *const *inputs, void *const *outputs,
                          fm_diag *d) {
  fm_cols_info ci;
  if (fm_fragment_cols_info(f, &ci, NULL) != FM_OK || ci.n < 2) return fm_reference_eval(f, outer, inputs, outputs, d);
  int64_t rows = ci.m == FM_DIM_SYMBOLIC ? outer : ci.m;
  if (rows * ci.n < FM_SAMPLE_THREADS_MIN_ELEMENTS) return fm_reference_eval(f, outer, inputs, outputs, d);
  int64_t width = (ci.n + FM_SAMPLE_COL_STRIPES - 1) / FM_SAMPLE_COL_STRIPES;
  int stripes = (int)((ci.n + width - 1) / width);
  range_job jobs[FM_SAMPLE_COL_STRIPES];
  for (int b = 0; b < stripes; b++) {
    int64_t c0 = b * width, w = ci.n - c0 < width ? ci.n - c0 : width;
    jobs[b] = (range_job){{0}, f, outer, c0, w, 1, ci.n, 0, inputs, outputs};
  }
  return run_jobs(jobs, sizeof jobs[0], stripes, range_main, d);
}

/* The whole reference of a pointwise or row fragment of at least FM_SAMPLE_THREADS_MIN_ELEMENTS
 * in bands along the longest dim a block may cut, one thread each; fm_reference_eval for one
 * with no such dim, or one too small to be worth the threads. */
static int banded_reference(const fm_fragment *f, int64_t outer, const void *const *inputs, void *const *outputs,
                            fm_diag *d) {
  uint32_t rank = f->n_outputs ? f->outputs[0].rank : 0, cmax = rank ? max_cut(f) : 0, dim = 0;
  int64_t total = 1, size = 0;
  for (uint32_t i = 0; i < rank; i++) total *= fm_sample_dim(f, outer, i);
  for (uint32_t i = 0; i < cmax; i++)
    if (fm_sample_dim(f, outer, i) > size) size = fm_sample_dim(f, outer, i), dim = i;
  if (size < 2 || total < FM_SAMPLE_THREADS_MIN_ELEMENTS) return fm_reference_eval(f, outer, inputs, outputs, d);
  int64_t len = (size + FM_SAMPLE_BANDS - 1) / FM_SAMPLE_BANDS;
  int bands = (int)((size + len - 1) / len);
  range_job jobs[FM_SAMPLE_BANDS];
  for (int b = 0; b < bands; b++) {
    int64_t r0 = b * len;
    jobs[b] = (range_job){{0}, f, outer, r0, size - r0 < len ? size - r0 : len, 0, 0, dim, inputs, outputs};
  }
  return run_jobs(jobs, sizeof jobs[0], bands, range_main, d);
}

int fm_sample_reference(const fm_fragment *f, int64_t outer, const fm_sample *s, uint32_t fixed,
                        const void *const *inputs, void *const *outputs, fm_diag *d) {
  if (s->n == 0 && fm_fragment_is_cols(f)) return cols_reference(f, outer, inputs, outputs, d);
  if (s->n == 0) return banded_reference(f, outer, inputs, outputs, d);
  if (s->n > FM_SAMPLE_MAX_BLOCKS) return fm_diag_set(d, FM_EINVAL, "a sample of %d blocks", s->n);
  block_job jobs[FM_SAMPLE_MAX_BLOCKS];
  for (int b = 0; b < s->n; b++) jobs[b] = (block_job){{0}, f, outer, s, b, fixed, inputs, outputs};
  return run_jobs(jobs, sizeof jobs[0], s->n, block_main, d);
}
