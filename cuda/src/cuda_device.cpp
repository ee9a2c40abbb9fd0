// CudaDevice: gather into pinned staging, copy on the copy stream, compute after an event, up to K in flight.
#include "kernels.hpp"

#include <stealbatch/cuda/cuda_device.hpp>
#include <stealbatch/cuda/green.hpp>

#include <cublas_v2.h>
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace stealbatch::cuda {

// One staging slot: pinned host bytes, their device copy, and the events that order and track the chunk using them.
struct CudaDevice::Slot {
  PinnedBuffer<std::byte> staging;  // the chunk's rows gathered on the host (none with Options::resident)
  DeviceBuffer<std::byte> input;    // ... on the device
  PinnedBuffer<std::uint32_t> ids;  // Options::resident: the chunk's sample ids, and their device copy
  DeviceBuffer<std::uint32_t> device_ids;
  Event copied;   // the H2D copy is done: compute may read `input`
  Event started;  // the compute stream reached the chunk: its inputs are there and the chunk before it is done
  Event done;     // the chunk's kernels are done: the slot may be reused
  bool busy = false;
  ChunkId chunk = 0;
  DeviceCallTime call;     // the call it ran, its time filled in once its events have completed
  std::uint64_t step = 0;  // the step (begin_step()'s count) it ran in: a failed step's time is not the next one's
};

namespace {

// Gathers of at most this many bytes run on the worker's thread: fanning 16 samples out to the TBB pool costs more
// than copying them.
constexpr std::size_t kInlineGatherBytes = std::size_t{256} << 10;
// Options::graphs: graphs kept per device (sample counts times slots; a step's counts are its rung, its shares and
// their remainders, and they recur from step to step), and cuBLAS's workspace for captured GEMMs (what PyTorch
// sets, CUBLAS_WORKSPACE_CONFIG=:4096:8).
constexpr std::size_t kGraphs = 128;
constexpr std::size_t kBlasWorkspaceBytes = std::size_t{32} << 20;

}  // namespace

CudaDevice::CudaDevice(std::size_t index, int gpu, Options options, std::shared_ptr<Partition> part)
    : m_index(index), m_gpu(gpu), m_o(std::move(options)), m_part(std::move(part)),
      m_graphs(kGraphs, [](cudaGraphExec_t g) { SB_CUDA_WARN(cudaGraphExecDestroy(g)); }) {
  check_in_flight(m_o.in_flight);
  if (m_o.resident > 0 && (m_o.input_bytes == 0 || m_o.input_bytes % 4 != 0 || !m_o.gather)) {
    throw ConfigError("CudaDevice: resident = " + std::to_string(m_o.resident) + " needs a gather function and input_bytes a multiple of 4 (" +
                      std::to_string(m_o.input_bytes) + ")");
  }
}

CudaDevice::~CudaDevice() {
  // On the runtime's thread, after the worker has gone. A part's handle, events and streams are released inside its
  // own context, and the thread's context is restored after; the streams go before the part (cuGreenCtxDestroy).
  // A whole GPU's handles are released with that GPU current (cuBLAS synchronizes the current device), and the
  // caller's device is restored after.
  std::optional<ContextScope> part;
  std::optional<DeviceScope> gpu;
  try {
    if (m_part) {
      part.emplace(m_part.get());
    } else {
      gpu.emplace(m_gpu);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "stealbatch: %s: %s\n", name().c_str(), e.what());
  }
  if (m_compute) SB_CUDA_WARN(cudaStreamSynchronize(m_compute.get()));
  if (m_copy) SB_CUDA_WARN(cudaStreamSynchronize(m_copy.get()));
  if (m_scratch && m_compute) {
    SB_CUDA_WARN(m_scratch_pooled ? cudaFreeAsync(m_scratch, m_compute.get()) : cudaFree(m_scratch));
    SB_CUDA_WARN(cudaStreamSynchronize(m_compute.get()));
  }
  m_graphs.clear();
  m_blas.reset();
  m_blas_workspace = {};
  m_slots.clear();
  m_synced.reset();
  m_ready.reset();
  m_params = {}, m_grad = {}, m_m = {}, m_v = {}, m_loss = {}, m_resident = {};
  m_loss_host = {};
  m_compute.reset();
  m_copy.reset();
}

std::string CudaDevice::name() const {
  return m_part ? "vgpu" + std::to_string(m_index) + "(" + std::to_string(m_part->sm_count()) + "SM)" : "cuda" + std::to_string(m_gpu);
}

void CudaDevice::fail(const std::string& what, const std::string& detail) const {
  throw CudaError(name() + ": " + what + ": " + detail);
}

void CudaDevice::bind() {
  SB_CUDA_CHECK(cudaSetDevice(m_gpu));
  if (m_compute) {  // a new worker thread after another device was excluded: make the context current, nothing more
    if (m_part) m_part->make_current();
    return;
  }
  if (m_part) {
    m_part->make_current();  // for this worker's lifetime: a green context is current to one thread at a time
    m_compute = Stream(m_part->create_stream());
    m_copy = Stream(m_part->create_stream());
    m_sms = m_part->sm_count();
  } else {
    m_compute = make_stream();
    m_copy = make_stream();
    SB_CUDA_CHECK(cudaDeviceGetAttribute(&m_sms, cudaDevAttrMultiProcessorCount, m_gpu));
  }
  int pools = 0;
  SB_CUDA_CHECK(cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, m_gpu));
  m_scratch_async = pools != 0;
  m_blas = make_blas();
  SB_CUBLAS_CHECK(cublasSetStream(m_blas.get(), m_compute.get()));
  if (m_o.graphs) {
    // After cublasSetStream, which resets a handle's workspace to cuBLAS's own pool: a GEMM being captured must not
    // allocate, so it gets a workspace of its own.
    m_blas_workspace = DeviceBuffer<std::byte>(kBlasWorkspaceBytes);
    SB_CUBLAS_CHECK(cublasSetWorkspace(m_blas.get(), m_blas_workspace.data(), m_blas_workspace.bytes()));
  }
  // fp32 GEMMs without TF32 (that is opt-in, CUBLAS_TF32_TENSOR_OP_MATH), as PyTorch with allow_tf32 = False. The
  // pedantic mode also forbids faster fp32 algorithms and is meant for testing.
  SB_CUBLAS_CHECK(cublasSetMathMode(m_blas.get(), CUBLAS_DEFAULT_MATH));
  // A part's kernels run on its SMs only: plan grids for those, not for the whole GPU.
  // (Not in deterministic mode: the GEMMs are then planned alike on every part and on the whole GPU.)
  if (m_part && !m_o.deterministic) SB_CUBLAS_CHECK(cublasSetSmCountTarget(m_blas.get(), m_sms));
  const unsigned block = m_o.wait == GpuWait::kBlock ? cudaEventBlockingSync : 0u;
  const unsigned wait_flags = cudaEventDisableTiming | block;
  for (std::size_t i = 0; i < m_o.in_flight; ++i) {
    auto s = std::make_unique<Slot>();
    s->copied = make_event();
    s->started = make_event(cudaEventDefault);  // timed: the call's time on the device is done - started
    s->done = make_event(cudaEventDefault | block);
    m_slots.push_back(std::move(s));
  }
  m_times.reserve(1024);
  m_synced = make_event(wait_flags);
  m_ready = make_event();  // in this device's context: an event is recorded only on a stream of its own context
  m_loss = DeviceBuffer<float>(1);
  m_loss_host = PinnedBuffer<float>(1);
  *m_loss_host.data() = 0.0f;
  SB_CUDA_CHECK(cudaMemsetAsync(m_loss.data(), 0, sizeof(float), m_compute.get()));
  if (m_o.resident > 0) hold_resident();
}

