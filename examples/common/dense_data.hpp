// Samples as dense float rows with integer labels: what the example models read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

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

// What a GPU chunk receives of each sample (RuntimeOptions::input_bytes and ::gather): its features, then its
// label as a float.
//
//   ro.input_bytes = gpu_input_bytes(train);
//   ro.gather = [&](std::uint32_t s, std::byte* dst) { gather_sample(train, s, dst); };
std::size_t gpu_input_bytes(const DenseData& data);
void gather_sample(const DenseData& data, std::uint32_t sample, std::byte* dst);

}  // namespace stealbatch::examples
