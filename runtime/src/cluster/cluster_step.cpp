// A step across the ranks of a multi-process run: the global chunk table, each rank's share in its window, chunks
// claimed from the own share and stolen from other ranks' with one compare-and-swap each, the reduction within the
// rank and then across ranks, and the watch that ends the job when a rank stops making progress.
//
// The protocol. Every rank builds the same chunk table from the same inputs (the batch size and the rank speeds
// gathered with the last reduction), so chunk ids are global and every rank knows every rank's initial share. A
// rank's remaining share is one word in its window (detail::ShareWord: the step's tag and the chunk ids [front,
// back) not yet taken). The owner's devices claim a few chunks at a time from the front, thieves take a part from the
// back, each with one compare-and-swap: a chunk leaves the word in exactly one successful CAS, so it is run exactly
// once. The owner writes its share at the step's start; a thief that finds last step's tag there writes it itself
// (from the same table) in the same CAS as its steal, and the owner's own CAS then sees the tag and goes on. Last
// step's words can be no older: no rank leaves a step's reduction before every rank has entered it, and every rank's
// RMA of that step completed before it entered. No chunk is created during a step and words only shrink, so a rank
// that finds its own share empty and every other one empty or not worth stealing from (detail::steal_amount) leaves
// the chunk phase for good; it does not read a share that its owner's first call for work claims whole (VictimWalk).
// The reduction carries, beside the gradient, every rank's speed, failure flag, chunk run counts and device tallies,
// so every rank checks exactly-once over the whole job and learns the same speeds.
#include "cluster/cluster_state.hpp"

#include <stealbatch/cores.hpp>
#include <stealbatch/runtime/detail/agreement.hpp>
#include <stealbatch/runtime/detail/speed_shares.hpp>
#include <stealbatch/scheduler/victim.hpp>
#include <stealbatch/stats.hpp>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <stdexcept>

