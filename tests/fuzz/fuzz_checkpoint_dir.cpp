// libFuzzer target for the checkpoint folder: any bytes, as a folder's entries (names, and what each is: a
// checkpoint recording some step, a foreign file, a link to nothing or to a checkpoint, a folder). The folder's list,
// newest and pruning must hold their promises whatever the names say: only CheckpointError may come out, the list is
// ordered by the step each file records, the newest is its last, pruning keeps exactly the newest `keep` of it and
// leaves every other entry alone but the temporary files of unfinished saves.
//
//   cmake -S . -B build-fuzz -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DSTEALBATCH_FUZZ=ON -DSTEALBATCH_CUDA=OFF
//   ninja -C build-fuzz fuzz_checkpoint_dir && build-fuzz/tests/fuzz/fuzz_checkpoint_dir -max_total_time=300 /tmp/corpus tests/fuzz/checkpoint_dir_corpus
//
// An input is lines: "KIND NAME" with KIND one of c (a checkpoint; NAME then " STEP", the step it records), f (a
// foreign file), l (a dangling link), s (a link to the first checkpoint), d (a folder); its first line is the keep.
#include <stealbatch/checkpoint/checkpoint_dir.hpp>
#include <stealbatch/checkpoint/checkpoint_file.hpp>
#include <stealbatch/error.hpp>

#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

fs::path scratch() {
  static const fs::path p = fs::temp_directory_path() / ("sb_fuzz_dir_" + std::to_string(::getpid()));
  return p;
}

// A name libFuzzer made, made safe for one folder entry: no '/', no NUL, not "." or "..", at most 200 bytes.
std::string entry_name(std::string s) {
  for (char& c : s) {
    if (c == '/' || c == '\0') c = '_';
  }
  if (s.size() > 200) s.resize(200);
  return s == "." || s == ".." ? std::string() : s;
}

std::set<std::string> names_in(const fs::path& dir) {
  std::set<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.insert(e.path().filename().string());
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> lines;
  for (std::size_t at = 0; at <= text.size();) {
    const std::size_t end = std::min(text.find('\n', at), text.size());
    lines.push_back(text.substr(at, end - at));
    at = end + 1;
  }
  if (lines.size() < 2 || lines.size() > 64) return 0;
  const std::size_t keep = 1 + (lines[0].empty() ? 0 : static_cast<unsigned char>(lines[0][0]) % 4);

  const fs::path dir = scratch();
  fs::remove_all(dir);
  fs::create_directories(dir);
  const stealbatch::CheckpointDir folder(dir);
  const std::vector<float> w{1.0f};
  fs::path first_checkpoint;
  for (std::size_t i = 1; i < lines.size(); ++i) {
    const std::string& line = lines[i];
    if (line.size() < 3 || line[1] != ' ') continue;
    std::string rest = line.substr(2);
    std::uint64_t step = 0;
    if (line[0] == 'c') {
      const std::size_t sp = rest.rfind(' ');
      if (sp == std::string::npos) continue;
      const std::string digits = rest.substr(sp + 1);
      if (digits.empty() || digits.size() > 19 || digits.find_first_not_of("0123456789") != std::string::npos) continue;
      step = std::stoull(digits);
      rest.resize(sp);
    }
    const std::string name = entry_name(rest);
    if (name.empty() || fs::exists(fs::symlink_status(dir / name))) continue;
    const fs::path p = dir / name;
    std::error_code ec;
    switch (line[0]) {
      case 'c': {
        const stealbatch::CheckpointTensor t{"w", {1}, w};
        try {
          stealbatch::write_checkpoint_file(p, std::span<const stealbatch::CheckpointTensor>(&t, 1), {{"stealbatch.optimizer.steps", std::to_string(step)}});
        } catch (const stealbatch::CheckpointError&) {
          continue;  // a name the file system refuses
        }
        if (first_checkpoint.empty()) first_checkpoint = p;
        break;
      }
      case 'f': std::ofstream(p) << "not a checkpoint"; break;
      case 'l': fs::create_symlink(dir / ".nothing-here", p, ec); break;
      case 's': if (!first_checkpoint.empty()) fs::create_symlink(first_checkpoint, p, ec); break;
      case 'd': fs::create_directory(p, ec); break;
      default: break;
    }
  }

  try {
    const auto before = folder.list();
    if (!std::is_sorted(before.begin(), before.end())) __builtin_trap();
    for (const auto& [step, path] : before) {
      const std::string n = path.filename().string();
      if (!n.starts_with("step-") || !n.ends_with(".safetensors") || !fs::is_regular_file(fs::symlink_status(path))) __builtin_trap();
    }
    const auto latest = folder.latest();
    if (latest.has_value() != !before.empty() || (latest && *latest != before.back().second)) __builtin_trap();
    // What pruning must leave: every entry that is not a listed checkpoint, and the newest `keep` that are.
    // (and the temporary files of saves that never finished, which pruning removes).
    std::set<std::string> expect;
    for (const std::string& n : names_in(dir)) {
      if (!(n.starts_with(".step-") && n.find(".safetensors.tmp.") != std::string::npos)) expect.insert(n);
    }
    for (std::size_t i = 0; i + keep < before.size(); ++i) expect.erase(before[i].second.filename().string());
    folder.prune(keep);
    if (names_in(dir) != expect) __builtin_trap();
    const auto after = folder.list();
    if (after.size() != std::min(keep, before.size())) __builtin_trap();
  } catch (const stealbatch::CheckpointError&) {
  }
  fs::remove_all(dir);
  return 0;
}
