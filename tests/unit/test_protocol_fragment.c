/* test_protocol_fragment.c: fragment decoding and every validation rule, accepted and
 * refused, with the error code and where the diag says the problem is. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fm_error.h"
#include "fm_fragment.h"
#include "fm_msg.h"
#include "fm_test.h"
#include "test_protocol_util.h"

#define FRAG(inputs, ops, outputs) "{'vocab':1,'inputs':[" inputs "],'ops':[" ops "],'outputs':[" outputs "]}"
#define T(id, dt, shape)           "{'id':" #id ",'dtype':'" dt "','shape':" shape "}"
#define X16                        T(0, "f16", "[4,8]")

static fm_fragment frag; /* large: keep it off the stack */

static void test_op_and_dtype_tables(void) {
  for (int i = 0; i < FM_OP__COUNT; i++) {
    const char *name = fm_op_name((fm_op)i);
    fm_op op;
    CHECK_EQ_INT(fm_op_parse(name, strlen(name), &op), FM_OK);
    CHECK_EQ_INT(op, i);
    int arity = fm_op_arity(op);
    CHECK(arity >= -1 && (arity <= 3 || fm_op_kind(op) == FM_OPK_CAT));
    CHECK((arity == -1) == (fm_op_kind(op) == FM_OPK_RESERVED));
  }
  fm_op op;
  CHECK_EQ_INT(fm_op_parse("ad", 2, &op), FM_EUNKNOWN_OP);
  CHECK_EQ_INT(fm_op_parse("addx", 4, &op), FM_EUNKNOWN_OP);
  CHECK_EQ_INT(fm_op_arity(FM_OP_WHERE), 3);
  CHECK_EQ_INT(fm_op_arity(FM_OP_CONST), 0);
  CHECK_EQ_INT(fm_op_arity(FM_OP_POW), 2);
  CHECK_EQ_INT(fm_op_arity(FM_OP_MM), 2);
  CHECK_EQ_INT(fm_op_arity(FM_OP_ADDMM), 3);
  CHECK_EQ_INT(fm_op_arity(FM_OP_BMM), 2);
  fm_dtype dt;
  CHECK_EQ_INT(fm_dtype_parse("bf16", 4, &dt), FM_OK);
  CHECK_EQ_INT(dt, FM_DT_BF16);
  CHECK_EQ_INT(fm_dtype_size(FM_DT_BF16), 2);
  CHECK_EQ_INT(fm_dtype_size(FM_DT_F32), 4);
  CHECK_EQ_INT(fm_dtype_size(FM_DT_BOOL), 1);
  CHECK_EQ_INT(fm_dtype_parse("f64", 3, &dt), FM_ESCHEMA);
  CHECK(strcmp(fm_dtype_name(FM_DT_F16), "f16") == 0);
}

static int ok_json(const char *src) {
  fm_diag d = {{0}};
  int rc = tp_decode_json(src, &frag, &d);
  if (rc) fprintf(stderr, "  unexpected refusal (%s): %s\n", fm_err_slug(rc), d.text);
  return rc == FM_OK;
}

static void test_accept_chain_and_defaults(void) {
  CHECK(ok_json(FRAG(T(0, "f16", "[-1,4,8]"),
                     "{'op':'gelu','out':1,'args':[0]},"
                     "{'op':'const','out':2,'value':0.5},"
                     "{'op':'mul','out':3,'args':[1,2]}",
                     T(3, "f16", "[-1,4,8]"))));
  CHECK_EQ_INT(frag.n_inputs, 1);
  CHECK_EQ_INT(frag.n_ops, 3);
  CHECK_EQ_INT(frag.inputs[0].align, 16);
  /* contiguous row-major, dim 0's stride the product of the others though it is symbolic */
  CHECK(frag.inputs[0].strides[0] == 32 && frag.inputs[0].strides[1] == 8 && frag.inputs[0].strides[2] == 1);
  CHECK(frag.ops[1].value == 0.5);
  CHECK_EQ_INT(frag.ops[0].dtype, FM_DT_F16);
  CHECK_EQ_INT(frag.ops[2].dtype, FM_DT_F16); /* a const does not promote */
  CHECK(fm_fragment_is_symbolic(&frag));

  /* an integer value is a number too; +inf is a valid constant */
  CHECK(ok_json(
      FRAG(X16, "{'op':'const','out':1,'value':2,'args':[]},{'op':'pow','out':2,'args':[0,1]}", T(2, "f16", "[4,8]"))));
  CHECK(frag.ops[0].value == 2.0);
  CHECK(!fm_fragment_is_symbolic(&frag));
  /* +-inf is a valid constant (JSON cannot spell it: go through the packed form) */
  CHECK(ok_json(
      FRAG(X16, "{'op':'const','out':1,'value':1},{'op':'minimum','out':2,'args':[0,1]}", T(2, "f16", "[4,8]"))));
  static fm_fragment g;
  g = frag;
  g.ops[0].value = -INFINITY;
  msgpack_sbuffer sb;
  fm_diag d = {{0}};
  CHECK_EQ_INT(tp_pack_fragment(&g, &sb), FM_OK);
  CHECK_EQ_INT(tp_decode_mp(sb.data, sb.size, &frag, &d), FM_OK);
  CHECK(isinf(frag.ops[0].value) && frag.ops[0].value < 0);
  msgpack_sbuffer_destroy(&sb);
}

