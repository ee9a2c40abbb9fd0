// Deterministic mode's number format: a cell's gradient rounded to fixed point, summed exactly in 64-bit integers.
//
// A float sum depends on its order; an integer sum does not. Each cell's gradient (one chunk's, computed on its own)
// is rounded per tensor to q = round(g * 2^shift), to nearest with ties to even, and added into an int64 accumulator.
// Integer addition is exact and associative, so the sum over a step's cells is the same whichever device ran which
// cell, in whichever order, in one process or across ranks. The sum returns to float as float(sum * 2^-shift).
//
// The bounds. A cell's values stay under 2^bits, bits = fixed_cell_bits(cells) <= 51: the rounding below is exact
// under 2^51, and `cells` values under 2^bits sum under 2^62, so no order of additions overflows. A tensor's shift
// puts its largest cell value kHeadroom bits under that bound (fixed_shift_for()). A step whose cells reach past
// the bound, or fall more than kHeadroom + kSlack bits under it, is redone with the shift its own cells call for
// (fixed_shift_fits()); the decision reads only the job's largest exponents, the same on every replica.
//
// The error. Each cell's rounding is at most half a unit, 2^-(shift + 1), so an element of the sum is off by at most
// cells * 2^-(shift + 1) from the exact sum of the cells' float gradients. With the shift in the accepted window that
// is at most cells * 2^(e - bits + kHeadroom + kSlack - 1) for a tensor whose largest cell value is under 2^e: with
// 64 cells and bits = 51, 2^-30 of the tensor's largest value, and with 4096 cells (bits = 50) 2^-23, about a
// float's rounding of that value (2^-24); at the set point, 2^kSlack times less. Elements far smaller than their
// tensor's largest keep that absolute error, not a relative one.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>

namespace stealbatch::detail {

// The exponent of a cell whose values are all 0 (no bound to keep).
inline constexpr int kNoExponent = std::numeric_limits<int>::min();
// The largest cell value sits this many bits under the bound: a step's gradients may grow 2^kHeadroom-fold over the
// step that set the shift before the step is redone.
inline constexpr int kHeadroom = 8;
// ... and may shrink 2^kSlack-fold under it (each bit lost there is a bit of precision).
inline constexpr int kSlack = 8;

// The bound's exponent for a step of `cells` cells (>= 1): min(51, 62 - ceil(log2(cells))).
constexpr int fixed_cell_bits(std::size_t cells) noexcept {
  const int log = cells <= 1 ? 0 : static_cast<int>(std::bit_width(cells - 1));  // ceil(log2(cells))
  return log >= 11 ? 62 - log : 51;
}

// The shift that puts a tensor whose largest cell value is under 2^exponent at kHeadroom bits under the bound.
constexpr int fixed_shift_for(int exponent, int bits) noexcept { return bits - kHeadroom - exponent; }

// Whether a step summed with `shift` stands: every cell under the bound, and the largest no more than kSlack bits
// under its set point. A tensor whose cells were all 0 fits any shift.
constexpr bool fixed_shift_fits(int exponent, int shift, int bits) noexcept {
  if (exponent == kNoExponent) return true;
  const int top = exponent + shift;  // the largest cell value is under 2^top units
  return top <= bits && top >= bits - kHeadroom - kSlack;
}

// What a cell's scan found in one tensor: the exponent e of its largest |value| (|value| < 2^e, as frexp gives it),
// or kNoExponent when every value is 0; and whether a value is not finite.
struct CellScan {
  int exponent = kNoExponent;
  bool finite = true;
};

// One tensor of a cell: scans it, adds round(v * 2^shift) of each value into acc (unless `shift` is kNoExponent:
// the scan alone), and zeroes v for the next cell. The sum is modulo 2^64: a cell past 2^51 units adds garbage, which
// its exponent tells (the step is then redone; nothing it added is kept).
CellScan add_cell_fixed(std::span<float> v, int shift, std::span<std::int64_t> acc) noexcept;

// out[i] = float(sum[i] * 2^-shift): the sum rounded to double (exact under 2^53), scaled (exact), rounded to float;
// the same on every replica.
void from_fixed(std::span<const std::int64_t> sum, int shift, std::span<float> out) noexcept;

}  // namespace stealbatch::detail
