/* test_hostile_strings.c: no client-supplied string reaches generated source (RELIABILITY.md
 * section 5). Fragments of the three templates (pointwise, rows, GEMM) are packed as a client
 * would, with a hostile string in every place the wire allows one (op name, dtype, map keys,
 * an extra field) and hostile numbers where the wire takes a number (const values, eps). Each
 * goes the daemon's way: fm_msg_unpack -> fm_fragment_decode -> canonicalize -> canonical
 * bytes -> fm_codegen_default + fm_codegen_generate. Asserted: a fragment carrying a hostile
 * string is refused with a bounded reason or, if it were ever accepted, neither its canonical
 * bytes nor its source contain the string; a hostile number gives source that NVRTC compiles;
 * a hostile arch string never reaches NVRTC's options. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <msgpack.h>

#include "fm_codegen.h"
#include "fm_fragment.h"
#include "fm_msg.h"
#include "fm_nvrtc.h"
#include "fm_test.h"

#define LONG_LEN  (200u << 10) /* a 200 KB string: under the frame cap, far over any name */
#define N_HOSTILE 20

typedef struct hstr {
  const char *p;
  size_t len;
} hstr;

static hstr hostile[N_HOSTILE];
static size_t n_hostile;
static char *long_str;

static void add_hostile(const char *p, size_t len) {
  hostile[n_hostile].p = p;
  hostile[n_hostile].len = len;
  n_hostile++;
}

static void init_hostile(void) {
  static const char *const plain[] = {
      "\"); system(\"rm -rf /\"); //",
      "*/ __global__ void evil() {} /*",
      "\n#include </etc/passwd>\n",
      "#define float double",
      "\\\nint evil;",
      "int",
      "return",
      "__global__",
      "asm volatile(\"trap;\")",
      "f32\"",
      "bf16 x; }",
      "gelu(x) + 1",
      "'",
      "${HOME}%s%n%x",
  };
  for (size_t i = 0; i < sizeof plain / sizeof plain[0]; i++) add_hostile(plain[i], strlen(plain[i]));
  add_hostile("\xff\xfe\xc0\x80 not utf-8", 14);
  add_hostile("add\0*/ evil", 11); /* an embedded NUL after a valid op name */
  add_hostile("bf16\0evil", 9);    /* and after a valid dtype */
  add_hostile("", 0);
  long_str = malloc(LONG_LEN);
  for (size_t i = 0; i < LONG_LEN; i++) long_str[i] = "*/\n#A\"\\"[i % 7];
  add_hostile(long_str, LONG_LEN);
}

static void pk_str(msgpack_packer *pk, const char *s, size_t n) {
  msgpack_pack_str(pk, n);
  msgpack_pack_str_body(pk, s, n);
}
static void pk_cstr(msgpack_packer *pk, const char *s) { pk_str(pk, s, strlen(s)); }

/* Where a hostile string goes. */
typedef enum {
  SLOT_NONE,      /* a clean fragment (numbers may still be hostile) */
  SLOT_OPNAME,    /* the name of the pointwise op after the const */
  SLOT_DTYPE,     /* input 0's dtype */
  SLOT_OP_KEY,    /* an extra key in an op's map */
  SLOT_TOP_VALUE, /* an extra top-level field "name": <string> */
  SLOT_INPUT_KEY, /* an extra key in input 0's map */
  SLOT__N
} slot;

typedef enum { BASE_POINTWISE, BASE_ROWS, BASE_GEMM, BASE__N } base;
static const char *const base_name[BASE__N] = {"pointwise", "rows", "gemm"};

/* A number as the client wrote it: a double, or an integer msgpack would carry as such. */
typedef struct hnum {
  const char *name;
  int is_int;
  double f;
  int64_t i;
} hnum;

static void pack_num(msgpack_packer *pk, const hnum *v) {
  if (v->is_int)
    msgpack_pack_int64(pk, v->i);
  else
    msgpack_pack_double(pk, v->f);
}

