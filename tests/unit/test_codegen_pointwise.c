/* test_codegen_pointwise.c: the pointwise generator's decisions (path, vector width,
 * coalescing), its metadata, configs and candidates, refusals, and what may appear in
 * generated source. Compilation is test_codegen_nvrtc's job; exact text is the goldens'. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fm_codegen.h"
#include "fm_test.h"
#include "test_codegen_frag.h"

static fm_fragment raw, canon;

/* Generates for canon with cfg (NULL: default); returns the source or NULL (rc in *rc). */
static char *gen(const fm_fragment *f, const fm_pw_config *cfg, uint32_t sms, fm_kernel_meta *m, int *rc_out,
                 fm_diag *d) {
  char *src = NULL;
  fm_kernel_meta meta;
  fm_diag dd = {{0}};
  int rc = fm_codegen_pointwise(f, cfg, sms, &src, m ? m : &meta, d ? d : &dd);
  if (rc_out) *rc_out = rc;
  if (rc && !rc_out) fprintf(stderr, "  codegen: %s: %s\n", fm_strerror(rc), (d ? d : &dd)->text);
  return src;
}

static void test_meta_flat(void) {
  CHECK_EQ_INT(tf_representative(0, &canon), FM_OK);
  fm_kernel_meta m;
  char *src = gen(&canon, NULL, 132, &m, NULL, NULL);
  CHECK(src != NULL);
  CHECK_STR_CONTAINS(src, "FLAT path, vec 8, unroll 4, block 256");
  CHECK(strcmp(m.kind, "pointwise") == 0);
  CHECK(strcmp(m.grid_rule, "elementwise") == 0);
  char want[32];
  snprintf(want, sizeof want, "fm_pointwise_v%d", FM_CODEGEN_VERSION);
  CHECK(strcmp(m.entry, want) == 0);
  CHECK_EQ_INT(m.block[0], 256);
  CHECK_EQ_INT(m.block[1], 1);
  CHECK_EQ_INT(m.block[2], 1);
  CHECK_EQ_INT(m.smem, 0);
  CHECK_EQ_INT(m.items_per_block, 256 * 8 * 4);
  CHECK_EQ_INT(m.inner, 1024);
  CHECK_EQ_INT(m.outer, 4096);
  CHECK_EQ_INT(m.max_blocks, 8 * 132);
  CHECK_EQ_INT(m.n_inputs, 2);
  CHECK_EQ_INT(m.n_outputs, 1);
  free(src);
  /* the grid cap follows the SM count; 0 means "assume an H100's 132" */
  src = gen(&canon, NULL, 108, &m, NULL, NULL);
  CHECK_EQ_INT(m.max_blocks, 8 * 108);
  free(src);
  src = gen(&canon, NULL, 0, &m, NULL, NULL);
  CHECK_EQ_INT(m.max_blocks, 8 * 132);
  free(src);
  fm_pw_config c = {512, 0, 1, 4};
  src = gen(&canon, &c, 100, &m, NULL, NULL);
  CHECK_EQ_INT(m.items_per_block, 512 * 8 * 1);
  CHECK_EQ_INT(m.max_blocks, 400);
  CHECK_EQ_INT(m.block[0], 512);
  CHECK_STR_CONTAINS(src, "__launch_bounds__(512)");
  free(src);
}

