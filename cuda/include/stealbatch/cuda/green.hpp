// Virtual GPUs: one physical GPU split into parts of given SM counts with CUDA green contexts (driver API).
#pragma once

#include <stealbatch/runtime/device_spec.hpp>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

namespace stealbatch::cuda {

// One part: a green context holding a disjoint set of the GPU's SMs. Kernels launched on a stream it creates run
// on those SMs only. Memory is the GPU's (green contexts share the primary context's allocations), so parts
// read each other's buffers and one kernel can reduce across them.
//
// A green context can be current to only one thread at a time (cuda.h, cuGreenCtxCreate): the device's worker
// makes it current once (bind) and keeps it. Every other thread reaches the part through its streams only:
// kernels and copies take their context from the stream they are issued on (cuda.h, cuLaunchKernel).
class Partition {
 public:
  // `primary`: the GPU's primary context (CUcontext), which the destructor makes current again where the part was.
  Partition(void* green_ctx, void* primary, int gpu, int sms) : m_green(green_ctx), m_primary(primary), m_gpu(gpu), m_sms(sms) {}
  // Destroy every stream of the part first (cuda.h, cuGreenCtxDestroy).
  ~Partition();
  Partition(const Partition&) = delete;
  Partition& operator=(const Partition&) = delete;
  int gpu() const noexcept { return m_gpu; }
  int sm_count() const noexcept { return m_sms; }
  // Makes the part's context current on the calling thread (the device's worker only).
  void make_current() const;
  // Whether the part's context is current on the calling thread.
  bool is_current() const;
  // A non-blocking stream whose kernels run on this part's SMs.
  cudaStream_t create_stream() const;

 private:
  friend class ContextScope;
  void* m_green;    // CUgreenCtx
  void* m_primary;  // CUcontext
  int m_gpu;
  int m_sms;
};

// Makes a part's context current for the scope, and the previous one current again after it (a no-op for a null
// part). For work on a thread other than the part's worker while that worker holds nothing (teardown).
//   { ContextScope on(part); cublasDestroy(handle); }
class ContextScope {
 public:
  explicit ContextScope(const Partition* part);
  ~ContextScope();
  ContextScope(const ContextScope&) = delete;
  ContextScope& operator=(const ContextScope&) = delete;

 private:
  void* m_previous = nullptr;  // CUcontext
  bool m_active = false;
};

// Splits GPU `gpu` into the parts a vgpu spec asks for (DeviceSpec::Parts: SM counts, N equal parts, or shares, turned
// into SM counts by vgpu_sm_counts()): each part gets whole SM groups of the GPU's partition granularity (at least 8
// SMs on Hopper) until their SM counts reach its count; the parts' actual counts are in Partition::sm_count(). Throws
// ConfigError when the spec does not fit (naming what fits), and CudaError where green contexts are unavailable
// (driver or GPU).
std::vector<std::shared_ptr<Partition>> make_partitions(int gpu, const DeviceSpec& spec);

// Each part's SM count from a vgpu spec and the GPU's partitionable groups (their SM counts, in order; `total` the
// GPU's SMs, for messages): the spec's own counts; N equal parts (whole groups each: vgpu:4 on 15 groups of 8 gives
// 3 groups, 24 SMs, a part); or shares of the groups, each rounded to whole groups and at least one (the largest give
// way where rounding asks for more than there are). Pure arithmetic, tested without a GPU. Throws ConfigError, naming
// what fits, where the groups cannot give every part what it asks.
std::vector<int> vgpu_sm_counts(const DeviceSpec& spec, const std::vector<unsigned>& group_sms, int total);

// How many of the GPU's SM groups (their SM counts in order) each part takes: groups in order until their summed SM
// count reaches the part's request. Empty when the groups run out. Pure arithmetic, for make_partitions and its test;
// throws ConfigError for a request under 1 SM.
//   assign_sm_groups({8, 8, 8, 8, 8}, {16, 9})  ->  {2, 2}
std::vector<std::size_t> assign_sm_groups(const std::vector<unsigned>& group_sms, const std::vector<int>& sm_counts);

// The GPU's SM partition granularity and usable SM count, for messages; throws CudaError without a GPU.
struct SmInfo {
  int total = 0;
  int granularity = 0;
};
SmInfo sm_info(int gpu);

}  // namespace stealbatch::cuda
