// The usage examples in the public headers' comments, compiled and run as written (adapted only to have data).
#include <stealbatch/runtime/cpu_device.hpp>
#include <stealbatch/runtime/runtime.hpp>
#include <stealbatch/runtime/sim_device.hpp>
#include <stealbatch/sha256.hpp>
#include <stealbatch/scheduler/chunk_deque.hpp>
#include <stealbatch/scheduler/event_count.hpp>
#include <stealbatch/scheduler/scheduler.hpp>
#include <stealbatch/scheduler/victim.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <numeric>
#include <span>
#include <string>
#include <thread>
#include <vector>

using namespace stealbatch;

TEST_CASE("DocExamples.ChunkDequeAndStealer") {
  ChunkDeque q;
  std::vector<ChunkId> chunks = {0, 1, 2, 3, 4, 5};
  q.push_bulk(chunks);  // one release of bottom for the lot
  Stealer s = q.stealer();
  Stolen one = s.steal();  // from another thread (here: the same one, which is allowed)
  CHECK(one.status == StealStatus::kTaken);
  CHECK(one.chunk == 0u);
  ChunkDeque my_deque;
  StolenBatch b = s.steal_batch_and_pop(my_deque, 8);  // half the victim, at most 8: one to run, the rest into my_deque
  CHECK(b.chunk == 1u);
  CHECK(b.moved == 2);
  std::vector<ChunkId> ran;
  while (auto c = q.pop()) ran.push_back(*c);  // newest first
  CHECK(ran == std::vector<ChunkId>{5, 4});
}

TEST_CASE("DocExamples.ChunkMerge") {
  std::vector<std::atomic<int>> hits(64);
  Scheduler sched({.workers = 4});
  auto run_one = [&](std::size_t, ChunkId c) { hits[c].fetch_add(1); };
  auto fitting = [](std::size_t, ChunkId, std::span<const ChunkId> more) { return std::min<std::size_t>(more.size(), 2); };
  auto compute = [&](std::size_t, std::span<const ChunkId> chunks) {
    for (ChunkId c : chunks) hits[c].fetch_add(1);
  };
  auto choose = [&](std::size_t w, ChunkId first, std::span<const ChunkId> more) { return fitting(w, first, more); };
  auto together = [&](std::size_t w, std::span<const ChunkId> chunks) { compute(w, chunks); };
  const ChunkMerge merge{choose, together};  // references: the lambdas must outlive the step
  sched.run(place_equal(64, 4), run_one, {}, &merge);
  int wrong = 0;
  for (auto& h : hits) wrong += h.load() != 1;
  CHECK(wrong == 0);
}

TEST_CASE("DocExamples.SchedulerAndBroadcast") {
  std::vector<std::atomic<int>> hits(64);
  auto compute = [&](std::size_t, ChunkId c) { hits[c].fetch_add(1); };
  Scheduler sched({.workers = 4});
  StepStats st = sched.run(place_equal(64, 4), [&](std::size_t worker, ChunkId c) { compute(worker, c); });
  CHECK(st.chunks == 64);
  for (auto& h : hits) CHECK(h.load() == 1);
  std::vector<int> zeroed(4, 0);
  sched.broadcast([&](std::size_t w) { zeroed[w] = 1; });
  CHECK(std::accumulate(zeroed.begin(), zeroed.end(), 0) == 4);
  sched.set_chunk_costs({6.6, 6.6, 1, 1});
  CHECK(sched.run(place_equal(8, 4), compute).chunks == 8);
}

TEST_CASE("DocExamples.EventCount") {
  EventCount ev;
  std::atomic<bool> work{false};
  std::thread waiter([&] {
    for (;;) {
      auto key = ev.prepare_wait();
      if (work.load()) {
        ev.cancel_wait();
        return;
      }
      ev.commit_wait(key);
    }
  });
  work.store(true);  // publish_work()
  ev.notify_one();
  waiter.join();
  CHECK(ev.waiters() == 0);
}

