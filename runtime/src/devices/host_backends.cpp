// The built-in device backends (CPU and simulated devices, which share the host's memory) and the backend registry.
#include <stealbatch/cores.hpp>
#include <stealbatch/runtime/cpu_device.hpp>
#include <stealbatch/runtime/runtime.hpp>
#include <stealbatch/runtime/sim_device.hpp>

#include <algorithm>
#include <cstdio>
#include <map>
#include <mutex>
#include <string>
#include <thread>

namespace stealbatch {

namespace {

unsigned cores() { return usable_cores(); }

// slowdown has one factor per device (validate() checked each one's range), or is empty: all 1.
std::vector<double> slowdowns(const RuntimeOptions& o, std::size_t n) {
  if (o.host.slowdown.empty()) return std::vector<double>(n, 1.0);
  if (o.host.slowdown.size() != n) {
    throw ConfigError("slowdown has " + std::to_string(o.host.slowdown.size()) + " values; expected one per device (" + std::to_string(n) + ")");
  }
  return o.host.slowdown;
}

// Several CPU devices: the BLAS library's one pool to a thread, so that each device's products run on its own
// thread (set_blas_pool_threads()); said once a process when a BLAS is loaded whose pool cannot be set.
void share_blas_pool() {
  if (set_blas_pool_threads(1) != BlasPool::kUnknown) return;
  static std::once_flag said;
  std::call_once(said, [] {
    std::fprintf(stderr,
                 "stealbatch: warning: this process's BLAS has a thread pool the runtime cannot size (neither OpenBLAS, BLIS nor MKL): "
                 "several CPU devices calling into it at once may contend for its threads; set its thread count to 1 "
                 "(OPENBLAS_NUM_THREADS=1 or the library's own setting)\n");
  });
}

class CpuBackend final : public DeviceBackend {
 public:
  std::size_t available() const noexcept override { return cores(); }
  bool shares_host_memory() const noexcept override { return true; }
  std::vector<std::unique_ptr<Device>> make_devices(const DeviceSpec& spec, const RuntimeOptions& o) override {
    const std::size_t n = spec.count;
    const std::vector<double> slow = slowdowns(o, n);
    // Deterministic mode: one thread a device, so that a chunk's kernels block their sums alike on any device count.
    const int threads = o.schedule.deterministic      ? 1
                        : o.host.threads_per_device > 0 ? o.host.threads_per_device
                                                        : std::max(1, static_cast<int>(cores() / static_cast<unsigned>(n)));
    if (n > 1) share_blas_pool();
    std::vector<std::unique_ptr<Device>> out;
    for (std::size_t i = 0; i < n; ++i) {
      auto d = std::make_unique<CpuDevice>(i, threads, slow[i]);
      // More device threads than cores: each chunk ends with a preemption point (see CpuDevice::run_chunk()).
      d->set_preemption_point(n * static_cast<std::size_t>(threads) > cores());
      d->set_compute_time(o.schedule.chunk_size == 0);  // the chunk sizer's measure
      out.push_back(std::move(d));
    }
    return out;
  }
  std::unique_ptr<Communicator> make_communicator(std::span<Device* const>) override { return std::make_unique<InProcessCommunicator>(); }
};

class SimBackend final : public DeviceBackend {
 public:
  std::size_t available() const noexcept override { return 0; }
  bool shares_host_memory() const noexcept override { return true; }
  bool leaves_cores_idle() const noexcept override { return true; }
  std::vector<std::unique_ptr<Device>> make_devices(const DeviceSpec& spec, const RuntimeOptions& o) override {
    const std::vector<double> slow = slowdowns(o, spec.count);
    std::vector<std::unique_ptr<Device>> out;
    for (std::size_t i = 0; i < spec.count; ++i) {
      // A simulated device's speed is its spec'd speed divided by its slowdown factor.
      auto d = std::make_unique<SimDevice>(i, spec.speeds[i] / slow[i], o.sim.sample_seconds, o.sim.sample_cost);
      d->set_link(o.sim.bytes_per_sample, o.sim.link_bw, o.sim.link_latency);
      d->set_call_seconds(o.sim.call_seconds);
      d->set_in_flight(o.gpu.in_flight, o.sim.launch_lead);
      if (o.sim.speed_factor) d->set_speed_factor([f = o.sim.speed_factor, i](std::uint64_t step, double t) { return f(i, step, t); });
      if (o.schedule.deterministic) d->set_one_thread();
      out.push_back(std::move(d));
    }
    m_sim = o.sim;
    return out;
  }
  std::unique_ptr<Communicator> make_communicator(std::span<Device* const> devices) override {
    return std::make_unique<SimRingCommunicator>(devices.size(), m_sim.allreduce_bytes, m_sim.busbw, m_sim.link_latency);
  }

 private:
  SimOptions m_sim;
};

std::mutex g_backends_mutex;
std::map<DeviceKind, std::shared_ptr<DeviceBackend>>& registered() {
  static std::map<DeviceKind, std::shared_ptr<DeviceBackend>> m;
  return m;
}

}  // namespace

void register_device_backend(DeviceKind kind, std::shared_ptr<DeviceBackend> backend) {
  const std::lock_guard lock(g_backends_mutex);
  registered()[kind] = std::move(backend);
}

std::shared_ptr<DeviceBackend> device_backend(DeviceKind kind) {
  {
    const std::lock_guard lock(g_backends_mutex);
    const auto it = registered().find(kind);
    if (it != registered().end() && it->second) return it->second;
  }
  if (kind == DeviceKind::kCpu) return std::make_shared<CpuBackend>();
  if (kind == DeviceKind::kSim) return std::make_shared<SimBackend>();
  return nullptr;
}

}  // namespace stealbatch
