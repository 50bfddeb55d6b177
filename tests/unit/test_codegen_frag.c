/* test_codegen_frag.c: fragment builders for the codegen tests (see the header). */
#include "test_codegen_frag.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fm_codegen.h"
#include "fm_codegen_gemm.h"
#include "fm_meta.h"
#include "fm_nvrtc.h"

void tf_init(fm_fragment *f) {
  memset(f, 0, sizeof *f);
  f->vocab = FM_VOCAB_VERSION;
}

void tf_contiguous(uint32_t rank, const int64_t *shape, int64_t *strides) {
  int64_t s = 1;
  for (uint32_t j = rank; j-- > 0;) {
    strides[j] = s;
    if (shape[j] > 0) s *= shape[j];
  }
}

static void fill(fm_tensor *t, uint32_t id, fm_dtype dt, uint32_t rank, const int64_t *shape, const int64_t *strides,
                 uint32_t align) {
  memset(t, 0, sizeof *t);
  t->id = id;
  t->dtype = dt;
  t->rank = rank;
  for (uint32_t j = 0; j < rank; j++) t->shape[j] = shape[j];
  if (strides) {
    for (uint32_t j = 0; j < rank; j++) t->strides[j] = strides[j];
  } else {
    tf_contiguous(rank, shape, t->strides);
  }
  t->align = align;
}

void tf_input(fm_fragment *f, uint32_t id, fm_dtype dt, uint32_t rank, const int64_t *shape, const int64_t *strides,
              uint32_t align) {
  fill(&f->inputs[f->n_inputs++], id, dt, rank, shape, strides, align);
}

void tf_output(fm_fragment *f, uint32_t id, fm_dtype dt, uint32_t rank, const int64_t *shape, const int64_t *strides,
               uint32_t align) {
  fill(&f->outputs[f->n_outputs++], id, dt, rank, shape, strides, align);
}

void tf_op(fm_fragment *f, fm_op op, uint32_t out, uint32_t nargs, uint32_t a0, uint32_t a1, uint32_t a2) {
  fm_opnode *n = &f->ops[f->n_ops++];
  memset(n, 0, sizeof *n);
  n->op = op;
  n->out = out;
  n->nargs = nargs;
  n->args[0] = a0;
  n->args[1] = a1;
  n->args[2] = a2;
}

void tf_const(fm_fragment *f, uint32_t out, double value) {
  tf_op(f, FM_OP_CONST, out, 0, 0, 0, 0);
  f->ops[f->n_ops - 1].value = value;
}

void tf_cast(fm_fragment *f, uint32_t out, uint32_t arg, fm_dtype to) {
  tf_op(f, FM_OP_CAST, out, 1, arg, 0, 0);
  f->ops[f->n_ops - 1].dtype = to;
}

void tf_iota(fm_fragment *f, uint32_t out, fm_dtype dt) {
  tf_op(f, FM_OP_IOTA, out, 0, 0, 0, 0);
  f->ops[f->n_ops - 1].dtype = dt;
}

int tf_finish(fm_fragment *f, fm_fragment *canon) {
  fm_diag d = {{0}};
  int rc = fm_fragment_validate(f, &d);
  if (rc) {
    fprintf(stderr, "  tf_finish: validate: %s: %s\n", fm_strerror(rc), d.text);
    return rc;
  }
  rc = fm_fragment_canonicalize(f, canon);
  if (rc) fprintf(stderr, "  tf_finish: canonicalize: %s\n", fm_strerror(rc));
  return rc;
}

const char *const tf_representative_name[TF_N_REPRESENTATIVE] = {"pw_flat_bf16_gelu", "pw_strided_bias_symbolic",
                                                                 "pw_multi_where_cast", "pw_units_odd_rows"};

