# The tuner (daemon/fm_tuner*.c): a stand-in worker (no GPU) that misbehaves on cue drives the
# unit test of worker management and judging, and the end-to-end tuning test of fusemld.
if(TARGET fm_daemon_core)
  add_executable(tuner_standin ${CMAKE_CURRENT_LIST_DIR}/tuner_standin.c)
  target_link_libraries(tuner_standin PRIVATE fm_protocol)

  add_executable(test_tuner ${CMAKE_CURRENT_LIST_DIR}/test_tuner.c)
  target_include_directories(test_tuner PRIVATE ${CMAKE_CURRENT_LIST_DIR})
  target_link_libraries(test_tuner PRIVATE fm_daemon_core)
  add_dependencies(test_tuner tuner_standin)
  add_test(NAME test_tuner COMMAND test_tuner $<TARGET_FILE:tuner_standin>)
  set_tests_properties(test_tuner PROPERTIES TIMEOUT 120)
endif()

# End to end: a real fusemld tuning through the stand-in (kill, restart, bad, untuned).
if(TARGET fusemld AND TARGET fusectl)
  add_executable(test_tuner_e2e ${CMAKE_CURRENT_SOURCE_DIR}/e2e/test_tuner_e2e.c ${CMAKE_CURRENT_SOURCE_DIR}/e2e/e2e_util.c)
  target_include_directories(test_tuner_e2e PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/unit ${CMAKE_CURRENT_SOURCE_DIR}/e2e)
  target_link_libraries(test_tuner_e2e PRIVATE fm_protocol PkgConfig::MSGPACK Threads::Threads)
  add_dependencies(test_tuner_e2e fusemld tuner_standin fusectl)
  add_test(NAME e2e_tuner COMMAND test_tuner_e2e $<TARGET_FILE:fusemld> $<TARGET_FILE:tuner_standin>
                                  $<TARGET_FILE:fusectl>)
  set_tests_properties(e2e_tuner PROPERTIES TIMEOUT 180 LABELS e2e)
endif()

# End to end: serving first and tuning in the background (--tune background) through the
# stand-in: upgrades, one build per key, hang-ups, foreground first, kills mid-tune.
if(TARGET fusemld AND TARGET fusectl)
  add_executable(test_bgtune_e2e ${CMAKE_CURRENT_SOURCE_DIR}/e2e/test_bgtune_e2e.c ${CMAKE_CURRENT_SOURCE_DIR}/e2e/e2e_util.c)
  target_include_directories(test_bgtune_e2e PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/unit ${CMAKE_CURRENT_SOURCE_DIR}/e2e)
  target_link_libraries(test_bgtune_e2e PRIVATE fm_protocol PkgConfig::MSGPACK Threads::Threads)
  add_dependencies(test_bgtune_e2e fusemld tuner_standin fusectl)
  add_test(NAME e2e_bgtune COMMAND test_bgtune_e2e $<TARGET_FILE:fusemld> $<TARGET_FILE:tuner_standin>
                                   $<TARGET_FILE:fusectl> ${CMAKE_SOURCE_DIR}/examples)
  set_tests_properties(e2e_bgtune PROPERTIES TIMEOUT 600 LABELS e2e)
endif()
