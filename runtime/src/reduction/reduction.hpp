// The step's reduction, a part of its own: after the chunk phase, the sum of every device's gradient (over the
// process, and across ranks over the job), then what the step makes of it (Reduce: the sum, the update or the
// mean). The step calls it in one place (run_step.cpp); one implementation per strategy, chosen once when the
// runtime starts (make_reduction()):
//   - InProcess: the devices' float sum within the process: host devices each sum a slice, fused with the update
//     (or the mean) in the same phase; GPUs their collective (NCCL) on their streams. (within_process.cpp)
//   - ExactInProcess: deterministic mode's fixed-point sum (ExactSum), with its verdict on the attempt: the same
//     bytes whatever the devices and the stealing. (within_process.cpp)
//   - AcrossRanks: a within-the-rank sum composed with the sum across ranks: this rank's sum (float, or fixed point)
//     goes into the tally, which crosses the ranks (float or bfloat16 on the wire, ClusterOptions::wire) with the
//     step's counts, and the update follows from the job's sum; GPUs' own collective spans the job. (across_ranks.cpp)
// Each works on the runtime's parts it is given (ReductionParts: the devices, the shared parameters, the exact sum,
// the cluster), never on the Runtime itself, and leaves in Reduced what the step's report needs.
#pragma once

#include "cluster/cluster_state.hpp"
#include "devices/device_set.hpp"
#include "parameters/shared_parameters.hpp"
#include "reduction/exact_sum.hpp"
#include "step/step_types.hpp"

#include <stealbatch/runtime/communicator.hpp>
#include <stealbatch/runtime/runtime.hpp>
#include <stealbatch/scheduler/scheduler.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <utility>
#include <vector>

namespace stealbatch {

// The parts of the runtime a reduction reads and writes, and the runtime's call it makes.
struct ReductionParts {
  const RuntimeOptions& options;
  DeviceSet& dev;
  const ParameterLayout& layout;
  SharedParameters& shared;  // host devices: the update (or the mean, into mean_next) from the sum
  std::vector<float>& mean_next;
  ExactSum& exact;                            // deterministic mode
  ClusterState& cluster;                      // across ranks: the tally's collectives (ClusterState::sum())
  const std::unique_ptr<Scheduler>& sched;    // broadcast(): each device's part on its worker
  const std::unique_ptr<Communicator>& comm;  // the devices' own collective (GPUs), or the modelled ring
  bool& lr_pending;                           // set_learning_rate() since the last update
  const Clock::time_point& epoch;             // the watchdog's stamps
  const std::uint64_t& steps;                 // steps completed (error messages)
  // The devices' call times taken, then this process's device reports (chunk_runner.cpp, step_report.cpp).
  std::function<std::vector<DeviceReport>(ChunkTable&, const ChunkPhase&)> device_reports;
};

// What the step hands its reduction.
struct ReductionStep {
  std::size_t batch;
  Reduce reduce_to;
  ChunkTable& table;
  const ChunkPhase& phase;
};

class Reduction {
 public:
  virtual ~Reduction() = default;
  // The step's sum and what follows from it, into `out` (the devices' counters in it, the reports of this process's
  // devices, across ranks the tally). False: deterministic mode's verdict is to run the step again, and nothing was
  // applied.
  virtual bool reduce(const ReductionStep& step, Reduced& out) = 0;
};

std::unique_ptr<Reduction> make_reduction(ReductionParts parts);

// What every strategy does on a device's worker, and between the sum and the report.
class ReductionBase : public Reduction {
 public:
  explicit ReductionBase(ReductionParts parts) : m_p(std::move(parts)) {}

 protected:
  // The device's chunks still in flight (a GPU's stream, a simulated device's queue), waited for: device time of its
  // chunks, part of its compute_s, and the end of its chunk phase (step_report.cpp), not the reduction's start.
  void drain(std::size_t d);
  // Slice d of the next parameters (and optimizer state) from `sum` / batch, or of the mean (in mean_next); slice d
  // of every device's buffer zeroed for the next step.
  void update_slice(std::size_t d, std::span<const float> sum, float scale, Reduce reduce_to);
  // Device d's loss handed over, after its drain.
  void take_loss(std::size_t d);
  // A set_learning_rate() since the last update reaches the optimizer now.
  void take_learning_rate(Reduce reduce_to);
  // Deterministic mode on GPUs: each hands over its fixed-point accumulator and its tensors' largest exponents.
  void take_device_cells();
  // The sum within one process, fused with what follows it: on each device's worker, its chunks drained, its loss
  // handed over, its part of the sum (`part`, with every device's buffer), the modelled ring's wait,
  // and where an update or a mean follows (Reduce other than kSum) slice d of it. Then the devices' call times and
  // reports, and the communicator's collective issued from one thread (NCCL's group call; a no-op on host devices).
  void fused(const ReductionStep& step, Reduced& out,
             const std::function<void(std::size_t, std::span<float* const>)>& part);
  // The devices' call times (GPUs' events), then this process's device reports, into out.local.
  void report_devices(const ReductionStep& step, Reduced& out);
  std::vector<float*> buffers() const;

  ReductionParts m_p;
};

}  // namespace stealbatch
