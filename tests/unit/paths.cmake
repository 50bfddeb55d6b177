# paths/ unit tests: default socket, database and config paths, the socket directory's owner
# check, fm_mkdirs (no network).
fm_unit_test(test_paths
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_paths.c
  LIBS fm_paths)
