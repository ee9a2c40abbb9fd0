// Every RuntimeOptions field has a documented valid range, and a value outside it gives a ConfigError that names
// the field and the value: one row per field (and per way to be wrong), checked table-driven.
#include <stealbatch/error.hpp>
#include <stealbatch/runtime/runtime.hpp>

#include <doctest/doctest.h>

#include "stub_cluster.hpp"

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

using namespace stealbatch;

namespace {

struct Row {
  const char* field;                          // what the message must name
  const char* value;                          // and the offending value, as printed
  std::function<void(RuntimeOptions&)> set;   // makes one field invalid
};

}  // namespace

TEST_CASE("Config.EveryFieldOutsideItsRangeNamesFieldAndValue") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const std::vector<Row> rows = {
      {"devices", "gpu:1", [](RuntimeOptions& o) { o.devices = "gpu:1"; }},
      {"devices", "cpu:0", [](RuntimeOptions& o) { o.devices = "cpu:0"; }},
      {"devices", "sim:1,-1", [](RuntimeOptions& o) { o.devices = "sim:1,-1"; }},
      {"devices", "vgpu:0", [](RuntimeOptions& o) { o.devices = "vgpu:0"; }},
      {"chunk_size", "1048577", [](RuntimeOptions& o) { o.schedule.chunk_size = (1u << 20) + 1; }},
      {"slowdown", "0.5", [](RuntimeOptions& o) { o.host.slowdown = {1, 0.5}; }},
      {"slowdown has 3 values", "3", [](RuntimeOptions& o) { o.host.slowdown = {1, 1, 1}; }},
      {"threads_per_device", "-1", [](RuntimeOptions& o) { o.host.threads_per_device = -1; }},
      {"throughput_window", "0", [](RuntimeOptions& o) { o.schedule.throughput_window = 0; }},
      {"throughput_window", "101", [](RuntimeOptions& o) { o.schedule.throughput_window = 101; }},
      {"sim.sample_seconds", "2", [](RuntimeOptions& o) { o.devices = "sim:1,1", o.sim.sample_seconds = 2; }},
      {"sim.call_seconds", "-0.001", [](RuntimeOptions& o) { o.sim.call_seconds = -1e-3; }},
      {"sim.call_seconds", "nan", [nan](RuntimeOptions& o) { o.sim.call_seconds = nan; }},
      {"sim.bytes_per_sample", "-1", [](RuntimeOptions& o) { o.sim.bytes_per_sample = -1; }},
      {"sim.link_bw", "0", [](RuntimeOptions& o) { o.sim.link_bw = 0; }},
      {"sim.link_latency", "nan", [nan](RuntimeOptions& o) { o.sim.link_latency = nan; }},
      {"sim.allreduce_bytes", "-5", [](RuntimeOptions& o) { o.sim.allreduce_bytes = -5; }},
      {"sim.busbw", "0", [](RuntimeOptions& o) { o.sim.busbw = 0; }},
      {"placement_weights has 1 values", "1", [](RuntimeOptions& o) { o.schedule.placement = PlacementPolicy::kGiven, o.schedule.placement_weights = {1}; }},
      {"weight", "-1", [](RuntimeOptions& o) { o.schedule.placement = PlacementPolicy::kGiven, o.schedule.placement_weights = {1, -1}; }},
      {"lr", "0", [](RuntimeOptions& o) { o.optimizer.lr = 0; }},
      {"momentum", "1", [](RuntimeOptions& o) { o.optimizer.momentum = 1; }},
      {"beta1", "1", [](RuntimeOptions& o) { o.optimizer.beta1 = 1; }},
      {"beta2", "-0.1", [](RuntimeOptions& o) { o.optimizer.beta2 = -0.1f; }},
      {"eps", "0", [](RuntimeOptions& o) { o.optimizer.eps = 0; }},
      {"weight_decay", "1", [](RuntimeOptions& o) { o.optimizer.weight_decay = 1; }},
      {"in_flight", "0", [](RuntimeOptions& o) { o.gpu.in_flight = 0; }},
      {"in_flight", "17", [](RuntimeOptions& o) { o.gpu.in_flight = 17; }},
      {"sim.launch_lead", "-0.001", [](RuntimeOptions& o) { o.sim.launch_lead = -1e-3; }},
      {"sim.launch_lead", "nan", [nan](RuntimeOptions& o) { o.sim.launch_lead = nan; }},
      {"input_bytes", "2147483648", [](RuntimeOptions& o) { o.gpu.input_bytes = std::size_t{1} << 31; }},
      {"input_bytes", "16", [](RuntimeOptions& o) { o.gpu.input_bytes = 16; }},  // no gather function
      {"input_bytes = 0", "never be called", [](RuntimeOptions& o) { o.gpu.gather = [](std::uint32_t, std::byte*) {}; }},
      {"resident = 8 samples but input_bytes = 0", "no inputs to hold", [](RuntimeOptions& o) { o.gpu.resident = 8; }},
      {"resident = 8 with input_bytes = 6", "multiple of 4",
       [](RuntimeOptions& o) { o.gpu.resident = 8, o.gpu.input_bytes = 6, o.gpu.gather = [](std::uint32_t, std::byte*) {}; }},
      {"resident", "4294967297", [](RuntimeOptions& o) { o.gpu.resident = (std::size_t{1} << 32) + 1; }},
      {"placement_weights has 2 values", "ignored", [](RuntimeOptions& o) { o.schedule.placement_weights = {1, 2}; }},
      {"placement = throughput with policy = static", "auto",
       [](RuntimeOptions& o) { o.schedule.placement = PlacementPolicy::kThroughput, o.schedule.policy = SchedulePolicy::kStatic; }},
      {"placement = throughput with policy = central", "ignored",
       [](RuntimeOptions& o) { o.schedule.placement = PlacementPolicy::kThroughput, o.schedule.policy = SchedulePolicy::kCentral; }},
      {"stall_timeout", "0", [](RuntimeOptions& o) { o.stall_timeout = 0; }},
      {"stall_timeout", "100000", [](RuntimeOptions& o) { o.stall_timeout = 1e5; }},
      {"trace_path", "/nonexistent-dir/trace.json", [](RuntimeOptions& o) { o.trace_path = "/nonexistent-dir/trace.json"; }},
  };
  for (const Row& r : rows) {
    const std::string field = r.field;
    CAPTURE(field);
    RuntimeOptions o;
    o.devices = "cpu:2";
    r.set(o);
    std::string what;
    try {
      Runtime rt(o);
    } catch (const ConfigError& e) {
      what = e.what();
    }
    CAPTURE(what);
    CHECK(what.find(r.field) != std::string::npos);
    CHECK(what.find(r.value) != std::string::npos);
  }
  // The defaults are valid: the documented ranges include them.
  CHECK_NOTHROW(Runtime(RuntimeOptions{.devices = "cpu:2"}));
}

