// A step's plan and chunk table: what is known of the devices, the shares and chunk sizes, and the end game's costs.
#include "step/planner.hpp"

#include <stealbatch/runtime/detail/speed_shares.hpp>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

namespace stealbatch {

namespace {

// Each device's call line a_d + b_d n (seconds, n samples) where every device's chunks have told its fixed part from its
// per-sample one (detail::ChunkSizer::line()), and that part matters: on some device it is at least kFixedMatters
// of the time of the device's whole share (in proportion to b) in one call. Empty otherwise: the measured speeds
// decide, as where costs are in proportion to samples they tell the same, and are measured over whole steps.
std::vector<detail::CallFit::Line> call_lines(const detail::ChunkSizer& sizer, std::size_t n, std::size_t batch) {
  constexpr double kFixedMatters = 0.01;
  std::vector<detail::CallFit::Line> lines(n);
  double inv = 0;
  for (std::size_t d = 0; d < n; ++d) {
    lines[d] = sizer.line(d);
    // Seconds a call and a sample, within what any device could measure (so that every share and size is finite).
    if (!(lines[d].per_call > 0 && lines[d].per_call <= 1e3) || !(lines[d].per_unit >= 1e-15 && lines[d].per_unit <= 1e3)) return {};
    inv += 1 / lines[d].per_unit;
  }
  const double whole = static_cast<double>(batch) / inv;  // each device's share time, fixed parts apart
  for (const detail::CallFit::Line& l : lines) {
    if (l.per_call >= kFixedMatters * (l.per_call + whole)) return lines;
  }
  return {};
}

}  // namespace

StepPlan StepPlanner::plan(std::size_t batch) {
  const std::size_t n = m_dev.devices.size();
  StepPlan p;
  p.speeds = m_speed.estimates();  // samples/s per device; empty until measured
  if (m_options.schedule.placement == PlacementPolicy::kPreviousStep && !p.speeds.empty()) {
    for (std::size_t d = 0; d < n; ++d) p.speeds[d] = m_speed.history[d].back();
  }
  p.known = !p.speeds.empty();
  for (double v : p.speeds) p.known = p.known && std::isfinite(v) && v > 0;
  p.rate = p.speeds;
  if (m_cluster) {
    // Across ranks the ranks' shares are placed by the ranks' speeds (cluster_step.cpp); within the rank the devices
    // claim chunks as they go, and the end game weighs them by speed only with two or more of them.
    p.known = p.known && n > 1;
    p.cutting = Cutting::kRankShares;
    m_cluster.plan(batch, p);  // with given costs, placed by cost (cluster_step.cpp)
    if (p.by_cost()) {
      p.rate = measured_cost_rates();
      p.known = !p.rate.empty() && n > 1;
      if (!p.known) p.rate.assign(n, 1.0);
    }
    return p;
  }
  const bool steal = m_options.schedule.policy == SchedulePolicy::kSteal;
  const bool adaptive = p.known && ((m_options.schedule.placement == PlacementPolicy::kThroughput && steal) || m_options.schedule.placement == PlacementPolicy::kPreviousStep);
  if (adaptive) p.placement = Placement::kBySpeed;
  // Speed-sized chunks, and a share whose end is cut finer: for thieves. A lone device has none, and keeps its chunks
  // whole (fewer launches, larger GEMMs).
  const bool by_speed = adaptive && n > 1 && steal && m_options.schedule.chunk_sizing == ChunkSizing::kBySpeed;
  p.cutting = m_options.schedule.chunk_size == 0 ? Cutting::kSized : by_speed ? Cutting::kBySpeed : Cutting::kFixed;
  p.finer_ends = by_speed;
  // Positions' costs and devices' speeds learnt apart (detail::CostProfile): where a chunk's time is known when its
  // call returns (host devices), with the policy that places by speed.
  p.learn_costs = m_dev.host && m_options.schedule.cost_by_position && steal && m_options.schedule.placement == PlacementPolicy::kThroughput &&
                  m_options.schedule.chunk_sizing == ChunkSizing::kBySpeed;
  if (by_speed && p.learn_costs && m_speed.cost_profile.active(batch, n)) {
    // Each device's speed in cost units per second: the profile's speeds. Read only before the chunk phase: the
    // profile learns (and may reallocate its costs) while the chunks run.
    p.placement = Placement::kByCost;
    p.rate.assign(m_speed.cost_profile.speeds().begin(), m_speed.cost_profile.speeds().end());
    p.position_cost = m_speed.cost_profile.costs();
  }
  if (m_costs.given()) plan_given_costs(batch, p);
  if (m_options.schedule.deterministic) p.cutting = Cutting::kCells, p.finer_ends = false;  // placed as planned, cut in cells
  // The cost model of launch-bound devices: placed by speed (placed by cost, a chunk's samples do not say its cost).
  if (p.cutting == Cutting::kSized && n > 1 && p.placement == Placement::kBySpeed) {
    p.lines = call_lines(m_speed.chunk_sizer, n, batch);
  }
  return p;
}

// The step's sample costs (one process): with stealing, or packed, the batch is placed and cut in cost, each
// position's cost the trainer's over the batch's mean. A static run that is not packed splits the samples equally, as
// DDP does (the costs still measure each device's cost per second).
void StepPlanner::plan_given_costs(std::size_t batch, StepPlan& p) {
  const std::size_t n = m_dev.devices.size();
  const bool steal = m_options.schedule.policy == SchedulePolicy::kSteal;
  if (!steal && !m_costs.packed()) return;
  p.placement = Placement::kByCost;
  p.position_cost = m_costs.norm;
  p.learn_costs = false;  // the costs are given, not learnt by position
  p.cost_chunk = cost_chunk(batch);
  const std::vector<double> measured = measured_cost_rates();
  const bool known = !measured.empty();
  const PlacementPolicy placement = m_options.schedule.placement;
  const bool by_measure = placement == PlacementPolicy::kThroughput || placement == PlacementPolicy::kPreviousStep;
  // The end game weighs devices by what was measured; shares follow it where the placement does, the weights where
  // given, and equal costs otherwise (a packed batch too: the packer is blind to speeds).
  p.known = known && (by_measure || m_costs.packed());
  p.rate = p.known ? measured : placement == PlacementPolicy::kGiven ? m_options.schedule.placement_weights : std::vector<double>(n, 1.0);
  if (m_costs.packed()) {
    p.cutting = Cutting::kPacked;
    p.finer_ends = false;
    return;
  }
  p.cutting = Cutting::kBySpeed;
  p.finer_ends = n > 1;
}

// Each device's measured cost per second in the plan's units (mean-cost samples of this batch per second): the median
// of its last steps', or with kPreviousStep the last one's. Empty until every device has one.
std::vector<double> StepPlanner::measured_cost_rates() const {
  std::vector<double> measured = m_speed.cost_estimates();
  if (m_options.schedule.placement == PlacementPolicy::kPreviousStep && !measured.empty()) {
    for (std::size_t d = 0; d < measured.size(); ++d) measured[d] = m_speed.cost_rate[d].back();
  }
  bool known = measured.size() == m_dev.devices.size();
  for (double& r : measured) known = known && std::isfinite(r) && r > 0, r /= m_costs.mean;
  return known ? measured : std::vector<double>{};
}

// A full chunk's cost in mean samples of the batch: chunk_size; or, with chunk_size = 0, the smallest chunk whose
// fixed call cost is at most a tenth of its time on every device (detail::CallFit), within [1, the batch over the
// devices]; 16 until a device's calls are known.
double StepPlanner::cost_chunk(std::size_t batch) const {
  constexpr double kUntilKnown = 16, kEfficiency = 0.9;
  if (m_options.schedule.chunk_size > 0 || m_options.schedule.deterministic) return static_cast<double>(cell_size(batch, m_options.schedule.chunk_size));
  double c = 0;
  for (const detail::CallFit& f : m_speed.call_fit) c = std::max(c, f.overhead_cost(kEfficiency));
  c = c > 0 ? c / m_costs.mean : kUntilKnown;
  return std::clamp(c, 1.0, std::max(1.0, static_cast<double>(batch) / static_cast<double>(m_dev.devices.size())));
}

namespace {

using Shares = std::vector<std::pair<std::uint32_t, std::uint32_t>>;

Shares to_shares(const std::vector<ChunkRange>& r) {
  Shares s(r.size());
  for (std::size_t d = 0; d < r.size(); ++d) s[d] = {static_cast<std::uint32_t>(r[d].begin), static_cast<std::uint32_t>(r[d].end)};
  return s;
}

// How a share is cut: into whole chunks of its size; finer at its end; or, a device's first step with automatic
// sizes, into the chunk sizer's probe (detail::ChunkSizer::probe_sizes).
enum class Cut : std::uint8_t { kWhole, kFiner, kProbe };

// Cuts each share (a device's, or across ranks a rank's) into chunks: whole ones of its size to the share's end, or (cut finer) sixths of what is
// left down to `floor` at the end, so the owner ends its share, and thieves (who take from the high end) start, on
// small chunks (detail::cut_share), or the sizer's probe. Fills the spans and each share's range of chunk ids.
void cut_shares(const Shares& share, const std::vector<double>& target, const std::vector<double>& floor, const std::vector<Cut>& cut,
                std::span<const double> position_cost, ChunkTable& t, std::vector<ChunkRange>& ranges, bool hard_floor = false) {
  std::vector<std::uint32_t> sizes;
  for (std::size_t d = 0; d < share.size(); ++d) {
    ranges[d].begin = static_cast<ChunkId>(t.spans.size());
    sizes.clear();
    if (cut[d] == Cut::kFiner) {
      detail::cut_share(share[d].first, share[d].second, target[d], floor[d], position_cost, sizes, hard_floor);
    } else if (cut[d] == Cut::kProbe) {
      detail::ChunkSizer::probe_sizes(share[d].second - share[d].first, sizes);
    } else {
      const auto whole = static_cast<std::uint32_t>(std::max(1.0, target[d]));
      for (std::uint32_t at = share[d].first; at < share[d].second; at += whole) sizes.push_back(std::min(whole, share[d].second - at));
      // A hard floor: a last piece under it joins the chunk before.
      if (hard_floor && sizes.size() > 1 && sizes.back() < floor[d]) sizes[sizes.size() - 2] += sizes.back(), sizes.pop_back();
    }
    std::uint32_t at = share[d].first;
    for (std::uint32_t size : sizes) t.spans.push_back({at, size}), at += size;
    ranges[d].end = static_cast<ChunkId>(t.spans.size());
  }
}

// Shares by the cost model t(n) = a_d + b_d n: the batch split so that every device, running its share in one call,
// ends at the same time T = a_d + b_d share_d. A device whose fixed cost alone is past T gets nothing. Returned as
// weights in samples (they sum to the batch).
std::vector<double> line_shares(std::span<const detail::CallFit::Line> lines, std::size_t batch) {
  const std::size_t n = lines.size();
  std::vector<bool> in(n, true);
  std::vector<double> w(n, 0.0);
  for (std::size_t round = 0; round < n; ++round) {
    double inv = 0, fixed = 0;
    for (std::size_t d = 0; d < n; ++d) {
      if (in[d]) inv += 1 / lines[d].per_unit, fixed += lines[d].per_call / lines[d].per_unit;
    }
    const double t_end = (static_cast<double>(batch) + fixed) / inv;
    bool dropped = false;
    for (std::size_t d = 0; d < n; ++d) {
      w[d] = in[d] ? (t_end - lines[d].per_call) / lines[d].per_unit : 0.0;
      if (in[d] && w[d] <= 0) in[d] = false, dropped = true;
    }
    if (!dropped) break;
  }
  for (double& x : w) x = std::max(0.0, x);
  return w;
}

}  // namespace

// Sized (chunk_size = 0): shares in samples (by speed or cost once measured, else equal or given), each cut into
// chunks of its device's size: a rung of its ladder while it explores, its chosen rung after that.
//
// Where every device's call line a_d + b_d n is known (its chunks timed one by one: host devices, GPUs by their
// events), the cost model decides instead of the measured speeds: shares that end together with one call each
// (line_shares()), and no chunk below the device's efficient size, where a_d is at most kFixedShareAtMost of its time. A
// share smaller than that runs in one call; a slower device gets fewer chunks, not smaller ones.
void StepPlanner::cut_sized(std::size_t batch, const StepPlan& p, ChunkTable& t) {
  const std::size_t n = m_dev.devices.size();
  const std::vector<detail::CallFit::Line>& lines = p.lines;
  const std::vector<double> rate = lines.empty() ? p.rate : line_shares(lines, batch);
  const std::vector<ChunkRange> plain = m_options.schedule.placement == PlacementPolicy::kGiven ? place_proportional(batch, m_options.schedule.placement_weights)
                                        : p.placement != Placement::kEqualOrGiven      ? place_proportional(batch, rate)
                                                                                       : place_equal(batch, n);
  Shares share = to_shares(plain);
  for (std::size_t d = 0; d < n; ++d) t.own_size[d] = m_speed.chunk_sizer.size(d, std::max<std::size_t>(1, plain[d].end - plain[d].begin));
  std::vector<std::size_t> efficient(n, 1);
  for (std::size_t d = 0; d < lines.size(); ++d) {
    const double e = std::ceil(lines[d].cost_at(1 - kFixedShareAtMost));
    efficient[d] = static_cast<std::size_t>(std::clamp(e, 1.0, static_cast<double>(batch)));
    // Exploring below it, the device would never run the rung it explores: it settles at the first rung above.
    if (t.own_size[d] < efficient[d] && m_speed.chunk_sizer.exploring(d) && !m_speed.chunk_sizer.probing(d)) {
      m_speed.chunk_sizer.settle_at_least(d, efficient[d]);
    }
    t.own_size[d] = std::max(t.own_size[d], efficient[d]);
  }
  if (p.finer_ends && lines.empty()) {  // with lines the shares stand as placed: no margin, the lines give the times
    // Plus a margin for slower devices whose speed is uncertain (see speed_share_weights()).
    const std::vector<double> weights = detail::speed_share_weights(p.rate, m_speed.history, t.own_size, batch);
    share = p.by_cost() ? detail::split_by_cost(p.position_cost, weights) : to_shares(place_proportional(batch, weights));
    // No device's chunk takes longer than the fastest device's: a device at under half the fastest one's speed
    // (compared at a rung both ran: speeds measured while the ladders are explored differ by the rungs'
    // efficiencies; within half, speeds that differ by noise keep their sizes) runs the fastest one's size scaled
    // to its speed. So the step's tail stays about one fast chunk long, and a slower device never holds a core
    // for long at a time. A capped device stops exploring: it will not run larger chunks.
    const std::size_t f = static_cast<std::size_t>(std::max_element(p.rate.begin(), p.rate.end()) - p.rate.begin());
    for (std::size_t d = 0; d < n; ++d) {
      const double relative = m_speed.chunk_sizer.relative_speed(d, f);
      const auto scaled = static_cast<std::size_t>(std::lround(relative * static_cast<double>(t.own_size[f])));
      if (relative <= 0 || relative >= 0.5 || scaled >= t.own_size[d]) continue;
      m_speed.chunk_sizer.stop_exploring(d);
      t.own_size[d] = std::max<std::size_t>(1, scaled);
    }
  }
  std::vector<double> target(n), floor(n);
  std::vector<Cut> cut(n, Cut::kWhole);
  std::vector<std::uint32_t> probe;
  for (std::size_t d = 0; d < n; ++d) {
    t.share_len[d] = share[d].second - share[d].first;
    t.own_size[d] = std::min<std::size_t>(t.own_size[d], std::max<std::uint32_t>(1, t.share_len[d]));
    if (m_speed.chunk_sizer.probing(d)) {  // its first step: chunks of several sizes, for its call-time line
      detail::ChunkSizer::probe_sizes(t.share_len[d], probe);
      if (!probe.empty()) cut[d] = Cut::kProbe, t.own_size[d] = *std::max_element(probe.begin(), probe.end());
    }
    t.own_cost[d] = target[d] = static_cast<double>(t.own_size[d]);
    floor[d] = std::max({1.0, target[d] / 4, static_cast<double>(efficient[d])});
    if (p.finer_ends && !m_speed.chunk_sizer.exploring(d)) cut[d] = Cut::kFiner;  // an exploring device's chunks are all of its rung
  }
  cut_shares(share, target, floor, cut, p.position_cost, t, t.ranges, /*hard_floor: no chunk under the efficient size*/ !lines.empty());
  t.full_chunk = static_cast<double>(*std::max_element(t.own_size.begin(), t.own_size.end()));
}

// Placed by speed with fixed sizes: samples in proportion to speed, and chunks sized to it.
void StepPlanner::cut_by_speed(std::size_t batch, const StepPlan& p, ChunkTable& t) {
  const std::size_t n = m_dev.devices.size();
  const double cs = p.cost_chunk > 0 ? p.cost_chunk : static_cast<double>(m_options.schedule.chunk_size);  // in cost units with given costs
  // Samples in proportion to speed, and chunks sized to it: a device at a sixth of the fastest one's speed gets a
  // sixth of the samples in chunks a sixth as large, so its chunks take about as long as anyone's and the step's
  // tail stays about one fast chunk long. Placed by cost, the same in cost units: a device's share is its part of
  // the batch's cost, and a chunk where samples cost twice the mean holds half the samples.
  const double fastest = *std::max_element(p.rate.begin(), p.rate.end());
  std::vector<double> floor(n);
  for (std::size_t d = 0; d < n; ++d) {
    t.own_size[d] = std::max<std::size_t>(1, static_cast<std::size_t>(std::lround(cs * p.rate[d] / fastest)));
    t.own_cost[d] = p.by_cost() ? cs * p.rate[d] / fastest : static_cast<double>(t.own_size[d]);
    floor[d] = p.by_cost() ? t.own_cost[d] / 4 : static_cast<double>(std::max<std::size_t>(1, t.own_size[d] / 4));  // a quarter chunk
  }
  const std::vector<double> weights = detail::speed_share_weights(p.rate, m_speed.history, t.own_size, batch);
  const Shares share = p.by_cost() ? detail::split_by_cost(p.position_cost, weights) : to_shares(place_proportional(batch, weights));
  cut_shares(share, t.own_cost, floor, std::vector<Cut>(n, Cut::kFiner), p.position_cost, t, t.ranges);
}

// Packed (PlacementPolicy::kPacked): each device's packed samples lie together (GivenCosts::take()); each share is cut
// into whole chunks of the cost budget.
void StepPlanner::cut_packed(const StepPlan& p, ChunkTable& t) const {
  const std::size_t n = m_dev.devices.size();
  Shares share(n);
  std::uint32_t at = 0;
  for (std::size_t d = 0; d < n; ++d) share[d] = {at, at + m_costs.packed_len[d]}, at += m_costs.packed_len[d];
  const std::vector<double> target(n, p.cost_chunk);
  for (std::size_t d = 0; d < n; ++d) t.own_size[d] = std::max<std::size_t>(1, static_cast<std::size_t>(std::lround(p.cost_chunk))), t.own_cost[d] = p.cost_chunk;
  cut_shares(share, target, /*floor: whole chunks*/ target, std::vector<Cut>(n, Cut::kFiner), p.position_cost, t, t.ranges);
}

// Fixed sizes, placed by count: the batch cut into chunks of chunk_size (the last may hold fewer), placed equally,
// by weight or by speed.
void StepPlanner::cut_fixed(std::size_t batch, const StepPlan& p, ChunkTable& t) const {
  const std::size_t n = m_dev.devices.size(), cs = m_options.schedule.chunk_size;
  for (std::size_t at = 0; at < batch; at += cs) t.spans.push_back({static_cast<std::uint32_t>(at), static_cast<std::uint32_t>(std::min(cs, batch - at))});
  if (m_options.schedule.placement == PlacementPolicy::kGiven) {
    t.ranges = place_proportional(t.size(), m_options.schedule.placement_weights);
  } else {
    t.ranges = p.placement != Placement::kEqualOrGiven ? place_proportional(t.size(), p.speeds) : place_equal(t.size(), n);
  }
}

// Across ranks: the rank's shares in proportion to the ranks' speeds (in samples, or with given costs in cost), each
// cut into chunks of its rank's size with its end cut finer (as a device's share in one process), the same on every
// rank; this rank's devices each run its size. Packed (kPacked): a rank's share is its devices' packs (the batch
// packed over the job's devices in rank order), cut into whole chunks of the budget.
void StepPlanner::cut_rank_shares(std::size_t batch, StepPlan& p, ChunkTable& t) const {
  RankShares& rs = p.ranks;
  const std::size_t ranks = rs.speed.size();
  if (m_options.schedule.deterministic) {  // the cells, each rank's share whole ones (every rank's chunk is a cell)
    cut_cell_grid(batch, t);
    rs.share = split_cells(t, p, rs.speed);
  } else {
    Shares share(ranks);
    if (m_costs.packed()) {
      std::uint32_t at = 0;
      for (std::size_t r = 0, g = 0; r < ranks; ++r) {
        std::uint32_t len = 0;
        for (std::size_t d = 0; d < m_cluster.rank_devices[r]; ++d) len += m_costs.packed_len[g++];
        share[r] = {at, at + len}, at += len;
      }
    } else {
      share = p.by_cost() ? detail::split_by_cost(p.position_cost, rs.speed) : to_shares(place_proportional(batch, rs.speed));
    }
    // Automatic sizes: no chunk below a rank's efficient size (rs.least, which ClusterState::plan() sized the chunks to at
    // least), as in one process. A static run's shares in samples are not stolen from: cut whole (in cost, whole
    // chunks of the budget are cut_share()'s, with the budget as the floor).
    std::vector<double> floor(ranks);
    bool hard_floor = false;
    for (std::size_t r = 0; r < ranks; ++r) {
      floor[r] = m_costs.packed() ? rs.chunk[r] : p.by_cost() ? rs.chunk[r] / 4 : std::max(1.0, std::floor(rs.chunk[r] / 4));
      if (rs.least[r] > 0) floor[r] = std::max(floor[r], rs.least[r]), hard_floor = true;
    }
    const bool whole = m_options.schedule.policy != SchedulePolicy::kSteal && !m_costs.packed() && !p.by_cost();
    const Cut cut = whole ? Cut::kWhole : Cut::kFiner;
    rs.share.assign(ranks, {});
    cut_shares(share, rs.chunk, floor, std::vector<Cut>(ranks, cut), p.position_cost, t, rs.share, hard_floor);
  }
  t.ranges.assign(m_dev.devices.size(), {});  // the devices claim chunks from the share words as they go
  const auto whole = std::max<std::size_t>(1, static_cast<std::size_t>(std::lround(rs.chunk[rs.me])));
  t.own_size.assign(m_dev.devices.size(), whole);
  t.own_cost.assign(m_dev.devices.size(), rs.chunk[rs.me]);
  t.full_chunk = rs.chunk[rs.me];
  if (t.size() >= detail::ShareWord::kMaxChunk) {
    throw ConfigError("batch = " + std::to_string(batch) + " makes " + std::to_string(t.size()) + " chunks across ranks; at most " +
                      std::to_string(detail::ShareWord::kMaxChunk - 1) + " (raise chunk_size)");
  }
}

// A cell: chunk_size samples; with 0, a sixteenth of the batch (cells enough to balance a step across devices, since
// no cell is split), at most 64 samples (the per-cell conversion then costs little beside the cell's compute). A
// function of the batch alone: every device count and every rank cuts the same grid.
std::size_t cell_size(std::size_t batch, std::size_t chunk_size) noexcept {
  constexpr std::size_t kCellsPerBatch = 16, kLargestCell = 64;
  return chunk_size > 0 ? chunk_size : std::clamp<std::size_t>(batch / kCellsPerBatch, 1, kLargestCell);
}

// Deterministic mode: the batch in cells that no device, rank or timing decides: cell_size() samples each, or with
// given sample costs cells of that many mean-cost samples, in the batch's order (the last may hold less).
void StepPlanner::cut_cell_grid(std::size_t batch, ChunkTable& t) const {
  const auto cell = static_cast<double>(cell_size(batch, m_options.schedule.chunk_size));
  std::vector<std::uint32_t> sizes;
  detail::cut_share(0, static_cast<std::uint32_t>(batch), cell, cell, m_costs.given() ? std::span<const double>(m_costs.norm) : std::span<const double>{},
                    sizes);
  std::uint32_t at = 0;
  for (std::uint32_t size : sizes) t.spans.push_back({at, size}), at += size;
}

// Whole cells to each owner (a device, or across ranks a rank), contiguous, in proportion to the weights by the
// cells' cost in the plan's units.
std::vector<ChunkRange> StepPlanner::split_cells(const ChunkTable& t, const StepPlan& p, std::span<const double> weights) const {
  std::vector<double> cost(t.size());
  for (std::size_t c = 0; c < t.size(); ++c) {
    cost[c] = static_cast<double>(t.spans[c].size);
    if (p.by_cost()) cost[c] = std::accumulate(p.position_cost.begin() + t.spans[c].begin, p.position_cost.begin() + t.spans[c].begin + t.spans[c].size, 0.0);
  }
  const auto split = detail::split_by_cost(cost, weights);
  std::vector<ChunkRange> out(split.size());
  for (std::size_t d = 0; d < split.size(); ++d) out[d] = {split[d].first, split[d].second};
  return out;
}

// Deterministic mode in one process: the cells placed on the devices as the plan says (equally, by the given weights,
// or by measured speed or cost rate), each device's share whole cells.
void StepPlanner::cut_cells(std::size_t batch, const StepPlan& p, ChunkTable& t) const {
  const std::size_t n = m_dev.devices.size();
  cut_cell_grid(batch, t);
  const std::vector<double> weights = m_options.schedule.placement == PlacementPolicy::kGiven ? m_options.schedule.placement_weights
                                      : p.placement != Placement::kEqualOrGiven           ? p.rate
                                                                                          : std::vector<double>(n, 1.0);
  t.ranges = split_cells(t, p, weights);
  const std::size_t cell = cell_size(batch, m_options.schedule.chunk_size);
  t.own_size.assign(n, cell);
  t.own_cost.assign(n, static_cast<double>(cell));
  t.full_chunk = static_cast<double>(cell);
}

ChunkTable StepPlanner::cut_and_place(std::size_t batch, StepPlan& p) {
  const std::size_t n = m_dev.devices.size();
  ChunkTable t;
  t.ranges.resize(n);
  t.share_len.assign(n, 0);
  t.full_chunk = static_cast<double>(m_options.schedule.chunk_size);
  t.own_size.assign(n, m_options.schedule.chunk_size);
  t.own_cost.assign(n, static_cast<double>(m_options.schedule.chunk_size));
  switch (p.cutting) {
    case Cutting::kSized: cut_sized(batch, p, t); break;
    case Cutting::kBySpeed: cut_by_speed(batch, p, t); break;
    case Cutting::kFixed: cut_fixed(batch, p, t); break;
    case Cutting::kRankShares: cut_rank_shares(batch, p, t); break;
    case Cutting::kPacked: cut_packed(p, t); break;
    case Cutting::kCells: cut_cells(batch, p, t); break;
  }
  if (p.cost_chunk > 0) t.full_chunk = p.cost_chunk;
  const std::size_t chunks = t.size();
  // Each chunk's cost in the units of the plan's rate: its samples, or the sum of its positions' costs.
  t.chunk_cost.resize(chunks);
  for (std::size_t c = 0; c < chunks; ++c) {
    double cost = static_cast<double>(t.spans[c].size);
    if (p.by_cost()) {
      cost = 0;
      for (std::uint32_t x = t.spans[c].begin; x < t.spans[c].begin + t.spans[c].size; ++x) cost += p.position_cost[x];
    }
    t.chunk_cost[c] = cost;
  }
  if (p.ranks.active()) {  // what a share word holds, from two reads: the cost of chunks [0, c)
    p.ranks.before.assign(chunks + 1, 0.0);
    for (std::size_t c = 0; c < chunks; ++c) p.ranks.before[c + 1] = p.ranks.before[c] + t.chunk_cost[c];
  }
  // Where each chunk was placed (across ranks, the device that claims it, when it does).
  t.home.assign(chunks, 0);
  for (std::size_t d = 0; d < n; ++d) {
    for (ChunkId c = t.ranges[d].begin; c < t.ranges[d].end; ++c) t.home[c] = static_cast<std::uint32_t>(d);
  }
  t.ran_on.assign(chunks, 0);
  t.runs.assign(chunks, 0);
  t.took_s.assign(p.learn_costs ? chunks : 0, 0.0);
  // Each chunk's compute time: for the chunk sizer (sized), and across ranks for the rank's efficient size.
  t.compute_s.assign(p.sized() || (m_cluster && (m_dev.host || m_dev.times_calls)) ? chunks : 0, 0.0);
  // Given costs: each chunk's in the trainer's units, and each call's time against it where calls are timed (host
  // devices as they return; devices that time them on their own clock after the chunk phase, take_call_times()).
  t.given_cost.assign(m_costs.given() ? chunks : 0, 0.0);
  for (std::size_t c = 0; c < t.given_cost.size(); ++c) t.given_cost[c] = m_costs.trainer_cost(t.spans[c].begin, t.spans[c].size);
  t.calls.assign(m_costs.given() && (m_dev.host || m_dev.times_calls) ? n : 0, {});
  for (auto& calls : t.calls) calls.reserve(chunks);  // a worker's record_call() appends without allocating
  return t;
}

std::vector<ChunkId> ChunkTable::drop_device(std::size_t dead) {
  const auto at = static_cast<std::ptrdiff_t>(dead);
  own_size.erase(own_size.begin() + at), own_cost.erase(own_cost.begin() + at), share_len.erase(share_len.begin() + at);
  if (!calls.empty()) calls.erase(calls.begin() + at);
  std::vector<ChunkId> redo;
  for (std::size_t c = 0; c < size(); ++c) {
    if (runs[c] != 0 && ran_on[c] == dead) runs[c] = 0;  // its gradient buffer leaves the reduction with it
    if (runs[c] == 0) {
      redo.push_back(static_cast<ChunkId>(c));
      continue;
    }
    if (ran_on[c] > dead) --ran_on[c];
    if (home[c] == dead) {
      home[c] = kHomeLost;  // placed on the lost device and run elsewhere: it moved
    } else if (home[c] != kHomeLost && home[c] > dead) {
      --home[c];
    }
  }
  return redo;
}

void StepPlanner::set_endgame(ChunkTable& t, StepPlan& p, Scheduler& sched) const {
  // Across ranks only with stealing: a rank's devices that declined its own share's chunks would leave them to no one.
  if (!p.known || m_options.schedule.endgame != EndGame::kOn || (m_cluster && m_options.schedule.policy != SchedulePolicy::kSteal)) {
    sched.set_own_always(false);
    sched.set_chunk_costs({});
    sched.set_chunk_weights({});
    sched.set_outside_rate(0);
    return;
  }
  const std::size_t n = m_dev.devices.size();
  std::vector<double> own(n), stolen(n);
  for (std::size_t d = 0; d < n; ++d) {
    // A device's samples/s mixes its speed with the cost of the samples placed on it. When the chunks taken from its
    // share ran as slowly on other devices as on it (the batch costs more where its share lies, as when data is
    // sorted by length), it is not a slow device: a chunk it steals from elsewhere costs it what it costs them. Its
    // measured speed times that slowness (the median of the last stolen chunks) is then its speed for the end game,
    // so it keeps taking work instead of idling as a "slow" device. Placed by cost, the speeds are already apart
    // from the costs.
    const double slowness = p.by_cost() ? 1.0 : detail::data_slowness(m_speed.stolen_slowness[d]);
    if (!p.lines.empty()) {
      // The cost model (placed by speed): a call's fixed part, then its samples. No data slowness: it is measured against costs in
      // proportion to samples, and a fixed cost a call makes small stolen chunks look like slow data.
      own[d] = p.lines[d].seconds(t.own_cost[d]);
      stolen[d] = std::max(own[d], p.lines[d].seconds(t.full_chunk));
      continue;
    }
    own[d] = t.own_cost[d] / p.rate[d];
    stolen[d] = std::max(own[d], t.full_chunk / (p.rate[d] * slowness));  // a stolen chunk is at most a full one
  }
  sched.set_chunk_costs(std::move(own), std::move(stolen));
  sched.set_own_always(!p.lines.empty());  // shares that end together by the cost model
  // What is left is weighed in full chunks, the unit of the stolen costs: a step ends on the small pieces of the
  // shares' ends, and a slow device that counted each as a full chunk of the others' time would start one of its
  // own chunks with little left, and end the step late. (A step from the ranks' share words counts what they hold
  // in full chunks itself, held_by_shares(): its ids are not placed before it, and it has no weights.)
  std::vector<double> weight(m_cluster ? 0 : t.size());
  const double full = std::max(t.full_chunk, p.by_cost() ? 1e-9 : 1.0);
  if (p.lines.empty()) {
    for (std::size_t c = 0; c < weight.size(); ++c) weight[c] = std::max(t.chunk_cost[c], 1e-9) / full;
  } else {
    // The cost model: a chunk weighs its time on the fastest device over a full chunk's there, its call's fixed part
    // included, so that the small pieces at the shares' ends count the calls they cost.
    const auto fast = std::min_element(p.lines.begin(), p.lines.end(), [](const auto& x, const auto& y) { return x.per_unit < y.per_unit; });
    for (std::size_t c = 0; c < weight.size(); ++c) weight[c] = fast->seconds(t.chunk_cost[c]) / fast->seconds(full);
  }
  sched.set_chunk_weights(std::move(weight));
  // What the shares still hold across ranks, the other ranks' devices take too, at their ranks' measured speeds: so a
  // device that slowed down leaves the job's last chunks to the job, not to its rank's other device alone.
  sched.set_outside_rate(p.outside_rate);
  // A device whose own chunks take far longer than its measured speed says has slowed down in this step (a throttled
  // GPU, a device that lost speed mid-step): the end game then weighs its chunks at what they take now. Only where a
  // chunk's time is known when its call returns: host devices and simulated ones (their timeline); across ranks, any.
  p.watch_speed = m_dev.host || m_cluster;
  t.stolen_ratio.assign(p.watch_speed ? t.size() : 0, 0.0f);
}

}  // namespace stealbatch
