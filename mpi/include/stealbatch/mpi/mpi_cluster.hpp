// The MPI cluster: ranks from a communicator, each rank's window of share words for one-sided steals, and the step's
// collectives, over Open MPI (or any MPI-3 library).
#pragma once

#include <stealbatch/runtime/cluster.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace stealbatch::mpi {

// Initialises MPI (MPI_THREAD_MULTIPLE: a rank's devices steal from their own threads) unless the program already
// has, and finalises it when the last MpiCluster made this way goes. Throws Error when MPI cannot start, or when the
// library gives less than MPI_THREAD_MULTIPLE.
//
//   auto cluster = stealbatch::mpi::MpiCluster::world();          // every process of mpirun -np N
//   stealbatch::Runtime rt({.devices = "cpu:1", .cluster = {.job = cluster}});
//
// The window is made with MPI_Win_allocate and locked once (MPI_Win_lock_all); reads, writes and compare-and-swaps
// are MPI_Fetch_and_op / MPI_Compare_and_swap followed by MPI_Win_flush, so each is complete when it returns. A steal
// must complete while every thread of the victim is inside a long chunk and calls no MPI: with Open MPI that holds
// for the shared-memory component (osc sm) between ranks of one node, not for the default selection (see the
// README's launch section). So world() names the component list itself when the launch did not (OMPI_MCA_osc unset:
// "sm,ucx", shared memory within a node), before MPI starts.
//
// Sums of 64 KiB or more take the cluster's own pipelined ring, ordered by node (mpi/src/ring_allreduce.hpp: each
// rank sends 2 (R - 1) / R of the buffer), smaller ones one MPI_Iallreduce. Environment (every rank the same):
// STEALBATCH_MPI_RING=0, MPI's own allreduce for every size; 2, two levels (mpi/src/two_level.hpp: summed within each
// node, across the nodes' leaders over the ring, sent back, block by block as the ring goes; a node's link carries
// 2 (N - 1) / N of the buffer for N nodes); STEALBATCH_MPI_PROGRESS_US, the progress agent's period outside the
// step's sum (20 µs).
class MpiCluster final : public Cluster {
 public:
  // A cluster over a duplicate of MPI_COMM_WORLD.
  static std::shared_ptr<MpiCluster> world();
  // MPI ends when the process does (an atexit handler), not when its last cluster goes: a process starts MPI once,
  // so one that makes a cluster, drops it and makes another (a Python script's second Runtime) calls this first.
  static void finalize_at_exit();
  // Processes that no MPI launcher started (torchrun, a scheduler's own launcher) join through a port: rank 0 calls
  // open_port() and hands the name to the others by the launcher's means (the Python package uses torch.distributed's
  // store), then every rank calls joined(rank, size, name), which returns when all `size` have. The others connect
  // one at a time, in rank order: rank r > 0 calls wait_turn() before it connects, and every rank calls pass_turn()
  // once it is in, so the launcher's means let rank r + 1 go (the package: a key in the store; joined.sh: a file).
  // Each process starts MPI alone, so Open MPI needs its name server for the connect: ompi-server running, and its
  // URI in OMPI_MCA_pmix_server_uri before the first call. A rank that never calls joined() leaves the others
  // waiting in it (Open MPI gives up after 600 s), so a caller first checks that every rank is up (the package's
  // store barrier does). Throws ConfigError for a rank outside [0, size), a port that is not rank 0's own, or two
  // ranks that gave the same rank (ranks that give different sizes wait in the join: the launcher's one size is
  // every rank's).
  using Turn = std::function<void()>;
  static std::string open_port();
  static std::shared_ptr<MpiCluster> joined(int rank, int size, const std::string& port, const Turn& wait_turn = {}, const Turn& pass_turn = {});
  // Whether this process was started by an MPI launcher (mpirun sets OMPI_COMM_WORLD_SIZE, PMI_SIZE or PMIX_RANK).
  static bool launched_by_mpirun() noexcept;
  // This process's rank among the ranks of its node (OMPI_COMM_WORLD_LOCAL_RANK; 0 when not launched by mpirun).
  static int local_rank() noexcept;

