// Parsing of device specs and per-device number lists, with errors that name the field, the value and the rule.
#include <stealbatch/error.hpp>
#include <stealbatch/runtime/device_spec.hpp>

#include <charconv>
#include <cmath>
#include <cstdio>
#include <string>

namespace stealbatch {

namespace {

// Appends the pieces of a message.
template <class... Parts>
std::string cat(const Parts&... parts) {
  std::string s;
  (s.append(parts), ...);
  return s;
}

[[noreturn]] void bad(std::string_view field, std::string_view value, std::string_view rule) {
  throw ConfigError(cat(field, " = '", value, "': ", rule));
}

std::vector<std::string_view> split(std::string_view s) {
  std::vector<std::string_view> out;
  for (;;) {
    const auto comma = s.find(',');
    out.push_back(s.substr(0, comma));
    if (comma == std::string_view::npos) return out;
    s.remove_prefix(comma + 1);
  }
}

bool parse_int(std::string_view s, long long& v) {
  const auto r = std::from_chars(s.data(), s.data() + s.size(), v);
  return !s.empty() && r.ec == std::errc() && r.ptr == s.data() + s.size();
}

}  // namespace

std::vector<double> parse_number_list(std::string_view list, std::string_view field) {
  std::vector<double> out;
  for (std::string_view piece : split(list)) {
    double v = 0;
    const auto r = std::from_chars(piece.data(), piece.data() + piece.size(), v);
    if (piece.empty() || r.ec != std::errc() || r.ptr != piece.data() + piece.size()) {
      bad(field, list, cat("'", piece, "' is not a number; expected a comma-separated list of numbers"));
    }
    if (!std::isfinite(v)) bad(field, list, cat("'", piece, "' is not a finite number; expected a comma-separated list of finite numbers"));
    out.push_back(v);
  }
  return out;
}

namespace {

constexpr std::string_view kDevicesRule =
    "expected cpu:N (1..256), cuda:all, cuda:local, cuda:I[,J...], vgpu:N (N equal parts), vgpu:SM1,SM2[,...] (SM counts >= 1), "
    "vgpu:P1%[,P2%...] (shares) or sim:S1[,S2...] (speeds in [0.001, 1e+06])";

// cuda:all, cuda:local or cuda:I[,J...]; `spec` is the whole text, for messages.
void parse_cuda(std::string_view spec, std::string_view rest, DeviceSpec& out) {
  out.kind = DeviceKind::kCuda;
  if (rest == "all") {
    out.all_gpus = true;
  } else if (rest == "local") {
    out.local_gpu = true;  // the GPU of this rank's place on its node (a cluster resolves it)
    out.count = 1;
  } else {
    for (std::string_view piece : split(rest)) {
      long long id = 0;
      if (!parse_int(piece, id) || id < 0 || id > 1023) bad("devices", spec, kDevicesRule);
      for (int seen : out.ids) {
        if (seen == id) bad("devices", spec, cat("GPU ", std::to_string(id), " is listed twice"));
      }
      out.ids.push_back(static_cast<int>(id));
    }
    out.count = out.ids.size();
  }
}

// vgpu:N, vgpu:SM1,SM2[,...] or vgpu:P1%[,P2%...].
void parse_vgpu(std::string_view spec, std::string_view rest, DeviceSpec& out) {
  out.kind = DeviceKind::kVgpu;
  const std::vector<std::string_view> pieces = split(rest);
  if (pieces.size() > 64) bad("devices", spec, "at most 64 virtual GPUs");
  const bool shares = !pieces.empty() && !pieces.front().empty() && pieces.front().back() == '%';
  for (std::string_view piece : pieces) {
    if (shares) {
      double pct = 0;
      const std::string_view num = piece.empty() || piece.back() != '%' ? std::string_view{} : piece.substr(0, piece.size() - 1);
      const auto r = std::from_chars(num.data(), num.data() + num.size(), pct);
      if (num.empty() || r.ec != std::errc() || r.ptr != num.data() + num.size() || !(pct > 0 && pct <= 100)) {
        bad("devices", spec, cat("'", piece, "': shares are percentages in (0, 100], each with its %, as vgpu:50%,25%,25%"));
      }
      out.shares.push_back(pct / 100);
      continue;
    }
    long long sms = 0;
    if (!parse_int(piece, sms) || sms < 1 || sms > 100000) bad("devices", spec, kDevicesRule);
    out.ids.push_back(static_cast<int>(sms));
  }
  if (shares) {
    out.parts = DeviceSpec::Parts::kShares;
    double sum = 0;
    for (double f : out.shares) sum += f;
    if (sum > 1 + 1e-9) bad("devices", spec, cat("the shares add up to ", std::to_string(std::lround(sum * 100)), "%; at most 100%"));
    out.count = out.shares.size();
  } else if (out.ids.size() == 1) {
    out.parts = DeviceSpec::Parts::kEqual;  // vgpu:N: N equal parts
    if (out.ids.front() > 64) bad("devices", spec, "at most 64 virtual GPUs");
    out.count = static_cast<std::size_t>(out.ids.front());
    out.ids.clear();
  } else {
    out.count = out.ids.size();
  }
}

// sim:S1[,S2...].
void parse_sim(std::string_view spec, std::string_view rest, DeviceSpec& out) {
  out.kind = DeviceKind::kSim;
  try {
    out.speeds = parse_number_list(rest, "devices");
  } catch (const ConfigError&) {  // its words name the list alone: these name the whole spec
    char rule[96];
    std::snprintf(rule, sizeof rule, "simulated speeds must be finite numbers in [%g, %g], comma-separated", kMinSimSpeed, kMaxSimSpeed);
    bad("devices", spec, rule);
  }
  for (double s : out.speeds) {
    // A speed of 1e-9 would make a step last for days, and 1e-300 overflows the simulated chunk's duration.
    if (!(s >= kMinSimSpeed && s <= kMaxSimSpeed)) {
      char range[64];
      std::snprintf(range, sizeof range, "simulated speeds must lie in [%g, %g]", kMinSimSpeed, kMaxSimSpeed);
      bad("devices", spec, range);
    }
  }
  if (out.speeds.size() > 4096) bad("devices", spec, "at most 4096 simulated devices");
  out.count = out.speeds.size();
}

}  // namespace

DeviceSpec parse_device_spec(std::string_view spec) {
  DeviceSpec out;
  out.text = std::string(spec);
  const auto colon = spec.find(':');
  if (colon == std::string_view::npos) bad("devices", spec, kDevicesRule);
  const std::string_view kind = spec.substr(0, colon), rest = spec.substr(colon + 1);
  if (kind == "cpu") {
    long long n = 0;
    if (!parse_int(rest, n) || n < 1 || n > 256) bad("devices", spec, kDevicesRule);
    out.kind = DeviceKind::kCpu;
    out.count = static_cast<std::size_t>(n);
  } else if (kind == "cuda") {
    parse_cuda(spec, rest, out);
  } else if (kind == "vgpu") {
    parse_vgpu(spec, rest, out);
  } else if (kind == "sim") {
    parse_sim(spec, rest, out);
  } else {
    bad("devices", spec, kDevicesRule);
  }
  return out;
}

std::vector<double> parse_slowdown_list(std::string_view list, std::size_t devices) {
  if (list.empty()) return std::vector<double>(devices, 1.0);
  std::vector<double> f = parse_number_list(list, "slowdown");
  if (f.size() != devices) {
    bad("slowdown", list, cat("has ", std::to_string(f.size()), " values; expected one per device (", std::to_string(devices), ")"));
  }
  for (double x : f) {
    if (x < 1.0 || x > 1000.0) bad("slowdown", list, "every factor must be in [1, 1000] (1 = full speed)");
  }
  return f;
}

}  // namespace stealbatch
