// The safetensors format (huggingface/safetensors): an 8-byte little-endian header length N, N bytes of JSON naming
// each tensor's dtype, shape and [begin, end) byte offsets into the data that follows, and an optional
// "__metadata__" object of strings; then the tensors' raw little-endian bytes, back to back, with no holes.
//
//   {"fc1.weight":{"dtype":"F32","shape":[256,784],"data_offsets":[0,802816]}, ..., "__metadata__":{"epoch":"3"}}
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace stealbatch {

struct SafetensorsTensor {
  std::string name;
  std::string dtype;                  // "F32", "F64", "I64", ...
  std::vector<std::uint64_t> shape;
  std::uint64_t begin = 0, end = 0;   // byte offsets into the data section
};

using SafetensorsMetadata = std::map<std::string, std::string, std::less<>>;

// A parsed file: a view of the bytes it was parsed from, which must outlive it.
class Safetensors {
 public:
  const std::vector<SafetensorsTensor>& tensors() const noexcept { return m_tensors; }  // in the order of their data
  const SafetensorsMetadata& metadata() const noexcept { return m_metadata; }
  std::span<const std::byte> data() const noexcept { return m_data; }
  // nullptr when no tensor has that name.
  const SafetensorsTensor* find(std::string_view name) const noexcept;
  std::span<const std::byte> bytes_of(const SafetensorsTensor& t) const noexcept { return m_data.subspan(t.begin, t.end - t.begin); }

 private:
  friend Safetensors parse_safetensors(std::span<const std::byte> file, const std::string& source);
  std::vector<SafetensorsTensor> m_tensors;
  std::map<std::string, std::size_t, std::less<>> m_index;
  SafetensorsMetadata m_metadata;
  std::span<const std::byte> m_data;
};

// Parses and checks a whole file's bytes: the header length against the size, the JSON, every entry's dtype, shape
// and offsets (each tensor's bytes = its element count x its dtype's size, every byte of the data covered once).
// Throws CheckpointError (kFormat) naming `source` and the first thing wrong.
Safetensors parse_safetensors(std::span<const std::byte> file, const std::string& source);

// Bytes per element of a safetensors dtype; 0 for a name the format does not define.
std::size_t dtype_size(std::string_view dtype) noexcept;

// The header (the length, then the JSON padded with spaces to a multiple of 8 bytes, so the data that follows is
// aligned) of a file holding `tensors`' data back to back in that order: each one's begin and end are set here.
std::string safetensors_header(std::vector<SafetensorsTensor>& tensors, const SafetensorsMetadata& metadata);

}  // namespace stealbatch
