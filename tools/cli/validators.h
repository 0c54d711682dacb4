#pragma once
// CLI11 validators the programs share. CLI::Range lets NaN through (every comparison with NaN is
// false) and inf through an open upper end: a floating-point option is checked with Finite or
// FiniteRange instead, at parse time, so that a bad value ends in one line naming the option
// ("--lr: 'nan' is not a finite number"). Header-only; only the programs, which link CLI11,
// include it.
#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdio>
#include <limits>
#include <string>

namespace wm::cli {

namespace detail {

inline std::string number_text(double v) {
  if (v >= std::numeric_limits<double>::max()) return "inf";
  if (v <= -std::numeric_limits<double>::max()) return "-inf";
  char b[32];
  std::snprintf(b, sizeof b, "%g", v);
  return b;
}

}  // namespace detail

// A finite number in [lo, hi] (each value of a list option).
class FiniteRange : public CLI::Validator {
 public:
  FiniteRange(double lo, double hi) {
    const std::string range = "[" + detail::number_text(lo) + ", " + detail::number_text(hi) + "]";
    name_ = "FINITE";
    description("FLOAT in " + range);
    func_ = [lo, hi, range](std::string& s) -> std::string {
      double v = 0;
      if (!CLI::detail::lexical_cast(s, v)) return "'" + s + "' is not a number";
      if (!std::isfinite(v)) return "'" + s + "' is not a finite number";
      if (v < lo || v > hi) return "'" + s + "' is outside " + range;
      return {};
    };
  }
};

// A whole number in [0, 2^64 - 1] written in decimal digits: CLI11 itself reads "-1" and
// "18446744073709551616" into an unsigned 64-bit option as 2^64 - 1 without a word.
class Uint64 : public CLI::Validator {
 public:
  Uint64() {
    name_ = "UINT64";
    description("UINT in [0, 18446744073709551615]");
    func_ = [](std::string& s) -> std::string {
      static const std::string max = "18446744073709551615";
      const size_t b = s.find_first_not_of('0');
      const std::string digits = b == std::string::npos ? "0" : s.substr(b);
      bool ok = !s.empty() && s.find_first_not_of("0123456789") == std::string::npos;
      ok = ok && (digits.size() < max.size() || (digits.size() == max.size() && digits <= max));
      return ok ? std::string() : "'" + s + "' is not a whole number in [0, " + max + "]";
    };
  }
};

// Any finite number.
inline const FiniteRange Finite(-std::numeric_limits<double>::max(), std::numeric_limits<double>::max());
// A finite number >= 0.
inline const FiniteRange FiniteNonNegative(0.0, std::numeric_limits<double>::max());

}  // namespace wm::cli
