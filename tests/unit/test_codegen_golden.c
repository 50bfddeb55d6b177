/* test_codegen_golden.c: the generated source of four representative fragments equals the
 * files in tests/unit/golden/, byte for byte.
 *
 * A deliberate change to generated code (which must also bump FM_CODEGEN_VERSION) is
 * accepted by regenerating the files and reviewing the diff:
 *     FM_UPDATE_GOLDEN=1 ctest -R test_codegen_golden     (or run the binary directly)
 * The test finds the files through FM_SOURCE_DIR (set by ctest; the build's source dir
 * otherwise). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fm_codegen.h"
#include "fm_test.h"
#include "test_codegen_frag.h"

static fm_fragment canon;

static void check_golden(int which) {
  CHECK_EQ_INT(tf_representative(which, &canon), FM_OK);
  char *src = NULL;
  fm_kernel_meta meta;
  fm_diag d = {{0}};
  fm_pw_config cfg = fm_codegen_pointwise_default(&canon);
  CHECK_EQ_INT(fm_codegen_pointwise(&canon, &cfg, 132, &src, &meta, &d), FM_OK);
  if (!src) return;
  CHECK(tf_golden(tf_representative_name[which], src));
  /* Whatever the files say, the properties the goldens were chosen for must hold. */
  CHECK(strstr(src, "#include") == NULL);
  char want[96];
  snprintf(want, sizeof want, "extern \"C\" __global__ void __launch_bounds__(256) fm_pointwise_v%d(",
           FM_CODEGEN_VERSION);
  CHECK_STR_CONTAINS(src, want);
  free(src);
}

static void test_golden_flat_bf16_gelu(void) { check_golden(0); }
static void test_golden_strided_bias_symbolic(void) { check_golden(1); }
static void test_golden_multi_where_cast(void) { check_golden(2); }
static void test_golden_units_odd_rows(void) { check_golden(3); }

int main(void) {
  RUN(test_golden_flat_bf16_gelu);
  RUN(test_golden_strided_bias_symbolic);
  RUN(test_golden_multi_where_cast);
  RUN(test_golden_units_odd_rows);
  return FM_TEST_DONE();
}
