/* test_protocol_integer.c: vocabulary 10 (integer values): what a fragment computing on i64
 * values accepts (a language model's label preparation: the ignore_index test, the range
 * check, the labels as f32 for the loss; a router's token numbers by floor_div), the result
 * dtypes, the canonical form (vocab 10 even without a vocab-10 op), and every refusal with its
 * error class and reason: a float or a fractional const meeting an i64 value, floor_div by
 * anything but a nonzero integer const, a float cast to i64, integer values beside a
 * reduction or a cat, what a vocab-9 fragment says. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fm_error.h"
#include "fm_fragment.h"
#include "fm_test.h"
#include "test_protocol_util.h"

#define FRAG(v, inputs, ops, outputs) "{'vocab':" #v ",'inputs':[" inputs "],'ops':[" ops "],'outputs':[" outputs "]}"
#define FRAG10(inputs, ops, outputs)  FRAG(10, inputs, ops, outputs)
#define T(id, dt, shape)              "{'id':" #id ",'dtype':'" dt "','shape':" shape "}"
#define OP2(name, out, a, b)          "{'op':'" name "','out':" #out ",'args':[" #a "," #b "]}"
#define CONST(out, v)                 "{'op':'const','out':" #out ",'value':" #v "}"
#define CAST(out, a, dt)              "{'op':'cast','out':" #out ",'args':[" #a "],'dtype':'" dt "'}"
/* the labels [8, 512] (a strided view of the padded [8, 513]) */
#define LABELS                        "{'id':0,'dtype':'i64','shape':[8,512],'strides':[513,1]}"
/* keep = labels != -100; ok = keep & 0 <= labels < 32000; y = where(keep, labels, 0) as f32 */
#define PREP                                                                                                        \
  CONST(1, -100)                                                                                                    \
  "," OP2("ne", 2, 0, 1) "," CONST(3, 0) "," OP2("ge", 4, 0, 3) "," CONST(5, 32000) "," OP2("lt", 6, 0, 5) "," OP2( \
      "mul", 7, 4, 6) "," CAST(8, 7, "bool") ",{'op':'where','out':9,'args':[2,0,3]}," CAST(10, 9, "f32")

static fm_fragment frag;

static void test_accepts(void) {
  static const char *const ok[] = {
      FRAG10(LABELS, PREP, T(2, "bool", "[8,512]") "," T(8, "bool", "[8,512]") "," T(10, "f32", "[8,512]")),
      /* a router's token numbers: floor_div by k, an i64 output; arithmetic with a bool */
      FRAG10(T(0, "i64", "[4096]") "," T(1, "bool", "[4096]"),
             CONST(2, 2) "," OP2("floor_div", 3, 0, 2) "," OP2("add", 4, 3, 1) ",{'op':'neg','out':5,'args':[4]}",
             T(3, "i64", "[4096]") "," T(5, "i64", "[4096]")),
      /* true division gives f32; maximum, abs; a bool cast to i64; an i64 stored as bf16 */
      FRAG10(T(0, "i64", "[64]") "," T(1, "i64", "[64]") "," T(2, "bool", "[64]"),
             OP2("div", 3, 0, 1) "," OP2("maximum", 4, 0, 1) ",{'op':'abs','out':5,'args':[4]}," CAST(
                 6, 2, "i64") "," OP2("sub", 7, 5, 6) "," CAST(8, 7, "bf16"),
             T(3, "f32", "[64]") "," T(8, "bf16", "[64]")),
  };
  fm_diag d = {{0}};
  for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
    int rc = tp_decode_json(ok[i], &frag, &d);
    if (rc) fprintf(stderr, "  accept %zu: %s\n", i, d.text);
    CHECK_EQ_INT(rc, FM_OK);
    CHECK(fm_fragment_has_integers(&frag));
    CHECK(!fm_fragment_is_extent(&frag) && !fm_fragment_is_rows(&frag));
  }
  CHECK_EQ_INT(tp_decode_json(ok[0], &frag, &d), FM_OK);
  CHECK_EQ_INT(frag.ops[1].dtype, FM_DT_BOOL); /* ne */
  CHECK_EQ_INT(frag.ops[6].dtype, FM_DT_F32);  /* two bools multiply as f32 (the protocol's promotion) */
  CHECK_EQ_INT(frag.ops[8].dtype, FM_DT_I64);  /* where of an i64 and an integer const */
  CHECK_EQ_INT(tp_decode_json(ok[1], &frag, &d), FM_OK);
  CHECK_EQ_INT(frag.ops[1].dtype, FM_DT_I64); /* floor_div */
  CHECK_EQ_INT(frag.ops[3].dtype, FM_DT_I64); /* neg */
  CHECK_EQ_INT(tp_decode_json(ok[2], &frag, &d), FM_OK);
  CHECK_EQ_INT(frag.ops[0].dtype, FM_DT_F32); /* true division */
  CHECK_EQ_INT(frag.ops[3].dtype, FM_DT_I64); /* a bool cast to i64 */
}

