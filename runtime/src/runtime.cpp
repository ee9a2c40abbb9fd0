// The Runtime: cut, place, run with stealing, reduce, scale by the true sample count, update every replica.
#include <stealbatch/error.hpp>
#include <stealbatch/runtime/cpu_device.hpp>
#include <stealbatch/runtime/detail/chunk_sizer.hpp>
#include <stealbatch/runtime/detail/cost_profile.hpp>
#include <stealbatch/runtime/detail/speed_shares.hpp>
#include <stealbatch/runtime/runtime.hpp>
#include <stealbatch/runtime/sim_device.hpp>

#include <algorithm>
#include <cmath>
#include <atomic>
#include <cstdio>
#include <exception>
#include <limits>
#include <map>
#include <optional>
#include <mutex>
#include <stdexcept>
#include <thread>

namespace stealbatch {

namespace {

using Clock = std::chrono::steady_clock;

double seconds(std::chrono::nanoseconds d) { return std::chrono::duration<double>(d).count(); }

constexpr std::size_t kStaleAfterIdleSteps = 10;
// Two own chunks in a row that take more than this many times what the device's measured speed predicts mark the
// device as slowed down for the rest of the step (see Scheduler::set_live_factor). Well above the chunk-to-chunk spread of
// real devices (the CPU devices here: 7-28% over a window) and of simulated variable costs (a 16-sample chunk of
// lognormal sigma-1 costs: about 33%), so only a real change of speed trips it.
constexpr double kSlowedDown = 2.0;
// ... and by at least this much (seconds): a chunk of microseconds that took three times as long says nothing about
// the device (a cache miss, a timer read, a context switch); with empty chunks the rule would otherwise trip.
constexpr double kSlowedDownAtLeast = 100e-6;
// The stolen chunks a device's data slowness is the median of (see detail::data_slowness()).
constexpr std::size_t kSlownessWindow = 16;
// The watchdog's mark for a device busy in the reduction or the update rather than in a chunk.
constexpr ChunkId kReductionPhase = ~ChunkId{0};
// A chunk's home device when that device was lost during the step (the chunk counts as moved wherever it ran).
constexpr std::uint32_t kHomeLost = ~std::uint32_t{0};

}  // namespace

// A device's tallies for this step (the replica itself lives in the Device). Aligned so that two devices' tallies
// never share a cache line.
struct alignas(detail::kCacheLine) Runtime::Replica {
  double loss = 0;
  std::uint64_t samples = 0;
  // How long finish_chunks() waited this step for chunks still in flight (a GPU, a simulated device): device time
  // of this step's chunks that the worker's busy time in the chunk phase does not hold.
  Clock::duration finish{};
  Clock::time_point device_end{};  // the end of the device's last chunk this step, on its own timeline (if it keeps one)
  Clock::duration update{};         // its part of the fused update this step (shared host parameters)
  Clock::time_point ready{};        // simulated devices: when it was ready for the AllReduce this step
  Clock::duration ar_wait{};        // simulated devices: how long it slept out the AllReduce for all (0 for all but one)
  double live_factor = 1.0;         // this step: how much slower than measured its own chunks now run (see kSlowedDown)
  double last_ratio = 0.0;          // this step: its last own chunk's time over what its measured speed predicted
  // The stall watchdog's view, written by the device's worker and read by the caller's thread: when the chunk
  // now running started (ns since the runtime's creation; 0 when none runs), and which chunk. Relaxed: a timer
  // that may read a value a moment old, nothing is published through it.
  std::atomic<std::int64_t> chunk_started_ns{0};
  std::atomic<ChunkId> current_chunk{0};
};

namespace {

// Marks a device as busy (in chunk `what`, or kReductionPhase) for the stall watchdog, for the stamp's lifetime.
// Relaxed stores: see Replica.
struct WatchStamp {
  std::atomic<std::int64_t>& started;
  WatchStamp(std::atomic<std::int64_t>& stamp, std::atomic<ChunkId>& chunk, ChunkId what, Clock::time_point since_epoch_of,
             Clock::time_point now = Clock::now())
      : started(stamp) {
    chunk.store(what, std::memory_order_relaxed);
    started.store(std::max<std::int64_t>(1, (now - since_epoch_of).count()), std::memory_order_relaxed);
  }
  ~WatchStamp() { started.store(0, std::memory_order_relaxed); }
  WatchStamp(const WatchStamp&) = delete;
  WatchStamp& operator=(const WatchStamp&) = delete;
};

std::mutex g_backends_mutex;
std::map<DeviceKind, std::shared_ptr<DeviceBackend>>& backends() {
  static std::map<DeviceKind, std::shared_ptr<DeviceBackend>> m;
  return m;
}

}  // namespace

void register_device_backend(DeviceKind kind, std::shared_ptr<DeviceBackend> backend) {
  const std::lock_guard lock(g_backends_mutex);
  backends()[kind] = std::move(backend);
}

std::shared_ptr<DeviceBackend> device_backend(DeviceKind kind) {
  const std::lock_guard lock(g_backends_mutex);
  const auto it = backends().find(kind);
  return it == backends().end() ? nullptr : it->second;
}

SchedulePolicy parse_policy(std::string_view name) {
  if (name == "steal") return SchedulePolicy::kSteal;
  if (name == "static") return SchedulePolicy::kStatic;
  if (name == "central") return SchedulePolicy::kCentral;
  throw ConfigError("policy = '" + std::string(name) + "': expected static, steal or central");
}

Runtime::Runtime(RuntimeOptions options) : m_options(std::move(options)), m_epoch(Clock::now()) {
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  if (m_options.devices.empty()) {
    const auto gpus = device_backend(DeviceKind::kCuda);
    m_options.devices = gpus && gpus->available() > 0 ? "cuda:all" : "cpu:" + std::to_string(std::min(cores, 4u));
  }
  DeviceSpec spec = parse_device_spec(m_options.devices);
  if (m_options.chunk_size > (std::size_t{1} << 20)) {
    throw ConfigError("chunk_size = " + std::to_string(m_options.chunk_size) + "; valid range is [1, 1048576], or 0 for sizes the runtime measures");
  }
  validate(m_options.optimizer);
  if (m_options.in_flight < 1 || m_options.in_flight > 16) {
    throw ConfigError("in_flight = " + std::to_string(m_options.in_flight) + "; valid range is [1, 16]");
  }
  if (!std::isfinite(m_options.sim_launch_lead) || m_options.sim_launch_lead < 0 || m_options.sim_launch_lead > 1) {
    throw ConfigError("sim_launch_lead = " + std::to_string(m_options.sim_launch_lead) + " s; valid range is [0, 1]");
  }
  if (m_options.input_bytes > (std::size_t{1} << 30)) {
    throw ConfigError("input_bytes = " + std::to_string(m_options.input_bytes) + "; valid range is [0, 1073741824]");
  }
  if (m_options.input_bytes > 0 && !m_options.gather) throw ConfigError("input_bytes = " + std::to_string(m_options.input_bytes) + " but no gather function is set");
  std::shared_ptr<DeviceBackend> backend;
  if (spec.kind == DeviceKind::kCuda || spec.kind == DeviceKind::kVgpu) {
    backend = device_backend(spec.kind);
    if (!backend) {
      throw ConfigError("devices = '" + spec.text + "': no CUDA backend is enabled in this program (built without CUDA, or " +
                        "stealbatch::cuda::enable() not called)");
    }
    m_devices = backend->make_devices(spec, m_options);
    spec.count = m_devices.size();
  }
  const std::size_t n = spec.count;
  if (m_options.slowdown.empty()) m_options.slowdown.assign(n, 1.0);
  if (m_options.slowdown.size() != n) {
    throw ConfigError("slowdown has " + std::to_string(m_options.slowdown.size()) + " values; expected one per device (" +
                      std::to_string(n) + ")");
  }
  if (m_options.threads_per_device < 0 || m_options.threads_per_device > 1024) {
    throw ConfigError("threads_per_device = " + std::to_string(m_options.threads_per_device) + "; valid range is [0, 1024] (0 = cores / devices)");
  }
  const int threads = m_options.threads_per_device > 0 ? m_options.threads_per_device
                                                       : std::max(1, static_cast<int>(cores / static_cast<unsigned>(n)));
  for (std::size_t i = 0; i < n; ++i) {
    const double f = m_options.slowdown[i];
    if (!std::isfinite(f) || f < 1.0 || f > 1000.0) {
      throw ConfigError("slowdown[" + std::to_string(i) + "] = " + std::to_string(f) + "; valid range is [1, 1000]");
    }
    if (backend) {
      if (f != 1.0) throw ConfigError("slowdown[" + std::to_string(i) + "] = " + std::to_string(f) + ": only CPU and simulated devices can be slowed down");
    } else if (spec.kind == DeviceKind::kSim) {
      // A simulated device's speed is its spec'd speed divided by its slowdown factor.
      m_devices.push_back(std::make_unique<SimDevice>(i, spec.speeds[i] / f, m_options.sim_sample_seconds, m_options.sim_sample_cost));
      static_cast<SimDevice&>(*m_devices.back()).set_link(m_options.sim_bytes_per_sample, m_options.sim_link_bw, m_options.sim_link_latency);
      static_cast<SimDevice&>(*m_devices.back()).set_in_flight(m_options.in_flight, m_options.sim_launch_lead);
      if (m_options.sim_speed_factor) {
        static_cast<SimDevice&>(*m_devices.back()).set_speed_factor([this, i](std::uint64_t step, double t) {
          return m_options.sim_speed_factor(i, step, t);
        });
      }
    } else {
      m_devices.push_back(std::make_unique<CpuDevice>(i, threads, f));
      // More device threads than cores: each chunk ends with a preemption point (see CpuDevice::run_chunk()).
      static_cast<CpuDevice&>(*m_devices.back()).set_preemption_point(n * static_cast<std::size_t>(threads) > cores);
      static_cast<CpuDevice&>(*m_devices.back()).set_compute_time(m_options.chunk_size == 0);  // for the chunk sizer
    }
    m_replicas.push_back(std::make_unique<Replica>());
  }
  auto check = [](const char* field, double v, double lo, double hi) {
    if (!std::isfinite(v) || v < lo || v > hi) {
      throw ConfigError(std::string(field) + " = " + std::to_string(v) + "; valid range is [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
    }
  };
  check("sim_bytes_per_sample", m_options.sim_bytes_per_sample, 0, 1e9);
  check("sim_link_bw", m_options.sim_link_bw, 1, 1e15);
  check("sim_link_latency", m_options.sim_link_latency, 0, 1);
  check("sim_allreduce_bytes", m_options.sim_allreduce_bytes, 0, 1e12);
  check("sim_busbw", m_options.sim_busbw, 1, 1e15);
  m_is_sim = spec.kind == DeviceKind::kSim;
  m_host_devices = !backend;
  if (m_options.throughput_window < 1 || m_options.throughput_window > 100) {
    throw ConfigError("throughput_window = " + std::to_string(m_options.throughput_window) + "; valid range is [1, 100]");
  }
  if (m_options.placement == PlacementPolicy::kGiven) {
    if (m_options.placement_weights.size() != n) {
      throw ConfigError("placement_weights has " + std::to_string(m_options.placement_weights.size()) + " values; expected one per device (" +
                        std::to_string(n) + ")");
    }
    (void)place_proportional(1, m_options.placement_weights);  // validates: finite, >= 0, not all 0
  }
  m_speed_history.resize(n);
  m_stolen_slowness.resize(n);
  m_chunk_sizer.reset(n);
  m_idle_steps.assign(n, 0);
  m_backend = backend;
  make_communicator();
  if (!m_options.trace_path.empty()) {
    std::vector<std::string> names;
    for (const auto& d : m_devices) names.push_back(d->name());
    m_trace = std::make_unique<TraceWriter>(m_options.trace_path, std::move(names));
  }
  if (!std::isfinite(m_options.stall_timeout) || m_options.stall_timeout <= 0 || m_options.stall_timeout > 86400) {
    throw ConfigError("stall_timeout = " + std::to_string(m_options.stall_timeout) + " s; valid range is (0, 86400]");
  }
  for (std::size_t i = 0; i < n; ++i) m_ids.push_back(i);
  make_scheduler();
}

// The reduction across the devices, and (simulated devices) the ring AllReduce time for their count.
void Runtime::make_communicator() {
  if (m_backend) {
    std::vector<Device*> raw;
    for (const auto& d : m_devices) raw.push_back(d.get());
    m_comm = m_backend->make_communicator(raw);
  } else {
    m_comm = std::make_unique<InProcessCommunicator>();
  }
  const double nd = static_cast<double>(m_devices.size());
  m_sim_allreduce_s = m_is_sim && nd > 1 && m_options.sim_allreduce_bytes > 0
                          ? 2.0 * (nd - 1.0) / nd * m_options.sim_allreduce_bytes / m_options.sim_busbw + m_options.sim_link_latency
                          : 0.0;
}

void Runtime::make_scheduler() {
  SchedulerOptions so;
  so.workers = m_devices.size();
  so.schedule = m_options.policy;
  so.seed = m_options.seed;
  so.on_worker_start = [this](std::size_t w) { m_devices[w]->bind(); };
  m_sched = std::make_unique<Scheduler>(std::move(so));
  // The watchdog looks at the devices' chunk stamps every 1/20 of the timeout (10 to 50 ms).
  const auto period = std::chrono::duration_cast<std::chrono::nanoseconds>(
      std::chrono::duration<double>(std::clamp(m_options.stall_timeout / 20, 0.01, 0.05)));
  m_sched->set_watchdog(period, [this] { return check_stalls(); }, [this] {
    for (auto& d : m_devices) d->cancel();
    m_comm->abort();  // NCCL: ncclCommAbort, so that a collective waiting on a dead peer returns
  });
}

std::exception_ptr Runtime::check_stalls() {
  const std::int64_t now = (Clock::now() - m_epoch).count();
  const auto limit = static_cast<std::int64_t>(m_options.stall_timeout * 1e9);
  for (std::size_t w = 0; w < m_replicas.size(); ++w) {
    const std::int64_t started = m_replicas[w]->chunk_started_ns.load(std::memory_order_relaxed);
    if (started == 0 || now - started <= limit) continue;
    char ms[32];
    std::snprintf(ms, sizeof ms, "%.0f", static_cast<double>(now - started) / 1e6);
    const ChunkId c = m_replicas[w]->current_chunk.load(std::memory_order_relaxed);
    const std::string where = c == kReductionPhase ? "in the reduction or the update" : "in chunk " + std::to_string(c);
    const bool usable = m_comm->survives_abort();
    return std::make_exception_ptr(TimeoutError(
        "device " + m_devices[w]->name() + " made no progress for " + ms + " ms in step " + std::to_string(m_steps + 1) + " (stuck " + where +
        "; stall_timeout = " + std::to_string(m_options.stall_timeout) + " s): the step failed and nothing was applied; its waits were cancelled" +
        (usable ? ", and the runtime can run another step" : " and its communicator aborted: the runtime cannot run another step")));
  }
  return nullptr;
}

void Runtime::learn_pending_observation() noexcept {
  PendingObservation& p = m_pending_observation;
  if (!p.ready) return;
  p.ready = false;  // taken here, not before a run: a run that throws before it gets here keeps the observation
  try {
    m_cost_profile.observe(p.batch, p.devices, p.chunks, p.flat_speeds);
  } catch (...) {  // out of memory: the profile is advice, and starts over
    m_cost_profile.reset();
  }
}

void Runtime::exclude_device(std::size_t position) {
  m_sched.reset();  // joins the workers: they are parked between steps
  m_lost.push_back(std::move(m_devices[position]));
  m_devices.erase(m_devices.begin() + static_cast<std::ptrdiff_t>(position));
  m_replicas.erase(m_replicas.begin() + static_cast<std::ptrdiff_t>(position));
  m_speed_history.erase(m_speed_history.begin() + static_cast<std::ptrdiff_t>(position));
  m_stolen_slowness.erase(m_stolen_slowness.begin() + static_cast<std::ptrdiff_t>(position));
  m_cost_profile.reset();  // indexed by the devices as they were
  m_chunk_sizer.erase(position);
  m_pending_observation.ready = false;
  m_idle_steps.erase(m_idle_steps.begin() + static_cast<std::ptrdiff_t>(position));
  m_ids.erase(m_ids.begin() + static_cast<std::ptrdiff_t>(position));
  if (m_options.placement == PlacementPolicy::kGiven) {
    m_options.placement_weights.erase(m_options.placement_weights.begin() + static_cast<std::ptrdiff_t>(position));
  }
  if (m_devices.empty()) throw Error("runtime: every device was lost; nothing is left to run on");
  make_communicator();
  make_scheduler();
}

Runtime::~Runtime() {
  m_sched.reset();  // workers stop first; then the trace is closed with everything they recorded
  if (m_trace) m_trace->close();
}

void Runtime::register_parameters(ParameterLayout layout, std::span<const float> initial) {
  if (initial.size() != layout.size()) {
    throw ConfigError("register_parameters: " + std::to_string(initial.size()) + " initial values for a layout of " +
                      std::to_string(layout.size()) + " floats");
  }
  m_layout = std::move(layout);
  if (m_host_devices) {
    for (auto& buffer : m_shared_params) buffer.assign(initial.begin(), initial.end());
    m_shared_live = 0;
    m_shared_optimizer = std::make_unique<Optimizer>(m_options.optimizer, initial.size(), /*double_buffered=*/true);
    m_sched->broadcast([&](std::size_t d) { m_devices[d]->share_replica(m_shared_params[0]); });
  } else {
    m_sched->broadcast([&](std::size_t d) { m_devices[d]->init_replica(initial, m_options.optimizer); });
  }
  m_mean_grad.assign(initial.size(), 0.0f);
  m_mean_next.assign(initial.size(), 0.0f);
  m_grads_dirty = false;
}

void Runtime::set_learning_rate(float lr) {
  if (m_layout.size() == 0) throw ConfigError("set_learning_rate: no parameters registered; call register_parameters() first");
  OptimizerOptions check = m_options.optimizer;
  check.lr = lr;
  validate(check);
  m_options.optimizer.lr = lr;
  m_lr_pending = true;
}

std::span<const float> Runtime::parameters(std::size_t device) const {
  m_host_params.resize(m_layout.size());
  Device& d = *m_devices.at(device);
  m_sched->broadcast([&](std::size_t w) {
    if (w == device) d.copy_params(m_host_params);
  });
  return m_host_params;
}

std::vector<double> Runtime::throughput_estimates() const {
  std::vector<double> out;
  for (const auto& h : m_speed_history) {
    if (h.empty()) return {};
    std::vector<double> sorted = h;
    std::nth_element(sorted.begin(), sorted.begin() + static_cast<std::ptrdiff_t>(sorted.size() / 2), sorted.end());
    out.push_back(sorted[sorted.size() / 2]);
  }
  return detail::pooled_speeds(out, m_speed_history);
}

std::uint64_t Runtime::trace_events_dropped() const noexcept { return m_trace ? m_trace->dropped() : 0; }

StepReport Runtime::run_chunks(std::span<const std::uint32_t> samples, const ChunkFunction& fn, Reduce reduce_to) {
  if (samples.empty()) throw ConfigError("batch = 0 samples; a step needs at least 1");
  if (samples.size() > std::numeric_limits<std::uint32_t>::max()) {
    throw ConfigError("batch = " + std::to_string(samples.size()) + " samples; at most 4294967295 per step");
  }
  if (m_layout.size() == 0) throw ConfigError("step: no parameters registered; call register_parameters() first");
  const auto t_start = Clock::now();
  std::size_t n = m_devices.size();
  const bool sized = m_options.chunk_size == 0;  // each device's chunk size from its measured curve (detail::ChunkSizer)
  std::size_t cs = m_options.chunk_size;         // a full chunk (the fastest device's; with sized, the largest own chunk)
  std::vector<double> speeds = throughput_estimates();  // samples/s per device; empty until measured
  if (m_options.placement == PlacementPolicy::kPreviousStep && !speeds.empty()) {
    for (std::size_t d = 0; d < n; ++d) speeds[d] = m_speed_history[d].back();
  }
  bool known = !speeds.empty();
  for (double v : speeds) known = known && std::isfinite(v) && v > 0;
  const bool adaptive = known && ((m_options.placement == PlacementPolicy::kThroughput && m_options.policy == SchedulePolicy::kSteal) ||
                                  m_options.placement == PlacementPolicy::kPreviousStep);
  // Speed-sized chunks, and a share whose end is cut finer: for thieves. A lone device has none, and keeps its chunks
  // whole (fewer launches, larger GEMMs).
  const bool by_speed = adaptive && n > 1 && m_options.policy == SchedulePolicy::kSteal && m_options.chunk_sizing == ChunkSizing::kBySpeed;
  // Positions' costs and devices' speeds learnt apart (detail::CostProfile): where a chunk's time is known when its
  // call returns (host devices), with the policy that places by speed.
  const bool learn_costs = m_host_devices && m_options.cost_by_position && m_options.policy == SchedulePolicy::kSteal &&
                           m_options.placement == PlacementPolicy::kThroughput && m_options.chunk_sizing == ChunkSizing::kBySpeed;
  const bool by_cost = by_speed && learn_costs && m_cost_profile.active(samples.size(), n);
  // Each device's speed in cost units per second: samples/s, or the profile's speeds when placing by cost.
  std::vector<double> rate = speeds;
  if (by_cost) rate.assign(m_cost_profile.speeds().begin(), m_cost_profile.speeds().end());
  // Read only before the chunk phase: the profile learns (and may reallocate its costs) while the chunks run.
  const std::span<const double> position_cost = by_cost ? m_cost_profile.costs() : std::span<const double>{};

  // The chunk table: chunk c covers samples [spans[c].begin, spans[c].begin + spans[c].size).
  std::vector<ChunkSpan>& spans = m_spans;
  spans.clear();
  std::vector<ChunkRange> ranges(n);
  std::vector<double> own_cost(n, static_cast<double>(cs));  // each device's own chunk, in cost units (samples when flat)
  std::vector<std::size_t> own_size(n, cs);   // each device's own chunk this step, in samples
  std::vector<std::uint32_t> share_len(n, 0);  // each device's share this step, in samples
  if (sized) {
    // Shares in samples (by speed or cost once measured, else equal or given), each cut into chunks of its device's
    // size: a rung of its ladder while it explores, its chosen rung after that. Placed by speed with stealing, a
    // share's end is cut finer (detail::cut_share), so the step ends on small chunks whatever the sizes.
    std::vector<std::pair<std::uint32_t, std::uint32_t>> share(n);
    auto set_shares = [&](const std::vector<ChunkRange>& r) {
      for (std::size_t d = 0; d < n; ++d) share[d] = {static_cast<std::uint32_t>(r[d].begin), static_cast<std::uint32_t>(r[d].end)};
    };
    const std::vector<ChunkRange> plain = m_options.placement == PlacementPolicy::kGiven ? place_proportional(samples.size(), m_options.placement_weights)
                                          : adaptive                                     ? place_proportional(samples.size(), rate)
                                                                                         : place_equal(samples.size(), n);
    set_shares(plain);
    for (std::size_t d = 0; d < n; ++d) own_size[d] = m_chunk_sizer.size(d, std::max<std::size_t>(1, plain[d].end - plain[d].begin));
    if (by_speed) {
      for (std::size_t d = 0; d < n; ++d) own_cost[d] = static_cast<double>(own_size[d]);
      const std::vector<double> weights = detail::speed_share_weights(rate, m_speed_history, own_size, samples.size());
      if (by_cost) {
        share = detail::split_by_cost(position_cost, weights);
      } else {
        set_shares(place_proportional(samples.size(), weights));
      }
    }
    // Placed by speed, no device's chunk takes longer than the fastest device's: a slower device's is its own size or
    // the fastest one's scaled to its speed, whichever is smaller. So the step's tail stays about one fast chunk
    // long, and a slower device never holds a core for long at a time (CPU devices on shared cores).
    // Speeds for this compare the devices at a rung both ran (speeds measured while the ladders are explored differ by
    // the rungs' efficiencies), and a device at more than half the fastest one's speed keeps its own size (speeds
    // that differ by noise should not shrink chunks). A capped device stops exploring: it will not run larger chunks.
    if (by_speed) {
      const std::size_t f = static_cast<std::size_t>(std::max_element(rate.begin(), rate.end()) - rate.begin());
      for (std::size_t d = 0; d < n; ++d) {
        const double relative = m_chunk_sizer.relative_speed(d, f);  // compared at a rung both ran
        const auto scaled = static_cast<std::size_t>(std::lround(relative * static_cast<double>(own_size[f])));
        if (relative <= 0 || relative >= 0.5 || scaled >= own_size[d]) continue;
        m_chunk_sizer.stop_exploring(d);
        own_size[d] = std::max<std::size_t>(1, scaled);
      }
    }
    std::vector<std::uint32_t> sizes;
    for (std::size_t d = 0; d < n; ++d) {
      ranges[d].begin = static_cast<ChunkId>(spans.size());
      share_len[d] = share[d].second - share[d].first;
      own_size[d] = std::min<std::size_t>(own_size[d], std::max<std::uint32_t>(1, share_len[d]));
      own_cost[d] = static_cast<double>(own_size[d]);
      sizes.clear();
      if (by_speed && !m_chunk_sizer.exploring(d)) {
        detail::cut_share(share[d].first, share[d].second, own_cost[d], std::max(1.0, own_cost[d] / 4), position_cost, sizes);
      } else {
        for (std::uint32_t at = share[d].first; at < share[d].second; at += static_cast<std::uint32_t>(own_size[d])) {
          sizes.push_back(static_cast<std::uint32_t>(std::min<std::size_t>(own_size[d], share[d].second - at)));
        }
      }
      std::uint32_t at = share[d].first;
      for (std::uint32_t size : sizes) spans.push_back({at, size}), at += size;
      ranges[d].end = static_cast<ChunkId>(spans.size());
    }
    cs = *std::max_element(own_size.begin(), own_size.end());
  } else if (by_speed) {
    // Samples in proportion to speed, and chunks sized to it: a device at a sixth of the fastest one's speed
    // gets a sixth of the samples in chunks a sixth as large, so its chunks take about as long as anyone's and
    // the step's tail stays about one fast chunk long. Placed by cost, the same in cost units: a device's share is
    // its part of the batch's cost, and a chunk where samples cost twice the mean holds half the samples.
    const double fastest = *std::max_element(rate.begin(), rate.end());
    std::vector<std::size_t> size_of(n);
    for (std::size_t d = 0; d < n; ++d) {
      size_of[d] = std::max<std::size_t>(1, static_cast<std::size_t>(std::lround(static_cast<double>(cs) * rate[d] / fastest)));
      own_cost[d] = by_cost ? static_cast<double>(cs) * rate[d] / fastest : static_cast<double>(size_of[d]);
      own_size[d] = size_of[d];
    }
    // Plus a margin for slower devices whose speed is uncertain (see speed_share_weights()).
    const std::vector<double> weights = detail::speed_share_weights(rate, m_speed_history, size_of, samples.size());
    std::vector<std::pair<std::uint32_t, std::uint32_t>> share(n);
    if (by_cost) {
      share = detail::split_by_cost(position_cost, weights);
    } else {
      const std::vector<ChunkRange> r = place_proportional(samples.size(), weights);
      for (std::size_t d = 0; d < n; ++d) share[d] = {r[d].begin, r[d].end};
    }
    std::vector<std::uint32_t> sizes;
    for (std::size_t d = 0; d < n; ++d) {
      ranges[d].begin = static_cast<ChunkId>(spans.size());
      // Full chunks until the share's end, which is cut finer (detail::kTailChunks): the owner ends its share, and
      // thieves (who take from the high end) start, on small chunks, so the step's tail is a fraction of a chunk
      // instead of a whole one, at the cost of a few more chunks per device (down to a quarter chunk). With the halves
      // of the last two chunks only, varcost at 4 devices was 0.956-0.963 (0.941-0.950 with none); see kTailChunks.
      const double floor = by_cost ? own_cost[d] / 4 : static_cast<double>(std::max<std::size_t>(1, size_of[d] / 4));
      sizes.clear();
      detail::cut_share(share[d].first, share[d].second, own_cost[d], floor, position_cost, sizes);
      std::uint32_t at = share[d].first;
      for (std::uint32_t size : sizes) spans.push_back({at, size}), at += size;
      ranges[d].end = static_cast<ChunkId>(spans.size());
    }
  } else {
    for (std::size_t at = 0; at < samples.size(); at += cs) {
      spans.push_back({static_cast<std::uint32_t>(at), static_cast<std::uint32_t>(std::min(cs, samples.size() - at))});
    }
    if (m_options.placement == PlacementPolicy::kGiven) {
      ranges = place_proportional(spans.size(), m_options.placement_weights);
    } else {
      ranges = adaptive ? place_proportional(spans.size(), speeds) : place_equal(spans.size(), n);
    }
  }
  const std::size_t chunks = spans.size();
  // Each chunk's cost in the units of `rate`: its samples, or the sum of its positions' costs.
  std::vector<double> chunk_cost(spans.size());
  for (std::size_t c = 0; c < spans.size(); ++c) {
    double cost = static_cast<double>(spans[c].size);
    if (by_cost) {
      cost = 0;
      for (std::uint32_t x = spans[c].begin; x < spans[c].begin + spans[c].size; ++x) cost += position_cost[x];
    }
    chunk_cost[c] = cost;
  }
  bool watch_speed = false;
  // The scheduler's end game: each device's expected time for one of its own chunks, and for a stolen one (at
  // most a full-size chunk).
  if (known && m_options.endgame == EndGame::kOn) {
    std::vector<double> own(n), stolen(n);
    for (std::size_t d = 0; d < n; ++d) {
      // A device's samples/s mixes its speed with the cost of the samples placed on it. When the chunks taken from
      // its share ran as slowly on other devices as on it (the batch costs more where its share lies, as when
      // data is sorted by length), it is not a slow device: a chunk it steals from elsewhere costs it what it
      // costs them. Its measured speed times that slowness (the median of the last stolen chunks) is then its
      // speed for the end game, so it keeps taking work instead of idling as a "slow" device. Placed by cost, the
      // speeds are already apart from the costs.
      const double slowness = by_cost ? 1.0 : detail::data_slowness(m_stolen_slowness[d]);
      own[d] = own_cost[d] / rate[d];
      stolen[d] = std::max(own[d], static_cast<double>(cs) / (rate[d] * slowness));
    }
    m_sched->set_chunk_costs(std::move(own), std::move(stolen));
    // A device whose own chunks take far longer than its measured speed says has slowed down in this step (a
    // throttled GPU, a device that lost speed mid-step): the end game then weighs its chunks at what they take now.
    // Only where a chunk's time is known when its call returns: host devices and simulated ones (their timeline).
    watch_speed = m_host_devices;
  } else {
    m_sched->set_chunk_costs({});
  }
  std::vector<std::uint32_t> home(chunks);  // where each chunk was placed, to count the ones that moved
  for (std::size_t d = 0; d < n; ++d) {
    for (ChunkId c = ranges[d].begin; c < ranges[d].end; ++c) home[c] = static_cast<std::uint32_t>(d);
  }
  std::vector<std::uint32_t> ran_on(chunks);
  std::vector<float> stolen_ratio(watch_speed ? chunks : 0, 0.0f);  // a stolen chunk's time over what its thief's speed predicts
  std::vector<double> took_s(learn_costs ? chunks : 0, 0.0);  // each chunk's time on its device, for the cost profile
  std::vector<double> compute_s(sized ? chunks : 0, 0.0);  // ... its compute time where the device knows it, for the sizer
  std::vector<std::uint8_t> runs(chunks, 0);  // each chunk's run count: the exactly-once check, chunk by chunk

  if (m_grads_dirty) {  // after compute_gradient() or a failed step; a completed step() leaves them zeroed
    m_sched->broadcast([&](std::size_t d) { m_devices[d]->zero_grad(); });
  }
  for (auto& r : m_replicas) r->loss = 0, r->samples = 0, r->device_end = {}, r->live_factor = 1.0, r->last_ratio = 0.0, r->ar_wait = {};
  m_grads_dirty = true;

  std::size_t largest = 0;
  for (const ChunkSpan& c : spans) largest = std::max<std::size_t>(largest, c.size);
  for (auto& d : m_devices) d->reset_cancel(), d->begin_step(m_steps + 1, t_start), d->reserve(largest);
  const std::uint64_t step_no = m_steps + 1;
  auto run_one = [&](std::size_t w, ChunkId c) {
    Replica& r = *m_replicas[w];
    Device& dev = *m_devices[w];
    ChunkContext ctx;
    ctx.device = w;
    ctx.chunk = c;
    ctx.home_device = home[c];
    ctx.samples = samples.subspan(spans[c].begin, spans[c].size);
    ctx.params = dev.params();
    ctx.grad = dev.grad();
    ctx.owner = &dev;
    ctx.layout = &m_layout;
    ctx.loss_sum = &r.loss;
    const auto t0 = Clock::now();
    const WatchStamp stamp(r.chunk_started_ns, r.current_chunk, c, m_epoch, t0);
    try {
      const Fault fault = m_options.inject_fault ? m_options.inject_fault(m_ids[w], step_no, c) : Fault::kNone;
      if (fault == Fault::kDeviceLoss) throw DeviceLostError(dev.name(), w, step_no, c, "injected fault");
      if (fault == Fault::kThrow) throw std::runtime_error("injected fault: the chunk function threw");
      if (fault == Fault::kStall) {
        dev.sleep_until_or_cancel(Clock::time_point::max());  // never completes on its own
        throw std::runtime_error("injected stall, cancelled by the watchdog");
      }
      dev.run_chunk(ctx, fn);
    } catch (const DeviceLostError& e) {
      if (m_options.on_device_failure == OnDeviceFailure::kExclude) throw;  // run_chunks() drops the device and re-runs its chunks
      std::throw_with_nested(ChunkError(dev.name(), step_no, c, e.what(), false));
    } catch (const std::exception& e) {
      const bool gpu_error = dynamic_cast<const CudaError*>(&e) != nullptr || dynamic_cast<const NcclError*>(&e) != nullptr;
      std::throw_with_nested(ChunkError(dev.name(), step_no, c, e.what(), !gpu_error));
    } catch (...) {
      std::throw_with_nested(ChunkError(dev.name(), step_no, c, "a non-standard exception", true));
    }
    r.samples += ctx.samples.size();
    ran_on[c] = static_cast<std::uint32_t>(w);
    ++runs[c];
    const bool own = ctx.device_end != Clock::time_point{};  // the device's timeline, when it keeps one
    if (own) r.device_end = std::max(r.device_end, ctx.device_end);
    // The chunk's span: on the device's timeline when it keeps one, else the worker's call (read once, for both uses).
    const auto begin = own ? ctx.device_begin : t0;
    const auto end = own ? ctx.device_end : (watch_speed || !took_s.empty() || !compute_s.empty() || m_trace ? Clock::now() : t0);
    const double took = seconds(end - begin);
    if (!took_s.empty()) took_s[c] = took;
    if (!compute_s.empty()) compute_s[c] = ctx.compute_seconds > 0 ? ctx.compute_seconds : took;
    if (watch_speed) {
      // The factor from its own chunks only: a stolen one may hold samples of another cost (another device's
      // share of a batch whose cost varies by position), which says nothing about this device's speed.
      const double ratio = took * rate[w] / chunk_cost[c];
      if (home[c] != w) stolen_ratio[c] = static_cast<float>(ratio);
      if (home[c] == w) {
        // Two in a row: one slow chunk is as often a chunk that lost its core for a while (four CPU devices on two
        // cores: 5-7 single chunks an epoch at 2.6-6.4x in the demo) as a device that slowed down.
        const bool slow = ratio > kSlowedDown && took * (1.0 - 1.0 / ratio) > kSlowedDownAtLeast;  // took - expected
        r.live_factor = slow && r.last_ratio > kSlowedDown ? std::min(ratio, r.last_ratio) : 1.0;
        r.last_ratio = slow ? ratio : 0.0;
      }
      // With chunks in flight, the next one starts only when those are done.
      m_sched->set_live_factor(w, r.live_factor, dev.queued_seconds());
    }
    if (m_trace) {
      m_trace->push(w, {static_cast<std::uint32_t>(m_ids[w]), c, (begin - m_epoch).count(), (end - m_epoch).count(), 0});
    }
  };
  StepStats st;
  std::vector<std::string> excluded;
  std::uint64_t rerun = 0;
  try {
    // Simulated devices: the profile learns from the last step while this one's chunks run, off the step's
    // critical path (it was 0.14 ms a step on the caller's thread at 8192 samples and 32 devices, 0.8% of
    // stealbench's seed-skew step there). This step is placed by what the profile knew before it, so it switches
    // on one step later than if it learnt between steps.
    std::function<void()> learn;
    if (m_pending_observation.ready) learn = [this] { learn_pending_observation(); };
    st = m_sched->run(ranges, run_one, learn);
  } catch (const DeviceLostError& lost) {
    // on_device_failure = exclude: drop the device, then re-run on the survivors what it had run this step (its
    // gradient buffer leaves the reduction) and what nobody ran; again if another device is lost meanwhile.
    std::optional<DeviceLostError> pending(lost);
    while (pending) {
      const std::size_t dead = pending->index();
      excluded.push_back(pending->device());
      pending.reset();
      watch_speed = false;  // the speeds are indexed by the devices as they were
      exclude_device(dead);
      n = m_devices.size();
      std::vector<ChunkId> redo;
      for (std::size_t c = 0; c < chunks; ++c) {
        if (runs[c] != 0 && ran_on[c] == dead) runs[c] = 0;
        if (runs[c] == 0) {
          redo.push_back(static_cast<ChunkId>(c));
          continue;
        }
        if (ran_on[c] > dead) --ran_on[c];
        if (home[c] == dead) {
          home[c] = kHomeLost;  // placed on the lost device and run elsewhere: it moved
        } else if (home[c] != kHomeLost && home[c] > dead) {
          --home[c];
        }
      }
      rerun += redo.size();
      std::vector<std::vector<ChunkId>> lists(n);
      const std::vector<ChunkRange> share = place_equal(redo.size(), n);
      for (std::size_t w = 0; w < n; ++w) {
        for (std::size_t i = share[w].begin; i < share[w].end; ++i) lists[w].push_back(redo[i]), home[redo[i]] = static_cast<std::uint32_t>(w);
      }
      for (auto& d : m_devices) d->reset_cancel();
      try {
        st = m_sched->run(lists, run_one);
      } catch (const DeviceLostError& again) {
        pending.emplace(again);
      }
    }
  }
  const auto t_chunks = Clock::now();
  for (std::size_t c = 0; c < chunks; ++c) {
    if (runs[c] != 1) {
      throw std::logic_error("runtime: chunk " + std::to_string(c) + " ran " + std::to_string(runs[c]) + " times in step " +
                             std::to_string(m_steps + 1) + ": exactly-once violated");
    }
  }

  std::vector<float*> bufs(n);
  for (std::size_t d = 0; d < n; ++d) bufs[d] = m_devices[d]->grad().data();
  const float scale = 1.0f / static_cast<float>(samples.size());
  const bool update = reduce_to == Reduce::kUpdate, sliced = reduce_to != Reduce::kSum;
  if (update && m_lr_pending) m_shared_optimizer->set_lr(m_options.optimizer.lr), m_lr_pending = false;  // set since the last update
  m_ar_arrived.store(0, std::memory_order_relaxed);  // published to the workers by the broadcast that follows
  const StepStats reduce = m_sched->broadcast([&](std::size_t d) {
    Device& dev = *m_devices[d];
    const WatchStamp stamp(m_replicas[d]->chunk_started_ns, m_replicas[d]->current_chunk, kReductionPhase, m_epoch);  // the watchdog covers the reduction too
    const auto f0 = Clock::now();
    dev.finish_chunks();  // chunks still in flight (GPU, simulated device)
    m_replicas[d]->finish = Clock::now() - f0;
    m_replicas[d]->loss += dev.take_device_loss();
    dev.set_sample_count(m_replicas[d]->samples);
    const std::size_t count = m_layout.size();
    if (sliced) {
      // Slice d of every device's gradient is complete (the chunk phase is over, and a host device's chunks write
      // their gradient before their call returns), and no other device touches slice d: sum it, write slice d of
      // the next parameters (and optimizer state) from it, and zero it in every buffer for the next step. No
      // device waits for another, so the reduction and the update are one phase, and the update is done once,
      // not once a device. step() switches to the next parameters once every device has done its slice.
      InProcessCommunicator::sum_slice(d, bufs, count);
    } else {
      m_comm->allreduce_sum(d, bufs, count);
    }
    if (m_sim_allreduce_s > 0) {
      // The ring model: the AllReduce starts when the last device is ready and ends the same time later for all.
      // One worker sleeps it out for all, the last to get here; the others go on with their slices. (Every worker
      // sleeping to the same instant woke them all at once: stealbench hetero at 64 devices on two cores read
      // 0.943-0.953 that way, 0.962 this way, interleaved; no difference beyond noise at 32.)
      // acq_rel: each worker's ready time, written before its increment, is visible to the worker whose increment
      // is the last one (a release sequence on one counter); a step that fails before it is never the last.
      // Ready: when the worker issued its part (the reduction phase reached it) or its last chunk ended on the
      // device's timeline, whichever is later, as a GPU stream starts a collective queued behind a kernel; not
      // when a worker woke from waiting for that chunk (a host thread's lateness, not the device's).
      m_replicas[d]->ready = std::max(f0, m_replicas[d]->device_end);
      if (m_ar_arrived.fetch_add(1, std::memory_order_acq_rel) + 1 == m_devices.size()) {
        Clock::time_point latest{};
        for (const auto& r : m_replicas) latest = std::max(latest, r->ready);
        const auto s0 = Clock::now();
        // Ended on time: a timed sleep's oversleep (a median 58 us a step at 32 devices here; 2.8 us this way) is
        // the host's lateness, not the ring's.
        dev.sleep_precisely_until_or_cancel(
            latest + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(m_sim_allreduce_s)));
        m_replicas[d]->ar_wait = Clock::now() - s0;
      }
    }
    if (sliced) {
      const auto u0 = Clock::now();
      const auto [b, e] = InProcessCommunicator::slice(d, n, count);
      if (update) {
        m_shared_optimizer->update_into(m_shared_params[m_shared_live], m_shared_params[1 - m_shared_live], std::span<const float>(bufs[0], count),
                                        scale, b, e);
      } else {
        for (std::size_t i = b; i < e; ++i) m_mean_next[i] = bufs[0][i] * scale;  // compute_gradient() swaps it in on success
      }
      for (float* g : bufs) std::fill(g + b, g + e, 0.0f);
      m_replicas[d]->update = Clock::now() - u0;
    }
  });
  m_comm->allreduce_all(bufs, m_layout.size());  // a collective issued from one thread (NCCL's group call)
  const auto t_reduced = Clock::now();

  StepReport rep;
  rep.step = ++m_steps;
  rep.chunks_s = seconds(t_chunks - t_start);
  rep.reduce_s = seconds(t_reduced - t_chunks);
  rep.samples = samples.size();
  rep.chunks = chunks;
  double loss = 0;
  rep.devices.resize(n);
  for (std::size_t d = 0; d < n; ++d) {
    const WorkerCounters& wc = st.workers[d];
    DeviceReport& dr = rep.devices[d];
    dr.name = m_devices[d]->name();
    // The device's time for its chunks: its own figure when it keeps one (chunks in flight), else its worker's busy
    // time in the chunk phase plus the wait in finish_chunks() for what was still in flight when that phase ended
    // (without it a device with K chunks in flight looks faster the fewer chunks it ran).
    const std::optional<double> own = m_devices[d]->step_device_seconds();
    const double finish_s = seconds(m_replicas[d]->finish);
    const double chunks_s = own ? *own : seconds(wc.busy) + finish_s;
    // Busy: its chunks and the rest of its part of the AllReduce (as a GPU's utilization counts its NCCL kernels).
    // A simulated device's AllReduce counts once for every device, whichever worker slept it out.
    dr.busy_s = chunks_s + std::max(0.0, seconds(reduce.workers[d].busy) - finish_s - seconds(m_replicas[d]->ar_wait)) + m_sim_allreduce_s;
    // Waiting for the others: from its last chunk's end (on the device's own timeline when it keeps one, where
    // the last chunk may end after the worker's last call returned) to the end of the chunk phase.
    if (wc.chunks_run == 0) {
      dr.barrier_wait_s = seconds(st.wall);
    } else if (m_replicas[d]->device_end != Clock::time_point{}) {
      dr.barrier_wait_s = std::max(0.0, seconds(t_chunks - m_replicas[d]->device_end));
    } else {
      dr.barrier_wait_s = std::max(0.0, seconds(st.wall - wc.last_end));
    }
    dr.chunks_run = wc.chunks_run;
    dr.samples = m_replicas[d]->samples;
    dr.chunk_samples = own_size[d];
    // A GPU's chunks run asynchronously, and its worker's calls do not time them: while it explores, the step does.
    if (sized && excluded.empty() && !m_host_devices) m_chunk_sizer.observe_step(d, dr.samples, chunks_s);
    loss += m_replicas[d]->loss;
    auto& h = m_speed_history[d];
    if (!excluded.empty()) {
      // A step with a re-run round: the counters cover that round only; the next step measures again.
    } else if (chunks_s > 0 && dr.samples > 0) {
      if (h.size() >= m_options.throughput_window) h.erase(h.begin(), h.end() - static_cast<std::ptrdiff_t>(m_options.throughput_window - 1));
      h.push_back(static_cast<double>(dr.samples) / chunks_s);
      m_idle_steps[d] = 0;
    } else if (++m_idle_steps[d] >= kStaleAfterIdleSteps) {
      // A device that runs nothing gets no fresh figure, and a wrong low one (a slow first step, a passing
      // stall) would keep it idle for good: few chunks placed, every chunk declined in the end game. After a
      // while, forget it; the next step splits equally and measures every device again.
      h.clear();
      m_idle_steps[d] = 0;
    }
  }
  if (sized && excluded.empty()) {
    if (m_host_devices) {
      for (std::size_t c = 0; c < chunks; ++c) m_chunk_sizer.observe_chunk(ran_on[c], spans[c].size, compute_s[c]);
    }
    for (std::size_t d = 0; d < n; ++d) m_chunk_sizer.end_step(d, share_len[d]);
  }
  if (learn_costs && excluded.empty()) {
    // Learnt from during the next step's chunk phase (above). speeds: samples/s as this step began, the flat model.
    PendingObservation& p = m_pending_observation;
    p.chunks.resize(chunks);
    for (std::size_t c = 0; c < chunks; ++c) p.chunks[c] = {spans[c].begin, spans[c].size, ran_on[c], took_s[c]};
    p.flat_speeds = speeds;
    p.batch = samples.size(), p.devices = n, p.ready = true;
    // Simulated devices sleep through their chunks, so the cores are free while the next step runs: it learns then
    // (above). CPU devices compute on those cores, and learning then took a core from one of them (chunk_overhead,
    // cpu:2: 0.23-0.27 -> 0.34 us a chunk, and a device that looks slower for it): they learn now, between steps.
    if (!m_is_sim) learn_pending_observation();
  }
  rep.placed_by_cost = by_cost;
  for (std::size_t c = 0; c < chunks; ++c) {
    // (Placed by cost, the ratios are against chunk costs, about 1: not the samples/s ratios this window holds.)
    if (!stolen_ratio.empty() && excluded.empty() && !by_cost && ran_on[c] != home[c] && stolen_ratio[c] > 0) {
      std::vector<double>& h = m_stolen_slowness[home[c]];
      if (h.size() >= kSlownessWindow) h.erase(h.begin());
      h.push_back(stolen_ratio[c]);
    }
    if (ran_on[c] != home[c]) {
      ++rep.steals, ++rep.devices[ran_on[c]].chunks_stolen;
      if (m_is_sim) rep.bytes_moved += m_options.sim_bytes_per_sample * spans[c].size;
    }
  }
  rep.loss = loss / static_cast<double>(samples.size());
  rep.excluded_devices = std::move(excluded);
  rep.rerun_chunks = rerun;
  if (m_trace) {
    // Each device's wait for the others, from its last chunk to the barrier: the end of the chunk phase, or the end
    // of the last chunk still in flight then (on a device with its own timeline), whichever is later.
    Clock::time_point barrier = t_chunks;
    for (std::size_t d = 0; d < n; ++d) barrier = std::max(barrier, std::min(m_replicas[d]->device_end, t_reduced));
    for (std::size_t d = 0; d < n; ++d) {
      const auto from = std::max(t_start + (st.workers[d].chunks_run > 0 ? st.workers[d].last_end : std::chrono::nanoseconds(0)),
                                 std::min(m_replicas[d]->device_end, barrier));
      m_trace->add({static_cast<std::uint32_t>(m_ids[d]), 0, (from - m_epoch).count(), (barrier - m_epoch).count(), 3});
    }
    m_trace->add({static_cast<std::uint32_t>(m_ids.size() + m_lost.size()), 0, (t_chunks - m_epoch).count(), (t_reduced - m_epoch).count(), 1});
  }
  return rep;
}

namespace {

void finish(StepReport& rep, Clock::time_point t_start) {
  rep.step_s = seconds(Clock::now() - t_start);
  for (DeviceReport& d : rep.devices) {
    d.idle_s = std::max(0.0, rep.step_s - d.busy_s);
    d.utilization = rep.step_s > 0 ? d.busy_s / rep.step_s : 0;
  }
}

}  // namespace

StepReport Runtime::compute_gradient(std::span<const std::uint32_t> samples, const ChunkFunction& fn) {
  const auto t0 = Clock::now();
  // The full-batch mean: the sum over every sample divided by the true sample count (a partial last chunk weighs
  // what it holds), never a mean of per-device means.
  if (m_host_devices) {
    // Host devices write the mean slice by slice in the reduction phase and zero their buffers there.
    StepReport rep = run_chunks(samples, fn, Reduce::kMean);
    m_mean_grad.swap(m_mean_next);  // only now: after a failed step gradient() still holds the last one
    m_grads_dirty = false;
    finish(rep, t0);
    if (m_trace) m_trace->drain();
    return rep;
  }
  StepReport rep = run_chunks(samples, fn, Reduce::kSum);
  const float scale = 1.0f / static_cast<float>(samples.size());
  // One phase: device 0 hands over the sum, and every device zeroes its buffer for the next step (which then
  // needs no zeroing phase of its own).
  m_sched->broadcast([&](std::size_t d) {
    if (d == 0) m_devices[0]->copy_grad(m_mean_grad);
    m_devices[d]->zero_grad();
  });
  m_grads_dirty = false;
  for (float& g : m_mean_grad) g *= scale;
  finish(rep, t0);
  if (m_trace) m_trace->drain();
  return rep;
}

StepReport Runtime::step(std::span<const std::uint32_t> samples, const ChunkFunction& fn) {
  const auto t0 = Clock::now();
  if (m_shared_optimizer) {
    // Host devices: the update is part of the reduction phase (see run_chunks); its figure is the longest
    // device's part of it.
    StepReport rep = run_chunks(samples, fn, Reduce::kUpdate);
    m_shared_optimizer->commit();
    m_shared_live = 1 - m_shared_live;
    for (auto& d : m_devices) d->set_shared_params(m_shared_params[m_shared_live]);
    Clock::duration longest{};
    for (const auto& r : m_replicas) longest = std::max(longest, r->update);
    rep.optimizer_s = seconds(longest);
    rep.reduce_s = std::max(0.0, rep.reduce_s - rep.optimizer_s);
    m_grads_dirty = false;  // every slice of every buffer was zeroed after its update
    finish(rep, t0);
    if (m_trace) m_trace->drain();
    return rep;
  }
  StepReport rep = run_chunks(samples, fn, Reduce::kSum);
  const auto t_opt = Clock::now();
  // Each device's worker updates its own replica from its copy of the summed gradient, scaled by 1 / the true
  // sample count: the same update on the same values in the same order, so the replicas stay identical. Then it
  // zeroes the gradient for the next step. A learning rate set since the last update is taken here.
  const float scale = 1.0f / static_cast<float>(samples.size());
  const bool new_lr = m_lr_pending;
  const StepStats opt = m_sched->broadcast([&](std::size_t d) {
    const WatchStamp stamp(m_replicas[d]->chunk_started_ns, m_replicas[d]->current_chunk, kReductionPhase, m_epoch);  // a GPU's update waits on NCCL's kernels
    if (new_lr) m_devices[d]->set_lr(m_options.optimizer.lr);
    m_devices[d]->apply_update(scale);
  });
  m_lr_pending = false;
  for (std::size_t d = 0; d < rep.devices.size(); ++d) rep.devices[d].busy_s += seconds(opt.workers[d].busy);
  m_grads_dirty = false;
  const auto t_end = Clock::now();
  rep.optimizer_s = seconds(t_end - t_opt);
  if (m_trace) {
    m_trace->add({static_cast<std::uint32_t>(m_ids.size() + m_lost.size()), 0, (t_opt - m_epoch).count(), (t_end - m_epoch).count(), 2});
    m_trace->drain();
  }
  finish(rep, t0);
  return rep;
}

}  // namespace stealbatch
