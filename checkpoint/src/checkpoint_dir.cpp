// A run's checkpoint folder: step-NNNNNNNNNNNN.safetensors files, the newest kept.
#include <stealbatch/checkpoint/checkpoint_dir.hpp>
#include <stealbatch/error.hpp>

#include <algorithm>
#include <cstdio>
#include <string>
#include <system_error>

namespace stealbatch {

namespace {

constexpr std::string_view kPrefix = "step-", kSuffix = ".safetensors";

// The step of a checkpoint's file name, or nothing for any other name (temporary files begin with '.').
std::optional<std::uint64_t> step_of(const std::string& name) {
  if (name.size() <= kPrefix.size() + kSuffix.size() || !name.starts_with(kPrefix) || !name.ends_with(kSuffix)) return std::nullopt;
  const std::string digits = name.substr(kPrefix.size(), name.size() - kPrefix.size() - kSuffix.size());
  if (digits.size() > 19 || digits.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  return std::stoull(digits);
}

}  // namespace

CheckpointDir::CheckpointDir(std::filesystem::path dir) : m_dir(std::move(dir)) {
  std::error_code ec;
  std::filesystem::create_directories(m_dir, ec);
  if (ec || !std::filesystem::is_directory(m_dir)) {
    throw CheckpointError(CheckpointError::Reason::kIo, m_dir.string(), "cannot create the checkpoint folder" + (ec ? ": " + ec.message() : std::string()));
  }
}

std::filesystem::path CheckpointDir::path_for(std::uint64_t step) const {
  char name[64];
  std::snprintf(name, sizeof name, "step-%012llu.safetensors", static_cast<unsigned long long>(step));
  return m_dir / name;
}

std::vector<std::pair<std::uint64_t, std::filesystem::path>> CheckpointDir::list() const {
  std::vector<std::pair<std::uint64_t, std::filesystem::path>> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(m_dir, ec)) {
    if (!e.is_regular_file(ec)) continue;
    if (const auto step = step_of(e.path().filename().string())) out.emplace_back(*step, e.path());
  }
  if (ec) throw CheckpointError(CheckpointError::Reason::kIo, m_dir.string(), "cannot list the checkpoint folder: " + ec.message());
  std::sort(out.begin(), out.end());
  return out;
}

std::optional<std::filesystem::path> CheckpointDir::latest() const {
  auto all = list();
  if (all.empty()) return std::nullopt;
  return all.back().second;
}

void CheckpointDir::prune(std::size_t keep) const {
  keep = std::max<std::size_t>(keep, 1);
  const auto all = list();
  std::error_code ec;
  for (std::size_t i = 0; i + keep < all.size(); ++i) std::filesystem::remove(all[i].second, ec);
  for (const auto& e : std::filesystem::directory_iterator(m_dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.starts_with(".step-") && name.find(".safetensors.tmp.") != std::string::npos) std::filesystem::remove(e.path(), ec);
  }
}

}  // namespace stealbatch
