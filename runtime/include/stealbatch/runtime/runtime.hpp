// The public API for trainers: devices, parameters, step(), the exact full-batch gradient and the optimizer.
#pragma once

#include <stealbatch/error.hpp>
#include <stealbatch/runtime/cluster.hpp>
#include <stealbatch/runtime/communicator.hpp>
#include <stealbatch/runtime/device.hpp>
#include <stealbatch/runtime/device_spec.hpp>
#include <stealbatch/runtime/optimizer.hpp>
#include <stealbatch/runtime/parameters.hpp>
#include <stealbatch/runtime/telemetry.hpp>
#include <stealbatch/scheduler/scheduler.hpp>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace stealbatch {

// kAuto (the default): kThroughput with stealing, kEqual without (a static run splits equally, as DDP does).
// kEqual: every step starts from an equal split. kThroughput (stealing only): after the first step, chunks are placed
// in proportion to each device's measured samples/s, the median of its last throughput_window steps, so one outlier
// step does not move the placement. kGiven: in proportion to placement_weights, every step (for instance true speeds
// known in advance: the "oracle" static split of the perf harness). kPreviousStep: in proportion to each device's
// samples/s in the previous step alone, with either policy (with kStatic, the per-step resizing of LB-BSP and DBS).
// kPacked (needs each step's sample costs, Runtime::step's `cost`): before each step the batch's samples are packed
// onto the devices greedily by cost, largest first, each to the device with the least cost so far, blind to the
// devices' speeds; with kStatic, the token-balanced packer of WLB-LLM-style trainers.
//
// With sample costs and kSteal, the placement is in cost, not in samples: kAuto and kThroughput split the batch's cost
// in proportion to each device's measured cost per second, kEqual into equal costs, kGiven by the weights. kStatic
// with costs but without kPacked still splits the samples equally (what DDP's DistributedSampler does).
enum class PlacementPolicy { kAuto, kEqual, kThroughput, kGiven, kPreviousStep, kPacked };

// kFixed: every chunk holds chunk_size samples (the last may hold fewer). kBySpeed (with kThroughput placement and
// stealing, once speeds are measured): each device's samples are cut into chunks sized to its speed, chunk_size
// on the fastest device and proportionally fewer (at least 1) on slower ones, so every chunk takes about as long;
// the end of each device's share (its last six chunks' worth) is cut finer, each chunk a sixth of what is left, down
// to a quarter chunk, so the step ends on small chunks (detail::kTailChunks).
enum class ChunkSizing { kFixed, kBySpeed };

// kOn: once devices' speeds are measured, a slow device stops taking chunks when the faster ones would finish
// the rest of the step sooner (Scheduler::set_chunk_costs). This shortens the step and lowers the slow device's
// utilization. kOff: every device takes chunks until none is left.
enum class EndGame { kOn, kOff };

// kFail: a device lost during a step fails the step with a ChunkError (cause: DeviceLostError). kExclude: the device
// is dropped, the chunks it had run this step or held are re-run on the survivors, the reduction leaves it out,
// the step's gradient is still exact, and later steps run on the survivors (StepReport::excluded_devices).
enum class OnDeviceFailure { kFail, kExclude };