void CudaDevice::hold_resident() {
  const std::size_t row = m_o.input_bytes, n = m_o.resident;
  // Gathered once, on the host in parallel, into pinned memory, and copied; the pinned copy goes once it has arrived.
  PinnedBuffer<std::byte> host(n * row);
  std::byte* dst = host.data();
  tbb::parallel_for(tbb::blocked_range<std::size_t>(0, n, 256), [&](const tbb::blocked_range<std::size_t>& r) {
    for (std::size_t i = r.begin(); i != r.end(); ++i) m_o.gather(static_cast<std::uint32_t>(i), dst + i * row);
  });
  m_resident = DeviceBuffer<std::byte>(n * row);
  SB_CUDA_CHECK(cudaMemcpyAsync(m_resident.data(), host.data(), n * row, cudaMemcpyHostToDevice, m_copy.get()));
  SB_CUDA_CHECK(cudaStreamSynchronize(m_copy.get()));
}

void CudaDevice::sync_compute(const std::string& what) {
  SB_CUDA_CHECK(cudaEventRecord(m_synced.get(), m_compute.get()));
  const cudaError_t e = cudaEventSynchronize(m_synced.get());
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    fail(what, std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e));
  }
}

void CudaDevice::init_replica(std::span<const float> initial, const OptimizerOptions& options) {
  m_graphs.clear();  // they hold the old replica's addresses
  // An update may still be queued on the old replica (apply_update() does not wait): done before it is freed.
  if (m_compute) sync_compute("before a new replica");
  m_count = initial.size();
  m_opt = options;
  m_t = 0;
  m_params = DeviceBuffer<float>(m_count);
  m_grad = DeviceBuffer<float>(m_count);
  m_m = DeviceBuffer<float>(m_count);
  m_v = options.kind == OptimizerKind::kAdam ? DeviceBuffer<float>(m_count) : DeviceBuffer<float>();
  m_fixed = {}, m_largest = {};
  cudaStream_t s = m_compute.get();
  SB_CUDA_CHECK(cudaMemcpyAsync(m_params.data(), initial.data(), m_count * sizeof(float), cudaMemcpyHostToDevice, s));
  SB_CUDA_CHECK(cudaMemsetAsync(m_grad.data(), 0, m_grad.bytes(), s));
  SB_CUDA_CHECK(cudaMemsetAsync(m_m.data(), 0, m_m.bytes(), s));
  if (m_v.size()) SB_CUDA_CHECK(cudaMemsetAsync(m_v.data(), 0, m_v.bytes(), s));
  SB_CUDA_CHECK(cudaStreamSynchronize(s));
}