static void pack_tensor(msgpack_packer *pk, uint32_t id, const char *dt, size_t dtlen, int rank, const int64_t *shape,
                        const int64_t *strides, slot s, const hstr *h) {
  int extra = s == SLOT_INPUT_KEY && h;
  msgpack_pack_map(pk, 3 + (strides != NULL) + extra);
  pk_cstr(pk, "id");
  msgpack_pack_uint32(pk, id);
  pk_cstr(pk, "dtype");
  pk_str(pk, dt, dtlen);
  pk_cstr(pk, "shape");
  msgpack_pack_array(pk, (size_t)rank);
  for (int i = 0; i < rank; i++) msgpack_pack_int64(pk, shape[i]);
  if (strides) {
    pk_cstr(pk, "strides");
    msgpack_pack_array(pk, (size_t)rank);
    for (int i = 0; i < rank; i++) msgpack_pack_int64(pk, strides[i]);
  }
  if (extra) {
    pk_str(pk, h->p, h->len);
    msgpack_pack_uint32(pk, 1);
  }
}

/* {op, out, args[, value]} plus the hostile key when asked. */
static void pack_op(msgpack_packer *pk, const char *op, size_t oplen, uint32_t out, int nargs, const uint32_t *args,
                    const hnum *value, const hstr *key) {
  msgpack_pack_map(pk, 2 + (nargs > 0) + (value != NULL) + (key != NULL));
  pk_cstr(pk, "op");
  pk_str(pk, op, oplen);
  pk_cstr(pk, "out");
  msgpack_pack_uint32(pk, out);
  if (nargs > 0) {
    pk_cstr(pk, "args");
    msgpack_pack_array(pk, (size_t)nargs);
    for (int i = 0; i < nargs; i++) msgpack_pack_uint32(pk, args[i]);
  }
  if (value) {
    pk_cstr(pk, "value");
    pack_num(pk, value);
  }
  if (key) {
    pk_str(pk, key->p, key->len);
    msgpack_pack_uint32(pk, 7);
  }
}