// Simulated devices: a chunk takes call_seconds + sample_seconds x (the sum of its samples' costs) / speed, slept out
// on the host, while the chunk function computes the real gradient.
struct SimOptions {
  double sample_seconds = 100e-6;                      // seconds per sample at speed 1, [0, 1]
  // What each call costs whatever it holds, at any speed: a GPU's kernel launches and their latency, an eager
  // framework's dispatch. 0: a chunk's time is its samples'. Seconds, [0, 1].
  double call_seconds = 0;
  std::function<double(std::uint32_t)> sample_cost{};  // a sample's relative cost (default 1)
  // A stolen chunk's inputs cross a link first: bytes_per_sample * samples / link_bw + link_latency seconds. The
  // AllReduce of allreduce_bytes follows the ring model 2 (n - 1) / n * bytes / busbw + link_latency
  // (SimRingCommunicator). Zero bytes: no cost.
  double bytes_per_sample = 0;                         // [0, 1e9]
  double link_bw = 25e9;                               // bytes/s, [1, 1e15]
  double link_latency = 10e-6;                         // seconds, [0, 1]
  double allreduce_bytes = 0;                          // [0, 1e12]
  double busbw = 100e9;                                // bytes/s, [1, 1e15]
  // A factor on device d's speed at (step, seconds into the step), for speed changes during a run (default 1).
  // Called on the device's thread at each chunk's start.
  std::function<double(std::size_t device, std::uint64_t step, double seconds_into_step)> speed_factor{};
  // A worker takes its next chunk only when the work its device has queued would run out within this many seconds
  // (and fewer than in_flight are queued), so chunks stay in the deques, where idle devices can steal them, until
  // just before they are needed. 0: as soon as fewer than in_flight are queued. The default is several timer
  // overshoots of a loaded host. [0, 1].
  double launch_lead = 0.5e-3;
};

// How a step's samples are cut into chunks, placed, stolen and ended. Every rank of a job must agree on these.
struct ScheduleOptions {
  // Samples per chunk, [1, 1048576] (on the fastest device, with kBySpeed sizing); or 0: each device's chunk is
  // the smallest size that reaches 95% of its best measured throughput (detail::ChunkSizer): large enough for its
  // kernels, as small as that allows for the step's tail; alone or under kStatic, with no tail to share, its best.
  // A device's first step runs chunks of several sizes, whose times give its fixed cost per call, and the sizer
  // starts from the size that predicts. StepReport's DeviceReport::chunk_samples tells the sizes.
  std::size_t chunk_size = 0;
  SchedulePolicy policy = SchedulePolicy::kSteal;  // kStatic: no stealing (the DDP baseline)
  PlacementPolicy placement = PlacementPolicy::kAuto;
  std::vector<double> placement_weights{};         // kGiven: one weight >= 0 per device (refused with another placement)
  ChunkSizing chunk_sizing = ChunkSizing::kBySpeed;
  EndGame endgame = EndGame::kOn;
  // With kSteal: a thief runs the chunks it takes in one steal (contiguous samples) in one call of the chunk
  // function, up to its own chunk size, instead of one call each (ChunkContext::chunks lists them). A fast device
  // that steals a slow one's small chunks then pays a call's fixed cost (an eager framework's, a kernel launch) once,
  // and runs larger GEMMs. The gradient is the same sum. On by default: it took 12% off a libtorch CNN's stealing epoch,
  // and left two MLPs' (hand-written, libtorch) within 5%, either way (perf/README.md, merged steals). A chunk function that
  // reads ctx.samples sees no difference; code keyed on chunk ids reads ctx.chunks, or turns this off for one call
  // per chunk (ctx.chunk is then the call's one chunk).
  bool merge_stolen = true;
  // With kSteal, kThroughput and kBySpeed on CPU or simulated devices: learn, from chunk times, what each batch
  // position costs apart from each device's speed, and place by cost when that predicts chunk times far better than
  // samples/s does (a batch whose cost depends on position: several sources in fixed proportions, data sorted by
  // length). See detail/cost_profile.hpp; StepReport::placed_by_cost tells when a step was.
  bool cost_by_position = true;
  std::size_t throughput_window = 5;               // steps in the throughput median, [1, 100]
  std::uint64_t seed = 0x5eedba7c;                 // victim order
  // Bit-identical results whatever the placement, the stealing, the device count and the rank count: the parameters
  // after N steps are the same bytes on cpu:1 and on sim:1,0.3,2,1, static or stealing, in one process or across 4
  // ranks, after a device lost and excluded, and resumed from a checkpoint. How:
  //   - cells: the batch is cut into chunks that do not depend on the devices, chunk_size samples each (0: the batch / 16, at
  //     most 64), or with sample costs that many samples of the batch's mean cost; shares are whole cells,
  //     chunk_sizing does not apply, and merged steals run each cell in its own call;
  //   - each cell's gradient is computed on its own, on one thread (CPU devices' threads_per_device is 1; simulated
  //     devices run chunks in a one-thread arena), and rounded to 64-bit fixed point, whose sum is exact in any order
  //     (detail/fixed_point.hpp: the format, its error bound and when a step is redone).
  // What it asks of the chunk function: a cell's gradient that depends only on the parameters and the cell's samples
  // (no state carried from chunk to chunk, no randomness but the samples' own). What it does not promise: the same
  // bits on another CPU (the kernels' instruction set), or a loss, a placement or a speed that do not depend on timing.
  // CPU and simulated devices; placement = packed is refused (it orders samples by device count).
  bool deterministic = false;
};

