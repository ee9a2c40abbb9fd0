// libFuzzer target for a dataset's splits: any bytes, cut into the four files of a Fashion-MNIST folder (training
// and test images and labels), each gzipped into a scratch folder, then loaded as the examples load them: both
// splits, then check_splits(). The only exception allowed out is DataError; a pair that passes must be one a model
// can read (images of one size, every array the size its header says). Anything else, or a sanitizer report, is a
// crash.
//
// The input: three 16-bit little-endian lengths, then the training images, the training labels and the test images
// of those lengths (each cut at what is left), then the test labels (the rest).
//
//   ninja -C build-fuzz fuzz_splits && build-fuzz/tests/fuzz/fuzz_splits -max_total_time=300 /tmp/corpus tests/fuzz/splits_corpus
#include <stealbatch/data/idx.hpp>
#include <stealbatch/error.hpp>

#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>

namespace {

const std::filesystem::path& scratch_dir() {
  static const std::filesystem::path p = [] {
    auto d = std::filesystem::temp_directory_path() / ("stealbatch_fuzz_splits_" + std::to_string(getpid()));
    std::filesystem::create_directories(d);
    return d;
  }();
  return p;
}

void write_gz(const std::filesystem::path& path, std::span<const std::uint8_t> bytes) {
  gzFile f = gzopen(path.c_str(), "wb1");
  if (f == nullptr) __builtin_trap();
  if (!bytes.empty() && gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())) != static_cast<int>(bytes.size())) __builtin_trap();
  gzclose(f);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 6) return 0;
  std::span<const std::uint8_t> rest(data + 6, size - 6);
  static const std::array<const char*, 4> names = {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz",
                                                   "t10k-labels-idx1-ubyte.gz"};
  for (std::size_t i = 0; i < 4; ++i) {
    const std::size_t want = i < 3 ? static_cast<std::size_t>(data[2 * i]) | (static_cast<std::size_t>(data[2 * i + 1]) << 8) : rest.size();
    const std::size_t n = std::min(want, rest.size());
    write_gz(scratch_dir() / names[i], rest.first(n));
    rest = rest.subspan(n);
  }
  try {
    const stealbatch::Dataset train = stealbatch::load_fashion_mnist(scratch_dir(), stealbatch::DataSplit::kTrain);
    const stealbatch::Dataset test = stealbatch::load_fashion_mnist(scratch_dir(), stealbatch::DataSplit::kTest);
    stealbatch::check_splits(train, test, scratch_dir().string());
    // Passed: what a model reads of either split is there.
    if (train.features != test.features || train.features != train.rows * train.cols) __builtin_trap();
    for (const stealbatch::Dataset* d : {&train, &test}) {
      if (d->x.size() != d->count * d->features || d->y.size() != d->count) __builtin_trap();
    }
  } catch (const stealbatch::DataError&) {
    // the documented failure
  }
  return 0;
}