static void test_accept_shapes(void) {
  /* broadcast bias over a symbolic dim, explicit strides and alignment */
  CHECK(ok_json(
      FRAG("{'id':7,'dtype':'bf16','shape':[-1,768],'strides':[768,1],'align':256},"
           "{'id':3,'dtype':'bf16','shape':[1,768],'align':2}",
           "{'op':'add','out':9,'args':[7,3]}", "{'id':9,'dtype':'bf16','shape':[-1,768],'strides':[1024,1]}")));
  CHECK_EQ_INT(frag.inputs[0].align, 256);
  CHECK_EQ_INT(frag.outputs[0].strides[0], 1024);
  /* a transposed input; an output that copies an input; rank 0 */
  CHECK(ok_json(
      FRAG("{'id':0,'dtype':'f32','shape':[4,8],'strides':[1,4]}", "", "{'id':0,'dtype':'f32','shape':[4,8]}")));
  CHECK(ok_json(FRAG(T(0, "f32", "[]"), "{'op':'exp','out':1,'args':[0]}", T(1, "f32", "[]"))));
  CHECK_EQ_INT(frag.inputs[0].rank, 0);
  /* a fragment of constants only, with two outputs of the same value */
  CHECK(ok_json(FRAG("", "{'op':'const','out':0,'value':1}", T(0, "f32", "[2]") "," T(0, "f32", "[2]"))));
  /* outputs with a permuted dense layout do not overlap */
  CHECK(ok_json(FRAG(X16, "", "{'id':0,'dtype':'f16','shape':[4,8],'strides':[1,4]}")));
}

/* Result dtypes follow PyTorch's promotion (fm_fragment.h). */
static void test_dtype_inference(void) {
  CHECK(ok_json(FRAG(T(0, "bf16", "[4]") "," T(1, "f16", "[4]") "," T(2, "bool", "[4]") "," T(3, "f32", "[4]"),
                     "{'op':'add','out':10,'args':[0,1]},"     /* bf16+f16 -> f32 */
                     "{'op':'mul','out':11,'args':[0,0]},"     /* bf16 */
                     "{'op':'sub','out':12,'args':[2,1]},"     /* bool+f16 -> f16 */
                     "{'op':'maximum','out':13,'args':[2,2]}," /* bool+bool -> f32 */
                     "{'op':'const','out':14,'value':3},"
                     "{'op':'div','out':15,'args':[14,14]},"     /* const+const -> f32 */
                     "{'op':'add','out':16,'args':[2,14]},"      /* bool+const -> f32 */
                     "{'op':'gt','out':17,'args':[0,14]},"       /* bool */
                     "{'op':'where','out':18,'args':[17,0,14]}," /* bf16 */
                     "{'op':'cast','out':19,'args':[3],'dtype':'f16'},"
                     "{'op':'pow','out':20,'args':[1,14]}," /* f16 */
                     "{'op':'neg','out':21,'args':[14]},"   /* f32 */
                     "{'op':'add','out':22,'args':[1,3]}",  /* f16+f32 -> f32 */
                     T(22, "f32", "[4]"))));
  static const fm_dtype want[] = {FM_DT_F32,  FM_DT_BF16, FM_DT_F16, FM_DT_F32, FM_DT_F32, FM_DT_F32, FM_DT_F32,
                                  FM_DT_BOOL, FM_DT_BF16, FM_DT_F16, FM_DT_F16, FM_DT_F32, FM_DT_F32};
  for (uint32_t i = 0; i < frag.n_ops; i++) {
    if (i == 4) continue; /* the const */
    if (frag.ops[i].dtype != want[i]) fprintf(stderr, "  ops[%u] dtype %s\n", i, fm_dtype_name(frag.ops[i].dtype));
    CHECK_EQ_INT(frag.ops[i].dtype, want[i]);
  }
}