// CPU and simulated devices (host memory).
struct HostOptions {
  // Per device, each in [1, 1000]; empty = all 1. Across ranks, one factor per device of the whole job (rank order).
  std::vector<double> slowdown{};
  int threads_per_device = 0;                      // CPU devices; 0 = cores / devices, at least 1
};

// GPU devices (and, for in_flight, simulated ones).
struct GpuOptions {
  std::size_t in_flight = 2;                       // chunks launched and not yet finished, [1, kMaxInFlight]
                                                   // (a worker may wait for in_flight - 1 chunks at once: keep stall_timeout above that)
  GpuWait wait = GpuWait::kSpin;                   // how a worker waits for its chunks (see GpuWait)
  // A chunk's inputs are gathered on the host, sample after sample, into pinned staging, then copied to the device
  // (ChunkContext::input). gather(sample, dst) writes input_bytes bytes of that sample at dst.
  std::size_t input_bytes = 0;                     // [0, 1 << 30]; 0 = no inputs travel (the chunk function finds its own)
  std::function<void(std::uint32_t sample, std::byte* dst)> gather{};
  // Samples [0, resident) held on each GPU device: gathered once, at its start, through `gather`, then a chunk's rows
  // are gathered on the device by index (its sample ids copied, not its inputs), as a PyTorch user with the data on the
  // GPU does. 0 = every chunk's inputs gathered on the host and copied. input_bytes must then be a multiple of 4, and a
  // chunk with a sample id >= resident fails, naming it.
  std::size_t resident = 0;
  // Chunk calls replayed from CUDA graphs, one per sample count and staging slot: a count's first call runs as is, its
  // second is captured, and later ones replay that graph (one launch for the chunk's kernels). Only for a chunk
  // function that enqueues all its work on ctx.stream, reads its inputs from ctx.input, and whose kernels and
  // workspace depend on the sample count alone: a replay runs none of its host code (no ctx.add_loss, no reading
  // ctx.samples' ids). A call that cannot be captured runs as is, with a warning; one whose workspace grows while
  // captured fails with a ConfigError.
  bool graphs = false;
};

// A multi-process run (stealbatch::mpi::MpiCluster): every rank makes its own Runtime with its own devices and calls
// step() with the same batch, in the same order. Chunk ids are global; each rank's share follows its devices' measured
// speed; a rank whose devices run dry takes chunks from another rank's share with one-sided atomics; the gradient is
// reduced within the rank, then across ranks, and divided by the global batch, so every rank's parameters stay the
// same. CPU and simulated devices.
// The gradient's format on the wire across ranks.
enum class WireFormat { kFloat32, kBfloat16 };

