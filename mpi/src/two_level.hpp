// The sum of large buffers across ranks of several nodes, some of them with more than one rank: in two levels
// (MpiCluster's sums from kRingFrom bytes on, with STEALBATCH_MPI_RING=2).
//
// The levels. Each node's ranks send their buffers to the node's leader (its lowest rank), which adds them to its own
// (point to point within the node: shared memory), the leaders sum theirs over the pipelined ring
// (ring_allreduce.hpp), and each leader sends the result back to its node's ranks. A node's link then carries
// 2 (N - 1) / N of the buffer each way for N nodes, against 2 (R - 1) / R for the ring over all R ranks in node
// order: 1 against 1.5 buffers at 2 nodes of 2 ranks, 1.5 against 1.75 at 4 nodes of 2, and at 2 nodes of P ranks
// half of what the flat ring sends as P grows. Every rank ends with the same bits: each node's sum is made at its
// leader, each block's sum of those at one leader of the ring, and the rest are copies.
//
// The overlap, block by block. The leaders' ring reads its N blocks one after another (RingHooks: its own block at
// its position p first, then p - 1, p - 2, ...), and finishes them one after another (p + 1, then p, p - 1, ...).
// So the node's ranks send their blocks in the order the ring reads them, and the leader adds block b of theirs just
// before its ring reads it, while the later blocks are still arriving: blocks cross the network while the rest is
// still being summed on the node. And each block goes back to the node's ranks as soon as it is the job's sum,
// while the ring still carries the others. What is exposed of the node's own work is one block's transfer and
// addition at the start and one block's way back at the end. Between two ranks MPI matches messages of one tag in
// the order they were sent and receives in the order they were posted, so each block lands in its own place; the
// leader receives the i-th block read into scratch i mod 2, posted one block ahead. (MPI's own non-blocking reduce
// and broadcast on the node took 135 ms for a 23 MB sum over 2 ranks of one machine, the ring 8.9 ms: libnbc moves
// small pieces, each waiting for a call into MPI.)
#pragma once

#include "ring_allreduce.hpp"

#include <mpi.h>

#include <cstddef>
#include <functional>
#include <mutex>

namespace stealbatch::mpi::detail {

struct TwoLevel {
  MPI_Comm node = MPI_COMM_NULL;  // this rank's node; its rank 0 is the leader
  int node_rank = 0, node_size = 1;
  int nodes = 1, position = 0;    // the leaders' ring: its size, and this node's leader's place in it
  Ring leaders;                   // that ring (on the leaders only)
};

// The sum of `data` (count elements of `type`) over every rank, in place, as above. Every MPI call is made under
// `lock`; `wait_one` waits for one request (and watches the other ranks meanwhile).
void two_level_allreduce(void* data, std::size_t count, const RingType& type, const TwoLevel& levels, std::mutex& lock,
                         const std::function<void(MPI_Request&)>& wait_one);

}  // namespace stealbatch::mpi::detail
