# Where the daemon keeps its kernels (RELIABILITY.md section 3): the database created 0600, and
# a read-only location served from memory (a private mount namespace; skipped where none).
if(TARGET fusemld)
  add_executable(e2e_store_location e2e/e2e_store_location.c e2e/e2e_util.c)
  target_include_directories(e2e_store_location PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/unit ${CMAKE_CURRENT_SOURCE_DIR}/e2e)
  target_link_libraries(e2e_store_location PRIVATE fm_protocol PkgConfig::MSGPACK Threads::Threads)
  add_dependencies(e2e_store_location fusemld)
  add_test(NAME e2e_store_location COMMAND e2e_store_location $<TARGET_FILE:fusemld>)
  set_tests_properties(e2e_store_location PROPERTIES TIMEOUT 120 LABELS e2e)
endif()
