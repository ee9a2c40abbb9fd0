// The runtime sizes the process's BLAS thread pool for several CPU devices: this executable stands in for OpenBLAS
// with an exported openblas_set_num_threads (the test target exports its symbols), which records its calls.
#include <stealbatch/runtime/cpu_device.hpp>
#include <stealbatch/runtime/runtime.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <vector>

namespace {
std::atomic<int> g_calls{0}, g_threads{-1};
}  // namespace

extern "C" __attribute__((visibility("default"))) void openblas_set_num_threads(int n) {
  g_calls.fetch_add(1);
  g_threads.store(n);
}

using namespace stealbatch;

TEST_CASE("BlasPool.SeveralCpuDevicesSetThePoolToOneThread") {
  // A raw chunk function that calls into the BLAS (a libtorch module bound by hand) gets each device's products on its
  // own thread: the runtime set the pool as it made its devices. One device keeps the pool as the process set it.
  g_calls = 0, g_threads = -1;
  { const Runtime one({.devices = "cpu:1"}); }
  CHECK(g_calls.load() == 0);
  { const Runtime two({.devices = "cpu:2"}); }
  CHECK(g_calls.load() == 1);
  CHECK(g_threads.load() == 1);
  CHECK(set_blas_pool_threads(3) == BlasPool::kSet);
  CHECK(g_threads.load() == 3);
  CHECK(set_blas_pool_threads(0) == BlasPool::kSet);  // at least one thread
  CHECK(g_threads.load() == 1);
}
