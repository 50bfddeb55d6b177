# client/ unit tests: fusectl's JSON reader and writer (+ the shipped examples) and
# libfusemld's framing against a fake server thread.
fm_unit_test(test_client_json
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_client_json.c
          ${PROJECT_SOURCE_DIR}/client/fusectl_json.c
          ${PROJECT_SOURCE_DIR}/client/fusectl_print.c
  LIBS fusemld_static PkgConfig::JANSSON m)
fm_unit_test(test_client_net
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_client_net.c
  LIBS fusemld_static Threads::Threads)
# fusectl's exit codes without a daemon (runs the built binary).
fm_unit_test(test_client_fusectl
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_client_fusectl.c)
add_dependencies(test_client_fusectl fusectl)
