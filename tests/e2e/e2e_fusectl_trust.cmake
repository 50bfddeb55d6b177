# What fusectl shows and whom it talks to (RELIABILITY.md sections 1 and 5): planted control
# characters printed escaped, a refusal shown as such, export's exit status with a corrupt entry,
# a socket in another user's directory refused.
if(TARGET fusemld AND TARGET fusectl)
  add_executable(e2e_fusectl_trust e2e/e2e_fusectl_trust.c e2e/e2e_util.c)
  target_include_directories(e2e_fusectl_trust PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/unit ${CMAKE_CURRENT_SOURCE_DIR}/e2e)
  target_link_libraries(e2e_fusectl_trust PRIVATE fm_cache fm_protocol PkgConfig::SQLITE3 PkgConfig::MSGPACK Threads::Threads)
  add_dependencies(e2e_fusectl_trust fusemld fusectl)
  add_test(NAME e2e_fusectl_trust COMMAND e2e_fusectl_trust $<TARGET_FILE:fusemld> $<TARGET_FILE:fusectl>)
  set_tests_properties(e2e_fusectl_trust PROPERTIES TIMEOUT 180 LABELS e2e)
endif()
