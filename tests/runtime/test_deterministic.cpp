// Deterministic mode: the fixed-point format's bounds at the extremes, and the same parameter bytes (SHA-256) after
// training whatever the devices, the policy, the merging, the slowdowns, a lost device or a resume; the default mode
// shown not to be, so that the comparison can fail.
#include "model_test_support.hpp"

#include <stealbatch/error.hpp>
#include <stealbatch/runtime/communicator.hpp>
#include <stealbatch/runtime/detail/fixed_point.hpp>
#include <stealbatch/runtime/runtime.hpp>
#include <stealbatch/runtime/testing.hpp>
#include <stealbatch/sha256.hpp>

#include <doctest/doctest.h>
#include <test_support.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <numeric>
#include <random>
#include <string>
#include <unistd.h>
#include <vector>

using namespace stealbatch;
using namespace stealbatch::testing;
using detail::kNoExponent;

namespace {

// Cells of one tensor rounded with the shift their largest exponent calls for, summed in `groups` accumulators (cells
// dealt round-robin after a shuffle), the groups then summed: the fixed-point sum as devices and ranks make it.
struct FixedRun {
  std::vector<std::int64_t> sum;
  int shift = 0;
};
FixedRun fixed_sum(const std::vector<std::vector<float>>& cells, std::size_t groups, std::uint64_t seed) {
  const std::size_t n = cells[0].size();
  const int bits = detail::fixed_cell_bits(cells.size());
  int e = kNoExponent;
  for (auto c : cells) e = std::max(e, detail::add_cell_fixed(c, kNoExponent, {}).exponent);  // the scan alone (a copy: it zeroes)
  FixedRun r;
  r.shift = detail::fixed_shift_for(e, bits);
  std::vector<std::size_t> order(cells.size());
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937_64(seed));
  std::vector<std::vector<std::int64_t>> acc(groups, std::vector<std::int64_t>(n, 0));
  for (std::size_t i = 0; i < order.size(); ++i) {
    std::vector<float> c = cells[order[i]];
    const detail::CellScan s = detail::add_cell_fixed(c, r.shift, acc[i % groups]);
    CHECK(s.finite);
    CHECK(detail::fixed_shift_fits(s.exponent, r.shift, bits));
    CHECK(std::all_of(c.begin(), c.end(), [](float v) { return v == 0.0f; }));  // left zeroed for the next cell
  }
  r.sum.assign(n, 0);
  for (const auto& a : acc) {
    for (std::size_t i = 0; i < n; ++i) r.sum[i] += a[i];
  }
  return r;
}

// The largest error of the fixed-point sum against the exact sum of the cells' floats (long double: exact for these
// sizes), over the bound cells * 2^-(shift + 1) plus the final float's rounding.
double worst_over_bound(const std::vector<std::vector<float>>& cells, const FixedRun& r) {
  std::vector<float> out(r.sum.size());
  detail::from_fixed(r.sum, r.shift, out);
  double worst = 0;
  for (std::size_t i = 0; i < out.size(); ++i) {
    long double exact = 0;
    for (const auto& c : cells) exact += c[i];
    const long double bound = static_cast<long double>(cells.size()) * std::ldexp(1.0L, -r.shift - 1) +
                              std::fabs(exact) * std::ldexp(1.0L, -24);  // + half a float ulp, and a little
    worst = std::max(worst, static_cast<double>(std::fabs(static_cast<long double>(out[i]) - exact) / bound));
  }
  return worst;
}

std::vector<std::vector<float>> random_cells(std::size_t cells, std::size_t n, double lo_exp, double hi_exp, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> e(lo_exp, hi_exp), sign(-1, 1);
  std::vector<std::vector<float>> out(cells, std::vector<float>(n));
  for (auto& c : out) {
    for (float& v : c) v = static_cast<float>(std::copysign(std::pow(10.0, e(rng)), sign(rng)));
  }
  return out;
}

// A small MLP trained for `steps` Adam steps in deterministic mode; the SHA-256 of its parameters' bytes.
struct Trained {
  std::string sha;
  std::uint32_t redone = 0;
  std::size_t excluded = 0;
  std::vector<float> params;
};

