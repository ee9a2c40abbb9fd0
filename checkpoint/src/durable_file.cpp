// write, fsync, rename, fsync the folder: the sequence that makes a replaced file survive a crash (the rename is
// atomic; the first fsync puts the data on disk before the name points at it; the second puts the name there).
#include <stealbatch/checkpoint/durable_file.hpp>
#include <stealbatch/error.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

namespace stealbatch {

namespace {

[[noreturn]] void io_error(const std::filesystem::path& path, const std::string& call, int err) {
  throw CheckpointError(CheckpointError::Reason::kIo, path.string(), call + ": " + std::strerror(err));
}

// Closes on every path out, once.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  int release() noexcept { return std::exchange(fd, -1); }
};

void write_all(int fd, std::span<const std::byte> bytes, const std::filesystem::path& path) {
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      io_error(path, "write", errno);
    }
    bytes = bytes.subspan(static_cast<std::size_t>(n));
  }
}

std::filesystem::path folder_of(const std::filesystem::path& path) {
  const std::filesystem::path parent = path.parent_path();
  return parent.empty() ? std::filesystem::path(".") : parent;
}

}  // namespace

void write_file_durably(const std::filesystem::path& path, std::span<const std::span<const std::byte>> pieces) {
  static std::atomic<unsigned> counter{0};
  const std::filesystem::path folder = folder_of(path);
  const std::filesystem::path tmp =
      folder / ("." + path.filename().string() + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter.fetch_add(1)));
  try {
    Fd f{::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644)};
    if (f.fd < 0) io_error(tmp, "open", errno);
    for (std::span<const std::byte> p : pieces) write_all(f.fd, p, tmp);
    if (::fsync(f.fd) != 0) io_error(tmp, "fsync", errno);
    if (::close(f.release()) != 0) io_error(tmp, "close", errno);
    if (::rename(tmp.c_str(), path.c_str()) != 0) io_error(path, "rename from " + tmp.filename().string(), errno);
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  Fd dir{::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
  if (dir.fd < 0) io_error(folder, "open the folder to fsync it", errno);
  if (::fsync(dir.fd) != 0) io_error(folder, "fsync the folder", errno);
}

std::vector<std::byte> read_whole_file(const std::filesystem::path& path) {
  Fd f{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (f.fd < 0) io_error(path, "open", errno);
  struct stat st{};
  if (::fstat(f.fd, &st) != 0) io_error(path, "fstat", errno);
  if (!S_ISREG(st.st_mode)) throw CheckpointError(CheckpointError::Reason::kIo, path.string(), "not a regular file");
  std::vector<std::byte> out(static_cast<std::size_t>(st.st_size));
  std::size_t at = 0;
  while (at < out.size()) {
    const ssize_t n = ::read(f.fd, out.data() + at, out.size() - at);
    if (n < 0) {
      if (errno == EINTR) continue;
      io_error(path, "read", errno);
    }
    if (n == 0) break;  // shorter than fstat said: the format check reports it as truncated
    at += static_cast<std::size_t>(n);
  }
  out.resize(at);
  return out;
}

}  // namespace stealbatch
