/* test_protocol_cols.c: vocabulary 5 (column fragments: reductions over dim 0): what makes a
 * fragment one, the shapes validation normalises (low-rank inputs, [N] outputs), the value
 * classes, the canonical form (vocab 5, dim packed for column reductions only, keepdim and
 * the dim's spelling sharing one key), and every refusal with its error class and reason. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fm_error.h"
#include "fm_fingerprint.h"
#include "fm_fragment.h"
#include "fm_test.h"
#include "test_protocol_util.h"

#define FRAG(v, inputs, ops, outputs) "{'vocab':" #v ",'inputs':[" inputs "],'ops':[" ops "],'outputs':[" outputs "]}"
#define FRAG5(inputs, ops, outputs)   FRAG(5, inputs, ops, outputs)
#define T(id, dt, shape)              "{'id':" #id ",'dtype':'" dt "','shape':" shape "}"
#define G                             T(0, "bf16", "[-1,64]")
#define SUM(out, arg)                 "{'op':'sum','out':" #out ",'args':[" #arg "],'dim':0,'keepdim':true}"

static fm_fragment frag, canon;

/* Whether the bytes hold the needle (the canonical packing of a key and value). */
static int holds(const uint8_t *buf, size_t len, const char *needle, size_t n) {
  for (size_t i = 0; buf && i + n <= len; i++)
    if (memcmp(buf + i, needle, n) == 0) return 1;
  return 0;
}

static void test_accepts(void) {
  static const char *const ok[] = {
      FRAG5(G, SUM(1, 0), T(1, "bf16", "[1,64]")),
      FRAG5(G, "{'op':'sum','out':1,'args':[0],'dim':-2,'keepdim':false}", T(1, "bf16", "[64]")),
      FRAG5(G, "{'op':'mean','out':1,'args':[0],'dim':0},{'op':'amax','out':2,'args':[0],'dim':0}",
            T(1, "bf16", "[1,64]") "," T(2, "bf16", "[64]")),
      /* a prologue with a per-column [64] weight (rank 1: [1, 64]) and a [-1, 1] per-row scale */
      FRAG5(G "," T(1, "f32", "[64]") "," T(2, "bf16", "[-1,1]"),
            "{'op':'mul','out':3,'args':[0,1]},{'op':'mul','out':4,'args':[3,2]}," SUM(5, 4), T(5, "f32", "[1,64]")),
      /* an epilogue: cast, and a bias [1, 64] and a scalar (rank 0: [1, 1]) added per column */
      FRAG5(G "," T(1, "bf16", "[1,64]") "," T(2, "f32", "[]"),
            SUM(3, 0) ",{'op':'add','out':4,'args':[3,1]},{'op':'mul','out':5,'args':[4,2]},"
                      "{'op':'cast','out':6,'args':[5],'dtype':'bf16'}",
            T(6, "bf16", "[1,64]") "," T(3, "bf16", "[64]")),
      /* static M, a column-major input */
      FRAG5("{'id':0,'dtype':'f16','shape':[300,64],'strides':[1,300]}", SUM(1, 0), T(1, "f16", "[1,64]")),
      /* M = 1: every input is in the column space */
      FRAG5(T(0, "f32", "[1,64]") "," T(1, "f32", "[1,64]"), "{'op':'mul','out':2,'args':[0,1]}," SUM(3, 2),
            T(3, "f32", "[1,64]")),
      /* N = 1 */
      FRAG5(T(0, "f32", "[-1,1]"), SUM(1, 0), T(1, "f32", "[1]")),
  };
  for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
    fm_diag d = {{0}};
    int rc = tp_decode_json(ok[i], &frag, &d);
    if (rc) fprintf(stderr, "  case %zu: %s\n", i, d.text);
    CHECK_EQ_INT(rc, FM_OK);
    CHECK(fm_fragment_is_cols(&frag));
    CHECK(!fm_fragment_is_rows(&frag));
    CHECK(!fm_fragment_is_gemm(&frag));
    CHECK_EQ_INT(fm_fragment_canonicalize(&frag, &canon), FM_OK);
    CHECK_EQ_INT(canon.vocab, 5);
    CHECK(fm_fragment_is_cols(&canon));
    for (uint32_t k = 0; k < canon.n_inputs; k++) CHECK_EQ_INT(canon.inputs[k].rank, 2);
    for (uint32_t k = 0; k < canon.n_outputs; k++) { /* [1, N] everywhere */
      CHECK_EQ_INT(canon.outputs[k].rank, 2);
      CHECK_EQ_INT(canon.outputs[k].shape[0], 1);
    }
    for (uint32_t j = 0; j < canon.n_ops; j++)
      if (fm_op_kind(canon.ops[j].op) == FM_OPK_REDUCE) CHECK_EQ_INT(canon.ops[j].dim, 0);
  }
  /* a rank-1 fragment reducing dim 0 reduces its last dim: a row fragment, vocab 2 */
  CHECK_EQ_INT(tp_decode_json(FRAG(2, T(0, "f32", "[4]"), SUM(1, 0), T(1, "f32", "[1]")), &frag, NULL), FM_OK);
  CHECK(fm_fragment_is_rows(&frag) && !fm_fragment_is_cols(&frag));
}

