// gemmbench: single-thread sgemm of the MLP's layers (one training pass: forward, weight and input gradients) at
// chunk sizes M, for each BLAS-like library installed, side by side in one run, each result checked against a
// double-precision reference. The libraries are loaded with dlopen, so none is a build dependency:
//   openblas  libopenblas.so.0, with the kernels it picked for this CPU (OPENBLAS_CORETYPE=... names another)
//   blis      libblis.so.4 (bli_sgemm)
//   onednn    libdnnl.so.2 (dnnl_sgemm)
// Exit status: 0 every result right and the JSON written; 1 a result is wrong, no library could be loaded, or the
// JSON could not be written at the end; 2 a usage error (a flag, its value, an unwritable --json), before any run.
#include "tool_cli.hpp"

#include <stealbatch/stats.hpp>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <dlfcn.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

using stealbatch::median;
using Clock = std::chrono::steady_clock;
namespace perf = stealbatch::perf;

namespace {

// C (row-major M x N) = A' B' + beta C, where A' is A (M x K) or its transpose, B' is B (K x N) or its transpose.
using Sgemm = std::function<void(bool ta, bool tb, long m, long n, long k, const float* a, long lda, const float* b, long ldb, float beta, float* c,
                                 long ldc)>;

struct Library {
  std::string name, kernels;  // kernels: the code family it runs on this CPU
  Sgemm gemm;
};

template <class F>
F sym(void* lib, const char* name) {
  return reinterpret_cast<F>(dlsym(lib, name));
}

std::optional<Library> load_openblas() {
  void* h = dlopen("libopenblas.so.0", RTLD_NOW | RTLD_LOCAL);
  if (!h) return std::nullopt;
  auto set_threads = sym<void (*)(int)>(h, "openblas_set_num_threads");
  auto corename = sym<char* (*)()>(h, "openblas_get_corename");
  auto config = sym<char* (*)()>(h, "openblas_get_config");
  using Cblas = void (*)(int, int, int, int, int, int, float, const float*, int, const float*, int, float, float*, int);
  auto cblas = sym<Cblas>(h, "cblas_sgemm");
  if (!cblas || !set_threads) return std::nullopt;
  set_threads(1);
  std::string version = config ? config() : "OpenBLAS";
  version = version.substr(0, version.find(' ', version.find(' ') + 1));  // "OpenBLAS 0.3.21"
  return Library{"openblas", version + " " + (corename ? corename() : "?"),
                 [cblas](bool ta, bool tb, long m, long n, long k, const float* a, long lda, const float* b, long ldb, float beta, float* c, long ldc) {
                   constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;
                   cblas(kRowMajor, ta ? kTrans : kNoTrans, tb ? kTrans : kNoTrans, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), 1.0f,
                         a, static_cast<int>(lda), b, static_cast<int>(ldb), beta, c, static_cast<int>(ldc));
                 }};
}

std::optional<Library> load_blis() {
  void* h = dlopen("libblis.so.4", RTLD_NOW | RTLD_LOCAL);
  if (!h) return std::nullopt;
  using Gemm = void (*)(int, int, long, long, long, const float*, const float*, long, long, const float*, long, long, const float*, float*, long, long);
  auto gemm = sym<Gemm>(h, "bli_sgemm");
  auto set_threads = sym<void (*)(long)>(h, "bli_thread_set_num_threads");
  auto version = sym<const char* (*)()>(h, "bli_info_get_version_str");
  auto arch_id = sym<int (*)()>(h, "bli_arch_query_id");
  auto arch_name = sym<const char* (*)(int)>(h, "bli_arch_string");
  if (!gemm) return std::nullopt;
  if (set_threads) set_threads(1);
  const std::string kernels = std::string("BLIS ") + (version ? version() : "?") + " " + (arch_id && arch_name ? arch_name(arch_id()) : "?");
  return Library{"blis", kernels,
                 [gemm](bool ta, bool tb, long m, long n, long k, const float* a, long lda, const float* b, long ldb, float beta, float* c, long ldc) {
                   constexpr int kNoTranspose = 0x0, kTranspose = 0x8;  // BLIS's trans_t
                   const float one = 1.0f;
                   gemm(ta ? kTranspose : kNoTranspose, tb ? kTranspose : kNoTranspose, m, n, k, &one, a, lda, 1, b, ldb, 1, &beta, c, ldc, 1);
                 }};
}

