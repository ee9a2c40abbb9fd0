// Green contexts through driver entry points fetched at run time: the library never links libcuda, so it loads
// and runs its CPU paths where there is no driver.
#include <stealbatch/cuda/check.hpp>
#include <stealbatch/cuda/green.hpp>

#include <cuda.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

namespace stealbatch::cuda {

namespace {

// The driver functions green contexts need, resolved once.
struct Driver {
  decltype(&cuDeviceGet) device_get = nullptr;
  decltype(&cuDeviceGetDevResource) get_resource = nullptr;
  decltype(&cuDevSmResourceSplitByCount) split = nullptr;
  decltype(&cuDevResourceGenerateDesc) generate_desc = nullptr;
  decltype(&cuGreenCtxCreate) create = nullptr;
  decltype(&cuGreenCtxDestroy) destroy = nullptr;
  decltype(&cuCtxFromGreenCtx) to_ctx = nullptr;
  decltype(&cuGreenCtxStreamCreate) stream_create = nullptr;
  decltype(&cuCtxSetCurrent) set_current = nullptr;
  decltype(&cuCtxGetCurrent) get_current = nullptr;
  decltype(&cuDevicePrimaryCtxRetain) primary_retain = nullptr;
  decltype(&cuDevicePrimaryCtxRelease) primary_release = nullptr;
  decltype(&cuGetErrorString) error_string = nullptr;
};

template <class F>
void resolve(const char* symbol, F& fn) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult status{};
  const cudaError_t e = cudaGetDriverEntryPointByVersion(symbol, &p, 12050, cudaEnableDefault, &status);
  if (e != cudaSuccess || status != cudaDriverEntryPointSuccess || p == nullptr) {
    (void)cudaGetLastError();
    throw CudaError(std::string("vgpu: the CUDA driver has no ") + symbol + " (green contexts with their own streams need a driver for CUDA 12.5 or later)");
  }
  fn = reinterpret_cast<F>(p);
}

const Driver& driver() {
  static const Driver d = [] {
    Driver x;
    resolve("cuDeviceGet", x.device_get);
    resolve("cuDeviceGetDevResource", x.get_resource);
    resolve("cuDevSmResourceSplitByCount", x.split);
    resolve("cuDevResourceGenerateDesc", x.generate_desc);
    resolve("cuGreenCtxCreate", x.create);
    resolve("cuGreenCtxDestroy", x.destroy);
    resolve("cuCtxFromGreenCtx", x.to_ctx);
    resolve("cuGreenCtxStreamCreate", x.stream_create);
    resolve("cuCtxSetCurrent", x.set_current);
    resolve("cuCtxGetCurrent", x.get_current);
    resolve("cuDevicePrimaryCtxRetain", x.primary_retain);
    resolve("cuDevicePrimaryCtxRelease", x.primary_release);
    resolve("cuGetErrorString", x.error_string);
    return x;
  }();
  return d;
}

void check(CUresult r, const char* what) {
  if (r == CUDA_SUCCESS) return;
  const char* msg = nullptr;
  if (driver().error_string) driver().error_string(r, &msg);
  throw CudaError(std::string("vgpu: ") + what + " failed: " + (msg ? msg : "unknown error") + " (" + std::to_string(static_cast<int>(r)) + ")");
}

CUdevResource device_sms(int gpu, CUdevice& dev) {
  SB_CUDA_CHECK(cudaSetDevice(gpu));
  SB_CUDA_CHECK(cudaFree(nullptr));  // the primary context, which the green contexts retain
  check(driver().device_get(&dev, gpu), "cuDeviceGet");
  CUdevResource all{};
  check(driver().get_resource(dev, &all, CU_DEV_RESOURCE_TYPE_SM), "cuDeviceGetDevResource(SM)");
  return all;
}

}  // namespace

namespace {

CUcontext context_of(void* green) {
  CUcontext ctx = nullptr;
  check(driver().to_ctx(&ctx, static_cast<CUgreenCtx>(green)), "cuCtxFromGreenCtx");
  return ctx;
}

}  // namespace