/* Vocab 10 in the canonical bytes, though no op is a vocab-10 op; float fragments keep theirs. */
static void test_canonical(void) {
  fm_diag d = {{0}};
  fm_fragment canon;
  CHECK_EQ_INT(
      tp_decode_json(FRAG10(LABELS, CONST(1, -100) "," OP2("ne", 2, 0, 1), T(2, "bool", "[8,512]")), &frag, &d), FM_OK);
  CHECK_EQ_INT(fm_fragment_canonicalize(&frag, &canon), FM_OK);
  CHECK_EQ_INT(canon.vocab, 10);
  CHECK_EQ_INT(canon.inputs[0].strides[0], 513);
  CHECK_EQ_INT(fm_fragment_validate(&canon, &d), FM_OK);
  CHECK_EQ_INT(
      tp_decode_json(FRAG10(T(0, "f32", "[8]"), CONST(1, 2) "," OP2("mul", 2, 0, 1), T(2, "f32", "[8]")), &frag, &d),
      FM_OK);
  CHECK_EQ_INT(fm_fragment_canonicalize(&frag, &canon), FM_OK);
  CHECK_EQ_INT(canon.vocab, 1);
}

static const tp_reject rejects[] = {
    /* what a vocabulary-9 fragment (or daemon) says */
    {FRAG(9, LABELS, CONST(1, -100) "," OP2("ne", 2, 0, 1), T(2, "bool", "[8,512]")), FM_ESCHEMA,
     "ops[1].args[0]: value 0 is i64, an index"},
    {FRAG(9, T(0, "bool", "[8]"), CAST(1, 0, "i64"), T(1, "i64", "[8]")), FM_ESCHEMA,
     "ops[0].dtype: i64 is an index dtype; no value is cast to it before vocab 10"},
    /* a float value or a fractional (or too large) const meeting an i64 value */
    {FRAG10(LABELS "," T(1, "f32", "[8,512]"), OP2("add", 2, 0, 1), T(2, "f32", "[8,512]")), FM_ESCHEMA,
     "ops[0].args[1]: 'add' mixes an i64 value with value 1, which is f32 (cast the i64 value to f32 first"},
    {FRAG10(LABELS, CONST(1, 0.5) "," OP2("lt", 2, 0, 1), T(2, "bool", "[8,512]")), FM_ESCHEMA,
     "ops[1].args[1]: 'lt' of an i64 value and the const 0.5: an integer const of magnitude at most 2^24"},
    {FRAG10(LABELS, CONST(1, 33554432) "," OP2("lt", 2, 0, 1), T(2, "bool", "[8,512]")), FM_ESCHEMA,
     "'lt' of an i64 value and the const 3.35544e+07"},
    {FRAG10(LABELS "," T(1, "bf16", "[8,512]"), "{'op':'where','out':3,'args':[2,0,1]}," OP2("ne", 2, 0, 0),
            T(3, "i64", "[8,512]")),
     FM_ESCHEMA, "value 2 is not defined before use"},
    {FRAG10(LABELS "," T(1, "bf16", "[8,512]"), OP2("ne", 2, 0, 0) ",{'op':'where','out':3,'args':[2,0,1]}",
            T(3, "i64", "[8,512]")),
     FM_ESCHEMA, "ops[1].args[2]: 'where' mixes an i64 value with value 1, which is bf16"},
    /* floor_div: of an i64 value, by a nonzero integer const */
    {FRAG10(LABELS, CONST(1, 0) "," OP2("floor_div", 2, 0, 1), T(2, "i64", "[8,512]")), FM_ESCHEMA,
     "ops[1].args[1]: floor_div divides by a nonzero integer const"},
    {FRAG10(LABELS "," T(1, "i64", "[8,512]"), OP2("floor_div", 2, 0, 1), T(2, "i64", "[8,512]")), FM_ESCHEMA,
     "ops[0].args[1]: floor_div divides by a nonzero integer const"},
    {FRAG10(T(0, "f32", "[8]"), CONST(1, 2) "," OP2("floor_div", 2, 0, 1), T(2, "f32", "[8]")), FM_ESCHEMA,
     "ops[1].args[0]: floor_div divides an i64 value, value 0 is f32"},
    {FRAG(9, T(0, "i64", "[8]"), CONST(1, 2) "," OP2("floor_div", 2, 0, 1), T(2, "i64", "[8]")), FM_ESCHEMA,
     "ops[1].op: 'floor_div' needs vocab 10 (the fragment says vocab 9)"},
    /* casts: a float is not truncated to i64; unary float ops and pow refuse i64 */
    {FRAG10(T(0, "f32", "[8]"), CAST(1, 0, "i64"), T(1, "i64", "[8]")), FM_ESCHEMA,
     "ops[0].args[0]: a cast to i64 takes a bool or an i64 value"},
    {FRAG10(T(0, "i64", "[8]"), "{'op':'exp','out':1,'args':[0]}", T(1, "f32", "[8]")), FM_ESCHEMA,
     "ops[0].args[0]: 'exp' needs a floating-point operand, value 0 is i64"},
    {FRAG10(T(0, "i64", "[8]"), CONST(1, 2) "," OP2("pow", 2, 0, 1), T(2, "i64", "[8]")), FM_ESCHEMA,
     "ops[1].args[0]: pow of an i64 value"},
    /* an output's dtype is its value's */
    {FRAG10(T(0, "i64", "[8]"), CAST(1, 0, "f32"), T(1, "i64", "[8]")), FM_ESCHEMA,
     "outputs[0].dtype: i64 does not match value 1, which is f32"},
    /* pointwise fragments only */
    {FRAG10(T(0, "i64", "[8,16]"), CAST(1, 0, "f32") ",{'op':'sum','out':2,'args':[1],'dim':-1}", T(2, "f32", "[8,1]")),
     FM_EUNSUPPORTED, "integer values run in a pointwise fragment only"},
    {FRAG10(T(0, "i64", "[8,16]") "," T(1, "i64", "[8,16]"), "{'op':'cat','out':2,'args':[0,1],'dim':1}",
            T(2, "i64", "[8,32]")),
     FM_EUNSUPPORTED, "integer values run in a pointwise fragment only"},
};

static void test_rejections(void) { CHECK_EQ_INT(tp_check_rejects(rejects, sizeof rejects / sizeof *rejects), 0); }

/* A C-built fragment gets the same checks: a const retyped after decoding. */
static void test_validate_struct(void) {
  fm_diag d = {{0}};
  CHECK_EQ_INT(
      tp_decode_json(FRAG10(LABELS, CONST(1, -100) "," OP2("ne", 2, 0, 1), T(2, "bool", "[8,512]")), &frag, &d), FM_OK);
  frag.ops[0].value = -100.25;
  CHECK_EQ_INT(fm_fragment_validate(&frag, &d), FM_ESCHEMA);
  CHECK_STR_CONTAINS(d.text, "an integer const of magnitude at most 2^24");
}

int main(void) {
  RUN(test_accepts);
  RUN(test_canonical);
  RUN(test_rejections);
  RUN(test_validate_struct);
  return FM_TEST_DONE();
}
