// The gradient comparison every equivalence gate uses (stealbatch/models/compare.hpp): a NaN or an infinity on
// either side, or a size mismatch, must fail a `<= tolerance` gate.
#include <stealbatch/models/compare.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

using stealbatch::examples::max_relative_error;

namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// The measure as it was written before: std::max(x, NaN) is x, so NaNs vanish from both maxima.
double max_relative_error_passing_nan(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, std::abs(static_cast<double>(a[i]) - b[i]));
    den = std::max(den, std::abs(static_cast<double>(b[i])));
  }
  return den > 0 ? num / den : num;
}

bool passes(double err) { return err <= 1e-4; }

}  // namespace

TEST_CASE("Compare.FiniteGradientsScoreTheirRelativeError") {
  const std::vector<float> ref{1.0f, -2.0f, 4.0f}, close{1.0f, -2.0f, 4.0002f}, far{1.0f, -2.0f, 5.0f};
  CHECK(max_relative_error(ref, ref) == 0.0);
  CHECK(max_relative_error(close, ref) == doctest::Approx(0.0002 / 4).epsilon(1e-3));
  CHECK(passes(max_relative_error(close, ref)));
  CHECK_FALSE(passes(max_relative_error(far, ref)));
  const std::vector<float> zeros(3, 0.0f);
  CHECK(max_relative_error(zeros, zeros) == 0.0);  // an all-zero reference compares absolutely
}

TEST_CASE("Compare.ANaNOrAnInfinityFailsTheGate") {
  const std::vector<float> ref{0.5f, -1.0f, 2.0f, 0.25f};
  const std::vector<float> all_nan(ref.size(), kNaN);
  // What the gate let through: an all-NaN gradient scored 0.
  REQUIRE(max_relative_error_passing_nan(all_nan, ref) == 0.0);
  REQUIRE(passes(max_relative_error_passing_nan(all_nan, ref)));

  CHECK(std::isinf(max_relative_error(all_nan, ref)));
  CHECK_FALSE(passes(max_relative_error(all_nan, ref)));
  for (const float bad : {kNaN, kInf, -kInf}) {
    for (std::size_t at = 0; at < ref.size(); ++at) {
      std::vector<float> one = ref;
      one[at] = bad;
      CAPTURE(bad);
      CAPTURE(at);
      CHECK_FALSE(passes(max_relative_error(one, ref)));  // on the result's side
      CHECK_FALSE(passes(max_relative_error(ref, one)));  // on the reference's side
    }
  }
}

TEST_CASE("Compare.SizesThatDifferFailTheGate") {
  const std::vector<float> ref{1.0f, 2.0f, 3.0f}, shorter{1.0f, 2.0f};
  CHECK_FALSE(passes(max_relative_error(shorter, ref)));
  CHECK_FALSE(passes(max_relative_error(ref, shorter)));
}
