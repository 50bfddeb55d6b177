# codegen unit tests (no GPU; NVRTC is real and compiles without one).
set(FM_CG_TEST_DIR ${CMAKE_CURRENT_LIST_DIR})
fm_unit_test(test_codegen_strbuf
  SOURCES ${FM_CG_TEST_DIR}/test_codegen_strbuf.c
  LIBS fm_codegen)
fm_unit_test(test_codegen_golden
  SOURCES ${FM_CG_TEST_DIR}/test_codegen_golden.c ${FM_CG_TEST_DIR}/test_codegen_frag.c
  LIBS fm_codegen)
fm_unit_test(test_codegen_pointwise
  SOURCES ${FM_CG_TEST_DIR}/test_codegen_pointwise.c ${FM_CG_TEST_DIR}/test_codegen_frag.c
  LIBS fm_codegen)
fm_unit_test(test_codegen_nvrtc
  SOURCES ${FM_CG_TEST_DIR}/test_codegen_nvrtc.c ${FM_CG_TEST_DIR}/test_codegen_frag.c
  LIBS fm_codegen Threads::Threads)
fm_unit_test(test_codegen_reference
  SOURCES ${FM_CG_TEST_DIR}/test_codegen_reference.c ${FM_CG_TEST_DIR}/test_codegen_frag.c
  LIBS fm_codegen m)
target_compile_definitions(test_codegen_golden PRIVATE FM_CG_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
fm_unit_test(test_codegen_candidates
  SOURCES ${FM_CG_TEST_DIR}/test_codegen_candidates.c ${FM_CG_TEST_DIR}/test_codegen_frag.c
  LIBS fm_codegen)
# the reduction templates: rows (last dim) and cols (dim 0), each with its fragments
foreach(t rows cols)
  fm_unit_test(test_codegen_${t}
    SOURCES ${FM_CG_TEST_DIR}/test_codegen_${t}.c ${FM_CG_TEST_DIR}/test_codegen_${t}_frag.c
            ${FM_CG_TEST_DIR}/test_codegen_frag.c
    LIBS fm_codegen)
  target_compile_definitions(test_codegen_${t} PRIVATE FM_CG_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
  fm_unit_test(test_codegen_${t}_ref
    SOURCES ${FM_CG_TEST_DIR}/test_codegen_${t}_ref.c ${FM_CG_TEST_DIR}/test_codegen_${t}_frag.c
            ${FM_CG_TEST_DIR}/test_codegen_frag.c
    LIBS fm_codegen m)
endforeach()
fm_unit_test(test_codegen_gemm
  SOURCES ${FM_CG_TEST_DIR}/test_codegen_gemm.c ${FM_CG_TEST_DIR}/test_codegen_frag.c
  LIBS fm_codegen)
target_compile_definitions(test_codegen_gemm PRIVATE FM_CG_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
fm_unit_test(test_codegen_bmm
  SOURCES ${FM_CG_TEST_DIR}/test_codegen_bmm.c ${FM_CG_TEST_DIR}/test_codegen_frag.c
  LIBS fm_codegen)
fm_unit_test(test_codegen_siblings
  SOURCES ${FM_CG_TEST_DIR}/test_codegen_siblings.c ${FM_CG_TEST_DIR}/test_codegen_frag.c
  LIBS fm_codegen)
fm_unit_test(test_codegen_b2b
  SOURCES ${FM_CG_TEST_DIR}/test_codegen_b2b.c ${FM_CG_TEST_DIR}/test_codegen_frag.c
  LIBS fm_codegen m)
fm_unit_test(test_codegen_skinny
  SOURCES ${FM_CG_TEST_DIR}/test_codegen_skinny.c ${FM_CG_TEST_DIR}/test_codegen_frag.c
  LIBS fm_codegen)
fm_unit_test(test_codegen_blas
  SOURCES ${FM_CG_TEST_DIR}/test_codegen_blas.c ${FM_CG_TEST_DIR}/test_codegen_frag.c
  LIBS fm_codegen)
# cat fragments (vocabulary 6): reference, golden source, NVRTC
fm_unit_test(test_codegen_cat
  SOURCES ${FM_CG_TEST_DIR}/test_codegen_cat.c ${FM_CG_TEST_DIR}/test_codegen_frag.c
  LIBS fm_codegen m)
target_compile_definitions(test_codegen_cat PRIVATE FM_CG_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
# the GEMM-family kernels served on sm_90a, pinned byte for byte (source and candidate lists)
fm_unit_test(test_codegen_golden_sm90
  SOURCES ${FM_CG_TEST_DIR}/test_codegen_golden_sm90.c ${FM_CG_TEST_DIR}/test_codegen_cols_frag.c
          ${FM_CG_TEST_DIR}/test_codegen_frag.c
  LIBS fm_codegen)
target_compile_definitions(test_codegen_golden_sm90 PRIVATE FM_CG_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
# the reference at a sample of blocks, the tuner's check of large fragments
fm_unit_test(test_reference_sample
  SOURCES ${FM_CG_TEST_DIR}/test_reference_sample.c ${FM_CG_TEST_DIR}/test_codegen_rows_frag.c
          ${FM_CG_TEST_DIR}/test_codegen_frag.c
  LIBS fm_codegen m)
# window ops (vocabulary 7: max_pool2d and its backward): reference, golden sources, NVRTC
fm_unit_test(test_codegen_window
  SOURCES ${FM_CG_TEST_DIR}/test_codegen_window.c ${FM_CG_TEST_DIR}/test_codegen_frag.c
  LIBS fm_codegen m)
target_compile_definitions(test_codegen_window PRIVATE FM_CG_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
# index_add (vocabulary 8, scatter fragments): reference, verifier's index, golden source, NVRTC
fm_unit_test(test_codegen_scatter
  SOURCES ${FM_CG_TEST_DIR}/test_codegen_scatter.c ${FM_CG_TEST_DIR}/test_codegen_frag.c
  LIBS fm_codegen m)
target_compile_definitions(test_codegen_scatter PRIVATE FM_CG_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
# take_rows (vocabulary 9, rows read at an index): reference, verifier's index, golden source, NVRTC
fm_unit_test(test_codegen_gather
  SOURCES ${FM_CG_TEST_DIR}/test_codegen_gather.c ${FM_CG_TEST_DIR}/test_codegen_frag.c
  LIBS fm_codegen m)
target_compile_definitions(test_codegen_gather PRIVATE FM_CG_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
# integer values (vocabulary 10): reference, verifier's labels, golden source, NVRTC
fm_unit_test(test_codegen_integer
  SOURCES ${FM_CG_TEST_DIR}/test_codegen_integer.c ${FM_CG_TEST_DIR}/test_codegen_frag.c
  LIBS fm_codegen m)
target_compile_definitions(test_codegen_integer PRIVATE FM_CG_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
# iota (vocabulary 11): reference, the sample's cut, golden source, NVRTC
fm_unit_test(test_codegen_iota
  SOURCES ${FM_CG_TEST_DIR}/test_codegen_iota.c ${FM_CG_TEST_DIR}/test_codegen_frag.c
  LIBS fm_codegen m)
target_compile_definitions(test_codegen_iota PRIVATE FM_CG_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