static void test_meta_symbolic_and_multi(void) {
  fm_kernel_meta m;
  CHECK_EQ_INT(tf_representative(1, &canon), FM_OK);
  char *src = gen(&canon, NULL, 132, &m, NULL, NULL);
  CHECK_STR_CONTAINS(src, "STRIDED path, vec 8, unroll 2");
  CHECK_STR_CONTAINS(src, "const long long n = outer * 768LL;");
  CHECK_EQ_INT(m.outer, -1);
  CHECK_EQ_INT(m.inner, 768);
  CHECK_EQ_INT(m.items_per_block, 256 * 8 * 2);
  free(src);
  CHECK_EQ_INT(tf_representative(2, &canon), FM_OK);
  src = gen(&canon, NULL, 132, &m, NULL, NULL);
  /* f32 beside bf16 and bool: 8 elements a vector, two 16-byte accesses of the f32 input */
  CHECK_STR_CONTAINS(src, "FLAT path, vec 8, unroll 2");
  CHECK_EQ_INT(m.outer, 64);
  CHECK_EQ_INT(m.inner, 128);
  CHECK_EQ_INT(m.items_per_block, 256 * 8 * 2);
  CHECK_EQ_INT(m.n_inputs, 1);
  CHECK_EQ_INT(m.n_outputs, 3);
  CHECK_STR_CONTAINS(src, "struct __align__(16) fm_uint4x2 { uint4 lo, hi; };");
  CHECK_STR_CONTAINS(src, "r0[u] = *reinterpret_cast<const fm_uint4x2 *>(in0 + v * 8);");
  /* at vec 8 the bf16 output moves 16 bytes and the bool output 8 */
  CHECK_STR_CONTAINS(src, "*reinterpret_cast<uint4 *>(out1 + v * 8) = w1[u];");
  CHECK_STR_CONTAINS(src, "*reinterpret_cast<uint2 *>(out2 + v * 8) = w2[u];");
  free(src);
  /* asked for 16 bytes of the f32 tensor (the tuner's other point): as before */
  fm_pw_config c4 = {256, 4, 2, 8};
  src = gen(&canon, &c4, 132, &m, NULL, NULL);
  CHECK_STR_CONTAINS(src, "FLAT path, vec 4, unroll 2");
  CHECK(strstr(src, "fm_uint4x2") == NULL);
  CHECK_STR_CONTAINS(src, "*reinterpret_cast<uint2 *>(out1 + v * 4) = w1[u];");
  free(src);
}

/* Value ids are the client's; the source must be built only from positions and typed
 * fields, so an id can never reach it (not even as a number). */
static void test_no_client_ids_in_source(void) {
  int64_t xs[2] = {-1, 96}, bs[2] = {1, 96};
  tf_init(&raw);
  tf_input(&raw, 123456, FM_DT_F16, 2, xs, NULL, 16);
  tf_input(&raw, 654321, FM_DT_F16, 2, bs, NULL, 16);
  tf_input(&raw, 777777, FM_DT_F32, 2, bs, NULL, 16); /* dead: no output reads it */
  tf_op(&raw, FM_OP_MUL, 999999, 2, 123456, 654321, 0);
  tf_const(&raw, 888888, 2.5);
  tf_op(&raw, FM_OP_ADD, 424242, 2, 999999, 888888, 0);
  tf_op(&raw, FM_OP_TANH, 313131, 1, 424242, 0, 0); /* dead op */
  tf_output(&raw, 424242, FM_DT_F16, 2, xs, NULL, 16);
  CHECK_EQ_INT(tf_finish(&raw, &canon), FM_OK);
  static const char *ids[] = {"123456", "654321", "777777", "999999", "888888", "424242", "313131"};
  for (int pass = 0; pass < 2; pass++) {
    /* the validated raw fragment too: even uncanonicalized ids must not leak */
    char *src = gen(pass ? &raw : &canon, NULL, 0, NULL, NULL, NULL);
    CHECK(src != NULL);
    if (!src) continue;
    for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++) {
      if (strstr(src, ids[i])) fprintf(stderr, "  id %s leaked into the source\n", ids[i]);
      CHECK(strstr(src, ids[i]) == NULL);
    }
    CHECK_STR_CONTAINS(src, "2.5f");
    CHECK(strstr(src, "tanhf(v") == NULL);                    /* dead code is not generated */
    CHECK(strstr(src, " i2") == NULL);                        /* the dead input is never loaded */
    CHECK_STR_CONTAINS(src, "const float *__restrict__ in2"); /* but keeps its parameter */
    free(src);
  }
}

