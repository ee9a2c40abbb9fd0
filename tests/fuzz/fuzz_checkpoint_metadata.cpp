// libFuzzer target for a checkpoint's metadata as the runtime reads it, past the checksum: a valid checkpoint of a
// small runtime (Adam, two devices) whose metadata values the input rewrites, re-stamped with a correct crc32 (as
// a writer with a bug, or a hand edit followed by a re-stamp, would leave it), then loaded with
// Runtime::load_checkpoint(). The only exception allowed out of the load is CheckpointError, with the runtime as it
// was; a load that succeeds must leave a runtime that steps. Anything else, a hang, or a sanitizer report, is a
// crash.
//
// The input: records of one byte choosing a metadata key (the checkpoint's own keys, in order, then a new key),
// then the value's bytes up to a 0 byte.
//
//   ninja -C build-fuzz fuzz_checkpoint_metadata && build-fuzz/tests/fuzz/fuzz_checkpoint_metadata -max_total_time=300 /tmp/corpus tests/fuzz/metadata_corpus
#include <stealbatch/checkpoint/checkpoint_file.hpp>
#include <stealbatch/error.hpp>
#include <stealbatch/runtime/runtime.hpp>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <numeric>
#include <span>
#include <string>
#include <vector>

using namespace stealbatch;

namespace {

struct Harness {
  std::filesystem::path dir = std::filesystem::temp_directory_path() / ("stealbatch_fuzz_meta_" + std::to_string(getpid()));
  std::unique_ptr<Runtime> rt;
  std::vector<std::string> names;                // the tensors, in the file's order
  std::vector<std::vector<std::uint64_t>> shapes;
  std::vector<std::vector<float>> values;
  SafetensorsMetadata meta;                      // without the checksum
  std::vector<std::string> keys;
  std::vector<std::uint32_t> batch = std::vector<std::uint32_t>(32);

  Harness() {
    std::filesystem::create_directories(dir);
    rt = std::make_unique<Runtime>(RuntimeOptions{.devices = "sim:1,0.5", .schedule = {.chunk_size = 4}, .optimizer = {.kind = OptimizerKind::kAdam, .lr = 1e-3f}});
    ParameterLayout layout;
    layout.add("w", {2, 3});
    layout.add("b", 2);
    rt->register_parameters(layout, std::vector<float>(layout.size(), 0.5f));
    std::iota(batch.begin(), batch.end(), 0u);
    for (int s = 0; s < 3; ++s) step();
    rt->save_checkpoint(dir / "base.safetensors", {{"epoch", "1"}, {"position", "32"}, {"step", "3"}});
    const CheckpointFile f = CheckpointFile::read(dir / "base.safetensors");
    for (const auto& t : f.contents().tensors()) {
      std::size_t count = 1;
      for (std::uint64_t d : t.shape) count *= static_cast<std::size_t>(d);
      names.push_back(t.name), shapes.push_back(t.shape), values.push_back(f.floats(t.name, count));
    }
    meta = f.contents().metadata();
    meta.erase(kCrcKey);
    for (const auto& [k, v] : meta) keys.push_back(k);
  }
  void step() {
    rt->step(batch, [](ChunkContext& ctx) {
      for (std::size_t i = 0; i < ctx.grad.size(); ++i) ctx.grad[i] += 0.01f * static_cast<float>(ctx.samples.size()) * static_cast<float>(i % 3);
    });
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static Harness h;
  SafetensorsMetadata meta = h.meta;
  for (std::size_t at = 0; at < size;) {
    const std::size_t which = data[at++] % (h.keys.size() + 1);
    const std::size_t end = std::find(data + at, data + size, std::uint8_t{0}) - data;
    const std::string value(reinterpret_cast<const char*>(data + at), end - at);
    meta[which < h.keys.size() ? h.keys[which] : "trainer.extra"] = value;
    at = end + 1;
  }
  std::vector<CheckpointTensor> tensors;
  for (std::size_t i = 0; i < h.names.size(); ++i) tensors.push_back({h.names[i], h.shapes[i], h.values[i]});
  const std::filesystem::path path = h.dir / "fuzz.safetensors";
  try {
    write_checkpoint_file(path, tensors, meta);  // stamps the crc32 over what the input made of it
  } catch (const CheckpointError&) {
    return 0;  // what the header cannot hold (text that is not UTF-8) is refused by name, and nothing written
  }
  const std::vector<float> now = h.rt->parameters(0);
  const std::vector<float> before(now.begin(), now.end());
  try {
    (void)h.rt->load_checkpoint(path);
  } catch (const CheckpointError&) {
    const std::vector<float> after = h.rt->parameters(0);
    if (!std::equal(after.begin(), after.end(), before.begin(), before.end())) __builtin_trap();  // a refused checkpoint changed the runtime
    return 0;
  }
  // Loaded: the runtime steps, and its parameters stay finite (the fuzzer's values are all a saved run could hold).
  h.step();
  for (float v : h.rt->parameters(0)) {
    if (!std::isfinite(v)) __builtin_trap();
  }
  return 0;
}
