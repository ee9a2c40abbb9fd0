// Runtime::save_checkpoint and load_checkpoint: the runtime's state in a checkpoint file (checkpoint/), checked
// whole against this runtime before any of it is applied.
#include "step/runtime_impl.hpp"

#include <stealbatch/checkpoint/checkpoint_file.hpp>
#include <stealbatch/error.hpp>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>

namespace stealbatch {

namespace {

constexpr const char* kFormatKey = "stealbatch.format";
constexpr const char* kFormatVersion = "1";
constexpr std::string_view kOwnPrefix = "stealbatch.";
constexpr std::string_view kOptimizerPrefix = "optimizer.";

std::string exact(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

const char* kind_name(OptimizerKind k) { return k == OptimizerKind::kAdam ? "adam" : "sgd"; }

// The optimizer settings a checkpoint records; all but lr must match on load.
struct Setting {
  const char* key;
  float OptimizerOptions::*field;
};
constexpr Setting kSettings[] = {{"stealbatch.optimizer.momentum", &OptimizerOptions::momentum},
                                 {"stealbatch.optimizer.beta1", &OptimizerOptions::beta1},
                                 {"stealbatch.optimizer.beta2", &OptimizerOptions::beta2},
                                 {"stealbatch.optimizer.eps", &OptimizerOptions::eps},
                                 {"stealbatch.optimizer.weight_decay", &OptimizerOptions::weight_decay}};

[[noreturn]] void fail(CheckpointError::Reason r, const std::string& source, const std::string& what) { throw CheckpointError(r, source, what); }

const std::string& need(const SafetensorsMetadata& meta, const char* key, const std::string& source) {
  const auto it = meta.find(key);
  if (it == meta.end()) fail(CheckpointError::Reason::kFormat, source, std::string("its metadata has no '") + key + "'");
  return it->second;
}

double number(const SafetensorsMetadata& meta, const char* key, const std::string& source) {
  const std::string& text = need(meta, key, source);
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || errno == ERANGE) {
    fail(CheckpointError::Reason::kFormat, source, std::string("metadata '") + key + "' = '" + text + "' is not a number");
  }
  return v;
}

std::vector<double> number_list(const std::string& text) {
  std::vector<double> out;
  const char* p = text.c_str();
  while (*p) {
    char* end = nullptr;
    const double v = std::strtod(p, &end);
    if (end == p) return {};
    out.push_back(v);
    p = *end == ',' ? end + 1 : end;
  }
  return out;
}

std::string names_of(const std::vector<std::unique_ptr<Device>>& devices) {
  std::string out;
  for (const auto& d : devices) out += (out.empty() ? "" : ",") + d->name();
  return out;
}

std::string shape_text(const std::vector<std::uint64_t>& shape) {
  std::string out = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

// Everything a load applies, read and checked in full before any of it is.
struct Staged {
  std::vector<float> params;
  OptimizerState state;
  float lr = 0;
  std::vector<double> speeds;  // empty: not restored (other devices, or a multi-process run)
  std::vector<int> shifts;     // deterministic mode's fixed-point shifts; empty: not in the file
  CheckpointMetadata trainer;
};

// Deterministic mode's shifts (stealbatch.fixed_shifts): one integer a tensor, kNoExponent for one not set yet.
std::vector<int> stage_shifts(const SafetensorsMetadata& meta, std::size_t tensors, const std::string& source) {
  const auto it = meta.find("stealbatch.fixed_shifts");
  if (it == meta.end()) return {};
  const std::vector<double> v = number_list(it->second);
  std::vector<int> out;
  for (double x : v) {
    const bool unset = x == static_cast<double>(detail::kNoExponent);
    if (!unset && !(x >= -4096 && x <= 4096 && x == std::floor(x))) break;
    out.push_back(unset ? detail::kNoExponent : static_cast<int>(x));
  }
  if (out.size() != tensors || v.size() != tensors) {
    fail(CheckpointError::Reason::kFormat, source,
         "stealbatch.fixed_shifts = '" + it->second + "' is not one shift (an integer) for each of the " + std::to_string(tensors) + " tensors");
  }
  return out;
}

void check_optimizer(const SafetensorsMetadata& meta, const OptimizerOptions& mine, const std::string& source) {
  const std::string& kind = need(meta, "stealbatch.optimizer", source);
  if (kind != kind_name(mine.kind)) {
    fail(CheckpointError::Reason::kOptimizer, source, "its optimizer is " + kind + ", this runtime's is " + kind_name(mine.kind));
  }
  for (const Setting& s : kSettings) {
    const double saved = number(meta, s.key, source);
    if (static_cast<float>(saved) != mine.*(s.field)) {
      fail(CheckpointError::Reason::kOptimizer, source,
           std::string(s.key + kOwnPrefix.size()) + " is " + exact(saved) + " in the file, " + exact(mine.*(s.field)) + " in this runtime");
    }
  }
}

void check_layout(const CheckpointFile& file, const ParameterLayout& layout, OptimizerKind kind) {
  const std::string& source = file.source();
  std::size_t params = 0;
  for (const SafetensorsTensor& t : file.contents().tensors()) {
    const bool optimizer = std::string_view(t.name).starts_with(kOptimizerPrefix);
    params += optimizer ? 0 : 1;
    std::string base = optimizer ? t.name.substr(kOptimizerPrefix.size()) : t.name;
    if (optimizer) {
      const bool m = base.ends_with(".m"), v = base.ends_with(".v");
      if (!m && !v) fail(CheckpointError::Reason::kFormat, source, "tensor '" + t.name + "' is neither an optimizer's .m nor its .v");
      if (v && kind != OptimizerKind::kAdam) fail(CheckpointError::Reason::kOptimizer, source, "tensor '" + t.name + "' is Adam's, this runtime's optimizer is sgd");
      base.resize(base.size() - 2);
    }
    try {
      const TensorView& mine = layout.tensor(layout.index_of(base));
      const std::vector<std::uint64_t> want(mine.shape.begin(), mine.shape.end());
      if (t.shape != want) {
        fail(CheckpointError::Reason::kLayout, source, "tensor '" + t.name + "' has shape " + shape_text(t.shape) + ", the layout's '" + base + "' is " + shape_text(want));
      }
    } catch (const ConfigError&) {
      fail(CheckpointError::Reason::kLayout, source, "tensor '" + t.name + "' is not in this runtime's parameter layout");
    }
  }
  if (params != layout.tensor_count()) {
    fail(CheckpointError::Reason::kLayout, source,
         "it holds " + std::to_string(params) + " parameter tensors, this runtime's layout " + std::to_string(layout.tensor_count()));
  }
}

// What a runtime's checkpoint is checked against: its options and layout, and (one process) its devices, whose saved
// speeds it takes when they are the same devices.
struct StageTarget {
  const RuntimeOptions& options;
  const ParameterLayout& layout;
  const std::vector<std::unique_ptr<Device>>* devices;  // null across ranks
};

Staged stage(const CheckpointFile& file, const StageTarget& m) {
  const std::string& source = file.source();
  const SafetensorsMetadata& meta = file.contents().metadata();
  const std::string& version = need(meta, kFormatKey, source);
  if (version != kFormatVersion) fail(CheckpointError::Reason::kFormat, source, "format version " + version + "; this build reads " + kFormatVersion);
  check_optimizer(meta, m.options.optimizer, source);
  check_layout(file, m.layout, m.options.optimizer.kind);

  Staged s;
  const bool adam = m.options.optimizer.kind == OptimizerKind::kAdam;
  s.params.reserve(m.layout.size());
  s.state.first.reserve(m.layout.size());
  if (adam) s.state.second.reserve(m.layout.size());
  for (const TensorView& t : m.layout.tensors()) {
    const auto append = [&](std::vector<float>& to, const std::string& name) {
      const std::vector<float> v = file.floats(name, t.size);
      to.insert(to.end(), v.begin(), v.end());
    };
    append(s.params, t.name);
    append(s.state.first, std::string(kOptimizerPrefix) + t.name + ".m");
    if (adam) append(s.state.second, std::string(kOptimizerPrefix) + t.name + ".v");
  }
  const double steps = number(meta, "stealbatch.optimizer.steps", source);
  if (!(steps >= 0 && steps <= 1e18) || steps != static_cast<double>(static_cast<std::uint64_t>(steps))) {  // NaN fails the first test
    fail(CheckpointError::Reason::kFormat, source, "stealbatch.optimizer.steps = " + exact(steps) + " is not a step count");
  }
  s.state.steps = static_cast<std::uint64_t>(steps);
  const double lr = number(meta, "stealbatch.optimizer.lr", source);
  OptimizerOptions check = m.options.optimizer;
  check.lr = static_cast<float>(lr);
  try {
    validate(check);
  } catch (const ConfigError& e) {
    fail(CheckpointError::Reason::kOptimizer, source, e.what());
  }
  s.lr = check.lr;
  // The devices' speeds, when they are the same devices: a resumed run is then balanced from its first step.
  const auto devices = meta.find("stealbatch.devices"), speeds = meta.find("stealbatch.speeds");
  if (m.devices != nullptr && devices != meta.end() && speeds != meta.end() && devices->second == names_of(*m.devices)) {
    s.speeds = number_list(speeds->second);
    if (s.speeds.size() != m.devices->size()) s.speeds.clear();
  }
  s.shifts = stage_shifts(meta, m.layout.tensor_count(), source);
  for (const auto& [k, v] : meta) {
    if (!std::string_view(k).starts_with(kOwnPrefix)) s.trainer.emplace(k, v);
  }
  return s;
}

// Across ranks: whether every rank got here without an error and, for a load, read the same bytes (the same crc32
// on every rank); false on all of them when one did not.
bool all_ranks_ok(Cluster* cluster, bool ok, std::uint32_t crc = 0) {
  if (!cluster || cluster->size() == 1) return ok;
  // The crc's halves and their squares: equal on every rank <=> each half's variance is 0. Below 2^16, the sums
  // are exact in doubles.
  const double lo = crc & 0xffffu, hi = crc >> 16;
  double v[5] = {ok ? 0.0 : 1.0, lo, lo * lo, hi, hi * hi};
  cluster->allreduce_sum(v);
  const double n = cluster->size();
  return v[0] == 0 && v[2] * n == v[1] * v[1] && v[4] * n == v[3] * v[3];
}

// The tensors a checkpoint holds: each parameter under its layout name, then the optimizer's state (m, and v for Adam).
std::vector<CheckpointTensor> checkpoint_tensors(const ParameterLayout& layout, std::span<const float> params, const OptimizerState& state, bool adam) {
  std::vector<CheckpointTensor> tensors;
  for (const TensorView& t : layout.tensors()) {
    const std::vector<std::uint64_t> shape(t.shape.begin(), t.shape.end());
    tensors.push_back({t.name, shape, params.subspan(t.offset, t.size)});
  }
  for (const TensorView& t : layout.tensors()) {
    const std::vector<std::uint64_t> shape(t.shape.begin(), t.shape.end());
    tensors.push_back({std::string(kOptimizerPrefix) + t.name + ".m", shape, std::span<const float>(state.first).subspan(t.offset, t.size)});
    if (adam) tensors.push_back({std::string(kOptimizerPrefix) + t.name + ".v", shape, std::span<const float>(state.second).subspan(t.offset, t.size)});
  }
  return tensors;
}

}  // namespace

void Runtime::save_checkpoint(const std::filesystem::path& path, const CheckpointMetadata& metadata) const {
  if (m->layout.size() == 0) throw ConfigError("save_checkpoint: no parameters registered; call register_parameters() first");
  SafetensorsMetadata meta;
  for (const auto& [k, v] : metadata) {
    if (std::string_view(k).starts_with(kOwnPrefix)) throw ConfigError("save_checkpoint: metadata key '" + k + "': keys beginning with 'stealbatch.' are the runtime's");
    meta.emplace(k, v);
  }
  std::vector<float> params(m->layout.size());
  OptimizerState state;
  if (m->dev.host) {
    params.assign(m->shared.live().begin(), m->shared.live().end());
    const auto first = m->shared.optimizer->first_moment(), second = m->shared.optimizer->second_moment();
    state = {{first.begin(), first.end()}, {second.begin(), second.end()}, m->shared.optimizer->steps()};
  } else {
    // Device 0's replica, on its worker (a GPU's context is bound there); every replica holds the same values.
    m->sched->broadcast([&](std::size_t w) {
      if (w != 0) return;
      m->dev.devices[0]->copy_params(params);
      state = m->dev.devices[0]->optimizer_state();
    });
  }
  const OptimizerOptions& o = m->options.optimizer;
  meta[kFormatKey] = kFormatVersion;
  meta["stealbatch.optimizer"] = kind_name(o.kind);
  meta["stealbatch.optimizer.lr"] = exact(o.lr);
  for (const Setting& s : kSettings) meta[s.key] = exact(o.*(s.field));
  meta["stealbatch.optimizer.steps"] = std::to_string(state.steps);
  meta["stealbatch.devices"] = names_of(m->dev.devices);
  std::string speeds;
  for (double v : m->speed.estimates()) speeds += (speeds.empty() ? "" : ",") + exact(v);
  meta["stealbatch.speeds"] = speeds;
  if (m->cluster) meta["stealbatch.ranks"] = std::to_string(m->cluster->size());
  if (m->exact) {  // a resumed run rounds its next step's cells as this one would have
    std::string shifts;
    for (int v : m->exact.shifts()) shifts += (shifts.empty() ? "" : ",") + std::to_string(v);
    meta["stealbatch.fixed_shifts"] = shifts;
  }

  const std::vector<CheckpointTensor> tensors = checkpoint_tensors(m->layout, params, state, o.kind == OptimizerKind::kAdam);
  // Across ranks, rank 0 writes (every rank holds the same values) and the others learn whether it could.
  std::exception_ptr error;
  if (!m->cluster || m->cluster->rank() == 0) {
    try {
      write_checkpoint_file(path, tensors, std::move(meta));
    } catch (...) {
      error = std::current_exception();
    }
  }
  const bool ok = all_ranks_ok(m->cluster.job.get(), error == nullptr);
  if (error) std::rethrow_exception(error);
  if (!ok) throw CheckpointError(CheckpointError::Reason::kIo, path.string(), "rank 0 could not write it");
}

CheckpointMetadata Runtime::load_checkpoint(const std::filesystem::path& path) {
  if (m->layout.size() == 0) throw ConfigError("load_checkpoint: no parameters registered; call register_parameters() first");
  std::exception_ptr error;
  std::optional<Staged> staged;
  std::uint32_t crc = 0;
  try {
    const CheckpointFile file = CheckpointFile::read(path);
    staged = stage(file, StageTarget{m->options, m->layout, m->cluster ? nullptr : &m->dev.devices});
    crc = file.crc32();
  } catch (...) {
    error = std::current_exception();
  }
  // Across ranks: every rank read it, and they all read the same bytes, or none applies it.
  const bool ok = all_ranks_ok(m->cluster.job.get(), error == nullptr, crc);
  if (error) std::rethrow_exception(error);
  if (!ok) throw CheckpointError(CheckpointError::Reason::kIo, path.string(), "another rank could not load it, or read other bytes under this path");

  Staged& s = *staged;
  if (m->dev.host) {
    m->shared.assign(s.params);
    m->shared.optimizer->restore(s.state.first, s.state.second, s.state.steps);
  } else {
    m->sched->broadcast([&](std::size_t d) { m->dev.devices[d]->load_replica(s.params, s.state); });
  }
  m->options.optimizer.lr = s.lr;
  m->lr_pending = true;
  // The steps are counted on from the saved run's: a resumed run's messages ("in step 17") name the step its
  // trainer and its checkpoints count, not the process's first.
  m->steps = s.state.steps;
  if (m->cluster) m->cluster.steps = s.state.steps;  // the replicas take it in the next update, as after set_learning_rate()
  if (!s.speeds.empty()) {
    for (std::size_t d = 0; d < s.speeds.size(); ++d) {
      if (s.speeds[d] > 0) m->speed.history[d] = {s.speeds[d]};
    }
  }
  // Deterministic mode: the saved shifts; a file without them (saved without the mode) leaves them to be found, as
  // at a first step.
  if (m->exact) m->exact.restore(s.shifts.empty() ? std::vector<int>(m->layout.tensor_count(), detail::kNoExponent) : s.shifts);
  return s.trainer;
}

}  // namespace stealbatch
