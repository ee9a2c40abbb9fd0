// The libtorch adapter's layout, binding and data helpers.
#include <stealbatch/error.hpp>
#include <stealbatch/runtime/cpu_device.hpp>
#include <stealbatch/torch.hpp>

#if defined(STEALBATCH_TORCH_CUDA)
#include <c10/core/AutogradState.h>
#include <torch/version.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

#include <algorithm>
#include <string>

namespace stealbatch::libtorch {

bool set_blas_threads(int threads) noexcept { return set_blas_pool_threads(threads) == BlasPool::kSet; }

namespace {

std::size_t elements(const ::torch::Tensor& t) { return static_cast<std::size_t>(t.numel()); }

::torch::TensorOptions floats_on(const ::torch::Device& device) { return ::torch::TensorOptions().dtype(::torch::kFloat).device(device); }

// The device of the chunk this thread runs (see chunk_device()); set for the duration of a GPU chunk.
thread_local ::torch::Device t_chunk_device(::torch::kCPU);

}  // namespace

::torch::Device chunk_device() noexcept { return t_chunk_device; }

ParameterLayout layout_of(const ::torch::nn::Module& module) {
  ParameterLayout layout;
  for (const auto& p : module.named_parameters(/*recurse=*/true)) {
    if (p.value().scalar_type() != ::torch::kFloat) throw ConfigError("libtorch: parameter '" + p.key() + "' is not float32");
    std::vector<std::size_t> shape;
    for (const std::int64_t d : p.value().sizes()) shape.push_back(static_cast<std::size_t>(d));
    if (shape.empty()) shape.push_back(1);  // a scalar parameter
    layout.add(p.key(), std::move(shape));
  }
  if (layout.size() == 0) throw ConfigError("libtorch: the module has no parameters");
  return layout;
}

std::vector<float> values_of(const ::torch::nn::Module& module) {
  std::vector<float> out;
  for (const auto& p : module.named_parameters(true)) {
    const ::torch::Tensor t = p.value().detach().contiguous().to(::torch::kCPU);
    out.insert(out.end(), t.data_ptr<float>(), t.data_ptr<float>() + t.numel());
  }
  return out;
}

void bind_module(::torch::nn::Module& module, const ParameterLayout& layout, std::span<const float> params, std::span<float> grad,
                 ::torch::Device device) {
  const auto named = module.named_parameters(true);
  if (named.size() != layout.tensors().size()) {
    throw ConfigError("libtorch: the module has " + std::to_string(named.size()) + " parameters; the layout has " +
                      std::to_string(layout.tensors().size()));
  }
  std::size_t i = 0;
  for (const auto& p : named) {
    const auto& slot = layout.tensors()[i++];
    ::torch::Tensor param = p.value();
    if (slot.name != p.key() || slot.size != elements(param)) {
      throw ConfigError("libtorch: parameter '" + p.key() + "' (" + std::to_string(elements(param)) + " floats) does not match the layout's '" +
                        slot.name + "' (" + std::to_string(slot.size) + ")");
    }
    // The runtime's buffers, viewed in place: the module reads the parameters, and autograd accumulates into the
    // gradient (in place: backward runs with grad mode off, where AccumulateGrad adds into a defined gradient).
    auto* w = const_cast<float*>(params.data() + slot.offset);  // read only: the optimizer, not torch, writes parameters
    param.set_data(::torch::from_blob(w, param.sizes(), floats_on(device)));
    param.mutable_grad() = ::torch::from_blob(grad.data() + slot.offset, param.sizes(), floats_on(device));
  }
}

void settle(::torch::nn::Module& module, const ParameterLayout& layout, std::span<float> grad, ::torch::Device device) {
  std::size_t i = 0;
  for (const auto& p : module.named_parameters(true)) {
    const auto& slot = layout.tensors()[i++];
    ::torch::Tensor param = p.value();
    float* mine = grad.data() + slot.offset;
    const ::torch::Tensor& g = param.grad();
    if (g.defined() && g.data_ptr<float>() == mine) continue;
    ::torch::Tensor view = ::torch::from_blob(mine, param.sizes(), floats_on(device));
    if (g.defined()) view.copy_(g);  // the replaced gradient already holds what the view held plus this chunk's
    param.mutable_grad() = view;
  }
}

::torch::Tensor rows(const ::torch::Tensor& data, std::span<const std::uint32_t> samples) {
  // For data on a GPU the ids are staged in pinned memory and copied without blocking, on the current stream (the
  // chunk's, under run_gpu_chunk's guard): a copy from pageable memory would block the host and synchronise the stream
  // at every chunk, which defeats the device's chunks in flight. torch's pinned allocator records the copy on the
  // stream and does not hand the block out again until the copy is done.
  const bool on_gpu = !data.is_cpu();
  ::torch::Tensor ids =
      ::torch::empty({static_cast<std::int64_t>(samples.size())}, ::torch::TensorOptions().dtype(::torch::kLong).pinned_memory(on_gpu));
  auto* p = ids.data_ptr<std::int64_t>();
  for (std::size_t i = 0; i < samples.size(); ++i) p[i] = samples[i];
  return data.index_select(0, on_gpu ? ids.to(data.device(), ::torch::kLong, /*non_blocking=*/true) : ids);
}

::torch::Tensor DeviceData::on(const ::torch::Device& device) const {
  if (device == m_host.device()) return m_host;
  const std::lock_guard lock(m_mutex);
  for (const auto& [where, copy] : m_copies) {
    if (where == device) return copy;
  }
  m_copies.emplace_back(device, m_host.to(device));  // inside a GPU chunk: on the device's stream, before the chunk reads it
  return m_copies.back().second;
}

std::int64_t Sequences::token_count() const noexcept {
  std::int64_t n = 0;
  for (std::int64_t l : lengths) n += l;
  return n;
}

::torch::Tensor to_device_async(const ::torch::Tensor& x, const ::torch::Device& device) {
  if (!x.defined() || x.device() == device) return x;
  // Host to GPU: staged in pinned memory and copied without blocking, on the current stream (a chunk's: the device's
  // compute stream). The caching host allocator keeps the pinned block until that copy is done.
  // Always a block of its own: pin_memory() of a tensor already pinned is that tensor, which its owner may refill
  // before the copy has run.
  if (x.is_cpu() && device.is_cuda()) {
    return ::torch::empty(x.sizes(), x.options().pinned_memory(true)).copy_(x).to(device, /*non_blocking=*/true);
  }
  return x.to(device);
}

Sequences Sequences::to(const ::torch::Device& device) const {
  Sequences out = *this;
  out.tokens = to_device_async(tokens, device), out.positions = to_device_async(positions, device);
  out.targets = to_device_async(targets, device), out.allowed = to_device_async(allowed, device);
  return out;
}

Sequences make_sequences(std::span<const std::uint32_t> samples, const std::function<std::span<const std::uint8_t>(std::uint32_t)>& tokens_of,
                         SequenceForm form, SequenceMask mask) {
  Sequences q;
  q.form = form;
  std::vector<std::span<const std::uint8_t>> seq;
  std::int64_t longest = 0, total = 0;
  for (std::uint32_t s : samples) {
    seq.push_back(tokens_of(s));
    const auto len = static_cast<std::int64_t>(seq.back().size());
    if (len == 0) throw ConfigError("libtorch: sample " + std::to_string(s) + " has no tokens; a sequence needs at least one");
    q.lengths.push_back(len);
    longest = std::max(longest, len), total += len;
  }
  const auto n = static_cast<std::int64_t>(seq.size());
  const bool packed = form == SequenceForm::kPacked;
  const std::int64_t rows = packed ? 1 : n, cols = packed ? total : longest;
  const auto longs = ::torch::TensorOptions().dtype(::torch::kLong);
  q.tokens = ::torch::zeros({rows, cols}, longs);
  q.positions = ::torch::zeros({rows, cols}, longs);
  q.targets = ::torch::full({rows, cols}, Sequences::kNoTarget, longs);
  auto tok = q.tokens.accessor<std::int64_t, 2>(), pos = q.positions.accessor<std::int64_t, 2>(), tgt = q.targets.accessor<std::int64_t, 2>();
  const bool dense = mask == SequenceMask::kDense;
  if (dense) q.allowed = ::torch::zeros({rows, cols, cols}, ::torch::TensorOptions().dtype(::torch::kBool));
  bool* ok = dense ? q.allowed.data_ptr<bool>() : nullptr;  // [rows][cols][cols], contiguous
  const auto at_ok = [&](std::int64_t r, std::int64_t i, std::int64_t j) -> bool& { return ok[(r * cols + i) * cols + j]; };
  std::int64_t at = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t row = packed ? 0 : i, base = packed ? at : 0, len = q.lengths[static_cast<std::size_t>(i)];
    const auto& x = seq[static_cast<std::size_t>(i)];
    for (std::int64_t t = 0; t < len; ++t) {
      tok[row][base + t] = x[static_cast<std::size_t>(t)];
      pos[row][base + t] = t;
      if (t + 1 < len) tgt[row][base + t] = x[static_cast<std::size_t>(t + 1)];
      if (dense) std::fill_n(&at_ok(row, base + t, base), t + 1, true);  // causal, within the sequence
    }
    // A padding query attends to itself alone, so that its softmax is defined; no real query sees it, and it has no target.
    for (std::int64_t t = len; dense && !packed && t < cols; ++t) at_ok(row, t, t) = true;
    at += len;
  }
  return q;
}

