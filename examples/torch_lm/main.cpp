// torch_lm: a byte-level causal transformer language model on real variable-length text, the Python standard
// library's sources cut into documents, trained on stealbatch through the libtorch adapter. A document's cost grows
// with the square of its length, so an equal split of a batch's documents is an unequal split of its work; with
// --order grouped (each batch sorted by length, as length-grouped samplers order it) the equal split gives the first
// device every long document. Each step gives the runtime each document's cost (b L + e L^2, fitted to this
// machine's measured times at the start), which the packer packs by and stealing cuts its chunks by.
//
// --plain trains the same module with plain libtorch (no stealbatch) on the same order; --export writes the run's
// documents, orders and settings for perf/torch_lm_ref.py (PyTorch DDP on the same work). Either refuses the flags
// that only the runtime's runs read, before any data is read.
#include "torch_trainer.hpp"

#include <stealbatch/cores.hpp>
#include <stealbatch/data/text_corpus.hpp>
#include <stealbatch/error.hpp>
#include <stealbatch/models/torch_modules.hpp>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <new>
#include <string>
#include <system_error>
#include <thread>
#include <vector>
#if defined(STEALBATCH_TORCH_CUDA)
#include <torch/cuda.h>
#endif

using namespace stealbatch;
using namespace stealbatch::examples;

