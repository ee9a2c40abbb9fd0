// The example models on a GPU device: the same networks, parameter layouts and math as MlpModel and CnnModel,
// in cuBLAS GEMMs and a few kernels, enqueued on the chunk's stream.
#pragma once

#include "dense_data.hpp"

#include <stealbatch/runtime/device.hpp>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace stealbatch::examples {

// What a chunk's sample carries to the GPU: its features, then its label as a float (features + 1 floats).
// Pass these to RuntimeOptions::input_bytes and ::gather.
//
//   ro.input_bytes = gpu_input_bytes(train);
//   ro.gather = [&](std::uint32_t s, std::byte* dst) { gather_sample(train, s, dst); };
std::size_t gpu_input_bytes(const DenseData& data);
void gather_sample(const DenseData& data, std::uint32_t sample, std::byte* dst);

// sizes = {inputs, hidden..., classes}, as MlpModel. accumulate() enqueues the forward and backward passes of the
// chunk on ctx.stream: ctx.grad += the summed gradient, *ctx.device_loss += the summed loss.
class MlpCuda {
 public:
  explicit MlpCuda(std::vector<std::size_t> sizes) : m_sizes(std::move(sizes)) {}
  void accumulate(ChunkContext& ctx) const;

 private:
  std::vector<std::size_t> m_sizes;
};

// The CnnModel network (see cnn_model.hpp) on the GPU: im2col + cuBLAS for the convolutions.
class CnnCuda {
 public:
  void accumulate(ChunkContext& ctx) const;
};

}  // namespace stealbatch::examples
