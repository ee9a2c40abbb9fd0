// The checkpoint file and its folder, below the runtime: the safetensors header as the format defines it, the
// checks of a corrupt or truncated file, the checksum, crash-safe replacement, and which checkpoints a folder keeps.
#include <stealbatch/checkpoint/checkpoint_dir.hpp>
#include <stealbatch/checkpoint/checkpoint_file.hpp>
#include <stealbatch/checkpoint/durable_file.hpp>
#include <stealbatch/checkpoint/safetensors.hpp>
#include <stealbatch/error.hpp>

#include <doctest/doctest.h>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

using namespace stealbatch;
namespace fs = std::filesystem;

namespace {

struct TempDir {
  fs::path path = fs::temp_directory_path() / ("sb_ckpt_" + std::to_string(::getpid()) + "_" + std::to_string(counter()++));
  TempDir() { fs::create_directories(path); }
  ~TempDir() { fs::remove_all(path); }
  static int& counter() {
    static int n = 0;
    return n;
  }
};

std::vector<std::byte> bytes_of(const std::string& s) {
  std::vector<std::byte> out(s.size());
  std::memcpy(out.data(), s.data(), s.size());
  return out;
}

// A file from a header text and data bytes, as the format lays it out.
std::vector<std::byte> file_of(const std::string& header, const std::vector<std::byte>& data) {
  std::string out(8, '\0');
  const std::uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);
  std::vector<std::byte> f = bytes_of(out + header);
  f.insert(f.end(), data.begin(), data.end());
  return f;
}

CheckpointError::Reason reason_of(const std::vector<std::byte>& file, std::string* message = nullptr) {
  try {
    (void)CheckpointFile::parse(file, "test.safetensors");
  } catch (const CheckpointError& e) {
    if (message) *message = e.what();
    return e.reason();
  }
  FAIL("parsed a file that should not parse");
  return CheckpointError::Reason::kIo;
}

}  // namespace

TEST_CASE("Safetensors.HeaderIsTheFormatsJsonPaddedToEightBytes") {
  std::vector<SafetensorsTensor> t{{"w", "F32", {2, 3}, 0, 0}, {"b", "F32", {2}, 0, 0}};
  const std::string h = safetensors_header(t, {{"epoch", "3"}});
  std::uint64_t n = 0;
  std::memcpy(&n, h.data(), 8);
  CHECK(n == h.size() - 8);
  CHECK(h.size() % 8 == 0);
  const std::string json = h.substr(8);
  CHECK(json.rfind(R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},"b":{"dtype":"F32","shape":[2],"data_offsets":[24,32]},)"
                   R"("__metadata__":{"epoch":"3"}})", 0) == 0);
  CHECK(json.find_first_not_of(' ', json.find_last_of('}') + 1) == std::string::npos);
  CHECK(t[1].begin == 24);
  CHECK(t[1].end == 32);
}

TEST_CASE("Safetensors.ParsesAFileAsTheReferenceWritesIt") {
  // The bytes safetensors.torch.save_file({"a": torch.tensor([1.0, 2.0])}, ...) writes: no metadata, one F32 tensor.
  const std::string header = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  std::vector<std::byte> data(8);
  const float v[2] = {1.0f, 2.0f};
  std::memcpy(data.data(), v, 8);
  const std::vector<std::byte> f = file_of(header, data);
  const Safetensors s = parse_safetensors(f, "ref");
  REQUIRE(s.tensors().size() == 1);
  CHECK(s.tensors()[0].name == "a");
  CHECK(s.tensors()[0].shape == std::vector<std::uint64_t>{2});
  REQUIRE(s.find("a") != nullptr);
  CHECK(s.find("b") == nullptr);
  float back[2];
  std::memcpy(back, s.bytes_of(*s.find("a")).data(), 8);
  CHECK(back[1] == 2.0f);
  // The reference writes no checksum: a stealbatch checkpoint needs one.
  CHECK(reason_of(f) == CheckpointError::Reason::kChecksum);
}

