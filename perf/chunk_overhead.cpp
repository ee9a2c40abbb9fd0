// chunk_overhead: the runtime's cost per chunk (everything but the chunk function), with empty chunk functions.
#include <stealbatch/runtime/runtime.hpp>
#include <stealbatch/runtime/version.hpp>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <vector>

using namespace stealbatch;

int main(int argc, char** argv) {
  std::string devices = "cpu:2";
  std::size_t chunks = 4096, steps = 50;
  std::string policy = "steal";
  CLI::App app{"chunk_overhead: runtime cost per chunk with empty chunk functions"};
  app.add_option("--devices", devices, "device spec")->capture_default_str();
  app.add_option("--chunks", chunks, "chunks per step (chunk size 1)")->check(CLI::Range(1, 1 << 22))->capture_default_str();
  app.add_option("--steps", steps, "timed steps (after 5 untimed)")->check(CLI::Range(1, 100000))->capture_default_str();
  app.add_option("--policy", policy, "static or steal")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  Runtime rt({.devices = devices, .chunk_size = 1, .policy = parse_policy(policy)});
  ParameterLayout layout;
  layout.add("p", 1);
  rt.register_parameters(layout, std::vector<float>{0.0f});
  std::vector<std::uint32_t> batch(chunks);
  std::iota(batch.begin(), batch.end(), 0u);
  const ChunkFunction empty = [](ChunkContext&) {};
  std::vector<double> per_chunk_us;
  for (std::size_t i = 0; i < steps + 5; ++i) {
    const StepReport r = rt.compute_gradient(batch, empty);
    // Each device spends the chunk phase on its chunks, so device-time per chunk = phase * devices / chunks.
    if (i >= 5) per_chunk_us.push_back(r.chunks_s * static_cast<double>(rt.device_count()) / static_cast<double>(r.chunks) * 1e6);
  }
  std::sort(per_chunk_us.begin(), per_chunk_us.end());
  std::printf("# chunk_overhead, stealbatch %s: %s, policy %s, %zu chunks of 1 sample per step, %zu timed steps\n", kVersionString,
              devices.c_str(), policy.c_str(), chunks, steps);
  std::printf("# per-chunk overhead = chunk-phase wall time x devices / chunks (device-time per chunk, empty chunk function)\n");
  std::printf("per_chunk_us  p50 %.3f  p10 %.3f  p90 %.3f\n", per_chunk_us[per_chunk_us.size() / 2], per_chunk_us[per_chunk_us.size() / 10],
              per_chunk_us[per_chunk_us.size() * 9 / 10]);
  return 0;
}
