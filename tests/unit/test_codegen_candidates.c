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
  c.p[0] = 256; c.p[1] = 0; c.p[2] = 4; c.p[3] = 8;
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

int main(void) {
  RUN(test_default_is_first_and_unique);
  RUN(test_generate_matches_template);
  RUN(test_describe_and_unknown);
  return FM_TEST_DONE();
}
