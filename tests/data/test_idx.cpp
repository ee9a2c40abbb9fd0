// IDX reader and Fashion-MNIST loader: gzip and plain round trips, each malformed input, and the real data set.
#include <stealbatch/error.hpp>
#include <stealbatch/data/idx.hpp>

#include <doctest/doctest.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <system_error>
#include <tuple>
#include <vector>

using namespace stealbatch;
namespace fs = std::filesystem;

namespace {

using Bytes = std::vector<std::uint8_t>;

const fs::path kFashionDir = "/usr/share/datasets/fashion-mnist";

// A fresh directory under the system temp dir, removed with its contents when the test ends (also on failure).
class TempDir {
 public:
  TempDir() {
    std::random_device rd;
    for (int attempt = 0; attempt < 100; ++attempt) {
      m_path = fs::temp_directory_path() / ("sb_test_idx_" + std::to_string(rd()) + std::to_string(rd()));
      if (fs::create_directory(m_path)) return;
    }
    throw std::runtime_error("TempDir: no unused name under " + fs::temp_directory_path().string());
  }
  ~TempDir() {
    std::error_code ec;  // cleanup is best effort: a destructor must not throw
    fs::remove_all(m_path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const fs::path& path() const { return m_path; }
  fs::path operator/(const std::string& name) const { return m_path / name; }

 private:
  fs::path m_path;
};

void put_be32(Bytes& out, std::uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<std::uint8_t>(v >> shift));
}

// Pixels from a fixed-seed generator: every byte value occurs, and gzip cannot shrink them to a few bytes, so a
// cut in the middle of the .gz file lands inside the deflate data.
Bytes image_pixels(std::size_t n) {
  std::mt19937 gen(42);
  Bytes px(n);
  for (auto& p : px) p = static_cast<std::uint8_t>(gen());
  return px;
}

Bytes images_file(std::uint32_t count, std::uint32_t rows, std::uint32_t cols, const Bytes& pixels) {
  Bytes out;
  put_be32(out, kIdxImagesMagic);
  put_be32(out, count);
  put_be32(out, rows);
  put_be32(out, cols);
  out.insert(out.end(), pixels.begin(), pixels.end());
  return out;
}

Bytes labels_file(const Bytes& labels) {
  Bytes out;
  put_be32(out, kIdxLabelsMagic);
  put_be32(out, static_cast<std::uint32_t>(labels.size()));
  out.insert(out.end(), labels.begin(), labels.end());
  return out;
}

void write_plain(const fs::path& path, const Bytes& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(out.good());
}

void write_gz(const fs::path& path, const Bytes& bytes) {
  gzFile f = gzopen(path.string().c_str(), "wb");
  REQUIRE(f != nullptr);
  const int written = gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
  const int closed = gzclose(f);
  REQUIRE(written == static_cast<int>(bytes.size()));
  REQUIRE(closed == Z_OK);
}

Bytes read_raw(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// The message of the DataError that f throws, so a test can check the file name and the key phrase.
template <class F>
std::string data_error_of(F&& f) {
  try {
    f();
  } catch (const DataError& e) {
    return e.what();
  }
  return "<no DataError thrown>";
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// A small Fashion-MNIST-shaped pair under the names load_fashion_mnist expects.
void write_split(const TempDir& dir, const std::string& prefix, std::uint32_t count, const Bytes& labels) {
  write_gz(dir / (prefix + "-images-idx3-ubyte.gz"), images_file(count, 3, 4, image_pixels(count * 12)));
  write_gz(dir / (prefix + "-labels-idx1-ubyte.gz"), labels_file(labels));
}

}  // namespace

TEST_CASE("Idx.GzipRoundTrip") {
  TempDir dir;
  const Bytes pixels = image_pixels(5 * 3 * 4);
  const Bytes labels{0, 9, 3, 3, 7};
  write_split(dir, "train", 5, labels);
  write_split(dir, "t10k", 2, Bytes{1, 2});

  const IdxImages im = read_idx_images(dir / "train-images-idx3-ubyte.gz");
  CHECK(im.count == 5);
  CHECK(im.rows == 3);
  CHECK(im.cols == 4);
  CHECK(im.pixels == pixels);
  CHECK(read_idx_labels(dir / "train-labels-idx1-ubyte.gz").labels == labels);
  CHECK(read_file_maybe_gzip(dir / "train-labels-idx1-ubyte.gz") == labels_file(labels));

  const Dataset train = load_fashion_mnist(dir.path(), DataSplit::kTrain);
  CHECK(train.count == 5);
  CHECK(train.features == 12);
  CHECK(train.y == labels);
  REQUIRE(train.x.size() == pixels.size());
  std::size_t off_scale = 0;  // one CHECK for all pixels keeps the assertion count meaningful
  for (std::size_t i = 0; i < pixels.size(); ++i) {
    if (train.x[i] != static_cast<float>(pixels[i]) / 255.0f) ++off_scale;
  }
  CHECK(off_scale == 0);

  const Dataset test = load_fashion_mnist(dir.path(), DataSplit::kTest);
  CHECK(test.count == 2);
  CHECK(test.y == Bytes{1, 2});
}

TEST_CASE("Idx.PlainFile") {
  TempDir dir;
  const Bytes pixels = image_pixels(2 * 5 * 6);
  write_plain(dir / "images.idx3-ubyte", images_file(2, 5, 6, pixels));
  write_plain(dir / "labels.idx1-ubyte", labels_file(Bytes{4, 8}));

  const IdxImages im = read_idx_images(dir / "images.idx3-ubyte");
  CHECK(im.count == 2);
  CHECK(im.rows == 5);
  CHECK(im.cols == 6);
  CHECK(im.pixels == pixels);
  CHECK(read_idx_labels(dir / "labels.idx1-ubyte").labels == Bytes{4, 8});

  // The in-memory parser a fuzzer drives gives the same result as the file path.
  const Bytes raw = images_file(2, 5, 6, pixels);
  CHECK(parse_idx_images(raw, "<memory>").pixels == pixels);
}

TEST_CASE("Idx.BadMagic") {
  TempDir dir;
  const fs::path plain = dir / "swapped.idx3-ubyte";
  write_plain(plain, labels_file(Bytes{1, 2, 3}));
  CHECK_THROWS_AS(read_idx_images(plain), DataError);
  const std::string msg = data_error_of([&] { read_idx_images(plain); });
  CHECK(contains(msg, plain.string()));
  CHECK(contains(msg, "bad magic 0x00000801, expected 0x00000803 (IDX images)"));
  CHECK(contains(msg, "this is an IDX labels file"));

  const fs::path gz = dir / "train-labels-idx1-ubyte.gz";
  write_gz(gz, images_file(1, 1, 1, Bytes{7}));
  CHECK_THROWS_AS(read_idx_labels(gz), DataError);
  const std::string gz_msg = data_error_of([&] { read_idx_labels(gz); });
  CHECK(contains(gz_msg, gz.string()));
  CHECK(contains(gz_msg, "bad magic 0x00000803, expected 0x00000801 (IDX labels)"));

  // Compressed data under a plain name: the hint says what happened.
  const fs::path unnamed = dir / "images.idx3-ubyte";
  write_plain(unnamed, read_raw(gz));
  const std::string unnamed_msg = data_error_of([&] { read_idx_images(unnamed); });
  CHECK(contains(unnamed_msg, unnamed.string()));
  CHECK(contains(unnamed_msg, "gzip-compressed but the name does not end in .gz"));
}

TEST_CASE("Idx.TruncatedGzip") {
  TempDir dir;
  const fs::path gz = dir / "train-images-idx3-ubyte.gz";
  write_gz(gz, images_file(10, 28, 28, image_pixels(10 * 28 * 28)));
  const Bytes whole = read_raw(gz);
  REQUIRE(whole.size() > 1000);
  write_plain(gz, Bytes(whole.begin(), whole.begin() + static_cast<std::ptrdiff_t>(whole.size() / 2)));
  CHECK_THROWS_AS(read_idx_images(gz), DataError);
  const std::string msg = data_error_of([&] { read_idx_images(gz); });
  CHECK(contains(msg, gz.string()));
  CHECK(contains(msg, "truncated gzip stream"));
  CHECK(contains(msg, "unexpected end of file"));
  CHECK(msg.find(gz.string(), 1) == std::string::npos);  // zlib's own "path: " prefix is not repeated

  // Only the 8-byte trailer missing: every pixel decompresses, and the stream is still incomplete.
  write_plain(gz, Bytes(whole.begin(), whole.end() - 8));
  CHECK_THROWS_AS(read_idx_images(gz), DataError);
  CHECK(contains(data_error_of([&] { read_idx_images(gz); }), "truncated gzip stream"));

  // A flipped byte in the deflate data: an invalid code, or a CRC mismatch at the end.
  Bytes flipped = whole;
  flipped[whole.size() / 2] ^= 0xff;
  write_plain(gz, flipped);
  CHECK_THROWS_AS(read_idx_images(gz), DataError);
  const std::string flip_msg = data_error_of([&] { read_idx_images(gz); });
  CHECK(contains(flip_msg, gz.string()));
  CHECK(contains(flip_msg, "gzip stream"));

  // Plain data under a .gz name: zlib would pass it through, the reader reports it.
  write_plain(gz, images_file(1, 1, 1, Bytes{7}));
  CHECK_THROWS_AS(read_idx_images(gz), DataError);
  const std::string plain_msg = data_error_of([&] { read_idx_images(gz); });
  CHECK(contains(plain_msg, gz.string()));
  CHECK(contains(plain_msg, "not gzip data"));
}

// Where a .gz file is damaged, in its compressed bytes (a decompressor finds a fault a few bytes after it at most), and
// what: its header or its data.
TEST_CASE("Idx.CorruptGzipSaysWhereAndWhat") {
  TempDir dir;
  const fs::path gz = dir / "train-images-idx3-ubyte.gz";
  write_gz(gz, images_file(10, 28, 28, image_pixels(10 * 28 * 28)));
  const Bytes whole = read_raw(gz);
  REQUIRE(whole.size() > 1000);
  const std::string size = std::to_string(whole.size());
  // The byte offset in "at byte N of", or -1.
  const auto at_byte = [](const std::string& msg) -> long long {
    const std::size_t at = msg.find("at byte ");
    return at == std::string::npos ? -1 : std::stoll(msg.substr(at + 8));
  };

  // The header: an unknown compression method (byte 2), then reserved flag bits (byte 3).
  for (const auto& [offset, value, what] : {std::tuple{2, 7, "unknown compression method"}, std::tuple{3, 0xe0, "unknown header flags set"}}) {
    CAPTURE(offset);
    Bytes bad = whole;
    bad[static_cast<std::size_t>(offset)] = static_cast<std::uint8_t>(value);
    write_plain(gz, bad);
    const std::string msg = data_error_of([&] { read_idx_images(gz); });
    CHECK(contains(msg, gz.string()));
    CHECK(contains(msg, "corrupt gzip header"));
    CHECK(contains(msg, what));
    CHECK(contains(msg, "of " + size + " compressed bytes"));
    CHECK(at_byte(msg) >= offset);
    CHECK(at_byte(msg) <= 10);  // within the 10-byte fixed header
    CHECK_FALSE(contains(msg, "decompressed bytes"));  // nothing was decompressed
  }

  // The deflate data, half way: found there, not at byte 0.
  Bytes flipped = whole;
  const std::size_t half = whole.size() / 2;
  flipped[half] ^= 0xff;
  write_plain(gz, flipped);
  const std::string msg = data_error_of([&] { read_idx_images(gz); });
  CHECK(contains(msg, gz.string()));
  CHECK(contains(msg, "corrupt gzip"));
  CHECK_FALSE(contains(msg, "past the first 0"));
  CHECK(at_byte(msg) > static_cast<long long>(half));
  CHECK(at_byte(msg) <= static_cast<long long>(whole.size()));

  // The CRC in the trailer: every byte decompresses, and the check at the end fails.
  Bytes crc = whole;
  crc[whole.size() - 8] ^= 0xff;
  write_plain(gz, crc);
  const std::string crc_msg = data_error_of([&] { read_idx_images(gz); });
  CHECK(contains(crc_msg, "the " + std::to_string(16 + 10 * 28 * 28) + " decompressed bytes do not match its CRC"));
  CHECK(at_byte(crc_msg) > static_cast<long long>(whole.size()) - 8);

  // Two members end to end decompress as one (gzip's concatenation), as zlib's own reader does.
  Bytes two = whole;
  two.insert(two.end(), whole.begin(), whole.end());
  write_plain(gz, two);
  Bytes expect = images_file(10, 28, 28, image_pixels(10 * 28 * 28));
  const Bytes once = expect;
  expect.insert(expect.end(), once.begin(), once.end());
  CHECK(read_file_maybe_gzip(gz) == expect);
}

TEST_CASE("Idx.TruncatedPayload") {
  TempDir dir;
  const fs::path images = dir / "train-images-idx3-ubyte.gz";
  Bytes short_images = images_file(4, 28, 28, image_pixels(100));
  write_gz(images, short_images);
  CHECK_THROWS_AS(read_idx_images(images), DataError);
  const std::string msg = data_error_of([&] { read_idx_images(images); });
  CHECK(contains(msg, images.string()));
  CHECK(contains(msg, "truncated: header says 4 images of 28x28 (3136 bytes), found 100 bytes"));

  const fs::path labels = dir / "labels.idx1-ubyte";
  Bytes short_labels = labels_file(Bytes{1, 2, 3, 4});
  short_labels.pop_back();
  write_plain(labels, short_labels);
  CHECK_THROWS_AS(read_idx_labels(labels), DataError);
  const std::string labels_msg = data_error_of([&] { read_idx_labels(labels); });
  CHECK(contains(labels_msg, labels.string()));
  CHECK(contains(labels_msg, "truncated: header says 4 labels (4 bytes), found 3 bytes"));

  // Cut inside the header itself.
  write_plain(labels, Bytes(short_labels.begin(), short_labels.begin() + 6));
  const std::string header_msg = data_error_of([&] { read_idx_labels(labels); });
  CHECK(contains(header_msg, labels.string()));
  CHECK(contains(header_msg, "truncated IDX labels header: found 6 bytes, expected 8"));
}

TEST_CASE("Idx.TrailingBytes") {
  TempDir dir;
  const fs::path images = dir / "train-images-idx3-ubyte.gz";
  Bytes long_images = images_file(2, 3, 3, image_pixels(18));
  long_images.insert(long_images.end(), {0xde, 0xad, 0xbe});
  write_gz(images, long_images);
  CHECK_THROWS_AS(read_idx_images(images), DataError);
  const std::string msg = data_error_of([&] { read_idx_images(images); });
  CHECK(contains(msg, images.string()));
  CHECK(contains(msg, "3 trailing bytes: header says 2 images of 3x3 (18 bytes), found 21 bytes"));

  const fs::path labels = dir / "labels.idx1-ubyte";
  Bytes long_labels = labels_file(Bytes{1, 2});
  long_labels.push_back(0);
  write_plain(labels, long_labels);
  CHECK_THROWS_AS(read_idx_labels(labels), DataError);
  const std::string labels_msg = data_error_of([&] { read_idx_labels(labels); });
  CHECK(contains(labels_msg, labels.string()));
  CHECK(contains(labels_msg, "1 trailing bytes: header says 2 labels (2 bytes), found 3 bytes"));
}

TEST_CASE("Idx.BadHeader") {
  struct Case {
    std::uint32_t count, rows, cols;
    const char* phrase;
  };
  const std::array<Case, 5> cases{{
      {0, 28, 28, "bad header: 0 images; expected 1..100000000"},
      {100'000'001, 1, 1, "bad header: 100000001 images; expected 1..100000000"},
      {10, 0, 28, "bad header: images of 0x28; each side must be 1..4096"},
      {10, 28, 4097, "bad header: images of 28x4097; each side must be 1..4096"},
      {257, 4096, 4096, "bad header: 257 images of 4096x4096 is 4311744512 bytes, more than the 4294967296 accepted"},
  }};
  for (const Case& c : cases) {
    CAPTURE(c.phrase);
    // A header alone: each check must fire before any allocation the header asks for.
    const Bytes header = images_file(c.count, c.rows, c.cols, Bytes{});
    CHECK_THROWS_AS(parse_idx_images(header, "<header>"), DataError);
    const std::string msg = data_error_of([&] { parse_idx_images(header, "<header>"); });
    CHECK(contains(msg, "<header>: "));
    CHECK(contains(msg, c.phrase));
  }
  CHECK(contains(data_error_of([] { parse_idx_labels(labels_file(Bytes{}), "<empty>"); }),
                 "<empty>: bad header: 0 labels"));
  CHECK(contains(data_error_of([] { parse_idx_images(Bytes{}, "<nothing>"); }),
                 "<nothing>: too short for an IDX images header: found 0 bytes, expected at least 16"));
}

TEST_CASE("Idx.CountMismatch") {
  TempDir dir;
  write_split(dir, "train", 5, Bytes{1, 2, 3, 4});
  CHECK_THROWS_AS(load_fashion_mnist(dir.path(), DataSplit::kTrain), DataError);
  const std::string msg = data_error_of([&] { load_fashion_mnist(dir.path(), DataSplit::kTrain); });
  CHECK(contains(msg, (dir / "train-images-idx3-ubyte.gz").string() + " holds 5 images"));
  CHECK(contains(msg, (dir / "train-labels-idx1-ubyte.gz").string() + " holds 4 labels"));
  CHECK(contains(msg, "the counts must match"));
}

TEST_CASE("Idx.LabelOutOfRange") {
  TempDir dir;
  write_split(dir, "t10k", 5, Bytes{0, 9, 1, 10, 255});
  CHECK_THROWS_AS(load_fashion_mnist(dir.path(), DataSplit::kTest), DataError);
  const std::string msg = data_error_of([&] { load_fashion_mnist(dir.path(), DataSplit::kTest); });
  CHECK(contains(msg, (dir / "t10k-labels-idx1-ubyte.gz").string()));
  CHECK(contains(msg, "label[3] = 10; Fashion-MNIST classes are 0..9"));
}

TEST_CASE("Idx.MissingFile") {
  TempDir dir;
  const fs::path missing = dir / "nope-images-idx3-ubyte.gz";
  CHECK_THROWS_AS(read_idx_images(missing), DataError);
  const std::string msg = data_error_of([&] { read_idx_images(missing); });
  CHECK(contains(msg, missing.string()));
  CHECK(contains(msg, "no such file"));

  // An empty data directory names the first file it looked for.
  const std::string load_msg = data_error_of([&] { load_fashion_mnist(dir.path(), DataSplit::kTrain); });
  CHECK(contains(load_msg, (dir / "train-images-idx3-ubyte.gz").string()));
  CHECK(contains(load_msg, "no such file"));

  const std::string dir_msg = data_error_of([&] { read_file_maybe_gzip(dir.path()); });
  CHECK(contains(dir_msg, dir.path().string()));
  CHECK(contains(dir_msg, "not a regular file"));
}

// The usage examples from idx.hpp, compiled and run against a small data set.
TEST_CASE("Idx.UsageExample") {
  TempDir tmp;
  write_split(tmp, "train", 3, Bytes{2, 0, 1});
  write_split(tmp, "t10k", 1, Bytes{5});
  const fs::path dir = tmp.path();

  const IdxImages im = read_idx_images(dir / "train-images-idx3-ubyte.gz");
  const std::uint8_t first = im.pixels[0];  // im.pixels.size() == im.count * im.rows * im.cols
  CHECK(im.pixels.size() == im.count * im.rows * im.cols);

  const IdxLabels lb = read_idx_labels(dir / "train-labels-idx1-ubyte.gz");
  const std::size_t n = lb.labels.size();
  CHECK(n == 3);

  const Dataset train = load_fashion_mnist(dir, DataSplit::kTrain);
  std::span<const float> item0(train.x.data(), train.features);  // train.y[0] in 0..9
  CHECK(item0[0] == static_cast<float>(first) / 255.0f);
  CHECK(train.y[0] == 2);
}

TEST_CASE("Idx.FashionMnist") {
  if (!fs::is_directory(kFashionDir)) {
    std::cout << "SB_SKIP: no Fashion-MNIST at " << kFashionDir.string() << "\n";
    return;
  }
  struct Split {
    DataSplit split;
    std::size_t count;
  };
  for (const Split s : {Split{DataSplit::kTrain, 60000}, Split{DataSplit::kTest, 10000}}) {
    CAPTURE(s.count);
    const Dataset d = load_fashion_mnist(kFashionDir, s.split);
    CHECK(d.count == s.count);
    CHECK(d.features == 784);
    REQUIRE(d.x.size() == d.count * d.features);
    REQUIRE(d.y.size() == d.count);
    const auto [lo, hi] = std::minmax_element(d.x.begin(), d.x.end());
    CHECK(*lo == 0.0f);
    CHECK(*hi == 1.0f);
    // Fashion-MNIST is balanced: 6000 items per class in train, 1000 in test.
    std::array<std::size_t, 10> per_class{};
    bool labels_in_range = true;
    for (const std::uint8_t y : d.y) {
      labels_in_range &= y < per_class.size();
      if (y < per_class.size()) ++per_class[y];
    }
    CHECK(labels_in_range);
    for (const std::size_t c : per_class) CHECK(c == s.count / 10);
  }
}