// Also drops the loss of a step that failed before take_device_loss() read it.
void CudaDevice::zero_grad() {
  SB_CUDA_CHECK(cudaMemsetAsync(m_grad.data(), 0, m_grad.bytes(), m_compute.get()));
  SB_CUDA_CHECK(cudaMemsetAsync(m_loss.data(), 0, sizeof(float), m_compute.get()));
  // ... and a failed or redone attempt's cells (deterministic mode)
  if (m_fixed.size()) SB_CUDA_CHECK(cudaMemsetAsync(m_fixed.data(), 0, m_fixed.bytes(), m_compute.get()));
  if (m_largest.size()) SB_CUDA_CHECK(cudaMemsetAsync(m_largest.data(), 0, m_largest.bytes(), m_compute.get()));
}

// Deterministic mode. The cell's kernels were queued on the compute stream by the chunk function; its rounding
// follows them there, tensor by tensor, and zeroes the gradient before the next cell's kernels, so no
// synchronization is added and chunks stay in flight.
void CudaDevice::add_cell_fixed(std::span<const std::size_t> begin, std::span<const int> shift) {
  const std::size_t tensors = shift.size();
  cudaStream_t s = m_compute.get();
  if (m_fixed.size() != m_count || m_largest.size() != tensors) {
    m_fixed = DeviceBuffer<unsigned long long>(m_count);
    m_largest = DeviceBuffer<unsigned>(tensors);
    SB_CUDA_CHECK(cudaMemsetAsync(m_fixed.data(), 0, m_fixed.bytes(), s));
    SB_CUDA_CHECK(cudaMemsetAsync(m_largest.data(), 0, m_largest.bytes(), s));
  }
  for (std::size_t t = 0; t < tensors; ++t) {
    detail::cell_to_fixed(m_grad.data() + begin[t], begin[t + 1] - begin[t], shift[t], m_fixed.data() + begin[t], m_largest.data() + t, s);
  }
}