/* Packs base b with the hostile string h in slot s and the number v (the const, or the eps). */
static void pack_fragment(msgpack_sbuffer *sb, base b, slot s, const hstr *h, const hnum *v) {
  msgpack_packer pk;
  msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
  const hstr *hs = s == SLOT_NONE ? NULL : h;
  msgpack_pack_map(&pk, 4 + (s == SLOT_TOP_VALUE));
  pk_cstr(&pk, "vocab");
  msgpack_pack_uint32(&pk, b == BASE_GEMM ? 3 : 2);
  const char *dt = b == BASE_POINTWISE ? "f32" : "bf16";
  const char *in_dt = s == SLOT_DTYPE ? hs->p : dt;
  size_t in_dtlen = s == SLOT_DTYPE ? hs->len : strlen(dt);
  const char *opn = s == SLOT_OPNAME ? hs->p : "mul";
  size_t opnlen = s == SLOT_OPNAME ? hs->len : 3;
  const hstr *opkey = s == SLOT_OP_KEY ? hs : NULL;
  pk_cstr(&pk, "inputs");
  if (b == BASE_POINTWISE) {
    const int64_t shape[2] = {-1, 256};
    msgpack_pack_array(&pk, 1);
    pack_tensor(&pk, 0, in_dt, in_dtlen, 2, shape, NULL, s, hs);
    pk_cstr(&pk, "ops");
    msgpack_pack_array(&pk, 3);
    const uint32_t a2[2] = {0, 1}, a3[1] = {2};
    pack_op(&pk, "const", 5, 1, 0, NULL, v, NULL);
    pack_op(&pk, opn, opnlen, 2, 2, a2, NULL, opkey);
    pack_op(&pk, "gelu", 4, 3, 1, a3, NULL, NULL);
    pk_cstr(&pk, "outputs");
    msgpack_pack_array(&pk, 1);
    pack_tensor(&pk, 3, "f32", 3, 2, shape, NULL, SLOT_NONE, NULL);
  } else if (b == BASE_ROWS) {
    const int64_t x[2] = {-1, 1024}, w[2] = {1, 1024};
    msgpack_pack_array(&pk, 3);
    pack_tensor(&pk, 0, in_dt, in_dtlen, 2, x, NULL, s, hs);
    pack_tensor(&pk, 1, "bf16", 4, 2, w, NULL, SLOT_NONE, NULL);
    pack_tensor(&pk, 2, "bf16", 4, 2, w, NULL, SLOT_NONE, NULL);
    pk_cstr(&pk, "ops");
    msgpack_pack_array(&pk, 2);
    const uint32_t ln[3] = {0, 1, 2}, a4[2] = {3, 3};
    pack_op(&pk, "layer_norm", 10, 3, 3, ln, v, NULL);
    pack_op(&pk, opn, opnlen, 4, 2, a4, NULL, opkey);
    pk_cstr(&pk, "outputs");
    msgpack_pack_array(&pk, 1);
    pack_tensor(&pk, 4, "bf16", 4, 2, x, NULL, SLOT_NONE, NULL);
  } else {
    const int64_t a[2] = {-1, 64}, bb[2] = {64, 128}, bst[2] = {1, 64}, bias[1] = {128}, o[2] = {-1, 128};
    msgpack_pack_array(&pk, 3);
    pack_tensor(&pk, 0, in_dt, in_dtlen, 2, a, NULL, s, hs);
    pack_tensor(&pk, 1, "bf16", 4, 2, bb, bst, SLOT_NONE, NULL);
    pack_tensor(&pk, 2, "bf16", 4, 1, bias, NULL, SLOT_NONE, NULL);
    pk_cstr(&pk, "ops");
    msgpack_pack_array(&pk, 4);
    const uint32_t mm[3] = {2, 0, 1}, a5[2] = {3, 4}, a6[1] = {5};
    pack_op(&pk, "addmm", 5, 3, 3, mm, NULL, NULL);
    pack_op(&pk, "const", 5, 4, 0, NULL, v, NULL);
    pack_op(&pk, opn, opnlen, 5, 2, a5, NULL, opkey);
    pack_op(&pk, "gelu", 4, 6, 1, a6, NULL, NULL);
    pk_cstr(&pk, "outputs");
    msgpack_pack_array(&pk, 1);
    pack_tensor(&pk, 6, "bf16", 4, 2, o, NULL, SLOT_NONE, NULL);
  }
  if (s == SLOT_TOP_VALUE) {
    pk_cstr(&pk, "name");
    pk_str(&pk, hs->p, hs->len);
  }
}

static int contains(const char *hay, size_t hlen, const hstr *h) {
  if (h->len == 0 || h->len > hlen) return 0;
  for (size_t i = 0; i + h->len <= hlen; i++)
    if (memcmp(hay + i, h->p, h->len) == 0) return 1;
  return 0;
}

static int n_refused, n_accepted, n_sources, n_compiled;

/* The daemon's path for one payload. Fills *src (malloc'd) with the default's source when the
 * fragment is accepted and supported; returns the decode result. Every generated source (the
 * default and two more candidates) and the canonical bytes are checked against h. */
