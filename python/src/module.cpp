// stealbatch._core: the runtime for Python. The extension links the runtime and Python alone, not libtorch: a
// device's buffers reach Python as buffers (host memory, through the buffer protocol: torch.frombuffer) or as CUDA
// array interfaces (GPU memory: torch.as_tensor), so the package runs with whichever torch the user has, 1.13 or 2.x,
// whatever C++ ABI it was built with. The Python side (stealbatch/_runtime.py) binds a module's parameters to those
// buffers and calls the user's loss.
//
// Threads and the GIL: a step runs on a stepping thread of the runtime's own while the calling thread, GIL released,
// waits for it in slices of 50 ms and checks for signals between them, so Ctrl-C reaches Python during a step. Each
// device's worker takes the GIL for its chunk's Python and nothing else; torch releases it inside its operators and
// its backward pass, so devices overlap there.
#include <stealbatch/cores.hpp>
#include <stealbatch/error.hpp>
#include <stealbatch/runtime/runtime.hpp>
#if defined(STEALBATCH_PY_MPI)
#include <stealbatch/mpi/mpi_cluster.hpp>
#endif
#if defined(STEALBATCH_PY_CUDA)
#include <stealbatch/cuda/backend.hpp>

#include <cuda_runtime_api.h>
#endif

#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <pybind11/stl/filesystem.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <semaphore>
#include <string>
#include <thread>
#include <vector>

namespace py = pybind11;
namespace sb = stealbatch;

namespace {

// Thrown from a chunk when the step is being cancelled (Ctrl-C) or when a chunk's Python raised: the runtime fails the
// step, applies nothing, and the stepping thread hands the Python exception back to the caller.
struct Cancelled : std::exception {
  const char* what() const noexcept override { return "the step was cancelled"; }
};

// One thread that runs a runtime's steps, one at a time, so that the runtime always sees the same caller.
class Stepper {
 public:
  Stepper() : m_thread([this] { loop(); }) {}
  ~Stepper() {
    {
      const std::lock_guard lock(m_mutex);
      m_stop = true;
    }
    m_cv.notify_all();
    m_thread.join();
  }
  Stepper(const Stepper&) = delete;
  Stepper& operator=(const Stepper&) = delete;

  // Starts `job`; wait_for() then tells when it has finished, and error() what it threw.
  void start(std::function<void()> job) {
    const std::lock_guard lock(m_mutex);
    m_job = std::move(job), m_done = false, m_error = nullptr;
    m_cv.notify_all();
  }
  bool wait_for(std::chrono::milliseconds slice) {
    std::unique_lock lock(m_mutex);
    return m_cv.wait_for(lock, slice, [&] { return m_done; });
  }
  std::exception_ptr error() const { return m_error; }  // read once wait_for() returned true

 private:
  void loop() {
    std::unique_lock lock(m_mutex);
    for (;;) {
      m_cv.wait(lock, [&] { return m_stop || m_job; });
      if (m_stop) return;
      std::function<void()> job = std::move(m_job);
      m_job = nullptr;
      lock.unlock();
      std::exception_ptr error;
      try {
        job();
      } catch (...) {
        error = std::current_exception();
      }
      lock.lock();
      m_error = error, m_done = true;
      m_cv.notify_all();
    }
  }

