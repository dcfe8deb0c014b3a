// Test helpers for ranks run as threads (collectives, ring TLS): an exception's message, and a
// check that throws (Catch2's assertion macros are not thread-safe, so rank bodies use it and
// the test asserts on the main thread after join).
#pragma once

#include <exception>
#include <sstream>
#include <stdexcept>
#include <string>

namespace dtf::test {

/// The message of a captured exception.
inline std::string message_of(const std::exception_ptr& p) {
  try {
    std::rethrow_exception(p);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}

}  // namespace dtf::test

/// In a rank's body: throws std::runtime_error naming the condition and msg when cond fails.
#define RANK_CHECK(cond, msg)                                    \
  do {                                                           \
    if (!(cond)) {                                               \
      std::ostringstream rank_check_os;                          \
      rank_check_os << "RANK_CHECK(" #cond ") failed: " << msg; \
      throw std::runtime_error(rank_check_os.str());             \
    }                                                            \
  } while (false)