static const tp_reject rejects[] = {
    /* structure */
    {"[1,2]", FM_ESCHEMA, "must be a map"},
    {"{'vocab':1,'inputs':[],'ops':[],'outputs':[],'vocabulary':1}", FM_ESCHEMA, "fragment: unknown key 'vocabulary'"},
    {"{'vocab':1,'inputs':[],'outputs':[]}", FM_ESCHEMA, "missing key 'ops'"},
    {"{'vocab':12,'inputs':[],'ops':[{'op':'fancy','out':1}],'outputs':[]}", FM_ESCHEMA,
     "vocab 12 not supported, this daemon speaks 1 to 11"},
    {"{'vocab':'1','inputs':[],'ops':[],'outputs':[]}", FM_ESCHEMA, "vocab: expected an integer"},
    {"{'vocab':1,'inputs':{},'ops':[],'outputs':[]}", FM_ESCHEMA, "inputs: expected an array"},
    {FRAG(X16, "", ""), FM_ESCHEMA, "outputs: at least one output"},
    /* tensors */
    {FRAG("{'id':0,'dtype':'f16','shape':[4,8],'stride':[8,1]}", "", X16), FM_ESCHEMA,
     "inputs[0]: unknown key 'stride'"},
    {FRAG("{'id':0,'shape':[4,8]}", "", X16), FM_ESCHEMA, "inputs[0]: missing key 'dtype'"},
    {FRAG(T(16777216, "f16", "[4,8]"), "", X16), FM_ELIMIT, "inputs[0].id: value id 16777216 exceeds"},
    {FRAG(T(-1, "f16", "[4,8]"), "", X16), FM_ESCHEMA, "inputs[0].id: expected a non-negative integer"},
    {FRAG(T(0, "f64", "[4,8]"), "", X16), FM_ESCHEMA, "inputs[0].dtype: unknown dtype 'f64'"},
    {FRAG("{'id':0,'dtype':16,'shape':[4,8]}", "", X16), FM_ESCHEMA, "inputs[0].dtype: expected a dtype name"},
    {FRAG(T(0, "f16", "[1,1,1,1,1,1,1,1,1]"), "", X16), FM_ELIMIT, "inputs[0].shape: rank 9 exceeds the limit of 8"},
    {FRAG(X16, "", T(0, "f16", "[0,8]")), FM_ESCHEMA, "outputs[0].shape[0]: 0 is not a size"},
    {FRAG(T(0, "f16", "[4,-2]"), "", X16), FM_ESCHEMA, "inputs[0].shape[1]: -2 is not a size"},
    {FRAG(T(0, "f16", "[4,-1]"), "", X16), FM_ESCHEMA, "inputs[0].shape[1]: only dim 0 may be symbolic"},
    {FRAG(T(0, "f16", "[-1,-1]"), "", T(0, "f16", "[-1,-1]")), FM_ESCHEMA,
     "inputs[0].shape[1]: only dim 0 may be symbolic"},
    {FRAG(T(0, "f16", "[2147483648]"), "", T(0, "f16", "[2147483648]")), FM_ELIMIT,
     "inputs[0].shape[0]: 2147483648 exceeds"},
    {FRAG(T(0, "f16", "[2097152,2097152]"), "", T(0, "f16", "[2097152,2097152]")), FM_ELIMIT,
     "more than 2^40 elements"},
    {FRAG(T(0, "f16", "[4.0,8]"), "", X16), FM_ESCHEMA, "inputs[0].shape[0]: expected an integer, got a float"},
    {FRAG("{'id':0,'dtype':'f16','shape':[4,8],'strides':[1]}", "", X16), FM_ESCHEMA,
     "inputs[0].strides: 1 entries for a shape of rank 2"},
    {FRAG("{'id':0,'dtype':'f16','shape':[4,8],'strides':[-8,1]}", "", X16), FM_ESCHEMA,
     "inputs[0].strides[0]: negative strides"},
    {FRAG("{'id':0,'dtype':'f16','shape':[4,8],'strides':[1099511627777,1]}", "", X16), FM_ELIMIT,
     "inputs[0].strides[0]: 1099511627777 exceeds"},
    {FRAG("{'id':0,'dtype':'f16','shape':[1048576,2],'strides':[1099511627776,1]}", "", T(0, "f16", "[1048576,2]")),
     FM_ELIMIT, "inputs[0].strides: the layout spans more than 2^40"},
    {FRAG("{'id':0,'dtype':'f16','shape':[4,8],'align':3}", "", X16), FM_ESCHEMA,
     "inputs[0].align: 3 is not a power of two"},
    {FRAG("{'id':0,'dtype':'f16','shape':[4,8],'align':0}", "", X16), FM_ESCHEMA,
     "inputs[0].align: 0 is not a power of two"},
    {FRAG("{'id':0,'dtype':'f16','shape':[4,8],'align':512}", "", X16), FM_ESCHEMA,
     "inputs[0].align: 512 is not a power of two"},
    {FRAG("{'id':0,'dtype':'f32','shape':[4,8],'align':2}", "", T(0, "f32", "[4,8]")), FM_ESCHEMA,
     "inputs[0].align: 2 is less than the 4-byte size of f32"},
    {FRAG(X16 "," X16, "", X16), FM_ESCHEMA, "inputs[1].id: value 0 is already defined by inputs[0]"},
    /* ops */
    {FRAG(X16, "{'op':'foo','out':1,'args':[0]}", X16), FM_EUNKNOWN_OP, "ops[0].op: unknown op 'foo'"},
    {FRAG(X16, "{'op':'relu','out':1,'args':[0]},{'op':'bmm','out':2,'args':[0,1]}", X16), FM_ESCHEMA,
     "ops[1].op: 'bmm' needs vocab 4 (the fragment says vocab 1)"},
    {FRAG(X16, "{'op':'softmax','out':1,'args':[0]}", X16), FM_ESCHEMA,
     "'softmax' needs vocab 2 (the fragment says vocab 1)"},
    {FRAG(X16, "{'op':7,'out':1,'args':[0]}", X16), FM_ESCHEMA, "ops[0].op: expected an op name"},
    {FRAG(X16, "{'op':'relu','args':[0]}", X16), FM_ESCHEMA, "ops[0]: missing key 'out'"},
    {FRAG(X16, "{'op':'relu','out':1,'arg':[0]}", X16), FM_ESCHEMA, "ops[0]: unknown key 'arg'"},
    {FRAG(X16, "{'op':'add','out':1,'args':[0]}", X16), FM_ESCHEMA, "ops[0].args: 'add' takes 2 args, got 1"},
    {FRAG(X16, "{'op':'where','out':1,'args':[0,0,0,0]}", X16), FM_ESCHEMA, "ops[0].args: 'where' takes 3 args, got 4"},
    {FRAG(X16, "{'op':'relu','out':1,'args':0}", X16), FM_ESCHEMA, "ops[0].args: expected an array"},
    {FRAG(X16, "{'op':'relu','out':1,'args':[0]},{'op':'add','out':2,'args':[1,9]}", T(2, "f16", "[4,8]")), FM_ESCHEMA,
     "ops[1].args[1]: value 9 is not defined before use"},
    {FRAG(X16, "{'op':'add','out':1,'args':[0,2]},{'op':'relu','out':2,'args':[0]}", T(1, "f16", "[4,8]")), FM_ESCHEMA,
     "ops[0].args[1]: value 2 is not defined before use"},
    {FRAG(X16, "{'op':'relu','out':1,'args':[1]}", T(1, "f16", "[4,8]")), FM_ESCHEMA,
     "ops[0].args[0]: value 1 is not defined before use"},
    {FRAG(X16, "{'op':'relu','out':0,'args':[0]}", X16), FM_ESCHEMA,
     "ops[0].out: value 0 is already defined by inputs[0]"},
    {FRAG(X16, "{'op':'relu','out':1,'args':[0]},{'op':'neg','out':1,'args':[0]}", T(1, "f16", "[4,8]")), FM_ESCHEMA,
     "ops[1].out: value 1 is already defined by ops[0]"},
    {FRAG(X16, "{'op':'relu','out':16777216,'args':[0]}", X16), FM_ELIMIT, "ops[0].out: value id 16777216 exceeds"},
    {FRAG(X16, "{'op':'relu','out':1,'args':[0],'value':1.0}", X16), FM_ESCHEMA,
     "ops[0].value: only const takes a value"},
    {FRAG(X16, "{'op':'const','out':1}", X16), FM_ESCHEMA, "ops[0]: const needs a 'value'"},
    {FRAG(X16, "{'op':'const','out':1,'value':'1'}", X16), FM_ESCHEMA, "ops[0].value: expected a number"},
    {FRAG(X16, "{'op':'const','out':1,'args':[0],'value':1}", X16), FM_ESCHEMA,
     "ops[0].args: 'const' takes 0 args, got 1"},
    {FRAG(X16, "{'op':'relu','out':1,'args':[0],'dtype':'f16'}", X16), FM_ESCHEMA,
     "ops[0].dtype: only cast and iota take a dtype"},
    {FRAG(X16, "{'op':'cast','out':1,'args':[0]}", X16), FM_ESCHEMA, "ops[0]: cast needs a 'dtype'"},
    {FRAG(X16, "{'op':'cast','out':1,'args':[0],'dtype':'int8'}", X16), FM_ESCHEMA,
     "ops[0].dtype: unknown dtype 'int8'"},
    {FRAG(X16 "," T(1, "f16", "[4,8]"), "{'op':'pow','out':2,'args':[0,1]}", T(2, "f16", "[4,8]")), FM_ESCHEMA,
     "ops[0].args[1]: pow's exponent must be a const value"},
    {FRAG(X16, "{'op':'where','out':1,'args':[0,0,0]}", X16), FM_ESCHEMA,
     "ops[0].args[0]: where's condition must be bool, value 0 is f16"},
    {FRAG(X16, "{'op':'const','out':1,'value':1},{'op':'where','out':2,'args':[1,0,0]}", X16), FM_ESCHEMA,
     "ops[1].args[0]: where's condition must be bool, value 1 is a const"},
    {FRAG(T(0, "bool", "[4,8]"), "{'op':'exp','out':1,'args':[0]}", T(1, "f32", "[4,8]")), FM_ESCHEMA,
     "ops[0].args[0]: 'exp' needs a floating-point operand, value 0 is bool"},
    /* outputs */
    {FRAG(X16, "{'op':'relu','out':1,'args':[0]}", T(9, "f16", "[4,8]")), FM_ESCHEMA,
     "outputs[0].id: value 9 is not defined"},
    {FRAG(
         X16,
         "{'op':'const','out':1,'value':2},{'op':'mul','out':2,'args':[0,1]},{'op':'cast','out':3,'args':[2],'dtype':'f32'}",
         T(3, "f16", "[4,8]")),
     FM_ESCHEMA, "outputs[0].dtype: f16 does not match value 3, which is f32"},
    {FRAG(T(0, "bf16", "[4,8]") "," T(1, "f16", "[4,8]"), "{'op':'add','out':2,'args':[0,1]}", T(2, "bf16", "[4,8]")),
     FM_ESCHEMA, "outputs[0].dtype: bf16 does not match value 2, which is f32 (add a cast)"},
    {FRAG(X16, "", X16 "," T(0, "f16", "[4,4]")), FM_ESCHEMA,
     "outputs[1].shape: [4, 4] differs from the iteration shape [4, 8] (outputs[0])"},
    /* shapes */
    {FRAG(T(0, "f16", "[8]"), "", T(0, "f16", "[4,8]")), FM_ESCHEMA,
     "inputs[0].shape: rank 1 differs from the iteration rank 2"},
    {FRAG(T(0, "f16", "[4,7]"), "", T(0, "f16", "[4,8]")), FM_ESCHEMA, "inputs[0].shape[1]: 7 does not broadcast to 8"},
    {FRAG(T(0, "f16", "[-1,8]"), "", T(0, "f16", "[4,8]")), FM_ESCHEMA,
     "inputs[0].shape[0]: symbolic, but the iteration dim is static (4)"},
    {FRAG(T(0, "f16", "[4,8]"), "", T(0, "f16", "[-1,8]")), FM_ESCHEMA,
     "inputs[0].shape[0]: 4 must be -1 (symbolic) or 1 (broadcast)"},
    {FRAG(X16, "", "{'id':0,'dtype':'f16','shape':[4,8],'strides':[8,0]}"), FM_ESCHEMA,
     "outputs[0].strides: elements would overlap"},
    {FRAG(X16, "", "{'id':0,'dtype':'f16','shape':[4,8],'strides':[4,1]}"), FM_ESCHEMA,
     "outputs[0].strides: elements would overlap"},
    {FRAG(T(0, "f16", "[-1,8]"), "", "{'id':0,'dtype':'f16','shape':[-1,8],'strides':[1,8]}"), FM_ESCHEMA,
     "outputs[0].strides[0]: the symbolic dim must have the largest stride"},
};