static int run_path(const msgpack_sbuffer *sb, const hstr *h, char **src_out) {
  msgpack_zone zone, zone2;
  msgpack_object obj, again;
  fm_diag d = {{0}};
  fm_fragment *raw = malloc(sizeof *raw), *canon = malloc(sizeof *canon), *canon2 = malloc(sizeof *canon2);
  uint8_t *bytes = NULL, *bytes2 = NULL;
  size_t n = 0, n2 = 0;
  int err;
  *src_out = NULL;
  CHECK(msgpack_zone_init(&zone, 4096));
  CHECK(msgpack_zone_init(&zone2, 4096));
  err = fm_msg_unpack((const uint8_t *)sb->data, sb->size, &fm_msg_request_limits, &zone, &obj, &d);
  if (!err) err = fm_fragment_decode(&obj, raw, &d);
  /* The reason goes back to the client: bounded, and terminated. */
  CHECK(memchr(d.text, '\0', sizeof d.text) != NULL);
  if (err) {
    n_refused++;
    goto out;
  }
  n_accepted++;
  CHECK_EQ_INT(fm_fragment_canonicalize(raw, canon), FM_OK);
  CHECK_EQ_INT(fm_fragment_canonical_bytes(canon, &bytes, &n), FM_OK);
  if (h) CHECK(!contains((const char *)bytes, n, h));
  /* the canonical form is a fixed point */
  CHECK_EQ_INT(fm_msg_unpack(bytes, n, &fm_msg_request_limits, &zone2, &again, &d), FM_OK);
  CHECK_EQ_INT(fm_fragment_decode(&again, raw, &d), FM_OK);
  CHECK_EQ_INT(fm_fragment_canonicalize(raw, canon2), FM_OK);
  CHECK_EQ_INT(fm_fragment_canonical_bytes(canon2, &bytes2, &n2), FM_OK);
  CHECK(n == n2 && bytes && bytes2 && memcmp(bytes, bytes2, n) == 0);

  fm_candidate def, cands[64];
  if (fm_codegen_default(canon, &def, &d) != FM_OK) goto out; /* unsupported: run unfused */
  size_t nc = fm_codegen_candidates(canon, cands, 64);
  if (nc > 64) nc = 64;
  for (size_t i = 0; i <= nc && i < 3; i++) {
    char *src = NULL;
    fm_kernel_meta meta;
    int rc = fm_codegen_generate(canon, i == 0 ? &def : &cands[i - 1], 132, &src, &meta, &d);
    CHECK_EQ_INT(rc, FM_OK);
    if (!src) continue;
    n_sources++;
    if (h && contains(src, strlen(src), h)) {
      fprintf(stderr, "  hostile string (%zu bytes) reached the source:\n%s\n", h->len, src);
      CHECK(0);
    }
    if (i == 0)
      *src_out = src;
    else
      free(src);
  }
out:
  msgpack_zone_destroy(&zone);
  msgpack_zone_destroy(&zone2);
  free(bytes);
  free(bytes2);
  free(raw);
  free(canon);
  free(canon2);
  return err;
}

static const hnum clean_value = {"0.5", 0, 0.5, 0};

/* Every hostile string in every slot of every template. */
static void test_hostile_strings_never_reach_source(void) {
  n_refused = n_accepted = 0;
  for (int b = 0; b < BASE__N; b++) {
    /* the clean fragment is accepted and generates source (else this test proves nothing) */
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    pack_fragment(&sb, (base)b, SLOT_NONE, NULL, &clean_value);
    char *src = NULL;
    CHECK_EQ_INT(run_path(&sb, NULL, &src), FM_OK);
    CHECK(src != NULL);
    free(src);
    msgpack_sbuffer_destroy(&sb);
    for (int s = SLOT_OPNAME; s < SLOT__N; s++) {
      for (size_t i = 0; i < n_hostile; i++) {
        msgpack_sbuffer_init(&sb);
        pack_fragment(&sb, (base)b, (slot)s, &hostile[i], &clean_value);
        int before = fm_test_failed_checks_;
        run_path(&sb, &hostile[i], &src);
        if (fm_test_failed_checks_ != before)
          fprintf(stderr, "  (%s, slot %d, hostile string %zu)\n", base_name[b], s, i);
        free(src);
        msgpack_sbuffer_destroy(&sb);
      }
    }
  }
  printf("  %d hostile-string fragments refused, %d accepted (source checked)\n", n_refused, n_accepted);
  CHECK(n_refused + n_accepted == BASE__N * (1 + (SLOT__N - 1) * (int)n_hostile));
}

/* Hostile numbers are values, not text: the source spells them as float literals or bit
 * patterns NVRTC accepts. */
