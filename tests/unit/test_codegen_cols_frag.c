/* test_codegen_cols_frag.c: the column fragments of the cols template's tests. */
#include "test_codegen_cols_frag.h"

#include <string.h>

#include "test_codegen_frag.h"

const char *const cf_name[CF_N_FRAGMENTS] = {"cols_bias_grad_bf16",  "cols_prologue_cast", "cols_stats_f16",
                                             "cols_colmajor_static", "cols_mask_bf16",     "cols_one_f32",
                                             "cols_batch_norm_stats"};

void cf_reduce(fm_fragment *f, fm_op op, uint32_t out, uint32_t arg) {
  tf_op(f, op, out, 1, arg, 0, 0);
  f->ops[f->n_ops - 1].dim = 0;
  f->ops[f->n_ops - 1].keepdim = 1;
}

static fm_fragment raw;

int cf_fragment(int which, fm_fragment *canon) {
  tf_init(&raw);
  switch (which) {
    case 0: {
      int64_t g[2] = {-1, 1024}, n[1] = {1024};
      tf_input(&raw, 0, FM_DT_BF16, 2, g, NULL, 16);
      cf_reduce(&raw, FM_OP_SUM, 1, 0);
      raw.ops[0].keepdim = 0;
      tf_output(&raw, 1, FM_DT_BF16, 1, n, NULL, 16);
      break;
    }
    case 1: {
      int64_t g[2] = {-1, 512}, gs[2] = {520, 1}, s[1] = {512}, o[2] = {1, 512};
      tf_input(&raw, 0, FM_DT_BF16, 2, g, gs, 16);
      tf_input(&raw, 1, FM_DT_F32, 1, s, NULL, 16);
      tf_op(&raw, FM_OP_MUL, 2, 2, 0, 1, 0);
      cf_reduce(&raw, FM_OP_SUM, 3, 2);
      tf_cast(&raw, 4, 3, FM_DT_BF16);
      tf_output(&raw, 4, FM_DT_BF16, 2, o, NULL, 16);
      tf_output(&raw, 3, FM_DT_F32, 1, s, NULL, 16);
      break;
    }
    case 2: {
      int64_t x[2] = {-1, 100}, o[2] = {1, 100};
      static const fm_op ops[3] = {FM_OP_SUM, FM_OP_MEAN, FM_OP_AMAX};
      tf_input(&raw, 0, FM_DT_F16, 2, x, NULL, 2);
      for (uint32_t i = 0; i < 3; i++) {
        cf_reduce(&raw, ops[i], 10 + i, 0);
        tf_cast(&raw, 20 + i, 10 + i, FM_DT_F32);
        tf_output(&raw, 20 + i, FM_DT_F32, 2, o, NULL, 4);
      }
      break;
    }
    case 3: {
      int64_t x[2] = {300, 48}, xs[2] = {1, 300}, r[2] = {300, 1}, b[2] = {1, 48};
      tf_input(&raw, 0, FM_DT_F32, 2, x, xs, 4);
      tf_input(&raw, 1, FM_DT_F32, 2, r, NULL, 4);
      tf_input(&raw, 2, FM_DT_F32, 2, b, NULL, 4);
      tf_op(&raw, FM_OP_MUL, 3, 2, 0, 1, 0);
      cf_reduce(&raw, FM_OP_MEAN, 4, 3);
      cf_reduce(&raw, FM_OP_AMAX, 5, 3);
      tf_const(&raw, 6, 0.5);
      tf_op(&raw, FM_OP_MUL, 7, 2, 5, 6, 0);
      tf_op(&raw, FM_OP_ADD, 8, 2, 7, 2, 0);
      tf_output(&raw, 4, FM_DT_F32, 2, b, NULL, 4);
      tf_output(&raw, 8, FM_DT_F32, 2, b, NULL, 4);
      break;
    }
    case 4: {
      int64_t x[2] = {-1, 256}, o[2] = {1, 256};
      tf_input(&raw, 0, FM_DT_BOOL, 2, x, NULL, 16);
      tf_input(&raw, 1, FM_DT_BF16, 2, x, NULL, 16);
      tf_const(&raw, 2, 0.0);
      tf_op(&raw, FM_OP_WHERE, 3, 3, 0, 1, 2);
      cf_reduce(&raw, FM_OP_SUM, 4, 3);
      tf_output(&raw, 4, FM_DT_BF16, 2, o, NULL, 16);
      break;
    }
    case 5: {
      int64_t x[2] = {-1, 1}, o[1] = {1};
      tf_input(&raw, 0, FM_DT_F32, 2, x, NULL, 4);
      cf_reduce(&raw, FM_OP_SUM, 1, 0);
      tf_output(&raw, 1, FM_DT_F32, 1, o, NULL, 4);
      break;
    }
    case 6: { /* a batch norm's statistics over [N * H * W, 64] channels-last values: the mean,
                 the mean of squared deviations from a per-column centre, rsqrt(var + eps) */
      int64_t x[2] = {-1, 64}, c[1] = {64}, o[1] = {64};
      tf_input(&raw, 0, FM_DT_BF16, 2, x, NULL, 16);
      tf_input(&raw, 1, FM_DT_F32, 1, c, NULL, 16);
      tf_cast(&raw, 9, 0, FM_DT_F32);
      tf_op(&raw, FM_OP_SUB, 2, 2, 9, 1, 0);
      tf_op(&raw, FM_OP_MUL, 3, 2, 2, 2, 0);
      cf_reduce(&raw, FM_OP_MEAN, 4, 9);
      cf_reduce(&raw, FM_OP_MEAN, 5, 3);
      raw.ops[3].keepdim = raw.ops[4].keepdim = 0;
      tf_const(&raw, 6, 1e-5);
      tf_op(&raw, FM_OP_ADD, 7, 2, 5, 6, 0);
      tf_op(&raw, FM_OP_RSQRT, 8, 1, 7, 0, 0);
      tf_output(&raw, 4, FM_DT_F32, 1, o, NULL, 16);
      tf_output(&raw, 5, FM_DT_F32, 1, o, NULL, 16);
      tf_output(&raw, 8, FM_DT_F32, 1, o, NULL, 16);
      break;
    }
    default:
      return FM_EINVAL;
  }
  return tf_finish(&raw, canon);
}
