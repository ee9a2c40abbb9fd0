// stealbench --chunk-overhead: the runtime's cost per chunk (everything but the chunk function), with empty chunk
// functions on real devices (cpu:N), not simulated ones.
#include "stealbench_overhead.hpp"
#include "tool_cli.hpp"

#include <stealbatch/runtime/runtime.hpp>
#include <stealbatch/runtime/version.hpp>
#include <stealbatch/stats.hpp>

#include <CLI/CLI.hpp>

#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

namespace stealbatch::perf {

int run_chunk_overhead(int argc, char** argv) {
  std::string devices = "cpu:2";
  std::size_t chunks = 4096, steps = 50;
  std::string policy = "steal";
  CLI::App app{"stealbench --chunk-overhead: the runtime's cost per chunk with empty chunk functions"};
  bool mode = true;  // stealbench's main() sends only --chunk-overhead here
  app.add_flag("--chunk-overhead", mode, "this mode (without it, stealbench runs simulated devices)");
  app.add_option("--devices", devices, "device spec")->capture_default_str();
  app.add_option("--chunks", chunks, "chunks per step (chunk size 1)")->check(CLI::Range(1, 1 << 22))->capture_default_str();
  app.add_option("--steps", steps, "timed steps (after 5 untimed)")->check(CLI::Range(1, 100000))->capture_default_str();
  app.add_option("--policy", policy, "static, steal or central")->capture_default_str();
  app.footer("Exit status: 0 every step exact; 1 a step's gradient is not one a sample; 2 a usage error (a flag or its value).");
  if (const int rc = parse(app, argc, argv); rc >= 0) return rc;

  std::vector<double> per_chunk_us, step_us;
  std::size_t wrong = 0;
  try {
    Runtime rt({.devices = devices, .schedule = {.chunk_size = 1, .policy = parse_policy(policy)}});
    ParameterLayout layout;
    layout.add("p", 1);
    rt.register_parameters(layout, std::vector<float>{0.0f});
    std::vector<std::uint32_t> batch(chunks);
    std::iota(batch.begin(), batch.end(), 0u);
    // Each chunk adds its sample count to the gradient's one float: the reduced gradient must be the batch, every
    // step (the correctness column), whichever device ran which chunk.
    const ChunkFunction count = [](ChunkContext& ctx) { ctx.grad[0] += static_cast<float>(ctx.samples.size()); };
    for (std::size_t i = 0; i < steps + 5; ++i) {
      const StepReport r = rt.compute_gradient(batch, count);
      wrong += r.samples != chunks || rt.gradient()[0] != 1.0f;  // the mean of 1 a sample
      // Each device spends the chunk phase on its chunks, so device time per chunk = phase x devices / chunks.
      if (i >= 5) {
        per_chunk_us.push_back(r.chunks_s * static_cast<double>(rt.device_count()) / static_cast<double>(r.chunks) * 1e6);
        step_us.push_back(r.step_s * 1e6);
      }
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "stealbench --chunk-overhead: %s\n", e.what());
    return 2;
  }
  std::printf("# stealbench --chunk-overhead, stealbatch %s: devices %s, policy %s, %zu samples a step at chunk_size 1, 5 untimed + %zu timed steps\n",
              kVersionString, devices.c_str(), policy.c_str(), chunks, steps);
  std::printf("# per_chunk_us = chunk-phase wall time x devices / chunks: the runtime's device time per chunk, the chunk function a single add\n");
  std::printf("%-10s %10s %10s %10s %12s %7s\n", "metric", "p10", "p50", "p90", "step_us_p50", "#wrong");
  std::printf("%-10s %10.3f %10.3f %10.3f %12.1f %7zu\n", "per_chunk", percentile(per_chunk_us, 0.1), median(per_chunk_us), percentile(per_chunk_us, 0.9),
              median(step_us), wrong);
  std::printf("# summary: %zu steps checked, #wrong total %zu\n", steps + 5, wrong);
  return wrong == 0 ? 0 : 1;
}

}  // namespace stealbatch::perf
