// Samples as dense float rows with integer labels: what the example models read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace stealbatch::examples {

// The IDX reader fills one; a test can point one at its own synthetic rows.
//
//   const DenseData train{ds.count, ds.features, ds.x, ds.y};
struct DenseData {
  std::size_t count = 0;
  std::size_t features = 0;
  std::span<const float> x;            // count * features
  std::span<const std::uint8_t> y;     // count
};

// Throws DataError unless `data` is what a model of `features` inputs can read at `samples`: its feature count is the
// model's, its rows and labels hold `count` samples, and every sample id is below the count. `model` names the model in
// the message. Every example model calls it where samples enter (forward, accuracy).
//
//   check_input(data, 784, samples, "mlp");
void check_input(const DenseData& data, std::size_t features, std::span<const std::uint32_t> samples, const char* model);

// What a GPU chunk receives of each sample (RuntimeOptions::gpu.input_bytes and .gather): its features, then its
// label as a float.
//
//   ro.gpu.input_bytes = gpu_input_bytes(train);
//   ro.gpu.gather = [&](std::uint32_t s, std::byte* dst) { gather_sample(train, s, dst); };
std::size_t gpu_input_bytes(const DenseData& data);
void gather_sample(const DenseData& data, std::uint32_t sample, std::byte* dst);

// The order of an epoch's samples: 0..n-1 shuffled by Fisher-Yates with SplitMix64 from seed * 1000003 + epoch,
// the index drawn as (r * (i + 1)) >> 64. Fully specified, so perf/torch_ref.py trains on the same order.
std::vector<std::uint32_t> epoch_order(std::size_t n, std::uint64_t seed, std::size_t epoch);

}  // namespace stealbatch::examples
