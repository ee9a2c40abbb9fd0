// CUDA basics: discovery without a driver, the NCCL library, RAII handles, a kernel launch on a real GPU, and the
// graph policy of gpu.graphs.
#include <stealbatch/cuda/device_info.hpp>
#include <stealbatch/cuda/graph_cache.hpp>
#include <stealbatch/cuda/green.hpp>
#include <stealbatch/cuda/handles.hpp>
#include <stealbatch/runtime/device_spec.hpp>

#include <doctest/doctest.h>

#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

using namespace stealbatch;

namespace {

// Prints the marker CTest turns into "skipped", with the reason.
bool skip_without_gpu() {
  if (cuda::device_count() > 0) return false;
  std::printf("SB_SKIP: %s\n", cuda::no_device_reason().c_str());
  return true;
}

}  // namespace

TEST_CASE("CudaInfo.DeviceCountNeverThrows") {
  // 0 on a machine without a driver (error 35). Without a driver the runtime's initialization fails again on
  // every call, so "cleared" means only that the answer stays 0 and nothing throws.
  const int n = cuda::device_count();
  CHECK(n >= 0);
  CHECK(cuda::device_count() == n);
  CHECK((n == 0) == !cuda::no_device_reason().empty());
}

TEST_CASE("CudaInfo.NcclLinksAndReportsItsVersion") {
  const int v = cuda::nccl_version();  // needs the library, not a GPU
  MESSAGE("NCCL " << v / 10000 << "." << (v / 100) % 100 << "." << v % 100);
  CHECK(v >= 20000);
}

TEST_CASE("CudaHandles.FillKernelRoundTrip") {
  if (skip_without_gpu()) return;
  cuda::DeviceScope on(0);
  cuda::Stream s = cuda::make_stream();
  cuda::Event done = cuda::make_event();
  cuda::DeviceBuffer<float> d(1 << 20);
  cuda::PinnedBuffer<float> h(d.size());
  cuda::fill(d.data(), d.size(), 3.5f, s.get());
  SB_CUDA_CHECK(cudaMemcpyAsync(h.data(), d.data(), d.bytes(), cudaMemcpyDeviceToHost, s.get()));
  SB_CUDA_CHECK(cudaEventRecord(done.get(), s.get()));
  SB_CUDA_CHECK(cudaEventSynchronize(done.get()));
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < h.size(); ++i) wrong += h.data()[i] != 3.5f;
  CHECK(wrong == 0);
}

TEST_CASE("CudaCheck.ErrorsNameTheCallAndLocation") {
  if (skip_without_gpu()) return;
  try {
    SB_CUDA_CHECK(cudaSetDevice(1 << 20));
    FAIL("an invalid device must throw");
  } catch (const CudaError& e) {
    const std::string what = e.what();
    CHECK(what.find("cudaSetDevice(1 << 20)") != std::string::npos);
    CHECK(what.find("test_cuda_basics.cpp") != std::string::npos);
  }
}

// vgpu parts get the GPU's SM groups in order until their SM counts reach the request, whatever size the driver made
// the groups (no GPU needed: the arithmetic of make_partitions).
TEST_CASE("Vgpu.PartsTakeGroupsUntilTheirCountIsReached") {
  using V = std::vector<std::size_t>;
  // Hopper: 132 SMs as 16 groups of 8 (4 left over); vgpu:64,16,16,16 takes 8 + 2 + 2 + 2 groups.
  const std::vector<unsigned> h200(16, 8);
  CHECK(cuda::assign_sm_groups(h200, {64, 16, 16, 16}) == V{8, 2, 2, 2});
  CHECK(cuda::assign_sm_groups(h200, {9}) == V{2});  // rounded up to whole groups
  CHECK(cuda::assign_sm_groups(h200, {120, 16}).empty());  // 17 groups asked of 16
  // Groups of other sizes than the granule: a part takes groups until the sum reaches its count.
  CHECK(cuda::assign_sm_groups({16, 16, 8, 8, 4}, {20, 8, 12}) == V{2, 1, 2});
  CHECK(cuda::assign_sm_groups({16, 16, 8, 8, 4}, {20, 8, 13}).empty());
  CHECK_THROWS_AS(cuda::assign_sm_groups(h200, {0}), ConfigError);
}

// vgpu specs in their three forms against the groups the H200's driver offered (15 of 8 SMs: 120 of 132): SM counts
// as given; N equal parts of whole groups; shares of the groups, rounded to whole ones. What does not fit is refused,
// naming what does (no GPU needed).
TEST_CASE("Vgpu.EqualPartsAndSharesFitTheGroupsTheDriverOffers") {
  using V = std::vector<int>;
  const std::vector<unsigned> h200(15, 8);
  const auto sms = [&](const char* spec) { return cuda::vgpu_sm_counts(parse_device_spec(spec), h200, 132); };
  CHECK(sms("vgpu:64,16,16,16") == V{64, 16, 16, 16});
  CHECK(sms("vgpu:4") == V{24, 24, 24, 24});  // 3 groups each; 3 left
  CHECK(sms("vgpu:2") == V{56, 56});
  CHECK(sms("vgpu:15") == V(15, 8));
  CHECK(sms("vgpu:50%,25%,25%") == V{56, 32, 32});  // 7.5 -> 8 groups, 3.75 -> 4, 4: one too many, the largest gives way
  CHECK(sms("vgpu:10%,10%") == V{16, 16});
  // vgpu:32,32,32,32 needs 128 SMs: refused, naming what fits.
  try {
    (void)sms("vgpu:32,32,32,32");
    FAIL("expected a ConfigError");
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    CHECK(what.find("vgpu:32,32,32,32") != std::string::npos);
    CHECK(what.find("15 groups of 8 SMs (120 of its 132)") != std::string::npos);
    CHECK(what.find("vgpu:4: 24 SMs a part") != std::string::npos);
  }
  CHECK_THROWS_AS(sms("vgpu:16"), ConfigError);  // 16 parts of 15 groups
  CHECK_THROWS_AS((void)cuda::vgpu_sm_counts(parse_device_spec("vgpu:2"), {}, 0), ConfigError);  // no groups at all
}

