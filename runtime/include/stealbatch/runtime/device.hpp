// The Device interface a runtime drives, and what a chunk function is handed.
#pragma once

#include <stealbatch/runtime/optimizer.hpp>
#include <stealbatch/runtime/parameters.hpp>
#include <stealbatch/scheduler/chunk_deque.hpp>

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace stealbatch {

class Device;

// Everything a chunk function needs: which device runs it, which samples, the device's replica of the
// parameters (read-only during a step), and the device's gradient buffer to accumulate into (add, never assign:
// other chunks of the step accumulate into the same buffer). The gradient is a sum over samples, not a mean:
// the runtime divides by the step's sample count after the reduction.
//
//   auto fn = [&](ChunkContext& ctx) {
//     for (std::uint32_t s : ctx.samples) loss += accumulate_grad(ctx.params, ctx.grad, s);
//     ctx.add_loss(loss);
//   };
struct ChunkContext {
  std::size_t device = 0;
  std::size_t home_device = 0;   // where the chunk was placed; != device when it was stolen (its inputs moved)
  ChunkId chunk = 0;
  // The chunks this call runs: {chunk}, or, when a thief merges what it stole (RuntimeOptions::schedule.merge_stolen),
  // several contiguous ones, `chunk` first; `samples` then covers them all.
  std::span<const ChunkId> chunks;
  std::span<const std::uint32_t> samples;
  std::span<const float> params;
  std::span<float> grad;
  const ParameterLayout* layout = nullptr;
  double* loss_sum = nullptr;    // the device's running loss for this step
  void add_loss(double sum_over_chunk) const { *loss_sum += sum_over_chunk; }

  // GPU devices only (nullptr elsewhere). params and grad above then hold device addresses. The chunk enqueues its
  // work on `stream` and returns without waiting: the runtime tracks completion with events.
  void* stream = nullptr;        // the device's compute stream (cudaStream_t)
  void* blas = nullptr;          // a cuBLAS handle bound to `stream` (cublasHandle_t)
  const void* input = nullptr;   // the chunk's inputs on the device: RuntimeOptions::gpu.gather's bytes, sample after sample
  float* device_loss = nullptr;  // a device float the chunk adds its summed loss to (atomicAdd)
  Device* owner = nullptr;       // the device running the chunk (for workspace())
  // Scratch memory of the running device (device memory on a GPU), at least `bytes`, reused by the device's
  // next chunk: on a GPU its chunks run in stream order, so one workspace serves them all.
  void* workspace(std::size_t bytes) const;
};

// What a device tells of a chunk it ran (Device::run_chunk()), apart from what the chunk saw: the chunk function never
// writes it.
struct ChunkTiming {
  // The chunk's compute time, where the device knows it better than the call's wall time tells (a CPU device with one
  // thread: the CPU time it spent, times its slowdown, without the time it waited for a core). 0 elsewhere.
  double compute_seconds = 0;
  // When the chunk runs on a device that keeps a timeline of its own (a simulated device with chunks in flight),
  // which the trace shows instead of the worker's call. Unset elsewhere.
  std::chrono::steady_clock::time_point device_begin{}, device_end{};
};

// A call's time on the device's own clock (a GPU's CUDA events), known only once the call's work is done: a device
// whose run_chunk() returns before its chunk has run reports it after the chunk phase (Device::call_device_times()).
struct DeviceCallTime {
  ChunkId first = 0;         // the lowest id among the call's chunks (a merged call's descend from ChunkContext::chunk)
  std::uint32_t chunks = 1;  // how many contiguous chunks the call ran (ChunkContext::chunks.size()): first, first + 1, ...
  double seconds = 0;        // from the start of its first kernel to the end of its last, on the device
};

using ChunkFunction = std::function<void(ChunkContext&)>;

// Chunks a device with its own queue (a GPU stream, a simulated device) may have launched and not finished.
inline constexpr std::size_t kMaxInFlight = 16;
// Throws ConfigError unless 1 <= in_flight <= kMaxInFlight, naming the field and the range.
void check_in_flight(std::size_t in_flight);

// How a GPU device's worker waits for its chunks. kSpin: CUDA's default scheduling, as PyTorch waits (the thread
// spins while the process has no more CUDA contexts than cores, and yields otherwise); the wake-up is immediate.
// kBlock: blocking-sync events; the thread sleeps and costs no CPU, but each wait adds a sleep and a wake-up.
enum class GpuWait { kSpin, kBlock };

// One compute device. Each device is driven by one worker thread of the runtime, which calls every method below
// except name(), on that thread.
//
// The device also holds its replica: the parameters, the gradient buffer (the sum over this step's chunks) and
// the optimizer state. The defaults here keep them in host memory (CPU and simulated devices); a GPU device
// overrides them to keep them in device memory.
class Device {
 public:
  virtual ~Device() = default;
  virtual std::string name() const = 0;
  // Called once on the device's worker thread before it runs anything (bind a GPU, pin a thread).
  virtual void bind() {}
  // Called by the runtime's thread before a step's chunks, between steps (the device runs nothing), with the step's
  // largest chunk: a device that stages inputs sizes its buffers for it here, so that nothing allocates mid-step.
  virtual void reserve(std::size_t /*max_chunk_samples*/) {}
  // Runs one chunk; returns once its gradient is in ctx.grad (or, with chunks in flight, once it is queued), with what
  // the device knows of its timing.
  virtual ChunkTiming run_chunk(ChunkContext& ctx, const ChunkFunction& fn) = 0;
  // Called by the runtime's thread before each step's chunks, with the step's number (from 1) and start time.
  virtual void begin_step(std::uint64_t /*step*/, std::chrono::steady_clock::time_point /*start*/) {}

  // The replica. params() and grad() are addresses the chunk functions use (device memory on a GPU).
  virtual void init_replica(std::span<const float> initial, const OptimizerOptions& options);
  // A host device in the same process as the others (CPU, simulated) needs no replica of its own: it reads the
  // runtime's one host copy of the parameters, which the runtime updates, and keeps only its gradient buffer.
  // apply_update() and set_lr() are then not for it (they throw std::logic_error).
  void share_replica(std::span<const float> shared_params);
  // Points a sharing device at the runtime's other copy (between steps, on any thread: the step hand-off orders it).
  void set_shared_params(std::span<const float> shared_params) noexcept { m_shared_params = shared_params; }
  virtual std::span<const float> params() const { return m_shares ? m_shared_params : std::span<const float>(m_params); }
  virtual std::span<float> grad() { return m_grad; }
  virtual void zero_grad();
  // Waits until every chunk this device launched has finished (a GPU's in-flight chunks); throws on a device error.
  virtual void finish_chunks() {}
  // Seconds until the chunks this device has launched and not finished are done: a chunk launched now starts no
  // sooner. 0 for a device whose run_chunk() returns when its chunk is done (the default).
  virtual double queued_seconds() const { return 0.0; }
  // The optimizer step from the reduced gradient sum scaled by grad_scale, then zero_grad(). A device with its own
  // queue (a GPU) may return once both are queued: its next chunks and every copy back to the host come after them.
  virtual void apply_update(float grad_scale);
  // Waits until everything the device has queued is done (a GPU's update behind a collective across ranks), so that
  // a reduction that never completes stalls here, under the reduction phase's watchdog. Nothing to wait for by default.
  virtual void wait_queued() {}
  virtual void set_lr(float lr);
  // The replica's optimizer state, copied to host memory, and its replacement with a saved one together with the
  // parameters (a resumed run; the sizes are the replica's). Not for a device that shares the runtime's parameters.
  virtual OptimizerState optimizer_state() const;
  virtual void load_replica(std::span<const float> params, const OptimizerState& state);
  // Copies to host memory (out.size() == the parameter count).
  virtual void copy_params(std::span<float> out) const;
  virtual void copy_grad(std::span<float> out) const;
  // The summed loss the chunks added on the device since the last call, read after finish_chunks() (GPU); 0 on host
  // devices, whose chunks use add_loss.
  virtual double take_device_loss() { return 0; }
  // The device's own busy time for this step's chunks, read after finish_chunks(), when it keeps one: a device with
  // chunks in flight knows it better than its worker's time in run_chunk() does. Empty: the runtime measures the
  // device by its worker (busy time in the chunk phase plus the wait in finish_chunks()).
  virtual std::optional<double> step_device_seconds() const { return std::nullopt; }
  // Whether the device times each call on its own clock (true: call_device_times() holds every call of a step). Fixed
  // for the device's life: the runtime reads it once, to choose how its chunk sizes and costs are learnt.
  virtual bool times_calls() const noexcept { return false; }
  // This step's calls in the order they ran, each with its time on the device, read after finish_chunks() and valid
  // until the next begin_step(). Empty for a device that does not time them (times_calls() false).
  virtual std::span<const DeviceCallTime> call_device_times() const { return {}; }
  // The DeviceCallTime of the call `ctx` describes, timed `seconds`: what a device that times its calls records.
  static DeviceCallTime call_time(const ChunkContext& ctx, double seconds) noexcept;
  virtual void* workspace(std::size_t bytes);

  // Deterministic mode on a device whose gradient lives in its own memory (a GPU; host devices leave it to the
  // runtime, and these throw std::logic_error). add_cell_fixed() queues, behind the chunk just run, the rounding of
  // its gradient to fixed point (stealbatch/runtime/detail/fixed_point.hpp, the same rule as on the host) into the
  // device's int64 accumulator, keeps each tensor's largest exponent, and zeroes the gradient for the next cell.
  // `begin`: each tensor's first element, the parameter count last; `shift`: the attempt's shift per tensor
  // (kNoExponent: scan only). take_cells_fixed(), after the chunk phase, adds the accumulator into `acc` (modulo
  // 2^64) and each tensor's largest exponent into `largest` (their max), resets both on the device, and returns the
  // first tensor that held a value that is not finite, or -1. load_grad() puts the reduced sum where a collective
  // would have left it.
  virtual bool sums_cells_itself() const { return false; }
  virtual void add_cell_fixed(std::span<const std::size_t> begin, std::span<const int> shift);
  virtual long take_cells_fixed(std::span<std::int64_t> acc, std::span<int> largest);
  virtual void load_grad(std::span<const float> sum);

  // Cancellation, for the stall watchdog: cancel() wakes every sleep_until_or_cancel() of this device now and
  // until reset_cancel() (which the runtime calls before each step). Thread-safe.
  void cancel();
  void reset_cancel();
  // Sleeps until `until`, or until cancel(); returns false when cancelled. Burns no CPU.
  bool sleep_until_or_cancel(std::chrono::steady_clock::time_point until);
  // The same, ending within microseconds of `until`: sleeps until `spin` before it, then yields until it (a timed
  // sleep oversleeps by tens of microseconds, at times hundreds). For one thread's wait whose lateness
  // would be the whole step's (the simulated AllReduce); it burns up to `spin` of one core.
  bool sleep_precisely_until_or_cancel(std::chrono::steady_clock::time_point until,
                                       std::chrono::nanoseconds spin = std::chrono::microseconds(150));

 protected:
  std::vector<float> m_params, m_grad;
  std::unique_ptr<Optimizer> m_optimizer;
  std::span<const float> m_shared_params;  // with share_replica()
  bool m_shares = false;
  std::vector<std::byte> m_workspace;

 private:
  std::mutex m_cancel_mutex;
  std::condition_variable m_cancel_cv;
  bool m_cancelled = false;
};

inline void* ChunkContext::workspace(std::size_t bytes) const { return owner->workspace(bytes); }

}  // namespace stealbatch
