// The libtorch adapter: torch::nn::Module versions of the MLP and the CNN give the same full-batch gradient as the
// hand-written ones on the same weights and batch, on 1 to 4 CPU devices with stealing; their layouts (names, shapes,
// order) are the hand-written ones'; a module that does not match a layout is refused.
#include <stealbatch/models/cnn_model.hpp>
#include <stealbatch/models/layers.hpp>
#include <stealbatch/models/mlp_model.hpp>
#include <stealbatch/models/torch_modules.hpp>
#include <stealbatch/torch.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

using namespace stealbatch;
using examples::CnnModel;
using examples::DenseData;
using examples::MlpModel;
using examples::TorchCnnImpl;
using examples::TorchMlpImpl;

namespace {

struct Data {
  std::size_t count = 512, features = 32;  // the MLP's; the CNN's data is Images below
  std::vector<float> x;
  std::vector<std::uint8_t> y;
  ::torch::Tensor tx, ty;
  Data() : x(count * features), y(count) {
    std::mt19937_64 rng(3);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (float& v : x) v = u(rng);
    for (auto& v : y) v = static_cast<std::uint8_t>(rng() % 10);
    tx = ::torch::from_blob(x.data(), {static_cast<std::int64_t>(count), static_cast<std::int64_t>(features)}, ::torch::kFloat);
    ty = ::torch::empty({static_cast<std::int64_t>(count)}, ::torch::kLong);
    for (std::size_t i = 0; i < count; ++i) ty[static_cast<std::int64_t>(i)] = static_cast<std::int64_t>(y[i]);
  }
  DenseData dense() const { return {count, features, x, y}; }
};

libtorch::ModuleChunks<TorchMlpImpl> torch_mlp(const Data& data, std::size_t devices) {
  return libtorch::ModuleChunks<TorchMlpImpl>(
      [] { return std::make_shared<TorchMlpImpl>(std::vector<std::int64_t>{32, 24, 16, 10}); }, devices, [&data](std::span<const std::uint32_t> s) { return libtorch::rows(data.tx, s); },
      [&data](const ::torch::Tensor& out, std::span<const std::uint32_t> s) {
        return ::torch::nn::functional::cross_entropy(out, libtorch::rows(data.ty, s),
                                                      ::torch::nn::functional::CrossEntropyFuncOptions().reduction(::torch::kSum));
      });
}

}  // namespace

TEST_CASE("Torch.LayoutIsTheHandWrittenModelsLayout") {
  const Data data;
  auto chunks = torch_mlp(data, 1);
  const MlpModel model({32, 24, 16, 10});
  REQUIRE(chunks.layout().tensors().size() == model.layout().tensors().size());
  for (std::size_t i = 0; i < model.layout().tensors().size(); ++i) {
    CHECK(chunks.layout().tensors()[i].name == model.layout().tensors()[i].name);
    CHECK(chunks.layout().tensors()[i].size == model.layout().tensors()[i].size);
    CHECK(chunks.layout().tensors()[i].offset == model.layout().tensors()[i].offset);
    CHECK(chunks.layout().tensors()[i].shape == model.layout().tensors()[i].shape);
  }
}

namespace {

// 28x28 images with values in [0, 1] (as the dataset's), and labels.
struct Images {
  std::size_t count = 96;
  std::vector<float> x;
  std::vector<std::uint8_t> y;
  ::torch::Tensor tx, ty;
  Images() : x(count * 784), y(count) {
    std::mt19937_64 rng(5);
    std::uniform_real_distribution<float> u(0.0f, 1.0f);
    for (float& v : x) v = u(rng);
    for (auto& v : y) v = static_cast<std::uint8_t>(rng() % 10);
    tx = ::torch::from_blob(x.data(), {static_cast<std::int64_t>(count), 784}, ::torch::kFloat);
    ty = ::torch::empty({static_cast<std::int64_t>(count)}, ::torch::kLong);
    for (std::size_t i = 0; i < count; ++i) ty[static_cast<std::int64_t>(i)] = static_cast<std::int64_t>(y[i]);
  }
  DenseData dense() const { return {count, 784, x, y}; }
};

}  // namespace

