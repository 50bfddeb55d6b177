/* test_protocol_scatter.c: vocabulary 8 (index_add, the i64 index dtype): what a scatter
 * fragment accepts (the MoE gather's gradient, strided src and index), its canonical form
 * (vocab 8, every other fragment's bytes unchanged), the i64 dtype confined to index_add's
 * index, and every refusal with its error class and reason. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fm_error.h"
#include "fm_fragment.h"
#include "fm_test.h"
#include "test_protocol_util.h"

#define FRAG(v, inputs, ops, outputs) "{'vocab':" #v ",'inputs':[" inputs "],'ops':[" ops "],'outputs':[" outputs "]}"
#define FRAG8(inputs, ops, outputs)   FRAG(8, inputs, ops, outputs)
#define T(id, dt, shape)              "{'id':" #id ",'dtype':'" dt "','shape':" shape "}"
/* the MoE decoder's gathered rows' gradient: 8192 bf16 rows of 1024 into 4096 tokens */
#define SRC                           T(0, "bf16", "[8192,1024]")
#define IDX                           T(1, "i64", "[8192]")
#define ADD(out, s, x)                "{'op':'index_add','out':" #out ",'args':[" #s "," #x "]}"
#define OUT                           T(2, "f32", "[4096,1024]")

static fm_fragment frag;

static void test_accepts(void) {
  static const char *const ok[] = {
      FRAG8(SRC "," IDX, ADD(2, 0, 1), OUT),
      /* the index first; src f32 with padded rows; an index read every other element */
      FRAG8(IDX ","
                "{'id':0,'dtype':'f32','shape':[8192,1000],'strides':[1024,1]}",
            ADD(2, 0, 1), T(2, "f32", "[4096,1000]")),
      FRAG8("{'id':0,'dtype':'f16','shape':[7,3],'strides':[1,7]},"
            "{'id':1,'dtype':'i64','shape':[7],'strides':[2]}",
            ADD(2, 0, 1), T(2, "f32", "[1,3]")),
  };
  fm_diag d = {{0}};
  for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
    int rc = tp_decode_json(ok[i], &frag, &d);
    if (rc) fprintf(stderr, "  accept %zu: %s\n", i, d.text);
    CHECK_EQ_INT(rc, FM_OK);
    CHECK(fm_fragment_is_scatter(&frag));
    CHECK_EQ_INT(frag.ops[0].dtype, FM_DT_F32);
  }
}

/* vocab 8 in the canonical bytes; a fragment without index_add keeps its own. */
static void test_canonical(void) {
  fm_diag d = {{0}};
  fm_fragment canon;
  CHECK_EQ_INT(tp_decode_json(FRAG8(SRC "," IDX, ADD(2, 0, 1), OUT), &frag, &d), FM_OK);
  CHECK_EQ_INT(fm_fragment_canonicalize(&frag, &canon), FM_OK);
  CHECK_EQ_INT(canon.vocab, 8);
  CHECK_EQ_INT(canon.inputs[1].dtype, FM_DT_I64);
  CHECK_EQ_INT(
      tp_decode_json(FRAG8(T(0, "f32", "[4]"), "{'op':'exp','out':1,'args':[0]}", T(1, "f32", "[4]")), &frag, &d),
      FM_OK);
  CHECK_EQ_INT(fm_fragment_canonicalize(&frag, &canon), FM_OK);
  CHECK_EQ_INT(canon.vocab, 1);
}