std::optional<Library> load_onednn() {
  void* h = dlopen("libdnnl.so.2", RTLD_NOW | RTLD_LOCAL);
  if (!h) return std::nullopt;
  using Gemm = int (*)(char, char, std::int64_t, std::int64_t, std::int64_t, float, const float*, std::int64_t, const float*, std::int64_t, float,
                       float*, std::int64_t);
  struct Version {
    int major, minor, patch;
    const char* hash;
    unsigned cpu_runtime, gpu_runtime;
  };
  auto gemm = sym<Gemm>(h, "dnnl_sgemm");
  auto version = sym<const Version* (*)()>(h, "dnnl_version");
  auto isa = sym<int (*)()>(h, "dnnl_get_effective_cpu_isa");
  if (!gemm) return std::nullopt;
  // oneDNN's threads are OpenMP's here: one thread, as every other library runs.
  if (auto omp = reinterpret_cast<void (*)(int)>(dlsym(RTLD_DEFAULT, "omp_set_num_threads"))) omp(1);
  void* gomp = dlopen("libgomp.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (gomp) {
    if (auto omp = sym<void (*)(int)>(gomp, "omp_set_num_threads")) omp(1);
  }
  std::string kernels = "oneDNN";
  if (version) {
    const Version* v = version();
    kernels += " " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch);
  }
  if (isa) {
    // dnnl_cpu_isa_t values (dnnl_types.h): the widest instruction set the JIT uses on this CPU.
    const int i = isa();
    const char* name = i == 0x3e7 ? "avx512_core_amx" : i == 0xe7 ? "avx512_core_bf16" : i == 0x67 ? "avx512_core_vnni" : i == 0x27 ? "avx512_core"
                       : i == 0x407 ? "avx2_vnni" : i == 0x7 ? "avx2" : i == 0x3 ? "avx" : i == 0x1 ? "sse41" : "other";
    kernels += std::string(" ") + name;
  }
  return Library{"onednn", kernels,
                 [gemm](bool ta, bool tb, long m, long n, long k, const float* a, long lda, const float* b, long ldb, float beta, float* c, long ldc) {
                   gemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, 1.0f, a, lda, b, ldb, beta, c, ldc);
                 }};
}

// One GEMM of the training pass: C (m x n) from A and B, with the flops 2mnk.
struct Op {
  const char* what;
  bool ta, tb;
  long m, n, k;
};

// The ops of one training pass of an MLP layer in -> out over b samples (row-major, W stored out x in):
// forward y = x W^T; weight gradient dW += dy^T x; input gradient dx = dy W (not for the first layer).
std::vector<Op> layer_ops(long b, long in, long out, bool first) {
  std::vector<Op> ops = {{"fwd", false, true, b, out, in}, {"dW", true, false, out, in, b}};
  if (!first) ops.push_back({"dx", false, false, b, in, out});
  return ops;
}