TEST_CASE("Torch.CnnGradientEqualsTheHandWrittenCnnsOnOneToFourDevices") {
  ::torch::set_num_threads(1);
  const Images data;
  const CnnModel model;
  const std::vector<float> weights = model.initial_parameters(3);
  std::vector<std::uint32_t> batch(60);
  for (std::size_t i = 0; i < batch.size(); ++i) batch[i] = static_cast<std::uint32_t>((i * 7) % data.count);
  std::vector<float> ref(model.layout().size(), 0.0f);
  CnnModel::Workspace ws;
  model.accumulate_gradient(weights, ref, data.dense(), batch, ws);
  for (float& g : ref) g /= static_cast<float>(batch.size());
  for (const char* devices : {"cpu:1", "cpu:2", "cpu:3", "cpu:4"}) {
    CAPTURE(devices);
    Runtime rt({.devices = devices, .schedule = {.chunk_size = 8}, .host = {.threads_per_device = 1}});
    libtorch::ModuleChunks<TorchCnnImpl> chunks(
        [] { return std::make_shared<TorchCnnImpl>(); }, rt.device_count(), [&data](std::span<const std::uint32_t> s) { return libtorch::rows(data.tx, s); },
        [&data](const ::torch::Tensor& out, std::span<const std::uint32_t> s) {
          return ::torch::nn::functional::cross_entropy(out, libtorch::rows(data.ty, s),
                                                        ::torch::nn::functional::CrossEntropyFuncOptions().reduction(::torch::kSum));
        });
    REQUIRE(chunks.layout().tensor_count() == model.layout().tensor_count());
    for (std::size_t i = 0; i < model.layout().tensor_count(); ++i) {
      CHECK(chunks.layout().tensor(i).name == model.layout().tensor(i).name);
      CHECK(chunks.layout().tensor(i).shape == model.layout().tensor(i).shape);
    }
    rt.register_parameters(chunks.layout(), weights);
    for (int rep = 0; rep < 2; ++rep) {
      rt.compute_gradient(batch, chunks.function());
      const double err = examples::max_relative_error(rt.gradient(), ref);
      CAPTURE(err);
      CHECK(err <= 1e-5);
    }
  }
}

TEST_CASE("Torch.GradientEqualsTheHandWrittenModelsOnOneToFourDevices") {
  ::torch::set_num_threads(1);
  const Data data;
  const DenseData dense = data.dense();
  const MlpModel model({32, 24, 16, 10});
  const std::vector<float> weights = model.initial_parameters(7);
  std::vector<std::uint32_t> batch(300);
  for (std::size_t i = 0; i < batch.size(); ++i) batch[i] = static_cast<std::uint32_t>((i * 37) % data.count);
  std::vector<float> ref(model.layout().size(), 0.0f);
  MlpModel::Workspace ws;
  model.accumulate_gradient(weights, ref, dense, batch, ws);
  for (float& g : ref) g /= static_cast<float>(batch.size());
  // Steps of the same batch from the same weights: every one's gradient is the hand-written model's.
  auto check_steps = [&](Runtime& rt, int steps) {
    auto chunks = torch_mlp(data, rt.device_count());
    rt.register_parameters(chunks.layout(), weights);
    for (int rep = 0; rep < steps; ++rep) {
      rt.compute_gradient(batch, chunks.function());
      CHECK(examples::max_relative_error(rt.gradient(), ref) <= 1e-5);
    }
  };
  for (const char* devices : {"cpu:1", "cpu:2", "cpu:3", "cpu:4"}) {
    CAPTURE(devices);
    Runtime rt({.devices = devices, .schedule = {.chunk_size = 16}, .host = {.threads_per_device = 1}});
    check_steps(rt, 3);
  }
  // As the torch examples run: one device slowed 4x, so its chunks are cut smaller, and thieves that merge what they
  // steal into one call (RuntimeOptions::schedule.merge_stolen). The module then sees chunks of several chunks' samples.
  for (const char* devices : {"cpu:2", "cpu:3"}) {
    CAPTURE(devices);
    std::vector<double> slowdown(static_cast<std::size_t>(devices[4] - '0'), 1.0);
    slowdown[0] = 4.0;
    Runtime rt({.devices = devices, .schedule = {.chunk_size = 16, .merge_stolen = true}, .host = {.slowdown = slowdown, .threads_per_device = 1}});
    check_steps(rt, 5);
  }
}

TEST_CASE("Torch.TrainingStepsLowerTheLoss") {
  ::torch::set_num_threads(1);
  const Data data;
  Runtime rt({.devices = "cpu:2", .schedule = {.chunk_size = 32}, .optimizer = {.kind = OptimizerKind::kAdam, .lr = 0.01f}, .host = {.threads_per_device = 1}});
  auto chunks = torch_mlp(data, rt.device_count());
  rt.register_parameters(chunks.layout(), chunks.initial());
  std::vector<std::uint32_t> all(data.count);
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<std::uint32_t>(i);
  const double first = rt.step(all, chunks.function()).loss;
  double last = first;
  for (int s = 0; s < 60; ++s) last = rt.step(all, chunks.function()).loss;
  CHECK(last < 0.7 * first);
}

