// Deterministic mode's sum: cells into each device's accumulator, the verdict, the slices of the sum.
#include "reduction/exact_sum.hpp"

#include <algorithm>
#include <stdexcept>

namespace stealbatch {

void ExactSum::init(const ParameterLayout& layout, std::size_t devices) {
  m_on = true;
  m_begin.clear(), m_name.clear();
  for (const TensorView& t : layout.tensors()) m_begin.push_back(t.offset), m_name.push_back(t.name);
  m_begin.push_back(layout.size());
  m_shift.assign(layout.tensor_count(), detail::kNoExponent);
  m_used = m_shift;
  m_acc.assign(devices, std::vector<std::int64_t>(layout.size(), 0));
  m_sum.assign(layout.size(), 0);
  m_exp.assign(devices, std::vector<int>(layout.tensor_count(), detail::kNoExponent));
}

void ExactSum::begin_attempt(std::size_t cells) {
  m_bits = detail::fixed_cell_bits(cells);
  m_used = m_shift;
  for (auto& row : m_exp) std::fill(row.begin(), row.end(), detail::kNoExponent);
}

void ExactSum::discard() {
  for (auto& acc : m_acc) std::fill(acc.begin(), acc.end(), 0);
}

void ExactSum::add_cell(std::size_t d, std::span<float> grad) {
  std::vector<std::int64_t>& acc = m_acc[d];
  std::vector<int>& largest = m_exp[d];
  for (std::size_t t = 0; t < m_shift.size(); ++t) {
    const std::size_t b = m_begin[t], n = m_begin[t + 1] - b;
    const detail::CellScan s = detail::add_cell_fixed(grad.subspan(b, n), m_used[t], std::span<std::int64_t>(acc).subspan(b, n));
    if (!s.finite) throw std::runtime_error(not_finite(t));
    largest[t] = std::max(largest[t], s.exponent);
  }
}

std::string ExactSum::not_finite(std::size_t bad) const {
  return "deterministic mode: the chunk's gradient holds a value that is not finite (NaN or infinite) in tensor '" + m_name[bad] +
         "'; fixed point cannot sum it";
}

std::vector<int> ExactSum::exponents() const {
  std::vector<int> out(m_shift.size(), detail::kNoExponent);
  for (const auto& row : m_exp) {
    for (std::size_t t = 0; t < out.size(); ++t) out[t] = std::max(out[t], row[t]);
  }
  return out;
}

bool ExactSum::settle(std::span<const int> job_exponents) {
  bool stands = true;
  for (std::size_t t = 0; t < m_shift.size(); ++t) {
    const int e = job_exponents[t];
    if (e == detail::kNoExponent) continue;  // all zero: summed exactly whatever the shift; it keeps its shift
    // A shift not yet set (the first step) scanned only: the attempt stands only if the tensor was all zero.
    stands = stands && m_used[t] != detail::kNoExponent && detail::fixed_shift_fits(e, m_used[t], m_bits);
    m_shift[t] = detail::fixed_shift_for(e, m_bits);
  }
  return stands;
}

void ExactSum::sum_slice(std::size_t b, std::size_t e, std::span<std::int64_t> out) {
  std::fill(out.begin() + static_cast<std::ptrdiff_t>(b), out.begin() + static_cast<std::ptrdiff_t>(e), 0);
  for (auto& acc : m_acc) {
    for (std::size_t i = b; i < e; ++i) {
      // Modulo 2^64, as the cells were added: exact when the verdict stands (no partial sum leaves 2^62).
      out[i] = static_cast<std::int64_t>(static_cast<std::uint64_t>(out[i]) + static_cast<std::uint64_t>(acc[i]));
      acc[i] = 0;
    }
  }
}

void ExactSum::sum_to_float(std::size_t b, std::size_t e, std::span<float> out) {
  sum_slice(b, e, m_sum);
  to_float(b, e, m_sum, out);
}

void ExactSum::to_float(std::size_t b, std::size_t e, std::span<const std::int64_t> sum, std::span<float> out) const {
  for (std::size_t t = 0; t < m_shift.size(); ++t) {
    const std::size_t lo = std::max(b, m_begin[t]), hi = std::min(e, m_begin[t + 1]);
    if (lo >= hi) continue;
    // A tensor whose shift is not set summed only zeros.
    const int shift = m_used[t] == detail::kNoExponent ? 0 : m_used[t];
    detail::from_fixed(sum.subspan(lo, hi - lo), shift, out.subspan(lo, hi - lo));
  }
}

void ExactSum::drop_device(std::size_t d) {
  m_acc.erase(m_acc.begin() + static_cast<std::ptrdiff_t>(d));
  m_exp.erase(m_exp.begin() + static_cast<std::ptrdiff_t>(d));
}

void ExactSum::restore(std::span<const int> shifts) {
  if (shifts.size() != m_shift.size()) {
    throw std::logic_error("deterministic mode: " + std::to_string(shifts.size()) + " shifts for " + std::to_string(m_shift.size()) + " tensors");
  }
  m_shift.assign(shifts.begin(), shifts.end());
}

}  // namespace stealbatch
