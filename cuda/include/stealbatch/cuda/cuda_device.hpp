// A GPU (or a green-context part of one) as a runtime device: streams, pinned staging, chunks in flight, and the
// replica in device memory.
#pragma once

#include <stealbatch/cuda/graph_cache.hpp>
#include <stealbatch/cuda/handles.hpp>
#include <stealbatch/runtime/device.hpp>

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace stealbatch::cuda {

class Partition;  // a green context: a set of SMs of one GPU (green.hpp)

// One worker per GPU drives it. A chunk's samples are gathered on the host (TBB) into a pinned staging slot,
// copied to the device on the copy stream, and the compute stream waits for that copy (an event) before the
// chunk function enqueues its kernels. Up to `in_flight` chunks are launched and unfinished at once; the worker
// takes its next chunk only when a slot is free, so a chunk not yet launched stays in the deque, stealable.
// Completion is tracked with events; nothing in the loop synchronizes the whole device. A step waits for the stream
// once, in its drain (finish_chunks(): the step's chunks, with its loss copied back); the reduction, the update and
// the zeroing are queued behind them and not waited for, and the next step's chunks queue behind those.
//
// The gradient buffer holds the parameter count's floats and nothing else: the update scales the reduced sum by the
// factor the host passes (1 / the step's sample count, an integer the host knows exactly at any batch size).
//
// Nothing allocates during a step: the runtime reserves staging for the step's largest chunk before its chunks
// run (reserve), and the workspace grows in stream order (cudaMallocAsync). cudaFree and cudaFreeHost would
// synchronize the whole GPU, every part of it.
class CudaDevice final : public Device {
 public:
  struct Options {
    std::size_t in_flight = 2;
    std::size_t input_bytes = 0;
    std::function<void(std::uint32_t, std::byte*)> gather;
    GpuWait wait = GpuWait::kSpin;
    // Deterministic mode (RuntimeOptions::schedule.deterministic): cells summed in fixed point on the device, and a
    // part's cuBLAS plans its GEMMs for the whole GPU, as a whole GPU's does, so that a cell's gradient is the same
    // bits on a part as on the GPU (cuBLAS gives the same bits for the same architecture and SM count).
    bool deterministic = false;
    // Chunk calls replayed from CUDA graphs (RuntimeOptions::gpu.graphs; graph_cache.hpp says which and when).
    bool graphs = false;
    // Samples [0, resident) held in device memory (RuntimeOptions::gpu.resident): a chunk's rows gathered there by id.
    // Each device holds its own copy, the parts of one GPU too.
    std::size_t resident = 0;
  };
  // `part` (may be null) confines the device's kernels to a green context of GPU `gpu`.
  CudaDevice(std::size_t index, int gpu, Options options, std::shared_ptr<Partition> part = nullptr);
  ~CudaDevice() override;

  std::string name() const override;
  void bind() override;
  void reserve(std::size_t max_chunk_samples) override;
  ChunkTiming run_chunk(ChunkContext& ctx, const ChunkFunction& fn) override;
  void begin_step(std::uint64_t step, std::chrono::steady_clock::time_point start) override;
  // Each call is timed by a pair of events on the compute stream, read as its slot comes free.
  bool times_calls() const noexcept override { return true; }
  std::span<const DeviceCallTime> call_device_times() const override { return m_times; }
  std::optional<double> step_device_seconds() const override;  // the sum of this step's call times: its busy time
  void init_replica(std::span<const float> initial, const OptimizerOptions& options) override;
  std::span<const float> params() const override { return {m_params.data(), m_count}; }
  std::span<float> grad() override { return {m_grad.data(), m_count}; }
  void zero_grad() override;
  void finish_chunks() override;
  // Queued behind the reduction on the compute stream; returns without waiting (wait_queued() waits).
  void apply_update(float grad_scale) override;
  void wait_queued() override;
  void set_lr(float lr) override { m_opt.lr = lr; }
  void copy_params(std::span<float> out) const override;
  void copy_grad(std::span<float> out) const override;
  OptimizerState optimizer_state() const override;
  void load_replica(std::span<const float> params, const OptimizerState& state) override;
  double take_device_loss() override;
  void* workspace(std::size_t bytes) override;
  bool sums_cells_itself() const override { return true; }
  void add_cell_fixed(std::span<const std::size_t> begin, std::span<const int> shift) override;
  long take_cells_fixed(std::span<std::int64_t> acc, std::span<int> largest) override;
  void load_grad(std::span<const float> sum) override;

  int gpu() const noexcept { return m_gpu; }
  // On the device's worker: records ready_event() on the compute stream, behind everything queued so far (the step's
  // chunks), for a reduction on another stream to wait for without the host waiting.
  void record_ready();
  cudaEvent_t ready_event() const noexcept { return m_ready.get(); }
  cudaStream_t compute_stream() const noexcept { return m_compute.get(); }
  // The SMs this device's kernels may use (the whole GPU's without a partition).
  int sm_count() const noexcept { return m_sms; }
  const Partition* partition() const noexcept { return m_part.get(); }
  // With Options::graphs: how many calls ran eagerly, were captured, replayed, or failed to capture.
  const GraphCache<cudaGraphExec_t>::Stats& graph_stats() const noexcept { return m_graphs.stats(); }

 private:
  struct Slot;
  void wait_slot(Slot& s);
  // fn(ctx) on the compute stream: eagerly, or captured into a graph and launched, or a graph replayed.
  void run_graphed(ChunkContext& ctx, const ChunkFunction& fn, Slot& s, std::size_t slot);
  void grow_staging(Slot& s, std::size_t samples);
  // The chunk's inputs into slot s's device rows: gathered on the host and copied, or gathered on the device from the
  // resident samples (by ids copied), behind `started` then (the gather is the chunk's work, as a PyTorch user's
  // index_select is). Sets ctx.input.
  void stage_inputs(ChunkContext& ctx, Slot& s);
  void hold_resident();  // Options::resident: the samples into device memory (bind())
  // Waits for everything enqueued on the compute stream so far, the way Options::wait says; throws naming `what`.
  void sync_compute(const std::string& what);
  [[noreturn]] void fail(const std::string& what, const std::string& detail) const;

  std::size_t m_index;
  int m_gpu;
  Options m_o;
  std::shared_ptr<Partition> m_part;
  int m_sms = 0;
  Stream m_compute, m_copy;
  BlasHandle m_blas;
  Event m_synced;  // recorded by sync_compute(), with the wait's flags
  Event m_ready;   // recorded by record_ready()
  std::vector<std::unique_ptr<Slot>> m_slots;
  std::size_t m_next_slot = 0;
  std::size_t m_count = 0;  // parameters
  DeviceBuffer<float> m_params, m_grad, m_m, m_v, m_loss;
  DeviceBuffer<std::byte> m_resident;  // Options::resident rows of input_bytes
  PinnedBuffer<float> m_loss_host;  // the step's loss, copied back with the stream sync that ends the chunks
  // Deterministic mode: the step's cells in fixed point (int64, modulo 2^64), and each tensor's largest |value| as
  // its bit pattern; made at the first cell (one synchronizing allocation, in the first step).
  DeviceBuffer<unsigned long long> m_fixed;
  DeviceBuffer<unsigned> m_largest;
  // The workspace: stream-ordered (cudaMallocAsync on the compute stream) where the device supports it.
  void* m_scratch = nullptr;
  std::size_t m_scratch_bytes = 0;
  bool m_scratch_async = true;   // the next growth tries the stream-ordered allocator
  bool m_scratch_pooled = false;  // m_scratch came from it (freed with cudaFreeAsync)
  OptimizerOptions m_opt;
  std::uint64_t m_t = 0;
  ChunkId m_last_chunk = 0;
  // This step's calls timed on the device (begin_step() clears them).
  std::vector<DeviceCallTime> m_times;
  // Options::graphs: the graphs by sample count and slot; cuBLAS's own workspace (set, so that a captured GEMM
  // allocates nothing); whether a capture is under way (workspace() may not move then).
  GraphCache<cudaGraphExec_t> m_graphs;
  DeviceBuffer<std::byte> m_blas_workspace;
  bool m_capturing = false;
  std::uint64_t m_step_gen = 0;  // begin_step()'s count
};

}  // namespace stealbatch::cuda
