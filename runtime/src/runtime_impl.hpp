// The Runtime's state, and the phases of a step; each phase lives in the source file named beside it.
#pragma once

#include <stealbatch/runtime/detail/chunk_sizer.hpp>
#include <stealbatch/runtime/detail/cost_profile.hpp>
#include <stealbatch/runtime/detail/heartbeat.hpp>
#include <stealbatch/runtime/cluster.hpp>
#include <stealbatch/runtime/runtime.hpp>
#include <stealbatch/scheduler/scheduler.hpp>

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace stealbatch {

using Clock = std::chrono::steady_clock;

inline double seconds(std::chrono::nanoseconds d) { return std::chrono::duration<double>(d).count(); }

// The watchdog's mark for a device busy in the reduction or the update rather than in a chunk.
inline constexpr ChunkId kReductionPhase = ~ChunkId{0};
// A chunk's home device when that device was lost during the step (the chunk counts as moved wherever it ran).
inline constexpr std::uint32_t kHomeLost = ~std::uint32_t{0};

// A device's tallies for this step (the replica itself lives in the Device). Aligned so that two devices' tallies
// never share a cache line.
struct alignas(detail::kCacheLine) Replica {
  double loss = 0;
  std::uint64_t samples = 0;
  // How long finish_chunks() waited this step for chunks still in flight (a GPU, a simulated device): device time
  // of this step's chunks that the worker's busy time in the chunk phase does not hold.
  Clock::duration finish{};
  Clock::time_point device_end{};  // the end of the device's last chunk this step, on its own timeline (if it keeps one)
  Clock::duration update{};         // its part of the fused update this step (shared host parameters)
  Clock::duration model_wait{};     // how long it slept out a modelled reduction for all (0 for all but one)
  double live_factor = 1.0;         // this step: how much slower than measured its own chunks now run
  double last_ratio = 0.0;          // this step: its last own chunk's time over what its measured speed predicted
  // The stall watchdog's view, written by the device's worker and read by the caller's thread: when the chunk
  // now running started (ns since the runtime's creation; 0 when none runs), and which chunk. Relaxed: a timer
  // that may read a value a moment old, nothing is published through it.
  std::atomic<std::int64_t> chunk_started_ns{0};
  std::atomic<ChunkId> current_chunk{0};

  void reset_step() noexcept { loss = 0, samples = 0, device_end = {}, live_factor = 1.0, last_ratio = 0.0, model_wait = {}; }
};

// Marks a device as busy (in chunk `what`, or kReductionPhase) for the stall watchdog, for the stamp's lifetime.
// Relaxed stores: see Replica.
struct WatchStamp {
  std::atomic<std::int64_t>& started;
  WatchStamp(Replica& r, ChunkId what, Clock::time_point epoch, Clock::time_point now = Clock::now()) : started(r.chunk_started_ns) {
    r.current_chunk.store(what, std::memory_order_relaxed);
    started.store(std::max<std::int64_t>(1, (now - epoch).count()), std::memory_order_relaxed);
  }
  ~WatchStamp() { started.store(0, std::memory_order_relaxed); }
  WatchStamp(const WatchStamp&) = delete;
  WatchStamp& operator=(const WatchStamp&) = delete;
};

// Appends `value` to a window of the last `size` (>= 1) values, dropping the oldest.
inline void push_window(std::vector<double>& window, double value, std::size_t size) {
  if (window.size() >= size) window.erase(window.begin(), window.end() - static_cast<std::ptrdiff_t>(size - 1));
  window.push_back(value);
}

struct ChunkSpan {
  std::uint32_t begin;
  std::uint32_t size;
};

// A step across ranks: what every rank computes alike from the same inputs (the step's tag, the ranks' speeds, each
// rank's share of the global chunk ids), and this rank's victims. Empty in one process.
struct RankShares {
  std::uint16_t tag = 0;                // 1 to 65535, from the step count: never a fresh share word's 0
  std::size_t me = 0;                   // this rank
  std::vector<double> speed;            // each rank's samples/s (equal placeholders until every rank is measured)
  bool measured = false;
  std::vector<std::size_t> chunk;       // each rank's full chunk, in samples
  std::vector<ChunkRange> share;        // each rank's chunk ids
  std::vector<std::uint64_t> before;    // the samples of chunks [0, c): what a share word holds, from two reads
  std::vector<int> victims;             // the other ranks of this node first, then the rest, each list starting after this rank
  bool active() const noexcept { return !share.empty(); }
  detail::ShareWord word_of(std::size_t r) const noexcept {
    return {tag, static_cast<std::uint32_t>(share[r].begin), static_cast<std::uint32_t>(share[r].end)};
  }
};

// How the step's samples are divided: equally (or by given weights), by measured samples/s, or by learnt
// batch-position costs (detail::CostProfile).
enum class Placement { kEqualOrGiven, kBySpeed, kByCost };
// How shares are cut into chunks: chunk_size everywhere (the last may hold fewer); each device's chunk from its
// measured curve (chunk_size = 0, detail::ChunkSizer); chunks sized to each device's speed with a share's end cut
// finer (stealing, 2+ devices); or across ranks, each rank's share cut to its speed (cluster_step.cpp).
enum class Cutting { kFixed, kSized, kBySpeed, kRankShares };

// How a step is placed: what is known of the devices and which rules apply (chunk_table.cpp).
struct StepPlan {
  std::vector<double> speeds;  // samples/s per device; empty until measured
  std::vector<double> rate;    // each device's speed in cost units per second (samples/s, or the profile's speeds)
  std::span<const double> position_cost;  // kByCost: each batch position's cost (read before the chunk phase only)
  bool known = false;          // every device has a measured speed
  Placement placement = Placement::kEqualOrGiven;
  Cutting cutting = Cutting::kFixed;
  bool finer_ends = false;     // a share's end cut finer (kSized with stealing on 2+ measured devices)
  bool learn_costs = false;    // the cost profile learns from this step
  bool watch_speed = false;    // the end game weighs a device at what its chunks take now (set_live_factor)
  double outside_rate = 0;     // across ranks: the other ranks' devices, in this rank's full chunks per second
  RankShares ranks;            // across ranks: the shares of the step's global chunk ids
  bool by_cost() const noexcept { return placement == Placement::kByCost; }
  bool sized() const noexcept { return cutting == Cutting::kSized; }
  // A chunk of the rank's own share (across ranks, any of its devices may have claimed it): it tells the device that
  // ran it its speed, as a device's own chunks do in one process.
  bool in_rank_share(ChunkId c) const noexcept {
    return ranks.active() && c >= ranks.share[ranks.me].begin && c < ranks.share[ranks.me].end;
  }
};

// The step's chunks and where they were placed and ran (chunk_table.cpp fills the first part; the chunk phase the
// second).
struct ChunkTable {
  std::vector<ChunkSpan> spans;          // chunk c covers samples [spans[c].begin, spans[c].begin + spans[c].size)
  std::vector<ChunkRange> ranges;        // each device's placed chunks
  std::vector<double> chunk_cost;        // each chunk's cost in the units of StepPlan::rate
  std::vector<double> own_cost;          // each device's own chunk, in cost units (samples when flat)
  std::vector<std::size_t> own_size;     // each device's own chunk, in samples
  std::vector<std::uint32_t> share_len;  // each device's share, in samples (sized)
  std::size_t full_chunk = 0;            // a full chunk, in samples: what a stolen chunk is at most

  std::vector<std::uint32_t> home;      // where each chunk was placed (kHomeLost once its device was lost)
  std::vector<std::uint32_t> ran_on;    // which device ran it
  std::vector<std::uint8_t> runs;       // how many times it ran: the exactly-once check, chunk by chunk
  std::vector<float> stolen_ratio;      // watch_speed: a stolen chunk's time over what its thief's speed predicts
  std::vector<double> took_s;           // learn_costs: its time on its device
  std::vector<double> compute_s;        // sized: its compute time where the device knows it, else its time
  std::size_t size() const noexcept { return spans.size(); }
  // Device `dead` was lost mid-step: the tables re-indexed to the devices that remain, and what it ran or held marked
  // as not run. Returns the chunks nobody has run now, in id order.
  std::vector<ChunkId> drop_device(std::size_t dead);
};

// What the chunk phase left for the report.
struct ChunkPhase {
  StepStats stats;
  std::vector<std::string> excluded;  // devices lost and dropped this step
  std::uint64_t rerun = 0;            // chunks re-run on the survivors
  Clock::time_point start, end;
  // Across ranks: a failure is carried to every rank by the reduction (and rethrown there), not thrown here; the
  // chunks taken from other ranks' shares and the steals that took them; the last call for work that found none.
  std::exception_ptr failure;
  std::string failure_text;
  std::uint64_t remote_chunks = 0, remote_steals = 0;
  double leave_s = 0;
};

// Tallies per device that travel with the reduction across ranks: compute seconds, chunks run, chunks stolen,
// samples, chunk size, and its kind (0 cpu, 1 sim, 2 cuda: its name).
inline constexpr std::size_t kTallyDeviceFields = 6;

// The reduction's buffer across ranks: the gradient, then every rank's speed and failure flag, every chunk's run
// count, every device's tallies and every rank's loss sum; each rank writes its own entries and leaves the others 0,
// so the sum is a gather. Empty in one process.
struct RankTally {
  std::size_t count = 0, ranks = 0, chunks = 0, devices = 0;
  std::vector<float> buf;
  RankTally() = default;
  RankTally(std::size_t c, std::size_t r, std::size_t k, std::size_t d)
      : count(c), ranks(r), chunks(k), devices(d), buf(c + 3 * r + k + kTallyDeviceFields * d, 0.0f) {}
  float* grad() { return buf.data(); }
  float* speed() { return buf.data() + count; }
  float* failed() { return speed() + ranks; }
  float* loss() { return failed() + ranks; }
  float* runs() { return loss() + ranks; }
  float* device(std::size_t d) { return runs() + chunks + kTallyDeviceFields * d; }
};

// What the reduction phase left for the report: each device's counters in it (within the process, and across ranks
// the update from the job's sum after it), the sum's tallies across ranks, and when it ended.
struct Reduced {
  StepStats within, applied;
  RankTally tally;
  Clock::time_point end;
};

// What the reduction phase leaves: the sum in every device's buffer (kSum); or, on host devices only, fused into
// that phase slice by slice with the buffers zeroed after, the optimizer update of the shared parameters
// (kUpdate) or the mean gradient in mean_next (kMean).
enum class Reduce { kSum, kUpdate, kMean };

struct Runtime::Impl {
  explicit Impl(RuntimeOptions options);
  ~Impl();

  // One step, for one process and across ranks alike: plan, cut and place the chunks, run them, reduce, report
  // (run_step.cpp). Across ranks, where the devices get their chunks (the ranks' share words) and how the sum crosses
  // processes (the tally) are cluster_step.cpp's; every other phase is the same code.
  StepReport run_step(std::span<const std::uint32_t> samples, const ChunkFunction& fn, Reduce reduce_to);
  // chunk_table.cpp
  StepPlan plan_step(std::size_t batch);
  ChunkTable cut_and_place(std::size_t batch, StepPlan& plan);
  void cut_sized(std::size_t batch, const StepPlan& plan, ChunkTable& t);
  void cut_by_speed(std::size_t batch, const StepPlan& plan, ChunkTable& t);
  void cut_fixed(std::size_t batch, const StepPlan& plan, ChunkTable& t);
  void cut_rank_shares(std::size_t batch, StepPlan& plan, ChunkTable& t);
  void set_endgame_costs(ChunkTable& table, StepPlan& plan);
  // run_chunks.cpp
  void begin_chunk_phase(const ChunkTable& t, Clock::time_point step_start);
  // The chunk phase, from the step's chunk source: each device's own deque, placed per device (one process, with
  // recovery from a lost device), or the ranks' share words, claimed a few chunks at a time (run_from_shares()).
  ChunkPhase run_chunk_phase(std::span<const std::uint32_t> samples, const ChunkFunction& fn, ChunkTable& t, StepPlan& plan,
                             Clock::time_point step_start);
  void run_one(std::size_t w, ChunkId c, std::span<const std::uint32_t> samples, const ChunkFunction& fn, ChunkTable& t, const StepPlan& plan);
  // One call of the chunk function over `chunks`: one chunk, or several contiguous ones a thief stole together
  // (descending, as mergeable() chose them), with every chunk's bookkeeping.
  void run_call(std::size_t w, std::span<const ChunkId> chunks, std::span<const std::uint32_t> samples, const ChunkFunction& fn, ChunkTable& t,
                const StepPlan& plan);
  void run_guarded(std::size_t w, std::span<const ChunkId> chunks, ChunkContext& ctx, const ChunkFunction& fn);  // faults, and errors named
  void record_call(std::size_t w, std::span<const ChunkId> chunks, const ChunkContext& ctx, Clock::time_point t0, ChunkTable& t, const StepPlan& plan);
  void watch_live_speed(std::size_t w, std::span<const ChunkId> chunks, double ratio, double took, ChunkTable& t, const StepPlan& plan);
  // How many of `more` (stolen after `first`, in the victim's order) run with it in one call on device w: those that
  // continue its span downward, up to w's own chunk size and `largest` (what the devices reserved for).
  std::size_t mergeable(std::size_t w, ChunkId first, std::span<const ChunkId> more, const ChunkTable& t, std::size_t largest) const noexcept;
  ChunkPhase run_with_recovery(std::span<const std::uint32_t> samples, const ChunkFunction& fn, ChunkTable& t, StepPlan& plan,
                               Clock::time_point step_start);
  void recover_lost_device(std::size_t dead, ChunkTable& t, StepPlan& plan, ChunkPhase& phase, const ChunkFn& run);
  void exclude_device(std::size_t position);
  // reduce.cpp: within the process (fused with the update on host devices in one process), then what crosses the
  // ranks' sum: the update from it (host devices) or the devices' own collective.
  StepStats reduce_within(std::size_t batch, Reduce reduce_to, const ChunkTable& t, RankTally& tally);
  StepStats finish_reduction(std::size_t batch, Reduce reduce_to, RankTally& tally);
  void update_slice(std::size_t d, std::span<const float> sum, float scale, Reduce reduce_to);
  // step_report.cpp
  std::vector<DeviceReport> device_reports(const ChunkTable& t, const ChunkPhase& phase);
  StepReport build_report(std::size_t batch, const ChunkTable& t, const StepPlan& plan, ChunkPhase& phase, std::vector<DeviceReport> local,
                          Reduced& reduced);
  void learn_from_step(std::size_t batch, const ChunkTable& t, const StepPlan& plan, const ChunkPhase& phase, const std::vector<DeviceReport>& local);
  // cluster_step.cpp: this rank's part of a job across ranks (options.cluster)
  void join_cluster(DeviceSpec& spec);
  void begin_rank_step(std::span<const std::uint32_t> samples, Reduce reduce_to);  // the step's agreement, and the progress word
  void plan_ranks(std::size_t batch, StepPlan& plan);                    // the ranks' speeds, the step's tag, the victims
  ChunkPhase run_from_shares(std::span<const std::uint32_t> samples, const ChunkFunction& fn, ChunkTable& t, StepPlan& plan,
                             Clock::time_point step_start);
  // The tally across ranks, with the step's watch while waiting; a failure anywhere rethrown everywhere, exactly-once
  // checked over the job, the ranks' speeds learnt.
  void sum_across_ranks(const ChunkTable& t, const ChunkPhase& phase, const std::vector<DeviceReport>& local, RankTally& tally);
  void add_rank_devices(StepReport& rep, RankTally& tally, std::vector<DeviceReport> local);
  void publish_progress();  // this rank's progress word: the step it is in, and one more beat
  void watch_cluster();     // publishes this rank's progress and where it is; ends the job when another rank has stopped making progress
  // runtime.cpp: what step() and compute_gradient() do after the step's reduction
  void switch_shared_params(StepReport& rep);
  void update_replicas(StepReport& rep, std::size_t batch);
  void take_mean_gradient(std::size_t batch);
  StepReport finish_step(StepReport rep, Clock::time_point t_start);
  // runtime.cpp
  void make_communicator();
  void make_scheduler();
  std::exception_ptr check_stalls();
  void learn_pending_observation() noexcept;
  std::vector<double> throughput_estimates() const;

  RuntimeOptions options;
  DeviceKind kind = DeviceKind::kCpu;
  std::shared_ptr<DeviceBackend> backend;
  std::vector<std::unique_ptr<Device>> devices;
  std::vector<std::unique_ptr<Replica>> replicas;
  std::unique_ptr<Communicator> comm;
  std::unique_ptr<TraceWriter> trace;
  ParameterLayout layout;
  std::vector<float> mean_grad;
  std::vector<float> mean_next;  // host devices: the mean being written in the reduction phase
  std::vector<std::vector<double>> speed_history;  // per device, the last samples/s measurements
  // Per device, how much slower than their thieves' own speed predicts its chunks ran on them (the last few stolen
  // chunks): samples that cost more where this device's share lies, not a slower device.
  std::vector<std::vector<double>> stolen_slowness;
  detail::CostProfile cost_profile;  // costs by batch position, apart from device speeds (cost_by_position)
  detail::ChunkSizer chunk_sizer;    // each device's chunk size (chunk_size = 0)
  // The last step's chunk times, for the profile to learn from (simulated devices: while the next step's chunks run).
  struct PendingObservation {
    std::vector<detail::CostProfile::ChunkTime> chunks;
    std::vector<double> flat_speeds;
    std::size_t batch = 0, devices = 0;
    bool ready = false;
  } pending_observation;
  std::vector<std::size_t> idle_steps;  // per device, consecutive steps in which it ran nothing
  Clock::time_point epoch;
  std::uint64_t steps = 0;
  bool grads_dirty = false;
  bool lr_pending = false;      // set_learning_rate() ran since the last update: the replicas take options.optimizer.lr
  bool host_devices = false;    // CPU or simulated devices: a chunk's time is known when its call returns
  bool learn_while_running = false;  // devices that sleep through their chunks: the profile learns during the next step
  // Host devices share one copy of the parameters and one optimizer: each device's worker reduces and updates its
  // own slice of them in one phase, instead of every device updating a full replica of its own. Double-buffered:
  // the update writes the other buffer (and the optimizer's next state), and only a step that completed switches
  // to it, so a step that fails in that phase leaves nothing applied.
  std::array<std::vector<float>, 2> shared_params;
  std::size_t shared_live = 0;  // the buffer the devices read
  std::unique_ptr<Optimizer> shared_optimizer;
  std::vector<std::size_t> ids;              // each device's index at creation (stable across exclusions)
  std::vector<std::unique_ptr<Device>> lost;  // excluded devices, kept until the runtime goes
  // A multi-process run (options.cluster): each rank's device count and this rank's first device's global index; each
  // rank's measured samples/s over the last steps (the same on every rank: gathered with the reduction); the steps
  // run across the ranks (every rank counts the same, failed ones too: the share words' tag); and, for the watch, the
  // last progress word seen of each rank and since when.
  std::shared_ptr<Cluster> cluster;
  std::vector<std::size_t> rank_devices;
  std::size_t first_device = 0;
  std::vector<std::vector<double>> rank_speed_history;
  std::uint64_t cluster_steps = 0;
  std::uint64_t cluster_step_now = 0;  // the step this rank is in, or last was in (1, 2, ...): the progress word's high half
  std::uint64_t progress = 0;  // this rank's progress word's low half (bumped by watch_cluster)
  std::int64_t clock_offset_ns = 0;  // add to this rank's times (since its epoch) to put them on rank 0's timeline
  std::vector<detail::StillWord> peers_seen;  // each rank's progress word, as the step's watch last read it
  std::unique_ptr<detail::Heartbeat> heartbeat;  // across ranks: this rank's pulse and the watch on the others'
  std::unique_ptr<Scheduler> sched;  // last: its workers stop before the devices and replicas go
};

}  // namespace stealbatch