struct ClusterOptions {
  std::shared_ptr<Cluster> job{};                  // empty: this process alone
  // kBfloat16: the gradient crosses the ranks in bfloat16, half float's bytes, as DDP's bf16_compress_hook sends it;
  // each device still sums its chunks in float, and each element of the job's sum lies within gamma_R times the sum
  // of the ranks' magnitudes of the exact sum (Cluster::allreduce_sum_bf16: 0.79% at 2 ranks). CPU and simulated devices, not in
  // deterministic mode (whose sum is exact in fixed point); with no cluster there is no wire, and it is refused.
  WireFormat wire = WireFormat::kFloat32;
  // Every rank's runtime beats a heartbeat from a thread of its own, whatever the rank is doing (a long chunk, an
  // evaluation, a checkpoint). A rank whose heartbeat stops for heartbeat_timeout seconds, because its process is
  // frozen or gone or its node is unreachable, ends the job on every other rank, within heartbeat_timeout plus a
  // tenth of it; the message names the rank, its node, and the step and chunk it was in. (0, 86400].
  double heartbeat_timeout = 10;
  // A rank whose own share is empty asks the others for work: its own node's ranks, then those of other nodes. Up
  // to 64 ranks on other nodes (probes = 0, auto) it reads every one, and leaves the chunk phase only once none holds
  // work worth stealing. Beyond, a read across nodes costs microseconds (RDMA) to milliseconds (TCP) and every rank
  // reading every other one at each step's end grows with the job: each call then reads its node and `probes` ranks
  // of other nodes drawn afresh (auto: 2 x ceil(log2 ranks), at least 16), and a rank leaves after a call that
  // finds nothing there; once the ranks' speeds are measured a call also stops reading when it has taken as long
  // as one of the rank's full chunks on one of its devices. Every chunk still runs exactly once (an owner runs
  // whatever is left of its share); what a rank that left could still have stolen is the balance given up
  // (perf/cluster_model.py measures it). A number sets the draw at any size (at or above the other nodes' ranks:
  // read them all). [0, 1 << 20].
  std::size_t probes = 0;
  // The trainer's own settings that every rank must share (its seed, epochs, data...), as name and value. The
  // runtime checks them with its own (the options that shape a step) when the ranks join, the parameter layout and
  // initial values at register_parameters(), and each step's batch (a hash of its sample ids) and learning rate
  // before the step's first collective: a disagreement throws ConfigError on every rank, naming the field, the ranks
  // and both values.
  std::vector<std::pair<std::string, std::string>> agree_on{};
};

// A runtime's settings, grouped by what they configure; each group is validated with the rest by validate().
//   Runtime rt({.devices = "cpu:4"});
//   Runtime rt({.devices = "sim:1,1,0.5", .schedule = {.chunk_size = 32, .policy = SchedulePolicy::kStatic}});
struct RuntimeOptions {
  std::string devices{};                           // "cpu:4", "cuda:all", "cuda:0,1", "vgpu:64,16", "sim:1,1,0.5"; empty = every GPU if
                                                   // there is one (with the CUDA backend enabled), else one CPU device per core, up to 4
  ScheduleOptions schedule{};
  OptimizerOptions optimizer{};
  HostOptions host{};
  GpuOptions gpu{};
  SimOptions sim{};                                // simulated devices ("sim:..." specs)
  ClusterOptions cluster{};
  // The stall watchdog: a step in which some device has been inside one chunk for longer than stall_timeout
  // seconds fails with a TimeoutError, and that device's waits are cancelled. (0, 86400]; default 10 minutes.
  // Across ranks, a rank whose step makes no progress for stall_timeout seconds (stuck, or not calling step() with
  // the others) ends the job too.
  double stall_timeout = 600;
  OnDeviceFailure on_device_failure = OnDeviceFailure::kFail;
  std::string trace_path{};                        // Chrome Trace Event JSON; empty = no trace
};

// Checks every option against its range (and the ones that depend on each other) before anything is built; throws
// ConfigError naming the field, the value and what is valid. The Runtime's constructor calls it first. (Options
// that depend on the devices, such as the length of slowdown, are checked once the devices are known.)
void validate(const RuntimeOptions& options);
// Each group's own checks (validate(RuntimeOptions) runs them all, then what depends on several groups).
void validate(const ScheduleOptions& o);
void validate(const HostOptions& o);
void validate(const GpuOptions& o);
void validate(const SimOptions& o);
void validate(const ClusterOptions& o);

