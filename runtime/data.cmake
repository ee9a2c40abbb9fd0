# stealbatch::data: the IDX reader and the Fashion-MNIST loader. Included from runtime/CMakeLists.txt.
find_package(ZLIB REQUIRED)
add_library(stealbatch_data src/idx.cpp)
add_library(stealbatch::data ALIAS stealbatch_data)
set_target_properties(stealbatch_data PROPERTIES EXPORT_NAME data OUTPUT_NAME stealbatch_data)
target_include_directories(stealbatch_data PUBLIC $<BUILD_INTERFACE:${CMAKE_CURRENT_SOURCE_DIR}/include>
                                                  $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
target_compile_features(stealbatch_data PUBLIC cxx_std_20)
# PUBLIC: a static library's consumers link zlib themselves, and the export then names ZLIB::ZLIB plainly.
target_link_libraries(stealbatch_data PUBLIC stealbatch::scheduler ZLIB::ZLIB)
sb_target_warnings(stealbatch_data)
