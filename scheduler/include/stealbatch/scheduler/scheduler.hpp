// Runs one step's chunks to completion across N worker threads, each chunk exactly once, with stealing.
#pragma once

#include <stealbatch/scheduler/chunk_deque.hpp>
#include <stealbatch/scheduler/endgame.hpp>
#include <stealbatch/scheduler/event_count.hpp>
#include <stealbatch/scheduler/idle.hpp>
#include <stealbatch/scheduler/placement.hpp>
#include <stealbatch/scheduler/victim.hpp>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <span>
#include <thread>
#include <type_traits>
#include <vector>

namespace stealbatch {

// kOne: a thief takes one chunk per steal (suits expensive chunks). kHalf: half the victim, capped.
enum class StealPolicy { kOne, kHalf };

// kSteal: idle workers steal. kStatic: every worker runs only what it was placed (the equal-split baseline).
// kCentral: the placement is ignored and every chunk goes into one shared lock-free MPMC queue
// (boost::lockfree::queue) that all workers take from: the central-queue baseline, with no locality.
enum class SchedulePolicy { kSteal, kStatic, kCentral };

struct SchedulerOptions {
  std::size_t workers = 1;                         // [1, 4096]
  SchedulePolicy schedule = SchedulePolicy::kSteal;
  VictimPolicy victim = VictimPolicy::kSticky;
  StealPolicy steal = StealPolicy::kHalf;
  std::size_t steal_batch_cap = 8;                 // [1, kMaxStealBatch]; the cap of kHalf
  IdleOptions idle{};
  std::uint64_t seed = 0x5eedba7c;                 // victim order; any value
  std::size_t deque_capacity = 256;                // initial ring size, [2, 2^30]; the ring grows as needed
  // Called once on each worker thread before it runs anything, with the worker index (bind a device here).
  // If it throws, the constructor rethrows the first such error after stopping every worker.
  std::function<void(std::size_t)> on_worker_start{};
};

// What one worker did during one step. Written only by the worker; read by the caller after the step.
struct WorkerCounters {
  std::uint64_t chunks_run = 0;      // chunks this worker ran (a merged call counts each of its chunks)
  std::uint64_t chunks_merged = 0;   // of those, chunks that ran in one call with the chunk before them (ChunkMerge)
  std::uint64_t chunks_stolen = 0;   // chunks it took from other deques (a batch steal counts each chunk)
  std::uint64_t steal_attempts = 0;  // steal calls on a victim
  std::uint64_t failed_steals = 0;   // attempts that returned kEmpty or kRetry
  std::uint64_t parks = 0;           // times it slept with nothing to run
  std::chrono::nanoseconds busy{0};  // inside chunk callbacks
  std::chrono::nanoseconds idle{0};  // looking for work or parked, while the step had chunks left
  std::chrono::nanoseconds last_end{0};  // from the step's start to the end of this worker's last chunk
  std::uint64_t endgame_declines = 0;  // 1 if it left the rest of the step to faster workers (see set_chunk_costs)
};

struct StepStats {
  std::vector<WorkerCounters> workers;
  std::chrono::nanoseconds wall{0};  // from placement to the last worker leaving the step
  std::uint64_t chunks = 0;          // the number of chunks placed
};

namespace detail {

// A non-owning reference to a callable, so a step's callback costs one indirect call and no allocation.
template <class Sig>
class FunctionRef;

template <class R, class... A>
class FunctionRef<R(A...)> {
 public:
  template <class F, class = std::enable_if_t<!std::is_same_v<std::decay_t<F>, FunctionRef>>>
  FunctionRef(F&& f) noexcept  // NOLINT(google-explicit-constructor): used like a function parameter
      : m_obj(const_cast<void*>(static_cast<const void*>(std::addressof(f)))),
        m_call([](void* o, A... a) -> R { return (*static_cast<std::remove_reference_t<F>*>(o))(std::forward<A>(a)...); }) {}
  R operator()(A... a) const { return m_call(m_obj, std::forward<A>(a)...); }

