/* test_protocol_rows.c: vocabulary 2 (row fragments): decoding the reductions and their
 * attributes, the composite ops and their expansion, the row shape rules, the canonical form
 * (lowest vocabulary, keepdim shapes, shared keys), and every refusal with its reason. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fm_error.h"
#include "fm_fragment.h"
#include "fm_test.h"
#include "test_protocol_util.h"

#define FRAG2(inputs, ops, outputs) "{'vocab':2,'inputs':[" inputs "],'ops':[" ops "],'outputs':[" outputs "]}"
#define T(id, dt, shape)            "{'id':" #id ",'dtype':'" dt "','shape':" shape "}"
#define X                           T(0, "bf16", "[-1,64]")
#define W                           T(1, "bf16", "[1,64]")
#define B                           T(2, "bf16", "[1,64]")

static fm_fragment frag, canon;

static void test_tables(void) {
  CHECK_EQ_INT(fm_op_kind(FM_OP_SUM), FM_OPK_REDUCE);
  CHECK_EQ_INT(fm_op_kind(FM_OP_VAR), FM_OPK_REDUCE);
  CHECK_EQ_INT(fm_op_kind(FM_OP_LAYER_NORM), FM_OPK_COMPOSITE);
  CHECK_EQ_INT(fm_op_arity(FM_OP_AMAX), 1);
  CHECK_EQ_INT(fm_op_arity(FM_OP_LAYER_NORM), 3);
  CHECK_EQ_INT(fm_op_arity(FM_OP_RMS_NORM), 2);
  CHECK_EQ_INT(fm_op_vocab(FM_OP_ADD), 1);
  CHECK_EQ_INT(fm_op_vocab(FM_OP_MEAN), 2);
  CHECK_EQ_INT(fm_op_vocab(FM_OP_SOFTMAX), 2);
  CHECK_EQ_INT(fm_op_vocab(FM_OP_MM), 3);
  CHECK_EQ_INT(fm_op_vocab(FM_OP_BMM), 4);
}

static void test_accepts(void) {
  static const char *const ok[] = {
      FRAG2(X, "{'op':'sum','out':1,'args':[0]}", T(1, "bf16", "[-1,1]")),
      FRAG2(X, "{'op':'sum','out':1,'args':[0],'dim':-1,'keepdim':false}", T(1, "bf16", "[-1]")),
      FRAG2(X, "{'op':'mean','out':1,'args':[0],'dim':1,'keepdim':true}", T(1, "bf16", "[-1,1]")),
      FRAG2(X, "{'op':'amax','out':1,'args':[0]},{'op':'sub','out':2,'args':[0,1]}", T(2, "bf16", "[-1,64]")),
      FRAG2(X, "{'op':'var','out':1,'args':[0],'correction':0}", T(1, "bf16", "[-1,1]")),
      FRAG2(X, "{'op':'softmax','out':1,'args':[0],'dim':-1}", T(1, "bf16", "[-1,64]")),
      FRAG2(X "," W "," B, "{'op':'layer_norm','out':3,'args':[0,1,2],'value':1e-5}", T(3, "bf16", "[-1,64]")),
      FRAG2(X, "{'op':'layer_norm','out':3,'args':[0],'value':1e-5}", T(3, "bf16", "[-1,64]")),
      FRAG2(X "," W, "{'op':'rms_norm','out':3,'args':[0,1],'value':1e-6}", T(3, "bf16", "[-1,64]")),
      /* per-row [-1, 1] input, a [4] row without leading dims, two outputs of both kinds */
      FRAG2(X "," T(1, "f32", "[-1,1]"), "{'op':'mul','out':2,'args':[0,1]},{'op':'sum','out':3,'args':[2]}",
            T(2, "f32", "[-1,64]") "," T(3, "f32", "[-1,1]")),
      FRAG2(T(0, "f32", "[4]"), "{'op':'amax','out':1,'args':[0]}", T(1, "f32", "[1]")),
      FRAG2(T(0, "f32", "[4]"), "{'op':'amax','out':1,'args':[0],'keepdim':false}", T(1, "f32", "[]")),
  };
  for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
    fm_diag d = {{0}};
    int rc = tp_decode_json(ok[i], &frag, &d);
    if (rc) fprintf(stderr, "  case %zu: %s\n", i, d.text);
    CHECK_EQ_INT(rc, FM_OK);
    CHECK(fm_fragment_is_rows(&frag));
    CHECK_EQ_INT(fm_fragment_canonicalize(&frag, &canon), FM_OK);
    CHECK_EQ_INT(canon.vocab, 2);
    for (uint32_t k = 0; k < canon.n_outputs; k++) /* keepdim shapes everywhere */
      CHECK_EQ_INT(canon.outputs[k].rank, canon.inputs[0].rank);
  }
}

/* A composite and its expansion written out by hand share one canonical form (and so one
 * key); keepdim and dim spellings do not split it either. */
