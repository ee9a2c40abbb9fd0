// Runtime::save_checkpoint and load_checkpoint: a resumed runtime continues bit for bit where the saved one was
// (static placement), its state survives every kind of bad file unchanged, and the devices' speeds come back.
#include "model_test_support.hpp"

#include <stealbatch/checkpoint/checkpoint_file.hpp>
#include <stealbatch/checkpoint/durable_file.hpp>
#include <stealbatch/error.hpp>
#include <stealbatch/runtime/runtime.hpp>

#include <doctest/doctest.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

using namespace stealbatch;
using namespace stealbatch::testing;
namespace fs = std::filesystem;

namespace {

struct TempDir {
  fs::path path = fs::temp_directory_path() / ("sb_rtckpt_" + std::to_string(::getpid()));
  TempDir() { fs::create_directories(path); }
  ~TempDir() { fs::remove_all(path); }
};

struct Trainer {
  Synthetic syn{1024, 16, 4, 3};
  MlpModel model{{16, 12, 4}};
  std::vector<float> init = model.initial_parameters(9);
  ChunkFunction fn = [this](ChunkContext& ctx) {
    thread_local MlpModel::Workspace ws;
    ctx.add_loss(model.accumulate_gradient(ctx.params, ctx.grad, syn.data, ctx.samples, ws));
  };
  std::vector<std::uint32_t> batch(std::size_t step) const {
    std::vector<std::uint32_t> b(128);
    std::iota(b.begin(), b.end(), static_cast<std::uint32_t>((step * 128) % 1024));
    return b;
  }
};

RuntimeOptions options(OptimizerKind kind, const char* devices = "cpu:2") {
  RuntimeOptions o;
  o.devices = devices;
  o.schedule.chunk_size = 16;
  o.schedule.policy = SchedulePolicy::kStatic;  // each device sums the same chunks in the same order: bit-identical runs
  o.host.threads_per_device = 1;
  o.optimizer.kind = kind;
  o.optimizer.lr = kind == OptimizerKind::kAdam ? 0.01f : 0.1f;
  return o;
}

std::vector<float> params_of(const Runtime& rt) {
  const auto p = rt.parameters(0);
  return {p.begin(), p.end()};
}

bool bit_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("Checkpoint.ResumedRuntimeContinuesBitForBit") {
  for (const OptimizerKind kind : {OptimizerKind::kAdam, OptimizerKind::kSgd}) {
    CAPTURE(static_cast<int>(kind));
    TempDir dir;
    Trainer t;
    // Straight: 8 steps. Interrupted: 3 steps, save, a new runtime loads it, 5 more steps.
    Runtime straight(options(kind));
    straight.register_parameters(t.model.layout(), t.init);
    for (std::size_t s = 0; s < 8; ++s) {
      straight.set_learning_rate(0.01f / static_cast<float>(s + 1));
      (void)straight.step(t.batch(s), t.fn);
    }
    const fs::path p = dir.path / "c.safetensors";
    {
      Runtime first(options(kind));
      first.register_parameters(t.model.layout(), t.init);
      for (std::size_t s = 0; s < 3; ++s) {
        first.set_learning_rate(0.01f / static_cast<float>(s + 1));
        (void)first.step(t.batch(s), t.fn);
      }
      first.save_checkpoint(p, {{"step", "3"}, {"seed", "9"}});
    }
    Runtime resumed(options(kind));
    resumed.register_parameters(t.model.layout(), t.init);
    const CheckpointMetadata meta = resumed.load_checkpoint(p);
    CHECK(meta == CheckpointMetadata{{"step", "3"}, {"seed", "9"}});
    for (std::size_t s = 3; s < 8; ++s) {
      resumed.set_learning_rate(0.01f / static_cast<float>(s + 1));
      (void)resumed.step(t.batch(s), t.fn);
    }
    CHECK(bit_equal(params_of(resumed), params_of(straight)));
  }
}

TEST_CASE("Checkpoint.FileHoldsTheLayoutNamesShapesAndOptimizerState") {
  TempDir dir;
  Trainer t;
  Runtime rt(options(OptimizerKind::kAdam));
  rt.register_parameters(t.model.layout(), t.init);
  (void)rt.step(t.batch(0), t.fn);
  const fs::path p = dir.path / "c.safetensors";
  rt.save_checkpoint(p, {{"epoch", "1"}});
  const CheckpointFile f = CheckpointFile::read(p);
  const auto* w = f.contents().find("fc1.weight");
  REQUIRE(w != nullptr);
  CHECK(w->shape == std::vector<std::uint64_t>{12, 16});
  CHECK(f.contents().find("optimizer.fc1.weight.m") != nullptr);
  CHECK(f.contents().find("optimizer.fc2.bias.v") != nullptr);
  CHECK(f.contents().tensors().size() == 3 * t.model.layout().tensor_count());
  const auto& meta = f.contents().metadata();
  CHECK(meta.at("stealbatch.optimizer") == "adam");
  CHECK(meta.at("stealbatch.optimizer.steps") == "1");
  CHECK(meta.at("epoch") == "1");
  const std::vector<float> p_now = params_of(rt);
  CHECK(f.floats("fc1.bias", 12) == std::vector<float>(p_now.begin() + 12 * 16, p_now.begin() + 12 * 16 + 12));
  // The runtime's own keys are its own.
  CHECK_THROWS_AS(rt.save_checkpoint(p, {{"stealbatch.epoch", "1"}}), ConfigError);
}

TEST_CASE("Checkpoint.BadFilesAreTypedErrorsAndLeaveTheRuntimeAsItWas") {
  TempDir dir;
  Trainer t;
  const fs::path good = dir.path / "good.safetensors";
  {
    Runtime saver(options(OptimizerKind::kAdam));
    saver.register_parameters(t.model.layout(), t.init);
    for (std::size_t s = 0; s < 2; ++s) (void)saver.step(t.batch(s), t.fn);
    saver.save_checkpoint(good);
  }
  const std::vector<std::byte> bytes = read_whole_file(good);
  const auto write = [&](const char* name, std::vector<std::byte> b) {
    const fs::path p = dir.path / name;
    std::ofstream(p, std::ios::binary).write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
    return p;
  };
  std::vector<std::byte> flipped = bytes;
  flipped[bytes.size() - 5] ^= std::byte{1};
  std::vector<std::byte> header = bytes;
  header[9] = std::byte{'!'};  // the first name's opening quote: no longer JSON

  Runtime rt(options(OptimizerKind::kAdam));
  rt.register_parameters(t.model.layout(), t.init);
  (void)rt.step(t.batch(5), t.fn);
  const std::vector<float> before = params_of(rt);
  const auto expect = [&](const fs::path& p, CheckpointError::Reason reason, const char* says, Runtime& on) {
    try {
      (void)on.load_checkpoint(p);
      FAIL("loaded ", p.string());
    } catch (const CheckpointError& e) {
      CHECK(e.reason() == reason);
      CHECK_MESSAGE(std::string(e.what()).find(says) != std::string::npos, std::string(e.what()));
      CHECK(std::string(e.what()).find(p.filename().string()) != std::string::npos);
    }
  };
  expect(dir.path / "missing.safetensors", CheckpointError::Reason::kIo, "No such file", rt);
  expect(write("truncated.safetensors", {bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(bytes.size() / 2)}),
         CheckpointError::Reason::kFormat, "truncated", rt);
  expect(write("header.safetensors", header), CheckpointError::Reason::kFormat, "corrupt header", rt);
  expect(write("flipped.safetensors", flipped), CheckpointError::Reason::kChecksum, "checksum mismatch", rt);
  // The same runtime after every failure: nothing applied, and the next step runs as if none was tried.
  CHECK(bit_equal(params_of(rt), before));

  // Another layout: a name, a shape, a count.
  const auto other = [&](std::vector<std::size_t> sizes, const char* says) {
    MlpModel m(sizes);
    Runtime o(options(OptimizerKind::kAdam));
    o.register_parameters(m.layout(), m.initial_parameters(1));
    const std::vector<float> was = params_of(o);
    expect(good, CheckpointError::Reason::kLayout, says, o);
    CHECK(bit_equal(params_of(o), was));
  };
  other({16, 10, 4}, "has shape [12, 16], the layout's 'fc1.weight' is [10, 16]");
  other({16, 12, 4, 4}, "holds 4 parameter tensors, this runtime's layout 6");
  {
    ParameterLayout renamed;
    for (const TensorView& v : t.model.layout().tensors()) renamed.add(v.name == "fc2.bias" ? "head.bias" : v.name, v.shape);
    Runtime o(options(OptimizerKind::kAdam));
    o.register_parameters(renamed, t.init);
    expect(good, CheckpointError::Reason::kLayout, "'fc2.bias' is not in this runtime's parameter layout", o);
  }
  // Another optimizer, or other settings of the same one.
  {
    Runtime o(options(OptimizerKind::kSgd));
    o.register_parameters(t.model.layout(), t.init);
    expect(good, CheckpointError::Reason::kOptimizer, "its optimizer is adam, this runtime's is sgd", o);
    RuntimeOptions b = options(OptimizerKind::kAdam);
    b.optimizer.beta1 = 0.8f;
    Runtime o2(b);
    o2.register_parameters(t.model.layout(), t.init);
    expect(good, CheckpointError::Reason::kOptimizer, "optimizer.beta1 is 0.89999997615814209 in the file", o2);
  }
  // And the good file still loads into the runtime that refused the others.
  (void)rt.load_checkpoint(good);
  CHECK_FALSE(bit_equal(params_of(rt), before));
}

TEST_CASE("Checkpoint.DeviceSpeedsComeBackOnTheSameDevices") {
  TempDir dir;
  Trainer t;
  RuntimeOptions o = options(OptimizerKind::kAdam, "sim:1,0.25");
  o.schedule.policy = SchedulePolicy::kSteal;
  o.sim.sample_seconds = 20e-6;
  const fs::path p = dir.path / "c.safetensors";
  std::vector<double> saved;
  {
    Runtime rt(o);
    rt.register_parameters(t.model.layout(), t.init);
    for (std::size_t s = 0; s < 4; ++s) (void)rt.step(t.batch(s), t.fn);
    saved = rt.throughput_estimates();
    rt.save_checkpoint(p);
  }
  REQUIRE(saved.size() == 2);
  Runtime resumed(o);
  resumed.register_parameters(t.model.layout(), t.init);
  CHECK(resumed.throughput_estimates().empty());
  (void)resumed.load_checkpoint(p);
  const std::vector<double> back = resumed.throughput_estimates();
  REQUIRE(back.size() == 2);
  // Pooling may merge devices within their noise; these differ 4x, so each keeps its own.
  CHECK(back[0] == doctest::Approx(saved[0]).epsilon(1e-12));
  CHECK(back[1] == doctest::Approx(saved[1]).epsilon(1e-12));
  // Other devices: the speeds are left to be measured.
  RuntimeOptions three = o;
  three.devices = "sim:1,1,1";
  Runtime other(three);
  other.register_parameters(t.model.layout(), t.init);
  (void)other.load_checkpoint(p);
  CHECK(other.throughput_estimates().empty());
}