int tf_representative(int which, fm_fragment *canon) {
  static fm_fragment f; /* large: keep it off the stack */
  tf_init(&f);
  switch (which) {
    case 0: {
      int64_t xs[2] = {4096, 1024}, bs[2] = {1, 1}, bst[2] = {0, 0};
      tf_input(&f, 10, FM_DT_BF16, 2, xs, NULL, 16);
      tf_input(&f, 11, FM_DT_BF16, 2, bs, bst, 2);
      tf_op(&f, FM_OP_ADD, 12, 2, 10, 11, 0);
      tf_op(&f, FM_OP_GELU, 13, 1, 12, 0, 0);
      tf_const(&f, 14, 0.5);
      tf_op(&f, FM_OP_MUL, 15, 2, 13, 14, 0);
      tf_output(&f, 15, FM_DT_BF16, 2, xs, NULL, 16);
      break;
    }
    case 1: {
      int64_t xs[2] = {-1, 768}, xst[2] = {1024, 1}, bs[2] = {1, 768};
      tf_input(&f, 1, FM_DT_BF16, 2, xs, xst, 16);
      tf_input(&f, 2, FM_DT_BF16, 2, bs, NULL, 16);
      tf_op(&f, FM_OP_ADD, 3, 2, 1, 2, 0);
      tf_op(&f, FM_OP_SILU, 4, 1, 3, 0, 0);
      tf_output(&f, 4, FM_DT_BF16, 2, xs, (int64_t[]){768, 1}, 16);
      break;
    }
    case 2: {
      int64_t xs[2] = {64, 128};
      tf_input(&f, 1, FM_DT_F32, 2, xs, NULL, 16);
      tf_const(&f, 2, 0.0);
      tf_op(&f, FM_OP_GT, 3, 2, 1, 2, 0);
      tf_const(&f, 4, 0.01);
      tf_op(&f, FM_OP_MUL, 5, 2, 1, 4, 0);
      tf_op(&f, FM_OP_WHERE, 6, 3, 3, 1, 5);
      tf_cast(&f, 7, 6, FM_DT_BF16);
      tf_output(&f, 6, FM_DT_F32, 2, xs, NULL, 16);
      tf_output(&f, 7, FM_DT_BF16, 2, xs, NULL, 16);
      tf_output(&f, 3, FM_DT_BOOL, 2, xs, NULL, 16);
      break;
    }
    case 3: { /* cross-entropy's backward at GPT-2's odd vocabulary: the logits read at their
                 padded row stride, the per-row log-sum-exp broadcast, the gradient contiguous */
      int64_t xs[2] = {-1, 50257}, xst[2] = {50304, 1}, ls[2] = {-1, 1};
      tf_input(&f, 1, FM_DT_BF16, 2, xs, xst, 16);
      tf_input(&f, 2, FM_DT_F32, 2, ls, NULL, 4);
      tf_cast(&f, 3, 1, FM_DT_F32);
      tf_op(&f, FM_OP_SUB, 4, 2, 3, 2, 0);
      tf_op(&f, FM_OP_EXP, 5, 1, 4, 0, 0);
      tf_cast(&f, 6, 5, FM_DT_BF16);
      tf_output(&f, 6, FM_DT_BF16, 2, xs, NULL, 16);
      break;
    }
    default:
      return FM_EINVAL;
  }
  return tf_finish(&f, canon);
}

/* every: each candidate for sm_80 too (where it runs there), not only the default. */
static int compile_candidates(const fm_fragment *canon, const char *name, int every, int *compiled) {
  fm_candidate c[64];
  int failures = 0, ok = 0, kernels = 0;
  size_t n = fm_codegen_candidates(canon, c, sizeof c / sizeof c[0]);
  for (size_t i = 0; i < n; i++) {
    char *src = NULL;
    fm_kernel_meta m;
    fm_diag d = {{0}};
    if (fm_codegen_generate(canon, &c[i], 132, &src, &m, &d)) {
      fprintf(stderr, "  %s candidate %zu: %s\n", name, i, d.text);
      failures++;
      continue;
    }
    if (!src) continue; /* a direct cuBLASLt plan: nothing to compile */
    kernels++;
    for (int a = 0; a < 2; a++) {
      const char *arch = a ? "sm_80" : "sm_90a";
      if ((a && i > 0 && !every) || !fm_nvrtc_arch_supported(arch) || !fm_candidate_runs_on(&c[i], arch)) continue;
      uint8_t *cubin = NULL;
      size_t len = 0;
      char *log = NULL;
      if (fm_nvrtc_compile(src, name, arch, &cubin, &len, &log)) {
        fprintf(stderr, "  %s candidate %zu %s:\n%s\n", name, i, arch, log ? log : "");
        failures++;
      } else {
        ok++;
      }
      free(cubin);
      free(log);
    }
    free(src);
  }
  printf("  %d compiles of %d kernels\n", ok, kernels);
  if (compiled) *compiled = ok;
  return failures;
}

int tf_compile_candidates(const fm_fragment *canon, const char *name, int *compiled) {
  return compile_candidates(canon, name, 0, compiled);
}

