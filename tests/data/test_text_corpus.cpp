// The text corpus: documents cut at top-level definitions, a split by content, a checked cache, and the real
// Python standard library's length distribution.
#include <stealbatch/data/text_corpus.hpp>
#include <stealbatch/error.hpp>
#include <stealbatch/stats.hpp>

#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <unistd.h>

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
  // Files in another order (renamed): the held-out documents are the same texts.
  std::filesystem::rename(root / "a.py", root / "z.py");
  const TextCorpus renamed = load_text_corpus(o);
  CHECK_FALSE(renamed.from_cache);  // the sources' fingerprint changed
  CHECK(texts(renamed, renamed.validation) == texts(first, first.validation));
  CHECK(texts(renamed, renamed.train) == texts(first, first.train));
  // Errors name the problem.
  CHECK_THROWS_WITH_AS(load_text_corpus({.roots = {tmp.path / "none"}}), doctest::Contains("no .py files"), DataError);
  CHECK_THROWS_AS(load_text_corpus({.roots = {root}, .max_len = 4}), ConfigError);
  CHECK_THROWS_AS(load_text_corpus({.roots = {root}, .validation = 0.9}), ConfigError);
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
