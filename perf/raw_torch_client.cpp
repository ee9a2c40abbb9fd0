// raw_torch_client: a causal transformer trained the way a new user writes it against the public API, with a raw
// ChunkFunction (no ModuleChunks): a libtorch module per device bound to the runtime's buffers (bind_module, settle),
// torch::set_num_threads(1) on each device's thread, and nothing else set up. torch_lm's documents (the Python
// standard library's sources, at most 512 bytes each) in length-grouped batches, static against steal on CPU
// devices, epoch by epoch interleaved; medians.
//
//   raw_torch_client [--devices cpu:2] [--epochs 3] [--batch 64] [--docs 512] [--cache FILE] [--blas-threads N]
//
// --blas-threads N sets the BLAS pool to N threads after the runtime is made (set_blas_pool_threads): with N > 1 the
// devices share one pool, as they did before the runtime sized it. Exit status: 0 the runs completed and every step
// counted every document once; 1 a step did not; 2 a usage error.
#include "tool_cli.hpp"

#include <stealbatch/data/text_corpus.hpp>
#include <stealbatch/error.hpp>
#include <stealbatch/models/torch_modules.hpp>
#include <stealbatch/runtime/cpu_device.hpp>
#include <stealbatch/runtime/runtime.hpp>
#include <stealbatch/stats.hpp>
#include <stealbatch/torch.hpp>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

using namespace stealbatch;

namespace {

// `count` documents of the Python standard library's sources (torch_lm's corpus, up to max_len bytes each), drawn
// at random with a fixed seed.
std::vector<std::span<const std::uint8_t>> pick_documents(const TextCorpus& corpus, std::size_t count) {
  std::vector<std::uint32_t> ids = corpus.train;
  std::shuffle(ids.begin(), ids.end(), std::mt19937_64(5));
  ids.resize(std::min(count, ids.size()));
  std::vector<std::span<const std::uint8_t>> docs;
  for (std::uint32_t i : ids) docs.push_back(corpus.document(i));
  return docs;
}

struct Run {
  std::unique_ptr<Runtime> rt;
  std::string name;
  std::vector<double> epochs;
};

}  // namespace