int tf_compile_every(const fm_fragment *canon, const char *name, int *compiled) {
  return compile_candidates(canon, name, 1, compiled);
}

int tf_rejects(fm_fragment *f, int rc_want, const char *why) {
  fm_diag d = {{0}};
  int rc = fm_fragment_validate(f, &d);
  if (rc == rc_want && strstr(d.text, why)) return 1;
  fprintf(stderr, "  got %d \"%s\", want %d \"%s\"\n", rc, d.text, rc_want, why);
  return 0;
}

static char *read_text(const char *path) {
  FILE *f = fopen(path, "rb");
  char *buf = NULL;
  long n;
  if (!f) return NULL;
  if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0 &&
      (buf = malloc((size_t)n + 1)) != NULL) {
    if (fread(buf, 1, (size_t)n, f) == (size_t)n) {
      buf[n] = '\0';
    } else {
      free(buf);
      buf = NULL;
    }
  }
  fclose(f);
  return buf;
}

int tf_golden(const char *name, const char *src) {
  char file[256];
  snprintf(file, sizeof file, "%s.cu", name);
  return tf_golden_file(file, src);
}

int tf_golden_file(const char *file, const char *src) {
  const char *root = getenv("FM_SOURCE_DIR");
#ifdef FM_CG_SOURCE_DIR
  if (!root) root = FM_CG_SOURCE_DIR; /* run by hand, outside ctest */
#endif
  const char *update = getenv("FM_UPDATE_GOLDEN");
  char path[1024];
  if (!root || !src) return 0;
  snprintf(path, sizeof path, "%s/tests/unit/golden/%s", root, file);
  if (update && strcmp(update, "1") == 0) {
    FILE *f = fopen(path, "wb");
    int ok = f && fwrite(src, 1, strlen(src), f) == strlen(src);
    if (f && fclose(f) != 0) ok = 0;
    if (ok) printf("  updated %s\n", path);
    return ok;
  }
  char *want = read_text(path);
  if (!want) {
    fprintf(stderr, "  cannot read %s (FM_UPDATE_GOLDEN=1 creates it)\n", path);
    return 0;
  }
  int line = 1, same = strcmp(want, src) == 0;
  if (!same) {
    const char *w = want, *g = src;
    for (; *w && *w == *g; w++, g++)
      if (*w == '\n') line++;
    const char *we = strchr(w, '\n'), *ge = strchr(g, '\n');
    fprintf(stderr, "  %s differs at line %d:\n    want: %.*s\n    got:  %.*s\n", path, line,
            (int)(we ? we - w : (long)strlen(w)), w, (int)(ge ? ge - g : (long)strlen(g)), g);
  }
  free(want);
  return same;
}

int tf_mlp_chain(fm_fragment *raw, fm_fragment *canon, int64_t k1, int64_t n1, int64_t n2) {
  int64_t x[2] = {-1, k1}, w1[2] = {k1, n1}, w1s[2] = {1, k1}, b1[1] = {n1};
  int64_t w2[2] = {n1, n2}, w2s[2] = {1, n1}, b2[1] = {n2}, o[2] = {-1, n2};
  tf_init(raw);
  tf_input(raw, 1, FM_DT_BF16, 2, x, NULL, 16);
  tf_input(raw, 2, FM_DT_BF16, 2, w1, w1s, 16);
  tf_input(raw, 3, FM_DT_BF16, 1, b1, NULL, 16);
  tf_input(raw, 4, FM_DT_BF16, 2, w2, w2s, 16);
  tf_input(raw, 5, FM_DT_BF16, 1, b2, NULL, 16);
  tf_input(raw, 6, FM_DT_BF16, 2, o, NULL, 16);
  tf_op(raw, FM_OP_ADDMM, 7, 3, 3, 1, 2);
  tf_op(raw, FM_OP_GELU, 8, 1, 7, 0, 0);
  tf_op(raw, FM_OP_ADDMM, 9, 3, 5, 8, 4);
  tf_op(raw, FM_OP_ADD, 10, 2, 9, 6, 0);
  tf_output(raw, 10, FM_DT_BF16, 2, o, NULL, 16);
  raw->m_hint = 16384;
  return tf_finish(raw, canon);
}

/* [n, c, h, w] channels-last: c fastest, then w, then h (a symbolic n is still outermost). */
static void nhwc_strides(const int64_t *s, int64_t *st) {
  st[1] = 1;
  st[3] = s[1];
  st[2] = s[3] * s[1];
  st[0] = s[2] * s[3] * s[1];
}

