// The heartbeat of a multi-process run: see stealbatch/runtime/detail/heartbeat.hpp.
#include <stealbatch/runtime/detail/heartbeat.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace stealbatch::detail {

double Heartbeat::period_s(double timeout_s) noexcept { return std::clamp(timeout_s / 10, 0.01, 0.5); }

std::vector<int> watched_ranks(int me, int ranks) {
  std::vector<int> out;
  if (ranks - 1 <= kWatchAllUpTo) {
    for (int r = 0; r < ranks; ++r) {
      if (r != me) out.push_back(r);
    }
    return out;
  }
  for (long long d = 1; d < ranks; d *= 2) out.push_back(static_cast<int>((me + d) % ranks));
  return out;
}

std::string rank_and_node(const Cluster& cluster, int rank) {
  const std::string node = cluster.node_name(rank);
  return "rank " + std::to_string(rank) + (node.empty() ? "" : " (node " + node + ")");
}

std::string last_seen(std::uint64_t progress, std::uint64_t where) {
  std::string s = "step " + std::to_string(progress >> 32);
  if (where >> 63) {
    s += ", in chunk " + std::to_string(where & 0xffffffffu) + " on its device " + std::to_string((where >> 32) & 0x7fffffffu);
  } else {
    s += ", in no chunk";
  }
  return s;
}

Heartbeat::Heartbeat(std::shared_ptr<Cluster> cluster, double timeout_s)
    : m_cluster(std::move(cluster)),
      m_timeout_s(timeout_s),
      m_thread([this](std::stop_token stop) { run(std::move(stop)); }),
      m_sentinel([this](std::stop_token stop) { sentinel(std::move(stop)); }) {}

Heartbeat::~Heartbeat() {
  m_sentinel.request_stop();
  m_thread.request_stop();
  m_wake.notify_all();
  m_sentinel.join();
  m_thread.join();
  m_cluster->set_node_pulse(kLeft);
  try {
    m_cluster->write(m_cluster->rank(), Cluster::kAlive, kLeft);
  } catch (...) {
    // The cluster failed (MPI reported an error): the launcher ends the job; nothing to tell the others here.
  }
}

void Heartbeat::run(std::stop_token stop) {
  using Clock = std::chrono::steady_clock;
  const int me = m_cluster->rank(), ranks = m_cluster->size();
  const auto period = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(period_s(m_timeout_s)));
  std::vector<StillWord> seen(static_cast<std::size_t>(ranks));
  const std::vector<int> watched = watched_ranks(me, ranks);
  std::uint64_t beat = 0;
  try {
    while (!stop.stop_requested()) {
      m_cluster->write(me, Cluster::kAlive, ++beat);
      const auto now = Clock::now();
      for (const int r : watched) {
        const std::uint64_t theirs = m_cluster->read(r, Cluster::kAlive);
        if (theirs == kLeft) continue;
        const double quiet = seen[static_cast<std::size_t>(r)].seconds_still(theirs, now);
        if (quiet <= m_timeout_s) continue;
        char msg[640];
        std::snprintf(msg, sizeof msg,
                      "stealbatch: %s stopped answering: no heartbeat for %.0f ms (heartbeat_timeout = %g s; its process is frozen or gone, or "
                      "its node is unreachable), last seen in %s: ending the job",
                      rank_and_node(*m_cluster, r).c_str(), quiet * 1e3, m_timeout_s,
                      last_seen(m_cluster->read(r, Cluster::kProgress), m_cluster->read(r, Cluster::kWhere)).c_str());
        m_cluster->abort(msg, 1);
      }
      std::unique_lock g(m_lock);
      m_wake.wait_for(g, stop, period, [] { return false; });
    }
  } catch (const std::exception& e) {
    // A one-sided access failed: MPI itself reports and ends the job on such errors; say where it came from.
    std::fprintf(stderr, "stealbatch: rank %d: the heartbeat stopped: %s\n", me, e.what());
  }
}