long CudaDevice::take_cells_fixed(std::span<std::int64_t> acc, std::span<int> largest) {
  if (m_fixed.size() != m_count || m_largest.size() != largest.size()) return -1;  // no cell ran here this step
  std::vector<std::uint64_t> fixed(m_count);
  std::vector<unsigned> bits(m_largest.size());
  cudaStream_t s = m_compute.get();
  SB_CUDA_CHECK(cudaMemcpyAsync(fixed.data(), m_fixed.data(), m_fixed.bytes(), cudaMemcpyDeviceToHost, s));
  SB_CUDA_CHECK(cudaMemcpyAsync(bits.data(), m_largest.data(), m_largest.bytes(), cudaMemcpyDeviceToHost, s));
  SB_CUDA_CHECK(cudaMemsetAsync(m_fixed.data(), 0, m_fixed.bytes(), s));
  SB_CUDA_CHECK(cudaMemsetAsync(m_largest.data(), 0, m_largest.bytes(), s));
  sync_compute("handing over the step's fixed-point sum after chunk " + std::to_string(m_last_chunk));
  for (std::size_t i = 0; i < m_count; ++i) acc[i] = static_cast<std::int64_t>(static_cast<std::uint64_t>(acc[i]) + fixed[i]);  // modulo 2^64
  long bad = -1;
  for (std::size_t t = 0; t < bits.size(); ++t) {
    if (bits[t] >= 0x7f800000u) {  // inf or NaN
      if (bad < 0) bad = static_cast<long>(t);
      continue;
    }
    if (bits[t] == 0) continue;  // every value 0: no exponent
    int e = 0;
    (void)std::frexp(std::bit_cast<float>(bits[t]), &e);
    largest[t] = std::max(largest[t], e);
  }
  return bad;
}

void CudaDevice::load_grad(std::span<const float> sum) {
  cudaStream_t s = m_compute.get();
  SB_CUDA_CHECK(cudaMemcpyAsync(m_grad.data(), sum.data(), m_count * sizeof(float), cudaMemcpyHostToDevice, s));
  sync_compute("loading the reduced gradient");  // `sum` is the caller's
}

void CudaDevice::grow_staging(Slot& s, std::size_t samples) {
  const std::size_t bytes = samples * m_o.input_bytes;
  if (s.input.size() >= bytes) return;
  if (m_o.resident > 0) {
    s.ids = PinnedBuffer<std::uint32_t>(samples);
    s.device_ids = DeviceBuffer<std::uint32_t>(samples);
  } else {
    s.staging = PinnedBuffer<std::byte>(bytes);
  }
  s.input = DeviceBuffer<std::byte>(bytes);
  for (std::size_t i = 0; i < m_slots.size(); ++i) {
    if (m_slots[i].get() == &s) m_graphs.clear_slot(i);  // its graphs read the old input
  }
}

void CudaDevice::reserve(std::size_t max_chunk_samples) {
  const std::size_t bytes = max_chunk_samples * m_o.input_bytes;
  if (bytes == 0 || m_slots.empty() || m_slots.front()->input.size() >= bytes) return;
  // Between steps, on the runtime's thread: every slot is free (finish_chunks waited for them). A part's memory is
  // its GPU's primary context's, which DeviceScope makes current here.
  const DeviceScope on(m_gpu);
  for (auto& s : m_slots) grow_staging(*s, max_chunk_samples);
}

void CudaDevice::begin_step(std::uint64_t /*step*/, std::chrono::steady_clock::time_point /*start*/) {
  // Between steps. A failed step may leave slots busy (nothing waited for them): their calls are that step's, and the
  // generation keeps wait_slot() from counting them in this one.
  m_times.clear();
  ++m_step_gen;
}

void CudaDevice::wait_slot(Slot& s) {
  if (!s.busy) return;
  const cudaError_t e = cudaEventSynchronize(s.done.get());
  s.busy = false;
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    fail("chunk " + std::to_string(s.chunk), std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e));
  }
  // Both events have completed: the call's time on the device. A timing that fails (it should not) loses the figure,
  // never the chunk; its error is cleared so that the next launch check does not report it.
  if (s.step != m_step_gen) return;
  float ms = 0;
  if (cudaEventElapsedTime(&ms, s.started.get(), s.done.get()) != cudaSuccess) {
    (void)cudaGetLastError();
    return;
  }
  s.call.seconds = static_cast<double>(ms) * 1e-3;
  m_times.push_back(s.call);
}