namespace stealbatch {

namespace detail {

std::uint32_t steal_amount(std::uint32_t left, double thief_speed, double victim_speed) noexcept {
  if (left == 0) return 0;
  if (!(thief_speed > 0) || !(victim_speed > 0) || !std::isfinite(thief_speed) || !std::isfinite(victim_speed)) thief_speed = victim_speed = 1;
  const double part = static_cast<double>(left) * thief_speed / (thief_speed + victim_speed);
  return static_cast<std::uint32_t>(std::min<double>(left, std::floor(part + 0.5)));
}

}  // namespace detail

namespace {

// The sizes of the chunk phase when a step's chunk size is left to the runtime (chunk_size = 0) across ranks: the
// fastest rank's chunks hold batch / (kChunksPerDevice x devices) samples, within [kMinAuto, kMaxAuto].
constexpr std::size_t kChunksPerDevice = 4, kMinAuto = 16, kMaxAuto = 512;
// Ranks of other nodes that a call for work reads all of; beyond, each call draws this many at least.
constexpr std::size_t kProbeAllUpTo = 64, kMinProbes = 16;

}  // namespace

void ClusterState::join(std::shared_ptr<Cluster> cluster, DeviceSpec& spec, HostOptions& host) {
  job = std::move(cluster);
  const int ranks = job->size(), me = job->rank();
  if (ranks < 1 || me < 0 || me >= ranks) throw ConfigError("cluster: rank " + std::to_string(me) + " of " + std::to_string(ranks));
  if (spec.kind == DeviceKind::kVgpu) {
    throw ConfigError("devices = '" + spec.text + "' with a cluster: the parts of one GPU cannot be NCCL ranks; across ranks use cpu:, sim: or cuda:");
  }
  if (spec.kind == DeviceKind::kCuda && spec.all_gpus) {
    throw ConfigError("devices = '" + spec.text + "' with a cluster: name each rank's GPUs (cuda:local, or cuda:I,J), so no two ranks take one GPU");
  }
  if (spec.local_gpu) {
    // cuda:local: the rank's index among the ranks of its node.
    int local = 0;
    for (int r = 0; r < me; ++r) local += job->same_node(r) ? 1 : 0;
    spec.ids = {local};
  }
  // A fresh share word (tag 0, which no step uses) before the collective below: no rank's first step can then mistake
  // what an earlier runtime on this cluster left for its own step's share.
  job->write(me, Cluster::kShare, 0);
  std::vector<double> counts(static_cast<std::size_t>(ranks), 0.0);
  counts[static_cast<std::size_t>(me)] = static_cast<double>(spec.count);
  job->allreduce_sum(counts);
  rank_devices.clear();
  for (double c : counts) rank_devices.push_back(static_cast<std::size_t>(c));
  first_device = std::accumulate(rank_devices.begin(), rank_devices.begin() + me, std::size_t{0});
  const std::size_t total = total_devices();
  if (!host.slowdown.empty() && host.slowdown.size() == total && total != spec.count) {
    // One factor per device of the whole job, in rank order: keep this rank's.
    host.slowdown = std::vector<double>(host.slowdown.begin() + static_cast<std::ptrdiff_t>(first_device),
                                        host.slowdown.begin() + static_cast<std::ptrdiff_t>(first_device + spec.count));
  } else if (!host.slowdown.empty() && host.slowdown.size() != spec.count) {
    throw ConfigError("slowdown has " + std::to_string(host.slowdown.size()) + " values; expected one per device of this rank (" +
                      std::to_string(spec.count) + ") or one per device of the whole job (" + std::to_string(total) + ", in rank order)");
  }
  if (host.threads_per_device == 0 && spec.kind == DeviceKind::kCpu) {
    // The node's cores shared among the devices of every rank on it.
    std::size_t on_node = 0;
    for (int r = 0; r < ranks; ++r) on_node += job->same_node(r) ? rank_devices[static_cast<std::size_t>(r)] : 0;
    host.threads_per_device = std::max(1, static_cast<int>(usable_cores() / std::max<std::size_t>(1, on_node)));
  }
  rank_speed_history.assign(static_cast<std::size_t>(ranks), {});
  rank_cost_history.assign(static_cast<std::size_t>(ranks), {});
  peers_seen.assign(static_cast<std::size_t>(ranks), {});
  rank_efficient.assign(static_cast<std::size_t>(ranks), 0.0);
  watched = detail::watched_ranks(me, ranks);
  // The clocks: each of a few rounds ends a collective on every rank at about the same moment; there every rank reads
  // its time since its own epoch, and the median difference from rank 0's is the offset (within the collective's
  // exit skew, microseconds on a node). The trace puts every rank on rank 0's timeline with it.
  std::vector<double> offsets;
  for (int round = 0; round < 5; ++round) {
    std::vector<double> at(static_cast<std::size_t>(ranks), 0.0);
    job->allreduce_sum(at);  // a rendezvous
    at.assign(static_cast<std::size_t>(ranks), 0.0);
    at[static_cast<std::size_t>(me)] = static_cast<double>((Clock::now() - m_p.epoch).count());
    job->allreduce_sum(at);
    offsets.push_back(at[0] - at[static_cast<std::size_t>(me)]);
  }
  clock_offset_ns = static_cast<std::int64_t>(median(offsets));
}

void ClusterState::publish_progress() {
  job->write(job->rank(), Cluster::kProgress, (step_now << 32) | (++progress & 0xffffffffu));
}

void ClusterState::watch() {
  const int me = job->rank();
  publish_progress();
  // Where this rank is: the chunk its longest-running device is in (for the others' message if it stops).
  std::int64_t oldest = 0;
  std::uint64_t where = 0;
  for (std::size_t d = 0; d < m_p.dev.replicas.size(); ++d) {
    const std::int64_t started = m_p.dev.replicas[d]->chunk_started_ns.load(std::memory_order_relaxed);
    if (started != 0 && (oldest == 0 || started < oldest)) {
      oldest = started;
      where = (std::uint64_t{1} << 63) | (std::uint64_t{d} << 32) | m_p.dev.replicas[d]->current_chunk.load(std::memory_order_relaxed);
    }
  }
  job->write(me, Cluster::kWhere, where);
  // A rank whose process has stopped is the heartbeat's to report (detail::Heartbeat, within heartbeat_timeout);
  // here, one that runs but makes no progress in its step, or does not call step() with the others.
  const auto now = Clock::now();
  for (const int r : watched) {  // every other rank, or its fingers in large jobs (detail::watched_ranks)
    const std::uint64_t beat = job->read(r, Cluster::kProgress);
    const double quiet = peers_seen[static_cast<std::size_t>(r)].seconds_still(beat, now);
    if (quiet <= m_p.options.stall_timeout) continue;
    char msg[640];
    std::snprintf(msg, sizeof msg,
                  "stealbatch: %s made no progress for %.0f ms while this rank is in step %llu; last seen in %s (stuck, or not calling step() "
                  "with the others; stall_timeout = %g s): ending the job",
                  detail::rank_and_node(*job, r).c_str(), quiet * 1e3, static_cast<unsigned long long>(step_now),
                  detail::last_seen(beat, job->read(r, Cluster::kWhere)).c_str(), m_p.options.stall_timeout);
    job->abort(msg, 1);
  }
}

void ClusterState::begin_step(std::span<const std::uint32_t> samples, std::span<const double> cost, Reduce reduce_to) {
  // Before the step's first collective, whose size follows the batch: every rank must be at the same step, with the
  // same batch, sample costs and learning rate, or the job would corrupt the MPI library's buffers, hang, or train
  // wrongly (the chunk table that every rank builds alike follows the costs).
  for (auto& seen : peers_seen) seen.restart();  // each step's watch starts afresh
  step_now = steps + 1;
  publish_progress();  // in this step now
  char lr[32];
  std::snprintf(lr, sizeof lr, "%.9g", static_cast<double>(m_p.options.optimizer.lr));
  const char* call = reduce_to == Reduce::kUpdate ? "step()" : reduce_to == Reduce::kMean ? "compute_gradient()" : "a summed gradient";
  detail::check_agreement(*job,
                          {{"step", std::to_string(step_now)}, {"call", call}, {"batch size", std::to_string(samples.size())},
                           {"batch (hash of its sample ids)", detail::hex16(detail::fnv1a(std::as_bytes(samples)))},
                           {"sample costs (hash of their bytes)", cost.empty() ? std::string("none") : detail::hex16(detail::fnv1a(std::as_bytes(cost)))},
                           {"learning rate", lr}},
                          "at a step", [this] { watch(); });
}

void ClusterState::plan(std::size_t batch, StepPlan& p) {
  const std::size_t ranks = static_cast<std::size_t>(job->size());
  RankShares& rs = p.ranks;
  rs.me = static_cast<std::size_t>(job->rank());
  rs.tag = static_cast<std::uint16_t>(steps++ % 65535 + 1);  // 1 to 65535: never a fresh word's 0
  // The rank speeds, the same on every rank (gathered with the last reduction): the shares in proportion to them, each
  // cut into chunks sized by its rank's speed. With given costs, in cost: each rank's cost per second in mean-cost
  // samples of this batch, and chunks of a cost budget (a chunk of long samples holds fewer of them). A static run
  // that is not packed splits the samples equally, as in one process (plan_given_costs()).
  const bool by_cost = m_p.costs.given() && (m_p.options.schedule.policy == SchedulePolicy::kSteal || m_p.costs.packed());
  rs.speed.assign(ranks, 0.0);
  bool known = true;
  for (std::size_t r = 0; r < ranks; ++r) {
    rs.speed[r] = by_cost ? median(rank_cost_history[r]) / m_p.costs.mean : median(rank_speed_history[r]);
    known = known && std::isfinite(rs.speed[r]) && rs.speed[r] > 0;
  }
  rs.measured = known && m_p.options.schedule.policy == SchedulePolicy::kSteal;
  if (!rs.measured) rs.speed.assign(ranks, 1.0);
  const std::size_t job_devices = total_devices();
  const bool cells = m_p.options.schedule.deterministic;  // every rank's chunk is a cell (cut_cell_grid())
  const std::size_t full = cells || m_p.options.schedule.chunk_size > 0 ? cell_size(batch, m_p.options.schedule.chunk_size) : std::clamp(batch / (kChunksPerDevice * job_devices), kMinAuto, kMaxAuto);
  const double fastest = *std::max_element(rs.speed.begin(), rs.speed.end());
  rs.chunk.resize(ranks);
  // Automatic sizes: a rank's chunks no smaller than its efficient size, once measured (a call's fixed part at most
  // kFixedShareAtMost of its time), as in one process; cut_rank_shares() cuts no end below it either.
  const bool sized = !cells && m_p.options.schedule.chunk_size == 0 && !by_cost;
  rs.least.assign(ranks, 0.0);
  for (std::size_t r = 0; r < ranks; ++r) {
    const double c = static_cast<double>(full) * (cells ? 1.0 : rs.speed[r] / fastest);
    rs.chunk[r] = by_cost ? c : std::max(1.0, std::round(c));  // whole samples without costs
    if (sized) rs.least[r] = std::min(rank_efficient[r], static_cast<double>(batch));
    rs.chunk[r] = std::max(rs.chunk[r], rs.least[r]);
  }
  if (by_cost) {
    p.placement = Placement::kByCost;
    p.position_cost = m_p.costs.norm;
    p.cost_chunk = rs.chunk[rs.me];
  }
  rs.victims.clear();
  for (int pass = 0; pass < 2; ++pass) {
    for (std::size_t i = 1; i < ranks; ++i) {
      const int v = static_cast<int>((rs.me + i) % ranks);
      if (job->same_node(v) == (pass == 0)) rs.victims.push_back(v);
    }
    if (pass == 0) rs.node_victims = rs.victims.size();
  }
  // How many of the other nodes' ranks a call for work reads (ClusterOptions::probes): all of up to kProbeAllUpTo,
  // else 2 x ceil(log2 ranks), at least kMinProbes, drawn afresh at every call.
  const std::size_t others = rs.victims.size() - rs.node_victims;
  std::size_t probes = m_p.options.cluster.probes;
  if (probes == 0) probes = others <= kProbeAllUpTo ? others : std::max<std::size_t>(kMinProbes, 2 * static_cast<std::size_t>(std::bit_width(ranks - 1)));
  rs.probes = std::min(probes, others);
  // The other ranks' devices take from this rank's share too once theirs is done: for the end game, their rate in
  // this rank's full chunks (none while the rank speeds are equal placeholders).
  p.outside_rate = 0;
  for (std::size_t r = 0; r < ranks && rs.measured; ++r) p.outside_rate += r == rs.me ? 0.0 : rs.speed[r] / rs.chunk[rs.me];
}

namespace {

// Writes the own share, unless a thief already did (with its steal taken out).
void publish_share(Cluster& c, const RankShares& rs) {
  const int me = c.rank();
  for (std::uint64_t old = c.read(me, Cluster::kShare); detail::ShareWord::unpack(old).tag != rs.tag;) {
    const std::uint64_t seen = c.compare_and_swap(me, Cluster::kShare, old, rs.word_of(rs.me).pack());
    if (seen == old) break;
    old = seen;  // a thief wrote it first, with this step's tag: the loop ends
  }
}

// The claim from the own share's front: one chunk per local device, as room allows.
std::size_t claim_own(Cluster& c, const RankShares& rs, std::uint32_t devices, std::uint32_t room, std::uint32_t& first) {
  const int me = c.rank();
  for (std::uint64_t old = c.read(me, Cluster::kShare);;) {
    const detail::ShareWord s = detail::ShareWord::unpack(old);
    if (s.left() == 0) return 0;
    const std::uint32_t k = std::min<std::uint32_t>({devices, s.left(), room});
    const std::uint64_t seen = c.compare_and_swap(me, Cluster::kShare, old, detail::ShareWord{rs.tag, s.front + k, s.back}.pack());
    if (seen == old) return first = s.front, k;
    old = seen;
  }
}

// A steal from a victim's back: the part that makes thief and victim finish together (detail::steal_amount).
std::size_t steal_from(Cluster& c, const RankShares& rs, int v, std::uint32_t room, std::uint32_t& first) {
  for (std::uint64_t old = c.read(v, Cluster::kShare);;) {
    detail::ShareWord s = detail::ShareWord::unpack(old);
    if (s.tag != rs.tag) s = rs.word_of(static_cast<std::size_t>(v));  // its owner has not written this step's share yet
    const std::uint32_t k = std::min(detail::steal_amount(s.left(), rs.speed[rs.me], rs.speed[static_cast<std::size_t>(v)]), room);
    if (k == 0) return 0;  // empty, or better left to its owner: so it stays, since shares only shrink
    const std::uint64_t seen = c.compare_and_swap(v, Cluster::kShare, old, detail::ShareWord{rs.tag, s.front, s.back - k}.pack());
    if (seen == old) return first = s.back - k, k;
    old = seen;
  }
}

// After a failure: leaves nothing of the own share for the others to run (the step fails on every rank anyway).
void give_up_share(Cluster& c, std::uint16_t tag) {
  const int me = c.rank();
  for (std::uint64_t old = c.read(me, Cluster::kShare);;) {
    const detail::ShareWord s = detail::ShareWord::unpack(old);
    if (s.tag == tag && s.left() == 0) return;
    const std::uint64_t seen = c.compare_and_swap(me, Cluster::kShare, old, detail::ShareWord{tag, 0, 0}.pack());
    if (seen == old) return;
    old = seen;
  }
}

// What every rank's share still holds, in this rank's full chunks, for the end game (an estimate: a share whose owner
// has not written this step's word yet counts whole; a failed read counts as more than any step holds, so the
// device takes). With bounded probes (RankShares::probes), the own word and the node's exactly, and as many of the
// other nodes' as a call for work reads, spread evenly from a place that moves with each call, scaled to them all.
std::uint64_t held_by_shares(Cluster& c, const RankShares& rs, std::size_t call) noexcept {
  try {
    const auto held_by = [&](int r) {
      detail::ShareWord s = detail::ShareWord::unpack(c.read(r, Cluster::kShare));
      if (s.tag != rs.tag) s = r == c.rank() ? detail::ShareWord{rs.tag, 0, 0} : rs.word_of(static_cast<std::size_t>(r));
      return rs.before[s.back] - rs.before[s.front];
    };
    double held = held_by(c.rank());
    for (std::size_t i = 0; i < rs.node_victims; ++i) held += held_by(rs.victims[i]);
    const std::size_t others = rs.victims.size() - rs.node_victims;
    if (rs.probes >= others) {
      for (std::size_t i = rs.node_victims; i < rs.victims.size(); ++i) held += held_by(rs.victims[i]);
    } else if (rs.probes > 0) {
      double sampled = 0;
      for (std::size_t j = 0; j < rs.probes; ++j) sampled += held_by(rs.victims[rs.node_victims + (call + j * others / rs.probes) % others]);
      held += sampled * static_cast<double>(others) / static_cast<double>(rs.probes);
    }
    return static_cast<std::uint64_t>(std::min(std::ceil(held / rs.chunk[rs.me] - 1e-9), 4294967296.0));  // as a failed read, at most
  } catch (...) {
    return std::uint64_t{1} << 32;
  }
}

// A call's walk over the victims once its own share is empty: the node's ranks in order, then every other node's
// rank in order, or rs.probes of them drawn afresh at each call (distinct within a call; the source is asked by one
// worker at a time, so the draw needs no lock). Past `budget` seconds of a call (0: none), no more reads of other
// nodes' words once one was made. A victim whose share holds no more chunks than it has devices is not read: its
// first call for work claims it whole (claim_own() takes a chunk for each of its devices), so once the victim has
// begun the step nothing of it is left. (A victim that has not begun by the time a thief is done keeps its share
// and runs it, as a static split would; across nodes each read costs milliseconds, and a share of one chunk a device
// is what a slow call, or a fast network, leaves a rank every step.)
class VictimWalk {
 public:
  VictimWalk(Cluster& cluster, const RankShares& rs, double budget, std::span<const std::size_t> rank_devices)
      : m_cluster(cluster), m_rs(rs), m_budget(budget), m_draw(static_cast<std::uint64_t>(rs.tag) << 32 | rs.me) {
    m_whole.resize(rs.share.size());
    for (std::size_t r = 0; r < rs.share.size(); ++r) m_whole[r] = rs.share[r].size() <= rank_devices[r];
  }

