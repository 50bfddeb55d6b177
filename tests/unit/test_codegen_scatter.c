/* test_codegen_scatter.c: the scatter template (vocabulary 8, index_add): the CPU reference
 * against sums written out by hand (rows named twice, rows named never, the output's prior
 * contents kept), the index rows the verifier fills in, the candidates and their vectors,
 * the generated source (goldens: the MoE decoder's gathered rows' gradient, T5's relative
 * position bias gradient through a shared table), its metadata, and every candidate through
 * NVRTC. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fm_codegen.h"
#include "fm_reference.h"
#include "fm_test.h"
#include "test_codegen_frag.h"

static fm_fragment raw, canon;

/* src [m, dcols] of src_dt (strides: NULL row-major), index [m], out f32 [r, dcols]. */
static int scatter(fm_dtype src_dt, int64_t m, int64_t dcols, int64_t r, const int64_t *src_strides) {
  const int64_t src[2] = {m, dcols}, index[1] = {m}, out[2] = {r, dcols};
  tf_init(&raw);
  raw.vocab = FM_VOCAB_SCATTER;
  tf_input(&raw, 1, src_dt, 2, src, src_strides, 16);
  tf_input(&raw, 2, FM_DT_I64, 1, index, NULL, 16);
  tf_op(&raw, FM_OP_INDEX_ADD, 3, 2, 1, 2, 0);
  tf_output(&raw, 3, FM_DT_F32, 2, out, NULL, 16);
  return tf_finish(&raw, &canon);
}

/* out[index[m]] += src[m] over what out holds, rows 0 and 2 twice, row 3 never. */
static void test_reference(void) {
  CHECK_EQ_INT(scatter(FM_DT_F32, 5, 3, 4, NULL), FM_OK);
  const float src[15] = {1, 2, 3, 10, 20, 30, 100, 200, 300, 0.5f, 0.25f, 0.125f, -1, -2, -3};
  const int64_t index[5] = {2, 0, 2, 1, 0};
  float out[12];
  for (int i = 0; i < 12; i++) out[i] = 1000.0f * (float)i;
  const void *ins[2] = {src, index};
  void *outs[1] = {out};
  fm_diag d = {{0}};
  CHECK_EQ_INT(fm_reference_eval(&canon, 0, ins, outs, &d), FM_OK);
  const float want[12] = {0 + 10 - 1,     1000 + 20 - 2,  2000 + 30 - 3,  3000 + 0.5f, 4000 + 0.25f, 5000 + 0.125f,
                          6000 + 1 + 100, 7000 + 2 + 200, 8000 + 3 + 300, 9000,        10000,        11000};
  for (int i = 0; i < 12; i++) CHECK(out[i] == want[i]);
  /* an index outside [0, R) is the reference's error, never a read or write past the rows */
  const int64_t bad[5] = {2, 0, 4, 1, 0};
  ins[1] = bad;
  CHECK_EQ_INT(fm_reference_eval(&canon, 0, ins, outs, &d), FM_EINVAL);
  CHECK_STR_CONTAINS(d.text, "index[2] = 4 is outside [0, 4)");
}

/* The verifier's index: rows in [0, R), both ends present; other fragments untouched. */
static void test_index_rows(void) {
  CHECK_EQ_INT(scatter(FM_DT_BF16, 1000, 8, 37, NULL), FM_OK);
  int64_t *index = malloc(1000 * sizeof *index);
  uint16_t *src = calloc(8000, sizeof *src);
  void *ins[2] = {src, index};
  CHECK_EQ_INT(fm_reference_index_rows(&canon, 42, ins), FM_OK);
  int lo = 0, hi = 0, inside = 1, hits[37] = {0};
  for (int m = 0; m < 1000; m++) {
    inside = inside && index[m] >= 0 && index[m] < 37;
    if (index[m] >= 0 && index[m] < 37) hits[index[m]]++;
    lo = lo || index[m] == 0;
    hi = hi || index[m] == 36;
  }
  CHECK(inside && lo && hi);
  int twice = 0;
  for (int r = 0; r < 37; r++) twice += hits[r] > 1;
  CHECK(twice > 0); /* M > R: rows that take several */
  for (int i = 0; i < 8000; i++) CHECK(src[i] == 0);
  free(index);
  free(src);
}

/* The MoE decoder's gathered rows' gradient (bf16 [8192, 1024] into [4096, 1024]): golden,
 * metadata, candidates, NVRTC; a strided src gets scalar loads. */
