/* test_gpu_cuda.c: the dlopen'ed driver. Without a GPU (CI, this build machine) every GPU
 * entry point must answer FM_ENOGPU with a reason, not crash or abort; on a GPU machine the
 * same test checks the device identity instead. */
#include <string.h>

#include "fm_cuda.h"
#include "fm_module.h"
#include "fm_test.h"

static int have_gpu;

static void test_load(void) {
  const fm_cuda *cu = (const fm_cuda *)1;
  fm_diag d = {{0}};
  int err = fm_cuda_load(&cu, &d);
  if (err == FM_OK) {
    have_gpu = 1;
    CHECK(cu != NULL && cu->cuLaunchKernel != NULL && cu->cuMemAlloc != NULL);
    return;
  }
  CHECK_EQ_INT(err, FM_ENOGPU);
  CHECK(cu == NULL);
  CHECK(strlen(d.text) > 0);
  /* The reason says what was missing: the library, or a device. */
  CHECK(strstr(d.text, "libcuda.so.1") || strstr(d.text, "cuInit") || strstr(d.text, "device"));

  /* The failure is cached, and reported again with the same reason. */
  fm_diag d2 = {{0}};
  CHECK_EQ_INT(fm_cuda_load(NULL, &d2), FM_ENOGPU);
  CHECK(strcmp(d.text, d2.text) == 0);
  CHECK_EQ_INT(fm_cuda_load(NULL, NULL), FM_ENOGPU); /* d may be NULL */
}

static void test_device_id(void) {
  fm_device_id dev;
  fm_diag d = {{0}};
  int err = fm_cuda_device_id(0, &dev, &d);
  if (have_gpu) {
    CHECK_EQ_INT(err, FM_OK);
    CHECK(dev.name[0] != '\0');
    CHECK(dev.cc_major >= 5 && dev.sm_count > 0);
    CHECK(strncmp(dev.arch, "sm_", 3) == 0);
    if (dev.cc_major == 9 && dev.cc_minor == 0) CHECK(strcmp(dev.arch, "sm_90a") == 0);
    CHECK_EQ_INT(fm_cuda_device_id(10000, &dev, &d), FM_ENOGPU);
    return;
  }
  CHECK_EQ_INT(err, FM_ENOGPU);
  CHECK(strlen(d.text) > 0);
  CHECK_EQ_INT(fm_cuda_device_id(-1, &dev, &d), FM_EINVAL);
}

static void test_fail_format(void) {
  fm_diag d = {{0}};
  CHECK_EQ_INT(fm_cuda_fail(NULL, 700, "cuLaunchKernel", &d), FM_ECUDA);
  CHECK_STR_CONTAINS(d.text, "cuLaunchKernel");
  CHECK_STR_CONTAINS(d.text, "700");
}

/* The client's GPU side degrades the same way: a load without a driver is FM_ENOGPU. */
static void test_module_without_gpu(void) {
  static uint8_t fake_cubin[16] = {0x7f, 'E', 'L', 'F'};
  fm_compiled k;
  fm_module *m = (fm_module *)1;
  fm_diag d = {{0}};
  memset(&k, 0, sizeof k);
  snprintf(k.kind, sizeof k.kind, "pointwise");
  snprintf(k.meta.kind, sizeof k.meta.kind, "pointwise");
  snprintf(k.meta.entry, sizeof k.meta.entry, "fm_pw");
  snprintf(k.meta.grid_rule, sizeof k.meta.grid_rule, "elementwise");
  k.meta.n_inputs = 1;
  k.meta.n_outputs = 1;
  k.cubin = fake_cubin;
  k.cubin_len = sizeof fake_cubin;

  /* Refusals that need no GPU come first. */
  CHECK_EQ_INT(fm_module_load(NULL, &m, &d), FM_EINVAL);
  CHECK(m == NULL);
  snprintf(k.meta.grid_rule, sizeof k.meta.grid_rule, "gemm_tiles");
  CHECK_EQ_INT(fm_module_load(&k, &m, &d), FM_EUNSUPPORTED);
  CHECK_STR_CONTAINS(d.text, "gemm_tiles");
  snprintf(k.meta.grid_rule, sizeof k.meta.grid_rule, "elementwise");
  CHECK_EQ_INT(fm_module_launch(NULL, NULL, NULL, 1, NULL, &d), FM_EINVAL);

  if (have_gpu) return; /* a fake CUBIN would only test the driver's error path */
  CHECK_EQ_INT(fm_module_load(&k, &m, &d), FM_ENOGPU);
  CHECK(m == NULL);
  CHECK(strlen(d.text) > 0);
}

/* The raw-bytes loader (the Python backend's entry through ctypes) checks the metadata bytes
 * before it touches the GPU, then behaves as fm_module_load. */