static void test_shared_keys(void) {
  size_t la, lb;
  uint8_t *a = tp_canon_json(
      FRAG2(X "," W "," B, "{'op':'layer_norm','out':3,'args':[0,1,2],'value':1e-5}", T(3, "bf16", "[-1,64]")), &la);
  uint8_t *b = tp_canon_json(FRAG2(X "," W "," B,
                                   "{'op':'var','out':12,'args':[0],'correction':0},{'op':'mean','out':10,'args':[0]},"
                                   "{'op':'sub','out':11,'args':[0,10]},{'op':'const','out':13,'value':1e-5},"
                                   "{'op':'add','out':14,'args':[12,13]},{'op':'rsqrt','out':15,'args':[14]},"
                                   "{'op':'mul','out':16,'args':[11,15]},{'op':'mul','out':17,'args':[16,1]},"
                                   "{'op':'add','out':3,'args':[17,2]}",
                                   T(3, "bf16", "[-1,64]")),
                             &lb);
  CHECK(tp_bytes_eq(a, la, b, lb));
  free(a);
  free(b);
  a = tp_canon_json(FRAG2(X, "{'op':'softmax','out':1,'args':[0]}", T(1, "bf16", "[-1,64]")), &la);
  b = tp_canon_json(FRAG2(X,
                          "{'op':'amax','out':5,'args':[0],'keepdim':true,'dim':1},{'op':'sub','out':6,'args':[0,5]},"
                          "{'op':'exp','out':7,'args':[6]},{'op':'sum','out':8,'args':[7],'dim':-1},"
                          "{'op':'div','out':1,'args':[7,8]}",
                          T(1, "bf16", "[-1,64]")),
                    &lb);
  CHECK(tp_bytes_eq(a, la, b, lb));
  free(a);
  free(b);
  a = tp_canon_json(FRAG2(X, "{'op':'sum','out':1,'args':[0],'keepdim':false}", T(1, "bf16", "[-1]")), &la);
  b = tp_canon_json(FRAG2(X, "{'op':'sum','out':1,'args':[0],'keepdim':true}", T(1, "bf16", "[-1,1]")), &lb);
  CHECK(tp_bytes_eq(a, la, b, lb));
  free(a);
  free(b);
  /* var's correction is part of the form */
  a = tp_canon_json(FRAG2(X, "{'op':'var','out':1,'args':[0]}", T(1, "bf16", "[-1,1]")), &la);
  b = tp_canon_json(FRAG2(X, "{'op':'var','out':1,'args':[0],'correction':0}", T(1, "bf16", "[-1,1]")), &lb);
  CHECK(a && b && !tp_bytes_eq(a, la, b, lb));
  free(a);
  free(b);
}

/* vocab 2 without reductions canonicalizes to vocab 1: the same bytes as the vocab-1 form. */
static void test_lowest_vocab(void) {
  size_t la, lb;
  uint8_t *a = tp_canon_json("{'vocab':1,'inputs':[" X
                             "],'ops':[{'op':'relu','out':1,'args':[0]}],"
                             "'outputs':[" T(1, "bf16", "[-1,64]") "]}",
                             &la);
  uint8_t *b = tp_canon_json(FRAG2(X, "{'op':'relu','out':1,'args':[0]}", T(1, "bf16", "[-1,64]")), &lb);
  CHECK(tp_bytes_eq(a, la, b, lb));
  CHECK(a && a[7] == 1); /* {"vocab": 1, ...: fixfixmap, fixstr "vocab", fixint 1 */
  free(a);
  free(b);
}