Partition::~Partition() {
  if (!m_green) return;
  try {
    // A thread left with a destroyed context fails every later call on it: hand it the primary context back.
    if (is_current()) check(driver().set_current(static_cast<CUcontext>(m_primary)), "cuCtxSetCurrent(primary)");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "stealbatch: %s\n", e.what());
  }
  const CUresult r = driver().destroy(static_cast<CUgreenCtx>(m_green));
  if (r != CUDA_SUCCESS) std::fprintf(stderr, "stealbatch: cuGreenCtxDestroy failed (%d)\n", static_cast<int>(r));
}

void Partition::make_current() const { check(driver().set_current(context_of(m_green)), "cuCtxSetCurrent"); }

bool Partition::is_current() const {
  CUcontext now = nullptr;
  check(driver().get_current(&now), "cuCtxGetCurrent");
  return now != nullptr && now == context_of(m_green);
}

ContextScope::ContextScope(const Partition* part) {
  if (part == nullptr) return;
  CUcontext prev = nullptr;
  check(driver().get_current(&prev), "cuCtxGetCurrent");
  m_previous = prev;
  part->make_current();
  m_active = true;
}

ContextScope::~ContextScope() {
  if (!m_active) return;
  const CUresult r = driver().set_current(static_cast<CUcontext>(m_previous));
  if (r != CUDA_SUCCESS) std::fprintf(stderr, "stealbatch: cuCtxSetCurrent (restoring the previous context) failed (%d)\n", static_cast<int>(r));
}

cudaStream_t Partition::create_stream() const {
  CUstream s = nullptr;
  check(driver().stream_create(&s, static_cast<CUgreenCtx>(m_green), CU_STREAM_NON_BLOCKING, 0), "cuGreenCtxStreamCreate");
  return reinterpret_cast<cudaStream_t>(s);
}

namespace {

// The SM count of one group: what the driver says a partition must be a multiple of, at least 8 SMs on compute
// capability 9.x (Hopper's granule: cuda.h, cuDevSmResourceSplitByCount), and never 0, which some drivers leave in
// minSmPartitionSize.
unsigned granule_of(const CUdevResource& all, int gpu) {
  unsigned g = std::max(all.sm.minSmPartitionSize, all.sm.smCoscheduledAlignment);
  int major = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, gpu) != cudaSuccess) (void)cudaGetLastError();
  if (major == 9) g = std::max(g, 8u);
  return std::max(g, 1u);
}

}  // namespace

SmInfo sm_info(int gpu) {
  CUdevice dev{};
  const CUdevResource all = device_sms(gpu, dev);
  return {static_cast<int>(all.sm.smCount), static_cast<int>(granule_of(all, gpu))};
}

std::vector<std::size_t> assign_sm_groups(const std::vector<unsigned>& group_sms, const std::vector<int>& sm_counts) {
  std::vector<std::size_t> out;
  std::size_t at = 0;
  for (int want : sm_counts) {
    if (want <= 0) throw ConfigError("vgpu: a part of " + std::to_string(want) + " SMs; each part needs at least 1");
    unsigned got = 0;
    std::size_t k = 0;
    while (got < static_cast<unsigned>(want)) {
      if (at + k >= group_sms.size()) return {};
      got += group_sms[at + k++];
    }
    out.push_back(k);
    at += k;
  }
  return out;
}