  std::mutex m_mutex;
  std::condition_variable m_cv;
  std::function<void()> m_job;
  std::exception_ptr m_error;
  bool m_done = true, m_stop = false;
  std::thread m_thread;  // last: it starts once the rest is made
};

// What one chunk call shows Python: the device, its sample ids and the device's buffers.
struct PyChunk {
  const sb::ChunkContext* ctx = nullptr;
  void check() const {
    if (ctx == nullptr) throw sb::ConfigError("a chunk's context was used after its chunk function returned");
  }
  void check_host() const {
    check();
    if (ctx->stream != nullptr) throw sb::ConfigError("a GPU chunk's buffers are device memory: use params_address and grad_address");
  }
};

py::memoryview host_floats(const float* p, std::size_t n) {
  return py::memoryview::from_memory(const_cast<float*>(p), static_cast<py::ssize_t>(n * sizeof(float)), /*readonly=*/false);
}

int gpu_index([[maybe_unused]] const float* p) {
#if defined(STEALBATCH_PY_CUDA)
  cudaPointerAttributes where{};
  if (cudaPointerGetAttributes(&where, p) == cudaSuccess && where.type == cudaMemoryTypeDevice) return where.device;
  (void)cudaGetLastError();
#endif
  return -1;
}

void bind_chunk(py::module_& m) {
  py::class_<PyChunk>(m, "Chunk", "One chunk call: valid only inside the chunk function it was given to.")
      .def_property_readonly("device", [](const PyChunk& c) { return c.check(), c.ctx->device; })
      .def_property_readonly("home_device", [](const PyChunk& c) { return c.check(), c.ctx->home_device; })
      .def_property_readonly("chunk", [](const PyChunk& c) { return c.check(), c.ctx->chunk; })
      .def_property_readonly("samples",
                             [](const PyChunk& c) {
                               c.check();
                               // A copy, widened to int64 (torch's index type), that the caller owns.
                               std::vector<std::int64_t> ids(c.ctx->samples.begin(), c.ctx->samples.end());
                               return py::bytearray(reinterpret_cast<const char*>(ids.data()), ids.size() * sizeof(std::int64_t));
                             },
                             "the sample ids, int64, as a bytearray of the caller's own")
      .def_property_readonly("on_gpu", [](const PyChunk& c) { return c.check(), c.ctx->stream != nullptr; })
      .def_property_readonly("params_address", [](const PyChunk& c) { return c.check(), reinterpret_cast<std::uintptr_t>(c.ctx->params.data()); })
      .def_property_readonly("grad_address", [](const PyChunk& c) { return c.check(), reinterpret_cast<std::uintptr_t>(c.ctx->grad.data()); })
      .def_property_readonly("size", [](const PyChunk& c) { return c.check(), c.ctx->params.size(); })
      .def("params", [](const PyChunk& c) { return c.check_host(), host_floats(c.ctx->params.data(), c.ctx->params.size()); },
           "a host device's parameters, as a buffer the runtime owns (valid while the runtime keeps it: params_address tells)")
      .def("grad", [](const PyChunk& c) { return c.check_host(), host_floats(c.ctx->grad.data(), c.ctx->grad.size()); },
           "a host device's gradient sum, as a buffer the runtime owns (valid while grad_address is the same)")
      .def_property_readonly("gpu_index", [](const PyChunk& c) { return c.check(), gpu_index(c.ctx->grad.data()); },
                             "the CUDA device holding the chunk's buffers (-1 on the host)")
      .def_property_readonly("stream", [](const PyChunk& c) { return c.check(), reinterpret_cast<std::uintptr_t>(c.ctx->stream); })
      .def_property_readonly("device_loss_address", [](const PyChunk& c) { return c.check(), reinterpret_cast<std::uintptr_t>(c.ctx->device_loss); })
      .def("add_loss", [](const PyChunk& c, double sum) { c.check(), c.ctx->add_loss(sum); }, "adds the chunk's summed loss (host devices)");
}

// The options a Python Runtime sets, flat; to_options() groups them as RuntimeOptions.
struct PyOptions {
  std::string devices, policy = "steal", placement = "auto", optimizer = "sgd", on_device_failure = "fail", trace_path, cluster = "none",
      wire = "float32";
  std::size_t chunk_size = 0, in_flight = 2;
  float lr = 0.05f, momentum = 0.9f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.0f;
  bool deterministic = false, merge_stolen = true, endgame = true;
  int threads_per_device = 0;
  std::vector<double> slowdown, placement_weights;
  double stall_timeout = 600, heartbeat_timeout = 10;
  std::uint64_t seed = 0x5eedba7c;
  std::shared_ptr<sb::Cluster> job;  // ranks already joined (mpi_join), in place of `cluster`
};

sb::PlacementPolicy parse_placement(const std::string& s) {
  if (s == "auto") return sb::PlacementPolicy::kAuto;
  if (s == "equal") return sb::PlacementPolicy::kEqual;
  if (s == "throughput") return sb::PlacementPolicy::kThroughput;
  if (s == "given") return sb::PlacementPolicy::kGiven;
  if (s == "previous") return sb::PlacementPolicy::kPreviousStep;
  if (s == "packed") return sb::PlacementPolicy::kPacked;
  throw sb::ConfigError("placement = '" + s + "': use auto, equal, throughput, given, previous or packed");
}

std::shared_ptr<sb::Cluster> make_cluster(const std::string& name) {
  if (name == "none") return nullptr;
#if defined(STEALBATCH_PY_MPI)
  if (name == "mpi") return sb::mpi::MpiCluster::world();
#endif
  if (name == "mpi") throw sb::ConfigError("cluster = 'mpi': this stealbatch was built without MPI (install libopenmpi-dev and rebuild)");
  throw sb::ConfigError("cluster = '" + name + "': use auto, none, mpi or torchrun");
}

sb::RuntimeOptions to_options(const PyOptions& p) {
  sb::RuntimeOptions o;
  o.devices = p.devices, o.trace_path = p.trace_path, o.stall_timeout = p.stall_timeout;
  o.schedule.chunk_size = p.chunk_size, o.schedule.policy = sb::parse_policy(p.policy), o.schedule.placement = parse_placement(p.placement);
  o.schedule.placement_weights = p.placement_weights, o.schedule.deterministic = p.deterministic;
  o.schedule.merge_stolen = p.merge_stolen, o.schedule.seed = p.seed;
  o.schedule.endgame = p.endgame ? sb::EndGame::kOn : sb::EndGame::kOff;
  o.optimizer = {.kind = sb::parse_optimizer(p.optimizer), .lr = p.lr, .momentum = p.momentum, .beta1 = p.beta1, .beta2 = p.beta2,
                 .eps = p.eps, .weight_decay = p.weight_decay};
  o.host.slowdown = p.slowdown, o.host.threads_per_device = p.threads_per_device;
  o.gpu.in_flight = p.in_flight;  // gpu.graphs stays off: a Python loss runs host code that a replay would skip
  if (p.on_device_failure == "exclude") o.on_device_failure = sb::OnDeviceFailure::kExclude;
  else if (p.on_device_failure != "fail") throw sb::ConfigError("on_device_failure = '" + p.on_device_failure + "': use fail or exclude");
  o.cluster.job = p.job ? p.job : make_cluster(p.cluster), o.cluster.heartbeat_timeout = p.heartbeat_timeout;
  if (p.wire == "bf16") o.cluster.wire = sb::WireFormat::kBfloat16;
  else if (p.wire != "float32") throw sb::ConfigError("wire = '" + p.wire + "': use float32 or bf16");
  return o;
}

// Marks a runtime busy for a scope, unless it already was (mine = false): a flag, not a mutex, because a signal
// handler that Python runs on the thread waiting for a step may call the runtime again.
struct Busy {
  explicit Busy(std::atomic<bool>& f) : flag(f), mine(!f.exchange(true)) {}
  ~Busy() {
    if (mine) flag.store(false);
  }
  Busy(const Busy&) = delete;
  Busy& operator=(const Busy&) = delete;
  std::atomic<bool>& flag;
  const bool mine;
};

// A runtime driven from Python: its steps run on the stepping thread, its chunks call a Python function.
class PyRuntime {
 public:
  explicit PyRuntime(const PyOptions& o) {
    auto options = to_options(o);
    m_job = options.cluster.job;
    m_rt = std::make_unique<sb::Runtime>(std::move(options));
  }
  ~PyRuntime() {
    const py::gil_scoped_release released;  // the workers may still be returning from Python
    m_stepper.reset();
    m_rt.reset();
  }
  PyRuntime(const PyRuntime&) = delete;
  PyRuntime& operator=(const PyRuntime&) = delete;

