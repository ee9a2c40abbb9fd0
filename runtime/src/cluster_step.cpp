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
// the chunk phase for good. The reduction carries, beside the gradient, every rank's speed, failure flag, chunk run
// counts and device tallies, so every rank checks exactly-once over the whole job and learns the same speeds.
#include "runtime_impl.hpp"

#include <stealbatch/runtime/detail/agreement.hpp>
#include <stealbatch/runtime/detail/speed_shares.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <thread>

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

// Tallies per device that travel with the reduction: busy seconds, chunks run, chunks stolen, samples, chunk size,
constexpr std::size_t kDeviceFields = 6;  // and its kind (0 cpu, 1 sim, 2 cuda: its name)
// The sizes of the chunk phase when a step's chunk size is left to the runtime (chunk_size = 0) across ranks: the
// fastest rank's chunks hold batch / (kChunksPerDevice x devices) samples, within [kMinAuto, kMaxAuto].
constexpr std::size_t kChunksPerDevice = 4, kMinAuto = 16, kMaxAuto = 512;
// A share's end is cut finer over this many chunks' worth of samples (as one process cuts a device's share).
constexpr std::size_t kTailChunks = 6;

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

// The reduction's buffer: the gradient, then every rank's speed and failure flag, every chunk's run count, every
// device's tallies and every rank's loss sum; each rank writes its own entries and leaves the others 0, so the sum
// is a gather.
struct Tally {
  std::size_t count, ranks, chunks, devices;
  std::vector<float> buf;
  Tally(std::size_t c, std::size_t r, std::size_t k, std::size_t d) : count(c), ranks(r), chunks(k), devices(d), buf(c + 3 * r + k + kDeviceFields * d, 0.0f) {}
  float* grad() { return buf.data(); }
  float* speed() { return buf.data() + count; }
  float* failed() { return speed() + ranks; }
  float* loss() { return failed() + ranks; }
  float* runs() { return loss() + ranks; }
  float* device(std::size_t d) { return runs() + chunks + kDeviceFields * d; }
};

}  // namespace

void Runtime::Impl::join_cluster(DeviceSpec& spec) {
  const int ranks = cluster->size(), me = cluster->rank();
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
    for (int r = 0; r < me; ++r) local += cluster->same_node(r) ? 1 : 0;
    spec.ids = {local};
  }
  // A fresh share word (tag 0, which no step uses) before the collective below: no rank's first step can then mistake
  // what an earlier runtime on this cluster left for its own step's share.
  cluster->write(me, Cluster::kShare, 0);
  std::vector<double> counts(static_cast<std::size_t>(ranks), 0.0);
  counts[static_cast<std::size_t>(me)] = static_cast<double>(spec.count);
  cluster->allreduce_sum(counts);
  rank_devices.clear();
  for (double c : counts) rank_devices.push_back(static_cast<std::size_t>(c));
  first_device = std::accumulate(rank_devices.begin(), rank_devices.begin() + me, std::size_t{0});
  const std::size_t total = std::accumulate(rank_devices.begin(), rank_devices.end(), std::size_t{0});
  if (!options.slowdown.empty() && options.slowdown.size() == total && total != spec.count) {
    // One factor per device of the whole job, in rank order: keep this rank's.
    options.slowdown = std::vector<double>(options.slowdown.begin() + static_cast<std::ptrdiff_t>(first_device),
                                           options.slowdown.begin() + static_cast<std::ptrdiff_t>(first_device + spec.count));
  }
  if (options.threads_per_device == 0 && spec.kind == DeviceKind::kCpu) {
    // The node's cores shared among the devices of every rank on it.
    std::size_t on_node = 0;
    for (int r = 0; r < ranks; ++r) on_node += cluster->same_node(r) ? rank_devices[static_cast<std::size_t>(r)] : 0;
    options.threads_per_device = std::max(1, static_cast<int>(std::max(1u, std::thread::hardware_concurrency()) / std::max<std::size_t>(1, on_node)));
  }
  rank_speed_history.assign(static_cast<std::size_t>(ranks), {});
  peers_seen.assign(static_cast<std::size_t>(ranks), {});
  // The clocks: each of a few rounds ends a collective on every rank at about the same moment; there every rank reads
  // its time since its own epoch, and the median difference from rank 0's is the offset (within the collective's
  // exit skew, microseconds on a node). The trace puts every rank on rank 0's timeline with it.
  std::vector<double> offsets;
  for (int round = 0; round < 5; ++round) {
    std::vector<double> at(static_cast<std::size_t>(ranks), 0.0);
    cluster->allreduce_sum(at);  // a rendezvous
    at.assign(static_cast<std::size_t>(ranks), 0.0);
    at[static_cast<std::size_t>(me)] = static_cast<double>((Clock::now() - epoch).count());
    cluster->allreduce_sum(at);
    offsets.push_back(at[0] - at[static_cast<std::size_t>(me)]);
  }
  clock_offset_ns = static_cast<std::int64_t>(median(offsets));
}

