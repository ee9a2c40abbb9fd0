// A sample as a GPU chunk receives it (features, then the label as a float), and the epochs' sample order.
#include <stealbatch/models/dense_data.hpp>

#include <stealbatch/error.hpp>

#include <cstring>
#include <string>
#include <numeric>
#include <utility>

namespace stealbatch::examples {

void check_input(const DenseData& data, std::size_t features, std::span<const std::uint32_t> samples, const char* model) {
  if (data.features != features) {
    throw DataError(std::string(model) + ": the data has " + std::to_string(data.features) + " features per sample; the model's input takes " +
                    std::to_string(features) + " (images of another size than the model was built for?)");
  }
  if (data.x.size() < data.count * data.features || data.y.size() < data.count) {
    throw DataError(std::string(model) + ": the data holds " + std::to_string(data.x.size()) + " floats and " + std::to_string(data.y.size()) +
                    " labels, too few for " + std::to_string(data.count) + " samples of " + std::to_string(data.features) + " features");
  }
  for (const std::uint32_t s : samples) {
    if (s >= data.count) {
      throw DataError(std::string(model) + ": sample " + std::to_string(s) + " is past the data's " + std::to_string(data.count) + " samples");
    }
  }
}

std::size_t gpu_input_bytes(const DenseData& data) { return (data.features + 1) * sizeof(float); }

void gather_sample(const DenseData& data, std::uint32_t sample, std::byte* dst) {
  std::memcpy(dst, data.x.data() + static_cast<std::size_t>(sample) * data.features, data.features * sizeof(float));
  const float label = static_cast<float>(data.y[sample]);
  std::memcpy(dst + data.features * sizeof(float), &label, sizeof(float));
}

__extension__ typedef unsigned __int128 Wide;  // the high half of a 64 x 64 product

std::vector<std::uint32_t> epoch_order(std::size_t n, std::uint64_t seed, std::size_t epoch) {
  std::vector<std::uint32_t> order(n);
  std::iota(order.begin(), order.end(), 0u);
  std::uint64_t state = seed * 1000003u + epoch;
  auto next = [&state] {  // SplitMix64
    std::uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  };
  for (std::size_t i = n; i-- > 1;) {
    const auto j = static_cast<std::size_t>((static_cast<Wide>(next()) * (i + 1)) >> 64);
    std::swap(order[i], order[j]);
  }
  return order;
}

}  // namespace stealbatch::examples
