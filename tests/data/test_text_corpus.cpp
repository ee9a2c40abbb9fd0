// The text corpus: documents cut at top-level definitions, a split by content, a checked cache, and the real
// Python standard library's length distribution.
#include <stealbatch/data/text_corpus.hpp>
#include <stealbatch/error.hpp>
#include <stealbatch/stats.hpp>

#include <doctest/doctest.h>

#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>

using namespace stealbatch;

namespace {

struct TempDir {
  std::filesystem::path path;
  TempDir() {
    std::string t = (std::filesystem::temp_directory_path() / "sb_corpus_XXXXXX").string();
    path = ::mkdtemp(t.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};

void write(const std::filesystem::path& p, const std::string& text) {
  std::filesystem::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << text;
}

std::string read(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// The names in a folder, for what a failed write may have left beside the cache.
std::set<std::string> names_in(const std::filesystem::path& dir) {
  std::set<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) out.insert(e.path().filename().string());
  return out;
}

// Overwrites the cache header's 64-bit field at `at` (the header: magic, then fingerprint, max_len, min_len, files,
// documents, bytes, checksum).
void patch_header(const std::filesystem::path& cache, std::streamoff at, std::uint64_t value) {
  std::fstream f(cache, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(at);
  f.write(reinterpret_cast<const char*>(&value), sizeof value);
}
constexpr std::streamoff kFilesField = 32, kDocumentsField = 40, kBytesField = 48;

std::multiset<std::string> texts(const TextCorpus& c, const std::vector<std::uint32_t>& ids) {
  std::multiset<std::string> out;
  for (std::uint32_t i : ids) {
    const auto d = c.document(i);
    out.emplace(d.begin(), d.end());
  }
  return out;
}

const std::string kModule =
    "\"\"\"A module.\"\"\"\nimport os\n\n"
    "def one(x):\n    return x + 1\n\n"
    "@decorator\nasync def two():\n    pass\n\n"
    "class Three:\n    def method(self):\n        return 3\n";

}  // namespace

TEST_CASE("TextCorpus.CutsAtTopLevelDefinitionsAndCapsTheLength") {
  const std::vector<std::string> d = cut_python_source(kModule, 1024, 8);
  REQUIRE(d.size() == 5);
  CHECK(d[0].rfind("\"\"\"A module", 0) == 0);
  CHECK(d[1].rfind("def one", 0) == 0);
  CHECK(d[2].rfind("@decorator\nasync def two", 0) == 0);  // a decorator starts its definition's document
  CHECK(d[3].rfind("class Three", 0) == 0);
  CHECK(d[4].rfind("    def method", 0) == 0);  // a method is a document of its own
  // A long document becomes pieces of max_len; pieces under min_len and blank ones are dropped.
  const std::vector<std::string> capped = cut_python_source("def f():\n" + std::string(100, 'x') + "\n", 32, 8);
  REQUIRE(capped.size() == 4);  // 110 bytes: 32, 32, 32 and 14
  for (const auto& piece : capped) CHECK(piece.size() <= 32);
  CHECK(cut_python_source("\n\n   \n", 1024, 1).empty());
}

TEST_CASE("TextCorpus.SplitIsByContentAndTheCacheIsChecked") {
  TempDir tmp;
  const auto root = tmp.path / "lib";
  write(root / "a.py", kModule);
  write(root / "pkg" / "b.py", "def b1():\n    return 'b1 is here'\n\ndef b2():\n    return 'b2 is here'\n");
  write(root / "__pycache__" / "skip.py", "def skipped():\n    return 'never read'\n");
  const auto cache = tmp.path / "corpus.bin";
  const TextCorpusOptions o{.roots = {root}, .min_len = 8, .validation = 0.5, .cache = cache};
  const TextCorpus first = load_text_corpus(o);
  CHECK(first.files == 2);
  CHECK(first.size() == 7);  // a.py: 5, b.py: 2
  CHECK_FALSE(first.from_cache);
  CHECK(first.train.size() + first.validation.size() == first.size());
  // From the cache: the same documents and the same split.
  const TextCorpus again = load_text_corpus(o);
  CHECK(again.from_cache);
  CHECK(again.bytes == first.bytes);
  CHECK(texts(again, again.validation) == texts(first, first.validation));
  // A corrupt cache is rebuilt, to the same corpus.
  {
    std::fstream f(cache, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-3, std::ios::end);
    f.put('#');
  }
  const TextCorpus rebuilt = load_text_corpus(o);
  CHECK_FALSE(rebuilt.from_cache);
  CHECK(rebuilt.bytes == first.bytes);
  CHECK(rebuilt.cache_rebuilt.find("checksum") != std::string::npos);
  CHECK(load_text_corpus(o).cache_rebuilt.empty());  // used as it is
  // Files in another order (renamed): the held-out documents are the same texts.
  std::filesystem::rename(root / "a.py", root / "z.py");
  const TextCorpus renamed = load_text_corpus(o);
  CHECK_FALSE(renamed.from_cache);  // the sources' fingerprint changed
  CHECK(texts(renamed, renamed.validation) == texts(first, first.validation));
  CHECK(texts(renamed, renamed.train) == texts(first, first.train));
  // Errors name the problem.
  std::filesystem::create_directories(tmp.path / "empty");
  CHECK_THROWS_WITH_AS(load_text_corpus({.roots = {tmp.path / "empty"}}), doctest::Contains("no .py files"), DataError);
  CHECK_THROWS_AS(load_text_corpus({.roots = {root}, .max_len = 4}), ConfigError);
  CHECK_THROWS_AS(load_text_corpus({.roots = {root}, .validation = 0.9}), ConfigError);
}

TEST_CASE("TextCorpus.AMissingRootIsNamedAsMissing") {
  TempDir tmp;
  const auto none = tmp.path / "none";
  try {
    (void)load_text_corpus({.roots = {none}});
    FAIL("no error for a root that does not exist");
  } catch (const DataError& e) {
    const std::string msg = e.what();
    CHECK(msg.find(none.string()) != std::string::npos);
    CHECK(msg.find("does not exist") != std::string::npos);
    CHECK(msg.find("apt-get") == std::string::npos);  // the hint is for the default roots only
  }
  write(tmp.path / "file.py", kModule);
  CHECK_THROWS_WITH_AS(load_text_corpus({.roots = {tmp.path / "file.py"}}), doctest::Contains("not a folder"), DataError);
}

TEST_CASE("TextCorpus.RefusesToReplaceAFileThatIsNotACache") {
  TempDir tmp;
  const auto root = tmp.path / "lib";
  write(root / "a.py", kModule);
  const TextCorpusOptions o{.roots = {root}, .min_len = 8};
  // Text, and a checkpoint's first bytes (safetensors: an 8-byte header length, then JSON): refused, left as they were.
  static constexpr char kCheckpointStart[] = "\x40\0\0\0\0\0\0\0{\"w\":{\"dtype\":\"F32\"}}";
  for (const std::string& text : {std::string("notes, not a cache\n"), std::string(kCheckpointStart, sizeof kCheckpointStart - 1)}) {
    const auto file = tmp.path / "keep.bin";
    write(file, text);
    TextCorpusOptions to = o;
    to.cache = file;
    CHECK_THROWS_WITH_AS(load_text_corpus(to), doctest::Contains(file.string().c_str()), ConfigError);
    CHECK_THROWS_WITH_AS(load_text_corpus(to), doctest::Contains("not a text corpus cache"), ConfigError);
    CHECK(read(file) == text);
  }
  // A folder: refused before anything is read or written, nothing left beside it.
  const auto folder = tmp.path / "folder";
  std::filesystem::create_directories(folder);
  TextCorpusOptions fo = o;
  fo.cache = folder;
  CHECK_THROWS_WITH_AS(load_text_corpus(fo), doctest::Contains("a folder"), ConfigError);
  CHECK(names_in(tmp.path) == std::set<std::string>{"folder", "keep.bin", "lib"});
  CHECK(std::filesystem::is_empty(folder));
  // An empty file holds nothing to lose: it becomes the cache.
  const auto empty = tmp.path / "empty.bin";
  write(empty, "");
  TextCorpusOptions eo = o;
  eo.cache = empty;
  CHECK_FALSE(load_text_corpus(eo).from_cache);
  CHECK(load_text_corpus(eo).from_cache);
}

TEST_CASE("TextCorpus.ACorruptHeaderIsRebuiltWithoutAllocatingItsCounts") {
  TempDir tmp;
  const auto root = tmp.path / "lib";
  write(root / "a.py", kModule);
  const auto cache = tmp.path / "corpus.bin";
  const TextCorpusOptions o{.roots = {root}, .min_len = 8, .cache = cache};
  const TextCorpus first = load_text_corpus(o);
  REQUIRE(load_text_corpus(o).from_cache);
  // Each count checked against the file's size before anything is allocated: 2^32 documents would take 32 GiB of
  // offsets, 2^33 bytes 8 GiB.
  for (const auto& [field, value] : {std::pair{kDocumentsField, std::uint64_t{1} << 32}, std::pair{kDocumentsField, std::uint64_t{6}},
                                     std::pair{kBytesField, std::uint64_t{1} << 33}, std::pair{kBytesField, ~std::uint64_t{0}},
                                     std::pair{kFilesField, std::uint64_t{12345}}}) {
    CAPTURE(field);
    CAPTURE(value);
    patch_header(cache, field, value);
    const TextCorpus rebuilt = load_text_corpus(o);
    CHECK_FALSE(rebuilt.from_cache);
    CHECK(rebuilt.cache_rebuilt.find("header") != std::string::npos);
    CHECK(rebuilt.bytes == first.bytes);
    CHECK(load_text_corpus(o).from_cache);  // rebuilt whole
  }
  // Cut short: its size says so.
  std::filesystem::resize_file(cache, std::filesystem::file_size(cache) - 1);
  const TextCorpus cut = load_text_corpus(o);
  CHECK_FALSE(cut.from_cache);
  CHECK(cut.cache_rebuilt.find("bytes") != std::string::npos);
  // Made with other options: rebuilt, saying so.
  const TextCorpus other = load_text_corpus({.roots = {root}, .max_len = 64, .min_len = 8, .cache = cache});
  CHECK_FALSE(other.from_cache);
  CHECK(other.cache_rebuilt.find("max_len") != std::string::npos);
}

TEST_CASE("TextCorpus.AFailedCacheWriteNamesTheReasonAndLeavesNoTemporaryFile") {
  TempDir tmp;
  const auto root = tmp.path / "lib";
  write(root / "a.py", kModule + std::string(8192, '#') + "\n");
  const auto cache = tmp.path / "corpus.bin";
  // A file size limit fails the write part way (EFBIG; SIGXFSZ ignored), as a full disk would.
  struct rlimit old{};
  REQUIRE(::getrlimit(RLIMIT_FSIZE, &old) == 0);
  const auto previous = std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = old;
  small.rlim_cur = 4096;
  REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);
  std::string msg;
  bool data_error = false;
  try {
    (void)load_text_corpus({.roots = {root}, .min_len = 8, .cache = cache});
  } catch (const DataError& e) {
    data_error = true, msg = e.what();
  } catch (const Error& e) {
    msg = e.what();
  }
  REQUIRE(::setrlimit(RLIMIT_FSIZE, &old) == 0);
  std::signal(SIGXFSZ, previous);
  CHECK_FALSE(data_error);  // the data is fine; the disk is not
  CHECK(msg.find(cache.string()) != std::string::npos);
  CHECK(msg.find(std::strerror(EFBIG)) != std::string::npos);
  CHECK(names_in(tmp.path) == std::set<std::string>{"lib"});
  // A folder that does not exist: the OS's reason, nothing created.
  try {
    (void)load_text_corpus({.roots = {root}, .min_len = 8, .cache = tmp.path / "none" / "corpus.bin"});
    FAIL("no error for a cache in a missing folder");
  } catch (const DataError& e) {
    FAIL("a failed cache write called a data error: " << std::string(e.what()));
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find(std::strerror(ENOENT)) != std::string::npos);
  }
  CHECK(names_in(tmp.path) == std::set<std::string>{"lib"});
}

TEST_CASE("TextCorpus.ThePythonStandardLibraryIsLongTailed") {
  TextCorpus c;
  try {
    c = load_text_corpus({});
  } catch (const DataError& e) {
    MESSAGE("skipped: " << e.what());
    return;
  }
  REQUIRE(c.size() > 1000);
  std::vector<double> len;
  for (std::uint32_t i = 0; i < c.size(); ++i) len.push_back(static_cast<double>(c.length(i)));
  const double p10 = percentile(len, 0.1), p50 = percentile(len, 0.5), p90 = percentile(len, 0.9), max = percentile(len, 1.0);
  MESSAGE(c.files << " files, " << c.size() << " documents, " << c.validation.size() << " held out; length p10 " << p10 << ", p50 " << p50 << ", p90 "
                  << p90 << ", max " << max);
  CHECK(max <= 1024);
  CHECK(p10 >= 16);
  CHECK(p90 >= 4 * p10);  // long-tailed
  CHECK(p50 < 1024);      // most documents are whole, not pieces of a capped one
  CHECK(c.validation.size() > c.size() / 40);
  CHECK(c.validation.size() < c.size() / 10);
}