void Runtime::Impl::publish_progress() {
  cluster->write(cluster->rank(), Cluster::kProgress, (cluster_step_now << 32) | (++progress & 0xffffffffu));
}

void Runtime::Impl::watch_cluster() {
  const int me = cluster->rank();
  publish_progress();
  // Where this rank is: the chunk its longest-running device is in (for the others' message if it stops).
  std::int64_t oldest = 0;
  std::uint64_t where = 0;
  for (std::size_t d = 0; d < replicas.size(); ++d) {
    const std::int64_t started = replicas[d]->chunk_started_ns.load(std::memory_order_relaxed);
    if (started != 0 && (oldest == 0 || started < oldest)) {
      oldest = started;
      where = (std::uint64_t{1} << 63) | (std::uint64_t{d} << 32) | replicas[d]->current_chunk.load(std::memory_order_relaxed);
    }
  }
  cluster->write(me, Cluster::kWhere, where);
  // A rank whose process has stopped is the heartbeat's to report (detail::Heartbeat, within heartbeat_timeout);
  // here, one that runs but makes no progress in its step, or does not call step() with the others.
  const auto now = Clock::now();
  for (int r = 0; r < cluster->size(); ++r) {
    if (r == me) continue;
    const std::uint64_t beat = cluster->read(r, Cluster::kProgress);
    const double quiet = peers_seen[static_cast<std::size_t>(r)].seconds_still(beat, now);
    if (quiet <= options.stall_timeout) continue;
    char msg[640];
    std::snprintf(msg, sizeof msg,
                  "stealbatch: %s made no progress for %.0f ms while this rank is in step %llu; last seen in %s (stuck, or not calling step() "
                  "with the others; stall_timeout = %g s): ending the job",
                  detail::rank_and_node(*cluster, r).c_str(), quiet * 1e3, static_cast<unsigned long long>(cluster_step_now),
                  detail::last_seen(beat, cluster->read(r, Cluster::kWhere)).c_str(), options.stall_timeout);
    cluster->abort(msg, 1);
  }
}

