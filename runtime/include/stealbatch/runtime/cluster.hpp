// The processes of a multi-process run as the runtime sees them: ranks, a small window of 64-bit words per rank that
// every rank can read and compare-and-swap without the owner taking part, and the collectives of a step.
// stealbatch::mpi::MpiCluster (stealbatch/mpi/mpi_cluster.hpp) is the MPI one; the runtime itself never calls MPI.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace stealbatch {

class Cluster {
 public:
  // The words of each rank's window: its remaining share of the step (detail::ShareWord); its heartbeat, which a
  // thread of its runtime beats for the runtime's whole life (detail::Heartbeat); its progress, which its runtime
  // bumps while it is in a step (the step's count in the high half); and where it is (the chunk its longest-running
  // device is in; 0 when none).
  enum Word : std::size_t { kShare = 0, kAlive = 1, kProgress = 2, kWhere = 3, kWords = 4 };

  virtual ~Cluster() = default;
  virtual int rank() const noexcept = 0;
  virtual int size() const noexcept = 0;
  // Whether `rank` runs on this rank's node (thieves try those victims first).
  virtual bool same_node(int rank) const noexcept = 0;
  // The name of `rank`'s node, for messages ("" when unknown).
  virtual std::string node_name(int /*rank*/) const { return {}; }

  // One-sided, atomic, complete when they return; callable from any thread of this rank, concurrently.
  virtual std::uint64_t read(int rank, Word word) = 0;
  // Writes `desired` if the word holds `expected`; returns what it held.
  virtual std::uint64_t compare_and_swap(int rank, Word word, std::uint64_t expected, std::uint64_t desired) = 0;
  virtual void write(int rank, Word word, std::uint64_t value) = 0;
  // The one-sided access this rank is inside now, if any: its target and how long it has waited. Between nodes an
  // access can need the target's cooperation (a transport without remote atomics in hardware, such as TCP), and to a
  // frozen process or across a cut link it never completes: the heartbeat's sentinel ends the job on such a wait
  // (detail::Heartbeat). Callable from any thread, without blocking. {-1, 0} when none, or where not tracked.
  struct Access {
    int rank = -1;
    double seconds = 0;
  };
  virtual Access access_in_flight() const noexcept { return {}; }
  // Whether this rank must answer other ranks' one-sided accesses promptly: on, except while it is inside a step's
  // sum (the runtime turns it off there, and on again after), whose own collectives progress the transport. A
  // transport whose accesses need the target's help (MpiCluster between nodes: its progress agent) may answer them
  // more slowly while off and leave the cores to the sum. Accesses complete either way.
  virtual void set_prompt_access(bool /*on*/) noexcept {}

  // A pulse among the ranks of one node that makes no call into the transport (node-local shared memory), so that
  // it goes on while a one-sided access waits. The heartbeat's sentinel sets this rank's pulse every period and
  // reads those of its node's other ranks: when an access to this node's own windows never completes, a rank of
  // the node whose pulse stands still is the one that holds it (frozen or gone); when every pulse of the node goes
  // on, the holder is on another node. Without node-local memory: has_node_pulse() is false, and the others are
  // no-ops. Callable from any thread, without blocking.
  virtual bool has_node_pulse() const noexcept { return false; }
  virtual void set_node_pulse(std::uint64_t /*value*/) noexcept {}
  // The pulse of `rank`, a rank of this node (0 for any other rank, or before it first set its pulse).
  virtual std::uint64_t node_pulse(int /*rank*/) const noexcept { return 0; }

