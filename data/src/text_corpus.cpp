// The Python standard library as a text corpus (text_corpus.hpp).
#include <stealbatch/data/text_corpus.hpp>

#include <stealbatch/error.hpp>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <sstream>
#include <system_error>

namespace stealbatch {

namespace {

constexpr char kMagic[8] = {'S', 'B', 'T', 'E', 'X', 'T', '0', '1'};

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

// The cached corpus when the file matches (options, sources, checksum); false otherwise (a missing, stale or corrupt
// cache is rebuilt).
bool read_cache(const std::filesystem::path& path, std::uint64_t fingerprint, const TextCorpusOptions& o, TextCorpus& c) {
  std::ifstream in(path, std::ios::binary);
  Header h{};
  if (!in || !in.read(reinterpret_cast<char*>(&h), sizeof h)) return false;
  if (std::memcmp(h.magic, kMagic, sizeof kMagic) != 0 || h.fingerprint != fingerprint || h.max_len != o.max_len || h.min_len != o.min_len) return false;
  if (h.documents > (std::uint64_t{1} << 32) || h.bytes > (std::uint64_t{1} << 34)) return false;
  c.offsets.resize(h.documents + 1);
  c.bytes.resize(h.bytes);
  if (!in.read(reinterpret_cast<char*>(c.offsets.data()), static_cast<std::streamsize>(c.offsets.size() * sizeof(std::uint64_t))) ||
      !in.read(reinterpret_cast<char*>(c.bytes.data()), static_cast<std::streamsize>(c.bytes.size()))) {
    return false;
  }
  if (in.peek() != std::char_traits<char>::eof() || payload_checksum(c) != h.checksum || c.offsets.front() != 0 || c.offsets.back() != h.bytes) return false;
  for (std::size_t i = 0; i + 1 < c.offsets.size(); ++i) {
    if (c.offsets[i] > c.offsets[i + 1]) return false;
  }
  c.files = h.files;
  return true;
}

void write_cache(const std::filesystem::path& path, std::uint64_t fingerprint, const TextCorpusOptions& o, const TextCorpus& c) {
  Header h{};
  std::memcpy(h.magic, kMagic, sizeof kMagic);
  h.fingerprint = fingerprint, h.max_len = o.max_len, h.min_len = o.min_len, h.files = c.files, h.documents = c.size(), h.bytes = c.bytes.size();
  h.checksum = payload_checksum(c);
  // Written aside and renamed, so a reader never sees half a file.
  const std::filesystem::path tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(&h), sizeof h);
    out.write(reinterpret_cast<const char*>(c.offsets.data()), static_cast<std::streamsize>(c.offsets.size() * sizeof(std::uint64_t)));
    out.write(reinterpret_cast<const char*>(c.bytes.data()), static_cast<std::streamsize>(c.bytes.size()));
    if (!out) throw DataError("text corpus: cannot write the cache " + tmp.string());
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) throw DataError("text corpus: cannot write the cache " + path.string() + ": " + ec.message());
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
  const std::vector<std::filesystem::path> roots = o.roots.empty() ? default_roots() : o.roots;
  std::uint64_t fingerprint = 0;
  const std::vector<std::filesystem::path> files = sources(roots, fingerprint);
  if (files.empty()) {
    throw DataError("text corpus: no .py files under " + (roots.empty() ? std::string("/usr/lib/python3.*") : roots.front().string()) +
                    " (Debian: apt-get install python3)");
  }
  TextCorpus c;
  if (o.cache.empty() || !(c.from_cache = read_cache(o.cache, fingerprint, o, c))) {
    c = {};
    c.offsets.push_back(0);
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
