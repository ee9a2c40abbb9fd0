# Finds oneDNN's CPU library and headers (Debian's libdnnl-dev). Its own dnnl-config.cmake also requires the OpenCL
# headers for its GPU runtime, which the CPU path here never uses. Defines OneDNN::dnnl, OneDNN_FOUND, OneDNN_VERSION.
find_path(OneDNN_INCLUDE_DIR NAMES oneapi/dnnl/dnnl.hpp HINTS "${DNNL_ROOT}" "$ENV{DNNL_ROOT}" PATH_SUFFIXES include)
find_library(OneDNN_LIBRARY NAMES dnnl HINTS "${DNNL_ROOT}" "$ENV{DNNL_ROOT}" PATH_SUFFIXES lib lib64 lib/x86_64-linux-gnu)
if(OneDNN_INCLUDE_DIR AND EXISTS "${OneDNN_INCLUDE_DIR}/oneapi/dnnl/dnnl_version.h")
  file(STRINGS "${OneDNN_INCLUDE_DIR}/oneapi/dnnl/dnnl_version.h" _dnnl_defs REGEX "^#define DNNL_VERSION_(MAJOR|MINOR|PATCH) +[0-9]+")
  foreach(_part MAJOR MINOR PATCH)
    string(REGEX MATCH "DNNL_VERSION_${_part} +([0-9]+)" _m "${_dnnl_defs}")
    set(_dnnl_${_part} "${CMAKE_MATCH_1}")
  endforeach()
  set(OneDNN_VERSION "${_dnnl_MAJOR}.${_dnnl_MINOR}.${_dnnl_PATCH}")
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(OneDNN REQUIRED_VARS OneDNN_LIBRARY OneDNN_INCLUDE_DIR VERSION_VAR OneDNN_VERSION)
mark_as_advanced(OneDNN_INCLUDE_DIR OneDNN_LIBRARY)

if(OneDNN_FOUND AND NOT TARGET OneDNN::dnnl)
  add_library(OneDNN::dnnl UNKNOWN IMPORTED)
  set_target_properties(OneDNN::dnnl PROPERTIES IMPORTED_LOCATION "${OneDNN_LIBRARY}" INTERFACE_INCLUDE_DIRECTORIES "${OneDNN_INCLUDE_DIR}")
endif()
