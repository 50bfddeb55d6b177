# fusectl shutdown: only root and the daemon's own uid may stop it; the daemon on the socket
# (and no other) stops with its in-flight compile answered and its database whole.
if(TARGET fusemld AND TARGET fusectl)
  add_executable(e2e_fusectl_shutdown e2e/e2e_fusectl_shutdown.c e2e/e2e_util.c)
  target_include_directories(e2e_fusectl_shutdown PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/unit ${CMAKE_CURRENT_SOURCE_DIR}/e2e)
  target_link_libraries(e2e_fusectl_shutdown PRIVATE fm_protocol PkgConfig::SQLITE3 PkgConfig::MSGPACK Threads::Threads)
  add_dependencies(e2e_fusectl_shutdown fusemld fusectl)
  add_test(NAME e2e_fusectl_shutdown COMMAND e2e_fusectl_shutdown $<TARGET_FILE:fusemld> $<TARGET_FILE:fusectl>)
  set_tests_properties(e2e_fusectl_shutdown PROPERTIES TIMEOUT 180 LABELS e2e)
endif()
