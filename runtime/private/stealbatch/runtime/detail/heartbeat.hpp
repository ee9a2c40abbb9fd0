// A rank's pulse across a multi-process run, and the watch on the other ranks' pulses.
//
// A thread of each rank's runtime writes a new value into the rank's kAlive word every period, from the join until
// the runtime goes, whatever the rank is doing: a long chunk, an evaluation between steps, a checkpoint, a wait in a
// collective. Only a process that no longer runs stops it: one frozen (SIGSTOP, a debugger), one gone without its
// launcher noticing, one on a node that is lost. The same thread reads the other ranks' kAlive words; one that has
// not changed for `timeout` seconds ends the job (Cluster::abort, exit status 1), naming the rank, its node, and
// the step and chunk it was last seen in (its kProgress and kWhere words, which its step's watch writes).
//
// Between nodes a read of another rank's word may itself never complete: where the transport needs the target's
// cooperation (osc ucx over TCP), a frozen target or a cut link leaves the read waiting, and with it the watch. A
// second thread, the sentinel, makes no MPI call: every period it asks the cluster which one-sided access is in
// flight (Cluster::access_in_flight); one that has waited longer than `timeout` ends the job the same way, naming
// its target. An access to this rank itself or to a rank of its node gets twice that: a rank stuck on a lost one
// stalls its node's accesses to it too, and it should be the one that speaks. Such a stall can also last for ever
// with no lost rank on this node: Open MPI 4.1's osc ucx takes a lock on the target's window around every atomic, and
// a rank that took it an instant before its node was cut off never gives it back; this rank's heartbeat then waits
// behind the stalled access and reads nobody. So the sentinel also beats a pulse in node-local shared memory
// (Cluster::set_node_pulse) and reads its node's others: a neighbour whose pulse stands still is named (frozen or
// gone); when every pulse goes on, the cause is on another node, and the message names the other nodes (detail::
// blame_for_near_stall). Should MPI_Abort itself not return, the process exits 5 s later (std::_Exit), and the
// launcher ends the job on that.
//
// A runtime that goes writes kLeft, so a rank that finishes first, or whose runtime is destroyed by an exception
// on its way out, is not taken for a frozen one. The words are only written by their rank and read by the others,
// each access a complete one-sided atomic (Cluster::read/write): the protocol needs no ordering beyond that.
#pragma once

#include <stealbatch/runtime/cluster.hpp>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <stop_token>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace stealbatch::detail {

class Heartbeat {
 public:
  static constexpr std::uint64_t kLeft = ~std::uint64_t{0};

  // Starts beating and watching at once. timeout_s: (0, 86400], as RuntimeOptions::cluster.heartbeat_timeout.
  Heartbeat(std::shared_ptr<Cluster> cluster, double timeout_s);
  ~Heartbeat();  // writes kLeft, then stops the thread
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

  // The beat's period: a tenth of the timeout, within [10 ms, 500 ms].
  static double period_s(double timeout_s) noexcept;

 private:
  void run(std::stop_token stop);
  void sentinel(std::stop_token stop);

  std::shared_ptr<Cluster> m_cluster;
  double m_timeout_s;
  std::mutex m_lock;
  std::condition_variable_any m_wake;
  std::jthread m_thread;    // it starts once everything above exists
  std::jthread m_sentinel;  // last: stopped and joined first
};

// How long a word that another rank keeps changing has stood still, read again and again: the first read and any
// change start the count afresh (restart() forgets the last read). The heartbeat watches kAlive with it, the step's
// watch kProgress.
class StillWord {
 public:
  double seconds_still(std::uint64_t value, std::chrono::steady_clock::time_point now) noexcept {
    if (value != m_value || m_since == std::chrono::steady_clock::time_point{}) {
      m_value = value, m_since = now;
      return 0;
    }
    return std::chrono::duration<double>(now - m_since).count();
  }
  void restart() noexcept { m_since = {}; }

 private:
  std::uint64_t m_value = 0;
  std::chrono::steady_clock::time_point m_since{};
};

// The ranks that `me` watches (its heartbeat and its step's stall watch read their words): every other rank in jobs
// of up to kWatchAllUpTo + 1 ranks; beyond, its fingers me + 1, me + 2, me + 4, ... (mod ranks), ceil(log2 ranks) of
// them. Reading every rank costs each rank ranks - 1 remote reads a period, every rank's window answering as many:
// at 10,000 ranks and 2 us a read, 20 ms of every period under the rank's MPI lock, and a stall watch (every 10 ms
// while waiting in a collective) that cannot finish one sweep in its period. With fingers every rank is watched by
// ceil(log2 ranks) others at distances 1, 2, 4, ... behind it. Where a node's ranks are consecutive (mpirun's
// default mapping by slot), the watchers at least a node's width behind are on other nodes (but for the largest
// finger, which may wrap round to near the rank), so a lost node's ranks are still seen to stop by ranks that are
// not lost with them.
inline constexpr int kWatchAllUpTo = 64;
std::vector<int> watched_ranks(int me, int ranks);

// "rank 1 (node n2)", or "rank 1" where the cluster knows no node name: how the watches name a rank.
std::string rank_and_node(const Cluster& cluster, int rank);

// The step and chunk a rank was last seen in, from its kProgress and kWhere words: "step 3, in chunk 5 on its device
// 0", or "step 3, in no chunk".
std::string last_seen(std::uint64_t progress, std::uint64_t where);

// "rank 2", "ranks 2-3" (consecutive), "ranks 2, 5, 9".
std::string rank_list(const std::vector<int>& ranks);

// The sentinel's message for an access to this rank's own window, or to a window of its node, that has waited past
// twice the timeout (a: the access). `frozen`: the node's ranks whose pulse has stood still past the timeout, with
// for how long, longest first; they are named. With none, every rank of the node goes on, and the stall comes from
// another node: the message names the other nodes and their ranks (four nodes at most, then how many more).
std::string blame_for_near_stall(const Cluster& cluster, const Cluster::Access& a, double timeout_s, const std::vector<std::pair<int, double>>& frozen);

}  // namespace stealbatch::detail
