/* test_protocol_gather.c: vocabulary 9 (take_rows): what a fragment that reads rows at an i64
 * index accepts (the MoE decoder's picks: a strided index, a broadcast weight), its canonical
 * form (vocab 9, an extent fragment), the i64 dtype confined to the indices, and every refusal
 * with its error class and reason. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fm_error.h"
#include "fm_fragment.h"
#include "fm_test.h"
#include "test_protocol_util.h"

#define FRAG(v, inputs, ops, outputs) "{'vocab':" #v ",'inputs':[" inputs "],'ops':[" ops "],'outputs':[" outputs "]}"
#define FRAG9(inputs, ops, outputs)   FRAG(9, inputs, ops, outputs)
#define T(id, dt, shape)              "{'id':" #id ",'dtype':'" dt "','shape':" shape "}"
/* pick 0 of the MoE decoder's experts' product: 8192 bf16 rows of 1024, 4096 tokens */
#define SRC                           T(0, "bf16", "[8192,1024]")
#define IDX                           "{'id':1,'dtype':'i64','shape':[4096,1],'strides':[2,0]}"
#define TAKE(out, s, x)               "{'op':'take_rows','out':" #out ",'args':[" #s "," #x "]}"
#define OUT                           T(2, "bf16", "[4096,1024]")

static fm_fragment frag;

static void test_accepts(void) {
  static const char *const ok[] = {
      FRAG9(SRC "," IDX, TAKE(2, 0, 1), OUT),
      /* scaled by the pick's f32 weight, summed with the second pick, cast */
      FRAG9(SRC "," IDX ",{'id':3,'dtype':'f32','shape':[4096,1],'strides':[2,0]},"
                "{'id':4,'dtype':'i64','shape':[4096,1],'strides':[2,0]}",
            TAKE(5, 0, 1) "," TAKE(6, 0, 4) ",{'op':'mul','out':7,'args':[5,3]},{'op':'add','out':8,'args':[7,6]},"
                                            "{'op':'cast','out':9,'args':[8],'dtype':'bf16'}",
            T(9, "bf16", "[4096,1024]")),
      /* rows of one element broadcast along the iteration's last dim; fewer rows than taken */
      FRAG9(T(0, "f32", "[7,1]") "," T(1, "i64", "[33,1]"), TAKE(2, 0, 1), T(2, "f32", "[33,65]")),
      /* a full index (every element its own row), bool rows, a rank-3 iteration */
      FRAG9(T(0, "bool", "[5,3,4]") "," T(1, "i64", "[2,3,4]"), TAKE(2, 0, 1), T(2, "bool", "[2,3,4]")),
  };
  fm_diag d = {{0}};
  for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
    int rc = tp_decode_json(ok[i], &frag, &d);
    if (rc) fprintf(stderr, "  accept %zu: %s\n", i, d.text);
    CHECK_EQ_INT(rc, FM_OK);
    CHECK(fm_fragment_is_extent(&frag));
    CHECK(!fm_fragment_is_scatter(&frag));
  }
  CHECK_EQ_INT(tp_decode_json(ok[0], &frag, &d), FM_OK);
  CHECK_EQ_INT(frag.ops[0].dtype, FM_DT_BF16); /* src's dtype */
}

/* vocab 9 in the canonical bytes, the index's dtype kept. */
static void test_canonical(void) {
  fm_diag d = {{0}};
  fm_fragment canon;
  CHECK_EQ_INT(tp_decode_json(FRAG9(SRC "," IDX, TAKE(2, 0, 1), OUT), &frag, &d), FM_OK);
  CHECK_EQ_INT(fm_fragment_canonicalize(&frag, &canon), FM_OK);
  CHECK_EQ_INT(canon.vocab, 9);
  CHECK_EQ_INT(canon.inputs[1].dtype, FM_DT_I64);
  CHECK_EQ_INT(canon.inputs[1].strides[0], 2);
}

