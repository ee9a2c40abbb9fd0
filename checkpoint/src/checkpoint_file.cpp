// A checkpoint file: the safetensors container with the data's crc32 in the metadata.
#include <stealbatch/checkpoint/checkpoint_file.hpp>
#include <stealbatch/checkpoint/durable_file.hpp>
#include <stealbatch/error.hpp>

#include <zlib.h>

#include <cstdio>
#include <cstring>
#include <limits>
#include <string_view>

namespace stealbatch {

namespace {

std::string hex8(std::uint32_t v) {
  char buf[9];
  std::snprintf(buf, sizeof buf, "%08x", v);
  return buf;
}

std::span<const std::byte> as_bytes_of(std::span<const float> v) { return std::as_bytes(v); }

[[noreturn]] void layout_error(const std::string& source, std::string_view name, const std::string& why) {
  throw CheckpointError(CheckpointError::Reason::kLayout, source, "tensor '" + std::string(name) + "' " + why);
}

// What the checksum covers besides the data: every tensor's name, dtype, shape and offsets in data order, and every
// metadata entry but the checksum's own, in key order, each length-prefixed so that no two headers read the same.
// A canonical form, not the header's bytes, so that it does not depend on how the JSON is spaced.
std::string covered_header(std::span<const SafetensorsTensor> tensors, const SafetensorsMetadata& metadata) {
  std::string out = "stealbatch checkpoint v2\n";
  const auto field = [&out](std::string_view s) { out.append(std::to_string(s.size())).append(":").append(s); };
  for (const SafetensorsTensor& t : tensors) {
    field(t.name);
    field(t.dtype);
    out += "[";
    for (std::uint64_t d : t.shape) out += std::to_string(d) + ",";
    out += "]" + std::to_string(t.begin) + "-" + std::to_string(t.end) + "\n";
  }
  for (const auto& [key, value] : metadata) {
    if (key == kCrcKey) continue;
    field(key);
    field(value);
    out += "\n";
  }
  return out;
}

std::uint32_t header_crc(std::span<const SafetensorsTensor> tensors, const SafetensorsMetadata& metadata) {
  const std::string h = covered_header(tensors, metadata);
  return crc32_of(std::as_bytes(std::span<const char>(h)));
}

// Well-formed UTF-8 (RFC 3629): no overlong forms, no surrogates, nothing above U+10FFFF.
bool is_utf8(std::string_view s) noexcept {
  for (std::size_t i = 0; i < s.size();) {
    const auto b = static_cast<unsigned char>(s[i]);
    std::size_t n = 0;
    std::uint32_t cp = 0, min = 0;
    if (b < 0x80) {
      ++i;
      continue;
    } else if ((b & 0xe0) == 0xc0) {
      n = 1, cp = b & 0x1fu, min = 0x80;
    } else if ((b & 0xf0) == 0xe0) {
      n = 2, cp = b & 0x0fu, min = 0x800;
    } else if ((b & 0xf8) == 0xf0) {
      n = 3, cp = b & 0x07u, min = 0x10000;
    } else {
      return false;
    }
    for (std::size_t k = 1; k <= n; ++k) {
      if (i + k >= s.size()) return false;
      const auto c = static_cast<unsigned char>(s[i + k]);
      if ((c & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (c & 0x3fu);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += n + 1;
  }
  return true;
}

}  // namespace

std::uint32_t crc32_of(std::span<const std::byte> bytes, std::uint32_t crc) noexcept {
  // zlib takes a uInt length: feed it in pieces of at most 1 GiB.
  uLong c = crc;
  while (!bytes.empty()) {
    const std::size_t n = std::min<std::size_t>(bytes.size(), std::size_t{1} << 30);
    c = ::crc32(c, reinterpret_cast<const Bytef*>(bytes.data()), static_cast<uInt>(n));
    bytes = bytes.subspan(n);
  }
  return static_cast<std::uint32_t>(c);
}

void write_checkpoint_file(const std::filesystem::path& path, std::span<const CheckpointTensor> tensors, SafetensorsMetadata metadata) {
  if (metadata.count(kCrcKey)) throw CheckpointError(CheckpointError::Reason::kFormat, path.string(), std::string("the metadata key '") + kCrcKey + "' is the checksum's");
  // The header is JSON, whose strings are UTF-8: refuse what it cannot hold, by name, before anything is written.
  const auto text = [&](const std::string& s, const std::string& what) {
    if (!is_utf8(s)) throw CheckpointError(CheckpointError::Reason::kFormat, path.string(), what + " is not UTF-8 text");
  };
  for (const auto& [k, v] : metadata) {
    text(k, "a metadata key");
    text(v, "metadata '" + k + "': its value");
  }
  for (const CheckpointTensor& t : tensors) text(t.name, "a tensor name");
  std::vector<SafetensorsTensor> entries;
  std::vector<std::span<const std::byte>> pieces(1);
  std::uint64_t at = 0;
  for (const CheckpointTensor& t : tensors) {
    std::uint64_t count = 1;
    for (std::uint64_t d : t.shape) count *= d;
    if (count != t.values.size()) {
      throw CheckpointError(CheckpointError::Reason::kFormat, path.string(),
                            "tensor '" + t.name + "': a shape of " + std::to_string(count) + " elements for " + std::to_string(t.values.size()) + " values");
    }
    entries.push_back({t.name, "F32", t.shape, at, at + t.values.size() * sizeof(float)});
    at = entries.back().end;
    pieces.push_back(as_bytes_of(t.values));
  }
  // The header as the reader will see it (its offsets included), then the data.
  std::uint32_t crc = header_crc(entries, metadata);
  for (std::size_t i = 1; i < pieces.size(); ++i) crc = crc32_of(pieces[i], crc);
  metadata.emplace(kCrcKey, hex8(crc));
  const std::string header = safetensors_header(entries, metadata);
  pieces[0] = std::as_bytes(std::span<const char>(header));
  write_file_durably(path, pieces);
}

CheckpointFile CheckpointFile::read(const std::filesystem::path& path) { return parse(read_whole_file(path), path.string()); }

CheckpointFile CheckpointFile::parse(std::vector<std::byte> bytes, const std::string& source) {
  CheckpointFile f;
  f.m_bytes = std::move(bytes);
  f.m_source = source;
  f.m_contents = parse_safetensors(f.m_bytes, source);  // views m_bytes, whose buffer a move of f keeps
  const auto it = f.m_contents.metadata().find(kCrcKey);
  if (it == f.m_contents.metadata().end()) {
    throw CheckpointError(CheckpointError::Reason::kChecksum, source, std::string("no checksum: the metadata has no '") + kCrcKey + "'");
  }
  f.m_crc = crc32_of(f.m_contents.data(), header_crc(f.m_contents.tensors(), f.m_contents.metadata()));
  const std::string actual = hex8(f.m_crc);
  if (it->second != actual) {
    const bool data_only = it->second == hex8(crc32_of(f.m_contents.data()));
    throw CheckpointError(CheckpointError::Reason::kChecksum, source,
                          data_only ? "its checksum covers the tensor data only (written by an older stealbatch): its header and metadata "
                                      "cannot be verified; resume from a checkpoint written by this version"
                                    : "checksum mismatch: the file says crc32 " + it->second + ", its header and data give " + actual +
                                          " (a changed byte in the tensors, their shapes or the metadata)");
  }
  return f;
}

std::vector<float> CheckpointFile::floats(std::string_view name, std::size_t count) const {
  const SafetensorsTensor* t = m_contents.find(name);
  if (t == nullptr) layout_error(m_source, name, "is missing");
  if (t->dtype != "F32") layout_error(m_source, name, "is " + t->dtype + ", expected F32");
  if (t->end - t->begin != count * sizeof(float)) {
    layout_error(m_source, name, "has " + std::to_string((t->end - t->begin) / sizeof(float)) + " elements, expected " + std::to_string(count));
  }
  std::vector<float> out(count);
  const auto bytes = m_contents.bytes_of(*t);
  if (count) std::memcpy(out.data(), bytes.data(), bytes.size());  // the data need not be aligned for floats
  return out;
}

}  // namespace stealbatch
