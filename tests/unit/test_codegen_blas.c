/* test_codegen_blas.c: cuBLASLt plans of GEMM fragments without a GPU: which epilogues
 * cuBLASLt runs by itself (the direct form: bias, C, relu / tanh GELU) and which need the
 * split form's epilogue kernel, the plan's operands, leading dims and sizes, its place in the
 * candidate list, its description, that its metadata survives the wire, and NVRTC compiles
 * of the split form's kernel for sm_80 and sm_90a. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fm_codegen.h"
#include "fm_nvrtc.h"
#include "fm_test.h"
#include "test_codegen_frag.h"

#define K 256

static fm_fragment raw, canon;

/* Layouts: b_row: W row-major [K, N] instead of nn.Linear's W.t(); x_ld and r_ld the row
 * strides of x and of the residual (-1: x dense, the residual N + 64; 0: one row expanded to
 * every row). */
typedef struct {
  int b_row;
  int64_t x_ld, r_ld;
} layout;
static const layout LINEAR = {0, -1, -1};

/* x [m, K] (m -1: symbolic, m_hint 4096) @ W.t() (B [K, N], strides [1, K]), bf16, then
 * epi, one step a letter: leading 'b' addmm with a bias [N] (rank 1) instead of mm; 'r' relu,
 * 't' gelu_tanh, 'g' gelu (erf), 'c' + a residual [m, N], 'f' cast to f32, 'p' the product
 * itself as a second output. Inputs x, W, bias, residual in that order; outputs [m, N] with
 * row stride N + 32. */
static int build_ex(int64_t m, int64_t n, const char *epi, layout l) {
  int64_t xs[2] = {m, K}, xst[2] = {l.x_ld < 0 ? K : l.x_ld, 1}, ws[2] = {K, n};
  int64_t wst[2] = {l.b_row ? n : 1, l.b_row ? 1 : K}, bs[1] = {n}, os[2] = {m, n};
  int64_t rst[2] = {l.r_ld < 0 ? n + 64 : l.r_ld, 1}, ost[2] = {n + 32, 1};
  int bias = epi[0] == 'b', pre = strchr(epi, 'p') != NULL;
  fm_dtype odt = strchr(epi, 'f') ? FM_DT_F32 : FM_DT_BF16;
  uint32_t cur = 10, id = 10;
  tf_init(&raw);
  raw.m_hint = m < 0 ? 4096 : 0;
  tf_input(&raw, 1, FM_DT_BF16, 2, xs, xst, 16);
  tf_input(&raw, 2, FM_DT_BF16, 2, ws, wst, 16);
  if (bias) tf_input(&raw, 3, FM_DT_BF16, 1, bs, NULL, 16);
  if (strchr(epi, 'c')) tf_input(&raw, 4, FM_DT_BF16, 2, os, rst, 16);
  if (bias)
    tf_op(&raw, FM_OP_ADDMM, id, 3, 3, 1, 2);
  else
    tf_op(&raw, FM_OP_MM, id, 2, 1, 2, 0);
  for (const char *s = epi + bias; *s; s++) {
    switch (*s) {
      case 'r':
        tf_op(&raw, FM_OP_RELU, ++id, 1, cur, 0, 0);
        break;
      case 't':
        tf_op(&raw, FM_OP_GELU_TANH, ++id, 1, cur, 0, 0);
        break;
      case 'g':
        tf_op(&raw, FM_OP_GELU, ++id, 1, cur, 0, 0);
        break;
      case 'c':
        tf_op(&raw, FM_OP_ADD, ++id, 2, cur, 4, 0);
        break;
      case 'f':
        tf_cast(&raw, ++id, cur, FM_DT_F32);
        break;
      default:
        continue;
    }
    cur = id;
  }
  tf_output(&raw, cur, odt, 2, os, ost, 16);
  if (pre) tf_output(&raw, 10, FM_DT_BF16, 2, os, ost, 16);
  return tf_finish(&raw, &canon);
}

static int build(int64_t m, int64_t n, const char *epi) { return build_ex(m, n, epi, LINEAR); }

