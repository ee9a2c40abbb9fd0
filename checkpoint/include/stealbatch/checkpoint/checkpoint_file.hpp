// A stealbatch checkpoint file: safetensors holding F32 tensors, with a crc32 (zlib) in the metadata under
// "stealbatch.crc32" (8 hex digits), checked on every read. It covers the whole file but itself: every tensor's name,
// dtype, shape and offsets, every other metadata entry (the epoch, the position, the optimizer's step count...), and
// the data.
#pragma once

#include <stealbatch/checkpoint/safetensors.hpp>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

namespace stealbatch {

inline constexpr const char* kCrcKey = "stealbatch.crc32";

struct CheckpointTensor {
  std::string name;
  std::vector<std::uint64_t> shape;  // its element count is values.size()
  std::span<const float> values;
};

// Writes the tensors in this order and the metadata (plus the checksum), crash-safe (write_file_durably).
// Throws CheckpointError: kIo, or kFormat for a shape that does not match its values or a metadata key "stealbatch.crc32".
void write_checkpoint_file(const std::filesystem::path& path, std::span<const CheckpointTensor> tensors, SafetensorsMetadata metadata);

// A checkpoint read whole and checked: the format, then the checksum. The parsed view points into bytes().
class CheckpointFile {
 public:
  static CheckpointFile read(const std::filesystem::path& path);
  // The same checks on bytes already in memory; `source` names them in errors.
  static CheckpointFile parse(std::vector<std::byte> bytes, const std::string& source);
  CheckpointFile(CheckpointFile&&) = default;  // the parsed view moves with the buffer it points into
  CheckpointFile& operator=(CheckpointFile&&) = default;
  CheckpointFile(const CheckpointFile&) = delete;
  CheckpointFile& operator=(const CheckpointFile&) = delete;

  const Safetensors& contents() const noexcept { return m_contents; }
  const std::string& source() const noexcept { return m_source; }
  std::uint32_t crc32() const noexcept { return m_crc; }  // the header's and the data's, checked equal to the one recorded
  // The F32 tensor `name` with `count` elements, copied out; CheckpointError (kLayout) naming the tensor when it is
  // missing, of another dtype or of another size.
  std::vector<float> floats(std::string_view name, std::size_t count) const;

 private:
  CheckpointFile() = default;
  std::vector<std::byte> m_bytes;
  Safetensors m_contents;
  std::string m_source;
  std::uint32_t m_crc = 0;
};

// The crc32 of bytes (zlib's), continued from `crc`.
std::uint32_t crc32_of(std::span<const std::byte> bytes, std::uint32_t crc = 0) noexcept;

}  // namespace stealbatch
