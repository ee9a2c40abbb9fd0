// bfloat16 on the wire: the conversions, the error bound of a sum through it, and the cluster's default sum, which
// rounds around a float sum where the transport cannot add bfloat16 itself.
#include <stealbatch/runtime/cluster.hpp>

#include <bit>
#include <cmath>
#include <vector>

namespace stealbatch {

namespace {

// Without a branch, so that the loops below vectorize (a million values a millisecond or so on one core).
inline std::uint16_t round_to_bf16(float v) noexcept {
  const auto bits = std::bit_cast<std::uint32_t>(v);
  // To nearest, ties to even: add half of the dropped half's range, less one unless the kept part is odd. A carry
  // into the exponent is the correct rounding up, to infinity past bfloat16's largest.
  const auto rounded = static_cast<std::uint16_t>((bits + 0x7fffU + ((bits >> 16) & 1U)) >> 16);
  const auto quiet_nan = static_cast<std::uint16_t>((bits >> 16) | 0x0040U);
  return (bits & 0x7fffffffU) > 0x7f800000U ? quiet_nan : rounded;
}

inline float widen(std::uint16_t h) noexcept { return std::bit_cast<float>(static_cast<std::uint32_t>(h) << 16); }

}  // namespace

std::uint16_t to_bf16(float v) noexcept { return round_to_bf16(v); }
float from_bf16(std::uint16_t h) noexcept { return widen(h); }

void to_bf16(std::span<const float> in, std::uint16_t* out) noexcept {
  for (std::size_t i = 0; i < in.size(); ++i) out[i] = round_to_bf16(in[i]);
}

void from_bf16(const std::uint16_t* in, std::span<float> out) noexcept {
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = widen(in[i]);
}

void add_bf16(const std::uint16_t* in, std::uint16_t* inout, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) inout[i] = round_to_bf16(widen(in[i]) + widen(inout[i]));
}

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
