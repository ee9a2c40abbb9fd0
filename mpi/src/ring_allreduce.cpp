// The pipelined ring of ring_allreduce.hpp.
#include "ring_allreduce.hpp"

#include "mpi_error.hpp"

#include <algorithm>
#include <numeric>

namespace stealbatch::mpi::detail {

namespace {

constexpr int kRingTag = 0x5b1;  // the ring's messages; the cluster's communicator carries no other point-to-point

// One run of the ring over one buffer: its blocks, segments and requests.
class RingRun {
 public:
  RingRun(void* data, std::size_t count, const RingType& type, const Ring& ring, std::mutex& lock,
          const std::function<void(MPI_Request&)>& wait_one, const RingHooks* hooks)
      : m_hooks(hooks),
        m_data(static_cast<std::byte*>(data)),
        m_count(count),
        m_type(type),
        m_ring(ring),
        m_lock(lock),
        m_wait(wait_one),
        m_steps(2 * (ring.size - 1)),
        m_seg(std::max<std::size_t>(1, kRingSegment / type.size)),
        m_sends(static_cast<std::size_t>(m_steps)) {
    const std::size_t largest = (count + static_cast<std::size_t>(ring.size) - 1) / static_cast<std::size_t>(ring.size);
    for (auto& s : m_scratch) s.resize(largest * type.size);
  }

  void run() {
    post_receives(0);
    ready(sent_block(0));
    for (std::size_t k = 0; k < segments(sent_block(0)); ++k) post_send(0, k);
    for (int s = 0; s < m_steps; ++s) {
      if (s + 1 < m_steps) post_receives(s + 1);
      if (reduce_scatter(s)) ready(recv_block(s));  // added to below
      for (std::size_t k = 0; k < m_recvs[s % 2].size(); ++k) {
        m_wait(m_recvs[s % 2][k]);
        if (reduce_scatter(s)) {
          const auto [b, e] = segment(recv_block(s), k);
          m_type.add(m_scratch[s % 2].data() + (b - block(recv_block(s)).first) * m_type.size, at(b), e - b);
        }
        if (s + 1 < m_steps) post_send(s + 1, k);
      }
      // The block received in an all-gather step, or added in the last reduce-scatter step, is the job's sum now.
      if (m_hooks && (!reduce_scatter(s) || s == m_ring.size - 2)) m_hooks->final(recv_block(s));
    }
    for (auto& step : m_sends) wait_all(step);
  }

 private:
  bool reduce_scatter(int s) const noexcept { return s < m_ring.size - 1; }
  void ready(int b) const {
    if (m_hooks) m_hooks->ready(b);
  }
  int wrap(int b) const noexcept { return ((b % m_ring.size) + m_ring.size) % m_ring.size; }
  int sent_block(int s) const noexcept {
    return wrap(reduce_scatter(s) ? m_ring.position - s : m_ring.position + 1 - (s - (m_ring.size - 1)));
  }
  int recv_block(int s) const noexcept {
    return wrap(reduce_scatter(s) ? m_ring.position - s - 1 : m_ring.position - (s - (m_ring.size - 1)));
  }
  std::pair<std::size_t, std::size_t> block(int b) const noexcept { return ring_block(m_count, m_ring.size, b); }
  std::size_t segments(int b) const noexcept {
    const auto [first, last] = block(b);
    return (last - first + m_seg - 1) / m_seg;
  }
  std::pair<std::size_t, std::size_t> segment(int b, std::size_t k) const noexcept {
    const auto [first, last] = block(b);
    return {first + k * m_seg, std::min(last, first + (k + 1) * m_seg)};
  }
  std::byte* at(std::size_t element) const noexcept { return m_data + element * m_type.size; }

  void post_send(int s, std::size_t k) {
    const auto [b, e] = segment(sent_block(s), k);
    MPI_Request req = MPI_REQUEST_NULL;
    {
      const std::lock_guard g(m_lock);
      check(MPI_Isend(at(b), static_cast<int>(e - b), m_type.type, m_ring.next, kRingTag, m_ring.comm, &req),
            "MPI_Isend");
    }
    m_sends[static_cast<std::size_t>(s)].push_back(req);
  }

  void post_receives(int s) {
    const int rb = recv_block(s);
    if (!reduce_scatter(s))
      wait_all(m_sends[static_cast<std::size_t>(s - (m_ring.size - 1))]);  // block rb left from it then
    auto& reqs = m_recvs[s % 2];
    reqs.assign(segments(rb), MPI_REQUEST_NULL);
    const std::size_t first = block(rb).first;
    for (std::size_t k = 0; k < reqs.size(); ++k) {
      const auto [b, e] = segment(rb, k);
      std::byte* into = reduce_scatter(s) ? m_scratch[s % 2].data() + (b - first) * m_type.size : at(b);
      const std::lock_guard g(m_lock);
      check(MPI_Irecv(into, static_cast<int>(e - b), m_type.type, m_ring.prev, kRingTag, m_ring.comm, &reqs[k]),
            "MPI_Irecv");
    }
  }

  void wait_all(std::vector<MPI_Request>& reqs) {
    for (MPI_Request& r : reqs) m_wait(r);
    reqs.clear();
  }

  const RingHooks* m_hooks;
  std::byte* m_data;
  std::size_t m_count;
  const RingType& m_type;
  const Ring& m_ring;
  std::mutex& m_lock;
  const std::function<void(MPI_Request&)>& m_wait;
  int m_steps;
  std::size_t m_seg;                              // elements a segment
  std::vector<std::vector<MPI_Request>> m_sends;  // each step's sends not yet waited for
  std::vector<MPI_Request> m_recvs[2];            // step s's receives: m_recvs[s % 2]
  std::vector<std::byte> m_scratch[2];            // reduce-scatter step s receives into m_scratch[s % 2]
};

}  // namespace

Ring ring_of(MPI_Comm comm, int rank, const std::vector<int>& node_first) {
  std::vector<int> order(node_first.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return node_first[static_cast<std::size_t>(a)] < node_first[static_cast<std::size_t>(b)];
  });
  Ring ring;
  ring.comm = comm;
  ring.size = static_cast<int>(order.size());
  ring.position = static_cast<int>(std::find(order.begin(), order.end(), rank) - order.begin());
  ring.next = order[static_cast<std::size_t>((ring.position + 1) % ring.size)];
  ring.prev = order[static_cast<std::size_t>((ring.position + ring.size - 1) % ring.size)];
  return ring;
}

void ring_allreduce(void* data, std::size_t count, const RingType& type, const Ring& ring, std::mutex& lock,
                    const std::function<void(MPI_Request&)>& wait_one, const RingHooks* hooks) {
  if (count == 0) return;
  if (ring.size < 2) {  // one block, the whole buffer: this rank's own is the sum
    if (hooks) hooks->ready(0), hooks->final(0);
    return;
  }
  RingRun(data, count, type, ring, lock, wait_one, hooks).run();
}

std::pair<std::size_t, std::size_t> ring_block(std::size_t count, int ranks, int b) noexcept {
  const auto r = static_cast<std::size_t>(ranks), i = static_cast<std::size_t>(b);
  return {count * i / r, count * (i + 1) / r};
}

}  // namespace stealbatch::mpi::detail