/* The one cuBLASLt candidate's form, checked against where the generic list puts it. */
static uint32_t blas_form(void) {
  fm_candidate c[64], b;
  size_t n = fm_codegen_candidates(&canon, c, 64);
  int seen = 0;
  CHECK_EQ_INT((int)fm_codegen_blas_candidates(&canon, &b, 1), 1);
  CHECK(n >= 2);
  for (size_t i = 0; i < n; i++) seen += c[i].tmpl == FM_TMPL_CUBLASLT;
  CHECK_EQ_INT(seen, 1);
  CHECK_EQ_INT(c[1].tmpl, FM_TMPL_CUBLASLT); /* right after the default */
  CHECK(memcmp(&c[1], &b, sizeof b) == 0);
  return b.p[0];
}

/* fm_codegen_blas for form; FM_OK and the direct form: no source. */
static int gen(uint32_t form, char **src, fm_kernel_meta *meta) {
  fm_diag d = {{0}};
  *src = (char *)"not cleared";
  int rc = fm_codegen_blas(&canon, form, 132, src, meta, &d);
  if (rc && rc != FM_EUNSUPPORTED) fprintf(stderr, "  fm_codegen_blas: %s\n", d.text);
  if (rc || form == FM_BLAS_DIRECT) CHECK(*src == NULL);
  return rc;
}

/* mm alone: a direct plan of the operands with nothing else; no kernel, no algorithm yet. */
static void test_direct_mm(void) {
  fm_kernel_meta m;
  char *src;
  CHECK_EQ_INT(build(-1, 512, ""), FM_OK);
  CHECK_EQ_INT(blas_form(), FM_BLAS_DIRECT);
  CHECK_EQ_INT(gen(FM_BLAS_DIRECT, &src, &m), FM_OK);
  const fm_meta_blas *b = &m.blas;
  CHECK(strcmp(m.kind, "cublaslt") == 0 && strcmp(m.grid_rule, "none") == 0 && m.entry[0] == '\0');
  CHECK(m.outer == -1 && m.n_inputs == 2 && m.n_outputs == 1 && m.n_tmaps == 0);
  CHECK(strcmp(b->form, "direct") == 0 && strcmp(b->dtype, "bf16") == 0 && strcmp(b->act, "none") == 0);
  CHECK(b->a == 0 && b->b == 1 && b->bias == -1 && b->c == -1 && b->out == 0 && b->has_algo == 0);
  CHECK(b->a_kmajor == 1 && b->b_kmajor == 1 && b->lda == K && b->ldb == K);
  CHECK_EQ_INT(b->ldd, 512 + 32);
  CHECK(b->m == -1 && b->n == 512 && b->k == K && b->workspace == FM_BLAS_WORKSPACE);
  CHECK(b->align[0] == 16 && b->align[1] == 16 && b->align[3] == 16);
  CHECK_EQ_INT(fm_meta_grid_x(&m, 4096), 0);
  CHECK_EQ_INT(fm_meta_scratch_bytes(&m, 4096), FM_BLAS_WORKSPACE);
  /* a static M; W row-major (N contiguous: B is not K-major, its leading dim N) */
  CHECK_EQ_INT(build_ex(300, 512, "", (layout){1, -1, -1}), FM_OK);
  CHECK_EQ_INT(blas_form(), FM_BLAS_DIRECT);
  CHECK_EQ_INT(gen(FM_BLAS_DIRECT, &src, &m), FM_OK);
  CHECK(m.outer == 300 && b->m == 300 && b->a_kmajor == 1 && b->b_kmajor == 0 && b->ldb == 512);
  /* one row: x's row stride is never stepped (canonically 0); cuBLASLt still gets K */
  CHECK_EQ_INT(build(1, 512, ""), FM_OK);
  CHECK_EQ_INT(gen(FM_BLAS_DIRECT, &src, &m), FM_OK);
  CHECK(b->m == 1 && b->lda == K);
}

/* Epilogues cuBLASLt runs itself: a [N] bias (BIAS epilogue), an [M, N] addend (C, beta 1),
 * then relu or tanh GELU. */
