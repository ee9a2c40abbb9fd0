// Deterministic mode's fixed point: a cell rounded and added in one pass, and the sum back to float.
#include <stealbatch/runtime/detail/fixed_point.hpp>

#include <bit>
#include <cmath>
#include <cstdint>

namespace stealbatch::detail {

namespace {

// 1.5 * 2^52: a double y with |y| < 2^51 added to it lands in [2^52, 2^53), where the unit in the last place is 1, so
// the addition rounds y to an integer (to nearest, ties to even: the FPU's default mode, which the library never
// changes), and the sum's low bits minus the constant's are that integer. No conversion instruction, so the loop
// vectorizes; |y| >= 2^51 gives garbage, never undefined behaviour.
constexpr double kRound = 6755399441055744.0;
constexpr std::uint64_t kRoundBits = std::bit_cast<std::uint64_t>(kRound);

}  // namespace

// Built for three instruction sets, chosen at load time: the pass is memory-bound, and wider vectors halve its
// instructions. Every operation in it is exact or correctly rounded, so each version gives the same bits.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__) && !defined(__SANITIZE_ADDRESS__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
CellScan add_cell_fixed(std::span<float> v, int shift, std::span<std::int64_t> acc) noexcept {
  // The largest |value| as its bit pattern with the sign cleared: for non-negative floats the integer order is the
  // float order, and inf and NaN sort above every finite value (>= 0x7f800000), so one integer max finds both the
  // exponent and a value that is not finite. An integer max reduction vectorizes without -ffast-math; a float one
  // does not.
  std::uint32_t largest = 0;
  const std::size_t n = v.size();
  float* x = v.data();
  if (shift == kNoExponent) {
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint32_t a = std::bit_cast<std::uint32_t>(x[i]) & 0x7fffffffu;
      largest = a > largest ? a : largest;
      x[i] = 0.0f;
    }
  } else {
    const double scale = std::ldexp(1.0, shift);
    std::int64_t* q = acc.data();
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint32_t a = std::bit_cast<std::uint32_t>(x[i]) & 0x7fffffffu;
      largest = a > largest ? a : largest;
      const double y = static_cast<double>(x[i]) * scale;  // exact: a power of two, within double's range
      // Modulo 2^64 (unsigned): the two's complement of the rounded value, added; a garbage cell wraps, and is
      // thrown away, never undefined.
      q[i] = static_cast<std::int64_t>(static_cast<std::uint64_t>(q[i]) + (std::bit_cast<std::uint64_t>(y + kRound) - kRoundBits));
      x[i] = 0.0f;
    }
  }
  CellScan s;
  s.finite = largest < 0x7f800000u;
  if (largest > 0 && s.finite) (void)std::frexp(std::bit_cast<float>(largest), &s.exponent);
  return s;
}

void from_fixed(std::span<const std::int64_t> sum, int shift, std::span<float> out) noexcept {
  const double scale = std::ldexp(1.0, -shift);
  for (std::size_t i = 0; i < sum.size(); ++i) out[i] = static_cast<float>(static_cast<double>(sum[i]) * scale);
}

}  // namespace stealbatch::detail