static const tp_reject rejects[] = {
    /* what a vocabulary-8 fragment (or daemon) says */
    {FRAG(8, SRC "," IDX, TAKE(2, 0, 1), OUT), FM_ESCHEMA, "ops[0].op: 'take_rows' needs vocab 9"},
    /* the index: its dtype, i64 anywhere else */
    {FRAG9(SRC "," T(1, "f32", "[4096,1]"), TAKE(2, 0, 1), OUT), FM_ESCHEMA,
     "ops[0].args[1]: 'take_rows' takes an i64 index, value 1 is f32"},
    {FRAG9(T(0, "i64", "[8,4]") "," T(1, "i64", "[8,1]"), TAKE(2, 0, 1), T(2, "i64", "[8,4]")), FM_ESCHEMA,
     "ops[0].args[0]: value 0 is i64, an index: only index_add's and take_rows' index reads one"},
    {FRAG9(SRC "," IDX, TAKE(2, 0, 1) ",{'op':'add','out':3,'args':[2,1]}", T(3, "bf16", "[4096,1024]")), FM_ESCHEMA,
     "ops[1].args[1]: value 1 is i64, an index: only index_add's and take_rows' index reads one"},
    {FRAG9(SRC "," IDX "," T(3, "i64", "[4096,1]"), TAKE(2, 0, 1), OUT), FM_ESCHEMA,
     "inputs[2].dtype: i64 is an index dtype: only index_add's and take_rows' index may be i64"},
    /* the extents: only dim 0 is free */
    {FRAG9(T(0, "bf16", "[8192,1000]") "," T(1, "i64", "[4096,1024]"), TAKE(2, 0, 1), OUT), FM_ESCHEMA,
     "ops[0]: take_rows' rows [8192, 1000] and index [4096, 1024] do not broadcast along dim 1"},
    {FRAG9(SRC "," T(1, "i64", "[4000,1]"), TAKE(2, 0, 1), OUT), FM_ESCHEMA,
     "outputs[0]: value 2 is [4000, 1024], which does not broadcast to the iteration shape [4096, 1024]"},
    {FRAG9(T(0, "bf16", "[1024]") "," T(1, "i64", "[4096,1]"), TAKE(2, 0, 1), OUT), FM_ESCHEMA,
     "inputs[0].shape: rank 1 differs from the iteration rank 2"},
    /* what the extent form does not take: symbolic sizes, a computed src, a reduction beside */
    {FRAG9(T(0, "bf16", "[-1,1024]") "," T(1, "i64", "[-1,1]"), TAKE(2, 0, 1), T(2, "bf16", "[-1,1024]")),
     FM_EUNSUPPORTED, "ops[0]: take_rows takes static sizes only (dim 0 is symbolic)"},
    {FRAG9(SRC "," IDX, "{'op':'neg','out':3,'args':[0]}," TAKE(2, 3, 1), OUT), FM_EUNSUPPORTED,
     "ops[1].args[0]: 'take_rows' reads fragment inputs only"},
    {FRAG9(SRC "," IDX, TAKE(2, 0, 1) ",{'op':'sum','out':3,'args':[2],'dim':-1}", T(3, "bf16", "[4096,1]")),
     FM_EUNSUPPORTED, "ops[0]: a take_rows runs in a pointwise fragment only"},
    /* an absurd size is a limit before anything else */
    {FRAG9(T(0, "bf16", "[4294967296,1024]") "," IDX, TAKE(2, 0, 1), OUT), FM_ELIMIT,
     "inputs[0].shape[0]: 4294967296 exceeds the limit of 2^31-1"},
};

static void test_rejections(void) { CHECK_EQ_INT(tp_check_rejects(rejects, sizeof rejects / sizeof *rejects), 0); }

/* A C-built fragment gets the same checks as a decoded one: an index retyped after decoding. */
static void test_validate_struct(void) {
  fm_diag d = {{0}};
  CHECK_EQ_INT(tp_decode_json(FRAG9(SRC "," IDX, TAKE(2, 0, 1), OUT), &frag, &d), FM_OK);
  frag.inputs[1].dtype = FM_DT_F16;
  CHECK_EQ_INT(fm_fragment_validate(&frag, &d), FM_ESCHEMA);
  CHECK_STR_CONTAINS(d.text, "takes an i64 index, value 1 is f16");
}

int main(void) {
  RUN(test_accepts);
  RUN(test_canonical);
  RUN(test_rejections);
  RUN(test_validate_struct);
  return FM_TEST_DONE();
}
