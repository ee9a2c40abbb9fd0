// The libtorch adapter's layout, binding and data helpers.
#include <stealbatch/error.hpp>
#include <stealbatch/torch.hpp>

#include <dlfcn.h>

#include <algorithm>

#include <string>

namespace stealbatch::libtorch {

bool set_blas_threads(int threads) noexcept {
  using SetThreads = void (*)(int);
  // Looked up, not linked: libtorch may be built on another BLAS, or on one without a pool of its own.
  static const auto set = reinterpret_cast<SetThreads>(::dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  if (set == nullptr) return false;
  set(std::max(1, threads));
  return true;
}

namespace {

std::size_t elements(const ::torch::Tensor& t) { return static_cast<std::size_t>(t.numel()); }

}  // namespace

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

void bind_module(::torch::nn::Module& module, const ParameterLayout& layout, std::span<const float> params, std::span<float> grad) {
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
    param.set_data(::torch::from_blob(w, param.sizes(), ::torch::kFloat));
    param.mutable_grad() = ::torch::from_blob(grad.data() + slot.offset, param.sizes(), ::torch::kFloat);
  }
}

void settle(::torch::nn::Module& module, const ParameterLayout& layout, std::span<float> grad) {
  std::size_t i = 0;
  for (const auto& p : module.named_parameters(true)) {
    const auto& slot = layout.tensors()[i++];
    ::torch::Tensor param = p.value();
    float* mine = grad.data() + slot.offset;
    const ::torch::Tensor& g = param.grad();
    if (g.defined() && g.data_ptr<float>() == mine) continue;
    ::torch::Tensor view = ::torch::from_blob(mine, param.sizes(), ::torch::kFloat);
    if (g.defined()) view.copy_(g);  // the replaced gradient already holds what the view held plus this chunk's
    param.mutable_grad() = view;
  }
}

::torch::Tensor rows(const ::torch::Tensor& data, std::span<const std::uint32_t> samples) {
  ::torch::Tensor ids = ::torch::empty({static_cast<std::int64_t>(samples.size())}, ::torch::kLong);
  auto* p = ids.data_ptr<std::int64_t>();
  for (std::size_t i = 0; i < samples.size(); ++i) p[i] = samples[i];
  return data.index_select(0, ids);
}

}  // namespace stealbatch::libtorch
