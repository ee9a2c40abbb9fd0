// CudaDevice: gather into pinned staging, copy on the copy stream, compute after an event, up to K in flight.
#include "kernels.hpp"

#include <stealbatch/cuda/cuda_device.hpp>
#include <stealbatch/cuda/green.hpp>

#include <cublas_v2.h>
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <cmath>
#include <string>

namespace stealbatch::cuda {

// One staging slot: pinned host bytes, their device copy, and the events that order and track the chunk using them.
struct CudaDevice::Slot {
  PinnedBuffer<std::byte> staging;
  DeviceBuffer<std::byte> input;
  Event copied;  // the H2D copy is done: compute may read `input`
  Event done;    // the chunk's kernels are done: the slot may be reused
  bool busy = false;
  ChunkId chunk = 0;
};

namespace {

void check_blas(cublasStatus_t st, const char* what) {
  if (st != CUBLAS_STATUS_SUCCESS) throw CudaError(std::string(what) + " failed: cuBLAS status " + std::to_string(static_cast<int>(st)));
}

}  // namespace

CudaDevice::CudaDevice(std::size_t index, int gpu, Options options, std::shared_ptr<Partition> part)
    : m_index(index), m_gpu(gpu), m_o(std::move(options)), m_part(std::move(part)) {
  if (m_o.in_flight < 1 || m_o.in_flight > 16) throw ConfigError("in_flight = " + std::to_string(m_o.in_flight) + "; valid range is [1, 16]");
}

CudaDevice::~CudaDevice() {
  // The worker has finished with the device; nothing may still run on its streams when the buffers go.
  if (m_compute) SB_CUDA_WARN(cudaStreamSynchronize(m_compute.get()));
  if (m_copy) SB_CUDA_WARN(cudaStreamSynchronize(m_copy.get()));
  if (m_blas) cublasDestroy(static_cast<cublasHandle_t>(m_blas));
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
    m_part->make_current();
    m_compute = Stream(m_part->create_stream());
    m_copy = Stream(m_part->create_stream());
    m_sms = m_part->sm_count();
  } else {
    m_compute = make_stream();
    m_copy = make_stream();
    SB_CUDA_CHECK(cudaDeviceGetAttribute(&m_sms, cudaDevAttrMultiProcessorCount, m_gpu));
  }
  cublasHandle_t h = nullptr;
  check_blas(cublasCreate(&h), "cublasCreate");
  m_blas = h;
  check_blas(cublasSetStream(h, m_compute.get()), "cublasSetStream");
  // Plain fp32 GEMMs (no TF32), as a float reference computes them.
  check_blas(cublasSetMathMode(h, CUBLAS_PEDANTIC_MATH), "cublasSetMathMode");
  for (std::size_t i = 0; i < m_o.in_flight; ++i) {
    auto s = std::make_unique<Slot>();
    s->copied = make_event();
    s->done = make_event(cudaEventDisableTiming | cudaEventBlockingSync);  // a worker waiting on it sleeps
    m_slots.push_back(std::move(s));
  }
  m_loss = DeviceBuffer<float>(1);
  m_loss_host = PinnedBuffer<float>(1);
  *m_loss_host.data() = 0.0f;
  SB_CUDA_CHECK(cudaMemsetAsync(m_loss.data(), 0, sizeof(float), m_compute.get()));
}

void CudaDevice::init_replica(std::span<const float> initial, const OptimizerOptions& options) {
  m_count = initial.size();
  m_opt = options;
  m_t = 0;
  m_params = DeviceBuffer<float>(m_count);
  m_grad = DeviceBuffer<float>(m_count + 1);
  m_m = DeviceBuffer<float>(m_count);
  m_v = options.kind == OptimizerKind::kAdam ? DeviceBuffer<float>(m_count) : DeviceBuffer<float>();
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
}

void CudaDevice::wait_slot(Slot& s) {
  if (!s.busy) return;
  const cudaError_t e = cudaEventSynchronize(s.done.get());
  s.busy = false;
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    fail("chunk " + std::to_string(s.chunk), std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e));
  }
}

