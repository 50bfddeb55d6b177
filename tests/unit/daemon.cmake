# daemon/ unit tests (the end-to-end ones are in tests/e2e/e2e.cmake).
if(TARGET fm_daemon_core)
  foreach(t config sd inflight compile remote_url)
    fm_unit_test(test_daemon_${t}
      SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_daemon_${t}.c
      LIBS fm_daemon_core)
  endforeach()
endif()
if(TARGET test_daemon_sd)
  target_compile_definitions(test_daemon_sd PRIVATE FM_HAVE_LIBSYSTEMD=${FM_HAVE_LIBSYSTEMD})
endif()
