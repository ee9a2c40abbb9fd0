// Step-report arithmetic, the dashboard text and the Chrome trace writer.
#include <stealbatch/error.hpp>
#include <stealbatch/runtime/telemetry.hpp>

#include <boost/lockfree/spsc_queue.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <string>

namespace stealbatch {

namespace {

// Ordered: an event's fields stay in the order they are written (name, cat, ph, pid, tid, ts, dur), easier to read.
using Json = nlohmann::ordered_json;

Json thread_name(int pid, std::size_t tid, const std::string& name) {
  return Json{{"name", "thread_name"}, {"ph", "M"}, {"pid", pid}, {"tid", tid}, {"args", {{"name", name}}}};
}

// Writes one event of the traceEvents array on a line of its own, dumped whole by nlohmann: a device name with
// quotes, backslashes or control characters is escaped, and bytes that are not UTF-8 become U+FFFD rather than an
// exception.
void emit(std::ostream& out, bool& first, const Json& event) {
  out << (first ? "" : ",\n") << event.dump(-1, ' ', false, Json::error_handler_t::replace);
  first = false;
}

}  // namespace

struct TraceWriter::Queue {
  boost::lockfree::spsc_queue<TraceEvent> events{1 << 16};
};

StepReport accumulate(std::span<const StepReport> steps) {
  StepReport sum;
  for (const StepReport& s : steps) {
    sum.step = std::max(sum.step, s.step);
    sum.step_s += s.step_s, sum.chunks_s += s.chunks_s, sum.reduce_s += s.reduce_s, sum.optimizer_s += s.optimizer_s;
    sum.samples += s.samples, sum.chunks += s.chunks, sum.steals += s.steals, sum.bytes_moved += s.bytes_moved;
    sum.loss += s.loss * static_cast<double>(s.samples);
    sum.ranks = std::max(sum.ranks, s.ranks), sum.remote_chunks += s.remote_chunks, sum.remote_steals += s.remote_steals;
    sum.redone += s.redone;
    if (sum.devices.size() < s.devices.size()) sum.devices.resize(s.devices.size());
    for (std::size_t d = 0; d < s.devices.size(); ++d) {
      DeviceReport& a = sum.devices[d];
      const DeviceReport& b = s.devices[d];
      a.name = b.name;
      a.busy_s += b.busy_s, a.idle_s += b.idle_s, a.barrier_wait_s += b.barrier_wait_s, a.compute_s += b.compute_s;
      a.chunks_run += b.chunks_run, a.chunks_stolen += b.chunks_stolen, a.samples += b.samples, a.cost += b.cost;
      a.chunk_samples = b.chunk_samples;  // the latest step's
    }
  }
  if (sum.samples > 0) sum.loss /= static_cast<double>(sum.samples);
  for (DeviceReport& d : sum.devices) d.utilization = sum.step_s > 0 ? d.busy_s / sum.step_s : 0;
  return sum;
}

double ideal_seconds(const StepReport& step, std::span<const double> slowdown) {
  double work = 0, speed = 0;
  for (std::size_t d = 0; d < step.devices.size(); ++d) {
    const double factor = d < slowdown.size() ? slowdown[d] : 1.0;
    work += step.devices[d].compute_s / factor, speed += 1.0 / factor;
  }
  return (speed > 0 ? work / speed : 0) + step.reduce_s + step.optimizer_s;
}

std::string format_dashboard(const StepReport& r, const std::string& title) {
  constexpr int kBar = 20;
  std::string out;
  char line[256];
  std::snprintf(line, sizeof line, "+-- %s: %llu steps, %.3f s, %llu samples, %llu chunks, %llu stolen\n", title.c_str(),
                static_cast<unsigned long long>(r.step), r.step_s, static_cast<unsigned long long>(r.samples),
                static_cast<unsigned long long>(r.chunks), static_cast<unsigned long long>(r.steals));
  out += line;
  if (r.redone > 0) {
    std::snprintf(line, sizeof line, "| deterministic: %u step(s) run twice (a first step finds the fixed-point scale; later ones, gradients that grew or shrank 256-fold)\n",
                  static_cast<unsigned>(r.redone));
    out += line;
  }
  if (r.ranks > 1) {
    std::snprintf(line, sizeof line, "| ranks: %zu, %llu chunks ran on another rank (%llu remote steals)\n", r.ranks,
                  static_cast<unsigned long long>(r.remote_chunks), static_cast<unsigned long long>(r.remote_steals));
    out += line;
  }
  std::snprintf(line, sizeof line, "| time: chunks %.3f s, allreduce %.3f s, optimizer %.3f s, other %.3f s\n", r.chunks_s, r.reduce_s,
                r.optimizer_s, std::max(0.0, r.step_s - r.chunks_s - r.reduce_s - r.optimizer_s));
  out += line;
  std::snprintf(line, sizeof line, "| %-6s %5s  %-*s  %8s %8s %7s %7s %8s %6s\n", "dev", "util", kBar + 2, "", "busy(s)", "wait(s)", "chunks",
                "stolen", "samples", "chunk");
  out += line;
  for (const DeviceReport& d : r.devices) {
    const int filled = std::clamp(static_cast<int>(d.utilization * kBar + 0.5), 0, kBar);
    std::string bar = "|" + std::string(static_cast<std::size_t>(filled), '#') + std::string(static_cast<std::size_t>(kBar - filled), ' ') + "|";
    std::snprintf(line, sizeof line, "| %-6s %4.0f%%  %s  %8.3f %8.3f %7llu %7llu %8llu %6zu\n", d.name.c_str(), d.utilization * 100, bar.c_str(),
                  d.busy_s, d.barrier_wait_s, static_cast<unsigned long long>(d.chunks_run),
                  static_cast<unsigned long long>(d.chunks_stolen), static_cast<unsigned long long>(d.samples), d.chunk_samples);
    out += line;
  }
  return out;
}

TraceWriter::TraceWriter(const std::string& path, std::vector<std::string> device_names) : TraceWriter(path, std::move(device_names), -1, 0) {}

TraceWriter::TraceWriter(const std::string& path, std::vector<std::string> device_names, int pid, std::int64_t offset_ns)
    : m_out(path), m_names(std::move(device_names)), m_worker_dropped(m_names.size(), 0), m_pid(std::max(pid, 0)), m_offset_ns(offset_ns) {
  if (!m_out) throw ConfigError("trace_path = '" + path + "': cannot open it for writing");
  for (std::size_t i = 0; i < m_names.size(); ++i) {
    m_queues.push_back(std::make_unique<Queue>());
  }
  m_out << R"({"displayTimeUnit":"ms","traceEvents":[)" << "\n";
  if (pid >= 0) {
    // A rank's file: its process row, and the offset that put its clock on rank 0's.
    emit(m_out, m_first, Json{{"name", "process_name"}, {"ph", "M"}, {"pid", m_pid}, {"args", {{"name", "rank " + std::to_string(m_pid)}}}});
    emit(m_out, m_first, Json{{"name", "clock_offset"}, {"ph", "M"}, {"pid", m_pid}, {"args", {{"offset_ns", m_offset_ns}}}});
  }
  for (std::size_t i = 0; i < m_names.size(); ++i) emit(m_out, m_first, thread_name(m_pid, i, m_names[i]));
  // The caller's spans (reduction, optimizer) go on a row of their own, after the devices.
  emit(m_out, m_first, thread_name(m_pid, m_names.size(), "host"));
}

TraceWriter::~TraceWriter() {
  try {
    close();
  } catch (...) {  // a destructor never throws; a failed final write only loses the trace's tail
  }
}

void TraceWriter::push(std::size_t worker, const TraceEvent& e) noexcept {
  if (!m_queues[worker]->events.push(e)) ++m_worker_dropped[worker];
}

void TraceWriter::add(const TraceEvent& e) { write(e); }

void TraceWriter::drain() {
  for (auto& q : m_queues) q->events.consume_all([this](const TraceEvent& e) { write(e); });
  m_dropped = 0;
  for (std::uint64_t d : m_worker_dropped) m_dropped += d;
}

void TraceWriter::write(const TraceEvent& e) {
  static const char* const kNames[] = {"chunk", "allreduce", "optimizer", "barrier"};
  const std::string kind = kNames[std::min<std::uint32_t>(static_cast<std::uint32_t>(e.kind), 3)];
  emit(m_out, m_first,
       Json{{"name", e.kind == TraceKind::kChunk ? kind + ' ' + std::to_string(e.chunk) : kind}, {"cat", kind}, {"ph", "X"}, {"pid", m_pid},
            {"tid", e.device}, {"ts", static_cast<double>(e.begin_ns + m_offset_ns) / 1e3}, {"dur", static_cast<double>(e.end_ns - e.begin_ns) / 1e3}});
}

void TraceWriter::close() {
  if (m_closed) return;
  m_closed = true;
  drain();
  m_out << "\n]}\n";
  m_out.flush();
}

}  // namespace stealbatch
