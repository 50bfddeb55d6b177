/* test_codegen_rows_frag.c: the row fragments of the rows template's tests. */
#include "test_codegen_rows_frag.h"

#include <stdio.h>
#include <string.h>

#include "test_codegen_frag.h"

const char *const rf_name[RF_N_FRAGMENTS] = {"rows_layer_norm_bf16",
                                             "rows_rms_norm_residual",
                                             "rows_softmax_f32",
                                             "rows_stats_f16",
                                             "rows_transposed_f32",
                                             "rows_padded_bf16",
                                             "rows_one_bf16",
                                             "rows_log_softmax_stream",
                                             "rows_center_stream",
                                             "rows_cross_entropy_stream",
                                             "rows_softcap_cross_entropy_stream"};

void rf_reduce(fm_fragment *f, fm_op op, uint32_t out, uint32_t arg, uint32_t correction) {
  tf_op(f, op, out, 1, arg, 0, 0);
  f->ops[f->n_ops - 1].dim = -1;
  f->ops[f->n_ops - 1].correction = (uint8_t)correction;
}

void rf_composite(fm_fragment *f, fm_op op, uint32_t out, uint32_t nargs, uint32_t a0, uint32_t a1, uint32_t a2,
                  double eps) {
  tf_op(f, op, out, nargs, a0, a1, a2);
  f->ops[f->n_ops - 1].dim = -1;
  f->ops[f->n_ops - 1].value = eps;
}

int rf_finish(fm_fragment *f, fm_fragment *canon) {
  fm_diag d = {{0}};
  int rc = fm_fragment_expand(f, &d);
  if (rc) {
    fprintf(stderr, "  rf_finish: expand: %s: %s\n", fm_strerror(rc), d.text);
    return rc;
  }
  return tf_finish(f, canon);
}

static fm_fragment raw;

