// The Runtime: its devices, scheduler and communicator, and step() and compute_gradient() from top to bottom.
#include "reduction/reduction.hpp"
#include "step/runtime_impl.hpp"

#include <stealbatch/cores.hpp>
#include <stealbatch/error.hpp>
#include <stealbatch/runtime/detail/agreement.hpp>

#include <algorithm>
#include <cstdio>
#include <thread>

namespace stealbatch {

std::unique_ptr<Communicator> DeviceBackend::make_cluster_communicator(std::span<Device* const>, Cluster&, std::size_t, std::size_t) {
  throw ConfigError("cluster: these devices cannot reduce across ranks");
}

SchedulePolicy parse_policy(std::string_view name) {
  if (name == "steal") return SchedulePolicy::kSteal;
  if (name == "static") return SchedulePolicy::kStatic;
  if (name == "central") return SchedulePolicy::kCentral;
  throw ConfigError("policy = '" + std::string(name) + "': expected static, steal or central");
}

namespace {

// The devices a spec names, from its kind's backend; an empty spec means every GPU if there is one, else one CPU
// device per core, up to 4.
std::string default_devices() {
  const auto gpus = device_backend(DeviceKind::kCuda);
  if (gpus && gpus->available() > 0) return "cuda:all";
  return "cpu:" + std::to_string(std::min(usable_cores(), 4u));
}

std::shared_ptr<DeviceBackend> backend_for(const DeviceSpec& spec) {
  std::shared_ptr<DeviceBackend> b = device_backend(spec.kind);
  if (!b) {
    throw ConfigError("devices = '" + spec.text + "': no CUDA backend is enabled in this program (built without CUDA, or " +
                      "stealbatch::cuda::enable() not called)");
  }
  return b;
}

}  // namespace

// What the ranks of a job must share: the options that shape a step (how chunks are cut, placed, stolen and ended,
// the optimizer), then the trainer's own (RuntimeOptions::cluster.agree_on). Not the devices, which each rank has its own of.
static detail::AgreementFields agreement_fields(const RuntimeOptions& o) {
  const auto num = [](double v) {
    char b[32];
    std::snprintf(b, sizeof b, "%.9g", v);
    return std::string(b);
  };
  detail::AgreementFields f{{"policy", std::to_string(static_cast<int>(o.schedule.policy))},
                            {"placement", std::to_string(static_cast<int>(o.schedule.placement))},
                            {"endgame", std::to_string(static_cast<int>(o.schedule.endgame))},
                            {"chunk_sizing", std::to_string(static_cast<int>(o.schedule.chunk_sizing))},
                            {"chunk_size", std::to_string(o.schedule.chunk_size)},
                            {"merge_stolen", o.schedule.merge_stolen ? "on" : "off"},
                            {"cost_by_position", o.schedule.cost_by_position ? "on" : "off"},
                            {"throughput_window", std::to_string(o.schedule.throughput_window)},
                            {"optimizer", std::to_string(static_cast<int>(o.optimizer.kind))},
                            {"optimizer lr", num(o.optimizer.lr)},
                            {"optimizer momentum", num(o.optimizer.momentum)},
                            {"optimizer betas", num(o.optimizer.beta1) + "," + num(o.optimizer.beta2)},
                            {"optimizer eps", num(o.optimizer.eps)},
                            {"optimizer weight_decay", num(o.optimizer.weight_decay)},
                            {"stall_timeout", num(o.stall_timeout)},
                            {"heartbeat_timeout", num(o.cluster.heartbeat_timeout)},
                            {"cluster probes", std::to_string(o.cluster.probes)},
                            {"cluster wire", o.cluster.wire == WireFormat::kBfloat16 ? "bf16" : "float32"},
                            {"on_device_failure", std::to_string(static_cast<int>(o.on_device_failure))},
                            {"deterministic", o.schedule.deterministic ? "on" : "off"}};
  for (const auto& field : o.cluster.agree_on) f.push_back(field);
  return f;
}

Runtime::Impl::Impl(RuntimeOptions o)
    : options(std::move(o)),
      cluster({options, dev, costs, exact, epoch, steps}),
      epoch(Clock::now()),
      planner(options, dev, speed, costs, cluster),
      runner({options, dev, layout, exact, sched, trace, inject_fault, epoch, steps}) {
  if (options.devices.empty()) options.devices = default_devices();
  validate(options);
  // What kAuto means: placement by measured speed where thieves balance what it misplaces, an equal split without.
  if (options.schedule.placement == PlacementPolicy::kAuto) {
    options.schedule.placement = options.schedule.policy == SchedulePolicy::kSteal ? PlacementPolicy::kThroughput : PlacementPolicy::kEqual;
  }
  const DeviceSpec spec = parse_device_spec(options.devices);
  DeviceSpec resolved = spec;
  if (options.cluster.job) {
    cluster.join(options.cluster.job, resolved, options.host);  // cluster_step.cpp: every rank's device count; slowdown, threads, cuda:local for this rank
    detail::check_agreement(*cluster, agreement_fields(options), "when they join");
    cluster.heartbeat = std::make_unique<detail::Heartbeat>(cluster.job, options.cluster.heartbeat_timeout);
  }
  if (!cluster && resolved.local_gpu) resolved.ids = {0};  // one process: the first GPU
  std::shared_ptr<DeviceBackend> backend = backend_for(spec);
  std::vector<std::unique_ptr<Device>> made = backend->make_devices(resolved, options);
  if (made.empty()) throw ConfigError("devices = '" + spec.text + "': no device");
  dev.adopt(spec.kind, std::move(backend), std::move(made));
  const std::size_t n = dev.size();
  if (options.schedule.deterministic && !dev.host &&
      !std::all_of(dev.devices.begin(), dev.devices.end(), [](const auto& d) { return d->sums_cells_itself(); })) {
    throw ConfigError("deterministic = on with devices = '" + spec.text + "': these devices cannot round their cells to fixed point");
  }
  if (!dev.host && std::any_of(options.host.slowdown.begin(), options.host.slowdown.end(), [](double f) { return f != 1.0; })) {
    throw ConfigError("slowdown = " + std::to_string(options.host.slowdown.size()) + " factors for devices = '" + spec.text +
                      "': only CPU and simulated devices can be slowed down");
  }
  if (options.schedule.placement == PlacementPolicy::kGiven && options.schedule.placement_weights.size() != n) {
    throw ConfigError("placement_weights has " + std::to_string(options.schedule.placement_weights.size()) + " values; expected one per device (" +
                      std::to_string(n) + ")");
  }
  speed.reset(n, options.schedule.throughput_window, options.schedule.policy == SchedulePolicy::kStatic, dev.host || dev.times_calls,
              dev.leaves_cores_idle);
  make_communicator();
  reduction = make_reduction({options, dev, layout, shared, mean_next, exact, cluster, sched, comm, lr_pending, epoch, steps,
                              [this](ChunkTable& t, const ChunkPhase& phase) {
                                runner.take_call_times(t);  // GPUs' event times
                                return device_reports(t, phase);
                              }});
  if (!options.trace_path.empty()) {
    std::vector<std::string> names;
    for (const auto& d : dev.devices) names.push_back(d->name());
    if (cluster) {
      // One file a rank, PATH.rank<N>.json, on rank 0's timeline (perf/merge_traces.py joins them).
      std::string path = options.trace_path;
      const std::string ext = ".json";
      if (path.size() > ext.size() && path.compare(path.size() - ext.size(), ext.size(), ext) == 0) path.resize(path.size() - ext.size());
      trace = std::make_unique<TraceWriter>(path + ".rank" + std::to_string(cluster->rank()) + ext, std::move(names), cluster->rank(), cluster.clock_offset_ns);
    } else {
      trace = std::make_unique<TraceWriter>(options.trace_path, std::move(names));
    }
  }
  make_scheduler();
}

Runtime::Impl::~Impl() {
  sched.reset();  // workers stop first; then the trace is closed with everything they recorded
  if (trace) trace->close();
}

void Runtime::Impl::make_communicator() {
  const std::vector<Device*> raw = dev.raw();
  if (cluster && !dev.host) {
    // GPUs across ranks: one reduction over the job's devices (NCCL across processes); host devices reduce within
    // the rank and then through the cluster (cluster_step.cpp).
    comm = dev.backend->make_cluster_communicator(raw, *cluster, cluster.first_device, cluster.total_devices());
    return;
  }
  comm = dev.backend->make_communicator(raw);
}

void Runtime::Impl::make_scheduler() {
  SchedulerOptions so;
  so.workers = dev.devices.size();
  so.schedule = options.schedule.policy;
  so.seed = options.schedule.seed;
  so.on_worker_start = [this](std::size_t w) { dev.devices[w]->bind(); };
  sched = std::make_unique<Scheduler>(std::move(so));
  // The watchdog looks at the devices' chunk stamps every 1/20 of the timeout (10 to 50 ms).
  const auto period =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::duration<double>(std::clamp(options.stall_timeout / 20, 0.01, 0.05)));
  sched->set_watchdog(period, [this] { return check_stalls(); }, [this] {
    for (auto& d : dev.devices) d->cancel();
    comm->abort();  // NCCL: ncclCommAbort, so that a collective waiting on a dead peer returns
  });
}

