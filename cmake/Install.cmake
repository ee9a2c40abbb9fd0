# Installs the public headers and libraries, and the package config for find_package(stealbatch).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(_sb_targets stealbatch_base stealbatch_scheduler stealbatch_checkpoint stealbatch_runtime stealbatch_data)
install(DIRECTORY base/include/ scheduler/include/ checkpoint/include/ runtime/include/ data/include/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} PATTERN "*.in" EXCLUDE)
if(STEALBATCH_CUDA)
  list(APPEND _sb_targets stealbatch_cuda)
  install(DIRECTORY cuda/include/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
  install(FILES cmake/FindNCCL.cmake DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/stealbatch)
endif()
if(STEALBATCH_TORCH)
  list(APPEND _sb_targets stealbatch_torch)
  install(DIRECTORY torch/include/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
endif()
if(STEALBATCH_MPI)
  list(APPEND _sb_targets stealbatch_mpi)
  install(DIRECTORY mpi/include/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
endif()
install(TARGETS ${_sb_targets} EXPORT stealbatchTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT stealbatchTargets NAMESPACE stealbatch:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/stealbatch)
configure_package_config_file(cmake/stealbatchConfig.cmake.in "${CMAKE_CURRENT_BINARY_DIR}/stealbatchConfig.cmake"
                              INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/stealbatch)
write_basic_package_version_file("${CMAKE_CURRENT_BINARY_DIR}/stealbatchConfigVersion.cmake" COMPATIBILITY SameMinorVersion)
install(FILES "${CMAKE_CURRENT_BINARY_DIR}/stealbatchConfig.cmake" "${CMAKE_CURRENT_BINARY_DIR}/stealbatchConfigVersion.cmake"
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/stealbatch)