// The graph policy of gpu.graphs, with stand-in handles: nothing here touches a GPU.
TEST_CASE("GraphCache.WarmsUpCapturesThenReplaysPerCountAndSlot") {
  using Cache = cuda::GraphCache<int>;
  std::vector<int> destroyed;
  Cache c(8, [&](int h) { destroyed.push_back(h); });
  int g = 0;
  CHECK(c.plan(64, 0, &g) == Cache::Action::kEager);    // warm-up: sizes the workspace
  CHECK(c.plan(64, 1, &g) == Cache::Action::kEager);    // another slot: another input address
  CHECK(c.plan(64, 0, &g) == Cache::Action::kCapture);
  c.captured(64, 0, 101);
  CHECK(c.plan(64, 0, &g) == Cache::Action::kReplay);
  CHECK(g == 101);
  CHECK(c.plan(32, 0, &g) == Cache::Action::kEager);    // another count: other kernel sizes
  CHECK(c.plan(64, 1, &g) == Cache::Action::kCapture);
  c.failed(64, 1);
  for (int i = 0; i < 3; ++i) CHECK(c.plan(64, 1, &g) == Cache::Action::kEager);  // a count that failed stays eager
  CHECK(c.stats().captured == 1);
  CHECK(c.stats().replayed == 1);
  CHECK(c.stats().failed == 1);
  CHECK(c.stats().eager == 6);
  CHECK(destroyed.empty());

  // A slot's staging moved: its graphs go, the other slot's stay.
  CHECK(c.plan(64, 1, &g) == Cache::Action::kEager);
  c.clear_slot(1);
  CHECK(c.plan(64, 0, &g) == Cache::Action::kReplay);
  CHECK(c.plan(64, 1, &g) == Cache::Action::kEager);  // the failure is forgotten with the slot: tried again
  CHECK(c.plan(64, 1, &g) == Cache::Action::kCapture);
  c.captured(64, 1, 102);
  // The replica or the workspace moved: every graph goes, and each count warms up again.
  c.clear();
  CHECK((destroyed == std::vector<int>{101, 102} || destroyed == std::vector<int>{102, 101}));
  CHECK(c.graphs() == 0);
  CHECK(c.plan(64, 0, &g) == Cache::Action::kEager);
  CHECK(c.plan(64, 0, &g) == Cache::Action::kCapture);
}

TEST_CASE("GraphCache.EvictsTheLeastRecentlyUsedPastItsCapacity") {
  using Cache = cuda::GraphCache<int>;
  std::vector<int> destroyed;
  {
    Cache c(2, [&](int h) { destroyed.push_back(h); });
    int g = 0;
    for (int n = 1; n <= 3; ++n) {
      REQUIRE(c.plan(n, 0, &g) == Cache::Action::kEager);
      REQUIRE(c.plan(n, 0, &g) == Cache::Action::kCapture);
      c.captured(n, 0, 10 * n);
      if (n == 2) CHECK(c.plan(1, 0, &g) == Cache::Action::kReplay);  // count 1 used after count 2
    }
    CHECK(destroyed == std::vector<int>{20});  // count 2 was the least recently used
    CHECK(c.graphs() == 2);
    CHECK(c.plan(2, 0, &g) == Cache::Action::kEager);  // evicted: starts over
  }
  CHECK(destroyed.size() == 3);  // the cache's end destroys what it kept
  CHECK_THROWS_AS(Cache(0, [](int) {}), std::invalid_argument);
}

TEST_CASE("GraphCache.ForgetsCountsSeenOnceWithoutAGraph") {
  using Cache = cuda::GraphCache<int>;
  Cache c(2, [](int) {});
  int g = 0;
  REQUIRE(c.plan(7, 0, &g) == Cache::Action::kEager);
  REQUIRE(c.plan(7, 0, &g) == Cache::Action::kCapture);
  c.captured(7, 0, 70);
  for (std::size_t n = 100; n < 140; ++n) CHECK(c.plan(n, 0, &g) == Cache::Action::kEager);  // a varying tail, each once
  CHECK(c.plan(7, 0, &g) == Cache::Action::kReplay);  // the kept graph stays
  CHECK(g == 70);
  CHECK(c.plan(100, 0, &g) == Cache::Action::kEager);  // forgotten: seen once again, not captured yet
}
