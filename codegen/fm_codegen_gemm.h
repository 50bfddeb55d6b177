/* fm_codegen_gemm.h: INTERNAL to codegen/ (the API is fm_codegen.h): the gemm template's
 * two files:
 *   fm_codegen_gemm_body.c  the fixed sm_80+ mainloop (CUDA text, configured by macros);
 *   fm_codegen_gemm.c       the plan (layouts, leading dims), the generated epilogue and
 *                           kernel around the mainloop, configs, candidates and metadata.
 * The epilogue's per-op expressions come from fm_codegen_ops.c (fm_cg_emit_op). */
#ifndef FM_CODEGEN_GEMM_H
#define FM_CODEGEN_GEMM_H

#include "fm_codegen_int.h"

extern const char fm_cg_gemm_body[];

#endif
