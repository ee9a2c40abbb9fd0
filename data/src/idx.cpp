// IDX parsing with exact-length and sanity checks, gzip reading through zlib, and the Fashion-MNIST loader.
#include <stealbatch/error.hpp>
#include <stealbatch/data/idx.hpp>

#include <zlib.h>

#include <array>
#include <cerrno>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <system_error>
#include <type_traits>
#include <utility>

namespace stealbatch {

namespace {

constexpr std::size_t kImagesHeaderBytes = 16;  // magic, count, rows, cols
constexpr std::size_t kLabelsHeaderBytes = 8;   // magic, count
constexpr unsigned kGzChunk = 1u << 20;         // per gzread call; fits its int return value

struct GzCloser {
  // The return value only reports write-side errors; for a read handle every error was already seen by gzread.
  void operator()(gzFile f) const noexcept { gzclose(f); }
};
using GzHandle = std::unique_ptr<std::remove_pointer_t<gzFile>, GzCloser>;

std::string hex32(std::uint32_t v) {
  std::array<char, 16> buf{};
  std::snprintf(buf.data(), buf.size(), "0x%08x", static_cast<unsigned>(v));
  return buf.data();
}

std::uint32_t load_be32(std::span<const std::uint8_t> b, std::size_t at) {
  return (std::uint32_t{b[at]} << 24) | (std::uint32_t{b[at + 1]} << 16) | (std::uint32_t{b[at + 2]} << 8) |
         std::uint32_t{b[at + 3]};
}

[[noreturn]] void fail(const std::string& name, const std::string& what) { throw DataError(name + ": " + what); }

// zlib's message, without the "path: " zlib puts in front of it, which fail() already adds.
std::string gz_message(gzFile f, const std::string& name, int& err) {
  std::string msg = gzerror(f, &err);
  if (msg.starts_with(name + ": ")) msg.erase(0, name.size() + 2);
  return msg;
}

// A hint for the two mix-ups that produce a bad magic in practice: the wrong file of the pair, and an
// uncompressed name on compressed data.
std::string magic_hint(std::span<const std::uint8_t> b, std::uint32_t magic) {
  if (magic == kIdxImagesMagic) return "; this is an IDX images file";
  if (magic == kIdxLabelsMagic) return "; this is an IDX labels file";
  if (b[0] == 0x1f && b[1] == 0x8b) return "; the data is gzip-compressed but the name does not end in .gz";
  return "";
}

void check_magic(std::span<const std::uint8_t> b, const std::string& name, std::uint32_t want, const char* kind,
                 std::size_t header_bytes) {
  if (b.size() < 4) {
    fail(name, "too short for an IDX " + std::string(kind) + " header: found " + std::to_string(b.size()) +
                   " bytes, expected at least " + std::to_string(header_bytes));
  }
  const std::uint32_t magic = load_be32(b, 0);
  if (magic != want) {
    fail(name,
         "bad magic " + hex32(magic) + ", expected " + hex32(want) + " (IDX " + kind + ")" + magic_hint(b, magic));
  }
  if (b.size() < header_bytes) {
    fail(name, "truncated IDX " + std::string(kind) + " header: found " + std::to_string(b.size()) +
                   " bytes, expected " + std::to_string(header_bytes));
  }
}

void check_count(const std::string& name, std::size_t count, const char* kind) {
  if (count == 0 || count > kIdxMaxCount) {
    fail(name, "bad header: " + std::to_string(count) + " " + kind + "; expected 1.." + std::to_string(kIdxMaxCount));
  }
}

// Checks the payload length exactly; `described` is the header's claim, e.g. "60000 images of 28x28".
void check_length(std::span<const std::uint8_t> b, const std::string& name, std::size_t header_bytes,
                  std::uint64_t payload, const std::string& described) {
  const std::uint64_t found = b.size() - header_bytes;
  const std::string claim = "header says " + described + " (" + std::to_string(payload) + " bytes)";
  if (found < payload) fail(name, "truncated: " + claim + ", found " + std::to_string(found) + " bytes");
  if (found > payload) {
    fail(name,
         std::to_string(found - payload) + " trailing bytes: " + claim + ", found " + std::to_string(found) + " bytes");
  }
}

std::vector<std::uint8_t> read_gzip(const std::filesystem::path& path) {
  const std::string name = path.string();
  errno = 0;
  GzHandle f(gzopen(name.c_str(), "rb"));
  if (!f) {
    fail(name, "cannot open: " + (errno != 0 ? std::generic_category().message(errno) : std::string("out of memory")));
  }
  gzbuffer(f.get(), 256 * 1024);  // the default 8 KiB costs several times more read calls on a 26 MB file
  // zlib would pass a non-gzip file through unchanged; a .gz name on plain data is a mix-up worth reporting.
  if (gzdirect(f.get()) == 1) fail(name, "not gzip data (no 1f 8b header), though the name ends in .gz");

  std::vector<std::uint8_t> out;
  for (;;) {
    const std::size_t at = out.size();
    if (at > kIdxMaxFileBytes) {
      fail(name,
           "decompresses to more than " + std::to_string(kIdxMaxFileBytes) + " bytes, the largest IDX file accepted");
    }
    out.resize(at + kGzChunk);
    const int n = gzread(f.get(), out.data() + at, kGzChunk);
    if (n < 0) {
      int err = Z_OK;
      const std::string msg = gz_message(f.get(), name, err);
      // zlib fails the whole read: the fault lies somewhere in the next kGzChunk decompressed bytes, or in the
      // stream's CRC and length trailer after them.
      fail(name, "corrupt gzip stream (" + msg + "), past the first " + std::to_string(at) + " decompressed bytes" +
                     (msg.find("data check") != std::string::npos ? ": the data does not match its CRC, so the file is damaged" : ""));
    }
    out.resize(at + static_cast<std::size_t>(n));
    if (n == 0) break;
  }
  // A stream cut short ends with a short read and Z_BUF_ERROR rather than a negative return.
  int err = Z_OK;
  const std::string msg = gz_message(f.get(), name, err);
  if (err != Z_OK) {
    fail(name, std::string(err == Z_BUF_ERROR ? "truncated gzip stream" : "gzip error") + " after " +
                   std::to_string(out.size()) + " decompressed bytes: " + msg);
  }
  return out;
}

std::vector<std::uint8_t> read_plain(const std::filesystem::path& path, std::uintmax_t size) {
  const std::string name = path.string();
  if (size > kIdxMaxFileBytes) {
    fail(name, std::to_string(size) + " bytes, more than " + std::to_string(kIdxMaxFileBytes) +
                   ", the largest IDX file accepted");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(name, "cannot open for reading");
  std::vector<std::uint8_t> out(static_cast<std::size_t>(size));
  in.read(reinterpret_cast<char*>(out.data()), static_cast<std::streamsize>(out.size()));
  if (static_cast<std::uintmax_t>(in.gcount()) != size) {
    fail(name, "read " + std::to_string(in.gcount()) + " bytes, expected the file size " + std::to_string(size));
  }
  return out;
}

}  // namespace

std::vector<std::uint8_t> read_file_maybe_gzip(const std::filesystem::path& path) {
  std::error_code ec;
  const std::filesystem::file_status st = std::filesystem::status(path, ec);
  if (!std::filesystem::exists(st)) {
    fail(path.string(), "no such file; expected an IDX file (gzip-compressed when the name ends in .gz)");
  }
  if (!std::filesystem::is_regular_file(st)) fail(path.string(), "not a regular file; expected an IDX file");
  if (path.extension() == ".gz") return read_gzip(path);
  const std::uintmax_t size = std::filesystem::file_size(path, ec);
  if (ec) fail(path.string(), "cannot read the file size: " + ec.message());
  return read_plain(path, size);
}

IdxImages parse_idx_images(std::span<const std::uint8_t> bytes, const std::string& name) {
  check_magic(bytes, name, kIdxImagesMagic, "images", kImagesHeaderBytes);
  const std::size_t count = load_be32(bytes, 4), rows = load_be32(bytes, 8), cols = load_be32(bytes, 12);
  check_count(name, count, "images");
  if (rows == 0 || cols == 0 || rows > kIdxMaxSide || cols > kIdxMaxSide) {
    fail(name, "bad header: images of " + std::to_string(rows) + "x" + std::to_string(cols) +
                   "; each side must be 1.." + std::to_string(kIdxMaxSide));
  }
  // count <= 1e8 and rows * cols <= 2^24, so the product cannot overflow 64 bits.
  const std::uint64_t payload = std::uint64_t{count} * rows * cols;
  const std::string described =
      std::to_string(count) + " images of " + std::to_string(rows) + "x" + std::to_string(cols);
  if (payload > kIdxMaxPixels) {
    fail(name, "bad header: " + described + " is " + std::to_string(payload) + " bytes, more than the " +
                   std::to_string(kIdxMaxPixels) + " accepted");
  }
  check_length(bytes, name, kImagesHeaderBytes, payload, described);
  IdxImages out;
  out.count = count;
  out.rows = rows;
  out.cols = cols;
  const auto body = bytes.subspan(kImagesHeaderBytes);
  out.pixels.assign(body.begin(), body.end());
  return out;
}

IdxLabels parse_idx_labels(std::span<const std::uint8_t> bytes, const std::string& name) {
  check_magic(bytes, name, kIdxLabelsMagic, "labels", kLabelsHeaderBytes);
  const std::size_t count = load_be32(bytes, 4);
  check_count(name, count, "labels");
  check_length(bytes, name, kLabelsHeaderBytes, count, std::to_string(count) + " labels");
  const auto body = bytes.subspan(kLabelsHeaderBytes);
  return IdxLabels{std::vector<std::uint8_t>(body.begin(), body.end())};
}

IdxImages read_idx_images(const std::filesystem::path& path) {
  return parse_idx_images(read_file_maybe_gzip(path), path.string());
}

IdxLabels read_idx_labels(const std::filesystem::path& path) {
  return parse_idx_labels(read_file_maybe_gzip(path), path.string());
}

Dataset load_fashion_mnist(const std::filesystem::path& dir, DataSplit split) {
  constexpr std::size_t kClasses = 10;
  const std::string prefix = split == DataSplit::kTrain ? "train" : "t10k";
  const std::filesystem::path images_path = dir / (prefix + "-images-idx3-ubyte.gz");
  const std::filesystem::path labels_path = dir / (prefix + "-labels-idx1-ubyte.gz");
  IdxImages images = read_idx_images(images_path);
  IdxLabels labels = read_idx_labels(labels_path);
  if (images.count != labels.labels.size()) {
    throw DataError(images_path.string() + " holds " + std::to_string(images.count) + " images but " +
                    labels_path.string() + " holds " + std::to_string(labels.labels.size()) +
                    " labels; the counts must match");
  }
  for (std::size_t i = 0; i < labels.labels.size(); ++i) {
    if (labels.labels[i] >= kClasses) {
      fail(labels_path.string(), "label[" + std::to_string(i) + "] = " + std::to_string(labels.labels[i]) +
                                     "; Fashion-MNIST classes are 0.." + std::to_string(kClasses - 1));
    }
  }

  // Dividing (not multiplying by 1/255) keeps 255 at exactly 1.0f.
  std::array<float, 256> scale{};
  for (std::size_t v = 0; v < scale.size(); ++v) scale[v] = static_cast<float>(v) / 255.0f;
  Dataset out;
  out.count = images.count;
  out.features = images.rows * images.cols;
  out.rows = images.rows, out.cols = images.cols;
  out.x.resize(images.pixels.size());
  for (std::size_t i = 0; i < images.pixels.size(); ++i) out.x[i] = scale[images.pixels[i]];
  out.y = std::move(labels.labels);
  return out;
}

void check_splits(const Dataset& train, const Dataset& test, const std::string& where) {
  if (test.rows == train.rows && test.cols == train.cols) return;
  throw DataError("data = '" + where + "': the test images are " + std::to_string(test.rows) + "x" + std::to_string(test.cols) +
                  ", the training images " + std::to_string(train.rows) + "x" + std::to_string(train.cols) +
                  ": every split must have the training set's size");
}

}  // namespace stealbatch
