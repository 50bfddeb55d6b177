# gpu/ unit tests: the dlopen'ed driver and module load/launch without a GPU (every entry
# point answers FM_ENOGPU), the device identity on a GPU machine.
fm_unit_test(test_gpu_cuda
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_gpu_cuda.c
  LIBS fm_gpu)