void CudaDevice::run_chunk(ChunkContext& ctx, const ChunkFunction& fn) {
  Slot& s = *m_slots[m_next_slot];
  wait_slot(s);  // normally already free: the previous call waited until fewer than in_flight were running
  cudaStream_t compute = m_compute.get();
  if (m_o.input_bytes > 0) {
    const std::size_t bytes = ctx.samples.size() * m_o.input_bytes;
    if (s.staging.size() < bytes) {
      s.staging = PinnedBuffer<std::byte>(bytes);
      s.input = DeviceBuffer<std::byte>(bytes);
    }
    std::byte* dst = s.staging.data();
    const auto samples = ctx.samples;
    const std::size_t row = m_o.input_bytes;
    tbb::parallel_for(tbb::blocked_range<std::size_t>(0, samples.size(), 16), [&](const tbb::blocked_range<std::size_t>& r) {
      for (std::size_t i = r.begin(); i != r.end(); ++i) m_o.gather(samples[i], dst + i * row);
    });
    SB_CUDA_CHECK(cudaMemcpyAsync(s.input.data(), dst, bytes, cudaMemcpyHostToDevice, m_copy.get()));
    SB_CUDA_CHECK(cudaEventRecord(s.copied.get(), m_copy.get()));
    SB_CUDA_CHECK(cudaStreamWaitEvent(compute, s.copied.get(), 0));
    ctx.input = s.input.data();
  }
  ctx.stream = compute;
  ctx.blas = m_blas;
  ctx.device_loss = m_loss.data();
  fn(ctx);
  const cudaError_t launch = cudaGetLastError();
  if (launch != cudaSuccess) fail("chunk " + std::to_string(ctx.chunk), std::string("launch failed: ") + cudaGetErrorName(launch) + ": " + cudaGetErrorString(launch));
  SB_CUDA_CHECK(cudaEventRecord(s.done.get(), compute));
  s.busy = true;
  s.chunk = ctx.chunk;
  m_last_chunk = ctx.chunk;
  m_next_slot = (m_next_slot + 1) % m_slots.size();
  // Leave a slot free before taking the next chunk: with every slot busy, wait for the oldest chunk.
  wait_slot(*m_slots[m_next_slot]);
}

void CudaDevice::finish_chunks() {
  for (auto& s : m_slots) wait_slot(*s);
  // The loss rides on the same synchronization: copied back and reset behind the last chunk.
  SB_CUDA_CHECK(cudaMemcpyAsync(m_loss_host.data(), m_loss.data(), sizeof(float), cudaMemcpyDeviceToHost, m_compute.get()));
  SB_CUDA_CHECK(cudaMemsetAsync(m_loss.data(), 0, sizeof(float), m_compute.get()));
  const cudaError_t e = cudaStreamSynchronize(m_compute.get());
  if (e != cudaSuccess) fail("after chunk " + std::to_string(m_last_chunk), std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e));
}

void CudaDevice::set_sample_count(std::uint64_t samples) {
  detail::set_value(m_grad.data() + m_count, static_cast<float>(samples), m_compute.get());
}

void CudaDevice::apply_update(float /*grad_scale: the device divides by the reduced count in grad[n]*/) {
  ++m_t;
  cudaStream_t s = m_compute.get();
  if (m_opt.kind == OptimizerKind::kSgd) {
    detail::sgd_update(m_params.data(), m_grad.data(), m_m.data(), m_count, m_opt.lr, m_opt.momentum, m_opt.weight_decay, s);
  } else {
    const float c1 = 1.0f - static_cast<float>(std::pow(static_cast<double>(m_opt.beta1), static_cast<double>(m_t)));
    const float c2 = 1.0f - static_cast<float>(std::pow(static_cast<double>(m_opt.beta2), static_cast<double>(m_t)));
    detail::adam_update(m_params.data(), m_grad.data(), m_m.data(), m_v.data(), m_count, m_opt.lr, m_opt.beta1, m_opt.beta2, m_opt.eps,
                        m_opt.weight_decay, c1, c2, s);
  }
  zero_grad();
  const cudaError_t e = cudaStreamSynchronize(s);
  if (e != cudaSuccess) fail("optimizer update", std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e));
}

void CudaDevice::copy_params(std::span<float> out) const {
  SB_CUDA_CHECK(cudaMemcpyAsync(out.data(), m_params.data(), m_count * sizeof(float), cudaMemcpyDeviceToHost, m_compute.get()));
  SB_CUDA_CHECK(cudaStreamSynchronize(m_compute.get()));
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
  if (m_scratch.size() < bytes) {
    SB_CUDA_CHECK(cudaStreamSynchronize(m_compute.get()));  // chunks in flight may still use the old one
    m_scratch = DeviceBuffer<std::byte>(bytes + bytes / 4);
  }
  return m_scratch.data();
}

}  // namespace stealbatch::cuda