struct Training {
  Synthetic syn{900, 24, 5, 3};
  MlpModel model{{24, 16, 5}};
  std::size_t steps = 6;
  bool costs = false;  // every other step's batch with sample costs
  double grow_at = 0;  // from step 4 on, every gradient times this (a step whose gradients leave the window)

  std::vector<std::uint32_t> batch(std::size_t step) const {
    std::vector<std::uint32_t> b(150 + step % 3 * 17);  // partial last cells
    for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<std::uint32_t>((i * 7919 + step * 131) % syn.data.count);
    return b;
  }
  Trained run(RuntimeOptions o, const std::function<void(Runtime&, std::size_t step)>& before_step = {}) const {
    o.optimizer = {.kind = OptimizerKind::kAdam, .lr = 0.01f};
    Runtime rt(o);
    rt.register_parameters(model.layout(), model.initial_parameters(5));
    std::vector<MlpModel::Workspace> ws(rt.device_count());
    Trained t;
    for (std::size_t s = 0; s < steps; ++s) {
      if (before_step) before_step(rt, s);
      const std::vector<std::uint32_t> b = batch(s);
      std::vector<double> cost;
      if (costs && s % 2 == 1) {
        for (std::uint32_t x : b) cost.push_back(1.0 + static_cast<double>(x % 13));
      }
      const float factor = grow_at > 0 && s >= 4 ? static_cast<float>(grow_at) : 1.0f;
      const StepReport r = rt.step(b, [&](ChunkContext& ctx) {
        ctx.add_loss(model.accumulate_gradient(ctx.params, ctx.grad, syn.data, ctx.samples, ws[ctx.device]));
        if (factor != 1.0f) {
          for (float& g : ctx.grad) g *= factor;
        }
      }, cost);
      t.redone += r.redone;
      t.excluded += r.excluded_devices.size();
    }
    t.params = rt.parameters();
    t.sha = sha256_hex(std::as_bytes(std::span<const float>(t.params)));
    return t;
  }
};

RuntimeOptions deterministic(std::string devices, SchedulePolicy policy = SchedulePolicy::kSteal) {
  RuntimeOptions o;
  o.devices = std::move(devices);
  o.schedule.policy = policy;
  o.schedule.chunk_size = 8;
  o.schedule.deterministic = true;
  o.sim.sample_seconds = 20e-6;
  return o;
}

// A step whose chunk 3 puts a NaN in tensor 1's gradient fails with a ChunkError that says "not finite" and names the
// tensor, and the runtime can go on: the next step runs. Returns the error for the caller's own checks.
ChunkError nan_fails_the_step(Runtime& rt, const Training& tr) {
  rt.register_parameters(tr.model.layout(), tr.model.initial_parameters(5));
  std::vector<MlpModel::Workspace> ws(rt.device_count());
  const std::size_t bias = tr.model.layout().tensor(1).offset;
  bool poison = true;
  auto fn = [&](ChunkContext& ctx) {
    ctx.add_loss(tr.model.accumulate_gradient(ctx.params, ctx.grad, tr.syn.data, ctx.samples, ws[ctx.device]));
    if (poison && ctx.chunk == 3) ctx.grad[bias] = std::nanf("");
  };
  ChunkError caught("", 0, 0, "no error", true);
  try {
    rt.step(tr.batch(0), fn);
    FAIL("a NaN gradient must fail the step");
  } catch (const ChunkError& e) {
    CHECK(std::string(e.what()).find("not finite") != std::string::npos);
    CHECK(std::string(e.what()).find("'" + tr.model.layout().tensor(1).name + "'") != std::string::npos);
    CHECK(e.can_continue());
    caught = e;
  }
  poison = false;
  CHECK(rt.step(tr.batch(0), fn).samples == tr.batch(0).size());  // the next step runs normally
  return caught;
}

// A simulated device's speed, new at random for each chunk: 0.2 to 2.
std::function<double(std::size_t, std::uint64_t, double)> random_speed() {
  auto rng = std::make_shared<std::mt19937_64>(std::random_device{}());
  auto lock = std::make_shared<std::mutex>();
  return [rng, lock](std::size_t, std::uint64_t, double) {
    const std::lock_guard g(*lock);
    return 0.2 + 1.8 * std::uniform_real_distribution<double>(0, 1)(*rng);
  };
}

}  // namespace

