// The per-worker lock-free work-stealing deque of chunk ids: the owner and the thieves are told apart by type.
#pragma once

#include <stealbatch/scheduler/detail/atomics.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

namespace stealbatch {

// A chunk: a contiguous run of one step's samples, named by its index in the step.
using ChunkId = std::uint32_t;

// kRetry: the thief lost a race. The deque may still hold work, so "the step is over" must not be decided on it.
enum class StealStatus { kEmpty, kTaken, kRetry };

struct [[nodiscard]] Stolen {
  StealStatus status;
  ChunkId chunk;  // meaningful only when status == kTaken
};

// The result of a batch steal: `chunk` is for the thief to run now, and `moved` more went into its own deque.
struct [[nodiscard]] StolenBatch {
  StealStatus status;
  ChunkId chunk;
  std::size_t moved;
};

// The most chunks one steal_batch_and_pop moves; the thief's staging array has this size.
inline constexpr std::size_t kMaxStealBatch = 64;

namespace detail {

// A power-of-two ring of atomic slots. Slots are atomic so that a thief may read one while the owner writes
// another; every slot access is relaxed because bottom and top carry the ordering.
class RingBuffer {
 public:
  explicit RingBuffer(std::int64_t capacity)
      : m_mask(capacity - 1), m_slots(std::make_unique<std::atomic<ChunkId>[]>(static_cast<std::size_t>(capacity))) {}

  std::int64_t capacity() const noexcept { return m_mask + 1; }
  ChunkId load(std::int64_t i) const noexcept { return m_slots[static_cast<std::size_t>(i & m_mask)].load(std::memory_order_relaxed); }
  void store(std::int64_t i, ChunkId c) noexcept { m_slots[static_cast<std::size_t>(i & m_mask)].store(c, std::memory_order_relaxed); }

 private:
  std::int64_t m_mask;
  std::unique_ptr<std::atomic<ChunkId>[]> m_slots;
};

// The state shared by the owner and every Stealer. Indices are signed 64-bit and only grow, so a CAS on top can
// never succeed on a recycled value (no ABA) and `bottom - 1` cannot wrap.
struct DequeState {
  explicit DequeState(std::int64_t capacity) : owned(std::make_unique<RingBuffer>(capacity)) { buffer.store(owned.get(), std::memory_order_relaxed); }

  alignas(kCacheLine) std::atomic<std::int64_t> top{0};     // CAS'd by thieves and by the owner's last-item pop: off the owner's line
  alignas(kCacheLine) std::atomic<std::int64_t> bottom{0};  // written by the owner only, read by thieves
  alignas(kCacheLine) std::atomic<RingBuffer*> buffer{nullptr};  // swapped by the owner on growth; read-mostly, so on a line of its own
  // Owner-only from here on: the live buffer and the buffers that growth retired. A retired buffer stays
  // allocated while a thief may still read it: until the owner calls reclaim() at a quiescent point, or until
  // the last Stealer and the owner are gone. Growth doubles, so the retired buffers together are smaller than
  // the live one.
  alignas(kCacheLine) std::unique_ptr<RingBuffer> owned;
  std::vector<std::unique_ptr<RingBuffer>> retired;
};

}  // namespace detail

// The thieves' handle. Copyable and cheap; every copy keeps the deque's shared state alive.
//
//   Stealer s = deque.stealer();
//   Stolen one = s.steal();                                   // from another thread
//   StolenBatch b = s.steal_batch_and_pop(my_deque, 8);       // half the victim, at most 8: one to run, the rest into my_deque
class Stealer {
 public:
  // Takes the oldest chunk.
  Stolen steal() const noexcept {
    detail::DequeState& d = *m_state;
    std::int64_t t = detail::load_before_barrier(d.top);
    detail::full_barrier_between_loads();
    // Acquire: pairs with the owner's release stores of bottom, so the slots below b are visible.
    const std::int64_t b = detail::load_after_barrier(d.bottom, std::memory_order_acquire);
    if (t >= b) return {StealStatus::kEmpty, 0};
    // Acquire: pairs with the release store in grow(), so a new buffer is seen fully copied. The buffer is
    // never shrunk and a retired one is never freed under a thief, so unlike crossbeam (which shrinks) no
    // re-check of the buffer pointer is needed: any buffer that holds index t holds the same chunk there.
    const detail::RingBuffer* buf = d.buffer.load(std::memory_order_acquire);
    const ChunkId c = buf->load(t);
    // Seq_cst, as in Lê et al.: the CAS is what decides ownership against the owner's last-item CAS. Failure
    // order relaxed: on failure the value is discarded and the caller retries.
    if (!d.top.compare_exchange_strong(t, t + 1, std::memory_order_seq_cst, std::memory_order_relaxed)) {
      return {StealStatus::kRetry, 0};
    }
    return {StealStatus::kTaken, c};
  }

