/* fm_reference_sample.h: the reference outputs of a large fragment at a sample of its
 * elements, so the tuner can verify a kernel over hundreds of millions of elements in a
 * fraction of a second (daemon/tuner/fusemld_tuner.c).
 *
 * Why: fm_reference_eval costs a core tens of nanoseconds per element and op. Cross-entropy's
 * rows over 4096 x 50304 logits kept the tuner 9-11 s in the reference before it could judge
 * the first candidate, and every fragment of the graph queued behind it: most of a first
 * training step's compile time.
 *
 * What may be cut: elements along the leading dims of most fragments are independent. A
 * pointwise fragment's along every dim; a row fragment's along every dim but the reduced
 * last one; a cat fragment's along the dims before its cat; a GEMM's along M; a bmm's along
 * its batch. A column fragment (reductions over dim 0) has none. A *block* fixes an index in
 * each of the first `cut` dims of the iteration space and covers the rest. It is evaluated as
 * the same fragment with those dims of size 1, over tensors offset to the block. A tensor of
 * size 1 along a cut dim is broadcast there and not offset; a symbolic dim 0 stays symbolic,
 * evaluated with outer = 1.
 *
 * The sample (fm_sample_choose): strips at the start, the middle and the end of the leading
 * index space (where edge and tail code runs), and one block drawn from each of equal
 * stretches between them, so a kernel wrong in one region of its grid is caught wherever the
 * region lies. Blocks are evaluated in parallel, one thread each. */
#ifndef FM_REFERENCE_SAMPLE_H
#define FM_REFERENCE_SAMPLE_H

#include <stdint.h>

#include "fm_error.h"
#include "fm_fragment.h"

#define FM_SAMPLE_MAX_BLOCKS     32
/* Below this many elements in the iteration space the reference computes every one. */
#define FM_SAMPLE_MIN_ELEMENTS   (1ll << 22)
/* The most elements one block should hold: the chooser cuts the fewest leading dims that get
 * a block under it (a row fragment's block is at least one row). */
#define FM_SAMPLE_BLOCK_ELEMENTS (1ll << 18)

typedef struct fm_sample {
  uint32_t cut; /* leading dims each block fixes */
  int n;        /* blocks; 0: every element (cut is then 0) */
  /* each block's index flattened over the cut dims (row-major), ascending, distinct */
  int64_t lead[FM_SAMPLE_MAX_BLOCKS];
} fm_sample;

/* The sample of a valid canonical pointwise, row or cat fragment at outer (the size of a
 * symbolic dim 0): n = 0 when the iteration space is under FM_SAMPLE_MIN_ELEMENTS, when no
 * dim can be cut, or when the leading index space has no more blocks than a sample takes;
 * n = 0 for every other kind of fragment (GEMM, bmm, columns: the tuner samples those
 * itself). seed picks the random blocks. */
void fm_sample_choose(const fm_fragment *f, int64_t outer, uint64_t seed, fm_sample *s);

/* Adds block `lead` (kept ascending and distinct); 0, or -1 when the sample is full. */
int fm_sample_add(fm_sample *s, int64_t lead);

/* The size of the iteration space's dim d (< rank) at outer: outputs[0]'s, except a row
 * fragment's last, which is its rows' length (outputs[0] may be a per-row value). */
int64_t fm_sample_dim(const fm_fragment *f, int64_t outer, uint32_t d);

/* The element offset of block b in tensor t, a tensor of f's iteration rank (an output, or an
 * input that is not broadcast across the cut dims as a whole). */
int64_t fm_sample_offset(const fm_fragment *f, int64_t outer, const fm_sample *s, int b, const fm_tensor *t);

/* A fragment evaluated whole (no sample) of at least FM_SAMPLE_THREADS_MIN_ELEMENTS runs on
 * threads: a column fragment in FM_SAMPLE_COL_STRIPES stripes of columns (its columns are
 * independent), a pointwise or row fragment in up to FM_SAMPLE_BANDS bands along its longest
 * dim that blocks may cut (its elements there are independent). Why: whole, the reference
 * took 100-800 ms a fragment on one core at BERT's sizes (3M elements), and the fragments
 * of a first training step are verified one after another. */
#define FM_SAMPLE_THREADS_MIN_ELEMENTS (1ll << 18)
#define FM_SAMPLE_COL_STRIPES          16
#define FM_SAMPLE_BANDS                16

/* The reference outputs of f (fm_reference_eval's contract) at the sample's blocks only: each
 * block on a thread of its own, written where the whole evaluation would write it. The
 * inputs in `fixed` (a bit per input: a GEMM's B, whose rows are K, not M) are never offset.
 * With s->n == 0, every element: a large column fragment in stripes of columns, a large
 * pointwise or row fragment in bands (above), bit for bit what fm_reference_eval computes;
 * anything else by fm_reference_eval. */
int fm_sample_reference(const fm_fragment *f, int64_t outer, const fm_sample *s, uint32_t fixed,
                        const void *const *inputs, void *const *outputs, fm_diag *d);

#endif