std::exception_ptr Runtime::Impl::check_stalls() {
  if (cluster) cluster.watch();
  const std::int64_t now = (Clock::now() - epoch).count();
  const auto limit = static_cast<std::int64_t>(options.stall_timeout * 1e9);
  for (std::size_t w = 0; w < dev.replicas.size(); ++w) {
    const std::int64_t started = dev.replicas[w]->chunk_started_ns.load(std::memory_order_relaxed);
    if (started == 0 || now - started <= limit) continue;
    char ms[32];
    std::snprintf(ms, sizeof ms, "%.0f", static_cast<double>(now - started) / 1e6);
    const ChunkId c = dev.replicas[w]->current_chunk.load(std::memory_order_relaxed);
    const std::string where = c == kReductionPhase ? "in the reduction or the update" : "in chunk " + std::to_string(c);
    const bool usable = comm->survives_abort();
    if (cluster) {
      // Across ranks a stalled device ends the job: the other ranks wait for this one's share of the reduction.
      cluster->abort("stealbatch: rank " + std::to_string(cluster->rank()) + ": device " + dev.devices[w]->name() + " made no progress for " + ms +
                     " ms in step " + std::to_string(steps + 1) + " (stuck " + where + "; stall_timeout = " + std::to_string(options.stall_timeout) +
                     " s): ending the job", 1);
    }
    return std::make_exception_ptr(TimeoutError(
        "device " + dev.devices[w]->name() + " made no progress for " + ms + " ms in step " + std::to_string(steps + 1) + " (stuck " + where +
        "; stall_timeout = " + std::to_string(options.stall_timeout) + " s): the step failed and nothing was applied; its waits were cancelled" +
        (usable ? ", and the runtime can run another step" : " and its communicator aborted: the runtime cannot run another step")));
  }
  return nullptr;
}