TEST_CASE("Torch.AModuleThatDoesNotMatchTheLayoutIsRefused") {
  const Data data;
  auto chunks = torch_mlp(data, 1);
  ParameterLayout other;
  other.add("fc1.weight", 32 * 24);
  std::vector<float> p(other.size()), g(other.size());
  std::string what;
  try {
    libtorch::bind_module(chunks.replica(0), other, p, g);
  } catch (const ConfigError& e) {
    what = e.what();
  }
  CHECK(what.find("the module has 6 parameters; the layout has 1") != std::string::npos);
}

TEST_CASE("Torch.DeviceDataGivesHostRowsOnCpuChunks") {
  const Data data;
  const libtorch::DeviceData x(data.tx);
  CHECK(libtorch::chunk_device() == ::torch::Device(::torch::kCPU));
  const std::vector<std::uint32_t> ids{5, 0, 511};
  const ::torch::Tensor r = x.rows(ids);
  REQUIRE(r.size(0) == 3);
  CHECK(r.device() == ::torch::Device(::torch::kCPU));
  for (std::size_t i = 0; i < ids.size(); ++i) CHECK(::torch::equal(r[static_cast<std::int64_t>(i)], data.tx[ids[i]]));
  CHECK(x.on(::torch::kCPU).data_ptr() == data.tx.data_ptr());  // the host tensor itself, not a copy
}

#if !defined(STEALBATCH_TORCH_CUDA)
TEST_CASE("Torch.AGpuChunkWithACpuOnlyLibtorchIsAClearError") {
  // A chunk from a GPU device (its stream set) cannot run on a libtorch without CUDA: a ConfigError that says so
  // and how to build against a CUDA libtorch, before anything is bound or run.
  const Data data;
  auto chunks = torch_mlp(data, 1);
  std::vector<float> params = chunks.initial(), grad(params.size(), 0.0f);
  const std::vector<std::uint32_t> ids{1, 2, 3};
  double loss = 0;
  int stream = 0;
  ChunkContext ctx;
  ctx.samples = ids;
  ctx.params = params;
  ctx.grad = grad;
  ctx.loss_sum = &loss;
  ctx.stream = &stream;
  std::string what;
  try {
    chunks.function()(ctx);
  } catch (const ConfigError& e) {
    what = e.what();
  }
  CHECK(what.find("is a GPU, and this adapter was built against a libtorch without CUDA") != std::string::npos);
  CHECK(what.find("torch.utils.cmake_prefix_path") != std::string::npos);
  CHECK(std::all_of(grad.begin(), grad.end(), [](float g) { return g == 0.0f; }));
  CHECK(loss == 0);
}
#endif