/* One f32/bf16/... input x -> relu -> output, with the given layout. */
static int unary_frag(fm_dtype dt, uint32_t rank, const int64_t *shape, const int64_t *in_strides, uint32_t align) {
  tf_init(&raw);
  tf_input(&raw, 1, dt, rank, shape, in_strides, align);
  tf_op(&raw, FM_OP_RELU, 2, 1, 1, 0, 0);
  tf_output(&raw, 2, dt, rank, shape, NULL, 16);
  return tf_finish(&raw, &canon);
}

static void test_vector_width_and_paths(void) {
  fm_kernel_meta m;
  char *src;
  int64_t s2[2] = {64, 64};
  /* bf16 whose base is only 4-byte aligned: two elements per access */
  CHECK_EQ_INT(unary_frag(FM_DT_BF16, 2, s2, NULL, 4), FM_OK);
  src = gen(&canon, NULL, 0, &m, NULL, NULL);
  CHECK_STR_CONTAINS(src, "FLAT path, vec 2,");
  CHECK_STR_CONTAINS(src, "reinterpret_cast<const unsigned int *>(in0 + v * 2)");
  free(src);
  /* transposed input: strided, nothing to vectorize along the rows; the row-major output
     stores units of 4 f32, the input read an element at a time at each one's coordinates */
  CHECK_EQ_INT(unary_frag(FM_DT_F32, 2, s2, (int64_t[]){1, 64}, 16), FM_OK);
  src = gen(&canon, NULL, 0, &m, NULL, NULL);
  CHECK_STR_CONTAINS(src, "STRIDED with UNITS path, vec 4,");
  CHECK_STR_CONTAINS(src, "r0[u][e] = in0[(c0 + c1 * 64LL)];");
  CHECK_STR_CONTAINS(src, "if (++c1 == 64LL) { c1 = 0; ++c0; }");
  CHECK_STR_CONTAINS(src, "*reinterpret_cast<uint4 *>(out0 + v * 4) = w0[u];");
  CHECK(strstr(src, "the last n %") == NULL); /* 4 divides 64 x 64 */
  CHECK_EQ_INT(m.items_per_block, 256 * 4 * 2);
  free(src);
  fm_pw_config one = {256, 1, 2, 8}; /* vec 1: the element-a-thread form, timed beside */
  src = gen(&canon, &one, 0, &m, NULL, NULL);
  CHECK_STR_CONTAINS(src, "STRIDED path, vec 1,");
  CHECK_STR_CONTAINS(src, "r0[u] = in0[(c0 + c1 * 64LL)];");
  CHECK_EQ_INT(m.items_per_block, 256 * 1 * 2);
  free(src);
  /* odd rows (GPT-2's vocabulary) read at a padded row stride, written contiguous: units of
     8 bf16 across rows, the last 37 * 1001 % 8 elements by block 0 */
  int64_t odd[2] = {37, 1001};
  CHECK_EQ_INT(unary_frag(FM_DT_BF16, 2, odd, (int64_t[]){1008, 1}, 16), FM_OK);
  src = gen(&canon, NULL, 0, &m, NULL, NULL);
  CHECK_STR_CONTAINS(src, "STRIDED with UNITS path, vec 8,");
  CHECK_STR_CONTAINS(src, "r0[u][e] = in0[(c0 * 1008LL + c1)];");
  CHECK_STR_CONTAINS(src, "the last n % 8 elements");
  CHECK_STR_CONTAINS(src, "fm_compute(in0[(c0 * 1008LL + c1)], o0);");
  free(src);
  /* an output aligned to 8 bytes only: units of 4 bf16, as wide as that alignment allows */
  tf_init(&raw);
  tf_input(&raw, 1, FM_DT_BF16, 2, odd, (int64_t[]){1008, 1}, 16);
  tf_op(&raw, FM_OP_RELU, 2, 1, 1, 0, 0);
  tf_output(&raw, 2, FM_DT_BF16, 2, odd, NULL, 8);
  CHECK_EQ_INT(tf_finish(&raw, &canon), FM_OK);
  src = gen(&canon, NULL, 0, &m, NULL, NULL);
  CHECK_STR_CONTAINS(src, "STRIDED with UNITS path, vec 4,");
  CHECK_STR_CONTAINS(src, "*reinterpret_cast<uint2 *>(out0 + v * 4) = w0[u];");
  free(src);
  CHECK_EQ_INT(unary_frag(FM_DT_BF16, 2, odd, (int64_t[]){1008, 1}, 16), FM_OK);
  size_t n_units = fm_codegen_pointwise_candidates(&canon, (fm_pw_config[64]){0}, 64);
  CHECK_EQ_INT(n_units, 25); /* the default with units, and once at one element a thread */
  /* a padded innermost dim of 12 bf16: 8 does not divide it, 4 does; units of 8 only asked */
  int64_t s12[2] = {-1, 12};
  CHECK_EQ_INT(unary_frag(FM_DT_BF16, 2, s12, (int64_t[]){16, 1}, 16), FM_OK);
  src = gen(&canon, NULL, 0, &m, NULL, NULL);
  CHECK_STR_CONTAINS(src, "STRIDED path, vec 4,");
  free(src);
  fm_pw_config eight = {256, 8, 2, 8};
  src = gen(&canon, &eight, 0, &m, NULL, NULL);
  CHECK_STR_CONTAINS(src, "STRIDED with UNITS path, vec 8,");
  CHECK_STR_CONTAINS(src, "the last n % 8 elements"); /* symbolic rows */
  free(src);
  fm_pw_config cands[64];
  size_t n_c = fm_codegen_pointwise_candidates(&canon, cands, 64);
  CHECK_EQ_INT(cands[n_c - 1].vec, 8); /* the units timed beside the default */
  /* the config can ask for narrower (or scalar) access, never wider */
  CHECK_EQ_INT(unary_frag(FM_DT_BF16, 2, s2, NULL, 16), FM_OK);
  fm_pw_config c = {128, 1, 2, 8};
  src = gen(&canon, &c, 0, &m, NULL, NULL);
  CHECK_STR_CONTAINS(src, "FLAT path, vec 1,");
  CHECK_EQ_INT(m.items_per_block, 128 * 2);
  free(src);
  c.vec = 4;
  src = gen(&canon, &c, 0, &m, NULL, NULL);
  CHECK_STR_CONTAINS(src, "FLAT path, vec 4,");
  CHECK_EQ_INT(m.items_per_block, 128 * 4 * 2);
  free(src);
  c.vec = 16;
  src = gen(&canon, &c, 0, &m, NULL, NULL);
  CHECK_STR_CONTAINS(src, "FLAT path, vec 8,");
  free(src);
  /* a static n that VEC does not divide gets the tail; one it divides does not */
  CHECK(strstr(src = gen(&canon, NULL, 0, NULL, NULL, NULL), "the last n %") == NULL);
  free(src);
  int64_t s15[2] = {3, 5};
  CHECK_EQ_INT(unary_frag(FM_DT_BF16, 2, s15, NULL, 16), FM_OK);
  src = gen(&canon, NULL, 0, NULL, NULL, NULL);
  CHECK_STR_CONTAINS(src, "the last n % 8 elements");
  free(src);
}

