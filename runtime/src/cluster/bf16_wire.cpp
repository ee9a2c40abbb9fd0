// bfloat16 on the wire: the conversions, the error bound of a sum through it, and the cluster's default sum, which
// rounds around a float sum where the transport cannot add bfloat16 itself.
#include <stealbatch/runtime/cluster.hpp>

#include <bit>
#include <cmath>
#include <vector>

namespace stealbatch {

std::uint16_t to_bf16(float v) noexcept {
  const auto bits = std::bit_cast<std::uint32_t>(v);
  if ((bits & 0x7fffffffU) > 0x7f800000U) return static_cast<std::uint16_t>((bits >> 16) | 0x0040U);  // a NaN, quiet
  // To nearest, ties to even: add half of the dropped half's range, less one unless the kept part is odd. A carry
  // into the exponent is the correct rounding up, to infinity past bfloat16's largest.
  return static_cast<std::uint16_t>((bits + 0x7fffU + ((bits >> 16) & 1U)) >> 16);
}

float from_bf16(std::uint16_t h) noexcept { return std::bit_cast<float>(static_cast<std::uint32_t>(h) << 16); }

double bf16_sum_bound(int ranks) noexcept {
  const double ru = static_cast<double>(ranks) * std::ldexp(1.0, -8);
  return ru / (1 - ru);
}

void Cluster::allreduce_sum_bf16(std::span<float> data, const std::function<void()>& waiting) {
  for (float& v : data) v = from_bf16(to_bf16(v));
  allreduce_sum(data, waiting);
  for (float& v : data) v = from_bf16(to_bf16(v));
}

}  // namespace stealbatch
