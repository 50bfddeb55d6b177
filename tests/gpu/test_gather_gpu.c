/* test_gather_gpu.c (device machine only): take_rows (vocabulary 9, rows read at an i64 index)
 * in the pointwise template's extent form, every candidate checked against the fp64 reference
 * through the shared suite (gpu_suite.h), the index holding rows of src with both ends and
 * their negative spellings among them (fm_reference_index_rows); then the MoE decoder's
 * combine timed.
 *
 * Cases: the MoE combine (bf16 product [8192, 1024] read at two picks of a strided index,
 * scaled by f32 weights, summed into a bf16 residual); f16 rows of odd length; f32 rows of one
 * element broadcast along the columns; column-major bf16 rows; an index of its own per element;
 * more rows taken than src has (rows taken several times) and fewer; a BERT's three embeddings
 * (ids of rank 2, rows read as [S, 1, D], one index broadcast over the batch) summed.
 *
 * Usage: test_gather_gpu [SEED [check|time|both]]   One line per kernel, "N passed, N failed". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fm_fragment.h"
#include "gpu_suite.h"

typedef struct gather_case {
  fm_dtype dt;
  int64_t s, src_cols, t, cols;
  int colmajor, full_index, picks; /* picks: an index read every `picks` rows, that many taken */
} gather_case;

static const gather_case cases[] = {
    {FM_DT_BF16, 8192, 1024, 4096, 1024, 0, 0, 2}, /* the MoE combine */
    {FM_DT_F16, 333, 65, 100, 65, 0, 0, 1},        {FM_DT_F32, 37, 1, 513, 7, 0, 0, 1},
    {FM_DT_BF16, 77, 33, 50, 33, 1, 0, 1},         {FM_DT_F32, 9, 24, 40, 24, 0, 1, 1},
    {FM_DT_BF16, 5, 8, 4096, 8, 0, 0, 2},
};

static int build(const gather_case *c, fm_fragment *canon, char *name, size_t cap) {
  static fm_fragment f;
  memset(&f, 0, sizeof f);
  f.vocab = FM_VOCAB_GATHER;
  gs_matrix(&f.inputs[f.n_inputs++], 1, c->dt, c->s, c->src_cols, c->colmajor);
  uint32_t next = 10, sum = 0;
  for (int p = 0; p < c->picks; p++) {
    fm_tensor *ix = &f.inputs[f.n_inputs++], *w = &f.inputs[f.n_inputs++];
    gs_matrix(ix, 2 + 2 * (uint32_t)p, FM_DT_I64, c->t, c->full_index ? c->cols : 1, 0);
    gs_matrix(w, 3 + 2 * (uint32_t)p, FM_DT_F32, c->t, 1, 0);
    if (!c->full_index) ix->strides[0] = w->strides[0] = c->picks; /* every picks-th of T*picks */
    const uint32_t taken = next++;
    uint32_t scaled = next++;
    gs_op(&f, FM_OP_TAKE_ROWS, taken, 2, 1, ix->id, 0);
    gs_op(&f, FM_OP_MUL, scaled, 2, taken, w->id, 0);
    if (sum) {
      gs_op(&f, FM_OP_ADD, next, 2, sum, scaled, 0);
      scaled = next++;
    }
    sum = scaled;
  }
  const fm_dtype out_dt = c->dt == FM_DT_F32 ? FM_DT_F32 : c->dt;
  if (out_dt != FM_DT_F32) {
    gs_op(&f, FM_OP_CAST, next, 1, sum, 0, 0);
    f.ops[f.n_ops - 1].dtype = out_dt;
    sum = next++;
  }
  if (c->picks > 1) { /* the residual the picks are added to */
    gs_matrix(&f.inputs[f.n_inputs++], 9, out_dt, c->t, c->cols, 0);
    gs_op(&f, FM_OP_ADD, next, 2, 9, sum, 0);
    sum = next++;
  }
  gs_matrix(&f.outputs[f.n_outputs++], sum, out_dt, c->t, c->cols, 0);
  f.outputs[0].strides[0] = c->cols; /* dense rows: the suite compares every element of the span */
  snprintf(name, cap, "take_rows %s [%lld, %lld]%s at %d x [%lld, %lld]%s", fm_dtype_name(c->dt), (long long)c->s,
           (long long)c->src_cols, c->colmajor ? " column-major" : "", c->picks, (long long)c->t,
           (long long)(c->full_index ? c->cols : 1), c->picks > 1 ? " + residual" : "");
  return gs_canon(&f, canon, name);
}