Runtime::Runtime(RuntimeOptions options) : m(std::make_unique<Impl>(std::move(options))) {}
Runtime::~Runtime() = default;

void testing::RuntimeAccess::inject_faults(Runtime& rt, FaultInjector f) { rt.m->inject_fault = std::move(f); }

void Runtime::register_parameters(ParameterLayout layout, std::span<const float> initial) {
  if (initial.size() != layout.size()) {
    throw ConfigError("register_parameters: " + std::to_string(initial.size()) + " initial values for a layout of " + std::to_string(layout.size()) +
                      " floats");
  }
  if (m->cluster) {
    // Every rank's replicas must start from the same parameters: the same layout (names and sizes) and values.
    std::uint64_t names = detail::fnv1a({});
    for (const auto& t : layout.tensors()) {
      names = detail::fnv1a(std::as_bytes(std::span<const char>(t.name.data(), t.name.size() + 1)), names);
      names = detail::fnv1a(std::as_bytes(std::span<const std::size_t>(&t.size, 1)), names);
    }
    detail::check_agreement(*m->cluster,
                            {{"parameter count", std::to_string(layout.size())}, {"parameter layout (hash of names and sizes)", detail::hex16(names)},
                             {"initial parameters (hash of their bytes)", detail::hex16(detail::fnv1a(std::as_bytes(initial)))}},
                            "at register_parameters", [this] { m->cluster.watch(); });
  }
  m->layout = std::move(layout);
  if (m->dev.host) {
    m->shared.init(initial, m->options.optimizer);
    m->sched->broadcast([&](std::size_t d) { m->dev.devices[d]->share_replica(m->shared.live()); });
  } else {
    m->sched->broadcast([&](std::size_t d) { m->dev.devices[d]->init_replica(initial, m->options.optimizer); });
  }
  if (m->options.schedule.deterministic) m->exact.init(m->layout, m->dev.devices.size());
  m->mean_grad.assign(initial.size(), 0.0f);
  m->mean_next.assign(initial.size(), 0.0f);
  m->grads_dirty = false;
}