std::vector<int> vgpu_sm_counts(const DeviceSpec& spec, const std::vector<unsigned>& group_sms, int total) {
  const std::size_t groups = group_sms.size();
  unsigned usable = 0;
  for (unsigned g : group_sms) usable += g;
  const unsigned each = groups > 0 ? usable / static_cast<unsigned>(groups) : 0;
  const auto refuse = [&](const std::string& why) {
    const std::size_t four = std::min<std::size_t>(4, groups);
    throw ConfigError("devices = '" + spec.text + "': " + why + ". The GPU can be partitioned into " + std::to_string(groups) + " groups of " +
                      std::to_string(each) + " SMs (" + std::to_string(usable) + " of its " + std::to_string(total) + "); what fits: vgpu:N for N up to " +
                      std::to_string(groups) + (four > 0 ? " (vgpu:" + std::to_string(four) + ": " + std::to_string(groups / four * each) + " SMs a part)" : "") +
                      ", shares in whole groups of at least one each (vgpu:50%,25%,25%), or SM counts that add up to at most " +
                      std::to_string(usable) + " in whole groups");
  };
  if (spec.parts == DeviceSpec::Parts::kSms) {
    if (assign_sm_groups(group_sms, spec.ids).empty()) refuse("too few SMs to give each part at least its count");
    return spec.ids;
  }
  const std::size_t n = spec.count;
  if (n == 0 || n > groups) refuse(std::to_string(n) + " parts of " + std::to_string(groups) + " groups");
  std::vector<std::size_t> take(n, groups / n);
  if (spec.parts == DeviceSpec::Parts::kShares) {
    std::size_t sum = 0;
    for (std::size_t i = 0; i < n; ++i) {
      take[i] = std::max<std::size_t>(1, static_cast<std::size_t>(std::lround(spec.shares[i] * static_cast<double>(groups))));
      sum += take[i];
    }
    while (sum > groups) {  // rounding asked for more than there are: the largest give way (each keeps at least one)
      --*std::max_element(take.begin(), take.end()), --sum;
    }
  }
  std::vector<int> sms;
  std::size_t at = 0;
  for (std::size_t k : take) {
    unsigned got = 0;
    for (std::size_t i = 0; i < k; ++i) got += group_sms[at++];
    sms.push_back(static_cast<int>(got));
  }
  return sms;
}

std::vector<std::shared_ptr<Partition>> make_partitions(int gpu, const DeviceSpec& spec) {
  CUdevice dev{};
  CUdevResource all = device_sms(gpu, dev);
  const int total = static_cast<int>(all.sm.smCount);
  // The primary context's handle, for ~Partition; each green context retains the primary context while it lives.
  CUcontext primary = nullptr;
  check(driver().primary_retain(&primary, dev), "cuDevicePrimaryCtxRetain");
  struct Release {
    CUdevice dev;
    ~Release() { (void)driver().primary_release(dev); }
  } release{dev};
  const unsigned granule = granule_of(all, gpu);
  // Split the whole GPU into groups of (at least) one granule, then give each part groups until their summed SM count
  // reaches its request: one split instance, so the groups may be combined into one descriptor per part. The groups'
  // sizes are read from what the driver returned, not assumed to be the granule.
  unsigned groups = 0;
  check(driver().split(nullptr, &groups, &all, nullptr, 0, granule), "cuDevSmResourceSplitByCount (query)");
  std::vector<CUdevResource> pieces(groups);
  CUdevResource rest{};
  check(driver().split(pieces.data(), &groups, &all, &rest, 0, granule), "cuDevSmResourceSplitByCount");
  pieces.resize(groups);
  std::vector<unsigned> group_sms;
  for (const CUdevResource& p : pieces) group_sms.push_back(p.sm.smCount);
  const std::vector<int> sm_counts = vgpu_sm_counts(spec, group_sms, total);  // refuses, naming what fits
  const std::vector<std::size_t> take = assign_sm_groups(group_sms, sm_counts);  // each part's groups: they fit
  std::vector<std::shared_ptr<Partition>> out;
  std::size_t at = 0;
  for (const std::size_t k : take) {
    CUdevResourceDesc desc = nullptr;
    check(driver().generate_desc(&desc, pieces.data() + at, static_cast<unsigned>(k)), "cuDevResourceGenerateDesc");
    unsigned sms = 0;
    for (std::size_t i = at; i < at + k; ++i) sms += pieces[i].sm.smCount;
    CUgreenCtx g = nullptr;
    check(driver().create(&g, desc, dev, CU_GREEN_CTX_DEFAULT_STREAM), "cuGreenCtxCreate");
    out.push_back(std::make_shared<Partition>(g, primary, gpu, static_cast<int>(sms)));
    at += k;
  }
  return out;
}

}  // namespace stealbatch::cuda