static void test_direct_epilogues(void) {
  static const struct {
    const char *epi, *act;
    int bias, c;
  } cases[] = {
      {"b", "none", 2, -1}, {"br", "relu", 2, -1}, {"bt", "gelu_tanh", 2, -1},
      {"c", "none", -1, 2}, {"bcr", "relu", 2, 3}, {"ct", "gelu_tanh", -1, 2},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    fm_kernel_meta m;
    char *src;
    for (int sym = 0; sym < 2; sym++) {
      CHECK_EQ_INT(build(sym ? -1 : 4096, 512, cases[i].epi), FM_OK);
      CHECK_EQ_INT(blas_form(), FM_BLAS_DIRECT);
      CHECK_EQ_INT(gen(FM_BLAS_DIRECT, &src, &m), FM_OK);
      if (strcmp(m.blas.act, cases[i].act) != 0 || m.blas.bias != cases[i].bias || m.blas.c != cases[i].c)
        fprintf(stderr, "  %s: act %s bias %d c %d\n", cases[i].epi, m.blas.act, m.blas.bias, m.blas.c);
      CHECK(strcmp(m.blas.act, cases[i].act) == 0);
      CHECK_EQ_INT(m.blas.bias, cases[i].bias);
      CHECK_EQ_INT(m.blas.c, cases[i].c);
      CHECK_EQ_INT(m.blas.m, sym ? -1 : 4096);
      if (cases[i].c >= 0) CHECK_EQ_INT(m.blas.ldc, 512 + 64);
      CHECK_EQ_INT(m.blas.ldd, 512 + 32);
      CHECK_EQ_INT(m.n_inputs, 2 + (cases[i].bias >= 0) + (cases[i].c >= 0));
    }
  }
  /* a bias aligned below the 16 bytes the plan promises cuBLASLt: the split form runs it */
  fm_kernel_meta m;
  char *src;
  CHECK_EQ_INT(build(-1, 512, "b"), FM_OK);
  canon.inputs[2].align = 4;
  CHECK_EQ_INT(blas_form(), FM_BLAS_SPLIT);
  CHECK_EQ_INT(gen(FM_BLAS_DIRECT, &src, &m), FM_EUNSUPPORTED);
}

static int n_compiled;

/* src compiles for sm_80 and sm_90a (each where this NVRTC has it). */
static void compiles(const char *src, const char *name) {
  static const char *const archs[] = {"sm_80", "sm_90a"};
  for (int a = 0; a < 2; a++) {
    if (!fm_nvrtc_arch_supported(archs[a])) continue;
    uint8_t *cubin = NULL;
    size_t len = 0;
    char *log = NULL;
    int rc = fm_nvrtc_compile(src, name, archs[a], &cubin, &len, &log);
    CHECK_EQ_INT(rc, FM_OK);
    CHECK(rc || len > 0);
    n_compiled += !rc;
    if (rc) fprintf(stderr, "  %s %s:\n%s\n", name, archs[a], log ? log : "");
    free(cubin);
    free(log);
  }
}

/* Epilogues cuBLASLt cannot run: erf GELU, an activation before the add (cuBLASLt adds C
 * first), an output in another dtype. The direct form is refused; the split form is an
 * elementwise kernel over [M, ceil(N / 8)] that reads the product from the scratch. */
