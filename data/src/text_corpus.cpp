// The Python standard library as a text corpus (text_corpus.hpp).
#include <stealbatch/data/text_corpus.hpp>

#include <stealbatch/error.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <system_error>
#include <utility>

namespace stealbatch {

namespace {

constexpr char kMagic[8] = {'S', 'B', 'T', 'E', 'X', 'T', '0', '1'};  // the format, then its version
constexpr std::size_t kFormatBytes = 6;                               // "SBTEXT": a cache of ours, of any version

std::uint64_t fnv1a(const void* data, std::size_t n, std::uint64_t h = 1469598103934665603ull) {
  const auto* p = static_cast<const std::uint8_t*>(data);
  for (std::size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

// A definition at any depth: a function, a method, a class, or the decorator before one.
bool starts_document(const std::string& line) {
  const std::size_t at = line.find_first_not_of(" \t");
  if (at == std::string::npos) return false;
  for (const char* head : {"def ", "async def ", "class ", "@"}) {
    if (line.compare(at, std::strlen(head), head) == 0) return true;
  }
  return false;
}

bool blank(const std::string& s) { return std::all_of(s.begin(), s.end(), [](unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }); }

// Every /usr/lib/python3.N directory (not /usr/lib/python3, Debian's dist-packages), sorted.
std::vector<std::filesystem::path> default_roots() {
  std::vector<std::filesystem::path> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/usr/lib", ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("python3.", 0) == 0 && e.is_directory()) out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// The .py files under the roots, sorted, without tests' data and caches: the files and their sizes are the
// fingerprint a cache must match.
std::vector<std::filesystem::path> sources(const std::vector<std::filesystem::path>& roots, std::uint64_t& fingerprint) {
  std::vector<std::filesystem::path> files;
  for (const auto& root : roots) {
    std::error_code ec;
    const std::filesystem::file_status st = std::filesystem::status(root, ec);
    if (!std::filesystem::exists(st)) {
      throw DataError("text corpus: " + root.string() + " does not exist" + (ec && ec != std::errc::no_such_file_or_directory ? " (" + ec.message() + ")" : "") +
                      "; expected a folder of Python sources");
    }
    if (!std::filesystem::is_directory(st)) throw DataError("text corpus: " + root.string() + " is not a folder; expected a folder of Python sources");
    for (auto it = std::filesystem::recursive_directory_iterator(root, std::filesystem::directory_options::skip_permission_denied, ec);
         !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
      const auto& p = it->path();
      std::error_code kind;  // an entry that vanished or cannot be read is skipped
      if (it->is_directory(kind) && (p.filename() == "__pycache__" || p.filename() == "site-packages" || p.filename() == "dist-packages")) {
        it.disable_recursion_pending();
        continue;
      }
      if (p.extension() == ".py" && it->is_regular_file(kind)) files.push_back(p);
    }
  }
  std::sort(files.begin(), files.end());
  fingerprint = 1469598103934665603ull;
  for (const auto& f : files) {
    const std::string s = f.string();
    std::error_code ec;
    const std::uint64_t size = std::filesystem::file_size(f, ec);
    fingerprint = fnv1a(s.data(), s.size(), fingerprint);
    fingerprint = fnv1a(&size, sizeof size, fingerprint);
  }
  return files;
}

struct Header {
  char magic[8];
  std::uint64_t fingerprint, max_len, min_len, files, documents, bytes, checksum;
};

std::uint64_t payload_checksum(const TextCorpus& c) {
  std::uint64_t h = fnv1a(c.offsets.data(), c.offsets.size() * sizeof(std::uint64_t));
  return fnv1a(c.bytes.data(), c.bytes.size(), h);
}

std::string os_reason(int err) { return std::generic_category().message(err); }

// What is at the cache path: nothing (or an empty file: nothing to lose), or a cache of ours to read. A folder, or a
// file that is not a cache of ours, is refused before anything is read or written, and left as it is.
enum class CacheFile { kAbsent, kOurs };

CacheFile inspect_cache(const std::filesystem::path& path) {
  std::error_code ec;
  const std::filesystem::file_status st = std::filesystem::status(path, ec);
  if (!std::filesystem::exists(st)) {
    if (ec && ec != std::errc::no_such_file_or_directory) throw Error("text corpus: cannot read the cache " + path.string() + ": " + ec.message());
    return CacheFile::kAbsent;
  }
  if (std::filesystem::is_directory(st)) throw ConfigError("cache = '" + path.string() + "' is a folder; name a file (for example " + (path / "pystdlib.corpus").string() + ")");
  if (!std::filesystem::is_regular_file(st)) throw ConfigError("cache = '" + path.string() + "' is not a regular file; name a file that this cache may replace");
  const std::uintmax_t size = std::filesystem::file_size(path, ec);
  if (ec) throw Error("text corpus: cannot read the cache " + path.string() + ": " + ec.message());
  if (size == 0) return CacheFile::kAbsent;
  char magic[kFormatBytes] = {};
  errno = 0;
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("text corpus: cannot read the cache " + path.string() + ": " + os_reason(errno));
  if (!in.read(magic, sizeof magic) || std::memcmp(magic, kMagic, sizeof magic) != 0) {
    throw ConfigError("cache = '" + path.string() + "' is not a text corpus cache (it does not start with " + std::string(kMagic, kFormatBytes) +
                      "); it is left as it is: name another file, or remove this one");
  }
  return CacheFile::kOurs;
}

// Reads the cache into c when it matches (its version, the options, the sources, its size and its checksum); else
// returns why not, and c is to be rebuilt. Every count in the header is checked against the file's size before
// anything is allocated for it.
std::string read_cache(const std::filesystem::path& path, std::uint64_t fingerprint, std::size_t files, const TextCorpusOptions& o, TextCorpus& c) {
  std::error_code ec;
  const std::uint64_t size = std::filesystem::file_size(path, ec);
  if (ec) return "cannot read its size: " + ec.message();
  errno = 0;
  std::ifstream in(path, std::ios::binary);
  if (!in) return "cannot open it: " + os_reason(errno);
  Header h{};
  if (size < sizeof h || !in.read(reinterpret_cast<char*>(&h), sizeof h)) {
    return std::to_string(size) + " bytes, shorter than its " + std::to_string(sizeof h) + "-byte header";
  }
  if (std::memcmp(h.magic, kMagic, sizeof kMagic) != 0) {
    return "written by another version (" + std::string(h.magic, sizeof h.magic) + ", this one reads " + std::string(kMagic, sizeof kMagic) + ")";
  }
  if (h.fingerprint != fingerprint) return "the sources changed since it was written (their names or sizes)";
  if (h.max_len != o.max_len || h.min_len != o.min_len) {
    return "made with max_len " + std::to_string(h.max_len) + " and min_len " + std::to_string(h.min_len) + ", not " + std::to_string(o.max_len) + " and " +
           std::to_string(o.min_len);
  }
  if (h.files != files) return "its header says " + std::to_string(h.files) + " source files, the sources are " + std::to_string(files) + " (a corrupt header)";
  // Document ids are 32-bit; below 2^32 documents the offsets' size cannot overflow.
  if (h.documents >= (std::uint64_t{1} << 32)) {
    return "its header says " + std::to_string(h.documents) + " documents, more than the 2^32 - 1 a corpus holds (a corrupt header)";
  }
  const std::uint64_t offsets_bytes = (h.documents + 1) * sizeof(std::uint64_t), room = size - sizeof h;
  if (h.bytes > room || offsets_bytes > room - h.bytes) {
    return "its header says " + std::to_string(h.documents) + " documents and " + std::to_string(h.bytes) + " bytes of text, more than the file's " +
           std::to_string(size) + " bytes hold (a corrupt header, or a file cut short)";
  }
  if (offsets_bytes + h.bytes != room) {
    return "its header says " + std::to_string(h.documents) + " documents and " + std::to_string(h.bytes) + " bytes of text (" +
           std::to_string(sizeof h + offsets_bytes + h.bytes) + " bytes in all), the file holds " + std::to_string(size) + " bytes (a corrupt header)";
  }
  c.offsets.resize(h.documents + 1);
  c.bytes.resize(h.bytes);
  if (!in.read(reinterpret_cast<char*>(c.offsets.data()), static_cast<std::streamsize>(offsets_bytes)) ||
      !in.read(reinterpret_cast<char*>(c.bytes.data()), static_cast<std::streamsize>(c.bytes.size()))) {
    return "cannot read all of its " + std::to_string(size) + " bytes";
  }
  if (payload_checksum(c) != h.checksum) return "its payload does not match its checksum (the file is damaged)";
  if (c.offsets.front() != 0 || c.offsets.back() != h.bytes || !std::is_sorted(c.offsets.begin(), c.offsets.end())) {
    return "its document offsets are out of order (the file is damaged)";
  }
  c.files = h.files;
  return {};
}

// A file beside the cache that is written whole, then renamed over it (so that a reader never sees half a file);
// removed on every path that does not reach the rename.
class TempBeside {
 public:
  explicit TempBeside(const std::filesystem::path& path) : m_path(path) {
    std::random_device rd;
    for (int attempt = 0; attempt < 100 && m_fd < 0; ++attempt) {
      char suffix[16];
      std::snprintf(suffix, sizeof suffix, ".tmp%08x", static_cast<unsigned>(rd()));
      m_tmp = path.string() + suffix;
      m_fd = ::open(m_tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
      if (m_fd < 0 && errno != EEXIST) fail("cannot create a file beside it (" + m_tmp + ")");
    }
    if (m_fd < 0) fail("cannot create a file beside it (" + m_tmp + ")");
  }
  ~TempBeside() {
    if (m_fd >= 0) ::close(m_fd);
    if (!m_renamed) ::unlink(m_tmp.c_str());
  }
  TempBeside(const TempBeside&) = delete;
  TempBeside& operator=(const TempBeside&) = delete;

  void write(const void* data, std::size_t n) {
    for (const auto* p = static_cast<const char*>(data); n > 0;) {
      const ssize_t w = ::write(m_fd, p, n);
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) fail("writing " + m_tmp);
      p += w, n -= static_cast<std::size_t>(w);
    }
  }
  void rename_over() {
    const int fd = std::exchange(m_fd, -1);
    if (::close(fd) != 0) fail("writing " + m_tmp);
    if (::rename(m_tmp.c_str(), m_path.c_str()) != 0) fail("renaming " + m_tmp + " over it");
    m_renamed = true;
  }

 private:
  [[noreturn]] void fail(const std::string& doing) const {
    const int err = errno;
    throw Error("text corpus: cannot write the cache " + m_path.string() + ": " + doing + ": " + os_reason(err));
  }

  std::filesystem::path m_path;
  std::string m_tmp;
  int m_fd = -1;
  bool m_renamed = false;
};

void write_cache(const std::filesystem::path& path, std::uint64_t fingerprint, const TextCorpusOptions& o, const TextCorpus& c) {
  Header h{};
  std::memcpy(h.magic, kMagic, sizeof kMagic);
  h.fingerprint = fingerprint, h.max_len = o.max_len, h.min_len = o.min_len, h.files = c.files, h.documents = c.size(), h.bytes = c.bytes.size();
  h.checksum = payload_checksum(c);
  TempBeside out(path);
  out.write(&h, sizeof h);
  out.write(c.offsets.data(), c.offsets.size() * sizeof(std::uint64_t));
  out.write(c.bytes.data(), c.bytes.size());
  out.rename_over();
}

}  // namespace

std::vector<std::string> cut_python_source(const std::string& text, std::size_t max_len, std::size_t min_len) {
  std::vector<std::string> docs;
  std::string doc, line;
  auto flush = [&] {
    for (std::size_t at = 0; at < doc.size(); at += max_len) {
      std::string piece = doc.substr(at, max_len);
      if (piece.size() >= min_len && !blank(piece)) docs.push_back(std::move(piece));
    }
    doc.clear();
  };
  std::istringstream in(text);
  bool decorated = false;  // the line before was a decorator: the definition belongs to its document
  while (std::getline(in, line)) {
    if (starts_document(line) && !decorated) flush();
    const std::size_t at = line.find_first_not_of(" \t");
    decorated = at != std::string::npos && line[at] == '@';
    doc += line;
    doc += '\n';
  }
  flush();
  return docs;
}

TextCorpus load_text_corpus(const TextCorpusOptions& o) {
  if (o.max_len < 16 || o.max_len > (std::size_t{1} << 20)) throw ConfigError("max_len = " + std::to_string(o.max_len) + "; valid range is [16, 1048576]");
  if (o.min_len < 1 || o.min_len > o.max_len) throw ConfigError("min_len = " + std::to_string(o.min_len) + "; valid range is [1, max_len]");
  if (!(o.validation >= 0 && o.validation <= 0.5)) throw ConfigError("validation = " + std::to_string(o.validation) + "; valid range is [0, 0.5]");
  // A cache path that names something else is refused before the sources are read.
  const bool cached = !o.cache.empty() && inspect_cache(o.cache) == CacheFile::kOurs;
  const std::vector<std::filesystem::path> roots = o.roots.empty() ? default_roots() : o.roots;
  std::uint64_t fingerprint = 0;
  const std::vector<std::filesystem::path> files = sources(roots, fingerprint);
  if (files.empty()) {
    if (o.roots.empty()) throw DataError("text corpus: no .py files under /usr/lib/python3.* (Debian: apt-get install python3)");
    std::string where;
    for (const auto& r : roots) where += (where.empty() ? "" : ", ") + r.string();
    throw DataError("text corpus: no .py files under " + where);
  }
  TextCorpus c;
  if (cached) c.cache_rebuilt = read_cache(o.cache, fingerprint, files.size(), o, c);
  c.from_cache = cached && c.cache_rebuilt.empty();
  if (!c.from_cache) {
    c.bytes.clear();
    c.offsets.assign(1, 0);
    for (const auto& f : files) {
      std::ifstream in(f, std::ios::binary);
      if (!in) throw DataError("text corpus: cannot read " + f.string());
      const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      for (const std::string& d : cut_python_source(text, o.max_len, o.min_len)) {
        c.bytes.insert(c.bytes.end(), d.begin(), d.end());
        c.offsets.push_back(c.bytes.size());
      }
    }
    c.files = files.size();
    if (!o.cache.empty()) write_cache(o.cache, fingerprint, o, c);
  }
  // Held out by content: the same documents whatever the files' order.
  const auto threshold = static_cast<std::uint64_t>(o.validation * 1e6);
  for (std::uint32_t i = 0; i < c.size(); ++i) {
    const auto d = c.document(i);
    (fnv1a(d.data(), d.size()) % 1000000 < threshold ? c.validation : c.train).push_back(i);
  }
  return c;
}

}  // namespace stealbatch