TEST_CASE("FixedPoint.BoundAndWindow") {
  CHECK(detail::fixed_cell_bits(1) == 51);
  CHECK(detail::fixed_cell_bits(2048) == 51);
  CHECK(detail::fixed_cell_bits(2049) == 50);
  CHECK(detail::fixed_cell_bits(4096) == 50);
  CHECK(detail::fixed_cell_bits(std::size_t{1} << 20) == 42);
  const int bits = 51, shift = detail::fixed_shift_for(3, bits);  // cells under 2^3
  CHECK(3 + shift == bits - detail::kHeadroom);
  CHECK(detail::fixed_shift_fits(3, shift, bits));
  CHECK(detail::fixed_shift_fits(3 + detail::kHeadroom, shift, bits));       // grown 2^8-fold: still under the bound
  CHECK_FALSE(detail::fixed_shift_fits(4 + detail::kHeadroom, shift, bits));  // past it: redone
  CHECK(detail::fixed_shift_fits(3 - detail::kSlack, shift, bits));
  CHECK_FALSE(detail::fixed_shift_fits(2 - detail::kSlack, shift, bits));     // shrunk too far: precision lost, redone
  CHECK(detail::fixed_shift_fits(kNoExponent, shift, bits));
  // frexp's exponent: |v| < 2^e.
  std::vector<float> v = {0.75f, -0.5f};
  CHECK(detail::add_cell_fixed(v, kNoExponent, {}).exponent == 0);
  v = {1.0f, 0.0f};
  CHECK(detail::add_cell_fixed(v, kNoExponent, {}).exponent == 1);
  v = {0.0f, -0.0f};
  CHECK(detail::add_cell_fixed(v, kNoExponent, {}).exponent == kNoExponent);
  for (float bad : {std::nanf(""), INFINITY, -INFINITY}) {
    v = {1.0f, bad};
    std::vector<std::int64_t> acc(2, 0);
    CHECK_FALSE(detail::add_cell_fixed(v, 20, acc).finite);
  }
}

TEST_CASE("FixedPoint.SumIsTheSameInAnyOrderAndWithinItsBound") {
  struct Case {
    const char* what;
    double lo, hi;  // decimal exponents of the values
    std::size_t cells;
  };
  for (const Case& c : {Case{"gradients around 1", -3, 0, 64}, Case{"tiny (1e-38 to 1e-30)", -38, -30, 64}, Case{"huge (1e30 to 1e37)", 30, 37, 64},
                        Case{"mixed scales in one tensor (1e-20 to 1e20)", -20, 20, 64}, Case{"many cells", -2, 0, 5000}}) {
    CAPTURE(c.what);
    const auto cells = random_cells(c.cells, 257, c.lo, c.hi, 7);
    const FixedRun one = fixed_sum(cells, 1, 1), four = fixed_sum(cells, 4, 2), many = fixed_sum(cells, 13, 3);
    CHECK(one.sum == four.sum);  // any order, any grouping: the same integers
    CHECK(one.sum == many.sum);
    const double worst = worst_over_bound(cells, one);
    CHECK(worst <= 1.0);
    MESSAGE(std::string(c.what) << ": worst error " << worst << " of the bound");
  }
  // The stated bound against the tensor's largest value: 64 cells at the set point, 2^-(bits - kHeadroom + 1 - 6).
  const auto cells = random_cells(64, 100, -1, 0, 11);
  const FixedRun r = fixed_sum(cells, 1, 1);
  CHECK(64 * std::ldexp(1.0, -r.shift - 1) <= std::ldexp(1.0, -37));  // largest value under 2^0: 2^-(51 - 8 + 1 - 6)
}

