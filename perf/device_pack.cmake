# What perf/device_torch and perf/device_python share on the GPU machine: the device pack that
# perf/pack_device_check.sh built (SB_PACK: the static stealbatch libraries), the folders of the shared libraries they
# link (SB_LIBS: libtbb, NCCL, cuBLAS), and SB_STEALBATCH_LIBS, the static libraries as one link group.
set(SB_PACK "" CACHE PATH "the device pack (perf/pack_device_check.sh): static/ holds the stealbatch libraries, include/ CLI11")
set(SB_LIBS "" CACHE STRING "folders that hold libtbb.so.12, libnccl.so.2 and libcublas.so.13")
set(SB_ROOT ${CMAKE_CURRENT_LIST_DIR}/..)
foreach(lib cuda runtime checkpoint scheduler)
  if(NOT EXISTS ${SB_PACK}/static/libstealbatch_${lib}.a)
    message(FATAL_ERROR "no ${SB_PACK}/static/libstealbatch_${lib}.a: run perf/pack_device_check.sh on the build machine")
  endif()
endforeach()
find_library(SB_TBB NAMES libtbb.so.12 tbb PATHS ${SB_LIBS} NO_DEFAULT_PATH REQUIRED)
find_library(SB_NCCL NAMES libnccl.so.2 nccl PATHS ${SB_LIBS} REQUIRED)
find_library(SB_CUBLAS NAMES libcublas.so.13 cublas PATHS ${SB_LIBS} REQUIRED)
find_library(SB_CUBLASLT NAMES libcublasLt.so.13 cublasLt PATHS ${SB_LIBS} REQUIRED)
find_library(SB_ZLIB NAMES libz.so.1 z REQUIRED)
set(SB_STEALBATCH_LIBS
  -Wl,--start-group ${SB_PACK}/static/libstealbatch_cuda.a ${SB_PACK}/static/libstealbatch_runtime.a
  ${SB_PACK}/static/libstealbatch_checkpoint.a ${SB_PACK}/static/libstealbatch_scheduler.a -Wl,--end-group
  ${SB_TBB} ${SB_NCCL} ${SB_CUBLAS} ${SB_CUBLASLT} ${SB_ZLIB} dl pthread rt)
