// A cluster for tests that need one but no transport: ranks on nodes of `per_node` consecutive ranks, named n0, n1,
// ...; one-sided accesses read 0 and write nothing, and the collectives leave the values as they are (a sum over one
// rank).
#pragma once

#include <stealbatch/runtime/cluster.hpp>

#include <cstdlib>
#include <string>

namespace stealbatch::testing {

class StubCluster final : public Cluster {
 public:
  StubCluster(int me, int ranks, int per_node) : m_me(me), m_ranks(ranks), m_per(per_node) {}
  int rank() const noexcept override { return m_me; }
  int size() const noexcept override { return m_ranks; }
  bool same_node(int r) const noexcept override { return r / m_per == m_me / m_per; }
  std::string node_name(int r) const override { return "n" + std::to_string(r / m_per); }
  std::uint64_t read(int, Word) override { return 0; }
  std::uint64_t compare_and_swap(int, Word, std::uint64_t, std::uint64_t) override { return 0; }
  void write(int, Word, std::uint64_t) override {}
  void allreduce_sum(std::span<float>, const std::function<void()>&) override {}
  void allreduce_sum(std::span<double>, const std::function<void()>&) override {}
  void allreduce_sum(std::span<std::int64_t>, const std::function<void()>&) override {}
  void broadcast(std::span<char>, int) override {}
  [[noreturn]] void abort(const std::string&, int) noexcept override { std::abort(); }

 private:
  int m_me, m_ranks, m_per;
};

}  // namespace stealbatch::testing