  sb::Runtime& rt() { return *m_rt; }
  // Runs `f(runtime)` when no step is running; a call from a loss function or another thread during a step raises.
  template <class F>
  auto when_idle(const char* what, F&& f) {
    const Busy idle(m_busy);
    if (!idle.mine) throw sb::ConfigError(std::string(what) + ": a step of this runtime is running; call it between steps");
    return f(*m_rt);
  }

  // `initial`: the address of `count` contiguous float32 values on the host (a tensor's data_ptr(), kept alive by the
  // caller during the call).
  void register_parameters(const std::vector<std::pair<std::string, std::vector<std::size_t>>>& tensors, std::uintptr_t initial,
                           std::size_t count) {
    sb::ParameterLayout layout;
    for (const auto& [name, shape] : tensors) layout.add(name, shape.empty() ? std::vector<std::size_t>{1} : shape);
    if (count != layout.size()) {
      throw sb::ConfigError("register_parameters: " + std::to_string(count) + " initial values for a layout of " + std::to_string(layout.size()));
    }
    const auto* p = reinterpret_cast<const float*>(initial);
    std::vector<float> values(p, p + count);
    const py::gil_scoped_release released;
    from_rank_zero(values);
    when_idle("register_parameters", [&](sb::Runtime& rt) { rt.register_parameters(std::move(layout), values); });
  }