static void test_split(void) {
  static const struct {
    int64_t m, n;
    const char *epi;
    uint32_t outs;
  } cases[] = {
      {-1, 512, "bg", 1}, {300, 100, "bg", 1}, {-1, 512, "bgp", 2}, {64, 512, "rc", 1}, {-1, 512, "bf", 1},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    fm_kernel_meta m;
    char *src, name[32], def[16];
    fm_diag d = {{0}};
    CHECK_EQ_INT(build(cases[i].m, cases[i].n, cases[i].epi), FM_OK);
    CHECK_EQ_INT(blas_form(), FM_BLAS_SPLIT);
    CHECK_EQ_INT(fm_codegen_blas(&canon, FM_BLAS_DIRECT, 132, &src, &m, &d), FM_EUNSUPPORTED);
    CHECK_STR_CONTAINS(d.text, "cannot run this epilogue");
    CHECK_EQ_INT(gen(FM_BLAS_SPLIT, &src, &m), FM_OK);
    CHECK(src != NULL);
    if (!src) continue;
    const fm_meta_blas *b = &m.blas;
    CHECK(strcmp(m.kind, "cublaslt") == 0 && strcmp(m.entry, "fm_blas_epi") == 0);
    CHECK(strcmp(m.grid_rule, "elementwise") == 0 && strcmp(b->form, "split") == 0);
    CHECK_EQ_INT(m.inner, (cases[i].n + 7) / 8);
    CHECK(m.block[0] == 256 && m.items_per_block == 256 && m.max_blocks == 132 * 8);
    CHECK(m.n_inputs == canon.n_inputs && m.n_outputs == cases[i].outs && m.outer == cases[i].m);
    /* the product, not the output, is cuBLASLt's D: [M, N] dense in the scratch */
    CHECK(b->bias == -1 && b->c == -1 && strcmp(b->act, "none") == 0 && b->ldd == (uint64_t)cases[i].n);
    CHECK(b->m == cases[i].m && b->n == (uint64_t)cases[i].n && b->lda == K && b->ldb == K);
    CHECK_STR_CONTAINS(src, "fm_blas_epi(");
    CHECK_STR_CONTAINS(src, "fm_scratch");
    snprintf(def, sizeof def, "#define FM_N %d\n", (int)cases[i].n);
    CHECK_STR_CONTAINS(src, def);
    CHECK(strstr(src, "#include") == NULL);
    snprintf(name, sizeof name, "blas_split_%s_%d.cu", cases[i].epi, (int)cases[i].n);
    compiles(src, name);
    free(src);
  }
  printf("  %d compiles\n", n_compiled);
  /* any GEMM fragment has the split form, and the grid cap follows the SM count */
  fm_kernel_meta m;
  char *src = NULL;
  fm_diag d = {{0}};
  CHECK_EQ_INT(build(-1, 512, "br"), FM_OK);
  CHECK_EQ_INT(fm_codegen_blas(&canon, FM_BLAS_SPLIT, 100, &src, &m, &d), FM_OK);
  CHECK(src && m.max_blocks == 800 && strcmp(m.blas.act, "none") == 0);
  free(src);
  CHECK_EQ_INT(fm_codegen_blas(&canon, FM_BLAS_SPLIT, 0, &src, &m, &d), FM_OK);
  CHECK_EQ_INT(m.max_blocks, 132 * 8);
  free(src);
  CHECK_EQ_INT(fm_codegen_blas(&canon, 3, 132, &src, &m, &d), FM_EINVAL);
  CHECK(src == NULL);
}

/* What cuBLASLt reads from memory must be what the fragment's tensors hold: a residual that
 * is one row expanded to every row (row stride 0) is a bias, not an [M, N] C; one whose rows
 * overlap (stride below N) is no C cuBLASLt takes; an operand expanded along M is no matrix
 * cuBLASLt takes (the gemm template still serves all of them). */
static void test_broadcast_layouts(void) {
  fm_kernel_meta m;
  fm_candidate c;
  char *src;
  for (int sym = 0; sym < 2; sym++) {
    CHECK_EQ_INT(build_ex(sym ? -1 : 64, 512, "cr", (layout){0, -1, 0}), FM_OK);
    CHECK_EQ_INT(blas_form(), FM_BLAS_DIRECT);
    CHECK_EQ_INT(gen(FM_BLAS_DIRECT, &src, &m), FM_OK);
    CHECK_EQ_INT(m.blas.bias, 2);
    CHECK_EQ_INT(m.blas.c, -1);
  }
  CHECK_EQ_INT(build_ex(64, 512, "c", (layout){0, -1, 8}), FM_OK);
  CHECK_EQ_INT(blas_form(), FM_BLAS_SPLIT);
  for (int64_t x_ld = 0; x_ld <= 8; x_ld += 8) { /* x expanded; x's rows overlapping */
    fm_diag d = {{0}};
    CHECK_EQ_INT(build_ex(64, 512, "b", (layout){0, x_ld, -1}), FM_OK);
    CHECK_EQ_INT(fm_codegen_default(&canon, &c, NULL), FM_OK);
    CHECK_EQ_INT((int)fm_codegen_blas_candidates(&canon, &c, 1), 0);
    CHECK_EQ_INT(fm_codegen_blas(&canon, FM_BLAS_SPLIT, 132, &src, &m, &d), FM_EUNSUPPORTED);
    CHECK_STR_CONTAINS(d.text, "cuBLASLt: an operand");
    CHECK(src == NULL);
    free(src);
  }
}

static void test_describe(void) {
  fm_candidate c;
  char desc[96];
  memset(&c, 0, sizeof c);
  c.tmpl = FM_TMPL_CUBLASLT;
  c.p[0] = FM_BLAS_DIRECT;
  fm_candidate_describe(&c, desc, sizeof desc);
  CHECK(strcmp(desc, "cublaslt direct") == 0);
  c.p[0] = FM_BLAS_SPLIT;
  fm_candidate_describe(&c, desc, sizeof desc);
  CHECK(strcmp(desc, "cublaslt split epilogue") == 0);
  CHECK(fm_candidate_runs_on(&c, "sm_80") && fm_candidate_runs_on(&c, "sm_90a"));
  CHECK(strcmp(fm_template_name(FM_TMPL_CUBLASLT), "cublaslt") == 0);
}

