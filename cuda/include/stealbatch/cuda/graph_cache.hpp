// Which chunk calls a GPU device replays from a CUDA graph (RuntimeOptions::gpu.graphs): the policy alone, with no
// CUDA in it, so that it is tested where there is no GPU. CudaDevice owns one and does what it says.
#pragma once

#include <stealbatch/runtime/device.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <iterator>
#include <stdexcept>
#include <unordered_map>
#include <utility>

namespace stealbatch::cuda {

// A graph replays the kernels a chunk function enqueued when it was captured, with the same arguments: the same
// sample count (the kernels' sizes), the same staging slot (the input's address), the same replica and workspace
// (their addresses). So graphs are kept per (sample count, slot), and every address change makes them stale:
//   - a count's first call runs eagerly: it warms up, and grows the workspace to what that count needs (a growth
//     clears every graph, this count's entry too, so such a count runs eagerly twice);
//   - its second call is captured (and then launched);
//   - every later call replays the graph;
//   - a count whose capture failed runs eagerly from then on;
//   - clear() when the replica or the workspace moves, clear_slot() when a slot's staging moves;
//   - past `capacity` graphs, the least recently used goes; past kEntriesPerGraph x capacity counts seen, those
//     without a graph are forgotten (a failed count is then tried again).
// Handle is the executable graph (cudaGraphExec_t); `destroy` releases one (a graph in flight is freed once done).
template <class Handle>
class GraphCache {
 public:
  enum class Action { kEager, kCapture, kReplay };
  struct Stats {
    std::uint64_t eager = 0, captured = 0, replayed = 0, failed = 0;
  };

  GraphCache(std::size_t capacity, std::function<void(Handle)> destroy) : m_capacity(capacity), m_destroy(std::move(destroy)) {
    if (m_capacity == 0) throw std::invalid_argument("GraphCache: capacity 0 would destroy each graph as it is kept");
  }
  GraphCache(const GraphCache&) = delete;
  GraphCache& operator=(const GraphCache&) = delete;
  ~GraphCache() { clear(); }

  // What to do with a call of `samples` samples staged in `slot`; with kReplay, `*graph` is the one to launch.
  Action plan(std::size_t samples, std::size_t slot, Handle* graph) {
    // Counts seen once and never again (a varying tail) would pile up: past a bound, those without a graph start over.
    if (m_entries.size() > kEntriesPerGraph * m_capacity) forget_unkept();
    Entry& e = m_entries[key(samples, slot)];
    e.last_use = ++m_clock;
    if (e.graph) {
      ++m_stats.replayed;
      *graph = e.graph;
      return Action::kReplay;
    }
    if (e.failed || e.calls++ == 0) {
      ++m_stats.eager;
      return Action::kEager;
    }
    return Action::kCapture;
  }
  // The capture plan() asked for succeeded: `graph` is kept (and launched by the caller now).
  void captured(std::size_t samples, std::size_t slot, Handle graph) {
    Entry& e = m_entries[key(samples, slot)];
    if (e.graph) m_destroy(e.graph);
    else ++m_kept;
    e.graph = graph;
    ++m_stats.captured;
    evict();
  }
  // The capture plan() asked for failed: this count and slot run eagerly until clear().
  void failed(std::size_t samples, std::size_t slot) {
    m_entries[key(samples, slot)].failed = true;
    ++m_stats.failed;
  }
  void clear() {
    for (auto& [k, e] : m_entries) {
      if (e.graph) m_destroy(e.graph);
    }
    m_entries.clear();
    m_kept = 0;
  }
  void clear_slot(std::size_t slot) {
    for (auto it = m_entries.begin(); it != m_entries.end();) {
      if (it->first % kSlots != slot) {
        ++it;
        continue;
      }
      if (it->second.graph) m_destroy(it->second.graph), --m_kept;
      it = m_entries.erase(it);
    }
  }
  std::size_t graphs() const noexcept { return m_kept; }
  const Stats& stats() const noexcept { return m_stats; }

 private:
  static constexpr std::uint64_t kSlots = 64;
  static constexpr std::size_t kEntriesPerGraph = 8;
  static_assert(kSlots > kMaxInFlight, "a key holds the slot below kSlots");
  struct Entry {
    Handle graph{};
    std::uint64_t calls = 0, last_use = 0;
    bool failed = false;
  };
  static std::uint64_t key(std::size_t samples, std::size_t slot) noexcept { return static_cast<std::uint64_t>(samples) * kSlots + slot; }
  void forget_unkept() {
    for (auto it = m_entries.begin(); it != m_entries.end();) it = it->second.graph ? std::next(it) : m_entries.erase(it);
  }
  void evict() {
    while (graphs() > m_capacity) {
      auto oldest = m_entries.end();
      for (auto it = m_entries.begin(); it != m_entries.end(); ++it) {
        if (it->second.graph && (oldest == m_entries.end() || it->second.last_use < oldest->second.last_use)) oldest = it;
      }
      m_destroy(oldest->second.graph);
      --m_kept;
      m_entries.erase(oldest);  // its count starts over: eager, then captured again
    }
  }

  std::size_t m_capacity;
  std::function<void(Handle)> m_destroy;
  std::unordered_map<std::uint64_t, Entry> m_entries;
  std::uint64_t m_clock = 0;
  std::size_t m_kept = 0;  // entries that hold a graph
  Stats m_stats;
};

}  // namespace stealbatch::cuda
