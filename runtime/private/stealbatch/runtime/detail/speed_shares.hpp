// How many samples each device gets when the runtime places a step by measured speed (speed-sized chunks).
#pragma once

#include <stealbatch/stats.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <numeric>
#include <span>
#include <vector>

namespace stealbatch::detail {

// The weights (in samples) for place_proportional(): each device's share in proportion to its speed, plus a
// margin for a device whose speed is uncertain. A device that finishes its own chunks early idles at the end of
// the step if it is slower than the others: their chunks are too long for it (the end game declines them). So a
// slower device whose measured speed varies from step to step (the spread of its window: standard deviation over
// mean, from three measurements on) gets a margin of up to five own chunks on top of its proportional share, in
// proportion to that spread (full at 10%) and to how much slower it is than the fastest; the faster devices steal
// back what it does not get to. (place_proportional() scales all weights to the batch, so a device ends up with
// the margin less its own share of it.) Devices with steady speeds get none (simulated devices, unless a speed
// schedule varies them), and the fastest never does. Five chunks: of 3, 5 and 8, the one that kept the slowed CPU
// devices of the main job busiest, the epoch no slower with any.
//
// speeds: samples/s per device (> 0); history: each device's recent measurements; own_chunk: each device's chunk
// size in samples; samples: the step's batch.
inline std::vector<double> speed_share_weights(std::span<const double> speeds, std::span<const std::vector<double>> history,
                                               std::span<const std::size_t> own_chunk, std::size_t samples) {
  constexpr double kMaxChunks = 5.0, kFullAtSpread = 0.1;
  const double fastest = *std::max_element(speeds.begin(), speeds.end());
  const double total = std::accumulate(speeds.begin(), speeds.end(), 0.0);
  std::vector<double> weights(speeds.size());
  for (std::size_t d = 0; d < speeds.size(); ++d) {
    const std::vector<double>& h = history[d];
    double spread = 0;
    if (h.size() >= 3) {
      double mean = 0, var = 0;
      for (double x : h) mean += x;
      mean /= static_cast<double>(h.size());
      for (double x : h) var += (x - mean) * (x - mean);
      if (mean > 0) spread = std::sqrt(var / static_cast<double>(h.size())) / mean;
    }
    const double margin = kMaxChunks * std::min(1.0, spread / kFullAtSpread) * (1.0 - speeds[d] / fastest) * static_cast<double>(own_chunk[d]);
    weights[d] = speeds[d] / total * static_cast<double>(samples) + margin;
  }
  return weights;
}

// How much slower than their own speed predicts the thieves ran the chunks they took from one device's share: the
// median of those ratios (a chunk's time x the thief's samples/s / its samples), when there are at least three
// and the median is at least 1.5; else 1. Above 1, the device's share holds costlier samples than the others'
// (the batch's cost varies with position, as when data is sorted by length), and its measured samples/s
// understates its speed by that much. (Where stolen chunks run at about the thief's speed, the median stays near 1
// and below the floor: nothing changes.)
inline double data_slowness(std::span<const double> stolen_ratios) {
  constexpr double kFloor = 1.5;
  if (stolen_ratios.size() < 3) return 1.0;
  const double m = median(std::vector<double>(stolen_ratios.begin(), stolen_ratios.end()));
  return std::isfinite(m) && m >= kFloor ? m : 1.0;
}

// Pools speeds that differ by no more than their noise. Each device's speed is the median of its window; when
// the devices' medians differ about as much as one device's measurements vary from step to step (samples of
// random cost: every device measures a little fast or slow by chance), the differences are noise, and placing by
// them only makes the step uneven. An empirical Bayes estimate on log speeds: the spread between the devices
// beyond what their own noise explains (tau^2), and each device's median pulled towards the mean of all by
// se^2 / (se^2 + tau^2), se^2 its window's variance over its size. Devices of really different speeds (tau much
// larger than se) keep theirs; windows under three values are not pooled.
inline std::vector<double> pooled_speeds(std::span<const double> medians, std::span<const std::vector<double>> history) {
  const std::size_t n = medians.size();
  std::vector<double> out(medians.begin(), medians.end());
  if (n < 2 || history.size() != n) return out;
  std::vector<double> loc(n), se2(n);
  for (std::size_t d = 0; d < n; ++d) {
    const std::vector<double>& h = history[d];
    if (h.size() < 3 || !(medians[d] > 0)) return out;
    double mean = 0, var = 0;
    for (double x : h) {
      if (!(x > 0)) return out;
      mean += std::log(x);
    }
    mean /= static_cast<double>(h.size());
    for (double x : h) var += (std::log(x) - mean) * (std::log(x) - mean);
    var /= static_cast<double>(h.size() - 1);
    loc[d] = std::log(medians[d]);
    se2[d] = var / static_cast<double>(h.size());
  }
  const double grand = std::accumulate(loc.begin(), loc.end(), 0.0) / static_cast<double>(n);
  double between = 0, noise = 0;
  for (std::size_t d = 0; d < n; ++d) between += (loc[d] - grand) * (loc[d] - grand), noise += se2[d];
  between /= static_cast<double>(n - 1), noise /= static_cast<double>(n);
  const double tau2 = std::max(0.0, between - noise);
  for (std::size_t d = 0; d < n; ++d) {
    const double keep = tau2 + se2[d] > 0 ? tau2 / (tau2 + se2[d]) : 1.0;
    out[d] = std::exp(grand + keep * (loc[d] - grand));
  }
  return out;
}

}  // namespace stealbatch::detail
