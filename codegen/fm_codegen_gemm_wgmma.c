/* fm_codegen_gemm_wgmma.c: fm_wgmma(), the one generated part of the gemm template's sm_90a
 * mainloops (cuda/wgmma_head.cuh, wgmma_ops.cuh, wgmma_body.cuh, wgmma_persistent.cuh: fixed
 * text): one m64nBNk16 warpgroup MMA whose register list depends on BN. */
#include "fm_codegen_gemm.h"

void fm_cg_gemm_emit_wgmma(fm_strbuf *sb, const char *ty, uint32_t bn) {
  uint32_t regs = bn / 2;
  fm_strbuf_printf(sb,
                   "/* one wgmma m64n%uk16 (A and B K-major in shared memory): d += A B, or with add 0\n"
                   "   d = A B, d's values ignored. A tile's first wgmma starts its accumulators that way:\n"
                   "   zeroing them first took a move per register, and where the K loop unrolled whole\n"
                   "   ptxas placed those moves after the first wgmma and waited for it to retire\n"
                   "   (C7517), stalling the tensor pipe at every tile. */\n"
                   "__device__ __forceinline__ void fm_wgmma(float (&d)[%u][4], unsigned long long da,\n"
                   "                                         unsigned long long db, int add) {\n"
                   "  asm volatile(\"{\\n.reg .pred p;\\nsetp.ne.b32 p, %%%u, 0;\\n\"\n"
                   "      \"wgmma.mma_async.sync.aligned.m64n%uk16.f32.%s.%s {",
                   bn, bn / 8, regs + 2, bn, ty, ty);
  for (uint32_t i = 0; i < regs; i++) fm_strbuf_printf(sb, "%s%%%u", i ? ", " : "", i);
  fm_strbuf_printf(sb, "}, %%%u, %%%u, p, 1, 1, 0, 0;\\n}\\n\"\n      : ", regs, regs + 1);
  for (uint32_t i = 0; i < regs; i++) fm_strbuf_printf(sb, "%s\"+f\"(d[%u][%u])", i ? ", " : "", i / 4, i % 4);
  fm_strbuf_append(sb, "\n      : \"l\"(da), \"l\"(db), \"r\"(add));\n}\n");
}