/* No plan where there is no product, or one the gemm plan refuses (x's leading dim 260 is
 * no multiple of 8). */
static void test_no_plan(void) {
  fm_diag d = {{0}};
  char *src = NULL;
  fm_candidate c[64];
  fm_kernel_meta m;
  CHECK_EQ_INT(tf_representative(1, &canon), FM_OK);
  CHECK_EQ_INT((int)fm_codegen_blas_candidates(&canon, c, 1), 0);
  size_t n = fm_codegen_candidates(&canon, c, 64);
  CHECK(n > 1);
  for (size_t i = 0; i < n; i++) CHECK(c[i].tmpl != FM_TMPL_CUBLASLT);
  CHECK_EQ_INT(fm_codegen_blas(&canon, FM_BLAS_SPLIT, 132, &src, &m, &d), FM_EUNSUPPORTED);
  CHECK_STR_CONTAINS(d.text, "not a GEMM fragment");
  CHECK(src == NULL);
  /* a leading dim the generated templates refuse (260: not 8-element chunks): the plan takes it */
  CHECK_EQ_INT(build_ex(64, 512, "b", (layout){0, 260, -1}), FM_OK);
  CHECK_EQ_INT((int)fm_codegen_blas_candidates(&canon, c, 1), 1);
  CHECK_EQ_INT(fm_codegen_blas(&canon, FM_BLAS_DIRECT, 132, &src, &m, &d), FM_OK);
  CHECK_EQ_INT((int)m.blas.lda, 260);
  CHECK_EQ_INT(fm_codegen_default(&canon, &c[0], &d), FM_OK);
  CHECK_EQ_INT(c[0].tmpl, FM_TMPL_CUBLASLT);
  CHECK_EQ_INT(build(64, 512, "b"), FM_OK);
  CHECK_EQ_INT((int)fm_codegen_blas_candidates(&canon, c, 0), 0); /* no room */
}

/* Both forms' metadata packs and unpacks to the same plan (the fields that reach cuBLASLt). */
static void test_meta_round_trip(void) {
  static const char *const epis[] = {"bcr", "bgp", ""};
  for (int i = 0; i < 3; i++) {
    fm_kernel_meta m, back;
    char *src;
    fm_diag d = {{0}};
    CHECK_EQ_INT(build(i == 2 ? 1000 : -1, 512, epis[i]), FM_OK);
    CHECK_EQ_INT(gen(i == 1 ? FM_BLAS_SPLIT : FM_BLAS_DIRECT, &src, &m), FM_OK);
    free(src);
    msgpack_sbuffer sb;
    msgpack_packer pk;
    msgpack_unpacked u;
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_unpacked_init(&u);
    CHECK_EQ_INT(fm_meta_pack(&m, &pk), FM_OK);
    CHECK(msgpack_unpack_next(&u, sb.data, sb.size, NULL) == MSGPACK_UNPACK_SUCCESS);
    int rc = fm_meta_unpack(&u.data, &back, &d);
    if (rc) fprintf(stderr, "  %s: %s\n", epis[i], d.text);
    CHECK_EQ_INT(rc, FM_OK);
    CHECK(strcmp(back.kind, m.kind) == 0 && strcmp(back.entry, m.entry) == 0);
    CHECK(strcmp(back.grid_rule, m.grid_rule) == 0 && back.outer == m.outer);
    CHECK(back.n_inputs == m.n_inputs && back.n_outputs == m.n_outputs);
    /* both zero-filled before their fields were written: byte for byte the same */
    CHECK(memcmp(&back.blas, &m.blas, sizeof m.blas) == 0);
    CHECK_EQ_INT(fm_meta_scratch_bytes(&back, 77), fm_meta_scratch_bytes(&m, 77));
    msgpack_unpacked_destroy(&u);
    msgpack_sbuffer_destroy(&sb);
  }
}

int main(void) {
  RUN(test_direct_mm);
  RUN(test_direct_epilogues);
  RUN(test_split);
  RUN(test_broadcast_layouts);
  RUN(test_describe);
  RUN(test_no_plan);
  RUN(test_meta_round_trip);
  return FM_TEST_DONE();
}