  ~MpiCluster() override;
  MpiCluster(const MpiCluster&) = delete;
  MpiCluster& operator=(const MpiCluster&) = delete;

  int rank() const noexcept override;
  int size() const noexcept override;
  bool same_node(int rank) const noexcept override;
  std::string node_name(int rank) const override;  // MPI_Get_processor_name, gathered at the start
  std::uint64_t read(int rank, Word word) override;
  std::uint64_t compare_and_swap(int rank, Word word, std::uint64_t expected, std::uint64_t desired) override;
  void write(int rank, Word word, std::uint64_t value) override;
  Access access_in_flight() const noexcept override;
  void set_prompt_access(bool on) noexcept override;  // the progress agent's period: 20 µs on, 1 ms off (in a sum)
  // How this cluster sums large buffers: "two levels", "ring" or "MPI's allreduce" (the same on every rank).
  const char* large_sums() const noexcept;
  // The node's pulses: one word per rank of the node in a shared-memory window (MPI_Win_allocate_shared on the
  // node's communicator), read and written with atomics on the mapped memory, never through MPI.
  bool has_node_pulse() const noexcept override;
  void set_node_pulse(std::uint64_t value) noexcept override;
  std::uint64_t node_pulse(int rank) const noexcept override;
  void allreduce_sum(std::span<float> data, const std::function<void()>& waiting) override;
  using Cluster::allreduce_sum;
  void allreduce_sum(std::span<double> data, const std::function<void()>& waiting) override;
  void allreduce_sum(std::span<std::int64_t> data, const std::function<void()>& waiting) override;
  // bfloat16 on the wire: MPI_UINT16_T with a user operation that adds each pair in float and rounds it back.
  void allreduce_sum_bf16(std::span<float> data, const std::function<void()>& waiting) override;
  void broadcast(std::span<char> data, int root) override;
  [[noreturn]] void abort(const std::string& why, int exit_code) noexcept override;
  void barrier();

 private:
  struct State;
  explicit MpiCluster(std::unique_ptr<State> s);
  static std::shared_ptr<MpiCluster> over(std::unique_ptr<State> s);  // ranks, nodes, window and agent over s->comm
  static void find_nodes(State& s);   // which ranks share this node, every rank's node name, and the node's pulse words
  static void open_pulses(State& s);  // the node's pulse words, where the node's ranks can share a window
  static void two_levels(State& s);   // large sums in two levels (STEALBATCH_MPI_RING=2)
  static void open_window(State& s);  // the share words, zeroed and locked for the cluster's life
  // An MPI_Request*, tested under the lock: often at first, then yielding the core, then (past 5 ms from `start`)
  // sleeping between tests; `waiting` every 10 ms. Several waits of one operation (the ring's segments) share one
  // Waiting, and each still yields, not sleeps, for its own first 200 µs (a segment on a fast link).
  struct Waiting {
    std::chrono::steady_clock::time_point start, next_watch;
  };
  void wait(void* request, const std::function<void()>& waiting, Waiting* shared = nullptr);
  [[noreturn]] void fail_access(int rc, const char* what, int rank) const noexcept;  // a failed one-sided access: ends the job naming the target
  void access(int rc, const char* what, int rank) const noexcept {
    if (rc != 0) fail_access(rc, what, rank);  // 0: MPI_SUCCESS (no MPI header here)
  }
  // The sum in place: the ring from detail::kRingFrom bytes (ring_allreduce.hpp), else MPI_Iallreduce, then wait();
  // type: 0 float, 1 double, 2 int64, 3 bfloat16.
  void allreduce(void* data, std::size_t count, int type, const std::function<void()>& waiting);
  std::unique_ptr<State> m;
};

}  // namespace stealbatch::mpi
