#pragma once
// Errors of the project. Library code throws; programs catch once, at main, and turn the
// message into a line on stderr and a non-zero exit code.
#include <sstream>
#include <stdexcept>
#include <string>

namespace wm {

// A failure with its context already in the message ("where: what (expected X, got Y)").
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Data on disk that is damaged: a spill file or checkpoint whose checksum, size or header is wrong.
class CorruptData : public Error {
 public:
  using Error::Error;
};

// Data a store held and can no longer give back: a remote tier's value that expired, was evicted
// or is unreachable. A kind of CorruptData, so that whoever recomputes a damaged block
// recomputes a lost one too.
class LostData : public CorruptData {
 public:
  using CorruptData::CorruptData;
};

namespace detail {
inline void append(std::ostringstream&) {}
template <class T, class... R>
void append(std::ostringstream& os, const T& v, const R&... rest) {
  os << v;
  append(os, rest...);
}
}  // namespace detail

// Concatenates its arguments with operator<< into a string.
template <class... A>
std::string str_cat(const A&... a) {
  std::ostringstream os;
  detail::append(os, a...);
  return os.str();
}

}  // namespace wm

// Throws wm::Error with the message built from the remaining arguments when cond is false.
#define WM_CHECK(cond, ...)                                                           \
  do {                                                                                \
    if (!(cond)) throw ::wm::Error(::wm::str_cat(__func__, ": ", __VA_ARGS__));      \
  } while (0)
