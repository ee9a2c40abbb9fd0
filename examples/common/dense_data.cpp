// A sample as a GPU chunk receives it: features, then the label as a float.
#include "dense_data.hpp"

#include <cstring>

namespace stealbatch::examples {

std::size_t gpu_input_bytes(const DenseData& data) { return (data.features + 1) * sizeof(float); }

void gather_sample(const DenseData& data, std::uint32_t sample, std::byte* dst) {
  std::memcpy(dst, data.x.data() + static_cast<std::size_t>(sample) * data.features, data.features * sizeof(float));
  const float label = static_cast<float>(data.y[sample]);
  std::memcpy(dst + data.features * sizeof(float), &label, sizeof(float));
}

}  // namespace stealbatch::examples
