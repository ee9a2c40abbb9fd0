// A stand-in for OpenBLAS in a shared library that the test loads with RTLD_LOCAL, as Python loads an extension's
// libraries: it records the thread count it is given.
namespace {
int g_threads = -1;
}  // namespace

extern "C" __attribute__((visibility("default"))) void openblas_set_num_threads(int n) { g_threads = n; }
extern "C" __attribute__((visibility("default"))) int fake_openblas_threads() { return g_threads; }