static void test_hostile_numbers_compile(void) {
  static const hnum nums[] = {
      {"nan", 0, NAN, 0},
      {"-nan", 0, -NAN, 0},
      {"+inf", 0, INFINITY, 0},
      {"-inf", 0, -INFINITY, 0},
      {"1e308", 0, 1e308, 0},
      {"-1e308", 0, -1e308, 0},
      {"just over FLT_MAX", 0, 3.4028235677973366e38, 0},
      {"denormal double", 0, 4.9e-324, 0},
      {"denormal float", 0, 1e-45, 0},
      {"-0.0", 0, -0.0, 0},
      {"INT64_MIN", 1, 0, INT64_MIN},
      {"INT64_MAX", 1, 0, INT64_MAX},
  };
  n_compiled = 0;
  for (int b = 0; b < BASE__N; b++) {
    for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++) {
      /* NVRTC time: every number for pointwise, the sharpest ones for rows and GEMM */
      int compile = b == BASE_POINTWISE || i == 0 || i == 2 || i == 5 || i == 10;
      msgpack_sbuffer sb;
      msgpack_sbuffer_init(&sb);
      pack_fragment(&sb, (base)b, SLOT_NONE, NULL, &nums[i]);
      char *src = NULL;
      int err = run_path(&sb, NULL, &src);
      /* eps must be > 0 and finite, and the protocol refuses a NaN const (validation); a const
       * takes any other number */
      if (b != BASE_ROWS && !(nums[i].is_int == 0 && isnan(nums[i].f))) {
        if (err) fprintf(stderr, "  %s const %s refused\n", base_name[b], nums[i].name);
        CHECK_EQ_INT(err, FM_OK);
      }
      if (src && compile) {
        uint8_t *cubin = NULL;
        size_t len = 0;
        char *log = NULL;
        int rc = fm_nvrtc_compile(src, "hostile.cu", "sm_90a", &cubin, &len, &log);
        if (rc)
          fprintf(stderr, "  %s %s: NVRTC: %s\n%s\n%s\n", base_name[b], nums[i].name, fm_strerror(rc), log ? log : "",
                  src);
        CHECK_EQ_INT(rc, FM_OK);
        CHECK(len > 4 && memcmp(cubin,
                                "\x7f"
                                "ELF",
                                4) == 0);
        n_compiled++;
        free(cubin);
        free(log);
      }
      free(src);
      msgpack_sbuffer_destroy(&sb);
    }
  }
  printf("  %d sources with hostile numbers compiled by NVRTC\n", n_compiled);
  CHECK(n_compiled >= 16);
}

/* The compile request's arch is the one other client string the compile path touches: it is
 * matched against a fixed list before it goes anywhere near NVRTC's options. */
static void test_hostile_arch_refused(void) {
  for (size_t i = 0; i < n_hostile; i++) {
    /* as the daemon sees a str field: NUL-terminated (an embedded NUL ends it early) */
    char *z = malloc(hostile[i].len + 1);
    memcpy(z, hostile[i].p, hostile[i].len);
    z[hostile[i].len] = '\0';
    CHECK(!fm_nvrtc_arch_supported(z));
    free(z);
  }
  const char *const archs[] = {"sm_90a --define-macro=float=double",
                               "sm_90a\n",
                               "sm_90a ",
                               "sm_90a\"",
                               "-Dx=y",
                               "sm_",
                               "compute_90a",
                               "sm_9999"};
  for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++) {
    CHECK(!fm_nvrtc_arch_supported(archs[i]));
    uint8_t *cubin = NULL;
    size_t len = 0;
    char *log = NULL;
    CHECK(fm_nvrtc_compile("extern \"C\" __global__ void k() {}", "a.cu", archs[i], &cubin, &len, &log) != FM_OK);
    CHECK(cubin == NULL);
    free(cubin);
    free(log);
  }
}

int main(void) {
  init_hostile();
  RUN(test_hostile_strings_never_reach_source);
  RUN(test_hostile_numbers_compile);
  RUN(test_hostile_arch_refused);
  free(long_str);
  return FM_TEST_DONE();
}
