// The ranks' agreement: one small collective when they agree, the field that differs when they do not.
#include <stealbatch/error.hpp>
#include <stealbatch/runtime/detail/agreement.hpp>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <optional>

namespace stealbatch::detail {

namespace {

constexpr std::size_t kTextBytes = 16384;  // the fields as broadcast text: "name\tvalue\n" lines, cut at this size

std::vector<char> as_text(const AgreementFields& fields) {
  std::vector<char> out(kTextBytes, '\0');
  std::size_t at = 0;
  for (const auto& [name, value] : fields) {
    const std::string line = name + "\t" + value + "\n";
    if (at + line.size() >= kTextBytes) break;
    std::memcpy(out.data() + at, line.data(), line.size());
    at += line.size();
  }
  return out;
}

AgreementFields from_text(const std::vector<char>& text) {
  AgreementFields out;
  const std::string s(text.data(), strnlen(text.data(), text.size()));
  std::size_t at = 0;
  while (at < s.size()) {
    const std::size_t end = std::min(s.find('\n', at), s.size()), tab = s.find('\t', at);
    if (tab < end) out.emplace_back(s.substr(at, tab - at), s.substr(tab + 1, end - tab - 1));
    at = end + 1;
  }
  return out;
}

// Where two ranks' fields first differ: the field's name and each side's value. A field that one side lacks, or two
// lists out of step, are named by their place, with each side's name and value.
struct Difference {
  std::string name, a, b;
};

std::optional<Difference> first_difference(const AgreementFields& a, const AgreementFields& b) {
  for (std::size_t i = 0; i < std::max(a.size(), b.size()); ++i) {
    if (i < a.size() && i < b.size()) {
      if (a[i] == b[i]) continue;
      if (a[i].first == b[i].first) return Difference{a[i].first, a[i].second, b[i].second};
    }
    const auto entry = [i](const AgreementFields& f) { return i < f.size() ? f[i].first + " = " + f[i].second : std::string("(none)"); };
    return Difference{"field " + std::to_string(i), entry(a), entry(b)};
  }
  return std::nullopt;
}

}  // namespace

std::uint64_t fnv1a(std::span<const std::byte> bytes, std::uint64_t h) noexcept {
  for (const std::byte b : bytes) h = (h ^ static_cast<std::uint64_t>(b)) * 1099511628211ULL;
  return h;
}

std::string hex16(std::uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

void check_agreement(Cluster& cluster, const AgreementFields& fields, std::string_view when, const std::function<void()>& waiting) {
  const int ranks = cluster.size(), me = cluster.rank();
  if (ranks <= 1) return;
  std::uint64_t h = 1469598103934665603ULL;
  for (const auto& [name, value] : fields) {
    h = fnv1a(std::as_bytes(std::span<const char>(name.data(), name.size() + 1)), h);  // with its '\0': no two lists hash alike by shifting
    h = fnv1a(std::as_bytes(std::span<const char>(value.data(), value.size() + 1)), h);
  }
  // Each byte b and b^2 summed over the ranks: all equal exactly when n * sum(b^2) == sum(b)^2 (Cauchy-Schwarz).
  // Integers below 2^53 throughout for n up to 2^18, so the sums are exact in any order.
  std::array<double, 16> sums{};
  for (int i = 0; i < 8; ++i) {
    const double b = static_cast<double>((h >> (8 * i)) & 0xff);
    sums[static_cast<std::size_t>(i)] = b, sums[static_cast<std::size_t>(8 + i)] = b * b;
  }
  cluster.allreduce_sum(sums, waiting);
  bool agree = true;
  for (std::size_t i = 0; i < 8; ++i) agree = agree && static_cast<double>(ranks) * sums[8 + i] == sums[i] * sums[i];
  if (agree) return;

  // They do not: rank 0's fields to every rank, each rank's verdict against them, then the first differing rank's.
  std::vector<char> zero = as_text(fields);
  cluster.broadcast(zero, 0);
  const AgreementFields at_zero = from_text(zero);
  std::vector<double> differs(static_cast<std::size_t>(ranks), 0.0);
  differs[static_cast<std::size_t>(me)] = first_difference(at_zero, fields) ? 1.0 : 0.0;
  cluster.allreduce_sum(differs);
  std::vector<int> which;
  for (int r = 0; r < ranks; ++r) {
    if (differs[static_cast<std::size_t>(r)] != 0) which.push_back(r);
  }
  std::string msg = "the ranks disagree " + std::string(when);
  if (which.empty()) {
    // Only a field past the broadcast text's size can differ so: say what can be said.
    throw ConfigError(msg + ": their settings differ (beyond what can be shown); launch every rank with the same flags");
  }
  std::vector<char> theirs = as_text(fields);
  cluster.broadcast(theirs, which.front());
  const Difference d = first_difference(at_zero, from_text(theirs)).value_or(Difference{"(nothing shown)", "", ""});
  std::string list;
  for (std::size_t i = 0; i < which.size() && i < 8; ++i) list += (i ? ", " : "") + std::to_string(which[i]);
  if (which.size() > 8) list += ", ... (" + std::to_string(which.size()) + " ranks)";
  msg += " on '" + d.name + "': rank 0 has " + d.a + ", rank " + std::to_string(which.front()) + " has " + d.b + " (ranks that differ from rank 0: " +
         list + "); every rank must be launched with the same settings";
  throw ConfigError(msg);
}

}  // namespace stealbatch::detail

namespace stealbatch {

void check_ranks_agree(Cluster& cluster, const std::vector<std::pair<std::string, std::string>>& values, std::string_view when) {
  detail::check_agreement(cluster, values, when);
}

}  // namespace stealbatch
