// dtf/error.hpp — the error type every dtf component throws.
//
// dtf::error derives from std::system_error so that callers can catch transport errors,
// configuration errors and invariant violations through one type and still read an
// error_code. Messages name the cause: the file, flag, field, peer or tensor at fault.
#pragma once

#include <string>
#include <system_error>

namespace dtf {

/// Error conditions raised by dtf (the category is "dtf").
enum class errc {
  invalid_argument = 1,  ///< a caller passed a value outside the contract
  invalid_config,        ///< a flag, environment variable or config field is malformed
  io_error,              ///< a file could not be opened, read or written
  corrupt_data,          ///< a file or message does not match its format
  shape_mismatch,        ///< tensors or layers whose shapes do not fit together
  out_of_range,          ///< an index or label outside its range
  timeout,               ///< a bounded wait ran out
  peer_failure,          ///< a remote task died or misbehaved
  internal,              ///< a broken invariant inside dtf (a bug)
};

}  // namespace dtf

template <>
struct std::is_error_code_enum<dtf::errc> : std::true_type {};

namespace dtf {

namespace detail {
class error_category_impl final : public std::error_category {
 public:
  const char* name() const noexcept override { return "dtf"; }
  std::string message(int ev) const override {
    switch (static_cast<errc>(ev)) {
      case errc::invalid_argument: return "invalid argument";
      case errc::invalid_config: return "invalid configuration";
      case errc::io_error: return "I/O error";
      case errc::corrupt_data: return "corrupt data";
      case errc::shape_mismatch: return "shape mismatch";
      case errc::out_of_range: return "out of range";
      case errc::timeout: return "timed out";
      case errc::peer_failure: return "peer failure";
      case errc::internal: return "internal error";
    }
    return "unknown dtf error";
  }
};
}  // namespace detail

/// The "dtf" error category.
inline const std::error_category& error_category() noexcept {
  static const detail::error_category_impl category;
  return category;
}

/// Makes errc values usable as std::error_code (found by argument-dependent lookup).
inline std::error_code make_error_code(errc e) noexcept {
  return {static_cast<int>(e), error_category()};
}

/// The exception thrown by dtf. what() is "<message>: <condition>".
class error : public std::system_error {
 public:
  /// An error of condition `code` with `message` (the cause: file, flag, field, peer or tensor).
  error(errc code, const std::string& message) : std::system_error(make_error_code(code), message), message_(message) {}
  /// The same with any std::error_code.
  error(std::error_code code, const std::string& message) : std::system_error(code, message), message_(message) {}
  /// The message without the condition appended by what().
  const std::string& message() const noexcept { return message_; }

 private:
  std::string message_;
};

namespace detail {
[[noreturn]] inline void throw_invariant(const char* condition, const std::string& message, const char* file,
                                         int line) {
  throw error(errc::internal, std::string(file) + ":" + std::to_string(line) + ": invariant '" + condition +
                                  "' failed: " + message);
}
}  // namespace detail

}  // namespace dtf

/// Checks an internal invariant; a failure throws dtf::error(errc::internal) naming the
/// file and line. For bad user input throw dtf::error with a specific errc instead.
#define DTF_ASSERT(cond, message)                                                      \
  do {                                                                                 \
    if (!(cond)) ::dtf::detail::throw_invariant(#cond, (message), __FILE__, __LINE__); \
  } while (false)
