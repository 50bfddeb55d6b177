/* test_codegen_golden.c: the generated source of three representative fragments equals the
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

static char *read_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  char *buf = NULL;
  if (fseek(f, 0, SEEK_END) != 0) goto out;
  long n = ftell(f);
  if (n < 0 || fseek(f, 0, SEEK_SET) != 0) goto out;
  buf = malloc((size_t)n + 1);
  if (!buf) goto out;
  if (fread(buf, 1, (size_t)n, f) != (size_t)n) {
    free(buf);
    buf = NULL;
    goto out;
  }
  buf[n] = '\0';
out:
  fclose(f);
  return buf;
}

/* Reports the first line where two sources differ. */
static void report_diff(const char *want, const char *got) {
  int line = 1;
  const char *w = want, *g = got;
  while (*w && *w == *g) {
    if (*w == '\n') line++;
    w++;
    g++;
  }
  const char *we = strchr(w, '\n'), *ge = strchr(g, '\n');
  fprintf(stderr, "  golden differs at line %d:\n    want: %.*s\n    got:  %.*s\n", line,
          (int)(we ? we - w : (long)strlen(w)), w, (int)(ge ? ge - g : (long)strlen(g)), g);
}

static void check_golden(int which) {
  const char *root = getenv("FM_SOURCE_DIR");
#ifdef FM_CG_SOURCE_DIR
  if (!root) root = FM_CG_SOURCE_DIR;   /* run by hand, outside ctest */
#endif
  const char *update = getenv("FM_UPDATE_GOLDEN");
  char path[1024];
  CHECK(root != NULL);
  if (!root) return;
  snprintf(path, sizeof path, "%s/tests/unit/golden/%s.cu", root, tf_representative_name[which]);
  CHECK_EQ_INT(tf_representative(which, &canon), FM_OK);
  char *src = NULL;
  fm_kernel_meta meta;
  fm_diag d = {{0}};
  fm_pw_config cfg = fm_codegen_pointwise_default(&canon);
  CHECK_EQ_INT(fm_codegen_pointwise(&canon, &cfg, 132, &src, &meta, &d), FM_OK);
  if (!src) return;
  if (update && strcmp(update, "1") == 0) {
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (f) {
      CHECK(fwrite(src, 1, strlen(src), f) == strlen(src));
      CHECK(fclose(f) == 0);
      printf("  updated %s\n", path);
    }
  } else {
    char *want = read_file(path);
    if (!want) fprintf(stderr, "  cannot read %s (FM_UPDATE_GOLDEN=1 creates it)\n", path);
    CHECK(want != NULL);
    if (want && strcmp(want, src) != 0) {
      report_diff(want, src);
      CHECK(!"generated source equals the golden file");
    }
    free(want);
  }
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

int main(void) {
  RUN(test_golden_flat_bf16_gelu);
  RUN(test_golden_strided_bias_symbolic);
  RUN(test_golden_multi_where_cast);
  return FM_TEST_DONE();
}
