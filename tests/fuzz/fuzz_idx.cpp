// libFuzzer target for the dataset reader: any bytes, as raw IDX images and labels, and as a .gz file through the
// file reader. The only exception allowed out of the reader is DataError; anything else, or a sanitizer report,
// is a crash.
//
//   cmake -S . -B build-fuzz -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DSTEALBATCH_FUZZ=ON -DSTEALBATCH_CUDA=OFF
//   ninja -C build-fuzz fuzz_idx && build-fuzz/tests/fuzz/fuzz_idx -max_total_time=300 /tmp/corpus tests/fuzz/corpus
#include <stealbatch/error.hpp>
#include <stealbatch/data/idx.hpp>

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>

namespace {

const std::filesystem::path& scratch_file() {
  static const std::filesystem::path p = std::filesystem::temp_directory_path() / ("stealbatch_fuzz_" + std::to_string(getpid()) + ".gz");
  return p;
}

template <class F>
void expect_only_data_errors(F&& f) {
  try {
    f();
  } catch (const stealbatch::DataError&) {
    // the documented failure
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::uint8_t> bytes(data, size);
  expect_only_data_errors([&] { (void)stealbatch::parse_idx_images(bytes, "<fuzz input>"); });
  expect_only_data_errors([&] { (void)stealbatch::parse_idx_labels(bytes, "<fuzz input>"); });
  {
    std::ofstream out(scratch_file(), std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  expect_only_data_errors([&] { (void)stealbatch::read_idx_images(scratch_file()); });
  expect_only_data_errors([&] { (void)stealbatch::read_idx_labels(scratch_file()); });
  return 0;
}
