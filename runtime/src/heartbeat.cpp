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

void Heartbeat::sentinel(std::stop_token stop) {
  const auto period = std::chrono::duration<double>(period_s(m_timeout_s));
  while (!stop.stop_requested()) {
    {
      std::unique_lock g(m_lock);
      m_wake.wait_for(g, stop, period, [] { return false; });
    }
    if (stop.stop_requested()) return;
    const Cluster::Access a = m_cluster->access_in_flight();
    // A rank stuck on a lost one makes no progress for its own node's ranks either: where the transport needs the
    // target's cooperation, their accesses to it wait too. Those targets get twice the time, so that the rank
    // that waits on the lost one speaks first and names it.
    const int me = m_cluster->rank();
    const bool near = a.rank == me || m_cluster->same_node(a.rank);
    if (a.rank < 0 || a.seconds <= (near ? 2 : 1) * m_timeout_s) continue;
    char msg[640];
    if (a.rank == me) {
      std::snprintf(msg, sizeof msg,
                    "stealbatch: %s: an access to its own window has waited %.0f ms (heartbeat_timeout = %g s; MPI is not progressing: a rank it "
                    "waits on is frozen or unreachable): ending the job",
                    rank_and_node(*m_cluster, me).c_str(), a.seconds * 1e3, m_timeout_s);
    } else {
      std::snprintf(msg, sizeof msg,
                    "stealbatch: %s stopped answering: a one-sided access to its window from %s has waited %.0f ms (heartbeat_timeout = %g s; "
                    "its process is frozen or gone, or its node is unreachable): ending the job",
                    rank_and_node(*m_cluster, a.rank).c_str(), rank_and_node(*m_cluster, me).c_str(), a.seconds * 1e3, m_timeout_s);
    }
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