// A family of devices: the library's own for cpu: and sim: specs, and the CUDA backend (stealbatch::cuda), which
// registers one for cuda: and vgpu: specs (stealbatch::cuda::enable()). Without it, those specs fail with a
// ConfigError that says so.
class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;
  // Devices usable now (GPUs); 0 when there are none. Never throws.
  virtual std::size_t available() const noexcept = 0;
  virtual std::vector<std::unique_ptr<Device>> make_devices(const DeviceSpec& spec, const RuntimeOptions& options) = 0;
  // The reduction across the devices make_devices() returned.
  virtual std::unique_ptr<Communicator> make_communicator(std::span<Device* const> devices) = 0;
  // Across ranks (devices that do not share host memory): one reduction over every device of the job, this rank's
  // `devices` being the job's devices [first, first + devices.size()) of `total`. The default says it cannot.
  virtual std::unique_ptr<Communicator> make_cluster_communicator(std::span<Device* const> devices, Cluster& cluster, std::size_t first,
                                                                   std::size_t total);
  // Devices in this process's memory whose chunks are done when run_chunk() returns (CPU, simulated): the runtime
  // keeps one shared copy of their parameters and fuses the reduction with the update, slice by slice.
  virtual bool shares_host_memory() const noexcept { return false; }
  // Devices that leave the host's cores idle while their chunks run (simulated ones sleep): the runtime's own
  // bookkeeping may run meanwhile.
  virtual bool leaves_cores_idle() const noexcept { return false; }
};
// Registers the backend for a kind of device spec (kCuda, kVgpu, or a stand-in for kCpu or kSim in a test); a later
// registration replaces an earlier one, and nullptr restores the built-in one where there is one. The registry is
// one per process and locked: any thread may register and look up at any time. A Runtime takes its backend once, when
// it is made, and holds it for its life: what is registered later changes only the runtimes made after.
void register_device_backend(DeviceKind kind, std::shared_ptr<DeviceBackend> backend);
std::shared_ptr<DeviceBackend> device_backend(DeviceKind kind);

namespace testing {
struct RuntimeAccess;
}  // namespace testing

// A trainer's own entries in a checkpoint (epoch, step, seed, data position): strings, as safetensors stores them.
using CheckpointMetadata = std::map<std::string, std::string>;

// "static", "steal" or "central"; throws ConfigError naming the field ("policy").
SchedulePolicy parse_policy(std::string_view name);

// A training runtime. One worker thread per device runs chunks; idle devices steal from busy ones; each
// device accumulates its chunks' gradients into its own buffer; one AllReduce sums them; dividing by the step's
// sample count gives the full-batch mean gradient, which the optimizer applies to every replica. (GPUs keep a
// replica each; CPU and simulated devices, in one address space, share one, which each device's worker updates
// slice by slice in the reduction phase.)
//
//   Runtime rt({.devices = "cpu:4", .schedule = {.chunk_size = 32}});
//   rt.register_parameters(layout, initial_values);
//   StepReport r = rt.step(batch_indices, [&](ChunkContext& ctx) { model.accumulate(ctx); });
class Runtime {
 public:
  explicit Runtime(RuntimeOptions options);
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  // Sets the layout and the initial values (copied to every replica). Throws ConfigError if the sizes differ.
  void register_parameters(ParameterLayout layout, std::span<const float> initial);

  // One training step over the samples (their indices), then the optimizer update. A chunk function that throws
  // fails the step with that exception; nothing is applied, and the next step runs normally.
  //
  // `cost` (optional): each sample's cost, one finite positive number per sample, in the batch's order (its tokens,
  // or any estimate of its compute). With stealing, chunks are then cut to a cost budget (chunk_size samples of the
  // batch's mean cost, so a chunk of long documents holds fewer of them) and shares are placed by cost; the runtime
  // learns each device's cost per second, and its time per call against the cost it held (call_cost()), from the
  // chunk times. The cost is an estimate: stealing corrects what it gets wrong. Across ranks, every rank gives the same
  // costs (checked: a rank that differs is named), and the ranks' shares are placed by each rank's cost per second.
  //   rt.step(batch, chunks.function(), tokens);   // tokens[i]: the length of sample batch[i]
  StepReport step(std::span<const std::uint32_t> samples, const ChunkFunction& fn, std::span<const double> cost = {});
  // As step(), without the update: the reduced mean gradient is left in gradient().
  StepReport compute_gradient(std::span<const std::uint32_t> samples, const ChunkFunction& fn, std::span<const double> cost = {});