TEST_CASE("DocExamples.VictimSelector") {
  const std::size_t self = 1, n = 4;
  std::vector<ChunkDeque> qs(n);
  std::vector<Stealer> stealers;
  for (auto& q : qs) stealers.push_back(q.stealer());
  VictimSelector sel(self, n, VictimPolicy::kSticky, 42);
  std::vector<std::size_t> visited;
  for (std::size_t i = 0, v = sel.first(stealers); i + 1 < n; ++i, v = sel.after(v)) visited.push_back(v);
  std::sort(visited.begin(), visited.end());
  CHECK(visited == std::vector<std::size_t>{0, 2, 3});
}

TEST_CASE("DocExamples.ParameterLayoutOptimizerRuntime") {
  ParameterLayout layout;
  const auto w = layout.add("fc1.weight", 784 * 256);
  const auto b = layout.add("fc1.bias", 256);
  std::vector<float> grad(layout.size(), 0.0f);
  std::span<float> w1 = layout.view(std::span<float>(grad), w);  // that tensor's slice of a flat buffer
  CHECK(w1.size() == 784u * 256u);
  CHECK(layout.tensor(b).offset == 784u * 256u);

  OptimizerOptions o{.kind = OptimizerKind::kAdam, .lr = 1e-3f};
  CHECK_NOTHROW(validate(o));

  Runtime rt({.devices = "cpu:4", .schedule = {.chunk_size = 32}});
  const std::vector<float> initial_values(layout.size(), 0.5f);
  rt.register_parameters(layout, initial_values);
  std::vector<std::uint32_t> batch_indices(100);
  std::iota(batch_indices.begin(), batch_indices.end(), 0u);
  StepReport r = rt.step(batch_indices, [&](ChunkContext& ctx) {
    for (std::uint32_t s : ctx.samples) ctx.grad[s % ctx.grad.size()] += 1.0f;  // a stand-in for model.accumulate(ctx)
    ctx.add_loss(static_cast<double>(ctx.samples.size()));
  });
  CHECK(r.samples == 100);
  CHECK(r.loss == doctest::Approx(1.0));
}

TEST_CASE("DocExamples.Devices") {
  CpuDevice d(0, /*threads=*/2, /*slowdown=*/6.6);
  SimDevice slow(3, /*speed=*/0.25, /*sample_seconds=*/100e-6);  // 400 us per sample
  CHECK(d.name() == "cpu0");
  CHECK(slow.name() == "sim3");
  InProcessCommunicator comm;
  std::vector<float> a = {1, 2}, c = {3, 4};
  std::vector<float*> grad_pointers = {a.data(), c.data()};
  for (std::size_t dev = 0; dev < 2; ++dev) comm.allreduce_sum(dev, grad_pointers, 2);
  CHECK(a == std::vector<float>{4, 6});
  CHECK(c == std::vector<float>{4, 6});
}

TEST_CASE("DocExamples.DeterministicSha256") {
  ParameterLayout layout;
  layout.add("w", 16);
  Runtime rt({.devices = "cpu:2", .schedule = {.chunk_size = 4, .deterministic = true}});
  rt.register_parameters(layout, std::vector<float>(16, 0.5f));
  std::vector<std::uint32_t> batch(40);
  std::iota(batch.begin(), batch.end(), 0u);
  (void)rt.step(batch, [](ChunkContext& ctx) {
    for (std::uint32_t s : ctx.samples) ctx.grad[s % 16] += 0.25f * static_cast<float>(s);
  });
  const std::vector<float> p = rt.parameters();
  const std::string sha = sha256_hex(std::as_bytes(std::span(p)));  // sha256.hpp's example, with rt's parameters
  CHECK(sha.size() == 64u);
  const std::vector<float> again = rt.parameters();
  CHECK(sha == sha256_hex(std::as_bytes(std::span(again))));
}