  // Chunks stolen into [first, first + k), at most `room`; 0 when no victim walked had any. Counts the steals in phase.
  std::size_t steal(std::uint32_t room, std::uint32_t& first, ChunkPhase& phase, Clock::time_point t0) {
    std::size_t k = 0;
    const auto try_victim = [&](std::size_t i) {
      const int v = m_rs.victims[i];
      if (m_whole[static_cast<std::size_t>(v)]) return;
      k = steal_from(m_cluster, m_rs, v, room, first);
      if (k != 0) phase.remote_chunks += k, ++phase.remote_steals;
    };
    const std::size_t others = m_rs.victims.size() - m_rs.node_victims;
    std::size_t i = 0;
    for (; k == 0 && i < m_rs.node_victims; ++i) try_victim(i);
    if (m_rs.probes >= others) {
      for (; k == 0 && i < m_rs.victims.size(); ++i) try_victim(i);
      return k;
    }
    m_drawn.clear();
    while (k == 0 && m_drawn.size() < m_rs.probes) {  // ends: probes < others, so a fresh one is always left
      if (m_budget > 0 && !m_drawn.empty() && seconds(Clock::now() - t0) > m_budget) break;
      const std::size_t j = m_rs.node_victims + m_draw.below(others);
      if (std::find(m_drawn.begin(), m_drawn.end(), j) != m_drawn.end()) continue;
      m_drawn.push_back(j);
      try_victim(j);
    }
    return k;
  }