static void test_rejections(void) { CHECK_EQ_INT(tp_check_rejects(rejects, sizeof rejects / sizeof *rejects), 0); }

/* Builds {vocab, inputs: [n_in], ops: [n_ops relu chain], outputs: [n_out]} as JSON. */
static char *big_fragment(int n_in, int n_ops, int n_out) {
  size_t cap = 64 + (size_t)(n_in + n_out) * 64 + (size_t)n_ops * 64;
  char *s = malloc(cap);
  size_t k = (size_t)snprintf(s, cap, "{'vocab':1,'inputs':[");
  for (int i = 0; i < n_in; i++)
    k += (size_t)snprintf(s + k, cap - k, "%s{'id':%d,'dtype':'f32','shape':[4]}", i ? "," : "", i);
  k += (size_t)snprintf(s + k, cap - k, "],'ops':[");
  for (int i = 0; i < n_ops; i++)
    k += (size_t)snprintf(s + k, cap - k, "%s{'op':'relu','out':%d,'args':[%d]}", i ? "," : "", 1000 + i,
                          i ? 999 + i : 0);
  k += (size_t)snprintf(s + k, cap - k, "],'outputs':[");
  int last = n_ops ? 999 + n_ops : 0;
  for (int i = 0; i < n_out; i++)
    k += (size_t)snprintf(s + k, cap - k, "%s{'id':%d,'dtype':'f32','shape':[4]}", i ? "," : "", last);
  snprintf(s + k, cap - k, "]}");
  return s;
}

