# The installed tree through pkg-config: <fusemld/fm_client.h> compiles with its Cflags.
if(TARGET fusemld_shared AND TARGET fusectl AND TARGET fusemld)
  add_test(NAME e2e_pkgconfig
           COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/e2e/test_pkgconfig.sh ${PROJECT_BINARY_DIR} ${CMAKE_C_COMPILER})
  set_tests_properties(e2e_pkgconfig PROPERTIES TIMEOUT 120 LABELS e2e)
endif()
# cmake --install into a DESTDIR: the systemd units, the drop-in, the example config and the
# documents the units name.
if(TARGET fusemld AND TARGET fusectl)
  add_test(NAME e2e_install COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/e2e/test_install.sh ${PROJECT_BINARY_DIR})
  set_tests_properties(e2e_install PROPERTIES TIMEOUT 120 LABELS e2e)
endif()
