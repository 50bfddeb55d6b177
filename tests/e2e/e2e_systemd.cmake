# systemd's notify protocol against a real fusemld (RELIABILITY.md section 6): READY=1,
# WATCHDOG=1 at half WATCHDOG_USEC, STOPPING=1 on SIGTERM.
if(TARGET fusemld)
  add_executable(e2e_systemd e2e/e2e_systemd.c e2e/e2e_util.c)
  target_include_directories(e2e_systemd PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/unit ${CMAKE_CURRENT_SOURCE_DIR}/e2e)
  target_link_libraries(e2e_systemd PRIVATE fm_protocol PkgConfig::MSGPACK Threads::Threads)
  add_dependencies(e2e_systemd fusemld)
  add_test(NAME e2e_systemd COMMAND e2e_systemd $<TARGET_FILE:fusemld>)
  set_tests_properties(e2e_systemd PROPERTIES TIMEOUT 120 LABELS e2e)
endif()
if(TARGET e2e_systemd)
  target_compile_definitions(e2e_systemd PRIVATE FM_HAVE_LIBSYSTEMD=${FM_HAVE_LIBSYSTEMD})
endif()