void Runtime::set_learning_rate(float lr) {
  if (m->layout.size() == 0) throw ConfigError("set_learning_rate: no parameters registered; call register_parameters() first");
  OptimizerOptions check = m->options.optimizer;
  check.lr = lr;
  validate(check);
  m->options.optimizer.lr = lr;
  m->lr_pending = true;
}

std::size_t Runtime::device_count() const noexcept { return m->dev.devices.size(); }
const Device& Runtime::device(std::size_t i) const { return *m->dev.devices.at(i); }
const ParameterLayout& Runtime::layout() const noexcept { return m->layout; }
std::span<const float> Runtime::gradient() const noexcept { return m->mean_grad; }
const RuntimeOptions& Runtime::options() const noexcept { return m->options; }
std::vector<double> Runtime::throughput_estimates() const { return m->speed.estimates(); }
std::uint64_t Runtime::trace_events_dropped() const noexcept { return m->trace ? m->trace->dropped() : 0; }
std::vector<std::pair<std::size_t, double>> Runtime::chunk_curve(std::size_t device) const {
  (void)m->dev.devices.at(device);  // std::out_of_range for a device that does not exist
  return m->speed.chunk_sizer.curve(device);
}

Runtime::CallCost Runtime::call_cost(std::size_t device) const {
  (void)m->dev.devices.at(device);  // std::out_of_range for a device that does not exist
  const detail::CallFit& f = m->speed.call_fit.at(device);
  if (!f.known()) return {};
  const detail::CallFit::Line l = f.line();
  return {l.per_call, l.per_unit, f.calls()};
}

std::vector<float> Runtime::parameters(std::size_t device) const {
  std::vector<float> out(m->layout.size());
  Device& d = *m->dev.devices.at(device);
  m->sched->broadcast([&](std::size_t w) {
    if (w == device) d.copy_params(out);
  });
  return out;
}

StepReport Runtime::Impl::finish_step(StepReport rep, Clock::time_point t_start) {
  grads_dirty = false;  // every buffer was zeroed after its update, or handed over
  rep.step_s = seconds(Clock::now() - t_start);
  for (DeviceReport& d : rep.devices) {
    d.idle_s = std::max(0.0, rep.step_s - d.busy_s);
    d.utilization = rep.step_s > 0 ? d.busy_s / rep.step_s : 0;
  }
  if (trace) trace->drain();
  return rep;
}

