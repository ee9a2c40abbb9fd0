// Reads IDX files (gzip-compressed or plain) and loads Fashion-MNIST as float features and uint8 labels.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

namespace stealbatch {

inline constexpr std::uint32_t kIdxImagesMagic = 0x00000803;  // unsigned byte data, 3 dimensions
inline constexpr std::uint32_t kIdxLabelsMagic = 0x00000801;  // unsigned byte data, 1 dimension

// Limits past which a header is taken as corrupt rather than as a request to allocate: real IDX image sets are
// 28x28 or so, and the largest public ones hold a few million images.
inline constexpr std::size_t kIdxMaxSide = 4096;
inline constexpr std::size_t kIdxMaxCount = 100'000'000;
inline constexpr std::uint64_t kIdxMaxPixels = std::uint64_t{1} << 32;
// The largest file read_file_maybe_gzip accepts (a 16-byte header plus kIdxMaxPixels), so a gzip bomb stops here.
inline constexpr std::uint64_t kIdxMaxFileBytes = 16 + kIdxMaxPixels;

// Images stored row-major, one byte per pixel: pixel (i, r, c) is pixels[(i * rows + r) * cols + c].
//   const IdxImages im = read_idx_images(dir / "train-images-idx3-ubyte.gz");
//   const std::uint8_t first = im.pixels[0];  // im.pixels.size() == im.count * im.rows * im.cols
struct IdxImages {
  std::size_t count = 0;
  std::size_t rows = 0;
  std::size_t cols = 0;
  std::vector<std::uint8_t> pixels;
};

// One byte per item; IDX itself puts no bound on the value (load_fashion_mnist checks < 10).
//   const IdxLabels lb = read_idx_labels(dir / "train-labels-idx1-ubyte.gz");
//   const std::size_t n = lb.labels.size();
struct IdxLabels {
  std::vector<std::uint8_t> labels;
};

// Which half of Fashion-MNIST to load: train-* (60000 items) or t10k-* (10000 items).
enum class DataSplit { kTrain, kTest };

// Features scaled to [0, 1], row-major: item i is x[i * features, (i + 1) * features); y[i] is its class.
//   const Dataset train = load_fashion_mnist("/usr/share/datasets/fashion-mnist", DataSplit::kTrain);
//   std::span<const float> item0(train.x.data(), train.features);  // train.y[0] in 0..9
struct Dataset {
  std::size_t count = 0;
  std::size_t features = 0;  // rows * cols
  std::size_t rows = 0, cols = 0;
  std::vector<float> x;
  std::vector<std::uint8_t> y;
};

// The whole file, decompressed when its name ends in ".gz" (a .gz file that is not gzip is an error, as is a
// truncated or corrupt stream; gzip members end to end read as one). Throws DataError naming the file and, for a
// damaged stream, whether its header, its data or its CRC failed and at which compressed byte that was found.
std::vector<std::uint8_t> read_file_maybe_gzip(const std::filesystem::path& path);

// Parse decompressed IDX bytes. `name` only labels the error messages (a path, or "<fuzz input>"). The header must
// be sane and the length exact: truncated data and trailing bytes both throw DataError.
IdxImages parse_idx_images(std::span<const std::uint8_t> bytes, const std::string& name);
IdxLabels parse_idx_labels(std::span<const std::uint8_t> bytes, const std::string& name);

// read_file_maybe_gzip, then parse.
IdxImages read_idx_images(const std::filesystem::path& path);
IdxLabels read_idx_labels(const std::filesystem::path& path);

// Reads {train,t10k}-{images-idx3,labels-idx1}-ubyte.gz from dir, checks that the counts agree and that every
// label is below 10, and scales pixels to [0, 1]. Throws DataError.
Dataset load_fashion_mnist(const std::filesystem::path& dir, DataSplit split);

// Every split must be what one model reads: images of the training set's size. Throws DataError naming `where`
// (the folder), both sizes and the split that differs; checked before training, so that a mismatched test set is
// neither found after the last epoch nor read out of bounds.
void check_splits(const Dataset& train, const Dataset& test, const std::string& where);

}  // namespace stealbatch