 private:
  void* m_obj;
  R (*m_call)(void*, A...);
};

}  // namespace detail

using ChunkFn = detail::FunctionRef<void(std::size_t worker, ChunkId chunk)>;
using WorkerFn = detail::FunctionRef<void(std::size_t worker)>;
// A step's chunks handed out on demand rather than placed up front (Scheduler::run_sourced): a worker that finds no
// chunk in any deque asks the source, one worker at a time, which writes up to out.size() chunk ids into `out` and
// returns how many. 0 means the source has nothing more this step and will not be asked again: it must decide, not
// answer "not yet". Multi-process runs use one: the rank's own share claimed a block at a time, then chunks taken
// from other ranks.
using ChunkSource = detail::FunctionRef<std::size_t(std::size_t worker, std::span<ChunkId> out)>;
// The most chunk ids one call of a ChunkSource may return.
inline constexpr std::size_t kMaxSourced = 4096;

// Stolen chunks run together (Scheduler::run with a ChunkMerge): a thief that takes several chunks in one steal
// may run the first and some of the others in one call instead of one call each, for chunk functions that pay a
// fixed cost per call (an eager framework's dispatcher and autograd graph, a kernel launch). What it does not
// merge goes onto its deque as usual, where others may steal it again.
//
//   auto choose = [&](std::size_t w, ChunkId first, std::span<const ChunkId> more) { return fitting(w, first, more); };
//   auto together = [&](std::size_t w, std::span<const ChunkId> chunks) { compute(w, chunks); };
//   const ChunkMerge merge{choose, together};  // references: the lambdas must outlive the step
//   sched.run(place_equal(64, 4), run_one, {}, &merge);
struct ChunkMerge {
  // How many of `more` (the chunks one steal took after `first`, in the victim's order: for a placed range,
  // descending ids) run in the same call as `first`: a prefix, at most more.size(). On the thief's thread, while it
  // owns every one of these chunks. An exception fails the step, as a chunk's would.
  detail::FunctionRef<std::size_t(std::size_t worker, ChunkId first, std::span<const ChunkId> more)> choose;
  // Runs `chunks` (`first`, then the chosen prefix) in one call on worker's thread; may throw as a ChunkFn may.
  detail::FunctionRef<void(std::size_t worker, std::span<const ChunkId> chunks)> run;
};

// The scheduler owns N worker threads and one ChunkDeque per worker. run() places a step's chunks, wakes the
// workers, and returns when every chunk has run exactly once. Between steps the workers park and use no CPU.
// If a callback throws, the step stops handing out chunks, every worker leaves the step, the chunks not yet
// run are discarded, and run() rethrows the first exception; the next run() starts clean.
// run() may be called by one thread at a time.
//
//   Scheduler sched({.workers = 4});
//   StepStats st = sched.run(place_equal(64, 4), [&](std::size_t worker, ChunkId c) { compute(worker, c); });
class Scheduler {
 public:
  explicit Scheduler(SchedulerOptions options);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler(Scheduler&&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Chunks placed as contiguous ranges; worker w runs its range in ascending order, and thieves take from the
  // high end, so what moves stays contiguous. `meanwhile`, when given, runs once on the calling thread right after
  // the workers are woken, while they run the step: work that belongs to no worker and would otherwise sit between
  // two steps (the caller would only wait). If it throws, the step fails with that exception as if a chunk had. It
  // runs concurrently with `fn` (state they share needs its own synchronisation), must not call back into the
  // scheduler, and should be short: the watchdog (the caller's thread) checks only after it, and the step's wall
  // time includes it when it outlasts the chunks.
  //   sched.run(place_equal(64, 4), run_chunk, [&] { learn_from(last_step); });
  // `merge`, when given (and the steal policy is kHalf), lets a thief run chunks it stole together in one call (see
  // ChunkMerge); it must outlive the call.
  StepStats run(std::span<const ChunkRange> placement, ChunkFn fn, const std::function<void()>& meanwhile = {}, const ChunkMerge* merge = nullptr);
  // Chunks placed as arbitrary lists; worker w pops its list front to back.
  StepStats run(std::span<const std::vector<ChunkId>> placement, ChunkFn fn);
  // Chunks from a source instead of a placement: every deque starts empty and workers ask `source` for chunks
  // whenever they find none to pop or steal; what one worker gets goes onto its own deque, where the others may
  // steal it. Returns when the source is exhausted and every chunk it gave has run, exactly once. kCentral is not
  // supported. `pending`, when given, tells how many chunks the source still holds for these workers (an estimate;
  // called from any worker): the end game (set_chunk_costs) then applies with the chunks given and not yet run plus
  // those as what is left, so a slow worker leaves a step's last chunks to faster ones here too. Without it the end
  // game does not apply.
  //   sched.run_sourced([&](std::size_t w, std::span<ChunkId> out) { return claim_block(out); }, run_chunk, own_left);
  StepStats run_sourced(ChunkSource source, ChunkFn fn, const std::function<std::uint64_t()>& pending = {});
  // Runs fn(worker) once on every worker thread, concurrently, and returns when all have finished (each worker's
  // busy time is its call's duration); the first exception is rethrown. For per-device work that belongs on the
  // device's own thread: zeroing its buffers, its part of a reduction, its optimizer update.
  //   sched.broadcast([&](std::size_t w) { zero(grad[w]); });
  StepStats broadcast(WorkerFn fn);

  // The end game on unequal workers (EndGameRule states the rule): costs[w] is worker w's expected time for one chunk
  // (any unit, > 0). So a slow device does not hold the step up with a last chunk that a fast one would have
  // finished first. An empty list turns the rule off (the default). Call between steps. Throws ConfigError for a
  // list whose size is not the worker count or that holds a value that is not finite and > 0.
  //   sched.set_chunk_costs({6.6, 6.6, 1, 1});
  void set_chunk_costs(std::vector<double> costs);
  // As above, with separate costs for a chunk from the worker's own deque and for one it steals. Throws ConfigError
  // unless own[w] <= stolen[w].
  void set_chunk_costs(std::vector<double> own, std::vector<double> stolen);
  // Whether a worker that has not slowed down in this step (its live factor) always takes its own chunks, the rule
  // weighing only what it steals. For shares placed to end together, each a few calls with a fixed cost (a cost
  // model a + b n): the rule's fluid estimate of what the others would take to finish the rest ignores their calls'
  // fixed costs, and would leave an own chunk to a thief that starts it only after its own. Off by default. Call
  // between steps.
  void set_own_always(bool on) noexcept { m_own_always = on; }
  // A sourced step whose `pending` counts chunks that workers outside this scheduler also take (every rank's share,
  // which the other ranks' devices steal from): their summed chunk rate, in chunks per unit of the costs above. The
  // end game's check on what the source holds then weighs a chunk against the time everyone, these workers and
  // those, would need to finish it all; the check on the chunks already given stays among these workers. 0 (the
  // default, and any value not finite or < 0) means none. Call between steps.
  //   sched.set_outside_rate(other_ranks_samples_per_s / chunk_samples);
  void set_outside_rate(double chunks_per_unit) noexcept;
  // What the end game counts as left, by weight rather than by number (placed steps): weights[c] is chunk c's part
  // of the chunk that the stolen costs above price (a share-end piece of a quarter of a full chunk weighs 0.25). So
  // a slow worker weighs a step's last few small pieces as the little work they are, not as a full chunk each, and
  // leaves them to the others. A chunk that has started counts half its weight until it ends (on average it is half
  // done). A worker's own cost then prices the largest chunk placed on it, and the next chunk in its deque costs it
  // that in proportion to its weight, so a share's last small piece is not priced as a whole chunk either. For the
  // placed steps that follow, until set again; an empty list (the default) counts every chunk as 1, and sourced steps
  // always count chunks. Call between steps. Throws ConfigError for a weight that is not finite and > 0; a step that
  // places a chunk id past the list throws ConfigError and runs nothing.
  //   sched.set_chunk_weights({1, 1, 1, 0.5, 0.25, 0.25});
  void set_chunk_weights(std::vector<double> weights);
  // During a step, from worker w's own thread (inside its chunk callback): its chunks now take `factor` times the
  // cost set above (a device that slowed down in the middle of the step: a throttled GPU, a shared host), and a
  // chunk it takes now starts only after `ahead` (in the costs' unit: the work it has already launched and not
  // finished, on a device that keeps chunks in flight). The end game then weighs a chunk at ahead + its cost x
  // factor, so the worker leaves the step's last chunks to the others instead of finishing them late; a worker
  // whose factor is above 1 may do so even if it is one of the fastest as placed, while another of those still
  // takes (so the step still ends). factor 1 (and any value <= 1 or not finite) means as set, ahead 0 (and any
  // value < 0 or not finite) none; both reset at each step's start.
  //   sched.set_live_factor(w, took > 2 * expected ? took / expected : 1.0, device.queued_seconds());
  void set_live_factor(std::size_t w, double factor, double ahead = 0) noexcept;

  // A watchdog for the steps that follow: while a step runs, the caller wakes every `period` and calls `check`. A
  // non-null exception fails the step with it (what is not yet taken is discarded), then `on_fail` runs once (it
  // should unblock chunk functions that may never return on their own, a stalled device's), and run() waits for
  // the workers to quiesce and rethrows that exception. An empty `check` removes the watchdog.
  //
  //   sched.set_watchdog(10ms, [&] { return stalled() ? std::make_exception_ptr(TimeoutError("...")) : nullptr; },
  //                      [&] { cancel_stalled_devices(); });
  void set_watchdog(std::chrono::nanoseconds period, std::function<std::exception_ptr()> check, std::function<void()> on_fail = {});

  std::size_t workers() const noexcept { return m_workers.size(); }
  const SchedulerOptions& options() const noexcept { return m_options; }
  // Workers asleep right now; racy, for tests and diagnostics.
  std::size_t parked_workers() const noexcept { return m_parked.load(std::memory_order_relaxed); }

 private:
  using Clock = std::chrono::steady_clock;
  struct Worker;   // scheduler/src/scheduler_impl.hpp
  struct Central;  // the kCentral queue
  enum class Source { kOwn, kStolen };
  // What one look over the victims found: a chunk to run; nothing, so wait and look again; or stop looking (the step
  // is over, or this worker leaves the rest to the others).
  enum class Round { kChunk, kEmpty, kStop };
  // A step's strategy, picked once per step by pick_strategy() and published with the rest of the step state: what
  // a worker runs as its own, where it finds more once those are gone, and what a failed step leaves it to discard.
  struct Strategy {
    bool (Scheduler::*own)(Worker& me);                 // false: this worker leaves the step
    bool (Scheduler::*more)(Worker& me, ChunkId& out);  // true: a chunk in `out`; false: the step is over for it
    void (Scheduler::*drain)(Worker& me) noexcept;      // after the loop
  };
  // A weight of 1 (a full chunk) in m_weight_units: fine enough that a one-sample piece of a 4096-sample chunk
  // still weighs 16 units.
  static constexpr double kWeightUnit = 65536.0;

  // The worker pool (worker_pool.cpp) and each worker's life across steps (worker_loop.cpp).
  void worker_main(std::size_t w);
  // Spins (within the budget), then yields, then parks until poll() returns true. ready() is the side-effect-free
  // re-check made between announcing the park and committing to it. (scheduler_impl.hpp)
  template <class Poll, class Ready>
  void wait_until(Poll&& poll, Ready&& ready, std::uint64_t* parks);

  // One step on one worker (worker_loop.cpp): run my own chunks, then find more, until the step is over for me.
  void run_step(Worker& me);
  Strategy pick_strategy() const noexcept;
  bool run_own(Worker& me);                  // the strategy's `own`
  bool find_more(Worker& me, ChunkId& out);  // the strategy's `more`, timed as idle
  // The strategies' parts. Own: the worker's deque (while the end game lets it take), the central queue, or the
  // broadcast's one call.
  bool run_deque(Worker& me);
  bool run_central(Worker& me);
  bool run_broadcast(Worker& me);
  // The end game declined: wake those who will take what is left here, and idle until the step ends.
  void leave_to_others(Worker& me);
  // More: steal (steal.cpp), ask the source (sourced.cpp), or wait for the others to finish.
  bool steal(Worker& me, ChunkId& out);
  bool ask_source(Worker& me, ChunkId& out);
  bool wait_out(Worker& me, ChunkId& out);
  void wait_step_over(Worker& me);
  // Drain: what is left after a failure, discarded.
  void drain_deque(Worker& me) noexcept;
  void drain_central(Worker& me) noexcept;
  void drain_nothing(Worker& me) noexcept;
  bool step_over() const noexcept;
  // Runs c, or, after a merging steal, the worker's group (c first) in one call.
  void execute(Worker& me, ChunkId c);

  // Stealing (steal.cpp). One look over every victim, then the source.
  Round steal_round(Worker& me, ChunkId& out);
  // One steal from victim v in this step's way: one chunk, half the victim, or half the victim to merge. kTaken: `out`
  // is this worker's to run now, and what came with it is on its deque or in its group.
  StealStatus steal_from(Worker& me, std::size_t v, ChunkId& out);
  // After a merging steal of `first` and me.group[1, 1 + moved): groups the chosen prefix with `first` and pushes
  // the rest onto the worker's deque; returns how many it pushed.
  std::size_t group_stolen(Worker& me, ChunkId first, std::size_t moved);
  // After a steal of `first` and me.group[1, 1 + moved): how many of those join `first` in one call (m_merge's
  // choice, clamped; 0 when it throws, which fails the step).
  std::size_t merged_prefix(Worker& me, ChunkId first, std::size_t moved) noexcept;
  bool work_visible(std::size_t self) const noexcept;

  // A sourced step (sourced.cpp). Asks the source for chunks (when it is open and no other worker is asking): the
  // first to run now in `out`, the rest onto this worker's deque. False when it gave nothing.
  bool refill(Worker& me, ChunkId& out);
  bool source_ready() const noexcept;
  // Asks the source until it gives chunks (true: the first in `out`), or the step is over or the source closed.
  bool wait_for_source(Worker& me, ChunkId& out);

  // The end game (endgame.cpp). The rule applied to worker w's next take: false when it leaves the rest to the others.
  bool worth_taking(std::size_t w, Source from) noexcept;
  // Its cost now for the next chunk from `from`: as placed (a weighted own chunk by its weight), times its live
  // factor, after what it has ahead.
  double cost_now(const Worker& me, Source from) const noexcept;
  // The rule with that cost and what is left now (and, for a sourced step, what the source still holds).
  bool worth_by_rule(const Worker& me, Source from) const noexcept;
  // A fastest worker the rule would have leave: true when it leaves, which it may only while another of the
  // fastest still takes (m_takers), so the last never does. Once left, it stays out this step.
  bool leave_takers(Worker& me) noexcept;
  // What the end game counts as left now: the weight of the chunks not yet finished, or their number.
  double left_now() const noexcept;
  std::size_t steal_cap(std::size_t w) const noexcept;

  // Placing a step's chunks (run.cpp), by the caller between steps.
  // fill(w) fills m_scratch for worker w; on any exception every deque is emptied before it propagates.
  template <class Fill>
  void place_all(std::uint64_t total, Fill&& fill);
  // Pushes m_scratch (already in pop-last order) onto worker w's deque, between steps.
  void place_scratch(std::size_t w, std::uint64_t total);
  void discard_all() noexcept;  // the caller, between steps only

  // A step's launch (launch.cpp). Runs a step of `chunks` counts with the step state already set: wakes the
  // workers, runs `meanwhile`, waits for every worker to leave the step, and returns their counters.
  StepStats launch(std::uint64_t chunks, ChunkFn fn, const std::function<void()>& meanwhile = {});
  // Publishes the step's counts and flags and wakes the workers.
  void start_step(std::uint64_t chunks) noexcept;
  // Returns when every worker has left the step; under a watchdog, through watch_step().
  void wait_for_workers();
  // Waits as above, calling the watchdog's check every period until it fails the step (once).
  void watch_step();
  // Collects the workers' counters into `stats`, rethrows the step's error, and checks that every chunk ran once.
  void finish_step(StepStats& stats);
  void fail_step(std::exception_ptr e) noexcept;

  SchedulerOptions m_options;
  std::vector<std::unique_ptr<Worker>> m_workers;
  std::vector<Stealer> m_stealers;
  std::vector<ChunkId> m_scratch;  // the caller's reversed copy of a range before a bulk push
  std::unique_ptr<Central> m_central;  // kCentral only
  EventCount m_event;
  SpinBudget m_spin;
  int m_launch_spins = 0;  // how long the caller looks for a launch's end before it sleeps (wait_for_workers())

  // Step state, published to the workers by the release bump of m_step_seq.
  Strategy m_strategy{};                  // pick_strategy()
  const ChunkFn* m_fn = nullptr;
  const ChunkMerge* m_merge = nullptr;    // set for a step whose thieves may merge what they steal
  const WorkerFn* m_broadcast = nullptr;  // set for a broadcast instead of a step of chunks
  const ChunkSource* m_source = nullptr;  // set for a sourced step
  const std::function<std::uint64_t()>* m_pending = nullptr;  // a sourced step's chunks not yet given (may be null)
  EndGameRule m_endgame;                       // inactive: no end-game rule
  bool m_own_always = false;                   // set_own_always()
  double m_outside_rate = 0;                   // set_outside_rate()
  std::vector<std::uint64_t> m_weight_units;   // set_chunk_weights(), each in units of 1 / kWeightUnit
  bool m_weighted = false;                     // this step's end game counts m_left_units, not m_remaining
  std::uint64_t m_placed_units = 0;            // the placed chunks' weight (place_all(), read by launch())
  std::vector<std::uint64_t> m_own_full_units;  // per worker, its largest placed chunk's weight (its own cost's)
  std::chrono::nanoseconds m_watch_period{0};
  std::function<std::exception_ptr()> m_watch_check;
  std::function<void()> m_watch_fail;
  Clock::time_point m_step_start;
  std::exception_ptr m_error;  // written by the first failing worker only, read by the caller after the step

  alignas(detail::kCacheLine) std::atomic<std::uint64_t> m_remaining{0};  // chunks of this step not yet finished
  std::atomic<std::uint64_t> m_left_units{0};  // their weight (weighted steps); on m_remaining's line: both fall at once
  alignas(detail::kCacheLine) std::atomic<bool> m_abort{false};
  std::atomic<std::uint32_t> m_takers{0};  // the fastest workers (as placed) that have not left the step's end game
  // A sourced step: the source may still give chunks (while it is, m_remaining holds one extra count, a token, so
  // that no worker sees the step over between two refills).
  alignas(detail::kCacheLine) std::atomic<bool> m_source_open{false};
  std::atomic<bool> m_refilling{false};     // a worker is asking the source
  std::atomic<std::uint64_t> m_sourced{0};  // the chunks the source gave this step
  alignas(detail::kCacheLine) std::atomic<std::uint32_t> m_step_seq{0};
  std::atomic<std::uint32_t> m_in_step{0};  // workers that have not yet left the current step; the caller waits on it
  std::atomic<bool> m_shutdown{false};
  std::atomic<std::uint32_t> m_parked{0};
  std::atomic<std::uint32_t> m_started{0};
  std::exception_ptr m_start_error;
  std::atomic<bool> m_start_failed{false};
};

}  // namespace stealbatch