TEST_CASE("Config.AutoPlacementIsBySpeedWithStealingAndEqualWithout") {
  // The common case stays one designated initializer; placement auto becomes what the policy can use.
  Runtime steal({.devices = "cpu:2"});
  CHECK(steal.options().schedule.placement == PlacementPolicy::kThroughput);
  Runtime fixed({.devices = "cpu:2", .schedule = {.policy = SchedulePolicy::kStatic}});
  CHECK(fixed.options().schedule.placement == PlacementPolicy::kEqual);
  Runtime central({.devices = "cpu:2", .schedule = {.policy = SchedulePolicy::kCentral}});
  CHECK(central.options().schedule.placement == PlacementPolicy::kEqual);
}

namespace {

std::string refusal(RuntimeOptions o) {
  try {
    Runtime rt(std::move(o));
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("Config.Bf16OnTheWireIsRefusedWhereItWouldBeIgnored") {
  RuntimeOptions o{.devices = "cpu:2"};
  o.cluster.wire = WireFormat::kBfloat16;
  CHECK(refusal(o).find("cluster.wire = bf16 without a cluster") != std::string::npos);
  o.cluster.job = std::make_shared<testing::StubCluster>(0, 1, 1);  // enough for validate()
  o.schedule.deterministic = true;
  CHECK(refusal(o).find("cluster.wire = bf16 with deterministic = on") != std::string::npos);
  o.schedule.deterministic = false;
  o.devices = "cuda:0";
  CHECK(refusal(o).find("GPUs sum across ranks in NCCL's float") != std::string::npos);
}

TEST_CASE("Bf16.RoundsToNearestEvenKeepsNanAndInfinityAndBoundsTheSum") {
  CHECK(to_bf16(1.0f) == 0x3f80);
  CHECK(to_bf16(-2.0f) == 0xc000);
  CHECK(to_bf16(1.0f + 0x1p-8f) == 0x3f80);          // halfway, to the even 1.0
  CHECK(to_bf16(1.0f + 3 * 0x1p-8f) == 0x3f82);      // halfway, to the even 1 + 2^-6
  CHECK(to_bf16(1.0f + 0x1p-8f + 0x1p-20f) == 0x3f81);  // past halfway: up
  CHECK(from_bf16(to_bf16(0x1p-130f)) == 0x1p-130f);   // a subnormal that bfloat16 holds exactly
  CHECK(std::isnan(from_bf16(to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  CHECK(std::isnan(from_bf16(to_bf16(std::bit_cast<float>(0x7f800001U)))));  // a NaN whose payload is all below bf16's bits
  CHECK(from_bf16(to_bf16(std::numeric_limits<float>::infinity())) == std::numeric_limits<float>::infinity());
  CHECK(from_bf16(to_bf16(std::numeric_limits<float>::max())) == std::numeric_limits<float>::infinity());  // past bf16's largest
  CHECK(bf16_sum_bound(1) == doctest::Approx(1.0 / 255));
  CHECK(bf16_sum_bound(4) == doctest::Approx(4.0 / 252));
  // The default sum rounds each value and the sum: one rank's values come back as bfloat16's nearest.
  testing::StubCluster one(0, 1, 1);
  std::vector<float> v = {1.0f + 0x1p-8f + 0x1p-20f, 3.14159f, -1e-3f};
  one.allreduce_sum_bf16(v, {});
  for (float x : v) CHECK(from_bf16(to_bf16(x)) == x);
  CHECK(v[0] == 1.0f + 0x1p-7f);
  CHECK(std::abs(v[1] - 3.14159f) <= bf16_sum_bound(1) * 3.14159f);
}