/* Classes and the column space of one fragment of every kind of value. */
static void test_classes(void) {
  fm_cols_info ci;
  fm_diag d = {{0}};
  CHECK_EQ_INT(tp_decode_json(FRAG5(G "," T(1, "f32", "[64]"),
                                    "{'op':'const','out':2,'value':2.0},{'op':'mul','out':3,'args':[1,2]},"
                                    "{'op':'mul','out':4,'args':[0,3]}," SUM(5, 4) ","
                                                                                   "{'op':'add','out':6,'args':[5,3]}",
                                    T(6, "f32", "[1,64]")),
                              &frag, &d),
               FM_OK);
  CHECK_EQ_INT(fm_fragment_cols_info(&frag, &ci, &d), FM_OK);
  CHECK_EQ_INT(ci.m, FM_DIM_SYMBOLIC);
  CHECK_EQ_INT(ci.n, 64);
  CHECK_EQ_INT(ci.in_cls[0], FM_COLS_SPACE);
  CHECK_EQ_INT(ci.in_cls[1], FM_COLS_PRE);
  CHECK_EQ_INT(ci.op_cls[0], FM_COLS_PRE);   /* const */
  CHECK_EQ_INT(ci.op_cls[1], FM_COLS_PRE);   /* w * 2 */
  CHECK_EQ_INT(ci.op_cls[2], FM_COLS_SPACE); /* g * (w * 2) */
  CHECK_EQ_INT(ci.op_cls[3], FM_COLS_POST);  /* the sum */
  CHECK_EQ_INT(ci.op_cls[4], FM_COLS_POST);  /* sum + w * 2 */
  CHECK(fm_fragment_is_symbolic(&frag));
  CHECK_EQ_INT(tp_decode_json(FRAG5(T(0, "bf16", "[8,64]"), SUM(1, 0), T(1, "bf16", "[1,64]")), &frag, &d), FM_OK);
  CHECK(!fm_fragment_is_symbolic(&frag));
  CHECK_EQ_INT(fm_fragment_cols_info(&frag, &ci, &d), FM_OK);
  CHECK_EQ_INT(ci.m, 8);
}

/* dim 0 and -2, keepdim true and false are one canonical form and key; dim is packed for
 * column reductions only, so a row fragment's bytes (and every vocab-2 key) are unchanged. */
static void test_canonical(void) {
  size_t la, lb;
  uint8_t *a = tp_canon_json(FRAG5(G, SUM(1, 0), T(1, "bf16", "[1,64]")), &la);
  uint8_t *b = tp_canon_json(FRAG5("{'id':4,'dtype':'bf16','shape':[-1,64],'strides':[64,1],'align':256}",
                                   "{'op':'sum','out':9,'args':[4],'dim':-2,'keepdim':false}",
                                   "{'id':9,'dtype':'bf16','shape':[64],'strides':[1]}"),
                             &lb);
  CHECK(tp_bytes_eq(a, la, b, lb));
  CHECK(a && la > 8 && a[7] == 5); /* {"vocab": 5, ... */
  CHECK(holds(a, la,
              "\xa3"
              "dim\x00",
              5)); /* "dim": 0 */
  uint8_t *r = tp_canon_json(FRAG(2, G, "{'op':'sum','out':1,'args':[0],'dim':-1}", T(1, "bf16", "[-1,1]")), &lb);
  CHECK(r && !holds(r, lb,
                    "\xa3"
                    "dim",
                    4));
  free(r);
  /* the canonical bytes decode to themselves, and so does their key */
  CHECK(tp_canonical_fixed_point(a, la, &frag));
  /* a sum over dim 0 and the same op over the last dim are different kernels */
  uint8_t *m = tp_canon_json(FRAG5(G, "{'op':'mean','out':1,'args':[0],'dim':0}", T(1, "bf16", "[1,64]")), &lb);
  CHECK(m && !tp_bytes_eq(a, la, m, lb));
  free(m);
  free(a);
  free(b);
}

