// The sum of large buffers across ranks: a ring, ordered by node, in segments, so that segments cross the network
// while the others are still being added on the way (MpiCluster's sums from kRingFrom bytes on).
//
// The ring. R ranks in ring order (every node's ranks next to each other: within a node the hops are shared memory,
// and each node's link carries one stream out and one in). The buffer is R blocks (block b: [count b / R,
// count (b + 1) / R)). 2 (R - 1) steps: in reduce-scatter step s (0 to R - 2) the rank at position p sends block
// p - s to the next rank and receives block p - s - 1 from the previous one, which it adds to its own; after them
// position p holds block p + 1's sum over every rank. In all-gather step s (0 to R - 2) it sends block p + 1 - s and
// receives block p - s over its own. Each rank sends 2 (R - 1) / R of the buffer, the least any allreduce can
// (against the whole buffer log2 R times in a binomial tree, through one root), and every rank ends with the same
// bits: each block's sum is made at one position and copied to the others.
//
// The pipeline. The block a rank sends at step s + 1 is the one it received at step s, so segment k of it goes out as
// soon as segment k arrived (and was added), not after the whole block: the steps overlap, and the transfer takes
// (2 (R - 1) / R) S / B plus 2 (R - 1) segments' latency rather than 2 (R - 1) blocks'. Each step's receives are
// posted before the previous step's are waited for; between the same two ranks MPI matches messages of one tag in the
// order they were sent and receives in the order they were posted, so segment k of step s lands in step s's buffer.
// A reduce-scatter step receives into one of two scratch blocks (step s into scratch s mod 2: step s - 2, its last
// user, was added before step s's receives are posted); an all-gather step receives into the buffer itself, into the
// block that this rank sent at reduce-scatter step s, whose sends are waited for first.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <functional>
#include <mutex>
#include <utility>
#include <vector>

namespace stealbatch::mpi::detail {

// From this many bytes on, MpiCluster's sums take the ring (below, one MPI_Iallreduce: its latency is fewer rounds).
inline constexpr std::size_t kRingFrom = std::size_t{64} << 10;
// The segment: 1 MiB, 9 ms at 1 Gbit/s. Each message costs about a round trip of its own over TCP (Open MPI's
// rendezvous): on 4 emulated nodes on "10gbit" links a 23 MB sum took 224 ms in 64 KiB segments, 134-154 ms in 256 KiB,
// 105 in 1 and 2 MiB, 100 in 4 MiB; at 1 Gbit/s 314-324 ms from 256 KiB to 4 MiB (34.9 MB at 1 Gbit/s: 280).
inline constexpr std::size_t kRingSegment = std::size_t{1} << 20;

struct Ring {
  MPI_Comm comm = MPI_COMM_NULL;
  int position = 0, size = 1;  // this rank's place in the ring order, and the ranks
  int prev = 0, next = 0;      // the ranks (of comm) before and after it
};

// The ring order: ranks sorted by their node's first rank, then by rank. node_first[r]: the lowest rank of r's node.
Ring ring_of(MPI_Comm comm, int rank, const std::vector<int>& node_first);

// What the ring moves: elements of `size` bytes of MPI type `type`, and inout[i] += in[i] over n of them.
struct RingType {
  std::size_t size;
  MPI_Datatype type;
  void (*add)(const void* in, void* inout, std::size_t n);
};

// What a caller may do around the ring's use of each block (two_level.hpp: the node's part in it). `ready(b)` runs
// before this rank's own block b is first read (sent at the first step, or added to in a reduce-scatter step): it
// may still fill it. The order: the block at the ring position p, then p - 1, p - 2, ... (mod R), each once.
// `final(b)` runs once block b holds the sum over every rank, and the ring only reads it from then on: p + 1 after
// the reduce-scatter, then p, p - 1, ..., p + 2 after each all-gather step. With one rank: ready(0), final(0).
// (A sum of no elements calls neither.)
struct RingHooks {
  std::function<void(int)> ready, final;
};

// The elements [first, last) of block b of a count-element buffer over `ranks` ranks.
std::pair<std::size_t, std::size_t> ring_block(std::size_t count, int ranks, int b) noexcept;

// The sum of `data` (count elements) over the ring, in place. Every MPI call is made under `lock`; `wait_one` waits
// for one request (and watches the other ranks meanwhile); `hooks`, where given, runs around each block.
void ring_allreduce(void* data, std::size_t count, const RingType& type, const Ring& ring, std::mutex& lock,
                    const std::function<void(MPI_Request&)>& wait_one, const RingHooks* hooks = nullptr);

}  // namespace stealbatch::mpi::detail
