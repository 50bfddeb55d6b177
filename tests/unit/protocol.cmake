# protocol/ unit tests (no GPU, no network). test_protocol_vectors reads protocol/vectors
# through FM_SOURCE_DIR; jansson parses its manifest and the JSON test fragments.
foreach(t frame msg fragment canon fingerprint meta text vectors)
  fm_unit_test(test_protocol_${t}
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_protocol_${t}.c
    LIBS fm_protocol PkgConfig::JANSSON)
endforeach()
foreach(t rows cols cat window scatter gather integer iota)
  fm_unit_test(test_protocol_${t}
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_protocol_${t}.c
    LIBS fm_protocol PkgConfig::JANSSON)
endforeach()