 private:
  Cluster& m_cluster;
  const RankShares& m_rs;
  double m_budget;
  Rng m_draw;
  std::vector<std::size_t> m_drawn;
  std::vector<char> m_whole;  // by rank: a share claimed whole as its owner begins
};

}  // namespace

ChunkPhase ClusterState::run_from_shares(ChunkTable& t, const StepPlan& plan, Clock::time_point step_start, Scheduler& sched, ChunkFn run) {
  const RankShares& rs = plan.ranks;
  publish_share(*job, rs);
  ChunkPhase phase;
  phase.start = step_start;
  // The scheduler's chunk source: chunks from the own share's front, else part of a victim's back; each handed out
  // to the device that asked, as its own. The walk's budget, once the ranks' speeds are measured: as long as one of
  // this rank's full chunks on one of its devices (the rank's speed is its devices' sum; over TCP a read costs about a
  // millisecond).
  VictimWalk walk(*job, rs, rs.measured ? rs.chunk[rs.me] * static_cast<double>(m_p.dev.devices.size()) / rs.speed[rs.me] : 0.0, rank_devices);
  const auto take = [&](std::size_t w, std::span<ChunkId> out) -> std::size_t {
    const auto t0 = Clock::now();
    const auto room = static_cast<std::uint32_t>(out.size());
    std::uint32_t first = 0;
    std::size_t k = claim_own(*job, rs, static_cast<std::uint32_t>(m_p.dev.devices.size()), room, first);
    if (k == 0 && m_p.options.schedule.policy == SchedulePolicy::kSteal) k = walk.steal(room, first, phase, t0);
    for (std::uint32_t i = 0; i < k; ++i) out[i] = first + i, t.home[first + i] = static_cast<std::uint32_t>(w);
    if (k == 0) phase.leave_s = seconds(Clock::now() - t0);
    return k;
  };
  // Workers may ask at once; the count only moves the sample (relaxed: it publishes nothing).
  std::atomic<std::size_t> pending_calls{0};
  const std::function<std::uint64_t()> pending = [this, &rs, &pending_calls]() noexcept {
    return held_by_shares(*job, rs, pending_calls.fetch_add(1, std::memory_order_relaxed));
  };
  try {
    phase.stats = sched.run_sourced(take, run, pending);
  } catch (const std::exception& e) {
    phase.failure = std::current_exception(), phase.failure_text = e.what();
  } catch (...) {
    phase.failure = std::current_exception(), phase.failure_text = "a non-standard exception";
  }
  // A failure is every rank's (the reduction carries it): nothing of the own share is left for the others to run.
  if (phase.failure) give_up_share(*job, rs.tag), phase.stats.workers.resize(m_p.dev.devices.size());
  phase.end = Clock::now();
  return phase;
}

void ClusterState::fill_tally(const ChunkTable& t, const ChunkPhase& phase, const std::vector<DeviceReport>& local, RankTally& tally) {
  const int me = job->rank();
  double busy = 0, samples = 0, cost = 0, loss = 0;
  for (std::size_t d = 0; d < m_p.dev.devices.size(); ++d) {
    const DeviceReport& dr = local[d];
    double* f = tally.device(first_device + d);
    f[0] = dr.compute_s, f[1] = static_cast<double>(dr.chunks_run), f[2] = static_cast<double>(dr.chunks_stolen);
    f[3] = static_cast<double>(dr.samples), f[4] = static_cast<double>(dr.chunk_samples);
    f[5] = m_p.dev.kind == DeviceKind::kSim ? 1.0 : m_p.dev.kind == DeviceKind::kCuda ? 2.0 : 0.0;
    f[6] = m_p.costs.given() ? dr.cost / m_p.costs.mean : 0.0;  // in mean-cost samples, as the speed below
    busy = std::max(busy, dr.compute_s), samples += static_cast<double>(dr.samples), cost += dr.cost, loss += m_p.dev.replicas[d]->loss;
  }
  // This rank's samples/s: what its devices ran over the time the busiest computed (0 when it ran nothing); and with
  // given costs its cost per second, sent in mean-cost samples.
  tally.speed()[me] = busy > 0 ? samples / busy : 0.0;
  tally.cost_speed()[me] = busy > 0 && m_p.costs.given() ? cost / m_p.costs.mean / busy : 0.0;
  tally.failed()[me] = phase.failure ? 1.0 : 0.0;
  tally.loss()[me] = loss;
  // This rank's chunk times against their samples (each chunk its own call; no given costs): its efficient size.
  for (std::size_t c = 0; c < t.compute_s.size() && !m_p.costs.given(); ++c) {
    if (t.runs[c] != 0 && t.compute_s[c] > 0) chunk_fit.add(static_cast<double>(t.spans[c].size), t.compute_s[c]);
  }
  const detail::CallFit& fit = chunk_fit;
  tally.efficient()[me] = fit.known() && fit.separates() ? std::ceil(fit.overhead_cost(1 - kFixedShareAtMost)) : 0.0;
  for (std::size_t c = 0; c < t.size(); ++c) tally.runs()[c] = static_cast<double>(t.runs[c]);
  if (m_p.exact) {  // deterministic mode: every rank's exponents, beside its fixed-point sum
    const std::vector<int> mine = m_p.exact.exponents();
    std::copy(mine.begin(), mine.end(), tally.exponents(static_cast<std::size_t>(me)));
  }
}

bool ClusterState::sum(const ChunkTable& t, const ChunkPhase& phase, const std::vector<DeviceReport>& local, RankTally& tally) {
  // The sum's own calls progress the transport: accesses from the ranks still in their chunk phase need no more.
  struct Summing {
    Cluster& job;
    explicit Summing(Cluster& c) : job(c) { job.set_prompt_access(false); }
    ~Summing() { job.set_prompt_access(true); }
    Summing(const Summing&) = delete;
    Summing& operator=(const Summing&) = delete;
  } summing(*job);
  fill_tally(t, phase, local, tally);
  // The gradient (float, or bfloat16 on the wire), then the tallies in doubles: two collectives.
  const auto on_wait = [this] { watch(); };
  if (tally.count > 0 && m_p.options.cluster.wire == WireFormat::kBfloat16) {
    job->allreduce_sum_bf16(tally.gradient, on_wait);
  } else if (tally.count > 0) {
    job->allreduce_sum(std::span<float>(tally.gradient), on_wait);
  }
  job->allreduce_sum(std::span<double>(tally.tallies), on_wait);
  // Deterministic mode: the fixed-point sum and every rank's exponents, every rank alike.
  if (m_p.exact) job->allreduce_sum(std::span<std::int64_t>(tally.exact), on_wait);
  return conclude(phase, tally);
}

// What every rank concludes from the sum: a failure anywhere fails the step everywhere (with the first failed rank's
// message); every chunk ran exactly once across the ranks; the ranks' speeds for the next steps; in deterministic mode
// the verdict on the attempt.
bool ClusterState::conclude(const ChunkPhase& phase, RankTally& tally) {
  const std::size_t ranks = static_cast<std::size_t>(job->size());
  const int me = job->rank();
  for (std::size_t r = 0; r < ranks; ++r) {
    if (tally.failed()[r] == 0.0) continue;
    std::vector<char> text(1024, '\0');
    if (r == static_cast<std::size_t>(me)) std::strncpy(text.data(), phase.failure_text.c_str(), text.size() - 1);
    job->broadcast(text, static_cast<int>(r));
    if (phase.failure) std::rethrow_exception(phase.failure);
    throw Error("step " + std::to_string(m_p.steps + 1) + " failed on rank " + std::to_string(r) + ": " + text.data() + "; nothing was applied on any rank");
  }
  for (std::size_t c = 0; c < tally.chunks; ++c) {
    if (tally.runs()[c] != 1.0) {
      throw std::logic_error("runtime: chunk " + std::to_string(c) + " ran " + std::to_string(static_cast<long long>(tally.runs()[c])) + " times across the ranks in step " +
                             std::to_string(m_p.steps + 1) + ": exactly-once violated");
    }
  }
  for (std::size_t r = 0; r < ranks; ++r) {
    if (tally.efficient()[r] > 0) rank_efficient[r] = tally.efficient()[r];
    if (tally.speed()[r] > 0) push_window(rank_speed_history[r], tally.speed()[r], m_p.options.schedule.throughput_window);
    if (tally.cost_speed()[r] > 0) push_window(rank_cost_history[r], tally.cost_speed()[r] * m_p.costs.mean, m_p.options.schedule.throughput_window);
  }
  if (!m_p.exact) return true;
  // The verdict on the attempt, from the job's largest exponent of each tensor (the same on every rank).
  std::vector<int> largest(m_p.exact.tensors(), detail::kNoExponent);
  for (std::size_t r = 0; r < ranks; ++r) {
    const std::int64_t* e = tally.exponents(r);
    for (std::size_t i = 0; i < largest.size(); ++i) largest[i] = std::max(largest[i], static_cast<int>(e[i]));
  }
  return m_p.exact.settle(largest);
}

void ClusterState::add_devices(StepReport& rep, RankTally& tally, std::vector<DeviceReport> local) const {
  const std::size_t ranks = static_cast<std::size_t>(job->size()), me = static_cast<std::size_t>(job->rank());
  rep.ranks = ranks;
  double loss = 0;
  for (std::size_t r = 0; r < ranks; ++r) loss += tally.loss()[r];
  rep.loss = loss / static_cast<double>(rep.samples);
  for (std::size_t r = 0, g = 0; r < ranks; ++r) {
    for (std::size_t d = 0; d < rank_devices[r]; ++d, ++g) {
      const double* f = tally.device(g);
      DeviceReport dr;
      if (r == me) {
        dr = std::move(local[d]);
      } else {
        dr.compute_s = dr.busy_s = f[0];
        dr.chunks_run = static_cast<std::uint64_t>(f[1]), dr.chunks_stolen = static_cast<std::uint64_t>(f[2]);
        dr.samples = static_cast<std::uint64_t>(f[3]), dr.chunk_samples = static_cast<std::size_t>(f[4]), dr.cost = f[6] * m_p.costs.mean;
        dr.barrier_wait_s = std::max(0.0, rep.chunks_s - dr.compute_s);
      }
      dr.name = "r" + std::to_string(r) + "/" + (f[5] == 1.0 ? "sim" : f[5] == 2.0 ? "cuda" : "cpu") + std::to_string(d);
      rep.devices.push_back(std::move(dr));
    }
  }
}

}  // namespace stealbatch