static void test_bool_splat_and_coalescing(void) {
  char *src;
  /* all-bool: 16 elements per 16-byte access */
  int64_t s[2] = {-1, 256};
  tf_init(&raw);
  tf_input(&raw, 1, FM_DT_BOOL, 2, s, NULL, 16);
  tf_input(&raw, 2, FM_DT_BOOL, 2, s, NULL, 16);
  tf_op(&raw, FM_OP_NE, 3, 2, 1, 2, 0);
  tf_output(&raw, 3, FM_DT_BOOL, 2, s, NULL, 16);
  CHECK_EQ_INT(tf_finish(&raw, &canon), FM_OK);
  src = gen(&canon, NULL, 0, NULL, NULL, NULL);
  CHECK_STR_CONTAINS(src, "FLAT path, vec 16,");
  CHECK_STR_CONTAINS(src, "const bool v2 = (v0 != v1);"); /* bool vs bool compares as bool */
  free(src);
  /* a per-row scale [64, 1]: stride 0 along the vector, one load splatted over it */
  int64_t xs[2] = {64, 128}, cs[2] = {64, 1};
  tf_init(&raw);
  tf_input(&raw, 1, FM_DT_BF16, 2, xs, NULL, 16);
  tf_input(&raw, 2, FM_DT_F32, 2, cs, NULL, 4);
  tf_op(&raw, FM_OP_MUL, 3, 2, 1, 2, 0);
  tf_cast(&raw, 4, 3, FM_DT_BF16);
  tf_output(&raw, 4, FM_DT_BF16, 2, xs, NULL, 16);
  CHECK_EQ_INT(tf_finish(&raw, &canon), FM_OK);
  src = gen(&canon, NULL, 0, NULL, NULL, NULL);
  CHECK_STR_CONTAINS(src, "STRIDED path, vec 8,"); /* the f32 splat does not narrow it */
  CHECK_STR_CONTAINS(src, "r1[u] = in1[(c0)];");
  CHECK_STR_CONTAINS(src, "fm_compute(fm_get_u16(r0[u], e), r1[u], o0);");
  free(src);
  /* [2, 3, 4, 8] + bias [1, 1, 4, 8]: the two outer and the two inner dims coalesce */
  int64_t x4[4] = {2, 3, 4, 8}, b4[4] = {1, 1, 4, 8};
  tf_init(&raw);
  tf_input(&raw, 1, FM_DT_F32, 4, x4, NULL, 16);
  tf_input(&raw, 2, FM_DT_F32, 4, b4, NULL, 16);
  tf_op(&raw, FM_OP_SUB, 3, 2, 1, 2, 0);
  tf_output(&raw, 3, FM_DT_F32, 4, x4, NULL, 16);
  CHECK_EQ_INT(tf_finish(&raw, &canon), FM_OK);
  src = gen(&canon, NULL, 0, NULL, NULL, NULL);
  CHECK_STR_CONTAINS(src, "/* coalesced dims: [6, 32] */");
  /* the bias varies along the inner dim alone, and a block's 256 vectors of 4 cover whole rows
     of 32: a thread's column never changes, and the bias is loaded once, before the loop */
  CHECK_STR_CONTAINS(src, "const long long hc = ((long long)blockIdx.x * 512 + threadIdx.x) * 4 % 32LL;");
  CHECK_STR_CONTAINS(src, "const uint4 h1 = *reinterpret_cast<const uint4 *>(in1 + hc);");
  CHECK_STR_CONTAINS(src, "fm_compute(fm_get_f32(r0[u], e), fm_get_f32(h1, e), o0);");
  CHECK(strstr(src, "r1[u]") == NULL);
  free(src);
  /* rows of 96: 256 x 4 is no multiple, the column moves between steps: loaded in the loop */
  int64_t x96[4] = {2, 3, 4, 24}, b96[4] = {1, 1, 4, 24};
  tf_init(&raw);
  tf_input(&raw, 1, FM_DT_F32, 4, x96, NULL, 16);
  tf_input(&raw, 2, FM_DT_F32, 4, b96, NULL, 16);
  tf_op(&raw, FM_OP_SUB, 3, 2, 1, 2, 0);
  tf_output(&raw, 3, FM_DT_F32, 4, x96, NULL, 16);
  CHECK_EQ_INT(tf_finish(&raw, &canon), FM_OK);
  fm_pw_config c96 = {.block = 256, .vec = 4, .unroll = 2, .blocks_per_sm = 8};
  src = gen(&canon, &c96, 0, NULL, NULL, NULL);
  CHECK_STR_CONTAINS(src, "/* coalesced dims: [6, 96] */");
  CHECK_STR_CONTAINS(src, "r1[u] = *reinterpret_cast<const uint4 *>(in1 + (c1));");
  CHECK(strstr(src, "hc") == NULL);
  free(src);
}

