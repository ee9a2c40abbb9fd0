// A run's checkpoint folder: step-NNNNNNNNNNNN.safetensors files, the newest kept.
#include <stealbatch/checkpoint/checkpoint_dir.hpp>
#include <stealbatch/error.hpp>

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
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

// The step a checkpoint records: its optimizer's step count ("stealbatch.optimizer.steps", what the runtime's
// save_checkpoint() writes), read from the safetensors header alone. Nothing when the file cannot be read as one
// (a truncated or foreign file: its load names what is wrong).
std::optional<std::uint64_t> recorded_step(const std::filesystem::path& path) {
  constexpr std::uint64_t kMaxHeader = 16u << 20;  // a header names tensors and metadata: far below this
  std::ifstream in(path, std::ios::binary);
  std::array<unsigned char, 8> len{};
  if (!in.read(reinterpret_cast<char*>(len.data()), len.size())) return std::nullopt;
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len[static_cast<std::size_t>(i)];
  if (n == 0 || n > kMaxHeader) return std::nullopt;
  std::string header(n, '\0');
  if (!in.read(header.data(), static_cast<std::streamsize>(n))) return std::nullopt;
  const nlohmann::json j = nlohmann::json::parse(header, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return std::nullopt;
  const auto meta = j.find("__metadata__");
  if (meta == j.end() || !meta->is_object()) return std::nullopt;
  const auto steps = meta->find("stealbatch.optimizer.steps");
  if (steps == meta->end() || !steps->is_string()) return std::nullopt;
  const std::string& digits = steps->get_ref<const std::string&>();
  if (digits.empty() || digits.size() > 19 || digits.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  return std::stoull(digits);
}

}  // namespace

CheckpointDir::CheckpointDir(std::filesystem::path dir, Open open) : m_dir(std::move(dir)) {
  std::error_code ec;
  if (open == Open::kExisting) {
    if (!std::filesystem::is_directory(m_dir, ec)) {
      throw CheckpointError(CheckpointError::Reason::kIo, m_dir.string(), "no such checkpoint folder" + (ec ? ": " + ec.message() : std::string()));
    }
    return;
  }
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
    // Its own error code: an entry that is not itself a regular file (a link, dangling or not; a folder) is passed
    // over, not a failure to list the folder. A save only ever writes regular files, and pruning a link's target
    // would leave the link dangling.
    std::error_code entry_ec;
    if (!std::filesystem::is_regular_file(e.symlink_status(entry_ec))) continue;
    const auto named = step_of(e.path().filename().string());
    if (!named) continue;
    // Ordered by the step the file records, not by its name: a file renamed or copied under a larger step's name is
    // as old as what it holds. Where the file records none, its name's step.
    out.emplace_back(recorded_step(e.path()).value_or(*named), e.path());
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

void CheckpointDir::remove_all() const {
  for (const auto& [step, path] : list()) {
    std::error_code ec;
    std::filesystem::remove(path, ec);
    if (ec) throw CheckpointError(CheckpointError::Reason::kIo, path.string(), "cannot remove it: " + ec.message());
  }
}

void CheckpointDir::check_writable() const {
  // Named as a save's temporary file, so that prune() removes one that a killed process left.
  const std::filesystem::path probe = m_dir / (".step-probe.safetensors.tmp." + std::to_string(::getpid()));
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    throw CheckpointError(CheckpointError::Reason::kIo, m_dir.string(), std::string("cannot write a checkpoint into this folder: ") + std::strerror(errno));
  }
  const char byte = 0;
  const bool wrote = ::write(fd, &byte, 1) == 1 && ::fsync(fd) == 0;
  const int err = errno;
  ::close(fd);
  std::error_code ec;
  std::filesystem::remove(probe, ec);
  if (!wrote) throw CheckpointError(CheckpointError::Reason::kIo, m_dir.string(), std::string("cannot write a checkpoint into this folder: ") + std::strerror(err));
}

CheckpointDir::Lock::Lock(Lock&& other) noexcept : m_fd(other.m_fd) { other.m_fd = -1; }

CheckpointDir::Lock::~Lock() {
  if (m_fd >= 0) ::close(m_fd);  // releases the flock
}

CheckpointDir::Lock CheckpointDir::lock() const {
  const std::string path = (m_dir / ".lock").string();
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) throw CheckpointError(CheckpointError::Reason::kIo, path, std::string("cannot open the folder's lock: ") + std::strerror(errno));
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char holder[32] = {};
    const ssize_t n = ::pread(fd, holder, sizeof holder - 1, 0);
    ::close(fd);
    if (err == EWOULDBLOCK) {
      std::string pid = n > 0 ? std::string(holder, static_cast<std::size_t>(n)) : std::string();
      pid = pid.substr(0, pid.find_first_not_of("0123456789"));
      throw CheckpointError(CheckpointError::Reason::kIo, m_dir.string(),
                            "another live process (pid " + (pid.empty() ? std::string("unknown") : pid) +
                                ") is saving checkpoints into this folder; two runs in one folder would replace each other's files");
    }
    throw CheckpointError(CheckpointError::Reason::kIo, path, std::string("cannot lock the folder: ") + std::strerror(err));
  }
  // Ours: record who holds it.
  const std::string pid = std::to_string(::getpid());
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
    // The pid is only for the other writer's message; the lock holds without it.
  }
  return Lock(fd);
}

}  // namespace stealbatch
