// validate(RuntimeOptions): every option's range, checked once, before anything is built.
#include <stealbatch/runtime/runtime.hpp>

#include <cmath>
#include <string>

namespace stealbatch {

namespace {

std::string text(double v) {
  std::string s = std::to_string(v);
  return s;
}

void check(const char* field, double v, double lo, double hi, const char* unit = "") {
  if (!std::isfinite(v) || v < lo || v > hi) {
    throw ConfigError(std::string(field) + " = " + text(v) + unit + "; valid range is [" + text(lo) + ", " + text(hi) + "]");
  }
}

void check_size(const char* field, std::size_t v, std::size_t lo, std::size_t hi, const std::string& also = "") {
  if (v < lo || v > hi) {
    throw ConfigError(std::string(field) + " = " + std::to_string(v) + "; valid range is [" + std::to_string(lo) + ", " + std::to_string(hi) + "]" + also);
  }
}

}  // namespace

// Each group checks its own fields; settings that nothing would read are refused, not ignored.
void validate(const ScheduleOptions& o) {
  if (o.chunk_size > (std::size_t{1} << 20)) check_size("chunk_size", o.chunk_size, 1, std::size_t{1} << 20, ", or 0 for sizes the runtime measures");
  check_size("throughput_window", o.throughput_window, 1, 100);
  if (o.placement == PlacementPolicy::kThroughput && o.policy != SchedulePolicy::kSteal) {
    throw ConfigError(std::string("placement = throughput with policy = ") + (o.policy == SchedulePolicy::kStatic ? "static" : "central") +
                      ": without stealing every step splits equally (as DDP does), so it would be ignored; leave placement = auto, or use "
                      "previous_step (each step resized to the last one's speeds) or given");
  }
  if (o.placement == PlacementPolicy::kPacked && o.policy == SchedulePolicy::kCentral) {
    throw ConfigError("placement = packed with policy = central: the central queue ignores any placement; use static (the packer) or steal");
  }
  if (!o.placement_weights.empty() && o.placement != PlacementPolicy::kGiven) {
    throw ConfigError("placement_weights has " + std::to_string(o.placement_weights.size()) +
                      " values but placement is not given: they would be ignored; set placement = given, or leave them empty");
  }
  if (o.deterministic && o.placement == PlacementPolicy::kPacked) {
    throw ConfigError("placement = packed with deterministic = on: the packer orders the batch's samples by the device count, and deterministic "
                      "cells are cut in the batch's own order; use placement = auto (stealing corrects what the placement misses)");
  }
  if (o.placement == PlacementPolicy::kGiven) {
    if (o.placement_weights.empty()) throw ConfigError("placement = given but placement_weights is empty; give one weight >= 0 per device");
    (void)place_proportional(1, o.placement_weights);  // finite, >= 0, not all 0
  }
}

void validate(const HostOptions& o) {
  for (std::size_t i = 0; i < o.slowdown.size(); ++i) {
    const std::string field = "slowdown[" + std::to_string(i) + "]";
    check(field.c_str(), o.slowdown[i], 1, 1000);
  }
  if (o.threads_per_device < 0 || o.threads_per_device > 1024) {
    throw ConfigError("threads_per_device = " + std::to_string(o.threads_per_device) + "; valid range is [0, 1024] (0 = cores / devices)");
  }
}

void validate(const GpuOptions& o) {
  check_in_flight(o.in_flight);
  check_size("input_bytes", o.input_bytes, 0, std::size_t{1} << 30);
  if (o.input_bytes > 0 && !o.gather) throw ConfigError("input_bytes = " + std::to_string(o.input_bytes) + " but no gather function is set");
  if (o.gather && o.input_bytes == 0) {
    throw ConfigError("a gather function is set but input_bytes = 0: no inputs travel, so it would never be called; set input_bytes");
  }
  check_size("resident", o.resident, 0, std::size_t{1} << 32);
  if (o.resident > 0 && o.input_bytes == 0) throw ConfigError("resident = " + std::to_string(o.resident) + " samples but input_bytes = 0: no inputs to hold");
  if (o.resident > 0 && o.input_bytes % 4 != 0) {
    throw ConfigError("resident = " + std::to_string(o.resident) + " with input_bytes = " + std::to_string(o.input_bytes) +
                      ": the device gathers rows in 4-byte words; give input_bytes a multiple of 4");
  }
}

void validate(const SimOptions& o) {
  check("sim.sample_seconds", o.sample_seconds, 0, 1, " s");
  check("sim.call_seconds", o.call_seconds, 0, 1, " s");
  check("sim.bytes_per_sample", o.bytes_per_sample, 0, 1e9);
  check("sim.link_bw", o.link_bw, 1, 1e15);
  check("sim.link_latency", o.link_latency, 0, 1, " s");
  check("sim.allreduce_bytes", o.allreduce_bytes, 0, 1e12);
  check("sim.busbw", o.busbw, 1, 1e15);
  check("sim.launch_lead", o.launch_lead, 0, 1, " s");
}

void validate(const ClusterOptions& o) {
  if (o.probes > (std::size_t{1} << 20)) throw ConfigError("cluster.probes = " + std::to_string(o.probes) + "; valid range is [0, 1048576] (0: auto)");
  if (!std::isfinite(o.heartbeat_timeout) || o.heartbeat_timeout <= 0 || o.heartbeat_timeout > 86400) {
    throw ConfigError("heartbeat_timeout = " + text(o.heartbeat_timeout) + " s; valid range is (0, 86400]");
  }
}

void validate(const RuntimeOptions& o) {
  if (!o.devices.empty()) (void)parse_device_spec(o.devices);
  validate(o.schedule);
  validate(o.optimizer);
  validate(o.host);
  validate(o.gpu);
  validate(o.sim);
  validate(o.cluster);
  if (!std::isfinite(o.stall_timeout) || o.stall_timeout <= 0 || o.stall_timeout > 86400) {
    throw ConfigError("stall_timeout = " + text(o.stall_timeout) + " s; valid range is (0, 86400]");
  }
  if (o.schedule.deterministic && o.host.threads_per_device > 1) {
    throw ConfigError("threads_per_device = " + std::to_string(o.host.threads_per_device) +
                      " with deterministic = on: each chunk runs on one thread, so that its gradient does not depend on a device's thread count; "
                      "leave it 0, or use more devices (cpu:N)");
  }
  if (o.cluster.job) {  // what a job across ranks cannot do
    if (o.schedule.policy == SchedulePolicy::kCentral) throw ConfigError("policy = central with a cluster: across ranks the policy is steal or static");
    if (o.on_device_failure == OnDeviceFailure::kExclude) {
      throw ConfigError("on_device_failure = exclude with a cluster: across ranks a lost device fails the step on every rank (fail)");
    }
    if (o.schedule.placement == PlacementPolicy::kGiven) throw ConfigError("placement = given with a cluster: across ranks shares follow measured speeds");
  }
  if (o.cluster.wire == WireFormat::kBfloat16) {
    if (!o.cluster.job) throw ConfigError("cluster.wire = bf16 without a cluster: one process sends no gradient over a wire; leave it float32");
    if (o.schedule.deterministic) {
      throw ConfigError("cluster.wire = bf16 with deterministic = on: deterministic mode sums exactly in fixed point across ranks; use one or the other");
    }
    // Empty devices (the runtime's default, every GPU else CPUs) are known once the runtime has filled them in.
    const DeviceKind kind = o.devices.empty() ? DeviceKind::kCpu : parse_device_spec(o.devices).kind;
    if (kind == DeviceKind::kCuda || kind == DeviceKind::kVgpu) {
      throw ConfigError("cluster.wire = bf16 with devices = '" + o.devices + "': GPUs sum across ranks in NCCL's float; bf16 on the wire is for CPU and simulated devices");
    }
  }
}

}  // namespace stealbatch