namespace {

// One step as every rank sees it: its tag, the rank speeds, the chunk table and each rank's share of it, this rank's
// victims in order, and what this rank took from the others.
struct ClusterPlan {
  std::uint16_t tag = 0;
  std::vector<double> speed;  // each rank's samples/s
  bool measured = false;      // else the speeds are equal placeholders
  std::vector<ChunkRange> share;  // each rank's chunk ids
  ChunkTable t;
  std::vector<std::uint64_t> before;  // the samples of chunks [0, c): a share word's samples at two reads
  std::vector<int> victims;       // the other ranks of this node first, then the rest, each list starting after this rank
  std::uint64_t remote_chunks = 0, remote_steals = 0;
  double leave_s = 0;  // the call for work that found none
  detail::ShareWord word_of(std::size_t r) const {
    return {tag, static_cast<std::uint32_t>(share[r].begin), static_cast<std::uint32_t>(share[r].end)};
  }
};

// The rank speeds (the same on every rank), the shares in proportion, each cut into chunks sized by its rank's speed.
ClusterPlan plan_cluster_step(Runtime::Impl& m, std::size_t batch) {
  const std::size_t ranks = static_cast<std::size_t>(m.cluster->size()), n = m.devices.size();
  const int me = m.cluster->rank();
  ClusterPlan p;
  p.tag = static_cast<std::uint16_t>(m.cluster_steps++ % 65535 + 1);  // 1 to 65535: never a fresh word's 0
  p.speed.assign(ranks, 0.0);
  bool known = true;
  for (std::size_t r = 0; r < ranks; ++r) p.speed[r] = median(m.rank_speed_history[r]), known = known && p.speed[r] > 0;
  p.measured = known && m.options.policy == SchedulePolicy::kSteal;
  if (!p.measured) p.speed.assign(ranks, 1.0);
  const std::size_t total_devices = std::accumulate(m.rank_devices.begin(), m.rank_devices.end(), std::size_t{0});
  const std::size_t full = m.options.chunk_size > 0 ? m.options.chunk_size : std::clamp(batch / (kChunksPerDevice * total_devices), kMinAuto, kMaxAuto);
  const double fastest = *std::max_element(p.speed.begin(), p.speed.end());
  const std::vector<ChunkRange> samples = place_proportional(batch, p.speed);
  ChunkTable& t = p.t;
  p.share.resize(ranks);
  for (std::size_t r = 0; r < ranks; ++r) {
    const std::size_t size = std::max<std::size_t>(1, static_cast<std::size_t>(std::lround(static_cast<double>(full) * p.speed[r] / fastest)));
    p.share[r].begin = static_cast<ChunkId>(t.spans.size());
    // Whole chunks, then the share's last kTailChunks chunks' worth cut finer: each a sixth of what is left, down to a
    // quarter chunk. The owner claims from the front and thieves from the back, so whatever runs last in the step, on
    // a slow device of the rank or on a thief, is small.
    const std::size_t len = samples[r].end - samples[r].begin, tail = std::min(len, kTailChunks * size), quarter = std::max<std::size_t>(1, size / 4);
    std::size_t s = samples[r].begin;
    while (s + tail < samples[r].end) {
      const std::size_t piece = std::min(size, samples[r].end - tail - s);
      t.spans.push_back({static_cast<std::uint32_t>(s), static_cast<std::uint32_t>(piece)});
      s += piece;
    }
    while (s < samples[r].end) {
      const std::size_t left = samples[r].end - s, piece = std::min(left, std::max(quarter, (left + kTailChunks - 1) / kTailChunks));
      t.spans.push_back({static_cast<std::uint32_t>(s), static_cast<std::uint32_t>(piece)});
      s += piece;
    }
    p.share[r].end = static_cast<ChunkId>(t.spans.size());
    if (r == static_cast<std::size_t>(me)) t.own_size.assign(n, size);
  }
  p.before.assign(t.size() + 1, 0);
  for (std::size_t c = 0; c < t.size(); ++c) p.before[c + 1] = p.before[c] + t.spans[c].size;
  const std::size_t chunks = t.size();
  if (chunks >= detail::ShareWord::kMaxChunk) {
    throw ConfigError("batch = " + std::to_string(batch) + " makes " + std::to_string(chunks) + " chunks across ranks; at most " +
                      std::to_string(detail::ShareWord::kMaxChunk - 1) + " (raise chunk_size)");
  }
  t.home.assign(chunks, 0), t.ran_on.assign(chunks, 0), t.runs.assign(chunks, 0), t.own_cost.assign(n, 1.0), t.share_len.assign(n, 0);
  for (int pass = 0; pass < 2; ++pass) {
    for (std::size_t i = 1; i < ranks; ++i) {
      const int v = static_cast<int>((static_cast<std::size_t>(me) + i) % ranks);
      if (m.cluster->same_node(v) == (pass == 0)) p.victims.push_back(v);
    }
  }
  return p;
}

// Writes the own share, unless a thief already did (with its steal taken out).
void publish_share(Cluster& c, const ClusterPlan& p) {
  const int me = c.rank();
  for (std::uint64_t old = c.read(me, Cluster::kShare); detail::ShareWord::unpack(old).tag != p.tag;) {
    const std::uint64_t seen = c.compare_and_swap(me, Cluster::kShare, old, p.word_of(static_cast<std::size_t>(me)).pack());
    if (seen == old) break;
    old = seen;  // a thief wrote it first, with this step's tag: the loop ends
  }
}

// The scheduler's chunk source: one chunk per local device from the own share's front, else part of a victim's back.
std::size_t take_chunks(Runtime::Impl& m, ClusterPlan& p, std::size_t w, std::span<ChunkId> out) {
  const auto t0 = Clock::now();
  Cluster& c = *m.cluster;
  const int me = c.rank();
  const auto hand_out = [&](std::uint32_t begin, std::uint32_t k) {
    for (std::uint32_t i = 0; i < k; ++i) out[i] = begin + i, p.t.home[begin + i] = static_cast<std::uint32_t>(w);
    return std::size_t{k};
  };
  const auto room = static_cast<std::uint32_t>(out.size());
  for (std::uint64_t old = c.read(me, Cluster::kShare);;) {
    const detail::ShareWord s = detail::ShareWord::unpack(old);
    if (s.left() == 0) break;
    const std::uint32_t k = std::min<std::uint32_t>({static_cast<std::uint32_t>(m.devices.size()), s.left(), room});
    const std::uint64_t seen = c.compare_and_swap(me, Cluster::kShare, old, detail::ShareWord{p.tag, s.front + k, s.back}.pack());
    if (seen == old) return hand_out(s.front, k);
    old = seen;
  }
  if (m.options.policy != SchedulePolicy::kSteal) return 0;
  for (const int v : p.victims) {
    for (std::uint64_t old = c.read(v, Cluster::kShare);;) {
      detail::ShareWord s = detail::ShareWord::unpack(old);
      if (s.tag != p.tag) s = p.word_of(static_cast<std::size_t>(v));  // its owner has not written this step's share yet
      const std::uint32_t k =
          std::min(detail::steal_amount(s.left(), p.speed[static_cast<std::size_t>(me)], p.speed[static_cast<std::size_t>(v)]), room);
      if (k == 0) break;  // empty, or better left to its owner: so it stays, since shares only shrink
      const std::uint64_t seen = c.compare_and_swap(v, Cluster::kShare, old, detail::ShareWord{p.tag, s.front, s.back - k}.pack());
      if (seen == old) {
        p.remote_chunks += k, ++p.remote_steals;
        return hand_out(s.back - k, k);
      }
      old = seen;
    }
  }
  p.leave_s = seconds(Clock::now() - t0);
  return 0;
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

// Within the rank, every device's slice of the sum into the reduction's buffer with this rank's tallies; then across
// ranks, with the watch while waiting. `local` gets the devices' part of it.
// Devices that do not share host memory (GPUs): the gradient stays on them, and only the tallies cross through the
// cluster here; the job-wide sum of the gradients is the devices' own collective (NCCL), issued once every rank
// agreed that the step succeeded (reduce_devices()).
Tally reduce_across(Runtime::Impl& m, const ClusterPlan& p, const ChunkPhase& phase, bool failed, StepStats& local) {
  const bool host = m.host_devices;
  const std::size_t n = m.devices.size(), count = host ? m.layout.size() : 0, ranks = static_cast<std::size_t>(m.cluster->size());
  const std::size_t total_devices = std::accumulate(m.rank_devices.begin(), m.rank_devices.end(), std::size_t{0});
  const int me = m.cluster->rank();
  Tally tally(count, ranks, p.t.size(), total_devices);
  std::vector<float*> bufs(n);
  for (std::size_t d = 0; d < n; ++d) bufs[d] = m.devices[d]->grad().data();
  local = m.sched->broadcast([&](std::size_t d) {
    Device& dev = *m.devices[d];
    Replica& r = *m.replicas[d];
    const WatchStamp stamp(r, kReductionPhase, m.epoch);
    const auto f0 = Clock::now();
    dev.finish_chunks();  // chunks still in flight (a simulated device)
    r.finish = Clock::now() - f0;
    r.loss += dev.take_device_loss();
    dev.set_sample_count(r.samples);
    if (!host) return;
    InProcessCommunicator::sum_slice(d, bufs, count);
    const auto [b, e] = InProcessCommunicator::slice(d, n, count);
    std::copy(bufs[0] + b, bufs[0] + e, tally.grad() + b);
  });
  double busy = 0, samples = 0, loss = 0;
  for (std::size_t d = 0; d < n; ++d) {
    const WorkerCounters& wc = phase.stats.workers[d];
    // The device's time for its chunks: its own figure where it keeps one (chunks in flight), else its worker's busy
    // time plus the wait for what was still in flight (as in one process's report).
    const std::optional<double> own = m.devices[d]->step_device_seconds();
    const double compute = own ? *own : seconds(wc.busy) + seconds(m.replicas[d]->finish);
    float* f = tally.device(m.first_device + d);
    f[0] = static_cast<float>(compute), f[1] = static_cast<float>(wc.chunks_run), f[2] = static_cast<float>(wc.chunks_stolen);
    f[3] = static_cast<float>(m.replicas[d]->samples), f[4] = static_cast<float>(p.t.own_size[d]), f[5] = m.kind == DeviceKind::kSim ? 1.0f : m.kind == DeviceKind::kCuda ? 2.0f : 0.0f;
    busy = std::max(busy, compute), samples += static_cast<double>(m.replicas[d]->samples), loss += m.replicas[d]->loss;
  }
  // This rank's samples/s: what its devices ran over the time the busiest computed (0 when it ran nothing).
  tally.speed()[me] = busy > 0 ? static_cast<float>(samples / busy) : 0.0f;
  tally.failed()[me] = failed ? 1.0f : 0.0f;
  tally.loss()[me] = static_cast<float>(loss);
  for (std::size_t c = 0; c < p.t.size(); ++c) tally.runs()[c] = static_cast<float>(p.t.runs[c]);
  m.cluster->allreduce_sum(tally.buf, [&m] { m.watch_cluster(); });
  return tally;
}

// What every rank concludes from the sum: a failure anywhere fails the step everywhere (with the first failed rank's
// message); every chunk ran exactly once across the ranks; the ranks' speeds for the next steps.
void agree(Runtime::Impl& m, Tally& tally, const std::exception_ptr& failure, const std::string& failure_text) {
  const std::size_t ranks = static_cast<std::size_t>(m.cluster->size());
  const int me = m.cluster->rank();
  for (std::size_t r = 0; r < ranks; ++r) {
    if (tally.failed()[r] == 0.0f) continue;
    std::vector<char> text(1024, '\0');
    if (r == static_cast<std::size_t>(me)) std::strncpy(text.data(), failure_text.c_str(), text.size() - 1);
    m.cluster->broadcast(text, static_cast<int>(r));
    if (failure) std::rethrow_exception(failure);
    throw Error("step " + std::to_string(m.steps + 1) + " failed on rank " + std::to_string(r) + ": " + text.data() +
                "; nothing was applied on any rank");
  }
  for (std::size_t c = 0; c < tally.chunks; ++c) {
    if (tally.runs()[c] != 1.0f) {
      throw std::logic_error("runtime: chunk " + std::to_string(c) + " ran " + std::to_string(tally.runs()[c]) + " times across the ranks in step " +
                             std::to_string(m.steps + 1) + ": exactly-once violated");
    }
  }
  for (std::size_t r = 0; r < ranks; ++r) {
    auto& h = m.rank_speed_history[r];
    if (tally.speed()[r] <= 0) continue;
    if (h.size() >= m.options.throughput_window) h.erase(h.begin());
    h.push_back(tally.speed()[r]);
  }
}

// The update (or the mean) from the job's sum divided by the global batch, slice by slice on this rank's devices.
StepStats update_from(Runtime::Impl& m, Tally& tally, std::size_t batch, Reduce reduce_to) {
  const std::size_t n = m.devices.size(), count = m.layout.size();
  const float scale = 1.0f / static_cast<float>(batch);
  const bool update = reduce_to == Reduce::kUpdate;
  if (update && m.lr_pending) m.shared_optimizer->set_lr(m.options.optimizer.lr), m.lr_pending = false;
  const std::span<const float> sum(tally.grad(), count);
  return m.sched->broadcast([&](std::size_t d) {
    const WatchStamp stamp(*m.replicas[d], kReductionPhase, m.epoch);
    const auto u0 = Clock::now();
    const auto [b, e] = InProcessCommunicator::slice(d, n, count);
    if (update) {
      m.shared_optimizer->update_into(m.shared_params[m.shared_live], m.shared_params[1 - m.shared_live], sum, scale, b, e);
    } else {
      for (std::size_t i = b; i < e; ++i) m.mean_next[i] = sum[i] * scale;
    }
    for (std::size_t k = 0; k < n; ++k) std::fill(m.devices[k]->grad().data() + b, m.devices[k]->grad().data() + e, 0.0f);
    m.replicas[d]->update = Clock::now() - u0;
  });
}

// The report: every rank's devices, from the tallies; this rank's devices' speeds for throughput_estimates().
StepReport cluster_report(Runtime::Impl& m, const ClusterPlan& p, Tally& tally, const ChunkPhase& phase, const StepStats& local,
                          const StepStats& applied, std::size_t batch) {
  const std::size_t ranks = static_cast<std::size_t>(m.cluster->size());
  const int me = m.cluster->rank();
  StepReport rep;
  rep.step = ++m.steps;
  rep.ranks = ranks;
  rep.chunks_s = seconds(phase.end - phase.start);
  rep.samples = batch;
  rep.chunks = p.t.size();
  rep.remote_chunks = p.remote_chunks, rep.remote_steals = p.remote_steals, rep.leave_s = p.leave_s;
  double loss = 0;
  for (std::size_t r = 0; r < ranks; ++r) loss += tally.loss()[r];
  rep.loss = loss / static_cast<double>(batch);
  for (std::size_t r = 0, g = 0; r < ranks; ++r) {
    for (std::size_t d = 0; d < m.rank_devices[r]; ++d, ++g) {
      const float* f = tally.device(g);
      DeviceReport dr;
      dr.name = "r" + std::to_string(r) + "/" + (f[5] == 1.0f ? "sim" : f[5] == 2.0f ? "cuda" : "cpu") + std::to_string(d);
      dr.compute_s = dr.busy_s = f[0];
      if (r == static_cast<std::size_t>(me)) dr.busy_s += seconds(local.workers[d].busy) + seconds(applied.workers[d].busy);
      dr.chunks_run = static_cast<std::uint64_t>(f[1]), dr.chunks_stolen = static_cast<std::uint64_t>(f[2]);
      dr.samples = static_cast<std::uint64_t>(f[3]), dr.chunk_samples = static_cast<std::size_t>(f[4]);
      dr.barrier_wait_s = std::max(0.0, rep.chunks_s - dr.compute_s);
      rep.steals += dr.chunks_stolen;
      rep.devices.push_back(std::move(dr));
    }
  }
  for (std::size_t d = 0; d < m.devices.size(); ++d) {
    const double s = tally.device(m.first_device + d)[0];  // its compute time this step
    if (s <= 0 || m.replicas[d]->samples == 0) continue;
    auto& h = m.speed_history[d];
    if (h.size() >= m.options.throughput_window) h.erase(h.begin());
    h.push_back(static_cast<double>(m.replicas[d]->samples) / s);
  }
  const auto end = Clock::now();
  rep.reduce_s = seconds(end - phase.end);  // step() takes the update's part out of it
  if (m.trace) {
    const auto host = static_cast<std::uint32_t>(m.ids.size() + m.lost.size());
    m.trace->add({host, 0, (phase.end - m.epoch).count(), (end - m.epoch).count(), TraceKind::kAllReduce});
  }
  return rep;
}

// The end game, as in one process: with its devices' speeds measured, a device takes one more chunk only while the
// others would not finish everything left sooner, and a device whose chunks now take far longer than its speed says
// (slowed down mid-step) is weighed at what they take now (run_one()). The chunks this rank's devices hold are
// weighed against the rank's other devices; what the shares still hold, against every other device of the job (the
// other ranks' at their ranks' measured speeds), since those steal from this rank's share once their own is done: so
// a device that slowed down leaves the job's last chunks to the job, not to its rank's other device alone.
StepPlan local_end_game(Runtime::Impl& m, ClusterPlan& p) {
  StepPlan plan;
  const std::size_t n = m.devices.size();
  plan.speeds = m.throughput_estimates();
  bool known = plan.speeds.size() == n && n > 1;
  for (double v : plan.speeds) known = known && std::isfinite(v) && v > 0;
  if (!known || m.options.endgame != EndGame::kOn || m.options.policy != SchedulePolicy::kSteal) {
    m.sched->set_chunk_costs({});
    m.sched->set_outside_rate(0);
    return plan;
  }
  const double size = static_cast<double>(p.t.own_size[0]);  // this rank's full chunk
  std::vector<double> cost(n);
  for (std::size_t d = 0; d < n; ++d) cost[d] = size / plan.speeds[d];
  m.sched->set_chunk_costs(cost, cost);
  // The other ranks' devices, in this rank's chunks per second (none while the rank speeds are equal placeholders).
  const std::size_t me = static_cast<std::size_t>(m.cluster->rank());
  double outside = 0;
  for (std::size_t r = 0; r < p.speed.size(); ++r) outside += r == me ? 0.0 : p.speed[r] / size;
  m.sched->set_outside_rate(p.measured ? outside : 0.0);
  plan.known = true;
  plan.rate = plan.speeds;
  plan.watch_speed = true;
  plan.rank_share = p.share[me];
  p.t.chunk_cost.resize(p.t.size());
  for (std::size_t c = 0; c < p.t.size(); ++c) p.t.chunk_cost[c] = static_cast<double>(p.t.spans[c].size);
  p.t.stolen_ratio.assign(p.t.size(), 0.0f);
  return plan;
}

}  // namespace

StepReport Runtime::Impl::run_cluster_step(std::span<const std::uint32_t> samples, const ChunkFunction& fn, Reduce reduce_to) {
  const auto t_start = Clock::now();
  // Before the step's first collective, whose size follows the batch: every rank must be at the same step, with the
  // same batch and learning rate, or the job would corrupt the MPI library's buffers, hang, or train wrongly.
  for (auto& seen : peers_seen) seen.restart();  // each step's watch starts afresh
  cluster_step_now = cluster_steps + 1;
  publish_progress();  // in this step now
  {
    char lr[32];
    std::snprintf(lr, sizeof lr, "%.9g", static_cast<double>(options.optimizer.lr));
    detail::check_agreement(*cluster,
                            {{"step", std::to_string(cluster_step_now)}, {"call", reduce_to == Reduce::kUpdate ? "step()" : reduce_to == Reduce::kMean ? "compute_gradient()" : "a summed gradient"},
                             {"batch size", std::to_string(samples.size())},
                             {"batch (hash of its sample ids)", detail::hex16(detail::fnv1a(std::as_bytes(samples)))}, {"learning rate", lr}},
                            "at a step", [this] { watch_cluster(); });
  }
  ClusterPlan p = plan_cluster_step(*this, samples.size());
  publish_share(*cluster, p);

  if (grads_dirty) sched->broadcast([&](std::size_t d) { devices[d]->zero_grad(); });
  for (auto& r : replicas) r->reset_step();
  grads_dirty = true;
  std::size_t largest = 0;
  for (const ChunkSpan& c : p.t.spans) largest = std::max<std::size_t>(largest, c.size);
  for (auto& d : devices) d->reset_cancel(), d->begin_step(steps + 1, t_start), d->reserve(largest);
  comm->begin_step();
  StepPlan plan = local_end_game(*this, p);
  // What every rank's share still holds, in this rank's full chunks, for the end game (an estimate: a share whose owner
  // has not written this step's word yet counts whole; a failed read counts as more than any step holds, so the
  // device takes).
  const std::function<std::uint64_t()> pending = [this, &p]() noexcept -> std::uint64_t {
    try {
      std::uint64_t held = 0;
      for (int r = 0; r < cluster->size(); ++r) {
        detail::ShareWord s = detail::ShareWord::unpack(cluster->read(r, Cluster::kShare));
        if (s.tag != p.tag) s = r == cluster->rank() ? detail::ShareWord{p.tag, 0, 0} : p.word_of(static_cast<std::size_t>(r));
        held += p.before[s.back] - p.before[s.front];
      }
      const std::size_t full = p.t.own_size[0];
      return (held + full - 1) / full;
    } catch (...) {
      return std::uint64_t{1} << 32;
    }
  };
  ChunkPhase phase;
  phase.start = t_start;
  std::exception_ptr failure;
  std::string failure_text;
  try {
    phase.stats = sched->run_sourced([&](std::size_t w, std::span<ChunkId> out) { return take_chunks(*this, p, w, out); },
                                     [&](std::size_t w, ChunkId c) { run_one(w, c, samples, fn, p.t, plan); }, pending);
  } catch (const std::exception& e) {
    failure = std::current_exception(), failure_text = e.what();
  } catch (...) {
    failure = std::current_exception(), failure_text = "a non-standard exception";
  }
  if (failure) give_up_share(*cluster, p.tag), phase.stats.workers.resize(devices.size());
  phase.end = Clock::now();

  StepStats local;
  Tally tally = reduce_across(*this, p, phase, failure != nullptr, local);
  agree(*this, tally, failure, failure_text);
  if (!host_devices) {
    // Every rank succeeded: the job-wide sum on the devices (NCCL), queued after their chunks; step() and
    // compute_gradient() then update or read each replica from it, as in one process.
    std::vector<float*> bufs;
    for (auto& d : devices) bufs.push_back(d->grad().data());
    comm->allreduce_all(bufs, layout.size());
    return cluster_report(*this, p, tally, phase, local, StepStats{std::vector<WorkerCounters>(devices.size()), {}, 0}, samples.size());
  }
  const StepStats applied = update_from(*this, tally, samples.size(), reduce_to);
  return cluster_report(*this, p, tally, phase, local, applied, samples.size());
}

}  // namespace stealbatch