static void test_rank0(void) {
  fm_kernel_meta m;
  tf_init(&raw);
  tf_input(&raw, 1, FM_DT_F32, 0, NULL, NULL, 4);
  tf_op(&raw, FM_OP_EXP, 2, 1, 1, 0, 0);
  tf_output(&raw, 2, FM_DT_F32, 0, NULL, NULL, 4);
  CHECK_EQ_INT(tf_finish(&raw, &canon), FM_OK);
  char *src = gen(&canon, NULL, 0, &m, NULL, NULL);
  CHECK(src != NULL);
  CHECK_STR_CONTAINS(src, "const long long n = 1LL;");
  CHECK_EQ_INT(m.outer, 1);
  CHECK_EQ_INT(m.inner, 1);
  free(src);
}

static void test_refusals(void) {
  int rc;
  fm_diag d = {{0}};
  /* a reserved (non-elementwise) op, built by hand since validation refuses it too */
  CHECK_EQ_INT(tf_representative(0, &canon), FM_OK);
  canon.ops[1].op = FM_OP_SOFTMAX;
  CHECK(gen(&canon, NULL, 0, NULL, &rc, &d) == NULL);
  CHECK_EQ_INT(rc, FM_EUNSUPPORTED);
  CHECK_STR_CONTAINS(d.text, "'softmax'");
  /* malformed structs are refused, not read out of bounds */
  CHECK_EQ_INT(tf_representative(0, &canon), FM_OK);
  canon.ops[0].args[1] = 4000;
  CHECK(gen(&canon, NULL, 0, NULL, &rc, &d) == NULL);
  CHECK_EQ_INT(rc, FM_EINVAL);
  CHECK_EQ_INT(tf_representative(0, &canon), FM_OK);
  canon.n_outputs = 0;
  CHECK(gen(&canon, NULL, 0, NULL, &rc, &d) == NULL);
  CHECK_EQ_INT(rc, FM_EINVAL);
  CHECK_EQ_INT(tf_representative(0, &canon), FM_OK);
  canon.inputs[0].shape[1] = 7; /* neither the iteration dim nor 1 */
  CHECK(gen(&canon, NULL, 0, NULL, &rc, &d) == NULL);
  CHECK_EQ_INT(rc, FM_EINVAL);
  /* bad configs */
  CHECK_EQ_INT(tf_representative(0, &canon), FM_OK);
  const fm_pw_config bad[] = {{100, 0, 1, 8}, {2048, 0, 1, 8}, {256, 3, 1, 8},
                              {256, 0, 0, 8}, {256, 0, 9, 8},  {256, 0, 1, 0}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    CHECK(gen(&canon, &bad[i], 0, NULL, &rc, &d) == NULL);
    CHECK_EQ_INT(rc, FM_EINVAL);
  }
}