static const tp_reject rejects[] = {
    {FRAG2(X, "{'op':'sum','out':1,'args':[0],'dim':0}", T(1, "bf16", "[1,64]")), FM_EUNSUPPORTED,
     "ops[0].dim: 'sum' over dim 0 of a rank-2 row; only the last dim (-1) can be reduced"},
    {FRAG2(X, "{'op':'sum','out':1,'args':[0]},{'op':'amax','out':2,'args':[1]}", T(2, "bf16", "[-1,1]")),
     FM_EUNSUPPORTED, "ops[1].args[0]: nested reduction"},
    {FRAG2(T(0, "f32", "[2,1048577]"), "{'op':'sum','out':1,'args':[0]}", T(1, "f32", "[2,1]")), FM_EUNSUPPORTED,
     "rows of 1048577 elements exceed the limit of 1048576"},
    /* a row longer than registers hold is streamed, and var needs it held */
    {FRAG2(T(0, "f32", "[2,40000]"), "{'op':'var','out':1,'args':[0]}", T(1, "f32", "[2,1]")), FM_EUNSUPPORTED,
     "ops[0]: var over rows of 40000 elements"},
    {FRAG2(T(0, "bf16", "[-1,40000]") "," T(1, "bf16", "[1,40000]") "," T(2, "bf16", "[1,40000]"),
           "{'op':'layer_norm','out':3,'args':[0,1,2],'value':1e-5}", T(3, "bf16", "[-1,40000]")),
     FM_EUNSUPPORTED, "var over rows of 40000 elements"},
    {FRAG2(T(0, "f32", "[-1]"), "{'op':'sum','out':1,'args':[0]}", T(1, "f32", "[1]")), FM_EUNSUPPORTED,
     "the reduced (last) dim must be static"},
    {"{'vocab':1,'inputs':[" X "],'ops':[{'op':'sum','out':1,'args':[0]}],'outputs':[" T(1, "bf16", "[-1,1]") "]}",
     FM_ESCHEMA, "ops[0].op: 'sum' needs vocab 2 (the fragment says vocab 1)"},
    {FRAG2(X, "{'op':'sum','out':1,'args':[0],'keepdim':1}", T(1, "bf16", "[-1,1]")), FM_ESCHEMA,
     "ops[0].keepdim: expected a bool"},
    {FRAG2(X, "{'op':'var','out':1,'args':[0],'correction':2}", T(1, "bf16", "[-1,1]")), FM_ESCHEMA,
     "ops[0].correction: 2 is not 0 or 1"},
    {FRAG2(X, "{'op':'relu','out':1,'args':[0],'dim':-1}", T(1, "bf16", "[-1,64]")), FM_ESCHEMA,
     "ops[0].dim: only reductions, softmax and cat take a dim"},
    {FRAG2(X, "{'op':'mean','out':1,'args':[0],'correction':0}", T(1, "bf16", "[-1,1]")), FM_ESCHEMA,
     "only var takes a correction"},
    {FRAG2(X, "{'op':'layer_norm','out':1,'args':[0]}", T(1, "bf16", "[-1,64]")), FM_ESCHEMA,
     "ops[0]: layer_norm needs a 'value' (its eps)"},
    {FRAG2(X, "{'op':'softmax','out':1,'args':[0,0]}", T(1, "bf16", "[-1,64]")), FM_ESCHEMA,
     "ops[0].args: 'softmax' takes 1 to 1 args, got 2"},
    {FRAG2(X, "{'op':'sum','out':1,'args':[0]}", T(1, "bf16", "[-1,64]")), FM_ESCHEMA,
     "outputs[0].shape: [-1, 64], but its value is one per row (last dim 1)"},
    {FRAG2(X, "{'op':'exp','out':1,'args':[0]},{'op':'sum','out':2,'args':[0]}",
           T(1, "bf16", "[-1,1]") "," T(2, "bf16", "[-1,1]")),
     FM_ESCHEMA, "outputs[0].shape: [-1, 1], but its value is a full row"},
    {FRAG2(X "," T(1, "bf16", "[-1,32]"), "{'op':'sum','out':2,'args':[0]}", T(2, "bf16", "[-1,1]")), FM_ESCHEMA,
     "inputs[1].shape[1]: 32 does not broadcast to 64"},
    {FRAG2(T(0, "bool", "[4,8]"), "{'op':'sum','out':1,'args':[0]}", T(1, "bool", "[4,1]")), FM_ESCHEMA,
     "'sum' reduces a floating-point tensor"},
    {"{'vocab':12,'inputs':[],'ops':[],'outputs':[]}", FM_ESCHEMA, "vocab 12 not supported, this daemon speaks 1 to 11"},
};

static void test_rejections(void) { CHECK_EQ_INT(tp_check_rejects(rejects, sizeof rejects / sizeof *rejects), 0); }

/* The expansion is bounded by FM_MAX_OPS like any fragment. */
static void test_expansion_limit(void) {
  fm_diag d = {{0}};
  memset(&frag, 0, sizeof frag);
  frag.vocab = 2;
  frag.n_inputs = 1;
  frag.inputs[0] = (fm_tensor){.id = 0, .dtype = FM_DT_F32, .rank = 2, .shape = {4, 8}, .strides = {8, 1}, .align = 16};
  frag.n_ops = 40;
  for (uint32_t i = 0; i < 40; i++)
    frag.ops[i] = (fm_opnode){.op = FM_OP_LAYER_NORM, .out = i + 1, .nargs = 1, .args = {i}, .value = 1e-5, .dim = -1};
  CHECK_EQ_INT(fm_fragment_expand(&frag, &d), FM_ELIMIT);
  CHECK_STR_CONTAINS(d.text, "exceeds the limit of 256 ops");
  frag.n_ops = 2;
  CHECK_EQ_INT(fm_fragment_expand(&frag, &d), FM_OK);
  CHECK_EQ_INT(frag.n_ops, 14); /* 7 ops per layer_norm without weight and bias */
  CHECK_EQ_INT(frag.ops[13].out, 2);
  frag.n_outputs = 1;
  frag.outputs[0] = frag.inputs[0];
  frag.outputs[0].id = 2;
  CHECK_EQ_INT(fm_fragment_validate(&frag, &d), FM_OK);
}

int main(void) {
  RUN(test_tables);
  RUN(test_accepts);
  RUN(test_shared_keys);
  RUN(test_lowest_vocab);
  RUN(test_rejections);
  RUN(test_expansion_limit);
  return FM_TEST_DONE();
}
