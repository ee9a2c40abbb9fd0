// set_blas_pool_threads(): the process's BLAS thread pool, found at run time (cpu_device.hpp).
#include <stealbatch/runtime/cpu_device.hpp>

#include <dlfcn.h>
#include <link.h>

#include <algorithm>

namespace stealbatch {

namespace {

// `name` in the process's global scope, else in any library it has loaded: a library loaded with RTLD_LOCAL (a Python
// extension's, such as torch's BLAS under `import torch`) is not in the global scope, and its pool is still the one
// the devices' products run on.
void* find_symbol(const char* name) noexcept {
  if (void* global = ::dlsym(RTLD_DEFAULT, name)) return global;
  struct Search {
    const char* name;
    void* found;
  } search{name, nullptr};
  ::dl_iterate_phdr(
      [](dl_phdr_info* info, std::size_t, void* data) -> int {
        auto* s = static_cast<Search*>(data);
        if (info->dlpi_name == nullptr || info->dlpi_name[0] == '\0') return 0;
        void* lib = ::dlopen(info->dlpi_name, RTLD_LAZY | RTLD_NOLOAD);  // already loaded: a handle, no load
        if (lib == nullptr) return 0;
        s->found = ::dlsym(lib, s->name);
        ::dlclose(lib);  // drops the reference dlopen added; the library stays loaded
        return s->found != nullptr ? 1 : 0;
      },
      &search);
  return search.found;
}

template <class F>
F find(const char* name) noexcept {
  return reinterpret_cast<F>(find_symbol(name));
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