  // As DDP does when it wraps a module: every rank starts from rank 0's values, so a model initialised without a
  // common seed trains as one. The sizes are compared first, on every rank, so that ranks whose layouts differ all
  // skip the values' broadcast and register_parameters then names the difference.
  void from_rank_zero(std::vector<float>& values) {
    if (!m_job || m_job->size() < 2) return;
    std::uint64_t root_count = values.size();
    m_job->broadcast({reinterpret_cast<char*>(&root_count), sizeof root_count}, 0);
    std::vector<double> differ{root_count != values.size() ? 1.0 : 0.0};
    m_job->allreduce_sum(differ);
    if (differ[0] == 0) m_job->broadcast({reinterpret_cast<char*>(values.data()), values.size() * sizeof(float)}, 0);
  }

  // One step (update = false: the gradient alone) over `count` sample ids (int64, at `samples`), calling `fn(chunk)`
  // for each chunk; `cost`: 0, or the address of one float64 per sample. The caller keeps both alive during the call.
  sb::StepReport step(std::uintptr_t samples, std::size_t count, const py::function& fn, std::uintptr_t cost, bool update) {
    const auto* given = reinterpret_cast<const std::int64_t*>(samples);
    std::vector<std::uint32_t> ids(count);
    for (std::size_t i = 0; i < count; ++i) {
      if (given[i] < 0 || given[i] > 0xffffffffLL) throw sb::ConfigError("step: sample id " + std::to_string(given[i]) + " is outside [0, 2^32)");
      ids[i] = static_cast<std::uint32_t>(given[i]);
    }
    std::vector<double> costs;
    if (cost != 0) costs.assign(reinterpret_cast<const double*>(cost), reinterpret_cast<const double*>(cost) + count);
    // One step at a time: the calling thread waits without the GIL, so another Python thread could call in meanwhile.
    const Busy stepping(m_busy);
    if (!stepping.mine) throw sb::ConfigError("step: another thread is running a step of this runtime; a runtime runs one step at a time");
    m_cancel = false;
    set_error(py::object());
    const sb::ChunkFunction chunk = [this, &fn](sb::ChunkContext& ctx) { run_chunk(fn, ctx); };
    sb::StepReport report;
    m_stepper->start([&] { report = update ? m_rt->step(ids, chunk, costs) : m_rt->compute_gradient(ids, chunk, costs); });
    wait_checking_signals();
    return report;
  }