ChunkTiming CudaDevice::run_chunk(ChunkContext& ctx, const ChunkFunction& fn) {
  Slot& s = *m_slots[m_next_slot];
  wait_slot(s);  // normally already free: the previous call waited until fewer than in_flight were running
  cudaStream_t compute = m_compute.get();
  ctx.stream = compute;
  ctx.blas = m_blas.get();
  ctx.device_loss = m_loss.data();
  stage_inputs(ctx, s);  // records s.started: behind the input's copy and the chunk before
  if (m_o.graphs) {
    run_graphed(ctx, fn, s, m_next_slot);
  } else {
    fn(ctx);
  }
  const cudaError_t launch = cudaGetLastError();
  if (launch != cudaSuccess) fail("chunk " + std::to_string(ctx.chunk), std::string("launch failed: ") + cudaGetErrorName(launch) + ": " + cudaGetErrorString(launch));
  SB_CUDA_CHECK(cudaEventRecord(s.done.get(), compute));
  s.busy = true;
  s.chunk = ctx.chunk;
  s.call = call_time(ctx, 0);
  s.step = m_step_gen;
  m_last_chunk = ctx.chunk;
  m_next_slot = (m_next_slot + 1) % m_slots.size();
  // Leave a slot free before taking the next chunk: with every slot busy, wait for the oldest chunk.
  wait_slot(*m_slots[m_next_slot]);
  return {};  // its time is the events' (call_device_times(), once its slot is waited for), not the call's
}

void CudaDevice::stage_inputs(ChunkContext& ctx, Slot& s) {
  cudaStream_t compute = m_compute.get();
  if (m_o.input_bytes == 0) {
    SB_CUDA_CHECK(cudaEventRecord(s.started.get(), compute));
    return;
  }
  const auto samples = ctx.samples;
  // Reserved before the step (reserve); growing here would synchronize the GPU, so it happens only to a caller that
  // drives the device without a runtime.
  grow_staging(s, samples.size());
  if (m_o.resident > 0) {
    std::uint32_t* ids = s.ids.data();
    for (std::size_t i = 0; i < samples.size(); ++i) {
      if (samples[i] >= m_o.resident) {  // the caller's batch, not the GPU: the device stays usable
        throw ConfigError(name() + ": chunk " + std::to_string(ctx.chunk) + ": sample " + std::to_string(samples[i]) + " is not among the " +
                          std::to_string(m_o.resident) + " samples held on the device (gpu.resident)");
      }
      ids[i] = samples[i];
    }
    SB_CUDA_CHECK(cudaMemcpyAsync(s.device_ids.data(), ids, samples.size() * sizeof(std::uint32_t), cudaMemcpyHostToDevice, m_copy.get()));
  } else {
    std::byte* dst = s.staging.data();
    const std::size_t row = m_o.input_bytes, bytes = samples.size() * row;
    const auto gather = [&](const tbb::blocked_range<std::size_t>& r) {
      for (std::size_t i = r.begin(); i != r.end(); ++i) m_o.gather(samples[i], dst + i * row);
    };
    if (bytes <= kInlineGatherBytes) {
      gather(tbb::blocked_range<std::size_t>(0, samples.size()));
    } else {
      tbb::parallel_for(tbb::blocked_range<std::size_t>(0, samples.size(), 16), gather);
    }
    SB_CUDA_CHECK(cudaMemcpyAsync(s.input.data(), dst, bytes, cudaMemcpyHostToDevice, m_copy.get()));
  }
  SB_CUDA_CHECK(cudaEventRecord(s.copied.get(), m_copy.get()));
  SB_CUDA_CHECK(cudaStreamWaitEvent(compute, s.copied.get(), 0));
  SB_CUDA_CHECK(cudaEventRecord(s.started.get(), compute));
  if (m_o.resident > 0) detail::gather_rows(m_resident.data(), m_o.input_bytes, s.device_ids.data(), samples.size(), s.input.data(), compute);
  ctx.input = s.input.data();
}