void Runtime::Impl::switch_shared_params(StepReport& rep) {
  // Host devices: the update was part of the reduction phase (see reduction/reduction.hpp); its figure is the
  // longest device's part of it, within that phase (a device may update its slice while another still drains its
  // chunks).
  shared.commit();
  for (auto& d : dev.devices) d->set_shared_params(shared.live());
  Clock::duration longest{};
  for (const auto& r : dev.replicas) longest = std::max(longest, r->update);
  rep.optimizer_s = std::min(seconds(longest), rep.reduce_s);
  rep.reduce_s -= rep.optimizer_s;
}

void Runtime::Impl::update_replicas(StepReport& rep, std::size_t batch) {
  const auto t_opt = Clock::now();
  // Each device's worker updates its own replica from its copy of the summed gradient, scaled by 1 / the true
  // sample count: the same update on the same values in the same order, so the replicas stay identical. Then it
  // zeroes the gradient for the next step. A learning rate set since the last update is taken here.
  const float scale = mean_scale(batch);
  const bool new_lr = lr_pending;
  const StepStats opt = sched->broadcast([&](std::size_t d) {
    const WatchStamp stamp(*dev.replicas[d], kReductionPhase, epoch);
    if (new_lr) dev.devices[d]->set_lr(options.optimizer.lr);
    dev.devices[d]->apply_update(scale);
    // A GPU queues its update behind the collective and returns: in one process the next step's chunks and drain
    // wait for it, in stream order. Across ranks a peer that never joins the collective must stall this phase,
    // where the watchdog names the reduction and aborts NCCL, not the next step's first chunk.
    if (cluster) dev.devices[d]->wait_queued();
  });
  lr_pending = false;
  const std::size_t first = cluster ? cluster.first_device : 0;  // across ranks the report lists every rank's devices
  for (std::size_t d = 0; d < dev.devices.size(); ++d) rep.devices[first + d].busy_s += seconds(opt.workers[d].busy);
  const auto t_end = Clock::now();
  rep.optimizer_s = seconds(t_end - t_opt);
  if (trace) {
    trace->add({static_cast<std::uint32_t>(dev.ever()), 0, (t_opt - epoch).count(), (t_end - epoch).count(), TraceKind::kOptimizer});
  }
}

void Runtime::Impl::take_mean_gradient(std::size_t batch) {
  if (dev.host) {
    mean_grad.swap(mean_next);  // written slice by slice in the reduction phase; only now: after a failed step gradient() still holds the last one
    return;
  }
  // One phase: device 0 hands over the sum, and every device zeroes its buffer for the next step (which then needs no
  // zeroing phase of its own).
  sched->broadcast([&](std::size_t d) {
    if (d == 0) dev.devices[0]->copy_grad(mean_grad);
    dev.devices[d]->zero_grad();
  });
  const float scale = mean_scale(batch);
  for (float& g : mean_grad) g *= scale;
}

// The full-batch mean: the sum over every sample divided by the true sample count (a partial last chunk weighs what it
// holds), never a mean of per-device means. Host devices write the mean (or the update) slice by slice in the
// reduction phase; other devices reduce the sum, and then each hands over or updates its replica.
StepReport Runtime::compute_gradient(std::span<const std::uint32_t> samples, const ChunkFunction& fn, std::span<const double> cost) {
  const auto t0 = Clock::now();
  StepReport rep = m->run_step(samples, fn, m->dev.host ? Reduce::kMean : Reduce::kSum, cost);
  m->take_mean_gradient(samples.size());
  return m->finish_step(std::move(rep), t0);
}

StepReport Runtime::step(std::span<const std::uint32_t> samples, const ChunkFunction& fn, std::span<const double> cost) {
  const auto t0 = Clock::now();
  StepReport rep = m->run_step(samples, fn, m->dev.host ? Reduce::kUpdate : Reduce::kSum, cost);
  if (m->dev.host) {
    m->switch_shared_params(rep);
  } else {
    m->update_replicas(rep, samples.size());
  }
  return m->finish_step(std::move(rep), t0);
}

}  // namespace stealbatch
