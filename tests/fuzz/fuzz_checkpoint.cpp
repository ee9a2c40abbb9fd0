// libFuzzer target for the checkpoint reader: any bytes, as a checkpoint file. The only exception allowed out of
// it is CheckpointError; anything else, or a sanitizer report, is a crash. Inputs that parse also have their
// tensors read out, as the runtime's load does.
//
//   cmake -S . -B build-fuzz -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DSTEALBATCH_FUZZ=ON -DSTEALBATCH_CUDA=OFF
//   ninja -C build-fuzz fuzz_checkpoint && build-fuzz/tests/fuzz/fuzz_checkpoint -max_total_time=300 /tmp/corpus tests/fuzz/checkpoint_corpus
#include <stealbatch/checkpoint/checkpoint_file.hpp>
#include <stealbatch/checkpoint/safetensors.hpp>
#include <stealbatch/error.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::vector<std::byte> bytes(size);
  if (size) std::memcpy(bytes.data(), data, size);
  try {
    // The format alone (no checksum needed), then every tensor's bytes read out.
    const stealbatch::Safetensors s = stealbatch::parse_safetensors(bytes, "<fuzz input>");
    std::size_t total = 0;
    for (const auto& t : s.tensors()) total += s.bytes_of(t).size();
    if (total != s.data().size()) __builtin_trap();  // the parser promised every byte covered once
  } catch (const stealbatch::CheckpointError&) {
  }
  try {
    const auto f = stealbatch::CheckpointFile::parse(std::move(bytes), "<fuzz input>");
    for (const auto& t : f.contents().tensors()) {
      if (t.dtype == "F32") (void)f.floats(t.name, (t.end - t.begin) / sizeof(float));
    }
  } catch (const stealbatch::CheckpointError&) {
  }
  return 0;
}
