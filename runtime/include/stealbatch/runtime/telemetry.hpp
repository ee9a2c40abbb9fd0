// What a step did, per device: the step report, an nvidia-smi-style dashboard, and a Chrome trace.
#pragma once

#include <cstddef>
#include <cstdint>
#include <fstream>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace stealbatch {

struct DeviceReport {
  std::string name;
  double compute_s = 0;       // its chunks' time: the device's own figure (chunks in flight), or its worker's calls
                              // plus its wait for the chunks still in flight when they ended (a GPU's drain)
  double busy_s = 0;          // running chunks, its part of the AllReduce and its optimizer update (a slowed-down
                              // device counts its idling as busy: it emulates compute)
  double idle_s = 0;          // step_s - busy_s
  double barrier_wait_s = 0;  // from the end of its last chunk to the end of the chunk phase: waiting for the others
  double utilization = 0;     // busy_s / step_s
  std::uint64_t chunks_run = 0;
  std::uint64_t chunks_stolen = 0;
  std::uint64_t samples = 0;
  std::size_t chunk_samples = 0;  // the size of its own chunks this step (before a share's end is cut finer)
  double cost = 0;                // the sample costs it ran, in the trainer's units (0: the step had none)
};

struct StepReport {
  std::uint64_t step = 0;     // 1-based count of steps run by this runtime
  double step_s = 0;          // the whole step: chunks, reduction and optimizer
  double chunks_s = 0;        // the chunk phase: until every device's chunks were done, its drain included
  double reduce_s = 0;        // the AllReduce, from there (with one device: nothing to reduce, about 0)
  double optimizer_s = 0;     // the update on every replica
  std::uint64_t samples = 0;
  std::uint64_t chunks = 0;
  std::uint64_t steals = 0;   // chunks that ran on a device other than the one they were placed on
  double bytes_moved = 0;     // inputs of stolen chunks that crossed a link (simulated devices; 0 otherwise)
  double loss = 0;            // mean loss over the step's samples (what the chunk functions reported)
  std::vector<DeviceReport> devices;
  // Devices lost in this step and dropped (on_device_failure = exclude), and the chunks re-run on the survivors
  // (those the lost devices had run or held). Empty and 0 in a step where nothing failed.
  std::vector<std::string> excluded_devices;
  std::uint64_t rerun_chunks = 0;
  bool placed_by_cost = false;  // placed by cost: the step's given sample costs, or learnt batch-position ones (cost_by_position)
  // Deterministic mode: times the step's chunks were run again because their gradients left the fixed-point window
  // (the first step always: it finds the scale; later, when a tensor's gradient grew or shrank 256-fold in a step).
  std::uint32_t redone = 0;
  // Across ranks (RuntimeOptions::cluster): every rank's devices, named "r1/cpu0", are in `devices`; chunks that ran on
  // another rank than the one they were placed on, and the steals that moved them.
  std::size_t ranks = 1;
  std::uint64_t remote_chunks = 0;
  std::uint64_t remote_steals = 0;
  double leave_s = 0;  // this rank's last call for work, which read the other ranks' shares and found none to take
};

// Sums step reports into one (an epoch): times and counts add, utilization is recomputed from the sums.
StepReport accumulate(std::span<const StepReport> steps);

// The step's ideal time: its devices' chunk time spread over their summed speed, as if perfectly balanced, plus the
// reduction and the update it paid,
//   (sum_d compute_s_d / f_d) / (sum_d 1 / f_d) + reduce_s + optimizer_s,
// where f_d is device d's slowdown factor (`slowdown[d]`, 1 where it names none): a device slowed f-fold ran its
// chunks in f times their work. The balanced term is a weighted mean of the compute_s, at most the largest, and each
// compute_s lies within the chunk phase, which the reduction and the update do not overlap: in one process a step
// never takes less than its ideal. (Across ranks a rank's reduce_s also holds its wait for the other ranks' chunks.)
//
//   double ideal = 0, actual = 0;
//   for (const StepReport& r : steps) ideal += ideal_seconds(r), actual += r.step_s;  // ideal / actual <= 1
double ideal_seconds(const StepReport& step, std::span<const double> slowdown = {});

// A fixed-width table with one bar per device, in the spirit of nvidia-smi:
//   dev    util  |bar                 |  busy(s)  wait(s)  chunks  stolen  samples  chunk (the latest step's own chunk size)
std::string format_dashboard(const StepReport& report, const std::string& title);

// A span of the trace: a chunk, or a barrier wait (a device waiting for the others) on a device's row; the reduction
// or the optimizer on the host row.
enum class TraceKind : std::uint32_t { kChunk, kAllReduce, kOptimizer, kBarrier };

struct TraceEvent {
  std::uint32_t device = 0;
  std::uint32_t chunk = 0;
  std::int64_t begin_ns = 0;  // since the runtime's creation
  std::int64_t end_ns = 0;
  TraceKind kind = TraceKind::kChunk;
};

// Per-worker single-producer queues of trace events. Workers push on the hot path (a few stores, never a lock);
// the caller drains them after each step and writes Chrome Trace Event JSON. A full queue drops the event and
// counts it, rather than stall a worker.
class TraceWriter {
 public:
  TraceWriter(const std::string& path, std::vector<std::string> device_names);  // throws Error if it cannot write
  // One rank's trace of a multi-process run: its events on process row `pid` ("rank N"), shifted by offset_ns onto
  // rank 0's timeline (the offset measured at start-up, written in the trace's metadata). perf/merge_traces.py puts
  // every rank's file into one trace.
  TraceWriter(const std::string& path, std::vector<std::string> device_names, int pid, std::int64_t offset_ns);
  ~TraceWriter();
  TraceWriter(const TraceWriter&) = delete;
  TraceWriter& operator=(const TraceWriter&) = delete;

  void push(std::size_t worker, const TraceEvent& e) noexcept;  // called by that worker only
  void add(const TraceEvent& e);                                 // the caller's own spans
  void drain();                                                  // the caller, between steps
  std::uint64_t dropped() const noexcept { return m_dropped; }
  void close();                                                  // writes the closing bracket; idempotent

 private:
  void write(const TraceEvent& e);
  std::ofstream m_out;
  std::vector<std::string> m_names;
  // A worker's single-producer queue (Boost.Lockfree's spsc_queue, defined in telemetry.cpp: the installed headers
  // need neither Boost nor TBB).
  struct Queue;
  std::vector<std::unique_ptr<Queue>> m_queues;
  std::vector<std::uint64_t> m_worker_dropped;  // written by each worker only
  std::uint64_t m_dropped = 0;
  int m_pid = 0;
  std::int64_t m_offset_ns = 0;
  bool m_first = true;
  bool m_closed = false;
};

}  // namespace stealbatch