  // Sets every replica's learning rate for the following steps (a schedule); throws ConfigError outside (0, 10].
  // The replicas take it in the next step's update phase, so a schedule that changes it every step costs no
  // extra round trip to the devices.
  void set_learning_rate(float lr);

  // Checkpoints, in safetensors (docs/DESIGN.md, "Checkpoints"). save_checkpoint() writes the parameters under their
  // layout names and shapes, the optimizer's state (optimizer.NAME.m, and optimizer.NAME.v for Adam), its kind,
  // settings, learning rate and step count, the devices' measured speeds, and `metadata` (no key may begin with
  // "stealbatch."), with the crc32 of the data, crash-safe: the file at `path` is the old one or the new one
  // whole, whenever the process dies. GPU replicas are copied from the device. Call it between steps. Across ranks
  // every rank calls it at the same point: rank 0 writes, and every rank returns once it has (or throws).
  //   rt.save_checkpoint(dir.path_for(step), {{"epoch", "3"}, {"step", "702"}});
  void save_checkpoint(const std::filesystem::path& path, const CheckpointMetadata& metadata = {}) const;
  // Restores what save_checkpoint() wrote into every replica and returns the trainer's metadata. Everything is
  // checked before anything is applied: a file that is missing, truncated or corrupt, a checksum that differs, a
  // layout that differs (a name, a shape, a count) or an optimizer of another kind or settings throws a
  // CheckpointError naming the file and the mismatch, and the runtime is as it was. The saved learning rate holds
  // until set_learning_rate(); the saved speeds place the next step when the devices are the same (one process).
  // Across ranks every rank reads the file, at the same point, and none applies it unless all read the same bytes.
  CheckpointMetadata load_checkpoint(const std::filesystem::path& path);

  std::size_t device_count() const noexcept;
  const Device& device(std::size_t i) const;
  const ParameterLayout& layout() const noexcept;
  // A host copy of a replica's parameters, the caller's own (GPU replicas are copied from the device; CPU and
  // simulated devices share one). Keep the vector while a view of it is in use:
  //   const std::vector<float> p = rt.parameters();  const auto w = rt.layout().view(std::span<const float>(p), w_id);
  std::vector<float> parameters(std::size_t device = 0) const;
  // The full-batch mean gradient of the last compute_gradient().
  std::span<const float> gradient() const noexcept;
  const RuntimeOptions& options() const noexcept;
  // The current placement weights (samples/s per device: each device's median, pooled where the devices differ no
  // more than their noise, see detail::pooled_speeds); empty before the first step.
  std::vector<double> throughput_estimates() const;
  std::uint64_t trace_events_dropped() const noexcept;
  // With chunk_size = 0: device d's measured throughput against chunk size, (samples per chunk, samples/s), from
  // the chunk sizes it has run so far.
  std::vector<std::pair<std::size_t, double>> chunk_curve(std::size_t device) const;
  // With sample costs (step()'s `cost`), on CPU and simulated devices: device d's time per call against the cost the
  // call held, t = per_call + per_unit * cost (seconds; cost in the trainer's units), fitted over its last 128 calls.
  // calls = 0 until 8 calls are known.
  struct CallCost {
    double per_call = 0, per_unit = 0;
    std::size_t calls = 0;
  };
  CallCost call_cost(std::size_t device) const;

 private:
  friend struct testing::RuntimeAccess;  // stealbatch/runtime/testing.hpp: fault injection
  struct Impl;  // runtime/src/step/runtime_impl.hpp
  std::unique_ptr<Impl> m;
};

}  // namespace stealbatch
