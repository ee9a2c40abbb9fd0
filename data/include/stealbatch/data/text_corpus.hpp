// A corpus of real variable-length text for a byte-level language model: the Python standard library's sources
// (every Debian machine has them: python3.11-minimal and libpython3.11-stdlib), cut into documents at each definition,
// at any depth (a line whose first word is `def`, `async def`, `class` or a decorator `@`: a function, a method, a
// class's head, and the module's head before the first), each at most max_len bytes (a longer one becomes several),
// blank-only ones dropped.
//
// The split is by each document's content (a 64-bit FNV-1a hash), so it does not depend on file order or on which
// files exist. The documents are read once into a cache file that is checked (magic, version, the sources' fingerprint,
// its header's counts against its size, and a checksum of its payload) and rebuilt whenever it does not match; a file
// there that is not such a cache is never replaced.
//
//   const TextCorpus c = load_text_corpus({.cache = "build/pystdlib.corpus"});
//   std::span<const std::uint8_t> doc = c.document(c.train[0]);
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

namespace stealbatch {

struct TextCorpusOptions {
  std::vector<std::filesystem::path> roots{};  // empty: every /usr/lib/python3.N directory
  std::size_t max_len = 1024;                  // bytes per document at most, [16, 1 << 20]
  std::size_t min_len = 16;                    // shorter documents are dropped (blank lines and stubs), [1, max_len]
  double validation = 0.05;                    // the share of documents held out, [0, 0.5]
  std::filesystem::path cache{};               // empty: no cache
};

struct TextCorpus {
  std::vector<std::uint8_t> bytes;     // every document, end to end
  std::vector<std::uint64_t> offsets;  // document i is bytes[offsets[i], offsets[i + 1])
  std::vector<std::uint32_t> train, validation;  // document ids, in document order
  std::size_t files = 0;               // source files read
  bool from_cache = false;             // read from the cache file rather than the sources
  std::string cache_rebuilt;           // why the cache file there was not used and was rebuilt; empty when it was used or absent
  std::size_t size() const noexcept { return offsets.empty() ? 0 : offsets.size() - 1; }
  std::span<const std::uint8_t> document(std::uint32_t i) const {
    return std::span<const std::uint8_t>(bytes).subspan(offsets.at(i), offsets.at(i + 1) - offsets[i]);
  }
  std::size_t length(std::uint32_t i) const { return offsets.at(i + 1) - offsets.at(i); }
};

// Reads (or rebuilds and caches) the corpus. Throws, naming the path and the problem:
//   DataError: a root that does not exist or is not a folder, no sources found, a source that cannot be read;
//   ConfigError: options out of range, or a cache path that names a folder or a file that is not a corpus cache
//     (refused before anything is read, the file left as it was; an empty file counts as no cache);
//   Error: a cache that cannot be read or written, with the OS's reason. The cache is written to a temporary file
//     beside it and renamed over it; no temporary file is left behind when that fails.
TextCorpus load_text_corpus(const TextCorpusOptions& options);

// One source file's documents, cut as above (exposed for tests).
std::vector<std::string> cut_python_source(const std::string& text, std::size_t max_len, std::size_t min_len);

}  // namespace stealbatch