static void tensor3(fm_tensor *t, uint32_t id, fm_dtype dt, int64_t d0, int64_t d1, int64_t d2, int64_t s0, int64_t s1,
                    int64_t s2) {
  memset(t, 0, sizeof *t);
  *t = (fm_tensor){.id = id, .dtype = dt, .rank = 3, .shape = {d0, d1, d2}, .strides = {s0, s1, s2}, .align = 16};
}

/* A BERT's embeddings as the client spells them for ids of rank 2: word rows [V, 1, D] at the
 * token ids [B, S, 1], token-type rows [2, 1, D] at ids broadcast over the batch [B, S, 1]
 * (stride 0), position rows [P, 1, D] at [1, S, 1], summed and cast to f32 [B, S, D]. */
static int build_embeddings(int64_t b, int64_t s, int64_t dim, fm_fragment *canon, char *name, size_t cap) {
  static fm_fragment f;
  memset(&f, 0, sizeof f);
  f.vocab = FM_VOCAB_GATHER;
  const int64_t v = 1001, types = 2, positions = s + 27;
  tensor3(&f.inputs[f.n_inputs++], 1, FM_DT_BF16, v, 1, dim, dim, 0, 1);
  tensor3(&f.inputs[f.n_inputs++], 2, FM_DT_I64, b, s, 1, s, 1, 0);
  tensor3(&f.inputs[f.n_inputs++], 3, FM_DT_BF16, types, 1, dim, dim, 0, 1);
  tensor3(&f.inputs[f.n_inputs++], 4, FM_DT_I64, b, s, 1, 0, 1, 0);
  tensor3(&f.inputs[f.n_inputs++], 5, FM_DT_BF16, positions, 1, dim, dim, 0, 1);
  tensor3(&f.inputs[f.n_inputs++], 6, FM_DT_I64, 1, s, 1, 0, 1, 0);
  gs_op(&f, FM_OP_TAKE_ROWS, 10, 2, 1, 2, 0);
  gs_op(&f, FM_OP_TAKE_ROWS, 11, 2, 3, 4, 0);
  gs_op(&f, FM_OP_ADD, 12, 2, 10, 11, 0);
  gs_op(&f, FM_OP_TAKE_ROWS, 13, 2, 5, 6, 0);
  gs_op(&f, FM_OP_ADD, 14, 2, 12, 13, 0);
  gs_op(&f, FM_OP_CAST, 15, 1, 14, 0, 0);
  f.ops[f.n_ops - 1].dtype = FM_DT_F32;
  tensor3(&f.outputs[f.n_outputs++], 15, FM_DT_F32, b, s, dim, s * dim, dim, 1);
  snprintf(name, cap, "take_rows embeddings: bf16 word, type and position rows at [%lld, %lld] ids, D %lld",
           (long long)b, (long long)s, (long long)dim);
  return gs_canon(&f, canon, name);
}

int main(int argc, char **argv) {
  uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 0) : 0x6a7e;
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
    gs_add_case(name, &canon, cases[i].t, 1);
  }
  static const int64_t embeddings[][3] = {{3, 37, 96}, {8, 512, 768}, {2, 5, 8}};
  for (size_t i = 0; check && i < sizeof embeddings / sizeof embeddings[0]; i++) {
    if (build_embeddings(embeddings[i][0], embeddings[i][1], embeddings[i][2], &canon, name, sizeof name)) {
      bad++;
      continue;
    }
    gs_add_case(name, &canon, embeddings[i][0], 1);
  }
  gs_run();
  if (time && !build(&cases[0], &canon, name, sizeof name)) {
    char best[96];
    double ms = gs_time(&canon, cases[0].t, 1, best, sizeof best);
    /* the product's picked rows, the residual read and the sum written (bf16), the picks' i64
       rows and f32 weights */
    const double bytes = 8192.0 * 1024 * 2 + 2 * 4096.0 * 1024 * 2 + 8192.0 * (8 + 4);
    printf("best %s: %.4f ms [%s], %.0f GB/s\n", name, ms, best, bytes / ms / 1e6);
  }
  return gs_finish() || bad ? 1 : 0;
}
