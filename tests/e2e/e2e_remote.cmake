# The remote tier (docs/REMOTE.md): the entry format alone, then a real redis-server on
# loopback shared by several daemons. The latter skips (77) where redis-server is absent.
if(TARGET fm_daemon_core)
  add_executable(e2e_remote_entry e2e/e2e_remote_entry.c)
  target_include_directories(e2e_remote_entry PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/unit)
  target_link_libraries(e2e_remote_entry PRIVATE fm_daemon_core)
  add_test(NAME e2e_remote_entry COMMAND e2e_remote_entry)
  set_tests_properties(e2e_remote_entry PROPERTIES TIMEOUT 60 LABELS e2e)
endif()
if(TARGET fusemld AND TARGET fusectl)
  add_executable(e2e_remote e2e/e2e_remote.c e2e/e2e_util.c)
  target_include_directories(e2e_remote PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/unit ${CMAKE_CURRENT_SOURCE_DIR}/e2e)
  target_link_libraries(e2e_remote PRIVATE fm_protocol PkgConfig::MSGPACK Threads::Threads)
  add_dependencies(e2e_remote fusemld fusectl)
  add_test(NAME e2e_remote COMMAND e2e_remote $<TARGET_FILE:fusemld> $<TARGET_FILE:fusectl>)
  set_tests_properties(e2e_remote PROPERTIES TIMEOUT 180 LABELS e2e SKIP_RETURN_CODE 77)
endif()
# A --remote daemon kept off the network by the sandboxes the systemd unit asks for
# (RestrictAddressFamilies= as a seccomp filter, PrivateNetwork= as a network namespace) says
# so at startup and names the drop-in.
if(TARGET fusemld)
  add_executable(e2e_remote_network e2e/e2e_remote_network.c e2e/e2e_util.c)
  target_include_directories(e2e_remote_network PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/unit ${CMAKE_CURRENT_SOURCE_DIR}/e2e)
  target_link_libraries(e2e_remote_network PRIVATE fm_protocol PkgConfig::MSGPACK Threads::Threads)
  add_dependencies(e2e_remote_network fusemld)
  add_test(NAME e2e_remote_network COMMAND e2e_remote_network $<TARGET_FILE:fusemld>)
  set_tests_properties(e2e_remote_network PROPERTIES TIMEOUT 120 LABELS e2e SKIP_RETURN_CODE 77)
endif()
