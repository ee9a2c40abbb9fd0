// Deterministic mode's fixed point: a cell rounded and added in one pass, and the sum back to float.
#include <stealbatch/runtime/detail/fixed_point.hpp>

#include <bit>
#include <cfloat>
#include <cmath>

namespace stealbatch::detail {

namespace {

// 1.5 * 2^52: a double y with |y| < 2^51 added to it lands in [2^52, 2^53), where the unit in the last place is 1, so
// the addition rounds y to an integer (to nearest, ties to even: the FPU's default mode, which the library never
// changes), and the sum's low bits minus the constant's are that integer. No conversion instruction, so the loop
// vectorizes; |y| >= 2^51 gives garbage, never undefined behaviour.
constexpr double kRound = 6755399441055744.0;
constexpr std::uint64_t kRoundBits = std::bit_cast<std::uint64_t>(kRound);

}  // namespace

CellScan add_cell_fixed(std::span<float> v, int shift, std::span<std::int64_t> acc) noexcept {
  float largest = 0.0f;
  int bad = 0;  // an int, not a bool, so the loop's reduction vectorizes
  const std::size_t n = v.size();
  float* x = v.data();
  if (shift == kNoExponent) {
    for (std::size_t i = 0; i < n; ++i) {
      const float a = std::fabs(x[i]);
      largest = a > largest ? a : largest;  // NaN compares false: caught by `bad`
      bad |= !(a <= FLT_MAX);
      x[i] = 0.0f;
    }
  } else {
    const double scale = std::ldexp(1.0, shift);
    std::int64_t* q = acc.data();
    for (std::size_t i = 0; i < n; ++i) {
      const float a = std::fabs(x[i]);
      largest = a > largest ? a : largest;
      bad |= !(a <= FLT_MAX);
      const double y = static_cast<double>(x[i]) * scale;  // exact: a power of two, within double's range
      // Modulo 2^64 (unsigned): the two's complement of the rounded value, added; a garbage cell wraps, and is
      // thrown away, never undefined.
      q[i] = static_cast<std::int64_t>(static_cast<std::uint64_t>(q[i]) + (std::bit_cast<std::uint64_t>(y + kRound) - kRoundBits));
      x[i] = 0.0f;
    }
  }
  CellScan s;
  s.finite = bad == 0;
  if (largest > 0.0f && s.finite) (void)std::frexp(largest, &s.exponent);
  return s;
}

void from_fixed(std::span<const std::int64_t> sum, int shift, std::span<float> out) noexcept {
  const double scale = std::ldexp(1.0, -shift);
  for (std::size_t i = 0; i < sum.size(); ++i) out[i] = static_cast<float>(static_cast<double>(sum[i]) * scale);
}

}  // namespace stealbatch::detail