namespace {

using Clock = std::chrono::steady_clock;

// torch_lm's own flags (the shared ones are TrainerFlags).
struct LmFlags {
  std::string order = "grouped", form = "packed", costs = "model";
  std::string cache;        // empty: no cache
  std::string export_path;  // empty: train
  std::size_t validation_docs = 256;
  bool plain = false;
  int plain_threads = static_cast<int>(stealbatch::usable_cores());
};

// What only the runs on stealbatch's runtime read: --plain trains without the runtime and --export ends before any
// training, so either would drop these unread. --export keeps --devices (the cost fit's threads) and --slowdown
// (perf/torch_lm_ref.py takes the same one); --plain reads neither, nor --costs.
constexpr std::array<const char*, 20> kRuntimeFlags = {
    "--policy",  "--compare", "--compare-policies", "--chunk",      "--endgame",        "--chunk-sizing", "--merge-stolen",
    "--gpu-wait", "--deterministic", "--json",       "--trace",      "--save",           "--save-every",   "--keep",
    "--save-overwrite", "--resume", "--stop-after",  "--stall-timeout", "--heartbeat-timeout", "--wire"};
constexpr std::array<const char*, 3> kPlainAlsoDrops = {"--devices", "--slowdown", "--costs"};

// A path flag given "" would be silently ignored: refused, as --save's is.
void check_not_empty(const CLI::App& app, const char* flag, const std::string& value, const char* expected) {
  if (app.count(flag) > 0 && value.empty()) throw ConfigError(std::string(flag + 2) + " = '': an empty path; name " + expected);
}

// Refuses, before any data is read: flags that the mode would drop unread, path flags that cannot work, and GPU
// devices that this build's libtorch cannot run the model on.
void check_flags(const CLI::App& app, const TrainerFlags& f, const LmFlags& lf) {
  const bool exporting = !lf.export_path.empty() || app.count("--export") > 0;
  if (lf.plain && exporting) throw ConfigError("--plain with --export: --export writes the run and exits before any training; drop one of the two");
  if (!lf.plain && app.count("--plain-threads") > 0) throw ConfigError("--plain-threads without --plain: only --plain's training reads it");
  const auto refuse = [&](const char* flag, const char* mode, const std::string& why) {
    if (app.count(flag) > 0) throw ConfigError(std::string(flag) + " with " + mode + ": " + why + "; drop one of the two");
  };
  for (const char* flag : kRuntimeFlags) {
    if (lf.plain) refuse(flag, "--plain", std::string("--plain trains with plain libtorch, without stealbatch's runtime, and only the runtime's runs read ") + flag);
    if (exporting) refuse(flag, "--export", std::string("--export writes the run's documents and settings and exits before any training, so nothing reads ") + flag);
  }
  if (lf.plain) {
    for (const char* flag : kPlainAlsoDrops) {
      refuse(flag, "--plain", std::string("--plain trains in one process on --plain-threads threads, with no devices, slowdowns or costs, so nothing reads ") + flag);
    }
  }
  if ((lf.plain || exporting) && f.optimizer != "adam") {
    throw ConfigError("--optimizer " + f.optimizer + " with " + (lf.plain ? "--plain" : "--export") +
                      ": plain libtorch and perf/torch_lm_ref.py train with Adam; drop --optimizer");
  }
  // Deterministic mode cuts its cells by the costs, so they must not depend on timing.
  if (f.deterministic && lf.costs == "model") {
    throw ConfigError("--costs model with --deterministic: the model's costs are fitted to measured times, which differ from run to run, "
                      "and deterministic cells are cut by the costs; use --costs tokens (the default with --deterministic)");
  }

  check_not_empty(app, "--data", f.data, "a folder of Python sources, or auto");
  check_not_empty(app, "--cache", lf.cache, "a file");
  check_not_empty(app, "--export", lf.export_path, "a file");
  if (!lf.export_path.empty()) check_output_file("--export", lf.export_path);
  // A cache that is there is checked by load_text_corpus (a folder, or a file that is not a cache, is refused); one
  // that is not must be creatable.
  std::error_code ec;
  if (!lf.cache.empty() && (std::filesystem::is_directory(lf.cache, ec) || !std::filesystem::exists(lf.cache, ec))) check_output_file("--cache", lf.cache);

  const DeviceSpec spec = parse_device_spec(f.devices);
  if (spec.kind == DeviceKind::kCuda || spec.kind == DeviceKind::kVgpu) {
#if defined(STEALBATCH_TORCH_CUDA)
    if (!::torch::cuda::is_available()) {
      throw ConfigError("devices = '" + f.devices + "': libtorch finds no CUDA device here (torch::cuda::is_available() is false); use --devices cpu:N");
    }
#else
    throw ConfigError("devices = '" + f.devices + "': this torch_lm's libtorch is CPU-only (libtorch " TORCH_VERSION
                      " without CUDA), so its model runs on cpu: devices only; use --devices cpu:N, or build torch_lm against a CUDA "
                      "libtorch (PyTorch's, through torch.utils.cmake_prefix_path)");
#endif
  }
}

// libtorch's message for an allocation that failed, in e or in the exception nested in it (a chunk's, carried by a
// ChunkError), without libtorch's stack trace; empty when e is no such failure.
std::string allocation_failure(const std::exception& e) {
  if (dynamic_cast<const std::bad_alloc*>(&e) != nullptr) return "std::bad_alloc";
  if (const auto* t = dynamic_cast<const c10::Error*>(&e)) {
    std::string msg = t->what_without_backtrace();
    const bool oom = dynamic_cast<const c10::OutOfMemoryError*>(&e) != nullptr || msg.find("can't allocate memory") != std::string::npos ||
                     msg.find("out of memory") != std::string::npos || msg.find("not enough memory") != std::string::npos;
    if (!oom) return {};
    msg = msg.substr(0, msg.find('\n'));
    if (const std::size_t at = msg.find("DefaultCPUAllocator"); at != std::string::npos) msg.erase(0, at);  // past "[enforce fail at ...] err == 0. "
    return msg;
  }
  try {
    std::rethrow_if_nested(e);
  } catch (const std::exception& inner) {
    return allocation_failure(inner);
  } catch (...) {
  }
  return {};
}

// The training documents (the first --limit of the training split in a seeded shuffle, so a limit samples the whole
// library) and the held-out ones evaluated, as spans into the corpus.
struct LmData {
  TextCorpus corpus;
  std::vector<std::uint32_t> train, validation;  // corpus document ids
  std::span<const std::uint8_t> doc(std::uint32_t i) const { return corpus.document(train[i]); }
  std::size_t length(std::uint32_t i) const { return corpus.length(train[i]); }
};

LmData load_data(const TrainerFlags& f, std::size_t max_len, std::size_t validation_docs, const std::string& cache) {
  TextCorpusOptions o;
  if (f.data != "auto") o.roots = {f.data};
  o.max_len = max_len;
  o.cache = cache;
  LmData d{load_text_corpus(o), {}, {}};
  const std::vector<std::uint32_t> pick = epoch_order(d.corpus.train.size(), f.seed, 0);
  const std::size_t n = f.limit ? std::min(f.limit, pick.size()) : pick.size();
  for (std::size_t i = 0; i < n; ++i) d.train.push_back(d.corpus.train[pick[i]]);
  const std::size_t v = std::min(validation_docs, d.corpus.validation.size());
  d.validation.assign(d.corpus.validation.begin(), d.corpus.validation.begin() + static_cast<std::ptrdiff_t>(v));
  if (d.train.empty()) throw DataError("data = '" + f.data + "': no training documents");
  if (d.validation.empty()) {
    throw DataError("data = '" + f.data + "': none of its " + std::to_string(d.corpus.size()) +
                    " documents is held out (the split by content holds out about 1 in 20), so there is nothing to measure validation bits per "
                    "byte on; give --data more sources");
  }
  return d;
}

// An epoch's order of the training documents: shuffled (epoch_order), or grouped: the shuffled order with each
// batch sorted by length, longest first (the batches hold the same documents either way).
std::vector<std::uint32_t> lm_order(const LmData& d, const TrainerFlags& f, bool grouped, std::size_t epoch) {
  std::vector<std::uint32_t> order = epoch_order(d.train.size(), f.seed, epoch);
  if (grouped) {
    for (std::size_t at = 0; at < order.size(); at += f.batch) {
      const auto b = order.begin() + static_cast<std::ptrdiff_t>(at), e = order.begin() + static_cast<std::ptrdiff_t>(std::min(order.size(), at + f.batch));
      std::stable_sort(b, e, [&](std::uint32_t x, std::uint32_t y) { return d.length(x) > d.length(y); });
    }
  }
  return order;
}

// The time of one forward and backward of one document of length L, fitted as a + b L + e L^2: a is the time at 8
// bytes, and b, e >= 0 the least-squares fit of the rest over eight lengths up to max_len, each the fastest of 5 runs
// after one untimed pass over them all. A document's cost is b L + e L^2, its predicted time less the fixed part
// (which the runtime learns per call); c = b / e is the length where attention's share equals the rest's. Measured
// with the threads (torch's and the BLAS library's) each device will use.
struct CostFit {
  double a = 0, b = 0, e = 0;
  double c() const { return b > 0 && e > 0 ? b / e : 0; }  // 0: one of the two terms is not measured
  double cost(double l) const { return b > 0 || e > 0 ? b * l + e * l * l : l; }
};

CostFit fit_document_cost(TorchLmImpl& net, std::int64_t max_len, int threads, libtorch::SequenceForm form) {
  ::torch::set_num_threads(threads);
  (void)libtorch::set_blas_threads(threads);
  std::vector<std::uint8_t> bytes(static_cast<std::size_t>(max_len));
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<std::uint8_t>(32 + (i * 7) % 90);
  const auto pass = [&](std::int64_t len) {
    const std::vector<std::uint32_t> one{0};
    const libtorch::Sequences s = libtorch::make_sequences(
        one, [&](std::uint32_t) { return std::span<const std::uint8_t>(bytes).first(static_cast<std::size_t>(len)); }, form, libtorch::SequenceMask::kNone);
    net.zero_grad();
    const auto t0 = Clock::now();
    next_byte_loss(net.forward(s), s).backward();
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  std::vector<std::int64_t> sizes{std::min<std::int64_t>(8, max_len)};
  for (std::int64_t k = 1; k <= 8; ++k) sizes.push_back(std::max<std::int64_t>(2, max_len * k / 8));
  for (const std::int64_t len : sizes) (void)pass(len);  // the allocator's and the kernels' first use
  std::vector<double> secs;
  for (const std::int64_t len : sizes) {
    double best = 1e30;
    for (int r = 0; r < 5; ++r) best = std::min(best, pass(len));
    secs.push_back(best);
  }
  net.zero_grad();
  CostFit fit{secs[0], 0, 0};
  // (t - a) = b L + e L^2, both >= 0: the 2 x 2 normal equations, or one term alone where the other comes out negative.
  double sll = 0, sl3 = 0, sl4 = 0, sty = 0, sty2 = 0;
  for (std::size_t i = 1; i < sizes.size(); ++i) {
    const double l = static_cast<double>(sizes[i]), y = secs[i] - fit.a;
    sll += l * l, sl3 += l * l * l, sl4 += l * l * l * l, sty += l * y, sty2 += l * l * y;
  }
  const double det = sll * sl4 - sl3 * sl3;
  fit.b = det != 0 ? (sty * sl4 - sty2 * sl3) / det : 0;
  fit.e = det != 0 ? (sll * sty2 - sl3 * sty) / det : 0;
  if (fit.b < 0) fit.b = 0, fit.e = std::max(0.0, sty2 / sl4);
  if (fit.e < 0) fit.e = 0, fit.b = std::max(0.0, sty / sll);
  return fit;
}

// Validation bits per byte: the summed next-byte cross-entropy over the held-out documents, in bits, over the bytes
// predicted (every byte of a document but its first).
double bits_per_byte(TorchLmImpl& net, const LmData& d, libtorch::SequenceForm form) {
  const ::torch::NoGradGuard no_grad;
  const auto of = [&](std::uint32_t i) { return d.corpus.document(i); };
  double nats = 0, predicted = 0;
  for (std::size_t at = 0; at < d.validation.size(); at += 16) {
    const auto ids = std::span<const std::uint32_t>(d.validation).subspan(at, std::min<std::size_t>(16, d.validation.size() - at));
    const libtorch::Sequences s = libtorch::make_sequences(ids, of, form, libtorch::SequenceMask::kNone);
    nats += next_byte_loss(net.forward(s), s).item<double>();
    predicted += static_cast<double>(s.token_count() - static_cast<std::int64_t>(ids.size()));  // a document's first byte is not predicted
  }
  return predicted > 0 ? nats / std::log(2.0) / predicted : std::numeric_limits<double>::quiet_NaN();  // none: not a figure
}

// The bar a model must clearly beat: a unigram model of the training documents' bytes (add-one smoothed), in bits
// per byte on the same held-out bytes.
double unigram_bits_per_byte(const LmData& d) {
  std::array<double, 256> count{};
  count.fill(1);
  double total = 256;
  for (std::uint32_t i = 0; i < d.train.size(); ++i) {
    for (std::uint8_t b : d.doc(i)) ++count[b], ++total;
  }
  double bits = 0, n = 0;
  for (std::uint32_t v : d.validation) {
    const auto doc = d.corpus.document(v);
    for (std::size_t t = 1; t < doc.size(); ++t) bits -= std::log2(count[doc[t]] / total), ++n;
  }
  return n > 0 ? bits / n : std::numeric_limits<double>::quiet_NaN();
}

// The same module, order, batch and schedule with plain libtorch: one process, torch's own threads, one forward and
// backward over each whole batch in the same form.
void train_plain_lm(const TrainerFlags& f, const TorchLmOptions& lm, const LmData& d, bool grouped, libtorch::SequenceForm form, int threads,
                    const std::vector<float>& initial, const ParameterLayout& layout) {
  ::torch::set_num_threads(threads);
  TorchLmImpl net(lm);
  {
    const ::torch::NoGradGuard no_grad;
    std::size_t at = 0;
    for (auto& p : net.parameters()) {
      std::copy_n(initial.begin() + static_cast<std::ptrdiff_t>(at), p.numel(), p.data_ptr<float>());
      at += static_cast<std::size_t>(p.numel());
    }
    if (at != layout.size()) throw Error("torch_lm: the plain module's parameters do not match the layout");
  }
  ::torch::optim::Adam opt(net.parameters(), ::torch::optim::AdamOptions(f.lr));
  const std::size_t steps_per_epoch = (d.train.size() + f.batch - 1) / f.batch, total = steps_per_epoch * f.epochs;
  const auto of = [&](std::uint32_t i) { return d.doc(i); };
  std::size_t step = 0;
  std::vector<double> epoch_s;
  double tokens = 0;
  for (std::size_t epoch = 1; epoch <= f.epochs; ++epoch) {
    const std::vector<std::uint32_t> order = lm_order(d, f, grouped, epoch);
    const auto t0 = Clock::now();
    double loss_sum = 0;
    for (std::size_t start = 0; start < order.size(); start += f.batch) {
      const auto ids = std::span<const std::uint32_t>(order).subspan(start, std::min(f.batch, order.size() - start));
      set_scheduled_lr(opt, f, step, total);
      ++step;
      opt.zero_grad();
      const libtorch::Sequences s = libtorch::make_sequences(ids, of, form, libtorch::SequenceMask::kNone);
      const ::torch::Tensor loss = next_byte_loss(net.forward(s), s) / static_cast<double>(ids.size());  // the runtime's convention
      loss.backward();
      opt.step();
      loss_sum += loss.item<double>() * static_cast<double>(ids.size());
      if (epoch == 1) tokens += static_cast<double>(s.token_count());
    }
    epoch_s.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    std::fprintf(stderr, "[plain libtorch] epoch %zu/%zu  %.3f s  loss %.4f\n", epoch, f.epochs, epoch_s.back(), loss_sum / static_cast<double>(order.size()));
  }
  const double med = median(std::vector<double>(epoch_s.size() > 1 ? epoch_s.begin() + 1 : epoch_s.begin(), epoch_s.end()));
  std::printf("plain libtorch, %d threads: %.0f tokens/s (median epoch%s %.3f s), validation bits/byte %.4f\n", threads, tokens / med,
              epoch_s.size() > 1 ? " after the first" : "", med, bits_per_byte(net, d, form));
}

// Writes what perf/torch_lm_ref.py needs to train the same model on the same work: the settings, the training
// documents, each epoch's order and the held-out documents.
void export_run(const std::string& path, const TrainerFlags& f, const TorchLmOptions& lm, const LmData& d, bool grouped, const std::string& form,
                double cost_c) {
  nlohmann::json j;
  j["model"] = {{"width", lm.width}, {"layers", lm.layers}, {"heads", lm.heads}, {"max_len", lm.max_len}};
  j["batch"] = f.batch, j["epochs"] = f.epochs, j["lr"] = f.lr, j["schedule"] = f.schedule, j["seed"] = f.seed;
  j["form"] = form, j["order"] = grouped ? "grouped" : "shuffled", j["cost_c"] = cost_c;
  j["train"] = nlohmann::json::array();
  for (std::uint32_t i = 0; i < d.train.size(); ++i) j["train"].push_back(std::vector<int>(d.doc(i).begin(), d.doc(i).end()));
  j["validation"] = nlohmann::json::array();
  for (std::uint32_t v : d.validation) j["validation"].push_back(std::vector<int>(d.corpus.document(v).begin(), d.corpus.document(v).end()));
  j["orders"] = nlohmann::json::array();
  for (std::size_t e = 1; e <= f.epochs; ++e) j["orders"].push_back(lm_order(d, f, grouped, e));
  std::ofstream out(path);
  if (!(out << j.dump() << "\n")) throw Error("cannot write --export file '" + path + "'");
}

// Loads the data, builds the model and fits the costs, then exports, trains with plain libtorch or trains on the
// runtime. `phase` says what it is doing, for a failure's message.
void run_lm(const TrainerFlags& f, const TorchLmOptions& lm, const LmFlags& lf, const char*& phase) {
  const bool grouped = lf.order == "grouped";
  const libtorch::SequenceForm seq_form = lf.form == "packed" ? libtorch::SequenceForm::kPacked : libtorch::SequenceForm::kPadded;
  phase = "reading the corpus";
  const auto t_load = Clock::now();
  const LmData data = load_data(f, static_cast<std::size_t>(lm.max_len), lf.validation_docs, lf.cache);
  if (!data.corpus.cache_rebuilt.empty()) std::printf("# corpus cache %s rebuilt: %s\n", lf.cache.c_str(), data.corpus.cache_rebuilt.c_str());
  std::vector<double> lens;
  double tokens = 0;
  for (std::uint32_t i = 0; i < data.train.size(); ++i) lens.push_back(static_cast<double>(data.length(i))), tokens += lens.back();
  std::sort(lens.begin(), lens.end());
  const auto pct = [&](double p) { return lens[static_cast<std::size_t>(p * static_cast<double>(lens.size() - 1))]; };
  std::printf("# torch_lm: %zu training documents (%.0f bytes; length p10 %.0f, p50 %.0f, p90 %.0f, max %.0f) of %zu, %zu held out evaluated; "
              "%s from %zu files in %.1f s; libtorch %s\n",
              data.train.size(), tokens, pct(0.1), pct(0.5), pct(0.9), lens.back(), data.corpus.train.size(), data.validation.size(),
              data.corpus.from_cache ? "cached" : "read", data.corpus.files, std::chrono::duration<double>(Clock::now() - t_load).count(), TORCH_VERSION);
  std::printf("# model: width %lld, %lld layers, %lld heads, max length %lld; order %s, form %s; %s\n", static_cast<long long>(lm.width),
              static_cast<long long>(lm.layers), static_cast<long long>(lm.heads), static_cast<long long>(lm.max_len), lf.order.c_str(), lf.form.c_str(),
              describe_configuration(f).c_str());

  // The cores shared among this process's devices, and among the ranks on this node under mpirun (Open MPI and
  // MPICH say how many share it).
  const std::size_t device_count = parse_device_spec(f.devices).count;
  std::size_t local_ranks = 1;
  for (const char* var : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"}) {
    if (const char* v = std::getenv(var); v != nullptr && std::atoi(v) > 0) local_ranks = static_cast<std::size_t>(std::atoi(v));
  }
  const int threads = std::max(1, static_cast<int>(stealbatch::usable_cores() / std::max<std::size_t>(1, device_count * local_ranks)));
  phase = "building the model";
  ::torch::manual_seed(f.seed);
  const std::function<std::shared_ptr<TorchLmImpl>()> make = [lm] { return std::make_shared<TorchLmImpl>(lm); };
  auto first = make();
  const ParameterLayout layout = libtorch::layout_of(*first);
  const std::vector<float> initial = libtorch::values_of(*first);

  CostFit fit;  // costs tokens: b = e = 0, the cost is L
  if (lf.costs == "model" && !lf.plain) {  // --plain gives no costs to anything
    phase = "fitting the document cost";
    fit = fit_document_cost(*first, lm.max_len, threads, seq_form);
    // Every rank gives the same costs (the runtime checks it at each step): the ranks' fits, averaged alike on each.
    std::array<double, 3> abe{fit.a, fit.b, fit.e};
    const std::size_t ranks = mean_over_ranks(abe);
    fit.a = abe[0], fit.b = abe[1], fit.e = abe[2];
    std::printf("# document cost: b L + e L^2 (c = b/e = %.0f): one document's forward and backward on %d thread(s) took %.2f ms + %.3f us L + %.5f us L^2%s\n",
                fit.c(), threads, fit.a * 1e3, fit.b * 1e6, fit.e * 1e6, ranks > 1 ? (" (the mean of " + std::to_string(ranks) + " ranks' fits)").c_str() : "");
  }
  const double c = fit.c();
  std::printf("# unigram model on the same split: %.4f bits/byte\n", unigram_bits_per_byte(data));
  if (!lf.export_path.empty()) {
    phase = "writing --export";
    export_run(lf.export_path, f, lm, data, grouped, lf.form, c);
    std::printf("# wrote %s\n", lf.export_path.c_str());
    return;
  }
  phase = "training";
  if (lf.plain) return train_plain_lm(f, lm, data, grouped, seq_form, lf.plain_threads, initial, layout);

  // A call builds its documents' Sequences once: the input function (called first, on the device's thread) keeps
  // them for the loss, which the adapter calls next in the same call on the same thread. Nothing is reused across
  // calls, whose sample spans may lie at the same address with other contents (a packed batch's order, say).
  const auto of = [&data](std::uint32_t i) { return data.doc(i); };
  struct Inputs {
    static libtorch::Sequences& last() {
      thread_local libtorch::Sequences s;
      return s;
    }
  };
  TrainerModel tm;
  tm.layout = &layout;
  tm.initial = initial;
  tm.chunk_function = [make, of, seq_form, threads](std::size_t devices, int one) -> ChunkFunction {
    auto chunks = std::make_shared<libtorch::ModuleChunks<TorchLmImpl, libtorch::Sequences>>(
        make, devices,
        [of, seq_form](std::span<const std::uint32_t> s) {
          return Inputs::last() = libtorch::make_sequences(s, of, seq_form, libtorch::SequenceMask::kNone);
        },
        [](const ::torch::Tensor& out, std::span<const std::uint32_t>) { return next_byte_loss(out, libtorch::to_device(Inputs::last(), out.device())); },
        one > 0 ? one : threads);
    ChunkFunction fn = chunks->function();
    return [chunks, fn](ChunkContext& ctx) { fn(ctx); };
  };
#if defined(STEALBATCH_TORCH_CUDA)
  tm.chunk_function_on_gpus = true;
#endif
  tm.sample_cost = [&data, fit](std::uint32_t i) { return fit.cost(static_cast<double>(data.length(i))); };
  tm.sample_units = [&data](std::uint32_t i) { return static_cast<double>(data.length(i)); };
  tm.units = "tokens";
  tm.order = [&data, &f, grouped](std::size_t epoch) { return lm_order(data, f, grouped, epoch); };
  tm.metric = "validation bits/byte";
  tm.test_accuracy = [first, &layout, &data, seq_form](std::span<const float> params) {
    std::vector<float> scratch(layout.size());
    libtorch::bind_module(*first, layout, params, scratch);
    return bits_per_byte(*first, data, seq_form);
  };
  // The trainer's loop counts samples: the documents, by position in data.train.
  const DenseData documents{data.train.size(), 0, {}, {}};
  report(f, train_policies(f, tm, documents));
}

}  // namespace

int main(int argc, char** argv) {
  TrainerFlags f{.data = "auto", .devices = "cpu:2", .epochs = 3, .batch = 64, .limit = 1024, .lr = 0.002f, .optimizer = "adam",
                 .compare_policies = "static,packer,steal-nocosts,steal"};
  TorchLmOptions lm{.width = 128, .layers = 2, .heads = 4, .max_len = 512};
  LmFlags lf;
  CLI::App app{"torch_lm: train a byte-level causal transformer on the Python standard library's sources on stealbatch (the libtorch adapter)"};
  add_trainer_options(app, f, [&](CLI::App& a) {
    a.add_option("--max-len", lm.max_len, "bytes per document at most (longer ones are cut); also the model's positions")->check(CLI::Range(16, 8192))->capture_default_str();
    a.add_option("--order", lf.order, "shuffled, or grouped: each batch sorted by length, longest first (a length-grouped sampler's order)")
        ->check(CLI::IsMember({"shuffled", "grouped"}))->capture_default_str();
    a.add_option("--costs", lf.costs, "each document's cost given with a step: model (b L + e L^2, fitted to measured times at the start) or tokens (L)")
        ->check(CLI::IsMember({"model", "tokens"}))->capture_default_str();
    a.add_option("--form", lf.form, "a chunk's documents: packed (end to end, attention within each document) or padded (rows padded to the longest)")
        ->check(CLI::IsMember({"packed", "padded"}))->capture_default_str();
    a.add_option("--width", lm.width, "model width")->check(CLI::Range(8, 4096))->capture_default_str();
    a.add_option("--layers", lm.layers, "transformer blocks")->check(CLI::Range(1, 64))->capture_default_str();
    a.add_option("--heads", lm.heads, "attention heads (a divisor of --width)")->check(CLI::Range(1, 256))->capture_default_str();
    a.add_option("--validation-docs", lf.validation_docs, "held-out documents evaluated at the end (bits per byte)")->check(CLI::Range(1, 1000000))->capture_default_str();
    a.add_option("--cache", lf.cache, "the corpus cache file (default: none, the sources are read each run); a file there that is not one is never replaced");
    a.add_flag("--plain", lf.plain, "train with plain libtorch instead (no stealbatch), for comparison");
    a.add_option("--plain-threads", lf.plain_threads, "--plain: torch's intra-op threads")->check(CLI::Range(1, 256))->capture_default_str();
    a.add_option("--export", lf.export_path, "write the run's documents, orders and settings as JSON for perf/torch_lm_ref.py, and exit");
  });
  app.get_option("--data")->description("a folder of Python sources, or auto: every /usr/lib/python3.N");
  app.get_option("--limit")->description("train on N documents, a seeded sample of the training split (0 = all)");
  app.get_option("--batch")->description("documents per step (mini-batch)");
  app.get_option("--chunk")->description("chunk budget in documents of the batch's mean cost, 1 to 1048576; auto: sized from each device's measured time per call");
  if (const int rc = parse_command_line("torch_lm", app, f, argc, argv); rc >= 0) return rc;
  // Deterministic mode cuts its cells by the costs, so they must not depend on timing: the token counts.
  if (f.deterministic && app.count("--costs") == 0) lf.costs = "tokens";

  return run_reporting_errors("torch_lm", [&] {
    check_flags(app, f, lf);
    if (lm.width % lm.heads != 0) throw ConfigError("heads = " + std::to_string(lm.heads) + ": not a divisor of --width " + std::to_string(lm.width));
    const char* phase = "starting";
    try {
      run_lm(f, lm, lf, phase);
    } catch (const std::exception& e) {
      // One line for what ran out and what to lower, not libtorch's stack trace (exit 1).
      if (const std::string what = allocation_failure(e); !what.empty()) {
        throw Error("out of memory while " + std::string(phase) + " (" + what + ") with --batch " + std::to_string(f.batch) + ", --max-len " +
                    std::to_string(lm.max_len) + ", --width " + std::to_string(lm.width) + ", --layers " + std::to_string(lm.layers) + ", --chunk " +
                    f.chunk + ": lower one of them");
      }
      if (const auto* t = dynamic_cast<const c10::Error*>(&e)) throw Error(std::string("libtorch: ") + t->what_without_backtrace());
      throw;
    }
  });
}
