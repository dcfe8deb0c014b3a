// Test helpers for ranks run as threads (collectives, ring TLS, the LibTorch adapter): the ring
// of n ranks on loopback, an exception's message, and a check that throws (Catch2's assertion
// macros are not thread-safe, so rank bodies use it and the test asserts on the main thread
// after join).
#pragma once

#include <dtf/collectives.hpp>

#include <exception>
#include <functional>
#include <thread>
#include <vector>
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

/// Listeners on free loopback ports (port 0: the kernel picks, the listener holds it) and their
/// addresses.
struct ring_setup {
  explicit ring_setup(std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) {
      listeners.emplace_back("127.0.0.1:0");
      addresses.push_back("127.0.0.1:" + std::to_string(listeners.back().port()));
    }
  }
  std::vector<ring_listener> listeners;
  std::vector<std::string> addresses;
};

/// Runs body(comm) on n ranks (threads); returns each rank's exception (null when it succeeded).
inline std::vector<std::exception_ptr> run_ranks_collect(std::size_t n, const collective_options& o,
                                                         const std::function<void(communicator&)>& body) {
  ring_setup setup(n);
  std::vector<std::exception_ptr> failures(n);
  std::vector<std::thread> threads;
  for (std::size_t r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        communicator c(std::move(setup.listeners[r]), r, setup.addresses, {}, o);
        body(c);
      } catch (...) {
        failures[r] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  return failures;
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
