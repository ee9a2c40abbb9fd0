// The two-level sum of two_level.hpp.
#include "two_level.hpp"

#include "mpi_error.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

namespace stealbatch::mpi::detail {

namespace {

constexpr int kUpTag = 0x5b2, kDownTag = 0x5b3;  // a block to the leader, and the job's sum of it back

class TwoLevelRun {
 public:
  TwoLevelRun(void* data, std::size_t count, const RingType& type, const TwoLevel& levels, std::mutex& lock,
              const std::function<void(MPI_Request&)>& wait_one)
      : m_data(static_cast<std::byte*>(data)), m_count(count), m_type(type), m_levels(levels), m_lock(lock), m_wait(wait_one) {}

  void run() {
    if (m_levels.node_rank == 0) {
      lead();
    } else {
      follow();
    }
  }

 private:
  int nodes() const noexcept { return m_levels.nodes; }
  int wrap(int b) const noexcept { return ((b % nodes()) + nodes()) % nodes(); }
  // The order in which the leader's ring reads its blocks, and the order in which they become the job's sum.
  int ready_block(int i) const noexcept { return wrap(m_levels.position - i); }
  int final_block(int i) const noexcept { return wrap(m_levels.position + 1 - i); }

  // Block b as messages of at most 1 GiB (within MPI's int counts, and what one transfer of a transport takes), sent
  // to or received from `peer`, into `reqs`. Every rank's block b has the same size, so each cuts it alike.
  void post(bool send, std::byte* base, int b, int peer, int tag, std::vector<MPI_Request>& reqs) {
    const auto [first, last] = ring_block(m_count, nodes(), b);
    const std::size_t piece = std::max<std::size_t>(1, (std::size_t{1} << 30) / m_type.size);
    for (std::size_t at = first; at < last;) {
      const std::size_t n = std::min(last - at, piece);
      std::byte* buf = base + (at - first) * m_type.size;
      MPI_Request req = MPI_REQUEST_NULL;
      {
        const std::lock_guard g(m_lock);
        if (send) {
          check(MPI_Isend(buf, static_cast<int>(n), m_type.type, peer, tag, m_levels.node, &req), "MPI_Isend");
        } else {
          check(MPI_Irecv(buf, static_cast<int>(n), m_type.type, peer, tag, m_levels.node, &req), "MPI_Irecv");
        }
      }
      reqs.push_back(req);
      at += n;
    }
  }
  std::byte* block_at(int b) const noexcept { return m_data + ring_block(m_count, nodes(), b).first * m_type.size; }
  void wait_all(std::vector<MPI_Request>& reqs) {
    for (MPI_Request& r : reqs) m_wait(r);
    reqs.clear();
  }

  // The leader: each block of the node's other ranks received into scratch (i mod 2 for the i-th block the ring
  // reads, posted one block ahead) and added to its own just before its ring reads it; each block sent back to them
  // as soon as it is the job's sum.
  void lead() {
    const auto others = static_cast<std::size_t>(m_levels.node_size - 1);
    // Rank j + 1's part of a scratch: the largest block (ring_block's differ by one at most).
    const std::size_t stride = (m_count + static_cast<std::size_t>(nodes()) - 1) / static_cast<std::size_t>(nodes()) * m_type.size;
    std::vector<std::byte> scratch[2];
    std::vector<MPI_Request> recvs[2], backs;
    for (auto& s : scratch) s.resize(others * stride);
    const auto post_recvs = [&](int i) {
      for (std::size_t j = 0; j < others; ++j) {
        post(false, scratch[i % 2].data() + j * stride, ready_block(i), static_cast<int>(j + 1), kUpTag, recvs[i % 2]);
      }
    };
    int readied = 0, finished = 0;
    post_recvs(0);
    RingHooks hooks;
    hooks.ready = [&](int b) {
      const int i = readied++;
      // The ring reads its blocks in the order the node's ranks sent them (ring_allreduce.hpp): anything else would
      // add the wrong block.
      if (b != ready_block(i)) throw std::logic_error("two-level sum: the ring read block " + std::to_string(b) + " where its order says " + std::to_string(ready_block(i)));
      if (i + 1 < nodes()) post_recvs(i + 1);
      const auto [first, last] = ring_block(m_count, nodes(), b);
      // Each rank's part: its messages in order, all of them before the next rank's (post_recvs posted them so).
      std::vector<MPI_Request>& reqs = recvs[i % 2];
      const std::size_t per_rank = reqs.size() / std::max<std::size_t>(1, others);
      for (std::size_t j = 0; j < others; ++j) {
        for (std::size_t q = 0; q < per_rank; ++q) m_wait(reqs[j * per_rank + q]);
        m_type.add(scratch[i % 2].data() + j * stride, m_data + first * m_type.size, last - first);
      }
      reqs.clear();
    };
    hooks.final = [&](int b) {
      const int i = finished++;
      if (b != final_block(i)) throw std::logic_error("two-level sum: the ring finished block " + std::to_string(b) + " where its order says " + std::to_string(final_block(i)));
      for (std::size_t j = 0; j < others; ++j) post(true, block_at(b), b, static_cast<int>(j + 1), kDownTag, backs);
    };
    ring_allreduce(m_data, m_count, m_type, m_levels.leaders, m_lock, m_wait, &hooks);
    wait_all(backs);
  }

  // Any other rank: every block sent to the leader at once, in the order its ring reads them; once all are out, each
  // block's sum received into it, in the order the leader's ring finishes them.
  void follow() {
    std::vector<MPI_Request> reqs;
    for (int i = 0; i < nodes(); ++i) post(true, block_at(ready_block(i)), ready_block(i), 0, kUpTag, reqs);
    wait_all(reqs);
    for (int i = 0; i < nodes(); ++i) post(false, block_at(final_block(i)), final_block(i), 0, kDownTag, reqs);
    wait_all(reqs);
  }

  std::byte* m_data;
  std::size_t m_count;
  const RingType& m_type;
  const TwoLevel& m_levels;
  std::mutex& m_lock;
  const std::function<void(MPI_Request&)>& m_wait;
};

}  // namespace

void two_level_allreduce(void* data, std::size_t count, const RingType& type, const TwoLevel& levels, std::mutex& lock,
                         const std::function<void(MPI_Request&)>& wait_one) {
  if (count == 0) return;
  TwoLevelRun(data, count, type, levels, lock, wait_one).run();
}

}  // namespace stealbatch::mpi::detail