// "rank 2", "ranks 2-3", "ranks 2, 5, 9".
std::string rank_list(const std::vector<int>& ranks) {
  if (ranks.size() == 1) return "rank " + std::to_string(ranks[0]);
  bool contiguous = true;
  for (std::size_t i = 1; i < ranks.size(); ++i) contiguous = contiguous && ranks[i] == ranks[i - 1] + 1;
  if (contiguous && !ranks.empty()) return "ranks " + std::to_string(ranks.front()) + "-" + std::to_string(ranks.back());
  std::string s = "ranks ";
  for (std::size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

std::string blame_for_near_stall(const Cluster& cluster, const Cluster::Access& a, double timeout_s, const std::vector<std::pair<int, double>>& frozen) {
  const int me = cluster.rank();
  const std::string what = a.rank == me ? "its own window" : "the window of " + rank_and_node(cluster, a.rank);
  char waited[160];
  std::snprintf(waited, sizeof waited, "%s's access to %s has waited %.0f ms (heartbeat_timeout = %g s)", rank_and_node(cluster, me).c_str(), what.c_str(),
                a.seconds * 1e3, timeout_s);
  if (!frozen.empty()) {
    char still[64];
    std::snprintf(still, sizeof still, "%.0f ms", frozen.front().second * 1e3);
    std::string names = rank_and_node(cluster, frozen.front().first);
    for (std::size_t i = 1; i < frozen.size(); ++i) names += i + 1 == frozen.size() ? " and " : ", ", names += rank_and_node(cluster, frozen[i].first);
    return "stealbatch: " + names + " stopped answering: its pulse on the node has stood still for " + still +
           " (its process is frozen or gone), and " + waited + ": ending the job";
  }
  // Every rank of this node goes on: what holds the window is on another node. Which one, this rank cannot tell (its
  // heartbeat waits behind the stalled access): it names the other nodes, a few of them at scale.
  std::vector<std::pair<std::string, std::vector<int>>> nodes;
  for (int r = 0; r < cluster.size(); ++r) {
    if (r == me || cluster.same_node(r)) continue;
    const std::string n = cluster.node_name(r);
    auto it = std::find_if(nodes.begin(), nodes.end(), [&](const auto& e) { return e.first == n; });
    if (it == nodes.end()) it = nodes.insert(nodes.end(), {n, {}});
    it->second.push_back(r);
  }
  constexpr std::size_t kNamed = 4;
  std::string names;
  for (std::size_t i = 0; i < std::min(nodes.size(), kNamed); ++i) {
    names += (i ? ", " : "") + (nodes[i].first.empty() ? std::string("a node") : nodes[i].first) + " (" + rank_list(nodes[i].second) + ")";
  }
  if (nodes.size() > kNamed) names += " and " + std::to_string(nodes.size() - kNamed) + " more";
  const std::string who = nodes.size() == 1 ? "node " + names : "a rank of another node, one of nodes " + names + ",";
  const std::string here = cluster.node_name(me).empty() ? std::string("this node") : "node " + cluster.node_name(me);
  return "stealbatch: " + who + " stopped answering: " + waited + " while every rank of " + here +
         " goes on: a rank of another node holds the window and is frozen or unreachable, or MPI cannot progress without it: ending the job";
}

namespace {

// The node's other ranks, whose pulses tell a frozen neighbour from a stall caused on another node (none where the
// node has no pulses).
std::vector<int> pulse_neighbours(const Cluster& cluster) {
  std::vector<int> neighbours;
  if (!cluster.has_node_pulse()) return neighbours;
  for (int r = 0; r < cluster.size(); ++r) {
    if (r != cluster.rank() && cluster.same_node(r)) neighbours.push_back(r);
  }
  return neighbours;
}

// The neighbours whose pulse has stood still past the timeout, with how long, longest first.
std::vector<std::pair<int, double>> frozen_neighbours(const Cluster& cluster, const std::vector<int>& neighbours, std::vector<StillWord>& still,
                                                      double timeout_s, std::chrono::steady_clock::time_point now) {
  std::vector<std::pair<int, double>> frozen;
  for (std::size_t i = 0; i < neighbours.size(); ++i) {
    const std::uint64_t theirs = cluster.node_pulse(neighbours[i]);
    if (theirs == 0 || theirs == Heartbeat::kLeft) {  // not started yet, or its runtime has gone
      still[i].restart();
      continue;
    }
    const double q = still[i].seconds_still(theirs, now);
    if (q > timeout_s) frozen.emplace_back(neighbours[i], q);
  }
  std::stable_sort(frozen.begin(), frozen.end(), [](const auto& x, const auto& y) { return x.second > y.second; });
  return frozen;
}

// What ends the job when access `a` has waited past its time: a frozen neighbour or another node (the pulses tell
// which), this rank's own MPI, or the rank it waits on.
std::string stall_message(const Cluster& cluster, const Cluster::Access& a, double timeout_s, const std::vector<std::pair<int, double>>& frozen,
                          bool near, bool others) {
  const int me = cluster.rank();
  if (near && cluster.has_node_pulse() && (!frozen.empty() || others)) return blame_for_near_stall(cluster, a, timeout_s, frozen);
  char text[640];
  if (a.rank == me) {
    std::snprintf(text, sizeof text,
                  "stealbatch: %s: an access to its own window has waited %.0f ms (heartbeat_timeout = %g s; MPI is not progressing: a rank it "
                  "waits on is frozen or unreachable): ending the job",
                  rank_and_node(cluster, me).c_str(), a.seconds * 1e3, timeout_s);
  } else {
    std::snprintf(text, sizeof text,
                  "stealbatch: %s stopped answering: a one-sided access to its window from %s has waited %.0f ms (heartbeat_timeout = %g s; "
                  "its process is frozen or gone, or its node is unreachable): ending the job",
                  rank_and_node(cluster, a.rank).c_str(), rank_and_node(cluster, me).c_str(), a.seconds * 1e3, timeout_s);
  }
  return text;
}

}  // namespace

void Heartbeat::sentinel(std::stop_token stop) {
  const auto period = std::chrono::duration<double>(period_s(m_timeout_s));
  const int me = m_cluster->rank();
  const std::vector<int> neighbours = pulse_neighbours(*m_cluster);
  std::vector<StillWord> still(neighbours.size());
  std::uint64_t pulse = 1;
  m_cluster->set_node_pulse(pulse);  // at once: a rank frozen before its first period is seen as frozen, not as not yet started
  bool others = false;
  for (int r = 0; r < m_cluster->size() && !others; ++r) others = r != me && !m_cluster->same_node(r);
  while (!stop.stop_requested()) {
    {
      std::unique_lock g(m_lock);
      m_wake.wait_for(g, stop, period, [] { return false; });
    }
    if (stop.stop_requested()) return;
    m_cluster->set_node_pulse(++pulse);
    const auto frozen = frozen_neighbours(*m_cluster, neighbours, still, m_timeout_s, std::chrono::steady_clock::now());
    const Cluster::Access a = m_cluster->access_in_flight();
    // A rank stuck on a lost one makes no progress for its own node's ranks either: where the transport needs the
    // target's cooperation, their accesses to it wait too, and a window whose lock a lost rank took waits for ever.
    // Those targets get twice the time, so that a rank that waits on the lost one directly speaks first and names
    // it; past that, the pulses say whether a rank of this node is frozen, or the cause is on another node.
    const bool near = a.rank == me || m_cluster->same_node(a.rank);
    if (a.rank < 0 || a.seconds <= (near ? 2 : 1) * m_timeout_s) continue;
    const std::string msg = stall_message(*m_cluster, a, m_timeout_s, frozen, near, others);
    // MPI_Abort may wait on what the stuck access holds: the process ends on its own 5 s later whatever happens.
    std::thread([] {
      std::this_thread::sleep_for(std::chrono::seconds(5));
      std::fprintf(stderr, "stealbatch: MPI_Abort did not end this process within 5 s: exiting\n");
      std::_Exit(1);
    }).detach();
    m_cluster->abort(msg, 1);
  }
}

}  // namespace stealbatch::detail
