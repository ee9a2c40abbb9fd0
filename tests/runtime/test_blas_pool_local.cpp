// The runtime finds a BLAS pool loaded out of the global scope (RTLD_LOCAL: a Python extension's libraries, torch's
// BLAS under `import torch`), and sets it for several CPU devices.
#include <stealbatch/runtime/cpu_device.hpp>
#include <stealbatch/runtime/runtime.hpp>

#include <doctest/doctest.h>

#include <dlfcn.h>

#ifndef SB_FAKE_OPENBLAS
#error "SB_FAKE_OPENBLAS: the path of the fake_openblas library"
#endif

using namespace stealbatch;

TEST_CASE("BlasPool.APoolLoadedLocallyIsFoundAndSet") {
  void* lib = ::dlopen(SB_FAKE_OPENBLAS, RTLD_NOW | RTLD_LOCAL);
  REQUIRE(lib != nullptr);
  REQUIRE(::dlsym(RTLD_DEFAULT, "openblas_set_num_threads") == nullptr);  // not in the global scope
  const auto threads = reinterpret_cast<int (*)()>(::dlsym(lib, "fake_openblas_threads"));
  REQUIRE(reinterpret_cast<void*>(threads) != nullptr);
  CHECK(threads() == -1);
  { const Runtime two({.devices = "cpu:2"}); }
  CHECK(threads() == 1);
  CHECK(set_blas_pool_threads(4) == BlasPool::kSet);
  CHECK(threads() == 4);
}