TEST_CASE("Safetensors.MalformedFilesAreFormatErrorsNamingTheProblem") {
  const std::vector<std::byte> data(8);
  const auto check = [&](const std::vector<std::byte>& f, const char* says) {
    std::string msg;
    CHECK(reason_of(f, &msg) == CheckpointError::Reason::kFormat);
    CHECK_MESSAGE(msg.find(says) != std::string::npos, msg);
    CHECK(msg.find("test.safetensors") != std::string::npos);
  };
  check(bytes_of("abc"), "truncated");
  check(file_of(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", {}), "truncated");
  std::vector<std::byte> long_header = file_of("{}", {});
  long_header[0] = std::byte{200};
  check(long_header, "truncated: the header claims 200 bytes");
  check(file_of(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})", data), "not a JSON object");
  check(file_of(R"([1,2])", data), "does not begin with '{'");
  check(file_of(R"({"a":{"dtype":"F33","shape":[2],"data_offsets":[0,8]}})", data), "unknown dtype 'F33'");
  check(file_of(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", data), "8 bytes for 3 elements");
  check(file_of(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", data), "non-negative integer");
  check(file_of(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", data), "a hole");
  check(file_of(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", data),
        "an overlap");
  check(file_of(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", data), "cover 4 bytes of data, the file has 8");
  check(file_of(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", data), "overflows");
  check(file_of(R"({"__metadata__":{"k":1}})", {}), "is not a string");
}

TEST_CASE("CheckpointFile.RoundTripsAndCatchesEveryFlippedByte") {
  TempDir dir;
  const std::vector<float> w{1, 2, 3, 4, 5, 6}, b{-1, 0.5f};
  const std::vector<CheckpointTensor> tensors{{"w", {2, 3}, w}, {"b", {2}, b}};
  const fs::path p = dir.path / "c.safetensors";
  write_checkpoint_file(p, tensors, {{"epoch", "3"}});
  const CheckpointFile f = CheckpointFile::read(p);
  CHECK(f.floats("w", 6) == w);
  CHECK(f.floats("b", 2) == b);
  CHECK(f.contents().metadata().at("epoch") == "3");
  CHECK_THROWS_AS((void)f.floats("w", 5), CheckpointError);
  CHECK_THROWS_AS((void)f.floats("x", 1), CheckpointError);
  // Every byte of the data flipped in turn: the checksum catches each one.
  const std::vector<std::byte> good = read_whole_file(p);
  const std::size_t data_at = good.size() - (w.size() + b.size()) * sizeof(float);
  for (std::size_t i = data_at; i < good.size(); ++i) {
    std::vector<std::byte> bad = good;
    bad[i] ^= std::byte{0x10};
    CHECK(reason_of(bad) == CheckpointError::Reason::kChecksum);
  }
  // Every truncation is an error, never a partial read.
  for (std::size_t len = 0; len < good.size(); ++len) {
    const std::vector<std::byte> cut(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(len));
    const auto r = reason_of(cut);
    CHECK((r == CheckpointError::Reason::kFormat || r == CheckpointError::Reason::kChecksum));
  }
  // A shape that does not match its values, and the checksum's own key, are refused before anything is written.
  const std::vector<CheckpointTensor> wrong{{"w", {4}, w}};
  CHECK_THROWS_AS(write_checkpoint_file(dir.path / "d.safetensors", wrong, {}), CheckpointError);
  CHECK_THROWS_AS(write_checkpoint_file(dir.path / "d.safetensors", tensors, {{kCrcKey, "0"}}), CheckpointError);
  // So are names and values the JSON header cannot hold: text that is not UTF-8 (a fuzzer found a trainer's metadata
  // value of bytes 0xff... escaping as nlohmann's type_error).
  CHECK_THROWS_WITH_AS(write_checkpoint_file(dir.path / "d.safetensors", tensors, {{"epoch", "\xff\xff"}}),
                       doctest::Contains("metadata 'epoch': its value is not UTF-8"), CheckpointError);
  CHECK_THROWS_WITH_AS(write_checkpoint_file(dir.path / "d.safetensors", tensors, {{"ep\xc3", "1"}}), doctest::Contains("is not UTF-8"),
                       CheckpointError);
  CHECK_THROWS_WITH_AS(write_checkpoint_file(dir.path / "d.safetensors", std::vector<CheckpointTensor>{{"w\xe2\x82", {2, 3}, w}}, {}),
                       doctest::Contains("tensor name"), CheckpointError);
  CHECK_FALSE(fs::exists(dir.path / "d.safetensors"));
}

// The checksum covers the header too: a changed byte in any metadata field (what a resumed run reads to know where it
// stands: the epoch, the position, Adam's step count, the devices' speeds), in a tensor's name or shape, is caught.
TEST_CASE("CheckpointFile.AFlippedByteInAnyMetadataFieldFailsTheChecksum") {
  TempDir dir;
  const std::vector<float> w{1, 2, 3, 4, 5, 6};
  const fs::path p = dir.path / "c.safetensors";
  const std::map<std::string, std::string, std::less<>> meta{
      {"epoch", "3"}, {"position", "1024"}, {"stealbatch.optimizer.steps", "57"}, {"stealbatch.speeds", "1523.5,2210.25"}};
  write_checkpoint_file(p, std::vector<CheckpointTensor>{{"w", {2, 3}, w}}, SafetensorsMetadata(meta.begin(), meta.end()));
  const std::vector<std::byte> good = read_whole_file(p);
  REQUIRE_NOTHROW((void)CheckpointFile::parse(good, "good"));
  const std::string text(reinterpret_cast<const char*>(good.data()), good.size());
  for (const auto& [key, value] : meta) {
    // Each character of the value, changed to another digit or letter: still well-formed JSON, so only the checksum
    // can tell.
    const std::size_t at = text.find("\"" + key + "\":\"" + value + "\"");
    REQUIRE(at != std::string::npos);
    const std::size_t first = at + key.size() + 4;
    for (std::size_t i = first; i < first + value.size(); ++i) {
      std::vector<std::byte> bad = good;
      const char c = static_cast<char>(bad[i]);
      bad[i] = static_cast<std::byte>(c == '9' ? '8' : (c == '.' || c == ',') ? '0' : c + 1);
      std::string msg;
      CAPTURE(key);
      CAPTURE(i - first);
      CHECK(reason_of(bad, &msg) == CheckpointError::Reason::kChecksum);
      CHECK_MESSAGE(msg.find("checksum mismatch") != std::string::npos, msg);
    }
  }
  // Every byte of the header flipped in turn: never loads (a checksum or a format error).
  std::uint64_t header_bytes = 0;
  std::memcpy(&header_bytes, good.data(), 8);  // little-endian, as safetensors stores it (x86-64 here)
  const std::size_t header_end = 8 + static_cast<std::size_t>(header_bytes);
  for (std::size_t i = 8; i < header_end; ++i) {
    std::vector<std::byte> bad = good;
    bad[i] ^= std::byte{0x01};
    const auto r = reason_of(bad);
    CAPTURE(i);
    CHECK((r == CheckpointError::Reason::kChecksum || r == CheckpointError::Reason::kFormat));
  }
}

// A file whose checksum covers only its data (as stealbatch wrote them before the header was covered) is refused
// with a message that says so.
TEST_CASE("CheckpointFile.AChecksumOfTheDataAloneIsRefusedByName") {
  const std::vector<float> v{1.0f, 2.0f};
  std::vector<std::byte> data(8);
  std::memcpy(data.data(), v.data(), 8);
  char crc[9];
  std::snprintf(crc, sizeof crc, "%08x", crc32_of(data));
  const std::vector<std::byte> f =
      file_of(std::string(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"__metadata__":{"stealbatch.crc32":")") + crc + "\"}}", data);
  std::string msg;
  CHECK(reason_of(f, &msg) == CheckpointError::Reason::kChecksum);
  CHECK_MESSAGE(msg.find("covers the tensor data only") != std::string::npos, msg);
}

TEST_CASE("DurableFile.ReplacesWholeAndLeavesNoTemporaryFile") {
  TempDir dir;
  const fs::path p = dir.path / "f";
  const std::string one = "first version", two = "second, longer version";
  const auto write = [&](const std::string& s) {
    const std::span<const std::byte> piece = std::as_bytes(std::span<const char>(s));
    write_file_durably(p, std::span<const std::span<const std::byte>>(&piece, 1));
  };
  write(one);
  write(two);
  const std::vector<std::byte> back = read_whole_file(p);
  CHECK(std::string(reinterpret_cast<const char*>(back.data()), back.size()) == two);
  std::size_t files = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir.path)) ++files;
  CHECK(files == 1);
  // A folder that does not exist: an I/O error naming the path, nothing left behind.
  try {
    const std::span<const std::byte> piece = std::as_bytes(std::span<const char>(one));
    write_file_durably(dir.path / "missing" / "f", std::span<const std::span<const std::byte>>(&piece, 1));
    FAIL("wrote into a missing folder");
  } catch (const CheckpointError& e) {
    CHECK(e.reason() == CheckpointError::Reason::kIo);
    CHECK(std::string(e.what()).find("missing") != std::string::npos);
  }
  CHECK_THROWS_AS((void)read_whole_file(dir.path / "nothing"), CheckpointError);
}

TEST_CASE("CheckpointDir.KeepsTheNewestAndSkipsUnfinishedSaves") {
  TempDir dir;
  const CheckpointDir d(dir.path / "run");
  CHECK_FALSE(d.latest().has_value());
  for (std::uint64_t step : {5u, 100u, 20u, 7u}) std::ofstream(d.path_for(step)) << "x";
  std::ofstream(dir.path / "run" / ".step-000000000200.safetensors.tmp.1.0") << "partial";  // a save that was killed
  std::ofstream(dir.path / "run" / "notes.txt") << "other";
  REQUIRE(d.latest().has_value());
  CHECK(*d.latest() == d.path_for(100));
  CHECK(d.list().size() == 4);
  d.prune(2);
  const auto left = d.list();
  REQUIRE(left.size() == 2);
  CHECK(left[0].first == 20);
  CHECK(left[1].first == 100);
  CHECK_FALSE(fs::exists(dir.path / "run" / ".step-000000000200.safetensors.tmp.1.0"));
  CHECK(fs::exists(dir.path / "run" / "notes.txt"));
  CHECK(d.path_for(7).filename() == "step-000000000007.safetensors");
}

TEST_CASE("CheckpointDir.OrdersByTheStepAFileRecordsNotItsName") {
  TempDir dir;
  const CheckpointDir d(dir.path / "run");
  const std::vector<float> w{1.0f, 2.0f};
  const auto save = [&](const fs::path& path, std::uint64_t step) {
    const CheckpointTensor t{"w", {2}, w};
    write_checkpoint_file(path, std::span<const CheckpointTensor>(&t, 1), {{"stealbatch.optimizer.steps", std::to_string(step)}});
  };
  save(d.path_for(16), 16);
  save(d.path_for(24), 24);
  save(d.path_for(32), 32);
  // Step 16's file copied under the largest name a step can have: as old as what it holds.
  const fs::path renamed = dir.path / "run" / "step-9999999999999999999.safetensors";
  fs::copy_file(d.path_for(16), renamed);
  // A link to nothing, under a checkpoint's name: passed over, not a failure to list the folder; a link to a
  // checkpoint is passed over too (pruning its target would leave it dangling).
  fs::create_symlink(dir.path / "gone.safetensors", d.path_for(40));
  fs::create_symlink(d.path_for(32), d.path_for(41));
  const auto all = d.list();
  REQUIRE(all.size() == 4);
  CHECK(all.back().first == 32);
  REQUIRE(d.latest().has_value());
  CHECK(*d.latest() == d.path_for(32));
  d.prune(2);
  const auto left = d.list();
  REQUIRE(left.size() == 2);
  CHECK(left[0].second == d.path_for(24));
  CHECK(left[1].second == d.path_for(32));
  CHECK_FALSE(fs::exists(renamed));
  CHECK(fs::is_symlink(d.path_for(40)));  // not checkpoints: prune leaves them
  CHECK(fs::is_symlink(d.path_for(41)));
  // A file that records no step (a foreign or truncated one) keeps its name's step: its load names what is wrong.
  std::ofstream(d.path_for(50)) << "not a checkpoint";
  CHECK(*d.latest() == d.path_for(50));
}

TEST_CASE("CheckpointDir.CheckWritableLeavesNoFileAndNamesTheFolder") {
  TempDir dir;
  const CheckpointDir d(dir.path / "run");
  d.check_writable();
  CHECK(fs::is_empty(dir.path / "run"));
  // Root writes anywhere a mode forbids: an immutable folder (chattr +i) is what stops every writer, where the file
  // system allows the flag. Where it does not, the folder's removal stands in (the probe's open fails alike).
  if (std::system(("chattr +i '" + (dir.path / "run").string() + "' 2>/dev/null").c_str()) == 0) {
    try {
      d.check_writable();
      FAIL("an immutable folder passed the check");
    } catch (const CheckpointError& e) {
      CHECK(e.reason() == CheckpointError::Reason::kIo);
      CHECK(std::string(e.what()).find("cannot write a checkpoint into this folder") != std::string::npos);
    }
    CHECK(std::system(("chattr -i '" + (dir.path / "run").string() + "'").c_str()) == 0);
  }
  fs::remove_all(dir.path / "run");
  CHECK_THROWS_AS(d.check_writable(), CheckpointError);
}
