// This rank's part of a job across ranks (RuntimeOptions::cluster): the cluster, each rank's device count and this
// rank's first device's global index, each rank's measured samples/s over the last steps and, of steps with given
// sample costs, its cost per second in the trainer's units (the same on every rank: gathered with the reduction), the
// steps run across the ranks (every rank counts the same, failed ones too: the share words' tag), this rank's progress
// word, for the watch, the last progress word seen of each rank and since when, and each rank's efficient chunk size.
// Empty (false) in one process. The share-word protocol and the watch that use it are cluster_step.cpp's.
#pragma once

#include <stealbatch/runtime/cluster.hpp>
#include <stealbatch/runtime/detail/call_fit.hpp>
#include <stealbatch/runtime/detail/heartbeat.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <numeric>
#include <vector>

namespace stealbatch {

struct ClusterState {
  std::shared_ptr<Cluster> job;
  std::vector<std::size_t> rank_devices;
  std::size_t first_device = 0;
  std::vector<std::vector<double>> rank_speed_history;
  std::vector<std::vector<double>> rank_cost_history;  // in the trainer's cost units per second
  std::uint64_t steps = 0;        // steps begun across the ranks
  std::uint64_t step_now = 0;     // the step this rank is in, or last was in (1, 2, ...): the progress word's high half
  std::uint64_t progress = 0;     // this rank's progress word's low half (bumped by the watch)
  std::int64_t clock_offset_ns = 0;  // add to this rank's times (since its epoch) to put them on rank 0's timeline
  std::vector<detail::StillWord> peers_seen;  // each rank's progress word, as the step's watch last read it
  std::vector<int> watched;                   // the ranks whose progress the step's watch reads (detail::watched_ranks)
  std::unique_ptr<detail::Heartbeat> heartbeat;  // this rank's pulse and the watch on the others'
  // Automatic chunk sizes: this rank's chunk times against their samples, and each rank's efficient chunk (the
  // smallest whose fixed part is at most kFixedShareAtMost of its time; 0 until known), the same on every rank
  // (gathered with the reduction).
  detail::CallFit chunk_fit;
  std::vector<double> rank_efficient;

  explicit operator bool() const noexcept { return job != nullptr; }
  Cluster* operator->() const noexcept { return job.get(); }
  Cluster& operator*() const noexcept { return *job; }
  std::size_t total_devices() const noexcept { return std::accumulate(rank_devices.begin(), rank_devices.end(), std::size_t{0}); }
};

}  // namespace stealbatch
