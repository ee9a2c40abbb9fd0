// The example models on a GPU device: the same networks, parameter layouts and math as MlpModel and CnnModel,
// in cuBLAS GEMMs and a few kernels, enqueued on the chunk's stream.
#pragma once

#include <stealbatch/models/dense_data.hpp>

#include <stealbatch/runtime/device.hpp>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace stealbatch::examples {

// sizes = {inputs, hidden..., classes}, as MlpModel. accumulate() enqueues the forward and backward passes of the
// chunk on ctx.stream: ctx.grad += the summed gradient, *ctx.device_loss += the summed loss.
class MlpCuda {
 public:
  static constexpr std::size_t kMaxLayers = 16;  // weight layers
  // Layer sizes, inputs first and classes last: 2 to kMaxLayers + 1 of them, else ConfigError.
  explicit MlpCuda(std::vector<std::size_t> sizes);
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
