# --exit-when-idle (what autostarting clients pass) and detaching from inside a systemd
# service, against a real fusemld.
if(TARGET fusemld)
  add_executable(e2e_idle_exit e2e/e2e_idle_exit.c e2e/e2e_util.c)
  target_include_directories(e2e_idle_exit PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/unit ${CMAKE_CURRENT_SOURCE_DIR}/e2e)
  target_link_libraries(e2e_idle_exit PRIVATE fm_protocol PkgConfig::MSGPACK Threads::Threads)
  add_dependencies(e2e_idle_exit fusemld)
  add_test(NAME e2e_idle_exit COMMAND e2e_idle_exit $<TARGET_FILE:fusemld>)
  set_tests_properties(e2e_idle_exit PROPERTIES TIMEOUT 180 LABELS e2e)
endif()
