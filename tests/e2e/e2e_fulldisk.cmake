# Full disk under the kernel store (RELIABILITY.md section 3): FM_TEST_DB_MAX_PAGES and a
# small tmpfs in a private mount namespace (skipped where none can be made).
if(TARGET fusemld)
  add_executable(e2e_fulldisk e2e/e2e_fulldisk.c e2e/e2e_util.c)
  target_include_directories(e2e_fulldisk PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/unit ${CMAKE_CURRENT_SOURCE_DIR}/e2e)
  target_link_libraries(e2e_fulldisk PRIVATE fm_protocol PkgConfig::MSGPACK Threads::Threads)
  add_dependencies(e2e_fulldisk fusemld)
  add_test(NAME e2e_fulldisk COMMAND e2e_fulldisk $<TARGET_FILE:fusemld>)
  set_tests_properties(e2e_fulldisk PROPERTIES TIMEOUT 300 LABELS e2e)
endif()
