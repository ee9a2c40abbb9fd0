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
constexpr unsigned kGzChunk = 1u << 20;         // decompressed bytes per inflate call

constexpr std::size_t kGzIn = 256 * 1024;       // compressed bytes per read: the default 8 KiB costs several times more read calls on a 26 MB file

struct FileCloser {
  void operator()(std::FILE* f) const noexcept { std::fclose(f); }  // a read handle: every error was seen by fread
};
using FileHandle = std::unique_ptr<std::FILE, FileCloser>;

// An inflate stream that ends itself.
struct Inflater {
  z_stream z{};
  gz_header head{};  // head.done turns 1 once a member's header is read: a fault before then is in the header
  Inflater() = default;
  Inflater(const Inflater&) = delete;
  Inflater& operator=(const Inflater&) = delete;
  ~Inflater() { inflateEnd(&z); }
};

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

// What went wrong in zlib's inflate (rc, neither Z_OK nor the stream's end) `where` in the compressed file, after
// `decompressed` bytes: named for a reader who must find the damage.
[[noreturn]] void fail_inflate(const std::string& name, int rc, const Inflater& inf, const std::string& where, std::size_t decompressed_bytes) {
  const std::string why = inf.z.msg != nullptr ? inf.z.msg : zError(rc);
  const std::string decompressed = std::to_string(decompressed_bytes) + " decompressed bytes";
  if (rc == Z_BUF_ERROR) {
    fail(name, "truncated gzip stream after " + decompressed + ": unexpected end of file " + where + (inf.head.done == 1 ? "" : ", in the header"));
  }
  if (rc == Z_MEM_ERROR) fail(name, "zlib ran out of memory after " + decompressed);
  if (inf.head.done != 1) fail(name, "corrupt gzip header (" + why + "), found " + where);
  if (why.find("data check") != std::string::npos || why.find("length check") != std::string::npos) {
    fail(name, "corrupt gzip stream: the " + decompressed + " do not match its CRC and length in the trailer (" + why + "), checked " + where +
                   "; the damage lies before that");
  }
  fail(name, "corrupt gzip stream (" + why + "), found " + where + " (the damage is there or a little before), after " + decompressed);
}

// The whole gzip file, decompressed; members end to end (gzip's concatenation) as one, bytes after the last member
// that are not a member ignored, as zlib's gzread does. A fault is reported where the decompressor met it in the
// compressed file (at most a few bytes past the damaged one), and as a fault of the header, of the data, or of the
// CRC in the trailer.
std::vector<std::uint8_t> read_gzip(const std::filesystem::path& path) {
  const std::string name = path.string();
  errno = 0;
  FileHandle f(std::fopen(name.c_str(), "rb"));
  if (!f) fail(name, "cannot open: " + std::generic_category().message(errno));
  std::error_code ec;
  const std::uintmax_t compressed = std::filesystem::file_size(path, ec);
  const std::string of_size = ec ? std::string(" of the compressed file") : " of " + std::to_string(compressed) + " compressed bytes";

  Inflater inf;
  if (inflateInit2(&inf.z, 15 + 16) != Z_OK) fail(name, "cannot start zlib's decompressor: out of memory");  // 15 + 16: a gzip wrapper
  inflateGetHeader(&inf.z, &inf.head);
  std::vector<std::uint8_t> in(kGzIn), out;
  bool eof = false;
  const auto refill = [&] {
    const std::size_t n = std::fread(in.data(), 1, in.size(), f.get());
    if (std::ferror(f.get())) fail(name, "cannot read: " + std::generic_category().message(errno));
    eof = std::feof(f.get()) != 0;
    inf.z.next_in = in.data(), inf.z.avail_in = static_cast<uInt>(n);
  };
  refill();
  // zlib would say "incorrect header check"; a .gz name on plain data is the likely mix-up.
  if (inf.z.avail_in < 2 || in[0] != 0x1f || in[1] != 0x8b) fail(name, "not gzip data (no 1f 8b header), though the name ends in .gz");
  std::uint64_t consumed = 0;  // compressed bytes inflated so far
  for (;;) {
    if (inf.z.avail_in == 0 && !eof) refill();
    const std::size_t at = out.size();
    if (at > kIdxMaxFileBytes) {
      fail(name, "decompresses to more than " + std::to_string(kIdxMaxFileBytes) + " bytes, the largest IDX file accepted");
    }
    out.resize(at + kGzChunk);
    inf.z.next_out = out.data() + at, inf.z.avail_out = kGzChunk;
    const uInt before = inf.z.avail_in;
    const int rc = inflate(&inf.z, Z_NO_FLUSH);
    out.resize(out.size() - inf.z.avail_out);
    consumed += before - inf.z.avail_in;
    if (rc == Z_STREAM_END) {
      // Another member may follow; anything else after the stream is ignored.
      if (inf.z.avail_in == 0 && !eof) refill();
      if (inf.z.avail_in == 0 || inf.z.next_in[0] != 0x1f || (inf.z.avail_in > 1 && inf.z.next_in[1] != 0x8b)) break;
      inflateReset(&inf.z);
      inflateGetHeader(&inf.z, &inf.head);
      continue;
    }
    if (rc == Z_OK || (rc == Z_BUF_ERROR && !(eof && inf.z.avail_in == 0))) continue;
    fail_inflate(name, rc, inf, "at byte " + std::to_string(consumed) + of_size, out.size());
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