int rf_fragment(int which, fm_fragment *canon) {
  tf_init(&raw);
  raw.vocab = 2;
  switch (which) {
    case 0: {
      int64_t x[2] = {-1, 4096}, w[2] = {1, 4096};
      tf_input(&raw, 0, FM_DT_BF16, 2, x, NULL, 16);
      tf_input(&raw, 1, FM_DT_BF16, 2, w, NULL, 16);
      tf_input(&raw, 2, FM_DT_BF16, 2, w, NULL, 16);
      rf_composite(&raw, FM_OP_LAYER_NORM, 3, 3, 0, 1, 2, 1e-5);
      tf_output(&raw, 3, FM_DT_BF16, 2, x, NULL, 16);
      break;
    }
    case 1: {
      int64_t x[2] = {-1, 2048}, w[2] = {1, 2048};
      tf_input(&raw, 0, FM_DT_BF16, 2, x, NULL, 16);
      tf_input(&raw, 1, FM_DT_BF16, 2, x, NULL, 16);
      tf_input(&raw, 2, FM_DT_BF16, 2, w, NULL, 16);
      tf_op(&raw, FM_OP_ADD, 3, 2, 0, 1, 0);
      rf_composite(&raw, FM_OP_RMS_NORM, 4, 2, 3, 2, 0, 1e-6);
      tf_output(&raw, 4, FM_DT_BF16, 2, x, NULL, 16);
      tf_output(&raw, 3, FM_DT_BF16, 2, x, NULL, 16);
      break;
    }
    case 2: {
      int64_t x[2] = {64, 1000};
      tf_input(&raw, 0, FM_DT_F32, 2, x, NULL, 16);
      rf_composite(&raw, FM_OP_SOFTMAX, 1, 1, 0, 0, 0, 0);
      tf_output(&raw, 1, FM_DT_F32, 2, x, NULL, 16);
      break;
    }
    case 3: {
      int64_t x[2] = {-1, 7}, s[2] = {-1, 1}, flat[1] = {-1};
      static const fm_op ops[5] = {FM_OP_SUM, FM_OP_MEAN, FM_OP_AMAX, FM_OP_VAR, FM_OP_VAR};
      tf_input(&raw, 0, FM_DT_F16, 2, x, NULL, 2);
      for (uint32_t i = 0; i < 5; i++) {
        rf_reduce(&raw, ops[i], 10 + i, 0, i == 3 ? 1 : 0);
        tf_cast(&raw, 20 + i, 10 + i, FM_DT_F32);
        tf_output(&raw, 20 + i, FM_DT_F32, 2, s, NULL, 4);
      }
      tf_output(&raw, 11, FM_DT_F16, 1, flat, NULL, 2); /* mean, keepdim=false */
      break;
    }
    case 4: {
      int64_t x[2] = {8, 33}, st[2] = {1, 8};
      tf_input(&raw, 0, FM_DT_F32, 2, x, st, 4);
      rf_reduce(&raw, FM_OP_SUM, 1, 0, 0);
      tf_op(&raw, FM_OP_DIV, 2, 2, 0, 1, 0);
      tf_output(&raw, 2, FM_DT_F32, 2, x, NULL, 4);
      break;
    }
    case 5: {
      int64_t x[2] = {-1, 127}, st[2] = {128, 1}, s[2] = {-1, 1};
      tf_input(&raw, 0, FM_DT_BF16, 2, x, st, 16);
      tf_input(&raw, 1, FM_DT_F32, 2, s, NULL, 4);
      rf_reduce(&raw, FM_OP_AMAX, 2, 0, 0);
      tf_op(&raw, FM_OP_SUB, 3, 2, 0, 2, 0);
      tf_op(&raw, FM_OP_MUL, 4, 2, 3, 1, 0);
      tf_cast(&raw, 5, 4, FM_DT_BF16);
      tf_output(&raw, 5, FM_DT_BF16, 2, x, NULL, 16);
      break;
    }
    case 6: {
      int64_t x[2] = {-1, 1};
      tf_input(&raw, 0, FM_DT_BF16, 2, x, NULL, 2);
      rf_composite(&raw, FM_OP_SOFTMAX, 1, 1, 0, 0, 0, 0);
      rf_reduce(&raw, FM_OP_VAR, 2, 0, 1);
      tf_output(&raw, 1, FM_DT_BF16, 2, x, NULL, 2);
      tf_output(&raw, 2, FM_DT_BF16, 2, x, NULL, 2);
      break;
    }
    case 7: { /* GPT-2's padded logits: log_softmax in fp32, rows of 50257 at stride 50304 */
      int64_t x[2] = {-1, 50257}, st[2] = {50304, 1};
      tf_input(&raw, 0, FM_DT_BF16, 2, x, st, 16);
      tf_cast(&raw, 1, 0, FM_DT_F32);
      rf_reduce(&raw, FM_OP_AMAX, 2, 1, 0);
      tf_op(&raw, FM_OP_SUB, 3, 2, 1, 2, 0);
      tf_op(&raw, FM_OP_EXP, 4, 1, 3, 0, 0);
      rf_reduce(&raw, FM_OP_SUM, 5, 4, 0);
      tf_op(&raw, FM_OP_LOG, 6, 1, 5, 0, 0);
      tf_op(&raw, FM_OP_SUB, 7, 2, 3, 6, 0);
      tf_output(&raw, 7, FM_DT_F32, 2, x, NULL, 16);
      break;
    }
    case 8: { /* whole tiles: (x - mean) / amax with the mean as a per-row output */
      int64_t x[2] = {-1, 40960}, s[2] = {-1, 1};
      tf_input(&raw, 0, FM_DT_BF16, 2, x, NULL, 16);
      rf_reduce(&raw, FM_OP_MEAN, 1, 0, 0);
      rf_reduce(&raw, FM_OP_AMAX, 2, 0, 0);
      tf_op(&raw, FM_OP_SUB, 3, 2, 0, 1, 0);
      tf_op(&raw, FM_OP_DIV, 4, 2, 3, 2, 0);
      tf_output(&raw, 4, FM_DT_BF16, 2, x, NULL, 16);
      tf_output(&raw, 1, FM_DT_BF16, 2, s, NULL, 2);
      break;
    }
    case 9:    /* cross-entropy's forward over Llama's vocabulary (the client's fragment): the
                  log-sum-exp of each row and the logit its target picks, from bf16 logits, a
                  [1, C] column index and a per-row target */
    case 10: { /* the same over Gemma 2's logits soft-capped (tanh(x / 30) * 30), written in bf16 */
      int64_t x[2] = {-1, 32000}, cols[2] = {1, 32000}, s[2] = {-1, 1};
      uint32_t logits = 0;
      tf_input(&raw, 0, FM_DT_BF16, 2, x, NULL, 16);
      tf_input(&raw, 1, FM_DT_F32, 2, cols, NULL, 16);
      tf_input(&raw, 2, FM_DT_F32, 2, s, NULL, 4);
      if (which == 10) {
        tf_const(&raw, 20, 30.0);
        tf_op(&raw, FM_OP_DIV, 21, 2, 0, 20, 0);
        tf_op(&raw, FM_OP_TANH, 22, 1, 21, 0, 0);
        tf_op(&raw, FM_OP_MUL, 23, 2, 22, 20, 0);
        tf_cast(&raw, 24, 23, FM_DT_BF16);
        logits = 24;
      }
      tf_cast(&raw, 3, logits, FM_DT_F32);
      rf_reduce(&raw, FM_OP_AMAX, 4, 3, 0);
      tf_op(&raw, FM_OP_SUB, 5, 2, 3, 4, 0);
      tf_op(&raw, FM_OP_EXP, 6, 1, 5, 0, 0);
      rf_reduce(&raw, FM_OP_SUM, 7, 6, 0);
      tf_op(&raw, FM_OP_LOG, 8, 1, 7, 0, 0);
      tf_op(&raw, FM_OP_ADD, 9, 2, 8, 4, 0);
      tf_op(&raw, FM_OP_EQ, 10, 2, 1, 2, 0);
      tf_const(&raw, 11, 0.0);
      tf_op(&raw, FM_OP_WHERE, 12, 3, 10, 3, 11);
      rf_reduce(&raw, FM_OP_SUM, 13, 12, 0);
      tf_output(&raw, 9, FM_DT_F32, 2, s, NULL, 4);
      tf_output(&raw, 13, FM_DT_F32, 2, s, NULL, 4);
      if (which == 10) tf_output(&raw, logits, FM_DT_BF16, 2, x, NULL, 16);
      break;
    }
    default:
      return FM_EINVAL;
  }
  return rf_finish(&raw, canon);
}