// How many of a few sampled entries of C differ from a double-precision product by more than 1e-4 relative.
std::size_t wrong_entries(const Op& op, const std::vector<float>& a, const std::vector<float>& b, const std::vector<float>& c) {
  std::size_t wrong = 0;
  std::mt19937_64 rng(7);
  for (int t = 0; t < 64; ++t) {
    const long i = static_cast<long>(rng() % static_cast<std::uint64_t>(op.m)), j = static_cast<long>(rng() % static_cast<std::uint64_t>(op.n));
    double ref = 0, mag = 0;
    for (long p = 0; p < op.k; ++p) {
      const double x = op.ta ? a[static_cast<std::size_t>(p * op.m + i)] : a[static_cast<std::size_t>(i * op.k + p)];
      const double y = op.tb ? b[static_cast<std::size_t>(j * op.k + p)] : b[static_cast<std::size_t>(p * op.n + j)];
      ref += x * y, mag += std::abs(x * y);
    }
    if (std::abs(c[static_cast<std::size_t>(i * op.n + j)] - ref) > 1e-4 * std::max(mag, 1e-30)) ++wrong;
  }
  return wrong;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"gemmbench: single-thread sgemm of the MLP's training pass per library, at chunk sizes M"};
  std::string sizes_s = "16,32,64,128,256,512,1024", layers_s = "784,256,128,10", libs_s = "openblas,blis,onednn", json_path;
  int reps = 15;
  double min_ms = 20;
  app.footer("Exit status: 0 every result right and the JSON written; 1 a result is wrong, no library could be loaded, or the JSON could "
             "not be written at the end; 2 a usage error (a flag, its value, an unwritable --json), before any run.");
  app.add_option("--m", sizes_s, "chunk sizes (rows of the GEMMs), each 1 to 8192")->capture_default_str();
  app.add_option("--layers", layers_s, "the MLP's layer sizes, two or more, each 1 to 8192")->capture_default_str();
  app.add_option("--libs", libs_s, "libraries to load: openblas, blis, onednn")->capture_default_str();
  app.add_option("--reps", reps, "timed repetitions per point (the median is reported); one untimed first")->check(CLI::Range(1, 1000))->capture_default_str();
  app.add_option("--min-ms", min_ms, "each repetition runs the pass enough times to last at least this long")
      ->check(perf::finite_range(0.0, 60000.0))->capture_default_str();
  app.add_option("--json", json_path, "write the rows as JSON");
  if (const int rc = perf::parse(app, argc, argv); rc >= 0) return rc;
  // A comma-separated list of sizes, each a whole number in [1, 8192]; empty on an error, which is printed.
  auto list = [](const char* flag, const std::string& s) {
    std::vector<long> v;
    std::stringstream ss(s);
    for (std::string x; std::getline(ss, x, ',');) {
      char* end = nullptr;
      const long n = std::strtol(x.c_str(), &end, 10);
      if (x.empty() || *end != '\0' || n < 1 || n > 8192) {
        perf::usage_error("gemmbench", std::string(flag) + " = '" + x + "': expected whole numbers in [1, 8192], comma-separated");
        return std::vector<long>{};
      }
      v.push_back(n);
    }
    return v;
  };
  const std::vector<long> ms = list("--m", sizes_s), layers = list("--layers", layers_s);
  if (ms.empty() || layers.empty()) return perf::kExitUsage;
  if (layers.size() < 2) return perf::usage_error("gemmbench", "--layers = '" + layers_s + "': expected two sizes or more (an input and an output)");
  std::vector<std::string> lib_names;
  std::stringstream ls(libs_s);
  for (std::string l; std::getline(ls, l, ',');) {
    if (l != "openblas" && l != "blis" && l != "onednn") {
      return perf::usage_error("gemmbench", "--libs = '" + l + "': expected openblas, blis or onednn, comma-separated");
    }
    lib_names.push_back(l);
  }
  if (!perf::check_output_file("gemmbench", app, "--json", json_path)) return perf::kExitUsage;

  std::vector<Library> libs;
  for (const std::string& l : lib_names) {
    std::optional<Library> lib = l == "openblas" ? load_openblas() : l == "blis" ? load_blis() : load_onednn();
    if (lib) {
      libs.push_back(std::move(*lib));
    } else {
      std::printf("# %s: not installed; skipped\n", l.c_str());
    }
  }
  if (libs.empty()) {
    std::fprintf(stderr, "gemmbench: none of --libs %s could be loaded: nothing to measure\n", libs_s.c_str());
    return 1;
  }
  std::printf("# gemmbench: one thread, MLP %s, one training pass (forward, weight and input gradients; none for the input)\n", layers_s.c_str());
  std::printf("# %d timed repetitions of >= %.0f ms after one untimed; GFLOP/s = sum of 2mnk over the pass / median time\n", reps, min_ms);
  for (const Library& l : libs) std::printf("# %-8s %s\n", l.name.c_str(), l.kernels.c_str());
  std::printf("%-9s %6s %12s %12s %9s %7s\n", "library", "M", "pass_us", "GFLOP/s", "vs_best", "#wrong");

  nlohmann::json rows = nlohmann::json::array();
  std::mt19937_64 rng(1);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (long m : ms) {
    std::vector<Op> ops;
    for (std::size_t l = 0; l + 1 < layers.size(); ++l) {
      for (const Op& op : layer_ops(m, layers[l], layers[l + 1], l == 0)) ops.push_back(op);
    }
    double flops = 0;
    std::vector<std::vector<float>> a(ops.size()), b(ops.size()), c(ops.size());
    for (std::size_t i = 0; i < ops.size(); ++i) {
      const Op& op = ops[i];
      flops += 2.0 * static_cast<double>(op.m) * static_cast<double>(op.n) * static_cast<double>(op.k);
      a[i].resize(static_cast<std::size_t>(op.m * op.k)), b[i].resize(static_cast<std::size_t>(op.k * op.n)), c[i].assign(static_cast<std::size_t>(op.m * op.n), 0.0f);
      for (float& x : a[i]) x = u(rng);
      for (float& x : b[i]) x = u(rng);
    }
    std::vector<double> rate(libs.size());
    std::vector<std::size_t> wrong(libs.size());
    for (std::size_t li = 0; li < libs.size(); ++li) {
      const Library& lib = libs[li];
      auto pass = [&] {
        for (std::size_t i = 0; i < ops.size(); ++i) {
          const Op& op = ops[i];
          lib.gemm(op.ta, op.tb, op.m, op.n, op.k, a[i].data(), op.ta ? op.m : op.k, b[i].data(), op.tb ? op.k : op.n, 0.0f, c[i].data(), op.n);
        }
      };
      pass();
      for (std::size_t i = 0; i < ops.size(); ++i) wrong[li] += wrong_entries(ops[i], a[i], b[i], c[i]);
      const auto t0 = Clock::now();
      long inner = 0;
      do pass(), ++inner;
      while (Clock::now() - t0 < std::chrono::duration<double, std::milli>(min_ms));
      std::vector<double> per;
      for (int r = 0; r < reps; ++r) {
        const auto s = Clock::now();
        for (long i = 0; i < inner; ++i) pass();
        per.push_back(std::chrono::duration<double>(Clock::now() - s).count() / static_cast<double>(inner));
      }
      rate[li] = flops / median(per) / 1e9;
    }
    const double best = *std::max_element(rate.begin(), rate.end());
    for (std::size_t li = 0; li < libs.size(); ++li) {
      std::printf("%-9s %6ld %12.1f %12.1f %9.2f %7zu\n", libs[li].name.c_str(), m, flops / rate[li] / 1e3, rate[li], rate[li] / best, wrong[li]);
      rows.push_back({{"library", libs[li].name}, {"kernels", libs[li].kernels}, {"m", m}, {"gflops", rate[li]}, {"vs_best", rate[li] / best},
                      {"wrong", wrong[li]}});
    }
  }
  std::size_t total_wrong = 0;
  for (const auto& r : rows) total_wrong += r["wrong"].get<std::size_t>();
  std::printf("# summary: %zu rows, #wrong total %zu\n", rows.size(), total_wrong);
  if (!json_path.empty() && !perf::write_output("gemmbench", "--json", json_path, rows.dump(2) + "\n")) return 1;
  return total_wrong == 0 ? 0 : 1;
}