 private:
  // On a device's worker: the chunk's Python, under the GIL. The first Python exception of the step is kept, with its
  // traceback, and every later chunk of the step ends at once.
  //
  // On host devices at most as many chunks run their Python at once as the process has cores: more would not run
  // faster, and a thread that holds the GIL when the OS preempts it for another device's thread stalls every device
  // (cpu:4 on 2 cores: 52k samples/s without the limit, 78k with it; see perf/README.md, python).
  void run_chunk(const py::function& fn, sb::ChunkContext& ctx) {
    if (m_cancel.load(std::memory_order_relaxed)) throw Cancelled();
    const bool host = ctx.stream == nullptr;
    if (host) m_cores.acquire();
    struct Release {
      explicit Release(std::counting_semaphore<>* c) : cores(c) {}
      std::counting_semaphore<>* cores;
      ~Release() {
        if (cores != nullptr) cores->release();
      }
      Release(const Release&) = delete;
      Release& operator=(const Release&) = delete;
    } release(host ? &m_cores : nullptr);
    // A thread state for the call: Python sees a new thread at each chunk (threading.local does not carry over; the
    // OS thread's ident, threading.get_ident(), does).
    const py::gil_scoped_acquire gil;
    if (m_cancel.load(std::memory_order_relaxed)) throw Cancelled();  // cancelled while this chunk waited for a core
    // Owned by Python (a reference kept past the call must not dangle), and emptied after the call: a use of it
    // later raises, naming the mistake.
    const py::object chunk = py::cast(PyChunk{&ctx});
    const auto forget = [&] { chunk.cast<PyChunk&>().ctx = nullptr; };
    try {
      fn(chunk);
      forget();
    } catch (py::error_already_set& e) {
      forget();
      if (e.trace()) PyException_SetTraceback(e.value().ptr(), e.trace().ptr());  // the exception, with the chunk's traceback
      {
        const std::lock_guard lock(m_error_mutex);
        if (!m_error) m_error = e.value();
      }
      m_cancel = true;
      throw Cancelled();
    }
  }

  // The calling thread, GIL released, waits for the step; between slices it checks for signals (Ctrl-C), and cancels
  // the step if one raised. Once the step is over: a chunk's Python exception is raised as itself, a runtime error
  // as the package's exception.
  void wait_checking_signals() {
    std::optional<py::error_already_set> interrupted;
    for (;;) {
      bool done = false;
      {
        const py::gil_scoped_release released;
        done = m_stepper->wait_for(std::chrono::milliseconds(50));
      }
      if (done) break;
      if (!interrupted && PyErr_CheckSignals() != 0) {
        interrupted.emplace();  // takes the pending KeyboardInterrupt
        m_cancel = true;
      }
    }
    const std::exception_ptr failed = m_stepper->error();
    if (interrupted) {
      if (failed) throw *interrupted;  // the step was cancelled: nothing applied
      // The step had finished its chunks and was applied: it returns, and the interrupt is raised right after.
      PyErr_SetInterrupt();
      return;
    }
    if (!failed) return;
    try {
      std::rethrow_exception(failed);
    } catch (const sb::Error&) {
      py::object error = set_error(py::object());
      if (error) {
        PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(error.ptr())), error.ptr());
        throw py::error_already_set();
      }
      throw;
    }
  }

  // Replaces the step's Python error and returns what it was. The workers set it with their thread attached to the
  // interpreter, which under a free-threaded Python (no GIL) is not exclusive: a mutex guards it.
  py::object set_error(py::object e) {
    const std::lock_guard lock(m_error_mutex);
    std::swap(m_error, e);
    return e;
  }

  std::unique_ptr<sb::Runtime> m_rt;
  std::shared_ptr<sb::Cluster> m_job;  // the ranks, where there are several
  std::unique_ptr<Stepper> m_stepper = std::make_unique<Stepper>();
  std::atomic<bool> m_cancel{false};
  std::counting_semaphore<> m_cores{static_cast<std::ptrdiff_t>(std::max(1u, sb::usable_cores()))};  // see run_chunk()
  std::atomic<bool> m_busy{false};  // a step, or a call that must not overlap one, is running (Busy)
  std::mutex m_error_mutex;  // guards m_error
  py::object m_error;        // the step's first Python exception
};