int main(int argc, char** argv) {
  std::string devices = "cpu:2";
  std::size_t epochs = 3, batch = 64, docs_count = 512;
  int blas_threads = 0;
  std::string cache;
  bool verbose = false;
  CLI::App app{"raw_torch_client: a raw-ChunkFunction libtorch transformer on length-grouped batches, static against steal"};
  app.add_option("--devices", devices, "CPU devices (cpu:N)")->capture_default_str();
  app.add_option("--epochs", epochs, "timed epochs per policy, interleaved")->check(CLI::Range(1, 100))->capture_default_str();
  app.add_option("--batch", batch, "documents a step")->check(CLI::Range(2, 4096))->capture_default_str();
  app.add_option("--docs", docs_count, "documents")->check(CLI::Range(2, 1 << 20))->capture_default_str();
  app.add_option("--cache", cache, "the corpus cache file (torch_lm's --cache): read if it is one, else written");
  app.add_option("--blas-threads", blas_threads, "after the runtime is made, the BLAS pool's threads (0: as the runtime set them)")
      ->check(CLI::Range(0, 256))->capture_default_str();
  app.add_flag("--verbose", verbose, "each step's chunks and devices (size/chunks run/compute s)");
  if (const int rc = perf::parse(app, argc, argv); rc >= 0) return rc;

  examples::TorchLmOptions lm;
  lm.max_len = 512;
  TextCorpusOptions co;
  co.max_len = static_cast<std::size_t>(lm.max_len);
  co.cache = cache;
  TextCorpus corpus;
  try {
    corpus = load_text_corpus(co);
  } catch (const Error& e) {
    std::fprintf(stderr, "raw_torch_client: %s\n", e.what());
    return 2;
  }
  const auto docs = pick_documents(corpus, docs_count);
  // Length-grouped batches: the documents sorted longest first and cut into batches, as a length-grouped sampler
  // makes them; an equal split then gives the first devices the long ones.
  std::vector<std::uint32_t> order(docs.size());
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(), [&](std::uint32_t a, std::uint32_t b) { return docs[a].size() > docs[b].size(); });

  std::vector<Run> runs;
  for (const bool steal : {false, true}) {
    RuntimeOptions o{.devices = devices};
    o.schedule.policy = steal ? SchedulePolicy::kSteal : SchedulePolicy::kStatic;
    o.optimizer.kind = OptimizerKind::kAdam, o.optimizer.lr = 1e-3f;
    runs.push_back({std::make_unique<Runtime>(o), steal ? "steal" : "static", {}});
  }
  if (blas_threads > 0) (void)set_blas_pool_threads(blas_threads);

  // Each runtime's devices get a replica of the same module; the chunk function binds it to the device's buffers.
  torch::manual_seed(1);
  const auto first = std::make_shared<examples::TorchLmImpl>(lm);
  const ParameterLayout layout = libtorch::layout_of(*first);
  const std::vector<float> initial = libtorch::values_of(*first);
  const auto tokens_of = [&](std::uint32_t s) { return docs[s]; };
  std::vector<std::function<void(ChunkContext&)>> fns;
  std::vector<std::vector<std::shared_ptr<examples::TorchLmImpl>>> replicas(runs.size());
  for (std::size_t r = 0; r < runs.size(); ++r) {
    runs[r].rt->register_parameters(layout, initial);
    for (std::size_t d = 0; d < runs[r].rt->device_count(); ++d) replicas[r].push_back(std::make_shared<examples::TorchLmImpl>(lm));
    fns.push_back([&, r](ChunkContext& ctx) {
      static thread_local bool threads_set = false;
      if (!threads_set) torch::set_num_threads(1), threads_set = true;  // the one thread setup a user does
      auto& m = replicas[r][ctx.device];
      libtorch::bind_module(*m, layout, ctx.params, ctx.grad);
      const libtorch::Sequences s = libtorch::make_sequences(ctx.samples, tokens_of, libtorch::SequenceForm::kPadded);
      const torch::Tensor loss = examples::next_byte_loss(m->forward(s), s);
      loss.backward();
      libtorch::settle(*m, layout, ctx.grad);
      ctx.add_loss(loss.item<double>());
    });
  }

  std::uint64_t wrong = 0;
  std::printf("# raw_torch_client: %s, %zu Python standard library documents (at most %lld bytes) in length-grouped batches of %zu, "
              "TorchLm width %lld, %lld layers; BLAS pool: %s\n",
              devices.c_str(), docs.size(), static_cast<long long>(lm.max_len), batch, static_cast<long long>(lm.width),
              static_cast<long long>(lm.layers), blas_threads > 0 ? (std::to_string(blas_threads) + " threads, set after the runtime").c_str() : "as the runtime set it");
  // One untimed step each, then epochs alternating static, steal.
  for (std::size_t e = 0; e <= epochs; ++e) {
    for (std::size_t r = 0; r < runs.size(); ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      const std::size_t end = e == 0 ? batch : order.size();
      for (std::size_t at = 0; at < end; at += batch) {
        const std::span<const std::uint32_t> b(order.data() + at, std::min(batch, order.size() - at));
        const StepReport rep = runs[r].rt->step(b, fns[r]);
        wrong += rep.samples != b.size();
        if (verbose) {
          std::printf("  %s step %zu: %.3f s, %zu chunks, %llu stolen, by cost %d |", runs[r].name.c_str(), at / batch, rep.step_s, rep.chunks,
                      static_cast<unsigned long long>(rep.steals), rep.placed_by_cost ? 1 : 0);
          for (const DeviceReport& d : rep.devices) std::printf(" %zu/%zu/%.3f", d.chunk_samples, static_cast<std::size_t>(d.chunks_run), d.compute_s);
          std::printf("\n");
        }
      }
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (e > 0) {
        runs[r].epochs.push_back(s);
        std::printf("epoch %zu %-6s %8.3f s\n", e, runs[r].name.c_str(), s);
        std::fflush(stdout);
      }
    }
  }
  const double st = median(runs[0].epochs), sl = median(runs[1].epochs);
  std::printf("median epoch: static %.3f s, steal %.3f s: steal takes %.2fx static's time (%.2fx faster)\n", st, sl, sl / st, st / sl);
  return wrong == 0 ? 0 : 1;
}
