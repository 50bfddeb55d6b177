/* test_codegen_candidates.c: the generic candidate API (fm_codegen_default / _candidates /
 * _generate / fm_candidate_describe) over the pointwise template. */
#include <stdlib.h>
#include <string.h>

#include "fm_codegen.h"
#include "fm_test.h"
#include "test_codegen_frag.h"

static void test_default_is_first_and_unique(void) {
  fm_fragment canon;
  CHECK_EQ_INT(tf_representative(0, &canon), FM_OK);
  fm_candidate def, all[64];
  fm_diag d = {{0}};
  CHECK_EQ_INT(fm_codegen_default(&canon, &def, &d), FM_OK);
  CHECK_EQ_INT(def.tmpl, FM_TMPL_POINTWISE);
  size_t n = fm_codegen_candidates(&canon, all, 64);
  CHECK(n >= 8 && n <= 64);
  CHECK(memcmp(&all[0], &def, sizeof def) == 0);
  for (size_t i = 0; i < n; i++)
    for (size_t j = i + 1; j < n; j++) CHECK(memcmp(&all[i], &all[j], sizeof all[i]) != 0);
  CHECK_EQ_INT(fm_codegen_candidates(&canon, all, 3), 3);
}

static void test_generate_matches_template(void) {
  fm_fragment canon;
  CHECK_EQ_INT(tf_representative(1, &canon), FM_OK);
  fm_candidate c;
  fm_diag d = {{0}};
  CHECK_EQ_INT(fm_codegen_default(&canon, &c, &d), FM_OK);
  char *a = NULL, *b = NULL;
  fm_kernel_meta ma, mb;
  CHECK_EQ_INT(fm_codegen_generate(&canon, &c, 132, &a, &ma, &d), FM_OK);
  fm_pw_config pw = fm_codegen_pointwise_default(&canon);
  CHECK_EQ_INT(fm_codegen_pointwise(&canon, &pw, 132, &b, &mb, &d), FM_OK);
  CHECK(a && b && strcmp(a, b) == 0); /* the generic path is exactly the template's */
  CHECK_EQ_INT(ma.items_per_block, mb.items_per_block);
  free(a);
  free(b);
}

static void test_describe_and_unknown(void) {
  fm_candidate c;
  memset(&c, 0, sizeof c);
  c.tmpl = FM_TMPL_POINTWISE;
  c.p[0] = 256;
  c.p[1] = 0;
  c.p[2] = 4;
  c.p[3] = 8;
  char buf[96];
  fm_candidate_describe(&c, buf, sizeof buf);
  CHECK(strcmp(buf, "pointwise block=256 vec=0 unroll=4 blocks_per_sm=8") == 0);
  CHECK(strcmp(fm_template_name(FM_TMPL_POINTWISE), "pointwise") == 0);
  fm_fragment canon;
  CHECK_EQ_INT(tf_representative(0, &canon), FM_OK);
  c.tmpl = (fm_template)99;
  char *src = NULL;
  fm_kernel_meta m;
  fm_diag d = {{0}};
  CHECK_EQ_INT(fm_codegen_generate(&canon, &c, 132, &src, &m, &d), FM_EUNSUPPORTED);
  CHECK_STR_CONTAINS(d.text, "template");
  CHECK(src == NULL);
}

/* x [-1, 256] f32 through n ops of one kind, each on the previous value (pow: by `exponent`). */
static void chain(fm_op op, int n, double exponent, fm_fragment *canon) {
  fm_fragment f;
  int64_t shape[2] = {-1, 256};
  tf_init(&f);
  tf_input(&f, 0, FM_DT_F32, 2, shape, NULL, 16);
  tf_const(&f, 1, exponent);
  uint32_t v = 0;
  for (int i = 0; i < n; i++) {
    uint32_t out = (uint32_t)i + 2;
    tf_op(&f, op, out, op == FM_OP_POW || op == FM_OP_ADD ? 2 : 1, v, 1, 0);
    v = out;
  }
  tf_output(&f, v, FM_DT_F32, 2, shape, NULL, 16);
  CHECK_EQ_INT(tf_finish(&f, canon), FM_OK);
}

/* The compile cost: ops weighted by what their code costs NVRTC; pow by an exponent the
 * generator special-cases is cheap. The daemon's bound refuses 255 chained general pows
 * (~50 s of NVRTC) and erfs (~13 s), and passes what models send. */
static void test_compile_cost(void) {
  fm_fragment canon;
  chain(FM_OP_ADD, 255, 1.0, &canon);
  CHECK_EQ_INT(fm_codegen_cost(&canon), 256);
  chain(FM_OP_POW, 255, 1.37, &canon);
  CHECK_EQ_INT(fm_codegen_cost(&canon), 1 + 255 * 32);
  CHECK(fm_codegen_cost(&canon) > FM_CODEGEN_MAX_COST);
  chain(FM_OP_POW, 255, 2.0, &canon); /* x * x */
  CHECK_EQ_INT(fm_codegen_cost(&canon), 1 + 255 * 2);
  CHECK(fm_codegen_cost(&canon) <= FM_CODEGEN_MAX_COST);
  chain(FM_OP_ERF, 255, 1.0, &canon);
  CHECK(fm_codegen_cost(&canon) > FM_CODEGEN_MAX_COST);
  for (int i = 0; i < TF_N_REPRESENTATIVE; i++) {
    CHECK_EQ_INT(tf_representative(i, &canon), FM_OK);
    CHECK(fm_codegen_cost(&canon) < 64);
  }
}

int main(void) {
  RUN(test_default_is_first_and_unique);
  RUN(test_generate_matches_template);
  RUN(test_describe_and_unknown);
  RUN(test_compile_cost);
  return FM_TEST_DONE();
}