void bind_reports(py::module_& m) {
  py::class_<sb::DeviceReport>(m, "DeviceReport", "One device's part of a step.")
      .def_readonly("name", &sb::DeviceReport::name)
      .def_readonly("compute_s", &sb::DeviceReport::compute_s)
      .def_readonly("busy_s", &sb::DeviceReport::busy_s)
      .def_readonly("idle_s", &sb::DeviceReport::idle_s)
      .def_readonly("barrier_wait_s", &sb::DeviceReport::barrier_wait_s)
      .def_readonly("utilization", &sb::DeviceReport::utilization)
      .def_readonly("chunks_run", &sb::DeviceReport::chunks_run)
      .def_readonly("chunks_stolen", &sb::DeviceReport::chunks_stolen)
      .def_readonly("samples", &sb::DeviceReport::samples)
      .def_readonly("chunk_samples", &sb::DeviceReport::chunk_samples);
  py::class_<sb::StepReport>(m, "StepReport", "What a step did: its time split, each device's part, the chunks stolen.")
      .def_readonly("step", &sb::StepReport::step)
      .def_readonly("step_s", &sb::StepReport::step_s)
      .def_readonly("chunks_s", &sb::StepReport::chunks_s)
      .def_readonly("reduce_s", &sb::StepReport::reduce_s)
      .def_readonly("optimizer_s", &sb::StepReport::optimizer_s)
      .def_readonly("samples", &sb::StepReport::samples)
      .def_readonly("chunks", &sb::StepReport::chunks)
      .def_readonly("steals", &sb::StepReport::steals)
      .def_readonly("loss", &sb::StepReport::loss)
      .def_readonly("devices", &sb::StepReport::devices)
      .def_readonly("ranks", &sb::StepReport::ranks)
      .def_readonly("remote_steals", &sb::StepReport::remote_steals)
      .def_readonly("excluded_devices", &sb::StepReport::excluded_devices)
      .def("dashboard", [](const sb::StepReport& r, const std::string& title) { return sb::format_dashboard(r, title); }, py::arg("title") = "step")
      .def("__repr__", [](const sb::StepReport& r) {
        return "StepReport(step=" + std::to_string(r.step) + ", samples=" + std::to_string(r.samples) + ", step_s=" + std::to_string(r.step_s) +
               ", steals=" + std::to_string(r.steals) + ", loss=" + std::to_string(r.loss) + ")";
      });
}

void bind_options(py::module_& m) {
  py::class_<PyOptions>(m, "Options", "The runtime's settings (stealbatch.Runtime's keyword arguments set them).")
      .def(py::init<>())
      .def_readwrite("devices", &PyOptions::devices).def_readwrite("policy", &PyOptions::policy)
      .def_readwrite("placement", &PyOptions::placement).def_readwrite("placement_weights", &PyOptions::placement_weights)
      .def_readwrite("optimizer", &PyOptions::optimizer).def_readwrite("lr", &PyOptions::lr)
      .def_readwrite("momentum", &PyOptions::momentum).def_readwrite("beta1", &PyOptions::beta1)
      .def_readwrite("beta2", &PyOptions::beta2).def_readwrite("eps", &PyOptions::eps)
      .def_readwrite("weight_decay", &PyOptions::weight_decay).def_readwrite("chunk_size", &PyOptions::chunk_size)
      .def_readwrite("deterministic", &PyOptions::deterministic).def_readwrite("merge_stolen", &PyOptions::merge_stolen)
      .def_readwrite("endgame", &PyOptions::endgame)
      .def_readwrite("threads_per_device", &PyOptions::threads_per_device).def_readwrite("slowdown", &PyOptions::slowdown)
      .def_readwrite("stall_timeout", &PyOptions::stall_timeout).def_readwrite("heartbeat_timeout", &PyOptions::heartbeat_timeout)
      .def_readwrite("on_device_failure", &PyOptions::on_device_failure).def_readwrite("trace_path", &PyOptions::trace_path)
      .def_readwrite("cluster", &PyOptions::cluster).def_readwrite("seed", &PyOptions::seed)
      .def_readwrite("in_flight", &PyOptions::in_flight).def_readwrite("job", &PyOptions::job).def_readwrite("wire", &PyOptions::wire);
}

