// A sourced step's refill protocol: one worker at a time asks the source, and the step ends only when it is exhausted.
#include "scheduler_impl.hpp"

#include <algorithm>
#include <stdexcept>

namespace stealbatch {

// The protocol of a sourced step. m_remaining counts the chunks given and not yet run, plus one token while the
// source is open. One worker at a time (m_refilling, taken by an acquire CAS) calls the source. It adds what it got
// to m_remaining before it gives the token back, on the same atomic in program order, so the count cannot reach
// zero between two refills; it then pushes the chunks onto its own deque (owner push: thieves may steal them at
// once) and releases m_refilling. A source that returns 0 is exhausted: the worker closes it and drops the token,
// and whoever then takes m_remaining to zero wakes everyone, exactly as in a placed step. Every release of
// m_refilling is followed by notify_all(), so a worker that parked while another was asking (its ready() saw
// m_refilling set) wakes to steal what was pushed, or to ask the source itself.
bool Scheduler::refill(Worker& me, ChunkId& out) {
  if (!source_ready()) return false;
  bool expected = false;
  if (!m_refilling.compare_exchange_strong(expected, true, std::memory_order_acquire, std::memory_order_relaxed)) return false;
  if (!m_source_open.load(std::memory_order_relaxed) || step_over()) {  // closed while we took the flag; or failed
    m_refilling.store(false, std::memory_order_release);
    m_event.notify_all();
    return false;
  }
  std::size_t got = 0;
  try {
    got = (*m_source)(me.index, std::span<ChunkId>(me.sourced));
    if (got > me.sourced.size()) throw std::logic_error("scheduler: a chunk source returned more chunks than it was given room for");
  } catch (...) {
    got = 0;
    fail_step(std::current_exception());
  }
  if (got == 0) {
    m_source_open.store(false, std::memory_order_release);
    m_refilling.store(false, std::memory_order_release);
    // Relaxed: as in execute(); the notify_all() below orders the zero before any parked worker's re-check.
    m_remaining.fetch_sub(1, std::memory_order_relaxed);
    m_event.notify_all();
    return false;
  }
  m_sourced.fetch_add(got, std::memory_order_relaxed);
  m_remaining.fetch_add(got, std::memory_order_relaxed);  // the token is still held: the count stays above zero
  out = me.sourced[0];
  if (got > 1) {
    // Pushed high to low, so this worker pops them ascending and thieves take the high end, as in a placed step.
    std::reverse(me.sourced.begin() + 1, me.sourced.begin() + static_cast<std::ptrdiff_t>(got));
    try {
      me.deque.push_bulk(std::span<const ChunkId>(me.sourced.data() + 1, got - 1));
    } catch (...) {  // growth failed: those chunks are lost to the step, which must fail rather than end short
      fail_step(std::current_exception());
    }
  }
  m_refilling.store(false, std::memory_order_release);
  m_event.notify_all();
  return true;
}

bool Scheduler::source_ready() const noexcept {
  // Acquire: pairs with the release stores in refill(), so a worker that sees the source free again also sees the
  // deque pushes and the count that came before.
  return m_source != nullptr && m_source_open.load(std::memory_order_acquire) && !m_refilling.load(std::memory_order_acquire);
}

bool Scheduler::wait_for_source(Worker& me, ChunkId& out) {
  bool got = false;
  // Acquire on m_source_open: as in source_ready().
  auto poll = [&] { return step_over() || (got = refill(me, out)) || !m_source_open.load(std::memory_order_acquire); };
  auto ready = [&] { return step_over() || source_ready(); };
  wait_until(poll, ready, &me.counters.parks);
  return got;
}

bool Scheduler::ask_source(Worker& me, ChunkId& out) {
  if (wait_for_source(me, out)) return true;
  wait_step_over(me);
  return false;
}

}  // namespace stealbatch