static void test_goldens(void) {
  CHECK_EQ_INT(scatter(FM_DT_BF16, 8192, 1024, 4096, NULL), FM_OK);
  CHECK_EQ_INT(canon.vocab, 8);
  fm_candidate def, all[16];
  fm_diag d = {{0}};
  CHECK_EQ_INT(fm_codegen_default(&canon, &def, &d), FM_OK);
  CHECK_EQ_INT(def.tmpl, FM_TMPL_SCATTER);
  CHECK_EQ_INT((int)def.p[0], 256);
  CHECK_EQ_INT((int)def.p[1], 4); /* one 16-byte add of f32 sums */
  size_t n = fm_codegen_candidates(&canon, all, 16);
  CHECK_EQ_INT((int)n, 9); /* 128, 256, 512 threads x 8, 4, 1 elements */
  char *src = NULL;
  fm_kernel_meta m;
  CHECK_EQ_INT(fm_codegen_generate(&canon, &def, 132, &src, &m, &d), FM_OK);
  CHECK(src && tf_golden("scatter_index_add_moe", src));
  CHECK(src && strstr(src, "__trap()") && strstr(src, "atomicAdd(reinterpret_cast<float4 *>(row) + q") &&
        strstr(src, "atomicAdd(row + e, fm_bf16_to_f32(v.e[e]))"));
  CHECK(strcmp(m.kind, "pointwise") == 0 && strcmp(m.grid_rule, "elementwise") == 0);
  CHECK(m.inner == 1024 && m.outer == 8192 && m.items_per_block == 256 * 4 && m.n_inputs == 2 && m.n_outputs == 1);
  CHECK_EQ_INT((int)fm_meta_grid_x(&m, m.outer), 8 * 132); /* capped: the kernel strides */
  free(src);
  int compiled = 0;
  CHECK_EQ_INT(tf_compile_candidates(&canon, "index_add moe", &compiled), 0);
  CHECK(compiled > 0);
  /* f16 src transposed (column-major): one element a thread, strided loads */
  const int64_t cm[2] = {1, 33};
  CHECK_EQ_INT(scatter(FM_DT_F16, 33, 5, 7, cm), FM_OK);
  n = fm_codegen_candidates(&canon, all, 16);
  for (size_t i = 0; i < n; i++) CHECK_EQ_INT((int)all[i].p[1], 1);
  CHECK_EQ_INT(tf_compile_candidates(&canon, "index_add f16 column-major", NULL), 0);
  /* a vector wider than the rows allow is refused, with the reason */
  fm_scatter_config wide = {.block = 256, .vec = 4};
  src = NULL;
  CHECK_EQ_INT(fm_codegen_scatter(&canon, &wide, 132, &src, &m, &d), FM_EUNSUPPORTED);
  CHECK_STR_CONTAINS(d.text, "wider than src's rows allow");
  CHECK(src == NULL);
}

/* T5's relative position bias gradient: 512 x 512 ids into 32 rows of 12 heads, the
 * gradient a permuted view (src column-major: [Q * K, H] strides [1, Q * K]). Default: a
 * shared table, lanes along M, eight rows a thread; candidates with lanes along M and tables
 * beside the plain ones; a table too large for shared memory refused. */
static void test_shared_table(void) {
  const int64_t cm[2] = {1, 262144};
  CHECK_EQ_INT(scatter(FM_DT_BF16, 262144, 12, 32, cm), FM_OK);
  fm_candidate def, all[16];
  fm_diag d = {{0}};
  CHECK_EQ_INT(fm_codegen_default(&canon, &def, &d), FM_OK);
  CHECK_EQ_INT(def.tmpl, FM_TMPL_SCATTER);
  CHECK_EQ_INT((int)def.p[1], 8);
  CHECK_EQ_INT((int)def.p[2], 1); /* table */
  CHECK_EQ_INT((int)def.p[3], 1); /* lanes along M */
  size_t n = fm_codegen_candidates(&canon, all, 16);
  CHECK_EQ_INT((int)n, 9); /* 3 along D one element a thread; 256, 512 x (M, M table, D table) */
  int tables = 0, columns = 0;
  for (size_t i = 0; i < n; i++) {
    tables += all[i].p[2] == 1;
    columns += all[i].p[3] == 1;
    CHECK(all[i].p[3] ? all[i].p[1] == 8 : all[i].p[1] == 1);
  }
  CHECK_EQ_INT(tables, 4);
  CHECK_EQ_INT(columns, 4);
  char *src = NULL, text[96];
  fm_kernel_meta m;
  CHECK_EQ_INT(fm_codegen_generate(&canon, &def, 132, &src, &m, &d), FM_OK);
  CHECK(src && tf_golden("scatter_index_add_t5_bias", src));
  CHECK(src && strstr(src, "__shared__ float sums[384]") && strstr(src, "if (next != r)") &&
        strstr(src, "if (sums[i] != 0.0f) atomicAdd(out0 + i, sums[i])"));
  CHECK(m.items_per_block == 256 * 8 && m.inner == 12 && m.outer == 262144);
  CHECK_EQ_INT((int)fm_meta_grid_x(&m, m.outer), 2 * 132); /* a table flushed a block */
  fm_candidate_describe(&def, text, sizeof text);
  CHECK_STR_CONTAINS(text, "scatter block=256 vec=8 lanes=m table");
  free(src);
  CHECK_EQ_INT(tf_compile_candidates(&canon, "index_add t5 bias", NULL), 0);
  /* few src rows an output row: no table by default, one still a candidate */
  CHECK_EQ_INT(scatter(FM_DT_F32, 100, 16, 64, NULL), FM_OK);
  CHECK_EQ_INT(fm_codegen_default(&canon, &def, &d), FM_OK);
  CHECK_EQ_INT((int)def.p[2], 0);
  n = fm_codegen_candidates(&canon, all, 16);
  tables = 0;
  for (size_t i = 0; i < n; i++) tables += all[i].p[2] == 1 && all[i].p[3] == 0;
  CHECK_EQ_INT(tables, 2);
  /* a table over 16 KB of shared memory is refused, with the reason */
  CHECK_EQ_INT(scatter(FM_DT_BF16, 4096, 1024, 8, NULL), FM_OK);
  fm_scatter_config big = {.block = 256, .vec = 8, .table = 1};
  src = NULL;
  CHECK_EQ_INT(fm_codegen_scatter(&canon, &big, 132, &src, &m, &d), FM_EUNSUPPORTED);
  CHECK_STR_CONTAINS(d.text, "over 16384 bytes of shared memory");
  CHECK(src == NULL);
  fm_scatter_config flag = {.block = 256, .vec = 1, .lanes_m = 2};
  CHECK_EQ_INT(fm_codegen_scatter(&canon, &flag, 132, &src, &m, &d), FM_EINVAL);
}

int main(void) {
  RUN(test_reference);
  RUN(test_index_rows);
  RUN(test_goldens);
  RUN(test_shared_table);
  return FM_TEST_DONE();
}