static void expect_count(int n_in, int n_ops, int n_out, int rc_want, const char *diag) {
  char *s = big_fragment(n_in, n_ops, n_out);
  fm_diag d = {{0}};
  int rc = tp_decode_json(s, &frag, &d);
  if (rc != rc_want) fprintf(stderr, "  %d/%d/%d: %s\n", n_in, n_ops, n_out, d.text);
  CHECK_EQ_INT(rc, rc_want);
  if (diag) CHECK_STR_CONTAINS(d.text, diag);
  free(s);
}

static void test_count_limits(void) {
  expect_count(FM_MAX_INPUTS, FM_MAX_OPS, FM_MAX_OUTPUTS, FM_OK, NULL);
  expect_count(FM_MAX_INPUTS + 1, 1, 1, FM_ELIMIT, "inputs: 33 inputs exceed the limit of 32");
  expect_count(1, FM_MAX_OPS + 1, 1, FM_ELIMIT, "ops: 257 ops exceed the limit of 256");
  expect_count(1, 1, FM_MAX_OUTPUTS + 1, FM_ELIMIT, "outputs: 17 outputs exceed the limit of 16");
}

/* Rules only a C-built fragment (or a packed one) can break. */
static void test_validate_struct(void) {
  CHECK(ok_json(FRAG(X16, "{'op':'const','out':1,'value':2},{'op':'mul','out':2,'args':[0,1]}", T(2, "f16", "[4,8]"))));
  static fm_fragment g;
  fm_diag d = {{0}};

  g = frag;
  g.ops[0].value = NAN;
  CHECK_EQ_INT(fm_fragment_validate(&g, &d), FM_ESCHEMA);
  CHECK_STR_CONTAINS(d.text, "ops[0].value: NaN is not a valid constant");
  /* the same NaN through the wire: packed as float64, refused by decode */
  msgpack_sbuffer sb;
  CHECK_EQ_INT(tp_pack_fragment(&g, &sb), FM_OK);
  CHECK_EQ_INT(tp_decode_mp(sb.data, sb.size, &frag, &d), FM_ESCHEMA);
  CHECK_STR_CONTAINS(d.text, "NaN");
  msgpack_sbuffer_destroy(&sb);

  CHECK(ok_json(FRAG(X16, "{'op':'const','out':1,'value':2},{'op':'mul','out':2,'args':[0,1]}", T(2, "f16", "[4,8]"))));
  g = frag;
  g.ops[1].op = FM_OP__COUNT;
  CHECK_EQ_INT(fm_fragment_validate(&g, &d), FM_EUNKNOWN_OP);
  g = frag;
  g.ops[1].op = FM_OP_BMM;
  CHECK_EQ_INT(fm_fragment_validate(&g, &d), FM_ESCHEMA);
  CHECK_STR_CONTAINS(d.text, "ops[1].op: 'bmm' needs vocab 4");
  g = frag;
  g.ops[1].nargs = 3;
  CHECK_EQ_INT(fm_fragment_validate(&g, &d), FM_ESCHEMA);
  g = frag;
  g.vocab = 12;
  CHECK_EQ_INT(fm_fragment_validate(&g, &d), FM_ESCHEMA);
  CHECK_STR_CONTAINS(d.text, "vocab 12 not supported, this daemon speaks 1 to 11");
  g = frag;
  g.inputs[0].dtype = FM_DT__COUNT;
  CHECK_EQ_INT(fm_fragment_validate(&g, &d), FM_ESCHEMA);
  g = frag;
  g.inputs[0].rank = 9;
  CHECK_EQ_INT(fm_fragment_validate(&g, &d), FM_ELIMIT);
  g = frag;
  g.n_ops = FM_MAX_OPS + 1;
  CHECK_EQ_INT(fm_fragment_validate(&g, &d), FM_ELIMIT);
  g = frag;
  g.n_outputs = 0;
  CHECK_EQ_INT(fm_fragment_validate(&g, &d), FM_ESCHEMA);
  g = frag;
  g.inputs[0].id = FM_MAX_VALUE_ID + 1;
  CHECK_EQ_INT(fm_fragment_validate(&g, &d), FM_ELIMIT);
  /* validation is repeatable: the original still passes */
  CHECK_EQ_INT(fm_fragment_validate(&frag, &d), FM_OK);
}

