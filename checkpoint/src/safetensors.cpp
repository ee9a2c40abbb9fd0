// The safetensors header: parsed with nlohmann-json, without exceptions, and checked entry by entry.
#include <stealbatch/checkpoint/safetensors.hpp>
#include <stealbatch/error.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>

namespace stealbatch {

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian; this build reads it as stored");

namespace {

// The reference implementation's limit: a header is names and numbers, never this large.
constexpr std::uint64_t kMaxHeader = 100'000'000;

[[noreturn]] void bad(const std::string& source, const std::string& what) {
  throw CheckpointError(CheckpointError::Reason::kFormat, source, what);
}

std::uint64_t read_u64_le(std::span<const std::byte> b) {
  std::uint64_t v = 0;
  std::memcpy(&v, b.data(), sizeof v);
  return v;
}

// An unsigned integer of the JSON, or the error naming the entry and the field.
std::uint64_t unsigned_field(const nlohmann::json& v, const std::string& source, const std::string& where) {
  if (!v.is_number_unsigned()) bad(source, where + " is " + v.dump() + ", expected a non-negative integer");
  return v.get<std::uint64_t>();
}

SafetensorsTensor parse_entry(const std::string& name, const nlohmann::json& e, const std::string& source) {
  if (!e.is_object()) bad(source, "corrupt header: tensor '" + name + "' is not an object");
  const auto dtype = e.find("dtype"), shape = e.find("shape"), offsets = e.find("data_offsets");
  if (dtype == e.end() || shape == e.end() || offsets == e.end() || e.size() != 3) {
    bad(source, "corrupt header: tensor '" + name + "' needs exactly dtype, shape and data_offsets");
  }
  SafetensorsTensor t;
  t.name = name;
  if (!dtype->is_string()) bad(source, "corrupt header: tensor '" + name + "': dtype is not a string");
  t.dtype = dtype->get<std::string>();
  const std::size_t elem = dtype_size(t.dtype);
  if (elem == 0) bad(source, "tensor '" + name + "': unknown dtype '" + t.dtype + "'");
  if (!shape->is_array()) bad(source, "corrupt header: tensor '" + name + "': shape is not an array");
  std::uint64_t count = 1;
  for (const auto& d : *shape) {
    const std::uint64_t n = unsigned_field(d, source, "tensor '" + name + "': a dimension");
    if (n != 0 && count > std::numeric_limits<std::uint64_t>::max() / n) bad(source, "tensor '" + name + "': its shape overflows 64 bits");
    count *= n;
    t.shape.push_back(n);
  }
  if (!offsets->is_array() || offsets->size() != 2) bad(source, "corrupt header: tensor '" + name + "': data_offsets is not [begin, end]");
  t.begin = unsigned_field((*offsets)[0], source, "tensor '" + name + "': data_offsets[0]");
  t.end = unsigned_field((*offsets)[1], source, "tensor '" + name + "': data_offsets[1]");
  if (t.end < t.begin) bad(source, "tensor '" + name + "': data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) + "] end before they begin");
  if (count > std::numeric_limits<std::uint64_t>::max() / elem || count * elem != t.end - t.begin) {
    bad(source, "tensor '" + name + "': " + std::to_string(t.end - t.begin) + " bytes for " + std::to_string(count) + " elements of " + t.dtype);
  }
  return t;
}

}  // namespace

std::size_t dtype_size(std::string_view dtype) noexcept {
  static constexpr std::pair<std::string_view, std::size_t> kSizes[] = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"I16", 2}, {"U16", 2}, {"F16", 2},
      {"BF16", 2}, {"I32", 4}, {"U32", 4}, {"F32", 4},     {"F64", 8},     {"I64", 8}, {"U64", 8}};
  for (const auto& [name, size] : kSizes) {
    if (name == dtype) return size;
  }
  return 0;
}

const SafetensorsTensor* Safetensors::find(std::string_view name) const noexcept {
  const auto it = m_index.find(name);
  return it == m_index.end() ? nullptr : &m_tensors[it->second];
}

Safetensors parse_safetensors(std::span<const std::byte> file, const std::string& source) {
  if (file.size() < 8) bad(source, "truncated: " + std::to_string(file.size()) + " bytes, less than the 8-byte header length");
  const std::uint64_t n = read_u64_le(file);
  if (n > kMaxHeader) bad(source, "corrupt header: it claims " + std::to_string(n) + " bytes (at most " + std::to_string(kMaxHeader) + ")");
  if (n > file.size() - 8) {
    bad(source, "truncated: the header claims " + std::to_string(n) + " bytes, the file has " + std::to_string(file.size() - 8) + " after its length");
  }
  const auto* text = reinterpret_cast<const char*>(file.data() + 8);
  if (n == 0 || text[0] != '{') bad(source, "corrupt header: it does not begin with '{'");
  const nlohmann::json header = nlohmann::json::parse(text, text + n, nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) bad(source, "corrupt header: not a JSON object");

  Safetensors out;
  out.m_data = file.subspan(8 + n);
  for (const auto& [key, value] : header.items()) {
    if (key == "__metadata__") {
      if (!value.is_object()) bad(source, "corrupt header: __metadata__ is not an object");
      for (const auto& [k, v] : value.items()) {
        if (!v.is_string()) bad(source, "corrupt header: __metadata__ '" + k + "' is not a string");
        out.m_metadata.emplace(k, v.get<std::string>());
      }
      continue;
    }
    out.m_tensors.push_back(parse_entry(key, value, source));
  }
  // Every byte of the data belongs to exactly one tensor: sorted by offset, each begins where the last ended.
  std::stable_sort(out.m_tensors.begin(), out.m_tensors.end(), [](const auto& a, const auto& b) { return a.begin < b.begin; });
  std::uint64_t at = 0;
  for (const SafetensorsTensor& t : out.m_tensors) {
    if (t.begin != at) {
      bad(source, "tensor '" + t.name + "' begins at byte " + std::to_string(t.begin) + " of the data, expected " + std::to_string(at) +
                      (t.begin > at ? " (a hole)" : " (an overlap)"));
    }
    at = t.end;
  }
  if (at != out.m_data.size()) {
    bad(source, at > out.m_data.size() ? "truncated: the tensors need " + std::to_string(at) + " bytes of data, the file has " + std::to_string(out.m_data.size())
                                       : "the tensors cover " + std::to_string(at) + " bytes of data, the file has " + std::to_string(out.m_data.size()));
  }
  for (std::size_t i = 0; i < out.m_tensors.size(); ++i) out.m_index.emplace(out.m_tensors[i].name, i);
  return out;
}

std::string safetensors_header(std::vector<SafetensorsTensor>& tensors, const SafetensorsMetadata& metadata) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  std::uint64_t at = 0;
  for (SafetensorsTensor& t : tensors) {
    std::uint64_t count = 1;
    for (std::uint64_t d : t.shape) count *= d;
    t.begin = at;
    t.end = at + count * dtype_size(t.dtype);
    at = t.end;
    j[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {t.begin, t.end}}};
  }
  if (!metadata.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    j["__metadata__"] = std::move(m);
  }
  std::string text = j.dump();
  text.append((8 - (8 + text.size()) % 8) % 8, ' ');
  std::string out(8, '\0');
  const std::uint64_t n = text.size();
  std::memcpy(out.data(), &n, sizeof n);
  return out + text;
}

}  // namespace stealbatch