namespace {

// A one-layer causal transformer over bytes, small enough for a test: token and position embeddings, one masked
// self-attention with a residual, and a head to the next byte. It reads Sequences in either form.
struct TinyLmImpl : ::torch::nn::Module {
  std::int64_t width;
  ::torch::nn::Embedding tok{nullptr}, pos{nullptr};
  ::torch::nn::Linear qkv{nullptr}, proj{nullptr}, head{nullptr};
  TinyLmImpl(std::int64_t w, std::int64_t max_len) : width(w) {
    tok = register_module("tok", ::torch::nn::Embedding(256, w));
    pos = register_module("pos", ::torch::nn::Embedding(max_len, w));
    qkv = register_module("qkv", ::torch::nn::Linear(w, 3 * w));
    proj = register_module("proj", ::torch::nn::Linear(w, w));
    head = register_module("head", ::torch::nn::Linear(w, 256));
  }
  ::torch::Tensor forward(const libtorch::Sequences& s) {
    ::torch::Tensor x = tok(s.tokens) + pos(s.positions);  // [B, L, w]
    const std::vector<::torch::Tensor> q = qkv(x).chunk(3, -1);
    ::torch::Tensor att = ::torch::matmul(q[0], q[1].transpose(1, 2)) / std::sqrt(static_cast<double>(width));
    att = att.masked_fill(s.allowed.logical_not(), -std::numeric_limits<float>::infinity()).softmax(-1);
    x = x + proj(::torch::matmul(att, q[2]));
    return head(x);  // [B, L, 256]
  }
};

::torch::Tensor next_byte_loss(const ::torch::Tensor& logits, const libtorch::Sequences& s) {
  return ::torch::nn::functional::cross_entropy(logits.reshape({-1, 256}), s.targets.reshape({-1}),
                                                ::torch::nn::functional::CrossEntropyFuncOptions().reduction(::torch::kSum).ignore_index(libtorch::Sequences::kNoTarget));
}

// Documents of random bytes with a long tail of lengths, 1 to 48.
struct Documents {
  std::vector<std::vector<std::uint8_t>> docs;
  explicit Documents(std::size_t n) {
    std::mt19937_64 rng(5);
    for (std::size_t i = 0; i < n; ++i) {
      const std::size_t len = rng() % 4 == 0 ? 16 + rng() % 33 : 1 + rng() % 8;
      docs.emplace_back(len);
      for (auto& b : docs.back()) b = static_cast<std::uint8_t>(rng() % 256);
    }
  }
  std::span<const std::uint8_t> operator()(std::uint32_t s) const { return docs.at(s); }
};

// The gradient a step must give: one plain libtorch forward and backward of the whole batch from `initial`, over the
// batch's size.
template <class Net, class Loss>
std::vector<float> one_plain_backward(Net& plain, const ParameterLayout& layout, const std::vector<float>& initial, const libtorch::Sequences& all,
                                      std::size_t batch, const Loss& loss) {
  std::vector<float> ref(layout.size(), 0.0f);
  libtorch::bind_module(plain, layout, initial, ref);
  loss(plain.forward(all), all).backward();
  libtorch::settle(plain, layout, ref);
  for (float& g : ref) g /= static_cast<float>(batch);
  return ref;
}

// Three steps on cpu:2 (device 0 3x slower, chunks of 8, stealing, the given costs), each placed by cost and each
// giving `ref`.
void check_steps_give(const ChunkFunction& fn, const ParameterLayout& layout, const std::vector<float>& initial, const std::vector<std::uint32_t>& batch,
                      const std::vector<double>& cost, const std::vector<float>& ref) {
  Runtime rt({.devices = "cpu:2", .schedule = {.chunk_size = 8}, .host = {.slowdown = {3.0, 1.0}, .threads_per_device = 1}});
  rt.register_parameters(layout, initial);
  for (int step = 0; step < 3; ++step) {
    const StepReport r = rt.compute_gradient(batch, fn, cost);
    CHECK(r.placed_by_cost);
    CHECK(examples::max_relative_error(rt.gradient(), ref) <= 1e-5);
  }
}

}  // namespace

TEST_CASE("Torch.SequencesInBothFormsMaskPaddingAndOtherSequences") {
  const std::vector<std::vector<std::uint8_t>> docs = {{1, 2, 3}, {7}, {4, 5}};
  auto of = [&](std::uint32_t s) { return std::span<const std::uint8_t>(docs[s]); };
  const std::vector<std::uint32_t> all = {0, 1, 2};
  const libtorch::Sequences pad = libtorch::make_sequences(all, of, libtorch::SequenceForm::kPadded);
  CHECK(pad.tokens.sizes() == ::torch::IntArrayRef({3, 3}));
  CHECK(pad.token_count() == 6);
  CHECK(pad.tokens[2][1].item<std::int64_t>() == 5);
  CHECK(pad.targets[0][0].item<std::int64_t>() == 2);
  CHECK(pad.targets[0][2].item<std::int64_t>() == libtorch::Sequences::kNoTarget);  // a sequence's last token
  CHECK(pad.targets[1][1].item<std::int64_t>() == libtorch::Sequences::kNoTarget);  // padding
  CHECK(pad.allowed[0][2][0].item<bool>());
  CHECK_FALSE(pad.allowed[0][0][1].item<bool>());  // causal
  CHECK_FALSE(pad.allowed[2][1][2].item<bool>());  // never a padded key
  const libtorch::Sequences packed = libtorch::make_sequences(all, of, libtorch::SequenceForm::kPacked);
  CHECK(packed.tokens.sizes() == ::torch::IntArrayRef({1, 6}));
  CHECK(packed.positions[0][4].item<std::int64_t>() == 0);  // the third sequence starts at 4
  CHECK(packed.targets[0][3].item<std::int64_t>() == libtorch::Sequences::kNoTarget);  // 7 is its sequence's last: not followed by 4
  CHECK(packed.allowed[0][5][4].item<bool>());
  CHECK_FALSE(packed.allowed[0][4][3].item<bool>());  // block-diagonal: not the sequence before
  const std::vector<std::vector<std::uint8_t>> empty = {{}};
  CHECK_THROWS_WITH_AS(libtorch::make_sequences(std::vector<std::uint32_t>{0}, [&](std::uint32_t) { return std::span<const std::uint8_t>(empty[0]); },
                                                libtorch::SequenceForm::kPadded),
                       doctest::Contains("sample 0 has no tokens"), ConfigError);
}

