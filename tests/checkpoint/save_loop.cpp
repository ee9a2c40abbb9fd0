// The kill test's saving process (kill_test.sh). Without --verify it saves checkpoints into DIR back to back, for
// ever: checkpoint k holds parameters that are a known function of k after one Adam step, and the folder keeps the
// last two. With --verify it loads DIR's newest checkpoint and checks it against the same function, computed
// afresh: the parameters bit for bit, then one more step from both, which the optimizer's saved state must match.
//
//   save_loop DIR             saves until killed
//   save_loop DIR --verify    exit 0: the newest checkpoint loads, passes its checksum and is right (or there is none yet)
// SB_SAVE_LOOP_FLOATS sets the parameters' size (default 262144), the same for the saving and the verifying process.
#include <stealbatch/checkpoint/checkpoint_dir.hpp>
#include <stealbatch/error.hpp>
#include <stealbatch/runtime/runtime.hpp>

#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

using namespace stealbatch;

namespace {

ParameterLayout layout_of(std::size_t floats) {
  ParameterLayout l;
  l.add("w", {floats / 4, 4});
  l.add("b", {4});
  return l;
}

std::vector<float> values_for(std::uint64_t k, std::size_t n) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<float>((k * 7919 + i * 104729) % 100003) * 1e-5f - 0.5f;
  return v;
}

const std::vector<std::uint32_t> kBatch{0, 1, 2, 3};

void grad_fn(ChunkContext& ctx) {
  for (std::uint32_t s : ctx.samples) {
    for (std::size_t i = 0; i < ctx.grad.size(); ++i) ctx.grad[i] += ctx.params[i] * 0.01f + static_cast<float>((i + s) % 13) * 1e-3f;
  }
}

std::unique_ptr<Runtime> make_runtime(const ParameterLayout& layout, std::uint64_t k) {
  RuntimeOptions o;
  o.devices = "cpu:1";
  o.host.threads_per_device = 1;
  o.schedule.chunk_size = 4;
  o.optimizer = {.kind = OptimizerKind::kAdam, .lr = 0.01f};
  auto rt = std::make_unique<Runtime>(o);
  rt->register_parameters(layout, values_for(k, layout.size()));
  return rt;
}

std::vector<float> params_of(const Runtime& rt) {
  const auto p = rt.parameters(0);
  return {p.begin(), p.end()};
}

int verify(const CheckpointDir& dir) {
  const auto latest = dir.latest();
  if (!latest) {
    std::printf("verify: no checkpoint yet\n");
    return 0;
  }
  // The file's size tells its layout: the newest save used the same --floats as every other (kill_test.sh).
  const std::uint64_t k = std::stoull(latest->filename().string().substr(5, 12));
  const std::size_t floats = std::stoull(std::getenv("SB_SAVE_LOOP_FLOATS") ? std::getenv("SB_SAVE_LOOP_FLOATS") : "262144");
  const ParameterLayout layout = layout_of(floats);
  const auto loaded = make_runtime(layout, 0);
  const CheckpointMetadata meta = loaded->load_checkpoint(*latest);  // throws on a bad file: the test fails
  if (meta.at("k") != std::to_string(k)) {
    std::printf("verify: %s holds k = %s\n", latest->c_str(), meta.at("k").c_str());
    return 1;
  }
  const auto expected = make_runtime(layout, k);
  (void)expected->step(kBatch, grad_fn);
  const auto same = [&](const char* when) {
    const std::vector<float> a = params_of(*loaded), b = params_of(*expected);
    if (std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0) return true;
    std::printf("verify: %s differs from step %llu's parameters %s\n", latest->c_str(), static_cast<unsigned long long>(k), when);
    return false;
  };
  if (!same("as loaded")) return 1;
  (void)loaded->step(kBatch, grad_fn);
  (void)expected->step(kBatch, grad_fn);
  if (!same("one step later (the optimizer's state)")) return 1;
  std::printf("verify: %s is step %llu's, whole\n", latest->filename().c_str(), static_cast<unsigned long long>(k));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string folder;
  bool verify_newest = false;
  CLI::App app{"save_loop: saves checkpoints back to back until killed, or verifies the newest (SB_SAVE_LOOP_FLOATS: parameters, default 262144)"};
  app.add_option("DIR", folder, "the checkpoint folder")->required();
  app.add_flag("--verify", verify_newest, "load the newest checkpoint and check it against what it should hold, then exit");
  CLI11_PARSE(app, argc, argv);
  try {
    const CheckpointDir dir(folder);
    if (verify_newest) return verify(dir);
    const std::size_t floats = std::stoull(std::getenv("SB_SAVE_LOOP_FLOATS") ? std::getenv("SB_SAVE_LOOP_FLOATS") : "262144");
    const ParameterLayout layout = layout_of(floats);
    const auto latest = dir.list();
    std::uint64_t k = latest.empty() ? 1 : latest.back().first + 1;
    const auto rt = make_runtime(layout, k);
    for (;; ++k) {
      rt->register_parameters(layout, values_for(k, layout.size()));  // a fresh optimizer too: what --verify computes
      (void)rt->step(kBatch, grad_fn);
      rt->save_checkpoint(dir.path_for(k), {{"k", std::to_string(k)}});
      dir.prune(2);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "save_loop: %s\n", e.what());
    return 1;
  }
}