static void test_module_load_bytes(void) {
  static const uint8_t fake_cubin[16] = {0x7f, 'E', 'L', 'F'};
  static const uint8_t not_a_map[] = {0x01};
  static const uint8_t two_objects[] = {0x80, 0x80};
  fm_kernel_meta meta;
  msgpack_sbuffer sb;
  msgpack_packer pk;
  fm_module *m = (fm_module *)1;
  fm_diag d = {{0}};

  memset(&meta, 0, sizeof meta);
  snprintf(meta.kind, sizeof meta.kind, "pointwise");
  snprintf(meta.entry, sizeof meta.entry, "fm_pw");
  snprintf(meta.grid_rule, sizeof meta.grid_rule, "elementwise");
  meta.block[0] = 256;
  meta.block[1] = 1;
  meta.block[2] = 1;
  meta.inner = 1024;
  meta.items_per_block = 2048;
  meta.max_blocks = 528;
  meta.outer = -1;
  meta.n_inputs = 1;
  meta.n_outputs = 1;
  msgpack_sbuffer_init(&sb);
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  CHECK_EQ_INT(fm_meta_pack(&meta, &pk), FM_OK);

  CHECK_EQ_INT(fm_module_load_bytes(NULL, 0, NULL, 0, &m, &d), FM_EINVAL);
  CHECK(m == NULL);
  CHECK_EQ_INT(fm_module_load_bytes(fake_cubin, sizeof fake_cubin, two_objects, sizeof two_objects, &m, &d),
               FM_EMALFORMED);
  CHECK_EQ_INT(fm_module_load_bytes(fake_cubin, sizeof fake_cubin, not_a_map, sizeof not_a_map, &m, &d), FM_ESCHEMA);
  CHECK_STR_CONTAINS(d.text, "meta");
  if (!have_gpu) {
    CHECK_EQ_INT(fm_module_load_bytes(fake_cubin, sizeof fake_cubin, (const uint8_t *)sb.data, sb.size, &m, &d),
                 FM_ENOGPU);
    CHECK(m == NULL);
  }
  msgpack_sbuffer_destroy(&sb);
}

/* cuBLASLt plans: a direct plan (rule "none") loads without a CUBIN where a kernel's metadata
 * needs one; without a GPU either refuses clearly; the scratch a launch needs comes from the
 * metadata alone. */
static void test_plan_without_cubin(void) {
  fm_kernel_meta meta;
  msgpack_sbuffer sb;
  msgpack_packer pk;
  fm_module *m = (fm_module *)1;
  fm_diag d = {{0}};
  memset(&meta, 0, sizeof meta);
  snprintf(meta.kind, sizeof meta.kind, "cublaslt");
  snprintf(meta.grid_rule, sizeof meta.grid_rule, "none");
  meta.block[0] = meta.block[1] = meta.block[2] = 1;
  meta.items_per_block = meta.max_blocks = 1;
  meta.outer = -1;
  meta.n_inputs = 2;
  meta.n_outputs = 1;
  fm_meta_blas *b = &meta.blas;
  snprintf(b->form, sizeof b->form, "direct");
  snprintf(b->dtype, sizeof b->dtype, "bf16");
  snprintf(b->act, sizeof b->act, "none");
  b->a = 0;
  b->b = 1;
  b->bias = b->c = -1;
  b->a_kmajor = b->b_kmajor = 1;
  b->lda = b->ldb = 12;
  b->ldc = b->ldd = 16;
  b->m = -1;
  b->n = 16;
  b->k = 12;
  for (int i = 0; i < 4; i++) b->align[i] = 16;
  b->workspace = 1000;
  CHECK(fm_meta_scratch_bytes(&meta, 100) == 1024); /* the workspace, rounded to 256 */
  msgpack_sbuffer_init(&sb);
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  CHECK_EQ_INT(fm_meta_pack(&meta, &pk), FM_OK);
  if (!have_gpu) {
    CHECK_EQ_INT(fm_module_load_bytes(NULL, 0, (const uint8_t *)sb.data, sb.size, &m, &d), FM_ENOGPU);
    CHECK(m == NULL);
  }
  msgpack_sbuffer_destroy(&sb);
  /* the same metadata as a kernel's (rule "elementwise") must bring its CUBIN */
  fm_compiled k;
  memset(&k, 0, sizeof k);
  k.meta = meta;
  snprintf(k.kind, sizeof k.kind, "cublaslt");
  snprintf(k.meta.grid_rule, sizeof k.meta.grid_rule, "elementwise");
  CHECK_EQ_INT(fm_module_load(&k, &m, &d), FM_EINVAL);
  CHECK_STR_CONTAINS(d.text, "no CUBIN");
}

int main(void) {
  RUN(test_load);
  RUN(test_device_id);
  RUN(test_fail_format);
  RUN(test_module_without_gpu);
  RUN(test_module_load_bytes);
  RUN(test_plan_without_cubin);
  return FM_TEST_DONE();
}
