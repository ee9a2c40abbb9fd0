// Move-only RAII handles for CUDA streams, events, device and pinned buffers, and the current-device scope.
#pragma once

#include <stealbatch/cuda/check.hpp>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <memory>
#include <type_traits>

namespace stealbatch::cuda {

struct StreamDeleter {
  void operator()(cudaStream_t s) const noexcept { SB_CUDA_WARN(cudaStreamDestroy(s)); }
};
struct EventDeleter {
  void operator()(cudaEvent_t e) const noexcept { SB_CUDA_WARN(cudaEventDestroy(e)); }
};
struct DeviceFree {
  void operator()(void* p) const noexcept { SB_CUDA_WARN(cudaFree(p)); }
};
struct PinnedFree {
  void operator()(void* p) const noexcept { SB_CUDA_WARN(cudaFreeHost(p)); }
};
struct BlasDeleter {
  void operator()(cublasHandle_t h) const noexcept;
};

using Stream = std::unique_ptr<std::remove_pointer_t<cudaStream_t>, StreamDeleter>;
using Event = std::unique_ptr<std::remove_pointer_t<cudaEvent_t>, EventDeleter>;
// A cuBLAS handle; its work goes to the stream set with cublasSetStream.
using BlasHandle = std::unique_ptr<std::remove_pointer_t<cublasHandle_t>, BlasDeleter>;

//   Stream s = make_stream();   kernel<<<g, b, 0, s.get()>>>(...);
inline Stream make_stream() {
  cudaStream_t s = nullptr;
  SB_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return Stream(s);
}

//   BlasHandle blas = make_blas();   SB_CUBLAS_CHECK(cublasSetStream(blas.get(), s.get()));
BlasHandle make_blas();

// Events for ordering and completion only: no timing, so recording them is cheap.
inline Event make_event(unsigned flags = cudaEventDisableTiming) {
  cudaEvent_t e = nullptr;
  SB_CUDA_CHECK(cudaEventCreateWithFlags(&e, flags));
  return Event(e);
}

namespace detail {

struct DeviceMemory {
  static void* allocate(std::size_t bytes) {
    void* p = nullptr;
    SB_CUDA_CHECK(cudaMalloc(&p, bytes));
    return p;
  }
  using Free = DeviceFree;
};

struct PinnedMemory {
  static void* allocate(std::size_t bytes) {
    void* p = nullptr;
    SB_CUDA_CHECK(cudaMallocHost(&p, bytes));
    return p;
  }
  using Free = PinnedFree;
};

// A typed allocation of `count` elements from Memory (device or page-locked host).
template <class T, class Memory>
class Allocation {
 public:
  Allocation() = default;
  explicit Allocation(std::size_t count)
      : m_ptr(count > 0 ? Memory::allocate(count * sizeof(T)) : nullptr), m_count(count) {}
  T* data() const noexcept { return static_cast<T*>(m_ptr.get()); }
  std::size_t size() const noexcept { return m_count; }
  std::size_t bytes() const noexcept { return m_count * sizeof(T); }

 private:
  std::unique_ptr<void, typename Memory::Free> m_ptr;
  std::size_t m_count = 0;
};

}  // namespace detail

// A typed device allocation.
//   DeviceBuffer<float> g(n);   cudaMemsetAsync(g.data(), 0, g.bytes(), stream);
template <class T>
using DeviceBuffer = detail::Allocation<T, detail::DeviceMemory>;

// A typed page-locked host allocation, for asynchronous copies.
//   PinnedBuffer<float> staging(n);   cudaMemcpyAsync(d.data(), staging.data(), staging.bytes(), cudaMemcpyHostToDevice, s);
template <class T>
using PinnedBuffer = detail::Allocation<T, detail::PinnedMemory>;

// Makes `device` current for the scope and restores the previous device after.
//   { DeviceScope on(1); ... }
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    SB_CUDA_CHECK(cudaGetDevice(&m_previous));
    if (device != m_previous) SB_CUDA_CHECK(cudaSetDevice(device));
  }
  ~DeviceScope() { SB_CUDA_WARN(cudaSetDevice(m_previous)); }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int m_previous = 0;
};

}  // namespace stealbatch::cuda