static void test_default_and_candidates(void) {
  CHECK_EQ_INT(tf_representative(0, &canon), FM_OK);
  fm_pw_config def = fm_codegen_pointwise_default(&canon);
  CHECK_EQ_INT(def.block, 256);
  CHECK_EQ_INT(def.vec, 0);
  CHECK_EQ_INT(def.unroll, 4); /* flat bf16 */
  CHECK_EQ_INT(def.blocks_per_sm, 8);
  fm_pw_config c[64];
  size_t n = fm_codegen_pointwise_candidates(&canon, c, 64);
  CHECK_EQ_INT(n, 24);
  CHECK(memcmp(&c[0], &def, sizeof def) == 0); /* the default is tried first */
  for (size_t i = 0; i < n; i++) {
    CHECK(c[i].block * c[i].blocks_per_sm <= 2048);
    CHECK(c[i].unroll >= 1 && c[i].unroll <= 8);
    for (size_t j = 0; j < i; j++) CHECK(memcmp(&c[i], &c[j], sizeof c[i]) != 0);
  }
  CHECK_EQ_INT(fm_codegen_pointwise_candidates(&canon, c, 5), 5);
  CHECK_EQ_INT(fm_codegen_pointwise_candidates(&canon, c, 0), 0);
  CHECK_EQ_INT(tf_representative(2, &canon), FM_OK);
  CHECK_EQ_INT(fm_codegen_pointwise_default(&canon).unroll, 2); /* f32 */
  /* 32 bytes of f32 a vector: the default at 16 bytes of it is timed too, last */
  n = fm_codegen_pointwise_candidates(&canon, c, 64);
  CHECK_EQ_INT(n, 25);
  CHECK_EQ_INT(c[n - 1].vec, 4);
  CHECK_EQ_INT(c[n - 1].unroll, fm_codegen_pointwise_default(&canon).unroll);
}

