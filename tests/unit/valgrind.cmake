# valgrind memcheck (RELIABILITY.md section 7), in a build without sanitizers only
# (-DFM_VALGRIND=ON; scripts/test builds build-valgrind): a few unit tests and one short
# daemon session under memcheck, ctest label `valgrind`. Errors or definite leaks fail the
# test (--error-exitcode); tests/valgrind.supp holds suppressions for library noise (none yet).
option(FM_VALGRIND "Add the valgrind memcheck tests (label valgrind; needs valgrind, no sanitizers)" OFF)
if(FM_VALGRIND AND NOT FM_SANITIZE AND NOT FM_FUZZ AND TARGET fusemld)
  find_program(FM_VALGRIND_EXE valgrind REQUIRED)
  set(FM_VG_SUPP ${CMAKE_CURRENT_SOURCE_DIR}/valgrind.supp)
  set(FM_VG ${FM_VALGRIND_EXE} -q --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite
      --show-leak-kinds=definite --track-origins=yes --suppressions=${FM_VG_SUPP})
  # Unit tests that cover the untrusted-input, store and worker-management code without NVRTC
  # (NVRTC under memcheck costs ~15 s a compile; the session below does one).
  set(FM_VG_UNITS test_protocol_msg test_protocol_frame test_protocol_fragment test_protocol_canon test_protocol_cat
      test_cache_store test_cache_integrity test_daemon_config test_daemon_sd test_tuner_env)
  set(FM_VG_TARGETS)
  foreach(t ${FM_VG_UNITS})
    if(TARGET ${t})
      add_test(NAME vg_${t} COMMAND ${FM_VG} $<TARGET_FILE:${t}>)
      set_tests_properties(vg_${t} PROPERTIES LABELS valgrind TIMEOUT 600
        ENVIRONMENT "FM_SOURCE_DIR=${PROJECT_SOURCE_DIR};FM_BINARY_DIR=${PROJECT_BINARY_DIR}")
      list(APPEND FM_VG_TARGETS ${t})
    endif()
  endforeach()
  add_executable(e2e_valgrind_session e2e/e2e_valgrind_session.c e2e/e2e_util.c)
  target_include_directories(e2e_valgrind_session PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/unit ${CMAKE_CURRENT_SOURCE_DIR}/e2e)
  target_link_libraries(e2e_valgrind_session PRIVATE fm_protocol PkgConfig::MSGPACK Threads::Threads)
  add_dependencies(e2e_valgrind_session fusemld)
  add_test(NAME vg_daemon_session COMMAND e2e_valgrind_session $<TARGET_FILE:fusemld> ${FM_VALGRIND_EXE} ${FM_VG_SUPP})
  set_tests_properties(vg_daemon_session PROPERTIES LABELS valgrind TIMEOUT 600)
  # scripts/test builds only these.
  add_custom_target(fm_valgrind_tests DEPENDS ${FM_VG_TARGETS} e2e_valgrind_session fusemld)
endif()
