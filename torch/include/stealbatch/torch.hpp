// The libtorch adapter: a torch::nn::Module trains on stealbatch. Its parameters are laid out one named tensor each,
// in parameters() order; during a chunk the module's parameters are views of the device's ctx.params and their
// gradients views of ctx.grad (torch::from_blob), so forward and backward copy neither, and backward's gradient
// accumulation lands in the runtime's buffer (the idea of DDP's gradient_as_bucket_view). Losses are sums: the
// runtime divides by the batch. CPU and simulated devices run the chunk on the calling thread, in host memory;
// GPU devices (a CUDA libtorch: STEALBATCH_TORCH_CUDA) run it on the device's stream, on views of device memory.
//
//   struct NetImpl : torch::nn::Module { ... torch::Tensor forward(torch::Tensor x); };
//   TORCH_MODULE(Net);
//   stealbatch::libtorch::DeviceData x(images), y(labels);   // on the host; copied to a GPU where chunks run there
//   stealbatch::libtorch::ModuleChunks<NetImpl> chunks([] { return Net()->ptr(); }, rt.device_count(),
//       [&](std::span<const std::uint32_t> s) { return x.rows(s); },
//       [&](const torch::Tensor& out, std::span<const std::uint32_t> s) {
//         return torch::nn::functional::cross_entropy(out, y.rows(s),
//                                                     torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
//       });
//   rt.register_parameters(chunks.layout(), chunks.initial());
//   rt.step(batch, chunks.function());
#pragma once

#include <stealbatch/runtime/runtime.hpp>

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <utility>
#include <vector>

namespace stealbatch::libtorch {

// The layout of a module's parameters: one tensor each, named and ordered as named_parameters() gives them (for a
// module with Linear layers fc1, fc2: fc1.weight, fc1.bias, fc2.weight, fc2.bias, each row-major).
ParameterLayout layout_of(const ::torch::nn::Module& module);
// The module's current parameter values, flat in that layout (the runtime's initial values).
std::vector<float> values_of(const ::torch::nn::Module& module);
// Makes the module's parameters views of `params` and their gradients views of `grad` (both in layout_of()'s layout,
// in `device`'s memory; named bind_module so that argument-dependent lookup never picks std::bind instead).
// Throws ConfigError when the module's parameters do not match the layout (name, count or size).
void bind_module(::torch::nn::Module& module, const ParameterLayout& layout, std::span<const float> params, std::span<float> grad,
                 ::torch::Device device = ::torch::kCPU);
// After backward: a gradient that autograd replaced instead of accumulating in place (it may, for instance for a
// gradient it had to reshape) is added into `grad` and the view restored, so nothing is lost either way.
void settle(::torch::nn::Module& module, const ParameterLayout& layout, std::span<float> grad, ::torch::Device device = ::torch::kCPU);
// Sets the thread count of the BLAS library libtorch runs its matrix products on when that library keeps a global
// thread pool of its own (OpenBLAS, which Debian's libtorch uses: openblas_set_num_threads, found at run time);
// returns whether there was one. Its pool is one for the process: several devices calling into it at once queue
// on its lock while its threads spin (a CNN on cpu:2 ran 3.7x slower), so with more than one device each product
// must run on its caller's thread alone. ModuleChunks calls it, and a runtime with two or more CPU devices sets it to
// 1 as it makes them (set_blas_pool_threads(), which this calls), so a raw chunk function needs nothing more.
bool set_blas_threads(int threads) noexcept;
// The rows of `data` (first dimension) at the chunk's sample ids, on data's device: a chunk's input or targets from a
// tensor dataset.
::torch::Tensor rows(const ::torch::Tensor& data, std::span<const std::uint32_t> samples);
// The device of the chunk that this thread is running: the GPU inside a ModuleChunks chunk on a GPU device, else the
// CPU. Input and loss functions read their data there (DeviceData does).
::torch::Device chunk_device() noexcept;

// A dataset tensor (inputs or targets; the first dimension is the sample) on the host, and a copy on each GPU that
// runs chunks, made at its first chunk there and kept: rows() gives a chunk's rows on the chunk's device. Safe to
// share among devices.
class DeviceData {
 public:
  explicit DeviceData(::torch::Tensor host) : m_host(std::move(host)) {}
  ::torch::Tensor rows(std::span<const std::uint32_t> samples) const { return libtorch::rows(on(chunk_device()), samples); }
  const ::torch::Tensor& host() const noexcept { return m_host; }
  // The data on `device` (the host tensor for the CPU).
  ::torch::Tensor on(const ::torch::Device& device) const;