// A causal transformer on variable-length documents, padded or packed, with stealing on cpu:2 and each document's
// length as its cost: the gradient is one plain libtorch backward over the same batch.
TEST_CASE("Torch.VariableLengthGradientEqualsOnePlainBackward") {
  ::torch::set_num_threads(1);
  const Documents docs(200);
  std::vector<std::uint32_t> batch(120);
  std::vector<double> cost(batch.size());
  for (std::size_t i = 0; i < batch.size(); ++i) batch[i] = static_cast<std::uint32_t>((i * 7) % docs.docs.size()), cost[i] = static_cast<double>(docs.docs[batch[i]].size());
  ::torch::manual_seed(3);
  auto make = [] { return std::make_shared<TinyLmImpl>(16, 48); };
  std::vector<std::vector<float>> refs;
  std::vector<float> initial;  // both forms from the same start
  for (const libtorch::SequenceForm form : {libtorch::SequenceForm::kPadded, libtorch::SequenceForm::kPacked}) {
    CAPTURE(static_cast<int>(form));
    libtorch::ModuleChunks<TinyLmImpl, libtorch::Sequences> chunks(
        make, 2, [&](std::span<const std::uint32_t> s) { return libtorch::make_sequences(s, docs, form); },
        [&](const ::torch::Tensor& out, std::span<const std::uint32_t> s) { return next_byte_loss(out, libtorch::make_sequences(s, docs, form)); });
    if (initial.empty()) initial = chunks.initial();
    // The reference: one module, the whole batch in one forward and one backward.
    TinyLmImpl plain(16, 48);
    refs.push_back(one_plain_backward(plain, chunks.layout(), initial, libtorch::make_sequences(batch, docs, form), batch.size(),
                                      [](const ::torch::Tensor& out, const libtorch::Sequences& s) { return next_byte_loss(out, s); }));
    check_steps_give(chunks.function(), chunks.layout(), initial, batch, cost, refs.back());
  }
  // Padding and packing compute the same function.
  CHECK(examples::max_relative_error(refs[1], refs[0]) <= 1e-5);
}

// torch_lm's model (two pre-norm blocks, attention within each document: a loop over the packed documents, a causal
// mask alone over the padded rows), from Sequences without their dense mask, on cpu:2 with stealing and costs: the
// gradient is one plain libtorch backward over the batch, and the two forms compute the same function.
TEST_CASE("Torch.TransformerLmGradientEqualsOnePlainBackwardInBothForms") {
  ::torch::set_num_threads(1);
  const Documents docs(160);
  std::vector<std::uint32_t> batch(96);
  std::vector<double> cost(batch.size());
  for (std::size_t i = 0; i < batch.size(); ++i) {
    batch[i] = static_cast<std::uint32_t>((i * 5) % docs.docs.size());
    const double l = static_cast<double>(docs.docs[batch[i]].size());
    cost[i] = l + l * l / 32;
  }
  const examples::TorchLmOptions o{.width = 16, .layers = 2, .heads = 2, .max_len = 48};
  ::torch::manual_seed(4);
  auto make = [o] { return std::make_shared<examples::TorchLmImpl>(o); };
  std::vector<std::vector<float>> refs;
  std::vector<float> initial;
  for (const libtorch::SequenceForm form : {libtorch::SequenceForm::kPadded, libtorch::SequenceForm::kPacked}) {
    CAPTURE(static_cast<int>(form));
    const auto input = [&](std::span<const std::uint32_t> s) { return libtorch::make_sequences(s, docs, form, libtorch::SequenceMask::kNone); };
    libtorch::ModuleChunks<examples::TorchLmImpl, libtorch::Sequences> chunks(
        make, 2, input, [&](const ::torch::Tensor& out, std::span<const std::uint32_t> s) { return examples::next_byte_loss(out, input(s)); });
    CHECK_FALSE(input(batch).allowed.defined());  // no T x T mask was built
    if (initial.empty()) initial = chunks.initial();
    examples::TorchLmImpl plain(o);
    refs.push_back(one_plain_backward(plain, chunks.layout(), initial, input(batch), batch.size(),
                                      [](const ::torch::Tensor& out, const libtorch::Sequences& s) { return examples::next_byte_loss(out, s); }));
    check_steps_give(chunks.function(), chunks.layout(), initial, batch, cost, refs.back());
  }
  CHECK(examples::max_relative_error(refs[1], refs[0]) <= 1e-5);
}
