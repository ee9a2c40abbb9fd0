// set_blas_pool_threads(): the process's BLAS thread pool, found at run time (cpu_device.hpp).
#include <stealbatch/runtime/cpu_device.hpp>

#include <dlfcn.h>

#include <algorithm>

namespace stealbatch {

namespace {

template <class F>
F find(const char* name) noexcept {
  return reinterpret_cast<F>(::dlsym(RTLD_DEFAULT, name));
}

}  // namespace

BlasPool set_blas_pool_threads(int threads) noexcept {
  using SetThreads = void (*)(int);
  const int n = std::max(1, threads);
  // Looked up once: the libraries a process has loaded when it makes its first CPU devices are those it runs on.
  static const auto openblas = find<SetThreads>("openblas_set_num_threads");
  static const auto blis = find<SetThreads>("bli_thread_set_num_threads");
  static const bool mkl = find<void*>("mkl_get_max_threads") != nullptr || find<void*>("MKL_Get_Max_Threads") != nullptr;
  static const bool blas = find<void*>("sgemm_") != nullptr || find<void*>("cblas_sgemm") != nullptr;
  if (openblas != nullptr) {
    openblas(n);
    return BlasPool::kSet;
  }
  if (blis != nullptr) {
    blis(n);
    return BlasPool::kSet;
  }
  return mkl || !blas ? BlasPool::kNone : BlasPool::kUnknown;
}

}  // namespace stealbatch