void CudaDevice::run_graphed(ChunkContext& ctx, const ChunkFunction& fn, Slot& s, std::size_t slot) {
  cudaStream_t compute = m_compute.get();
  const std::size_t n = ctx.samples.size();
  cudaGraphExec_t exec = nullptr;
  switch (m_graphs.plan(n, slot, &exec)) {
    case GraphCache<cudaGraphExec_t>::Action::kEager:
      fn(ctx);
      return;
    case GraphCache<cudaGraphExec_t>::Action::kReplay:
      SB_CUDA_CHECK(cudaGraphLaunch(exec, compute));
      return;
    case GraphCache<cudaGraphExec_t>::Action::kCapture:
      break;
  }
  // Thread-local capture: the other devices' workers go on with their own CUDA calls meanwhile. What fn enqueues is
  // recorded, not run; the graph then runs it, once now and again at every replay.
  SB_CUDA_CHECK(cudaStreamBeginCapture(compute, cudaStreamCaptureModeThreadLocal));
  m_capturing = true;
  cudaGraph_t graph = nullptr;
  try {
    fn(ctx);
  } catch (...) {
    m_capturing = false;
    (void)cudaStreamEndCapture(compute, &graph);  // ends the capture whatever it holds; nothing of it ran
    if (graph) (void)cudaGraphDestroy(graph);
    (void)cudaGetLastError();
    m_graphs.failed(n, slot);
    throw;
  }
  m_capturing = false;
  const cudaError_t ended = cudaStreamEndCapture(compute, &graph);
  cudaError_t made = ended;
  if (ended == cudaSuccess) made = cudaGraphInstantiate(&exec, graph, 0);
  if (graph) SB_CUDA_WARN(cudaGraphDestroy(graph));  // the executable graph keeps what it needs
  if (made != cudaSuccess) {
    // Something in fn cannot be captured (a synchronization, a call on another stream): nothing of it ran, so it
    // runs eagerly now, and this count does from now on.
    (void)cudaGetLastError();
    std::fprintf(stderr, "stealbatch: %s: a chunk of %zu samples could not be captured in a CUDA graph (%s); it runs without one\n",
                 name().c_str(), n, cudaGetErrorName(made));
    m_graphs.failed(n, slot);
    SB_CUDA_CHECK(cudaEventRecord(s.started.get(), compute));  // the capture's host time is not the call's
    fn(ctx);
    return;
  }
  m_graphs.captured(n, slot, exec);
  // The call's time starts here: the stream may have gone idle while the host captured and instantiated.
  SB_CUDA_CHECK(cudaEventRecord(s.started.get(), compute));
  SB_CUDA_CHECK(cudaGraphLaunch(exec, compute));
}

void CudaDevice::finish_chunks() {
  // One wait: the loss copied back and reset behind the last chunk, then the stream. Every slot's chunk is done by
  // then, so taking their times (wait_slot()) waits for nothing more.
  SB_CUDA_CHECK(cudaMemcpyAsync(m_loss_host.data(), m_loss.data(), sizeof(float), cudaMemcpyDeviceToHost, m_compute.get()));
  SB_CUDA_CHECK(cudaMemsetAsync(m_loss.data(), 0, sizeof(float), m_compute.get()));
  sync_compute("after chunk " + std::to_string(m_last_chunk) + " (the step's chunks, or the update queued before them)");
  for (auto& s : m_slots) wait_slot(*s);
}

void CudaDevice::apply_update(float grad_scale) {
  ++m_t;
  cudaStream_t s = m_compute.get();
  if (m_opt.kind == OptimizerKind::kSgd) {
    detail::sgd_update(m_params.data(), m_grad.data(), m_m.data(), m_count, grad_scale, m_opt.lr, m_opt.momentum, m_opt.weight_decay, s);
  } else {
    const float c1 = 1.0f - static_cast<float>(std::pow(static_cast<double>(m_opt.beta1), static_cast<double>(m_t)));
    const float c2 = 1.0f - static_cast<float>(std::pow(static_cast<double>(m_opt.beta2), static_cast<double>(m_t)));
    detail::adam_update(m_params.data(), m_grad.data(), m_m.data(), m_v.data(), m_count, grad_scale, m_opt.lr, m_opt.beta1, m_opt.beta2, m_opt.eps,
                        m_opt.weight_decay, c1, c2, s);
  }
  zero_grad();
  // No wait: the next step's chunks, its drain and every copy back to the host follow on the compute stream, so the
  // step's one wait is its drain (finish_chunks()), and a fault in the update is reported there.
}

void CudaDevice::wait_queued() { sync_compute("optimizer update"); }

void CudaDevice::record_ready() { SB_CUDA_CHECK(cudaEventRecord(m_ready.get(), m_compute.get())); }

void CudaDevice::copy_params(std::span<float> out) const {
  SB_CUDA_CHECK(cudaMemcpyAsync(out.data(), m_params.data(), m_count * sizeof(float), cudaMemcpyDeviceToHost, m_compute.get()));
  SB_CUDA_CHECK(cudaStreamSynchronize(m_compute.get()));
}