 private:
  ::torch::Tensor m_host;
  mutable std::mutex m_mutex;
  mutable std::vector<std::pair<::torch::Device, ::torch::Tensor>> m_copies;
};

// A chunk's variable-length token sequences (a language model's documents), in one of two forms:
// - kPadded: sequence i in row i of a [n, L] tensor (L the longest), zeros after its length; attention is causal and
//   never reaches padding;
// - kPacked: the sequences end to end in one row, [1, T]; attention is causal within each sequence
//   (block-diagonal), so no position is padding. The mask is dense, T x T for T tokens in the chunk, and so is a
//   plain attention over it: packing saves work only with a kernel that skips the blocks (a varlen attention).
// The model reads tokens, positions (each token's position within its own sequence) and allowed (the mask), or
// lengths alone: a model that attends within each sequence itself (a causal mask alone is exact on right padding; a
// loop over the packed sequences is a varlen attention) asks make_sequences() for no mask. The loss reads targets:
// each token's next token in its sequence, or kNoTarget (a sequence's last token, padding).
enum class SequenceForm { kPadded, kPacked };
enum class SequenceMask { kDense, kNone };
struct Sequences {
  static constexpr std::int64_t kNoTarget = -100;  // cross_entropy's default ignore_index
  SequenceForm form = SequenceForm::kPadded;
  ::torch::Tensor tokens;     // int64: [n, L] padded, [1, T] packed
  ::torch::Tensor positions;  // int64, tokens' shape: each token's position within its sequence
  ::torch::Tensor targets;    // int64, tokens' shape: the next token in the same sequence, or kNoTarget
  ::torch::Tensor allowed;    // bool: [n, L, L] padded, [1, T, T] packed; true where query i may attend to key j
                              // (undefined with SequenceMask::kNone)
  std::vector<std::int64_t> lengths;
  std::int64_t token_count() const noexcept;  // the real tokens, without padding
  Sequences to(const ::torch::Device& device) const;  // each tensor by to_device_async()
};
// A chunk's sequences from each sample's tokens (bytes: a byte-level model), in the given form, on the host.
// Throws ConfigError for an empty sequence. SequenceMask::kNone leaves `allowed` undefined (no T x T allocation).
Sequences make_sequences(std::span<const std::uint32_t> samples, const std::function<std::span<const std::uint8_t>(std::uint32_t)>& tokens_of,
                         SequenceForm form, SequenceMask mask = SequenceMask::kDense);
// A tensor moved to `device`; from the host to a GPU through pinned memory and without blocking, on the current stream.
::torch::Tensor to_device_async(const ::torch::Tensor& x, const ::torch::Device& device);
// A ModuleChunks input moved to a chunk's device: a tensor, or Sequences.
inline ::torch::Tensor to_device(const ::torch::Tensor& x, const ::torch::Device& d) { return to_device_async(x, d); }
inline Sequences to_device(const Sequences& x, const ::torch::Device& d) { return x.tokens.device() == d ? x : x.to(d); }

namespace detail {
// A chunk on a GPU device (ctx.stream set): `pass` (forward, loss and backward; it returns the summed loss) runs with
// the chunk's GPU and the device's stream current, on the module bound to the device's buffers, and the loss is
// added to ctx.device_loss in stream order (nothing waits for the GPU). Throws ConfigError where libtorch has no
// CUDA.
void run_gpu_chunk(::torch::nn::Module& module, const ParameterLayout& layout, ChunkContext& ctx, const std::function<::torch::Tensor()>& pass);
}  // namespace detail

// A chunk function from a module: one replica per device (make() builds one; every replica has the same layout),
// the chunk's input from its sample ids, and the summed loss of its output. Each device's thread runs torch with
// `threads` intra-op threads (torch's thread count is per calling thread: set on each device's worker, not once for
// the process, or every device would start a pool of all the cores). `In` is what the input function returns and
// the module's forward() takes: a tensor, or a chunk's variable-length Sequences (make_sequences()).
template <class Module, class In = ::torch::Tensor>
class ModuleChunks {
 public:
  using Make = std::function<std::shared_ptr<Module>()>;
  using Input = std::function<In(std::span<const std::uint32_t> samples)>;
  using Loss = std::function<::torch::Tensor(const ::torch::Tensor& output, std::span<const std::uint32_t> samples)>;

