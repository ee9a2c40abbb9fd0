// A CPU device: computes inside its own tbb::task_arena with its share of the cores, optionally slowed down.
#pragma once

#include <stealbatch/runtime/device.hpp>

#include <memory>

namespace stealbatch {

// `slowdown` >= 1 emulates a slower device: after each chunk the device idles (sleeps, burning no CPU) for
// (slowdown - 1) times the chunk's compute time, so it runs at 1/slowdown of its speed. The compute time is the
// CPU time the device's thread spent in the chunk when the device has one thread (so time spent waiting for a
// core, or blocked, is not multiplied), and the chunk's wall time when it has more. Threads the chunk function
// starts itself (a multithreaded BLAS, OpenMP) are not in the first: keep such libraries to one thread, as the
// examples do, or give the device more threads.
//
//   CpuDevice d(0, /*threads=*/2, /*slowdown=*/6.6);
class CpuDevice final : public Device {
 public:
  CpuDevice(std::size_t index, int threads, double slowdown);
  ~CpuDevice() override;
  std::string name() const override;
  void bind() override;
  ChunkTiming run_chunk(ChunkContext& ctx, const ChunkFunction& fn) override;
  int threads() const noexcept { return m_threads; }
  double slowdown() const noexcept { return m_slowdown; }
  // When the CPU devices' threads outnumber the cores: end every chunk with a system call (see run_chunk()), so
  // that a device thread waiting for a core gets it at a chunk boundary. Off by default (a system call a chunk);
  // the runtime turns it on when its CPU devices oversubscribe the machine.
  void set_preemption_point(bool on) noexcept { m_preemption_point = on; }
  // Report each chunk's compute time (ChunkTiming::compute_seconds; two clock reads a chunk). The runtime asks for
  // it when it sizes chunks from their times.
  void set_compute_time(bool on) noexcept { m_compute_time = on; }

 private:
  std::size_t m_index;
  int m_threads;
  double m_slowdown;
  struct Arena;  // a tbb::task_arena of `threads` (cpu_device.cpp: the installed headers need no TBB)
  std::unique_ptr<Arena> m_arena;
  bool m_preemption_point = false;
  bool m_compute_time = false;
};

// The BLAS library of this process, where it keeps one pool of threads for the whole process (OpenBLAS, BLIS), set to
// `threads` threads. Found at run time (dlsym): the runtime links no BLAS. Several CPU devices calling into one such
// pool at once queue on its lock while its threads spin (a raw libtorch chunk function on cpu:2, Debian's libtorch on
// OpenBLAS, ran up to 1.9x slower with stealing than static), so a runtime with two or more CPU devices sets it to 1
// as it makes them. kSet: set; kNone: no BLAS is loaded, or one whose threads follow the calling thread (MKL's
// OpenMP, which torch::set_num_threads sets per thread); kUnknown: a BLAS is loaded (sgemm_ resolves) whose pool no
// call the runtime knows sets.
enum class BlasPool { kSet, kNone, kUnknown };
BlasPool set_blas_pool_threads(int threads) noexcept;

}  // namespace stealbatch