// Ranks that torchrun (or any launcher but mpirun) started join through an MPI port; stealbatch/_torchrun.py hands
// the port's name around through torch.distributed's store.
void bind_cluster(py::module_& m) {
  py::class_<sb::Cluster, std::shared_ptr<sb::Cluster>>(m, "Cluster", "Ranks that have joined (stealbatch._core.mpi_join).")
      .def_property_readonly("rank", &sb::Cluster::rank)
      .def_property_readonly("size", &sb::Cluster::size);
#if defined(STEALBATCH_PY_MPI)
  // A script may make a runtime, drop it and make another: MPI must outlive the first one's cluster.
  sb::mpi::MpiCluster::finalize_at_exit();
  m.def("mpi_open_port", [] { return sb::mpi::MpiCluster::open_port(); }, py::call_guard<py::gil_scoped_release>(),
        "rank 0: starts MPI alone and opens the port the others join through; returns its name");
  m.def(
      "mpi_join",
      [](int rank, int size, const std::string& port, const py::object& wait_turn, const py::object& pass_turn) -> std::shared_ptr<sb::Cluster> {
        const auto call = [](const py::object& f) {
          return [fp = &f] {
            const py::gil_scoped_acquire held;
            (*fp)();
          };
        };
        const py::gil_scoped_release released;
        return sb::mpi::MpiCluster::joined(rank, size, port, call(wait_turn), call(pass_turn));
      },
      py::arg("rank"), py::arg("size"), py::arg("port"), py::arg("wait_turn"), py::arg("pass_turn"),
      "every rank: joins the others through rank 0's port, one at a time (wait_turn() before its connect, pass_turn() once in); returns "
      "when all `size` have");
#endif
}

py::bytes as_bytes(const std::vector<float>& v) { return {reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float)}; }

void bind_runtime(py::module_& m) {
  py::class_<PyRuntime>(m, "Runtime", "The runtime itself; stealbatch.Runtime wraps it with a module's binding.")
      .def(py::init<const PyOptions&>(), py::call_guard<py::gil_scoped_release>())
      .def("register_parameters", &PyRuntime::register_parameters)
      .def("step", &PyRuntime::step, py::arg("samples"), py::arg("count"), py::arg("fn"), py::arg("cost"), py::arg("update"))
      .def("set_learning_rate", [](PyRuntime& r, float lr) { r.when_idle("lr", [&](sb::Runtime& rt) { rt.set_learning_rate(lr); }); })
      .def("save_checkpoint",
           [](PyRuntime& r, const std::filesystem::path& p, const sb::CheckpointMetadata& meta) {
             r.when_idle("save_checkpoint", [&](sb::Runtime& rt) { rt.save_checkpoint(p, meta); });
           },
           py::call_guard<py::gil_scoped_release>())
      .def("load_checkpoint",
           [](PyRuntime& r, const std::filesystem::path& p) { return r.when_idle("load_checkpoint", [&](sb::Runtime& rt) { return rt.load_checkpoint(p); }); },
           py::call_guard<py::gil_scoped_release>())
      .def("parameters",
           [](PyRuntime& r, std::size_t d) { return as_bytes(r.when_idle("parameters", [&](sb::Runtime& rt) { return rt.parameters(d); })); },
           py::arg("device") = 0)
      .def("gradient", [](PyRuntime& r) {
        const std::vector<float> g = r.when_idle("gradient", [](sb::Runtime& rt) { return std::vector<float>(rt.gradient().begin(), rt.gradient().end()); });
        return as_bytes(g);
      })
      .def_property_readonly("device_count", [](PyRuntime& r) { return r.rt().device_count(); })
      .def_property_readonly("threads_per_device", [](PyRuntime& r) { return r.rt().options().host.threads_per_device; },
                             "CPU devices' threads as the runtime set them (0: not set; across ranks, the node's cores shared among its ranks' devices)")
      .def("device_name", [](PyRuntime& r, std::size_t d) { return r.rt().device(d).name(); })
      .def("throughput_estimates", [](PyRuntime& r) { return r.rt().throughput_estimates(); })
      .def("chunk_curve", [](PyRuntime& r, std::size_t d) { return r.rt().chunk_curve(d); });
}