  // Collectives: every rank calls them from one thread, in the same order. The sum is in place and the same on
  // every rank. `waiting` runs every 10 ms or so while this rank waits for the others (the runtime watches
  // the other ranks' heartbeats there); it may call abort().
  virtual void allreduce_sum(std::span<float> data, const std::function<void()>& waiting) = 0;
  virtual void allreduce_sum(std::span<double> data, const std::function<void()>& waiting) = 0;
  // Exact in any order while no partial sum leaves the int64 range (deterministic mode keeps them under 2^62).
  virtual void allreduce_sum(std::span<std::int64_t> data, const std::function<void()>& waiting) = 0;
  void allreduce_sum(std::span<double> data) { allreduce_sum(data, {}); }
  // The float sum with bfloat16 on the wire (half the bytes of float): each rank's values rounded to bfloat16
  // (to nearest, ties to even), the partial sums added in float and rounded to bfloat16 again wherever they leave a
  // rank, the result in float. bfloat16 keeps float's exponent range and 8 significant bits (unit roundoff
  // u = 2^-8), and each of the R ranks' values passes through at most R roundings, so for every element
  //   |result - exact sum| <= gamma_R * sum over ranks |x_r|,   gamma_R = R u / (1 - R u)
  // (0.79% at 2 ranks, 1.6% at 4; the analysis of recursive summation, Higham, "Accuracy and Stability of Numerical
  // Algorithms", 4.2). The default rounds each rank's values, sums them in float and rounds the sum: within the same
  // bound, with float's bytes on the wire; a transport that adds bfloat16 itself overrides it (MpiCluster does).
  virtual void allreduce_sum_bf16(std::span<float> data, const std::function<void()>& waiting);
  virtual void broadcast(std::span<char> data, int root) = 0;
  // Ends the whole job at once, every rank (MPI_Abort), after printing `why` on this rank's standard error; the job's
  // exit status is `exit_code` (the launcher's, as MPI_Abort passes it on).
  [[noreturn]] virtual void abort(const std::string& why, int exit_code) noexcept = 0;
};

// Every rank of `cluster` calls it at the same point, before any collective whose size or presence follows these
// values, with its own named values (a trainer's flags: {"--batch", "64"}, ...), in the same order. One small
// collective when they agree; when they do not, every rank throws the same ConfigError naming `when`, the first
// name whose values differ, rank 0's value and the first differing rank's.
//   check_ranks_agree(*cluster, {{"--batch", "64"}, {"--costs", "model"}}, "when they join");
void check_ranks_agree(Cluster& cluster, const std::vector<std::pair<std::string, std::string>>& values, std::string_view when);

// bfloat16, the upper half of a float: rounded to nearest, ties to even; a NaN stays a NaN (quiet), infinities and
// values past bfloat16's largest round to infinity as float's own overflow does.
std::uint16_t to_bf16(float v) noexcept;
float from_bf16(std::uint16_t h) noexcept;
// The same over arrays (out and in hold in.size() and out.size() values), and inout[i] = bfloat16(in[i] + inout[i]),
// the sum in float: a bfloat16 sum's step.
void to_bf16(std::span<const float> in, std::uint16_t* out) noexcept;
void from_bf16(const std::uint16_t* in, std::span<float> out) noexcept;
void add_bf16(const std::uint16_t* in, std::uint16_t* inout, std::size_t n) noexcept;
// gamma_R of the bound above, for `ranks` ranks: a bfloat16 sum lies within bf16_sum_bound(R) * sum |x_r| of the exact.
double bf16_sum_bound(int ranks) noexcept;

namespace detail {

// A rank's remaining share of a step, packed into one word so that one compare-and-swap moves chunks out of it:
// the step's tag (1 to 65535, from its count; 0 in a fresh word) and the chunk ids [front, back) not yet taken. The owner takes from the
// front, thieves from the back.
struct ShareWord {
  static constexpr std::uint32_t kMaxChunk = (1u << 24) - 1;  // chunk ids per step: [0, kMaxChunk)
  std::uint16_t tag = 0;
  std::uint32_t front = 0, back = 0;

  std::uint64_t pack() const noexcept {
    return (std::uint64_t{tag} << 48) | (std::uint64_t{front & kMaxChunk} << 24) | std::uint64_t{back & kMaxChunk};
  }
  static ShareWord unpack(std::uint64_t w) noexcept {
    return {static_cast<std::uint16_t>(w >> 48), static_cast<std::uint32_t>((w >> 24) & kMaxChunk), static_cast<std::uint32_t>(w & kMaxChunk)};
  }
  std::uint32_t left() const noexcept { return back > front ? back - front : 0; }
};

// How many of a victim's `left` chunks a thief takes: the part that makes both finish together at their speeds
// (samples/s, either may be 0 when unknown: then as if equal), rounded to nearest, so that a slow thief leaves the
// last chunks of a fast victim alone and a fast one takes most of a slow one's. 0: not worth stealing.
std::uint32_t steal_amount(std::uint32_t left, double thief_speed, double victim_speed) noexcept;

}  // namespace detail

}  // namespace stealbatch
