# Unit tests of cache/ (the SQLite kernel store). They use real SQLite files in temp dirs.
fm_unit_test(test_cache_store SOURCES unit/test_cache_store.c LIBS fm_cache)
fm_unit_test(test_cache_integrity SOURCES unit/test_cache_integrity.c LIBS fm_cache)
fm_unit_test(test_cache_threads SOURCES unit/test_cache_threads.c LIBS fm_cache Threads::Threads)