  // Takes half the victim's chunks (rounded up), at most `cap` and at most kMaxStealBatch. Returns the oldest
  // to run now and pushes the rest into `dest` with one bottom update.
  template <class OwnerDeque>
  StolenBatch steal_batch_and_pop(OwnerDeque& dest, std::size_t cap) const {
    std::array<ChunkId, kMaxStealBatch> more;
    const StolenBatch s = steal_batch(more, cap);
    // push_bulk may allocate (growth) and so throw; the chunks are then lost to the step, which the scheduler's
    // exactly-once check reports. The scheduler sizes deques so that a steal never grows them past the step.
    if (s.moved > 0) dest.push_bulk(std::span<const ChunkId>(more.data(), s.moved));
    return s;
  }

  // As steal_batch_and_pop(), with the chunks after the oldest written to more[0, moved) in the victim's order
  // (oldest first) instead of pushed: the thief owns them exactly as if they were in its deque, and must run or
  // push every one. In a Chase–Lev deque the owner pops uncontested while top < bottom - 1, so a thief may not
  // claim several slots with one CAS: as in crossbeam's LIFO flavour, the batch is taken one CAS at a time and
  // stops at the first lost race. Each slot is claimed by its own seq_cst CAS on top, as in steal(), so each
  // chunk has exactly one taker.
  StolenBatch steal_batch(std::span<ChunkId, kMaxStealBatch> more, std::size_t cap) const noexcept {
    detail::DequeState& d = *m_state;
    std::int64_t t = detail::load_before_barrier(d.top);
    detail::full_barrier_between_loads();
    std::int64_t b = detail::load_after_barrier(d.bottom, std::memory_order_acquire);  // pairs as in steal()
    if (t >= b) return {StealStatus::kEmpty, 0, 0};
    const std::int64_t want = std::min<std::int64_t>(
        {(b - t + 1) / 2, static_cast<std::int64_t>(std::max<std::size_t>(cap, 1)), static_cast<std::int64_t>(kMaxStealBatch)});

    const detail::RingBuffer* buf = d.buffer.load(std::memory_order_acquire);  // pairs as in steal()
    const ChunkId first = buf->load(t);
    if (!d.top.compare_exchange_strong(t, t + 1, std::memory_order_seq_cst, std::memory_order_relaxed)) {
      return {StealStatus::kRetry, 0, 0};
    }
    std::size_t n = 0;
    for (std::int64_t i = 1; i < want; ++i) {
      ++t;
      detail::full_barrier_between_loads();  // the same pairing as the first steal, once per extra slot
      b = detail::load_after_barrier(d.bottom, std::memory_order_acquire);
      if (t >= b) break;
      buf = d.buffer.load(std::memory_order_acquire);  // the owner may have grown the buffer meanwhile
      const ChunkId c = buf->load(t);
      if (!d.top.compare_exchange_strong(t, t + 1, std::memory_order_seq_cst, std::memory_order_relaxed)) break;
      more[n++] = c;
    }
    return {StealStatus::kTaken, first, n};
  }

  // A racy estimate of the victim's length, for load-aware victim choice. Relaxed: it is only a hint, and a
  // stale value costs at most one failed steal.
  std::size_t size_hint() const noexcept {
    const std::int64_t n = m_state->bottom.load(std::memory_order_relaxed) - m_state->top.load(std::memory_order_relaxed);
    return n > 0 ? static_cast<std::size_t>(n) : 0;
  }

 private:
  friend class ChunkDeque;
  explicit Stealer(std::shared_ptr<detail::DequeState> s) : m_state(std::move(s)) {}
  std::shared_ptr<detail::DequeState> m_state;
};

// Chase–Lev work-stealing deque (Chase and Lev, SPAA 2005) with the C11 memory orders of Lê, Pop, Cohen and
// Zappa Nardelli, "Correct and Efficient Work-Stealing for Weak Memory Models", PPoPP 2013. The owner pushes
// and pops at the bottom (LIFO); thieves steal from the top (FIFO). The ring grows when full and never shrinks.
// One object is the owner's handle: only one thread at a time may call its members, and consecutive owners must
// be ordered by happens-before (the scheduler hands each deque from the placing thread to its worker that way).
//
//   ChunkDeque q;
//   q.push_bulk(chunks);               // one release of bottom for the lot
//   while (auto c = q.pop()) run(*c);  // newest first
class ChunkDeque {
 public:
  explicit ChunkDeque(std::size_t initial_capacity = 256)
      : m_state(std::make_shared<detail::DequeState>(static_cast<std::int64_t>(std::bit_ceil(std::max<std::size_t>(initial_capacity, 2))))) {}

  ChunkDeque(const ChunkDeque&) = delete;
  ChunkDeque& operator=(const ChunkDeque&) = delete;
  ChunkDeque(ChunkDeque&&) noexcept = default;
  ChunkDeque& operator=(ChunkDeque&&) noexcept = default;

  void push(ChunkId c) { push_bulk(std::span<const ChunkId>(&c, 1)); }