namespace detail {

#if defined(STEALBATCH_TORCH_CUDA)
void run_gpu_chunk(::torch::nn::Module& module, const ParameterLayout& layout, ChunkContext& ctx, const std::function<::torch::Tensor()>& pass) {
  // The chunk's GPU is the one that holds the device's gradient buffer.
  cudaPointerAttributes where{};
  if (cudaPointerGetAttributes(&where, ctx.grad.data()) != cudaSuccess || where.type != cudaMemoryTypeDevice) {
    (void)cudaGetLastError();
    throw ConfigError("libtorch: device " + std::to_string(ctx.device) + " gave a GPU chunk whose gradient buffer is not GPU memory");
  }
  const ::torch::Device device(::torch::kCUDA, static_cast<c10::DeviceIndex>(where.device));
  // A module's pass runs host code and allocates through libtorch's caching allocator at every call: a graph's replay
  // would run none of the first and reuse the second's blocks. gpu.graphs is refused, not captured.
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(static_cast<cudaStream_t>(ctx.stream), &capturing) == cudaSuccess && capturing != cudaStreamCaptureStatusNone) {
    throw ConfigError("libtorch: device " + std::to_string(ctx.device) + ": a module's chunks cannot be replayed from CUDA graphs; leave gpu.graphs off");
  }
  // The module's kernels run on the device's stream, in order with the runtime's copies, events and reduction.
  const c10::cuda::CUDAStreamGuard on_stream(c10::cuda::getStreamFromExternal(static_cast<cudaStream_t>(ctx.stream), device.index()));
  struct Scope {
    explicit Scope(const ::torch::Device& d) { t_chunk_device = d; }
    ~Scope() { t_chunk_device = ::torch::Device(::torch::kCPU); }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;
  } scope(device);
  libtorch::bind_module(module, layout, ctx.params, ctx.grad, device);
  // libtorch runs a CUDA backward pass on one engine thread per device index, and every part of a GPU (vgpu:) is the
  // same index: the parts' backward passes would queue behind each other there. With the engine's multithreading off
  // (thread-local, libtorch 2.0 and later) this worker runs its own backward pass, on its own stream.
#if TORCH_VERSION_MAJOR >= 2
  struct BackwardHere {
    bool was = c10::AutogradState::get_tls_state().get_multithreading_enabled();
    BackwardHere() { c10::AutogradState::get_tls_state().set_multithreading_enabled(false); }
    ~BackwardHere() { c10::AutogradState::get_tls_state().set_multithreading_enabled(was); }
    BackwardHere(const BackwardHere&) = delete;
    BackwardHere& operator=(const BackwardHere&) = delete;
  } here;
#endif
  const ::torch::Tensor loss = pass();
  libtorch::settle(module, layout, ctx.grad, device);
  // Added in stream order; the runtime reads the device's loss after the step's chunks.
  ::torch::from_blob(ctx.device_loss, {1}, floats_on(device)).add_(loss.detach().to(::torch::kFloat).reshape({1}));
}
#else
void run_gpu_chunk(::torch::nn::Module&, const ParameterLayout&, ChunkContext& ctx, const std::function<::torch::Tensor()>&) {
  throw ConfigError("libtorch: device " + std::to_string(ctx.device) +
                    " is a GPU, and this adapter was built against a libtorch without CUDA (Debian's libtorch-dev is CPU only): "
                    "build it against a CUDA libtorch, such as PyTorch's (cmake -DCMAKE_PREFIX_PATH=$(python3 -c 'import torch; "
                    "print(torch.utils.cmake_prefix_path)'))");
}
#endif

}  // namespace detail

}  // namespace stealbatch::libtorch
