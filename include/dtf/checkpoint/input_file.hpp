// dtf/checkpoint/input_file.hpp — a checkpoint file as the reader sees it: opened without
// following a symlink, a regular file only (a FIFO would block a reader forever), every read
// bounds-checked against the size seen at open; or the same over bytes in memory (the fuzz
// target's, the tests'). Errors: errc::io_error (cannot open or read), errc::corrupt_data (not
// a regular file, a read outside it, a file that shrank).
#pragma once

#include <dtf/checkpoint/format.hpp>
#include <dtf/detail/sha256.hpp>
#include <dtf/error.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace dtf {

namespace detail::ckpt {

inline std::string errno_text() { return std::strerror(errno); }

/// A read-only input: an open regular file, or bytes in memory (the fuzzer's, the tests').
/// Every read is bounds-checked against the size seen at open.
class input_file {
 public:
  /// Opens `path` without following a symlink; it must be a regular file.
  static input_file open(const std::filesystem::path& path) {
    input_file f;
    f.what_ = path.string();
    f.fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (f.fd_ < 0)
      throw error(errc::io_error, "cannot open " + f.what_ + ": " + errno_text() +
                                      (errno == ELOOP ? " (a symlink: checkpoint files are read only as regular files)" : ""));
    struct stat st {};
    if (::fstat(f.fd_, &st) != 0) throw error(errc::io_error, "cannot stat " + f.what_ + ": " + errno_text());
    if (!S_ISREG(st.st_mode)) throw error(errc::corrupt_data, f.what_ + ": not a regular file");
    f.size_ = std::uint64_t(st.st_size);
    return f;
  }
  static input_file memory(std::span<const std::byte> bytes, std::string what) {
    input_file f;
    f.what_ = std::move(what);
    f.memory_ = bytes;
    f.size_ = bytes.size();
    return f;
  }

  input_file() = default;
  input_file(input_file&& o) noexcept : fd_(std::exchange(o.fd_, -1)), memory_(o.memory_), size_(o.size_), what_(std::move(o.what_)) {}
  input_file& operator=(input_file&& o) noexcept {
    if (this != &o) {
      close();
      fd_ = std::exchange(o.fd_, -1);
      memory_ = o.memory_;
      size_ = o.size_;
      what_ = std::move(o.what_);
    }
    return *this;
  }
  ~input_file() { close(); }

  std::uint64_t size() const noexcept { return size_; }
  const std::string& what() const noexcept { return what_; }

  /// Reads n bytes at offset. Errors: corrupt_data when the range is not inside the file (or
  /// the file shrank since open), io_error when reading fails.
  void read(std::uint64_t offset, void* dst, std::size_t n) const {
    if (offset > size_ || n > size_ - offset)
      corrupt(what_, "", "a read of " + std::to_string(n) + " bytes at " + std::to_string(offset) +
                             " lies outside its " + std::to_string(size_) + " bytes");
    if (fd_ < 0) {
      if (n) std::memcpy(dst, memory_.data() + offset, n);
      return;
    }
    auto* at = static_cast<char*>(dst);
    while (n > 0) {
      const ssize_t got = ::pread(fd_, at, n, off_t(offset));
      if (got < 0) {
        if (errno == EINTR) continue;
        throw error(errc::io_error, "cannot read " + what_ + ": " + errno_text());
      }
      if (got == 0) corrupt(what_, "", "ends early (it changed while being read)");
      at += got;
      n -= std::size_t(got);
      offset += std::uint64_t(got);
    }
  }

  /// SHA-256 of the whole file, read in 1 MiB pieces.
  std::string sha256_hex() const {
    sha256 h;
    if (fd_ < 0) {
      h.update(memory_.data(), memory_.size());
      return h.hex();
    }
    std::vector<char> buf(std::size_t(1) << 20);
    for (std::uint64_t at = 0; at < size_;) {
      const std::size_t n = std::size_t(std::min<std::uint64_t>(buf.size(), size_ - at));
      read(at, buf.data(), n);
      h.update(buf.data(), n);
      at += n;
    }
    return h.hex();
  }

  /// The whole file as text, refused beyond `limit` bytes.
  std::string text(std::uint64_t limit) const {
    if (size_ > limit) corrupt(what_, "", std::to_string(size_) + " bytes, more than " + std::to_string(limit));
    std::string s(std::size_t(size_), '\0');
    read(0, s.data(), s.size());
    return s;
  }

 private:
  void close() noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  int fd_ = -1;
  std::span<const std::byte> memory_;
  std::uint64_t size_ = 0;
  std::string what_;
};

inline nlohmann::json parse_json(const std::string& text, const std::string& what) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    corrupt(what, "", std::string("malformed JSON: ") + e.what());
  }
}

/// Reads a whole file (the benchmark's baseline read).
inline std::vector<char> read_file(const std::filesystem::path& path) {
  const auto f = input_file::open(path);
  std::vector<char> data(static_cast<std::size_t>(f.size()));
  f.read(0, data.data(), data.size());
  return data;
}

}  // namespace detail::ckpt

}  // namespace dtf
