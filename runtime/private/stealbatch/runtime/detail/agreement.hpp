// What every rank of a job must agree on, checked where a disagreement would otherwise corrupt the job: collectives
// of different sizes (heap corruption in the MPI library), a hang, or training that is silently wrong.
#pragma once

#include <stealbatch/runtime/cluster.hpp>

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace stealbatch::detail {

// Named values, in an order every rank shares: "policy" = "steal", "batch hash" = "9f0c...".
using AgreementFields = std::vector<std::pair<std::string, std::string>>;

// FNV-1a, 64 bits: the fields' fingerprint, and the hashes of a batch's sample ids or a layout.
std::uint64_t fnv1a(std::span<const std::byte> bytes, std::uint64_t h = 1469598103934665603ULL) noexcept;
std::string hex16(std::uint64_t v);

// Every rank calls it at the same point with its own fields. One fixed-size collective when the ranks agree: the
// sum, over the ranks, of each byte of the fields' fingerprint and of its square, which are equal on every rank
// exactly when n x (sum of squares) = (sum)^2 for every byte (exact in doubles up to 2^18 ranks). When they do not,
// rank 0's fields and then those of the first rank that differs from them are broadcast, and every rank throws the
// same ConfigError: `when`, the first field that differs, the ranks, and both values. `waiting` runs while this rank
// waits for the others in the first collective (Cluster::allreduce_sum).
void check_agreement(Cluster& cluster, const AgreementFields& fields, std::string_view when, const std::function<void()>& waiting = {});

}  // namespace stealbatch::detail