/* A key given twice is ambiguous (JSON parsers keep one, msgpack keeps both): refused. */
static void test_duplicate_key(void) {
  msgpack_sbuffer sb;
  msgpack_packer pk;
  msgpack_sbuffer_init(&sb);
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, 5);
  fm_pack_kv_u64(&pk, "vocab", 1);
  fm_pack_cstr(&pk, "inputs");
  msgpack_pack_array(&pk, 0);
  fm_pack_cstr(&pk, "ops");
  msgpack_pack_array(&pk, 0);
  fm_pack_cstr(&pk, "outputs");
  msgpack_pack_array(&pk, 0);
  fm_pack_kv_u64(&pk, "vocab", 1);
  fm_diag d = {{0}};
  CHECK_EQ_INT(tp_decode_mp(sb.data, sb.size, &frag, &d), FM_ESCHEMA);
  CHECK_STR_CONTAINS(d.text, "fragment: key 'vocab' appears twice");
  msgpack_sbuffer_destroy(&sb);

  /* and a non-str key */
  msgpack_sbuffer_init(&sb);
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, 1);
  msgpack_pack_int(&pk, 1);
  msgpack_pack_int(&pk, 1);
  CHECK_EQ_INT(tp_decode_mp(sb.data, sb.size, &frag, &d), FM_ESCHEMA);
  CHECK_STR_CONTAINS(d.text, "fragment: keys must be str");
  msgpack_sbuffer_destroy(&sb);
}

/* Hostile strings in a diag are shown safely and bounded. */
static void test_diag_sanitized(void) {
  fm_diag d = {{0}};
  CHECK_EQ_INT(
      tp_decode_json(
          FRAG(X16, "{'op':'\\u0001\\u00e9xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx','out':1}", X16),
          &frag, &d),
      FM_EUNKNOWN_OP);
  CHECK_STR_CONTAINS(d.text, "unknown op '???xxx");
  CHECK_STR_CONTAINS(d.text, "...'");
  for (const char *p = d.text; *p; p++) CHECK((unsigned char)*p >= 0x20 && (unsigned char)*p < 0x7f);
}

int main(void) {
  RUN(test_op_and_dtype_tables);
  RUN(test_accept_chain_and_defaults);
  RUN(test_accept_shapes);
  RUN(test_dtype_inference);
  RUN(test_rejections);
  RUN(test_count_limits);
  RUN(test_validate_struct);
  RUN(test_duplicate_key);
  RUN(test_diag_sanitized);
  return FM_TEST_DONE();
}
