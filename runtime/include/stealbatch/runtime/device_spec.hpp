// Which devices a runtime drives, parsed from "cpu:4", "cuda:all", "cuda:0,1", "vgpu:64,16,16,16" or "sim:1,0.5,...".
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace stealbatch {

// kVgpu: one physical GPU (GPU 0) partitioned into parts of the given SM counts (CUDA green contexts), each part a
// device of its own: how an uneven set of GPUs is tested on a single one.
enum class DeviceKind { kCpu, kCuda, kSim, kVgpu };

// The parsed form of a device spec.
//   DeviceSpec s = parse_device_spec("cpu:4");        // four CPU devices sharing the machine's cores
//   DeviceSpec g = parse_device_spec("cuda:0,2");     // GPUs 0 and 2
//   DeviceSpec l = parse_device_spec("cuda:local");   // under mpirun: GPU k for the k-th rank of its node
//   DeviceSpec v = parse_device_spec("sim:1,1,0.5");  // three simulated devices of those relative speeds
//   DeviceSpec p = parse_device_spec("vgpu:64,16");   // GPU 0 as two parts of 64 and 16 SMs
//   DeviceSpec q = parse_device_spec("vgpu:4");       // GPU 0 as four equal parts of what it can partition
//   DeviceSpec r = parse_device_spec("vgpu:50%,25%,25%");  // ... as a half and two quarters of it
// The range of a simulated device's relative speed ("sim:S1,S2,..."): slower would make a step last for hours at the
// default 100 us a sample, faster is below the timer's resolution.
inline constexpr double kMinSimSpeed = 1e-3;
inline constexpr double kMaxSimSpeed = 1e6;

struct DeviceSpec {
  DeviceKind kind = DeviceKind::kCpu;
  std::vector<int> ids;        // kCuda: the GPU ordinals (empty with all_gpus); kVgpu: the SM count of each part
  bool all_gpus = false;       // kCuda: "cuda:all"
  bool local_gpu = false;      // kCuda: "cuda:local", one GPU: the rank's index among the ranks of its node (with a cluster)
  std::size_t count = 0;       // the number of devices (kCuda with all_gpus: 0 until the GPUs are counted)
  std::vector<double> speeds;  // kSim: relative speeds, one per device, in [kMinSimSpeed, kMaxSimSpeed]
  // kVgpu: how the parts are asked for. kSms: ids holds each part's SM count ("vgpu:64,16,16,16"); kEqual: `count`
  // equal parts of what the GPU can partition ("vgpu:4"); kShares: `shares`, each part's share of it ("vgpu:50%,25%,25%",
  // fractions in (0, 1] that sum to at most 1). The GPU's partitionable groups turn the last two into SM counts. A
  // single number is a count of parts, not one part's SMs: one part of S SMs is vgpu:P% or two counts.
  enum class Parts { kSms, kEqual, kShares } parts = Parts::kSms;
  std::vector<double> shares;
  std::string text;            // the spec as given, for messages
};

// Throws ConfigError naming the field ("devices"), the value and what is valid.
DeviceSpec parse_device_spec(std::string_view spec);

// "6.6,6.6,1,1": one factor >= 1 per device (1 = full speed). An empty string means all 1. Throws ConfigError
// naming the field ("slowdown") for a malformed list, a value below 1 or not finite, or a length other than `devices`.
std::vector<double> parse_slowdown_list(std::string_view list, std::size_t devices);

// Splits on commas and parses each piece as a finite double; throws ConfigError naming `field` on failure.
std::vector<double> parse_number_list(std::string_view list, std::string_view field);

}  // namespace stealbatch
