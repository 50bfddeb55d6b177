# End-to-end tests: a real fusemld on a temp socket and temp database (no GPU needed).
# The binaries come in as $<TARGET_FILE:...> arguments.
if(TARGET fusemld)
  add_executable(test_daemon_e2e e2e/test_daemon_e2e.c e2e/e2e_util.c)
  target_include_directories(test_daemon_e2e PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/unit ${CMAKE_CURRENT_SOURCE_DIR}/e2e)
  target_link_libraries(test_daemon_e2e PRIVATE fm_protocol PkgConfig::SQLITE3 PkgConfig::MSGPACK Threads::Threads)
  add_dependencies(test_daemon_e2e fusemld)
  add_test(NAME e2e_daemon COMMAND test_daemon_e2e $<TARGET_FILE:fusemld>)
  set_tests_properties(e2e_daemon PROPERTIES TIMEOUT 120 LABELS e2e)
endif()

if(TARGET fusemld AND TARGET fusectl)
  add_test(NAME e2e_fusectl
           COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/e2e/test_fusectl.sh
                   $<TARGET_FILE:fusemld> $<TARGET_FILE:fusectl> ${PROJECT_SOURCE_DIR}/examples)
  set_tests_properties(e2e_fusectl PROPERTIES TIMEOUT 240 LABELS e2e)
endif()

# What an import may plant and what a stored entry must prove before it is served (links the
# daemon core to build signed and forged entries, and SQLite to edit a stopped daemon's file).
if(TARGET fusemld)
  add_executable(test_import_trust e2e/test_import_trust.c e2e/e2e_util.c)
  target_include_directories(test_import_trust PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/unit ${CMAKE_CURRENT_SOURCE_DIR}/e2e)
  target_link_libraries(test_import_trust PRIVATE fm_daemon_core PkgConfig::SQLITE3)
  add_dependencies(test_import_trust fusemld)
  add_test(NAME e2e_import_trust COMMAND test_import_trust $<TARGET_FILE:fusemld>)
  set_tests_properties(e2e_import_trust PROPERTIES TIMEOUT 180 LABELS e2e)
endif()
if(TARGET test_daemon_e2e)
  target_compile_definitions(test_daemon_e2e PRIVATE FM_HAVE_LIBSYSTEMD=${FM_HAVE_LIBSYSTEMD})
endif()
