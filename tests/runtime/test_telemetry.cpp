// The Chrome trace writer: what it writes is JSON that parses back, whatever the device names hold.
#include <stealbatch/runtime/telemetry.hpp>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

using namespace stealbatch;

namespace {

std::filesystem::path temp_trace(const std::string& tag) {
  return std::filesystem::temp_directory_path() / ("sb_telemetry_" + tag + "_" + std::to_string(::getpid()) + ".json");
}

nlohmann::json read_json(const std::filesystem::path& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);  // throws parse_error on anything but one whole JSON value
}

}  // namespace

TEST_CASE("Telemetry.TraceEscapesQuotesAndBackslashesInDeviceNames") {
  const std::string odd = "gpu \"fast\" C:\\dev\\0";
  const auto path = temp_trace("names");
  {
    TraceWriter w(path.string(), {odd, "tab\there", "cpu1"}, 2, 5000);
    w.push(0, {.device = 0, .chunk = 7, .begin_ns = 1000, .end_ns = 4000, .kind = TraceKind::kChunk});
    w.push(2, {.device = 2, .chunk = 0, .begin_ns = 2000, .end_ns = 2500, .kind = TraceKind::kBarrier});
    w.drain();
    w.add({.device = 3, .chunk = 0, .begin_ns = 5000, .end_ns = 9000, .kind = TraceKind::kAllReduce});
    w.close();
  }
  const nlohmann::json j = read_json(path);
  CHECK(j["displayTimeUnit"] == "ms");
  std::vector<std::string> rows;
  std::size_t spans = 0;
  for (const auto& e : j["traceEvents"]) {
    CHECK(e["pid"] == 2);
    if (e["name"] == "thread_name") rows.push_back(e["args"]["name"]);
    if (e["name"] == "process_name") CHECK(e["args"]["name"] == "rank 2");
    if (e["name"] == "clock_offset") CHECK(e["args"]["offset_ns"] == 5000);
    if (e["ph"] == "X") ++spans;
    if (e["ph"] == "X" && e["cat"] == "chunk") {
      CHECK(e["name"] == "chunk 7");
      CHECK(e["tid"] == 0);
      CHECK(e["ts"].get<double>() == 6.0);  // (1000 + 5000) ns in us, on rank 0's clock
      CHECK(e["dur"].get<double>() == 3.0);
    }
  }
  CHECK(rows == std::vector<std::string>{odd, "tab\there", "cpu1", "host"});
  CHECK(spans == 3);
  std::filesystem::remove(path);
}

TEST_CASE("Telemetry.TraceReplacesBytesThatAreNotUtf8") {
  const auto path = temp_trace("utf8");
  {
    TraceWriter w(path.string(), {std::string("dev\xff\xfe")});
    w.close();
  }
  const nlohmann::json j = read_json(path);
  REQUIRE(j["traceEvents"].size() == 2);  // the device's row and the host's
  CHECK(j["traceEvents"][0]["args"]["name"] == "dev\xEF\xBF\xBD\xEF\xBF\xBD");  // each bad byte as U+FFFD
  CHECK(j["traceEvents"][1]["args"]["name"] == "host");
  std::filesystem::remove(path);
}

TEST_CASE("Telemetry.IdealSpreadsTheDevicesComputeOverTheirSummedSpeed") {
  // Two devices, the second slowed 2-fold: 1 s and 3 s of chunks are 1 + 1.5 s of work at full speed, over a summed
  // speed of 1.5 devices; the reduction and the update are paid as they came.
  StepReport r;
  r.reduce_s = 0.25, r.optimizer_s = 0.125;
  r.devices.resize(2);
  r.devices[0].compute_s = 1.0, r.devices[1].compute_s = 3.0;
  const std::vector<double> slowdown = {1.0, 2.0};
  CHECK(ideal_seconds(r, slowdown) == doctest::Approx(2.5 / 1.5 + 0.375));
  CHECK(ideal_seconds(r) == doctest::Approx(2.0 + 0.375));  // no factors: the mean
  CHECK(ideal_seconds(StepReport{}) == 0.0);
}