TEST_CASE("Deterministic.SameBitsWhateverTheDevicesPolicyMergingSlowdownsAndFaults") {
  const Training tr;
  const Trained ref = tr.run(deterministic("cpu:1", SchedulePolicy::kStatic));
  struct Config {
    const char* what;
    RuntimeOptions o;
    bool lose_device = false;
  };
  std::vector<Config> configs = {
      {"cpu:1 static again", deterministic("cpu:1", SchedulePolicy::kStatic)},
      {"cpu:1 steal", deterministic("cpu:1")},
      {"cpu:2 steal", deterministic("cpu:2")},
      {"cpu:4 steal, slowdowns", deterministic("cpu:4")},
      {"cpu:4 steal, merged steals off", deterministic("cpu:4")},
      {"cpu:3 static", deterministic("cpu:3", SchedulePolicy::kStatic)},
      {"cpu:4 central", deterministic("cpu:4", SchedulePolicy::kCentral)},
      {"sim:1,0.3,2,1 steal, random speeds", deterministic("sim:1,0.3,2,1")},
      {"cpu:3 static, a device lost at step 3", deterministic("cpu:3", SchedulePolicy::kStatic), true},
      {"cpu:2 steal, chunk_size 0 (cells of batch / 16)", deterministic("cpu:2")},
  };
  configs[3].o.host.slowdown = {1, 3, 1, 2};
  configs[4].o.host.slowdown = {1, 3, 1, 2};
  configs[4].o.schedule.merge_stolen = false;
  configs[7].o.sim.speed_factor = random_speed();
  configs[8].o.on_device_failure = OnDeviceFailure::kExclude;  // static: device 1 surely runs its own chunks, and is lost
  configs[9].o.schedule.chunk_size = 0;
  for (Config& c : configs) {
    CAPTURE(c.what);
    std::function<void(Runtime&, std::size_t)> before;
    if (c.lose_device) {
      before = [](Runtime& rt, std::size_t step) {
        if (step == 2) inject_faults(rt, [](std::size_t device, std::uint64_t, ChunkId chunk) { return device == 1 && chunk % 3 == 1 ? Fault::kDeviceLoss : Fault::kNone; });
      };
    }
    const Trained t = tr.run(c.o, before);
    CHECK(t.excluded == (c.lose_device ? 1u : 0u));
    if (c.o.schedule.chunk_size == 0) {
      // Other cells (9 to 11 samples: the batches hold 150 to 184): other bits, the same on any devices.
      RuntimeOptions one = deterministic("cpu:1", SchedulePolicy::kStatic);
      one.schedule.chunk_size = 0;
      CHECK(t.sha == tr.run(one).sha);
      CHECK(t.sha != ref.sha);
      continue;
    }
    CHECK(t.sha == ref.sha);
    CHECK(t.redone == ref.redone);
  }
  CHECK(ref.redone >= 1);  // the first step finds the scale
  MESSAGE("parameters sha256 " << ref.sha << " on every configuration (" << ref.redone << " step(s) redone)");

  // With sample costs (cells of a cost budget), the same across devices and policies too.
  Training costed;
  costed.costs = true;
  const std::string with_costs = costed.run(deterministic("cpu:1", SchedulePolicy::kStatic)).sha;
  CHECK(with_costs != ref.sha);
  CHECK(costed.run(deterministic("cpu:4")).sha == with_costs);
  RuntimeOptions sim = deterministic("sim:2,1,0.5");
  sim.sim.speed_factor = random_speed();
  CHECK(costed.run(sim).sha == with_costs);
}

TEST_CASE("Deterministic.GradientIsTheSequentialOneWithinFloatTolerance") {
  const Training tr;
  const std::vector<float> init = tr.model.initial_parameters(5);
  for (const char* devices : {"cpu:1", "cpu:3"}) {
    Runtime rt(deterministic(devices));
    rt.register_parameters(tr.model.layout(), init);
    std::vector<MlpModel::Workspace> ws(rt.device_count());
    const std::vector<std::uint32_t> b = tr.batch(0);
    const StepReport r = rt.compute_gradient(b, [&](ChunkContext& ctx) {
      ctx.add_loss(tr.model.accumulate_gradient(ctx.params, ctx.grad, tr.syn.data, ctx.samples, ws[ctx.device]));
    });
    CHECK(r.redone == 1);
    const std::vector<float> ref = sequential_mean_gradient(tr.model, init, tr.syn.data, b);
    CHECK(relative_error(rt.gradient(), ref) <= 1e-5);
  }
}