int tf_max_pool(fm_fragment *raw, fm_fragment *canon, fm_dtype dt, const int64_t nchw[4], const int32_t window[8],
                int ceil_mode, int channels_last, int pass) {
  int64_t pooled[4] = {nchw[0], nchw[1], fm_window_pooled(nchw[2], window, 0, ceil_mode),
                       fm_window_pooled(nchw[3], window, 1, ceil_mode)};
  int64_t xs[4], ps[4];
  nhwc_strides(nchw, xs);
  nhwc_strides(pooled, ps);
  const int64_t *pst = channels_last ? ps : NULL, *xst = channels_last ? xs : NULL;
  tf_init(raw);
  raw->vocab = FM_VOCAB_WINDOW;
  if (pass == TF_POOL_BACKWARD) {
    tf_input(raw, 1, dt, 4, pooled, pst, 16);        /* gy */
    tf_input(raw, 3, FM_DT_F16, 4, pooled, pst, 16); /* the argmax's tap indices */
    tf_op(raw, FM_OP_MAX_POOL2D_BACKWARD, 2, 2, 1, 3, 0);
  } else {
    tf_input(raw, 0, dt, 4, nchw, xst, 16);
    tf_op(raw, FM_OP_MAX_POOL2D, 2, 1, 0, 0, 0);
  }
  for (uint32_t k = 0; k < raw->n_ops; k++) {
    memcpy(raw->ops[k].window, window, sizeof raw->ops[k].window);
    raw->ops[k].ceil_mode = (uint8_t)ceil_mode;
  }
  tf_output(raw, 2, dt, 4, pass == TF_POOL_BACKWARD ? nchw : pooled, pass == TF_POOL_BACKWARD ? xst : pst, 16);
  if (pass == TF_POOL_ARGMAX) { /* the tap indices too, stored as f16 */
    tf_op(raw, FM_OP_MAX_POOL2D_ARGMAX, 4, 1, 0, 0, 0);
    memcpy(raw->ops[raw->n_ops - 1].window, window, sizeof raw->ops[0].window);
    raw->ops[raw->n_ops - 1].ceil_mode = (uint8_t)ceil_mode;
    tf_cast(raw, 5, 4, FM_DT_F16);
    tf_output(raw, 5, FM_DT_F16, 4, pooled, pst, 16);
  }
  return tf_finish(raw, canon);
}

int tf_attention_scores(fm_fragment *raw, fm_fragment *canon) {
  int64_t q[3] = {-1, 128, 64}, k[3] = {-1, 64, 128}, kst[3] = {8192, 1, 64}, mask[2] = {128, 128},
          o[3] = {-1, 128, 128};
  tf_init(raw);
  tf_input(raw, 1, FM_DT_BF16, 3, q, NULL, 16);
  tf_input(raw, 2, FM_DT_BF16, 3, k, kst, 16);
  tf_input(raw, 3, FM_DT_BF16, 2, mask, NULL, 16);
  tf_op(raw, FM_OP_BMM, 4, 2, 1, 2, 0);
  tf_const(raw, 5, 0.125);
  tf_op(raw, FM_OP_MUL, 6, 2, 4, 5, 0);
  tf_op(raw, FM_OP_ADD, 7, 2, 6, 3, 0);
  tf_output(raw, 7, FM_DT_BF16, 3, o, NULL, 16);
  raw->m_hint = 48;
  return tf_finish(raw, canon);
}

const fm_gemm_mainloop *tf_gemm_mainloop(const fm_candidate *c) {
  return c->tmpl == FM_TMPL_GEMM ? fm_cg_gemm_mainloop(fm_cg_gemm_config_of(c).wgmma) : NULL;
}

int tf_meta_round_trip(const fm_kernel_meta *m, fm_kernel_meta *back, fm_diag *d) {
  msgpack_sbuffer sb;
  msgpack_packer pk;
  msgpack_unpacked u;
  int rc = FM_ENOMEM;
  msgpack_sbuffer_init(&sb);
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  msgpack_unpacked_init(&u);
  if (fm_meta_pack(m, &pk) == FM_OK && msgpack_unpack_next(&u, sb.data, sb.size, NULL) == MSGPACK_UNPACK_SUCCESS)
    rc = fm_meta_unpack(&u.data, back, d);
  msgpack_unpacked_destroy(&u);
  msgpack_sbuffer_destroy(&sb);
  return rc;
}