static const tp_reject rejects[] = {
    /* what a vocabulary-4 daemon answers, so the client runs the sum unfused */
    {FRAG(4, G, SUM(1, 0), T(1, "bf16", "[1,64]")), FM_EUNSUPPORTED,
     "ops[0].dim: 'sum' over dim 0 of a rank-2 row; only the last dim (-1) can be reduced"},
    {FRAG5(G, "{'op':'var','out':1,'args':[0],'dim':0}", T(1, "bf16", "[1,64]")), FM_EUNSUPPORTED,
     "ops[0]: 'var' over dim 0 is not supported"},
    {FRAG5(T(0, "f32", "[8,64]"), SUM(1, 0) ",{'op':'amax','out':2,'args':[0],'dim':-1}",
           T(1, "f32", "[1,64]") "," T(2, "f32", "[8,1]")),
     FM_EUNSUPPORTED, "ops[1].dim: 'amax' over dim -1; a fragment reduces over dim 0 (columns) or over the last dim"},
    {FRAG5(G, SUM(1, 0) ",{'op':'sub','out':2,'args':[0,1]}," SUM(3, 2), T(3, "bf16", "[1,64]")), FM_EUNSUPPORTED,
     "ops[1].args[1]: value 1 comes from a column reduction and is read in the [M, N] space; that needs a second pass"},
    {FRAG5(G, SUM(1, 0) ",{'op':'amax','out':2,'args':[1],'dim':0}", T(2, "bf16", "[1,64]")), FM_EUNSUPPORTED,
     "ops[1].args[0]: nested reduction"},
    {FRAG5(G "," T(1, "bf16", "[1,64]"), SUM(2, 1) "," SUM(3, 0), T(2, "bf16", "[1,64]") "," T(3, "bf16", "[1,64]")),
     FM_EUNSUPPORTED, "ops[0].args[0]: nested reduction: value 1 is already one value per column"},
    {FRAG5(G, "{'op':'exp','out':1,'args':[0]}," SUM(2, 1), T(2, "bf16", "[1,64]") "," T(1, "bf16", "[-1,64]")),
     FM_EUNSUPPORTED, "outputs[1]: value 1 is in the [M, N] space; a column fragment writes per-column values only"},
    {FRAG5(G "," T(1, "bf16", "[1,64]"), SUM(2, 0), T(1, "bf16", "[1,64]")), FM_EUNSUPPORTED,
     "outputs: none depends on a column reduction"},
    {FRAG5(G, SUM(1, 0), T(1, "bf16", "[1,32]")), FM_ESCHEMA,
     "outputs[0].shape: [1, 32]; a column fragment's outputs are [1, N] = [1, 64] (or [N])"},
    {FRAG5(G, SUM(1, 0), T(1, "bf16", "[]")), FM_ESCHEMA, "outputs[0].shape: rank 0"},
    {FRAG5(G "," T(1, "bf16", "[5,64]"), "{'op':'add','out':2,'args':[0,1]}," SUM(3, 2), T(3, "bf16", "[1,64]")),
     FM_ESCHEMA, "inputs[1].shape[0]: 5 must be -1 (symbolic) or 1 (broadcast)"},
    {FRAG5(T(0, "bf16", "[5,64]") "," T(1, "bf16", "[-1,64]"), "{'op':'add','out':2,'args':[0,1]}," SUM(3, 2),
           T(3, "bf16", "[1,64]")),
     FM_ESCHEMA, "inputs[1].shape[0]: symbolic, but M is static (5)"},
    {FRAG5(G "," T(1, "bf16", "[-1,32]"), "{'op':'add','out':2,'args':[0,1]}," SUM(3, 2), T(3, "bf16", "[1,64]")),
     FM_ESCHEMA, "inputs[1].shape[1]: 32 does not broadcast to N = 64"},
    {FRAG5(T(0, "bool", "[-1,64]"), SUM(1, 0), T(1, "bool", "[1,64]")), FM_ESCHEMA,
     "'sum' reduces a floating-point tensor"},
    /* rank 3: dim 0 is no column reduction there, and the rows rule refuses it */
    {FRAG5(T(0, "f32", "[4,8,64]"), SUM(1, 0), T(1, "f32", "[1,8,64]")), FM_EUNSUPPORTED,
     "only the last dim (-1) can be reduced"},
    {FRAG5(T(0, "bf16", "[-1,64]") "," T(1, "bf16", "[64,32]"), "{'op':'mm','out':2,'args':[0,1]}," SUM(3, 2),
           T(3, "bf16", "[1,32]")),
     FM_EUNSUPPORTED, "a GEMM fragment cannot also reduce"},
};

static void test_rejections(void) { CHECK_EQ_INT(tp_check_rejects(rejects, sizeof rejects / sizeof *rejects), 0); }

int main(void) {
  RUN(test_accepts);
  RUN(test_classes);
  RUN(test_canonical);
  RUN(test_rejections);
  return FM_TEST_DONE();
}