  // Pushes the chunks in order (the last one pushed is popped first) and publishes them with one store.
  void push_bulk(std::span<const ChunkId> chunks) {
    if (chunks.empty()) return;
    detail::DequeState& d = *m_state;
    // Relaxed: only this owner writes bottom.
    const std::int64_t b = d.bottom.load(std::memory_order_relaxed);
    // Acquire: pairs with a thief's seq_cst CAS on top, so its read of a slot happens before we overwrite that
    // slot below (Lê et al., push).
    const std::int64_t t = d.top.load(std::memory_order_acquire);
    const auto n = static_cast<std::int64_t>(chunks.size());
    detail::RingBuffer* buf = d.owned.get();
    if (b - t + n > buf->capacity()) buf = grow(t, b, b - t + n);
    for (std::int64_t i = 0; i < n; ++i) buf->store(b + i, chunks[static_cast<std::size_t>(i)]);
    // Release: publishes the slots; pairs with the acquire load of bottom in Stealer::steal().
    d.bottom.store(b + n, std::memory_order_release);
  }

  // Takes the newest chunk, or nothing when the deque is empty or a thief won the last one.
  std::optional<ChunkId> pop() noexcept {
    detail::DequeState& d = *m_state;
    const std::int64_t b = d.bottom.load(std::memory_order_relaxed) - 1;  // relaxed: only the owner writes bottom
    // Reserve slot b before looking at top; the barrier pairs with the one in Stealer::steal().
    detail::store_then_full_barrier(d.bottom, b);
    std::int64_t t = detail::load_after_barrier(d.top, std::memory_order_relaxed);
    if (t > b) {
      // Empty. Release: keeps every bottom store a release, so a thief that reads any bottom value sees the
      // slots below it (C++20 release sequences no longer extend through plain stores).
      d.bottom.store(b + 1, std::memory_order_release);
      return std::nullopt;
    }
    const ChunkId c = d.owned->load(b);
    if (t < b) return c;  // at least two chunks: no thief can reach slot b
    // The last chunk: race the thieves for it on top. Seq_cst pairs with their CAS.
    const bool won = d.top.compare_exchange_strong(t, t + 1, std::memory_order_seq_cst, std::memory_order_relaxed);
    d.bottom.store(b + 1, std::memory_order_release);  // release: as in the empty case
    if (!won) return std::nullopt;
    return c;
  }

  // The chunk pop() would return next, unless a thief takes it first; nothing when the deque looks empty. An
  // estimate for the owner's planning (a thief may take it at any time). Relaxed throughout: bottom and the slots
  // below it are written only by this owner, so it reads its own latest values; top is only compared, as a hint.
  std::optional<ChunkId> peek() const noexcept {
    const detail::DequeState& d = *m_state;
    const std::int64_t b = d.bottom.load(std::memory_order_relaxed);
    if (d.top.load(std::memory_order_relaxed) >= b) return std::nullopt;
    return d.owned->load(b - 1);
  }

  // Grows the ring now so that holding `n` chunks never grows it later (growth allocates, and may throw).
  void reserve(std::size_t n) {
    detail::DequeState& d = *m_state;
    const auto need = static_cast<std::int64_t>(n);
    if (need > d.owned->capacity()) {
      // Relaxed bottom: owner-only. Acquire top: as in push_bulk().
      grow(d.top.load(std::memory_order_acquire), d.bottom.load(std::memory_order_relaxed), need);
    }
  }

  // Owner's view of the length; exact when no thief is active.
  std::size_t size() const noexcept {
    const std::int64_t n = m_state->bottom.load(std::memory_order_relaxed) - m_state->top.load(std::memory_order_relaxed);
    return n > 0 ? static_cast<std::size_t>(n) : 0;
  }
  bool empty() const noexcept { return size() == 0; }
  std::size_t capacity() const noexcept { return static_cast<std::size_t>(m_state->owned->capacity()); }
  std::size_t retired_buffers() const noexcept { return m_state->retired.size(); }

  // Frees the buffers retired by growth. Call only at a quiescent point: when no Stealer of this deque is
  // inside a steal (the scheduler calls it between steps, when every worker is parked).
  void reclaim() noexcept { m_state->retired.clear(); }

  Stealer stealer() const { return Stealer(m_state); }

 private:
  detail::RingBuffer* grow(std::int64_t t, std::int64_t b, std::int64_t needed) {
    detail::DequeState& d = *m_state;
    auto cap = d.owned->capacity();
    while (cap < needed) cap *= 2;
    auto fresh = std::make_unique<detail::RingBuffer>(cap);
    // Copy the live range [t, b). Thieves may take some of it meanwhile; both buffers hold the same chunk at
    // every index, and the CAS on top decides who owns it.
    for (std::int64_t i = t; i < b; ++i) fresh->store(i, d.owned->load(i));
    // Release: pairs with the thieves' acquire load of buffer, so they never see it before the copy.
    d.buffer.store(fresh.get(), std::memory_order_release);
    d.retired.push_back(std::move(d.owned));
    d.owned = std::move(fresh);
    return d.owned.get();
  }

  std::shared_ptr<detail::DequeState> m_state;
};

}  // namespace stealbatch