  ModuleChunks(const Make& make, std::size_t devices, Input input, Loss loss, int threads = 1)
      : m_input(std::move(input)), m_loss(std::move(loss)), m_threads(std::max(1, threads)) {
    for (std::size_t d = 0; d < std::max<std::size_t>(1, devices); ++d) m_replicas.push_back(make());
    // One device may use the BLAS library's own threads; several must not share them (see set_blas_threads).
    set_blas_threads(devices > 1 ? 1 : m_threads);
    m_layout = layout_of(*m_replicas[0]);
    m_initial = values_of(*m_replicas[0]);
  }

  const ParameterLayout& layout() const noexcept { return m_layout; }
  // The first replica's values as made: register these with the runtime.
  const std::vector<float>& initial() const noexcept { return m_initial; }
  Module& replica(std::size_t device) { return *m_replicas.at(device); }

  // The chunk function for Runtime::step(): on device d's replica, bound to the device's buffers, forward and backward
  // over the chunk's samples.
  ChunkFunction function() {
    return [this](ChunkContext& ctx) {
      if (ctx.device >= m_replicas.size()) throw ConfigError("libtorch: chunk on device " + std::to_string(ctx.device) + " but only " +
                                                             std::to_string(m_replicas.size()) + " module replicas were made");
      Module& m = *m_replicas[ctx.device];
      if (ctx.stream != nullptr) {
        detail::run_gpu_chunk(m, m_layout, ctx, [&] {
          const In x = to_device(m_input(ctx.samples), chunk_device());  // an input function may read host data
          ::torch::Tensor loss = m_loss(m.forward(x), ctx.samples);
          loss.backward();
          return loss;
        });
        return;
      }
      thread_local int threads = 0;
      if (threads != m_threads) ::torch::set_num_threads(threads = m_threads);
      libtorch::bind_module(m, m_layout, ctx.params, ctx.grad);
      const ::torch::Tensor out = m.forward(m_input(ctx.samples));
      const ::torch::Tensor loss = m_loss(out, ctx.samples);
      loss.backward();
      libtorch::settle(m, m_layout, ctx.grad);
      ctx.add_loss(loss.item<double>());
    };
  }

  // Runs `body` with device 0's replica bound to `params` (host memory; read-only use: evaluation) and no gradient
  // recorded.
  template <class Body>
  auto with_parameters(std::span<const float> params, Body&& body) {
    std::vector<float> scratch(m_layout.size());
    libtorch::bind_module(*m_replicas[0], m_layout, params, scratch);
    const ::torch::NoGradGuard no_grad;
    return body(*m_replicas[0]);
  }

 private:
  std::vector<std::shared_ptr<Module>> m_replicas;
  ParameterLayout m_layout;
  std::vector<float> m_initial;
  Input m_input;
  Loss m_loss;
  int m_threads = 1;
};

}  // namespace stealbatch::libtorch