/* Constants: "%.9g" of the fp32 value + "f", inf by bit pattern, never a bare integer. */
static void test_constants_and_pow(void) {
  static const double vals[] = {1.0, -0.0, 1e39, -1e39, 1e-10, 0.1, 3.4028235e38, 100.0};
  static const char *want[] = {"1.0f",
                               "(-0.0f)",
                               "(__int_as_float(0x7f800000))",
                               "(__int_as_float(0xff800000))",
                               "1.00000001e-10f",
                               "0.100000001f",
                               "3.40282347e+38f",
                               "100.0f"};
  int64_t s[1] = {1000};
  tf_init(&raw);
  tf_input(&raw, 1, FM_DT_F32, 1, s, NULL, 16);
  uint32_t prev = 1, id = 100;
  for (size_t i = 0; i < sizeof vals / sizeof vals[0]; i++) {
    tf_const(&raw, id, vals[i]);
    tf_op(&raw, FM_OP_ADD, id + 1, 2, prev, id, 0);
    prev = id + 1;
    id += 2;
  }
  static const double exps[] = {2.0, 0.5, -1.0, 2.7};
  for (size_t i = 0; i < sizeof exps / sizeof exps[0]; i++) {
    tf_const(&raw, id, exps[i]);
    tf_op(&raw, FM_OP_POW, id + 1, 2, prev, id, 0);
    prev = id + 1;
    id += 2;
  }
  tf_output(&raw, prev, FM_DT_F32, 1, s, NULL, 16);
  CHECK_EQ_INT(tf_finish(&raw, &canon), FM_OK);
  char *src = gen(&canon, NULL, 0, NULL, NULL, NULL);
  CHECK(src != NULL);
  if (!src) return;
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) CHECK_STR_CONTAINS(src, want[i]);
  const char *body = strstr(src, "void fm_compute(");
  CHECK_STR_CONTAINS(body, " = (v16 * v16);  /* pow */");
  CHECK_STR_CONTAINS(body, " = sqrtf(v18);  /* pow */");
  CHECK_STR_CONTAINS(body, " = (1.0f / v20);  /* pow */");
  CHECK_STR_CONTAINS(body, " = powf(v22, 2.70000005f);  /* pow */");
  /* an exponent is consumed at generation time: no variable holds it */
  CHECK(strstr(body, "= 2.70000005f;") == NULL);
  free(src);
}

int main(void) {
  RUN(test_meta_flat);
  RUN(test_meta_symbolic_and_multi);
  RUN(test_no_client_ids_in_source);
  RUN(test_vector_width_and_paths);
  RUN(test_bool_splat_and_coalescing);
  RUN(test_rank0);
  RUN(test_refusals);
  RUN(test_default_and_candidates);
  RUN(test_constants_and_pow);
  return FM_TEST_DONE();
}