// The runtime's errors as Python exceptions, all under stealbatch.Error; those that say what was wrong with an
// argument are also ValueErrors, a checkpoint's also OSErrors, a stall also a TimeoutError. The classes live as long
// as the process (as a C extension's own exception classes do): the translator may run at any time.
struct Errors {
  PyObject *error = nullptr, *config = nullptr, *data = nullptr, *checkpoint = nullptr, *timeout = nullptr, *chunk = nullptr;
};
Errors g_errors;

PyObject* new_error(py::module_& m, const char* name, PyObject* bases) {
  const std::string qualified = std::string("stealbatch.") + name;
  PyObject* type = PyErr_NewException(qualified.c_str(), bases, nullptr);
  if (type == nullptr) throw py::error_already_set();
  m.add_object(name, py::handle(type));  // the module holds a reference; the one PyErr_NewException gave is kept
  return type;
}

void bind_errors(py::module_& m) {
  g_errors.error = new_error(m, "Error", PyExc_RuntimeError);
  const auto with = [](PyObject* other) { return py::make_tuple(py::handle(g_errors.error), py::handle(other)); };
  g_errors.config = new_error(m, "ConfigError", with(PyExc_ValueError).ptr());
  g_errors.data = new_error(m, "DataError", with(PyExc_ValueError).ptr());
  g_errors.checkpoint = new_error(m, "CheckpointError", with(PyExc_OSError).ptr());
  g_errors.timeout = new_error(m, "TimeoutError", with(PyExc_TimeoutError).ptr());
  g_errors.chunk = new_error(m, "ChunkError", g_errors.error);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const sb::ConfigError& e) {
      PyErr_SetString(g_errors.config, e.what());
    } catch (const sb::DataError& e) {
      PyErr_SetString(g_errors.data, e.what());
    } catch (const sb::CheckpointError& e) {
      PyErr_SetString(g_errors.checkpoint, e.what());
    } catch (const sb::TimeoutError& e) {
      PyErr_SetString(g_errors.timeout, e.what());
    } catch (const sb::ChunkError& e) {
      PyErr_SetString(g_errors.chunk, e.what());
    } catch (const sb::Error& e) {
      PyErr_SetString(g_errors.error, e.what());
    }
  });
}

}  // namespace

#if defined(PYBIND11_VERSION_HEX) && PYBIND11_VERSION_HEX >= 0x020D0000
// Declared free-threading safe (PEP 703): a free-threaded CPython then runs the devices' chunks in parallel.
#define STEALBATCH_PY_MODULE(name, m) PYBIND11_MODULE(name, m, py::mod_gil_not_used())
#else
#define STEALBATCH_PY_MODULE(name, m) PYBIND11_MODULE(name, m)
#endif

STEALBATCH_PY_MODULE(_core, m) {
  m.doc() = "stealbatch's runtime (the extension behind the stealbatch package)";
#if defined(STEALBATCH_PY_CUDA)
  sb::cuda::enable();
  m.attr("has_cuda") = true;
#else
  m.attr("has_cuda") = false;
#endif
#if defined(STEALBATCH_PY_MPI)
  m.attr("has_mpi") = true;
#else
  m.attr("has_mpi") = false;
#endif
  bind_errors(m);
  bind_chunk(m);
  bind_options(m);
  bind_cluster(m);
  bind_reports(m);
  bind_runtime(m);
}
