# Reliability unit tests (RELIABILITY.md): hostile client strings and numbers through
# decode -> canonical form -> codegen -> NVRTC.
fm_unit_test(test_hostile_strings
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_hostile_strings.c
  LIBS fm_codegen PkgConfig::MSGPACK m)
set_tests_properties(test_hostile_strings PROPERTIES TIMEOUT 300)

# The tuner worker's environment has no CUDA_MPS_* (fm_tuner_worker.c scrubs it).
if(TARGET fm_daemon_core)
  fm_unit_test(test_tuner_env
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_tuner_env.c
    LIBS fm_daemon_core)
endif()