OptimizerState CudaDevice::optimizer_state() const {
  OptimizerState st{std::vector<float>(m_count), std::vector<float>(m_v.size()), m_t};
  cudaStream_t s = m_compute.get();
  SB_CUDA_CHECK(cudaMemcpyAsync(st.first.data(), m_m.data(), m_count * sizeof(float), cudaMemcpyDeviceToHost, s));
  if (m_v.size()) SB_CUDA_CHECK(cudaMemcpyAsync(st.second.data(), m_v.data(), m_v.bytes(), cudaMemcpyDeviceToHost, s));
  SB_CUDA_CHECK(cudaStreamSynchronize(s));
  return st;
}

void CudaDevice::load_replica(std::span<const float> params, const OptimizerState& state) {
  if (params.size() != m_count || state.first.size() != m_count || state.second.size() != m_v.size()) {
    throw std::logic_error(name() + ": load_replica() with a state of another size");
  }
  cudaStream_t s = m_compute.get();
  SB_CUDA_CHECK(cudaMemcpyAsync(m_params.data(), params.data(), m_count * sizeof(float), cudaMemcpyHostToDevice, s));
  SB_CUDA_CHECK(cudaMemcpyAsync(m_m.data(), state.first.data(), m_count * sizeof(float), cudaMemcpyHostToDevice, s));
  if (m_v.size()) SB_CUDA_CHECK(cudaMemcpyAsync(m_v.data(), state.second.data(), m_v.bytes(), cudaMemcpyHostToDevice, s));
  SB_CUDA_CHECK(cudaStreamSynchronize(s));  // the host buffers are the caller's: done with them before returning
  m_t = state.steps;
}

void CudaDevice::copy_grad(std::span<float> out) const {
  SB_CUDA_CHECK(cudaMemcpyAsync(out.data(), m_grad.data(), m_count * sizeof(float), cudaMemcpyDeviceToHost, m_compute.get()));
  SB_CUDA_CHECK(cudaStreamSynchronize(m_compute.get()));
}

double CudaDevice::take_device_loss() {
  const float loss = *m_loss_host.data();  // finish_chunks() synchronized the copy
  *m_loss_host.data() = 0.0f;
  return loss;
}

void* CudaDevice::workspace(std::size_t bytes) {
  if (m_scratch_bytes >= bytes) return m_scratch;
  if (m_capturing) {
    // The count's eager call sized the workspace; a graph must not hold an allocation of its own.
    throw ConfigError(name() + ": gpu.graphs: a chunk of the same sample count asked for " + std::to_string(bytes) + " bytes of workspace, more than the " +
                      std::to_string(m_scratch_bytes) + " its first call left; under gpu.graphs a chunk function's workspace must depend on its sample count alone");
  }
  m_graphs.clear();  // the workspace moves: every graph holds its old address
  const std::size_t want = bytes + bytes / 4;
  cudaStream_t s = m_compute.get();
  if (m_scratch_async) {
    // In stream order: the old block is freed behind the chunks still using it, and nothing waits.
    void* p = nullptr;
    const cudaError_t e = cudaMallocAsync(&p, want, s);
    if (e == cudaSuccess) {
      void* old = std::exchange(m_scratch, p);
      const bool old_pooled = std::exchange(m_scratch_pooled, true);
      m_scratch_bytes = want;
      if (old) SB_CUDA_CHECK(old_pooled ? cudaFreeAsync(old, s) : cudaFree(old));
      return p;
    }
    (void)cudaGetLastError();  // clear it: the next chunk's launch check must not report it
    if (e != cudaErrorNotSupported) SB_CUDA_CHECK(e);  // out of memory, or an earlier kernel's error: the caller's
    m_scratch_async = false;  // no stream-ordered allocator for this stream: the synchronous way from now on
  }
  SB_CUDA_CHECK(cudaStreamSynchronize(s));  // chunks in flight may still use the old one
  if (m_scratch) SB_CUDA_CHECK(m_scratch_pooled ? cudaFreeAsync(m_scratch, s) : cudaFree(m_scratch));
  m_scratch = nullptr, m_scratch_bytes = 0;
  SB_CUDA_CHECK(cudaMalloc(&m_scratch, want));
  m_scratch_bytes = want, m_scratch_pooled = false;
  return m_scratch;
}

std::optional<double> CudaDevice::step_device_seconds() const {
  double sum = 0;
  for (const DeviceCallTime& t : m_times) sum += t.seconds;
  return sum;
}

}  // namespace stealbatch::cuda