static const tp_reject rejects[] = {
    /* what a vocabulary-7 fragment (or daemon) says */
    {FRAG(7, SRC "," IDX, ADD(2, 0, 1), OUT), FM_ESCHEMA, "ops[0].op: 'index_add' needs vocab 8"},
    /* the index: its dtype, its length; i64 anywhere else */
    {FRAG8(SRC "," T(1, "f32", "[8192]"), ADD(2, 0, 1), OUT), FM_ESCHEMA,
     "ops[0].args[1]: 'index_add' takes an i64 index, value 1 is f32"},
    {FRAG8(SRC "," T(1, "i64", "[8191]"), ADD(2, 0, 1), OUT), FM_ESCHEMA,
     "inputs[1].shape: index_add's index is [M] = [8192], one row of src each"},
    {FRAG8(SRC "," T(1, "i64", "[8192,1]"), ADD(2, 0, 1), OUT), FM_ESCHEMA, "index_add's index is [M] = [8192]"},
    {FRAG8(T(0, "i64", "[8]") "," T(1, "f32", "[8]"), "{'op':'add','out':2,'args':[0,1]}", T(2, "f32", "[8]")),
     FM_ESCHEMA, "ops[0].args[0]: value 0 is i64, an index: only index_add's and take_rows' index reads one"},
    {FRAG8(T(0, "f32", "[8]"), "{'op':'cast','out':1,'args':[0],'dtype':'i64'}", T(1, "i64", "[8]")), FM_ESCHEMA,
     "ops[0].dtype: i64 is an index dtype; no value is cast to it"},
    {FRAG8(T(0, "i64", "[8]") "," T(1, "f32", "[8]"), "{'op':'exp','out':2,'args':[1]}", T(2, "f32", "[8]")),
     FM_ESCHEMA, "inputs[0].dtype: i64 is an index dtype: only index_add's and take_rows' index may be i64"},
    {FRAG8(T(0, "i64", "[8]"), "", T(0, "i64", "[8]")), FM_ESCHEMA,
     "outputs[0].dtype: i64 is an index dtype; no output stores one"},
    /* src: a float, the output's row length, rank 2 */
    {FRAG8(T(0, "bool", "[8192,1024]") "," IDX, ADD(2, 0, 1), OUT), FM_ESCHEMA,
     "ops[0].args[0]: 'index_add' adds floating-point rows, value 0 is bool"},
    {FRAG8(SRC "," IDX, ADD(2, 0, 1), T(2, "f32", "[4096,1000]")), FM_ESCHEMA,
     "outputs[0].shape: rows of 1000 where src's have 1024"},
    {FRAG8(T(0, "bf16", "[8192,2,512]") "," IDX, ADD(2, 0, 1), T(2, "f32", "[4096,2,512]")), FM_ESCHEMA,
     "index_add: src and the output are [M, D] and [R, D] (ranks 3 and 3)"},
    {FRAG8(SRC "," SRC, ADD(2, 0, 0), OUT), FM_ESCHEMA, "value 0 is already defined"},
    /* what the template does not take: the output's dtype or layout, symbolic sizes, other
       ops beside it, an operand that is no input */
    {FRAG8(SRC "," IDX, ADD(2, 0, 1) ",{'op':'cast','out':3,'args':[2],'dtype':'bf16'}", T(3, "bf16", "[4096,1024]")),
     FM_EUNSUPPORTED, "index_add runs alone: one op over two inputs (src, index) and one output (got 2 ops"},
    {FRAG8(SRC "," IDX, ADD(2, 0, 1), "{'id':2,'dtype':'f32','shape':[4096,1024],'strides':[1,4096]}"), FM_EUNSUPPORTED,
     "outputs[0].strides: index_add adds into a row-major [R, D] (strides [1024, 1])"},
    {FRAG8(T(0, "bf16", "[-1,1024]") "," T(1, "i64", "[-1]"), ADD(2, 0, 1), OUT), FM_EUNSUPPORTED,
     "index_add: static sizes only (no symbolic dim)"},
    {FRAG8(SRC "," IDX, "{'op':'neg','out':3,'args':[0]}," ADD(2, 3, 1), OUT), FM_EUNSUPPORTED,
     "ops[1].args[0]: 'index_add' reads fragment inputs only"},
    /* an absurd size is a limit before anything else */
    {FRAG8(T(0, "bf16", "[8192,4294967296]") "," IDX, ADD(2, 0, 1), OUT), FM_ELIMIT,
     "inputs[0].shape[1]: 4294967296 exceeds the limit of 2^31-1"},
};

static void test_rejections(void) { CHECK_EQ_INT(tp_check_rejects(rejects, sizeof rejects / sizeof *rejects), 0); }

/* A C-built fragment gets the same checks as a decoded one: an index retyped after decoding. */
static void test_validate_struct(void) {
  fm_diag d = {{0}};
  CHECK_EQ_INT(tp_decode_json(FRAG8(SRC "," IDX, ADD(2, 0, 1), OUT), &frag, &d), FM_OK);
  frag.inputs[1].dtype = FM_DT_F16;
  CHECK_EQ_INT(fm_fragment_validate(&frag, &d), FM_ESCHEMA);
  CHECK_STR_CONTAINS(d.text, "takes an i64 index, value 1 is f16");
  frag.inputs[1].dtype = FM_DT_I64;
  frag.outputs[0].dtype = FM_DT_BF16;
  CHECK(fm_fragment_validate(&frag, &d) != FM_OK);
}

int main(void) {
  RUN(test_accepts);
  RUN(test_canonical);
  RUN(test_rejections);
  RUN(test_validate_struct);
  return FM_TEST_DONE();
}
