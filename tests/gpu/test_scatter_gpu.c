/* test_scatter_gpu.c (device machine only): index_add (vocabulary 8, scatter fragments), every
 * candidate checked against the fp64 reference through the shared suite (gpu_suite.h): the
 * output zeroed before each launch, the index holding rows in range with both ends among them
 * (fm_reference_index_rows); then the MoE decoder's gathered rows' gradient and T5's relative
 * position bias gradient timed.
 *
 * Cases: bf16 / f16 / f32 src, odd row lengths (one element a thread), src rows padded or
 * column-major, many rows per output row (8192 into 37: atomics contending) and few (4096 into
 * 32000, an embedding's gradient), one row, D = 1; tables that fit shared memory: T5's bias
 * (262144 column-major rows of 12 into 32), BERT's token types (4096 rows of 768 into 2), an
 * odd column-major one (1001 rows of 7 into 5).
 *
 * Usage: test_scatter_gpu [SEED [check|time|both]]   One line per kernel, "N passed, N failed". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fm_fragment.h"
#include "gpu_suite.h"

typedef struct scatter_case {
  fm_dtype dt;
  int64_t m, dcols, r;
  int64_t s0, s1; /* src strides; 0: row-major */
} scatter_case;

static const scatter_case cases[] = {
    {FM_DT_BF16, 8192, 1024, 4096, 0, 0}, {FM_DT_F16, 333, 65, 100, 0, 0},    {FM_DT_F32, 8192, 40, 37, 0, 0},
    {FM_DT_BF16, 4096, 256, 32000, 0, 0}, {FM_DT_F32, 1000, 96, 500, 128, 1}, {FM_DT_BF16, 77, 33, 9, 1, 77},
    {FM_DT_F16, 1, 8, 1, 0, 0},           {FM_DT_F32, 513, 1, 3, 0, 0},        {FM_DT_BF16, 262144, 12, 32, 1, 262144},
    {FM_DT_F32, 4096, 768, 2, 0, 0},      {FM_DT_F16, 1001, 7, 5, 1, 1001},
};
#define T5_BIAS 8 /* the case timed beside the MoE decoder's */

static int build(const scatter_case *c, fm_fragment *canon, char *name, size_t cap) {
  static fm_fragment f;
  memset(&f, 0, sizeof f);
  f.vocab = FM_VOCAB_SCATTER;
  gs_matrix(&f.inputs[f.n_inputs++], 1, c->dt, c->m, c->dcols, 0);
  if (c->s0) {
    f.inputs[0].strides[0] = c->s0;
    f.inputs[0].strides[1] = c->s1;
  }
  gs_vector(&f.inputs[f.n_inputs++], 2, FM_DT_I64, c->m);
  gs_op(&f, FM_OP_INDEX_ADD, 3, 2, 1, 2, 0);
  gs_matrix(&f.outputs[f.n_outputs++], 3, FM_DT_F32, c->r, c->dcols, 0);
  f.outputs[0].strides[0] = c->dcols; /* dense rows, which index_add adds into */
  snprintf(name, cap, "index_add %s [%lld, %lld]%s into [%lld, %lld]", fm_dtype_name(c->dt), (long long)c->m,
           (long long)c->dcols, c->s0 ? " strided" : "", (long long)c->r, (long long)c->dcols);
  return gs_canon(&f, canon, name);
}

int main(int argc, char **argv) {
  uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 0) : 0x5ca7;
  const char *mode = argc > 2 ? argv[2] : "both";
  const int check = strcmp(mode, "time") != 0, time = strcmp(mode, "check") != 0;
  if (gs_start(seed)) return 2;
  static fm_fragment canon;
  char name[160];
  int bad = 0;
  for (size_t i = 0; check && i < sizeof cases / sizeof cases[0]; i++) {
    if (build(&cases[i], &canon, name, sizeof name)) {
      bad++;
      continue;
    }
    gs_add_case(name, &canon, cases[i].m, 1);
  }
  gs_run();
  for (size_t k = 0; time && k < 2; k++) {
    const scatter_case *c = &cases[k ? T5_BIAS : 0];
    if (build(c, &canon, name, sizeof name)) continue;
    char best[96];
    double ms = gs_time(&canon, c->m, 1, best, sizeof best);
    /* rows and indices read, sums added */
    const double bytes = (double)c->m * (double)c->dcols * 2 + (double)c->m * 8 + (double)c->r * (double)c->dcols * 4;
    printf("best %s: %.4f ms [%s], %.0f GB/s\n", name, ms, best, bytes / ms / 1e6);
  }
  return gs_finish() || bad ? 1 : 0;
}
