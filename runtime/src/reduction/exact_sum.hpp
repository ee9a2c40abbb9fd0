// Deterministic mode's part of the runtime: each device's fixed-point sum of the cells it ran, the job's shifts, and
// the verdict that redoes a step whose cells left the shifts' window (detail/fixed_point.hpp).
//
// Invariants: one accumulator and one row of exponents per live device, in the devices' order; during the chunk
// phase a device's worker alone touches its own (add_cell()), and in the reduction each device's worker touches only
// its slice of every accumulator (sum_slice()). The shifts change only between a step's phases, on the caller's thread
// (settle(), restore()), and are the same on every replica of the job: they follow from the job's exponents alone.
#pragma once

#include <stealbatch/runtime/detail/fixed_point.hpp>
#include <stealbatch/runtime/parameters.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace stealbatch {

class ExactSum {
 public:
  explicit operator bool() const noexcept { return m_on; }
  // At register_parameters(): the layout's tensors, `devices` accumulators of zeros, and no shift yet (the first step
  // scans its cells and is redone with the shifts they call for).
  void init(const ParameterLayout& layout, std::size_t devices);
  // Before each attempt at a step of `cells` cells across the job: the bound for that many, every exponent cleared.
  // The accumulators are zero already: sum_slice() zeroes what it reads, and a failed step's calls discard().
  void begin_attempt(std::size_t cells);
  void discard();
  // Device d ran a cell: its gradient (the device's buffer, left zeroed) into its accumulator. Throws
  // std::runtime_error naming the tensor when a value is not finite (fixed point cannot hold it: the step fails).
  void add_cell(std::size_t d, std::span<float> grad);
  // The largest exponent of each tensor over this process's devices (kNoExponent: every value 0).
  std::vector<int> exponents() const;
  std::size_t tensors() const noexcept { return m_shift.size(); }
  // The verdict on an attempt from the job's exponents: true if it stands. Either way the shifts are then set from
  // them, for the redo or for the next step.
  bool settle(std::span<const int> job_exponents);
  // Elements [b, e) of the sum over this process's devices, written to out[b, e); the accumulators zeroed there.
  void sum_slice(std::size_t b, std::size_t e, std::span<std::int64_t> out);
  // The two above through a buffer of the sum's own: this process's sum in float, out[b, e) (one process).
  void sum_to_float(std::size_t b, std::size_t e, std::span<float> out);
  // Elements [b, e) of a sum (this process's, or the job's) in float: out[i] = sum[i] * 2^-shift, the shift the
  // attempt rounded i's tensor with.
  void to_float(std::size_t b, std::size_t e, std::span<const std::int64_t> sum, std::span<float> out) const;
  void drop_device(std::size_t d);
  // A device that sums its cells itself (Device::sums_cells_itself(), a GPU): what it is told each cell (each
  // tensor's first element, the count last; this attempt's shifts), and where it hands over its accumulator and its
  // tensors' largest exponents after the chunk phase (Device::take_cells_fixed()); and the words naming tensor `bad`
  // when a value of it was not finite (add_cell() throws them as std::runtime_error).
  std::span<const std::size_t> tensor_begins() const noexcept { return m_begin; }
  std::span<const int> attempt_shifts() const noexcept { return m_used; }
  std::span<std::int64_t> accumulator(std::size_t d) noexcept { return m_acc[d]; }
  std::span<int> largest(std::size_t d) noexcept { return m_exp[d]; }
  std::string not_finite(std::size_t bad) const;
  // The shifts for the next attempt, for checkpoints (kNoExponent: not set yet), and their restoration.
  const std::vector<int>& shifts() const noexcept { return m_shift; }
  void restore(std::span<const int> shifts);

 private:
  bool m_on = false;
  std::vector<std::size_t> m_begin;  // each tensor's first element; the parameter count last
  std::vector<std::string> m_name;
  std::vector<int> m_shift;  // for the next attempt
  std::vector<int> m_used;   // this attempt's: what its cells were rounded with
  int m_bits = 51;
  std::vector<std::vector<std::int64_t>> m_acc;  // per device
  std::vector<std::int64_t> m_sum;               // sum_to_float()'s: each device writes its slice
  std::vector<std::vector<int>> m_exp;           // per device, per tensor: the largest exponent this attempt
};

}  // namespace stealbatch