TEST_CASE("Deterministic.DefaultModeIsNotBitIdenticalAcrossDeviceCounts") {
  // What the mode answers: the default float sum depends on how the devices grouped the chunks. (If this ever held,
  // the bit-identity checks above would prove nothing.)
  const Training tr;
  RuntimeOptions one = deterministic("cpu:1", SchedulePolicy::kStatic), four = deterministic("cpu:4", SchedulePolicy::kStatic);
  one.schedule.deterministic = four.schedule.deterministic = false;
  const Trained a = tr.run(one), b = tr.run(four);
  CHECK(a.sha != b.sha);
  CHECK(relative_error(a.params, b.params) <= 1e-3);  // different bits, the same training
}

TEST_CASE("Deterministic.GrowingGradientsRedoTheStepAndStayIdentical") {
  Training tr;
  tr.grow_at = 4096;  // 2^12, past the headroom of 2^8
  const Trained a = tr.run(deterministic("cpu:1")), b = tr.run(deterministic("sim:1,0.5,2"));
  CHECK(a.redone == 2);  // the first step, and the one where the gradients grew
  CHECK(a.sha == b.sha);
  CHECK(b.redone == a.redone);
}

TEST_CASE("Deterministic.ResumedRunEqualsAnUninterruptedOne") {
  const Training tr;
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("sb_det_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::filesystem::path file = dir / "c.safetensors";
  const Trained whole = tr.run(deterministic("cpu:2"));
  // Three steps on cpu:4, saved; three more on sim devices from the file, with the later batches.
  {
    RuntimeOptions o = deterministic("cpu:4");
    o.optimizer = {.kind = OptimizerKind::kAdam, .lr = 0.01f};
    Runtime rt(o);
    rt.register_parameters(tr.model.layout(), tr.model.initial_parameters(5));
    std::vector<MlpModel::Workspace> ws(4);
    for (std::size_t s = 0; s < 3; ++s) {
      rt.step(tr.batch(s), [&](ChunkContext& ctx) { ctx.add_loss(tr.model.accumulate_gradient(ctx.params, ctx.grad, tr.syn.data, ctx.samples, ws[ctx.device])); });
    }
    rt.save_checkpoint(file);
  }
  RuntimeOptions o = deterministic("sim:1,0.4,2");
  o.optimizer = {.kind = OptimizerKind::kAdam, .lr = 0.01f};
  Runtime rt(o);
  rt.register_parameters(tr.model.layout(), tr.model.initial_parameters(5));
  (void)rt.load_checkpoint(file);
  std::vector<MlpModel::Workspace> ws(3);
  std::uint32_t redone = 0;
  for (std::size_t s = 3; s < 6; ++s) {
    redone += rt.step(tr.batch(s), [&](ChunkContext& ctx) {
                   ctx.add_loss(tr.model.accumulate_gradient(ctx.params, ctx.grad, tr.syn.data, ctx.samples, ws[ctx.device]));
                 }).redone;
  }
  const std::vector<float> p = rt.parameters();
  CHECK(sha256_hex(std::as_bytes(std::span<const float>(p))) == whole.sha);
  CHECK(redone == 0);  // the saved shifts: no step to find them again
  std::filesystem::remove_all(dir);
}

TEST_CASE("Deterministic.NonFiniteGradientFailsTheStepNamingTheTensor") {
  const Training tr;
  Runtime rt(deterministic("cpu:2"));
  const ChunkError e = nan_fails_the_step(rt, tr);
  CHECK(e.chunk() == 3);
}

TEST_CASE("Deterministic.ConfigurationsItCannotHonourAreRefused") {
  const auto refused = [](const RuntimeOptions& o) -> std::string {
    try {
      Runtime rt(o);
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "(no ConfigError)";
  };
  RuntimeOptions packed = deterministic("cpu:2");
  packed.schedule.placement = PlacementPolicy::kPacked;
  CHECK(refused(packed).find("placement = packed with deterministic = on") != std::string::npos);
  RuntimeOptions threads = deterministic("cpu:1");
  threads.host.threads_per_device = 2;
  CHECK(refused(threads).find("threads_per_device = 2 with deterministic = on") != std::string::npos);
}

namespace {

// A stand-in for a GPU in deterministic mode: a device with its own replica (not the runtime's shared host copy)
// that rounds its cells itself, as CudaDevice does on the GPU, here with the host's rule on host memory; registered
// as the cuda backend. So the runtime's path for such devices (the hand-over after the chunk phase, the host's sum,
// the load of the float sum, each replica's own update) runs where there is no GPU.
class SelfSummingDevice final : public Device {
 public:
  explicit SelfSummingDevice(std::size_t i) : m_index(i) {}
  std::string name() const override { return "selfsum" + std::to_string(m_index); }
  ChunkTiming run_chunk(ChunkContext& ctx, const ChunkFunction& fn) override {
    fn(ctx);
    return {};
  }
  bool sums_cells_itself() const override { return true; }
  void add_cell_fixed(std::span<const std::size_t> begin, std::span<const int> shift) override {
    if (m_acc.size() != grad().size()) m_acc.assign(grad().size(), 0), m_largest.assign(shift.size(), kNoExponent), m_bad = -1;
    for (std::size_t t = 0; t < shift.size(); ++t) {
      const std::size_t b = begin[t], n = begin[t + 1] - b;
      const detail::CellScan s = detail::add_cell_fixed(grad().subspan(b, n), shift[t], std::span<std::int64_t>(m_acc).subspan(b, n));
      if (!s.finite && m_bad < 0) m_bad = static_cast<long>(t);
      m_largest[t] = std::max(m_largest[t], s.exponent);
    }
  }
  long take_cells_fixed(std::span<std::int64_t> acc, std::span<int> largest) override {
    if (m_acc.empty()) return -1;
    for (std::size_t i = 0; i < m_acc.size(); ++i) acc[i] = static_cast<std::int64_t>(static_cast<std::uint64_t>(acc[i]) + static_cast<std::uint64_t>(m_acc[i]));
    for (std::size_t t = 0; t < largest.size(); ++t) largest[t] = std::max(largest[t], m_largest[t]);
    const long bad = m_bad;
    m_acc.clear();
    return bad;
  }
  void load_grad(std::span<const float> sum) override { std::copy(sum.begin(), sum.end(), grad().begin()); }
  void zero_grad() override {
    Device::zero_grad();
    m_acc.clear();  // a failed or redone attempt's cells
  }

 private:
  std::size_t m_index;
  std::vector<std::int64_t> m_acc;
  std::vector<int> m_largest;
  long m_bad = -1;
};

struct SelfSummingBackend final : DeviceBackend {
  std::size_t count = 1;
  std::size_t available() const noexcept override { return count; }
  std::vector<std::unique_ptr<Device>> make_devices(const DeviceSpec&, const RuntimeOptions&) override {
    std::vector<std::unique_ptr<Device>> out;
    for (std::size_t i = 0; i < count; ++i) out.push_back(std::make_unique<SelfSummingDevice>(i));
    return out;
  }
  std::unique_ptr<Communicator> make_communicator(std::span<Device* const>) override { return std::make_unique<InProcessCommunicator>(); }
};

}  // namespace

TEST_CASE("Deterministic.DevicesThatRoundTheirOwnCellsGiveTheHostsBits") {
  const RestoreCudaBackend restore;
  auto backend = std::make_shared<SelfSummingBackend>();
  register_device_backend(DeviceKind::kCuda, backend);
  const Training tr;
  const Trained host = tr.run(deterministic("cpu:1", SchedulePolicy::kStatic));
  for (std::size_t n : {1, 2, 4}) {
    backend->count = n;
    for (const SchedulePolicy policy : {SchedulePolicy::kSteal, SchedulePolicy::kStatic}) {
      CAPTURE(n);
      CAPTURE(policy == SchedulePolicy::kSteal);
      const Trained t = tr.run(deterministic("cuda:all", policy));
      // The same cells, rounded by the same rule, summed exactly, and the same Adam arithmetic on each replica: the
      // host devices' bits.
      CHECK(t.sha == host.sha);
      CHECK(t.redone == host.redone);
    }
  }
  MESSAGE("parameters sha256 " << host.sha << " on cpu:1 and on 1, 2 and 4 self-summing devices");

  // A value that is not finite, found after the chunk phase: the step fails naming the device and the tensor, and the
  // next one runs.
  backend->count = 2;
  Runtime rt(deterministic("cuda:all"));
  CHECK(std::string(nan_fails_the_step(rt, tr).what()).find("selfsum") != std::string::npos);
}
