# Reliability tests (RELIABILITY.md): access control and per-client limits, compile limits, load with hostile
# clients, and SIGKILL crash loops, each against a real fusemld.
if(TARGET fusemld)
  foreach(t access load crashloop connections compile_limits)
    if(EXISTS ${CMAKE_CURRENT_LIST_DIR}/test_${t}.c)
      add_executable(test_${t} e2e/test_${t}.c e2e/e2e_util.c)
      target_include_directories(test_${t} PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/unit ${CMAKE_CURRENT_SOURCE_DIR}/e2e)
      target_link_libraries(test_${t} PRIVATE fm_protocol PkgConfig::SQLITE3 PkgConfig::MSGPACK Threads::Threads)
      add_dependencies(test_${t} fusemld)
      add_test(NAME e2e_${t} COMMAND test_${t} $<TARGET_FILE:fusemld>)
      set_tests_properties(e2e_${t} PROPERTIES TIMEOUT 600 LABELS e2e)
    endif()
  endforeach()
  # The load test saturates the machine on purpose: alone, so that it slows no timing-sensitive
  # test (and none skews its figures).
  if(TARGET test_load)
    set_tests_properties(e2e_load PROPERTIES RUN_SERIAL TRUE)
  endif()
endif()
