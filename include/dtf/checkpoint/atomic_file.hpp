// dtf/checkpoint/atomic_file.hpp — one checkpoint file written crash-safely and without
// trusting the directory's contents (used by dtf/checkpoint/writer.hpp).
//
// Every file is written to a fresh temporary name FINAL.tmp.<16 random hex digits>, opened
// with O_CREAT|O_EXCL|O_NOFOLLOW (so whatever sits in the directory — a symlink planted at a
// predictable name, yesterday's debris — is never written through or truncated), flushed
// (fsync), renamed over FINAL, and the directory is synced. A write that fails (or a
// checkpoint_fault) leaves the temporary file behind, as a crash would; commit_checkpoint
// sweeps such debris.
//
// Thread safety: an atomic_file is used by one thread. Errors: errc::io_error (a file cannot be
// created, written, read back, synced or renamed; a fault injected).
#pragma once

#include <dtf/checkpoint/input_file.hpp>
#include <dtf/detail/sha256.hpp>
#include <dtf/error.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace dtf {

/// Testing aid for crash safety: makes a write stop after `abort_after_bytes` bytes of a file,
/// leaving its temporary file on disk as a crash would, and throw errc::io_error — or, with
/// kill_process, SIGKILL this very process there (a real crash in the middle of a save).
struct checkpoint_fault {
  std::uint64_t abort_after_bytes = 0;  ///< 0: off
  /// SIGKILL this process at that point instead of throwing.
  bool kill_process = false;
  /// Tests: called on a parameter server's save thread before it writes its files.
  std::function<void()> before_write;
  /// Tests: called on a parameter server's save thread after each shard was copied (its lock
  /// released, its bytes not yet written), with the bytes the save's copy buffer then holds
  /// (dtf/ps/shard_snapshot.hpp: at most one shard's values and slots).
  std::function<void(std::uint64_t)> shard_copied;
};

namespace detail::ckpt {

/// A contiguous byte range to write.
struct piece {
  const void* data;
  std::size_t size;
};

/// What was written.
struct written {
  std::uint64_t bytes = 0;
  std::string sha256;
};

inline void fsync_directory(const std::filesystem::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw error(errc::io_error, "cannot open directory " + dir.string() + ": " + errno_text());
  const int rc = ::fsync(fd);
  const int saved = errno;
  ::close(fd);
  if (rc != 0 && saved != EINVAL)  // some file systems cannot sync a directory
    throw error(errc::io_error, "cannot sync directory " + dir.string() + ": " + std::strerror(saved));
}

/// 16 hex digits from the kernel's random source: a temporary name nobody predicted.
inline std::string random_suffix() {
  std::uint64_t r = 0;
  auto* at = reinterpret_cast<char*>(&r);
  for (std::size_t got = 0; got < sizeof r;) {
    const ssize_t n = ::getrandom(at + got, sizeof r - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw error(errc::io_error, std::string("getrandom: ") + errno_text());
    }
    got += std::size_t(n);
  }
  static constexpr char hex[] = "0123456789abcdef";
  std::string s(16, '0');
  for (std::size_t i = 0; i < 16; ++i) s[i] = hex[(r >> (4 * i)) & 0xf];
  return s;
}

/// Creates FINAL.tmp.<random> exclusively, never through a symlink (read-write: a file whose
/// header is written last is read back for its checksum). Returns its descriptor.
inline int create_temporary(const std::filesystem::path& path, std::filesystem::path& tmp) {
  for (int attempt = 0; attempt < 16; ++attempt) {
    tmp = std::filesystem::path(path.string() + ".tmp." + random_suffix());
    const int fd = ::open(tmp.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd >= 0) return fd;
    if (errno != EEXIST) throw error(errc::io_error, "cannot create " + tmp.string() + ": " + errno_text());
  }
  throw error(errc::io_error, "cannot create a temporary file beside " + path.string() + ": every name taken");
}

/// A file being written crash-safely (see the file comment): bytes are appended in order (the
/// fault counts them), a range already appended may be written over (a header whose contents
/// are known only once what follows it is written), and commit() syncs it and renames it into
/// place. Destroyed uncommitted, it leaves its temporary file, as a crash would.
class atomic_file {
 public:
  /// `rewrites`: some range will be written over, so commit() computes the SHA-256 by reading
  /// the file back (otherwise it is computed as the bytes are appended).
  atomic_file(std::filesystem::path path, checkpoint_fault fault, bool rewrites = false)
      : path_(std::move(path)), fault_(std::move(fault)), rewrites_(rewrites) {
    fd_ = create_temporary(path_, tmp_);
  }
  ~atomic_file() {
    if (fd_ >= 0) ::close(fd_);
  }
  atomic_file(const atomic_file&) = delete;
  atomic_file& operator=(const atomic_file&) = delete;

  void append(const void* data, std::size_t size) {
    if (!rewrites_) hash_.update(data, size);
    const auto* at = static_cast<const char*>(data);
    while (size > 0) {
      std::size_t chunk = std::min<std::size_t>(size, std::size_t(1) << 30);
      if (fault_.abort_after_bytes != 0) {
        if (bytes_ >= fault_.abort_after_bytes) injected_fault();
        chunk = std::min<std::size_t>(chunk, fault_.abort_after_bytes - bytes_);
      }
      const ssize_t n = ::write(fd_, at, chunk);
      if (n < 0) {
        if (errno == EINTR) continue;
        fail("cannot write " + tmp_.string() + ": " + errno_text());
      }
      at += n;
      size -= std::size_t(n);
      bytes_ += std::uint64_t(n);
    }
  }

  /// Writes `size` bytes over [at, at + size), a range already appended (constructed with
  /// `rewrites`).
  void overwrite(std::uint64_t at, const void* data, std::size_t size) {
    DTF_ASSERT(rewrites_ && at <= bytes_ && size <= bytes_ - at, "an overwrite stays within the bytes appended");
    const auto* from = static_cast<const char*>(data);
    while (size > 0) {
      const ssize_t n = ::pwrite(fd_, from, std::min<std::size_t>(size, std::size_t(1) << 30), off_t(at));
      if (n < 0) {
        if (errno == EINTR) continue;
        fail("cannot write " + tmp_.string() + ": " + errno_text());
      }
      from += n;
      at += std::uint64_t(n);
      size -= std::size_t(n);
    }
  }

  /// Syncs the file, renames it over its final name and syncs the directory. Returns its size
  /// and SHA-256.
  written commit() {
    if (fault_.abort_after_bytes != 0 && bytes_ >= fault_.abort_after_bytes) injected_fault();
    written w{bytes_, rewrites_ ? read_back_sha256() : hash_.hex()};
    if (::fsync(fd_) != 0) fail("cannot sync " + tmp_.string() + ": " + errno_text());
    if (::close(std::exchange(fd_, -1)) != 0)
      throw error(errc::io_error, "cannot close " + tmp_.string() + ": " + errno_text());
    if (::rename(tmp_.c_str(), path_.c_str()) != 0)
      throw error(errc::io_error, "cannot rename " + tmp_.string() + " to " + path_.string() + ": " + errno_text());
    fsync_directory(path_.has_parent_path() ? path_.parent_path() : std::filesystem::path("."));
    return w;
  }

 private:
  [[noreturn]] void fail(const std::string& what) {
    ::close(std::exchange(fd_, -1));
    throw error(errc::io_error, what);
  }

  [[noreturn]] void injected_fault() {
    if (fault_.kill_process) ::kill(::getpid(), SIGKILL);
    fail("fault injection: write of " + path_.string() + " aborted after " + std::to_string(bytes_) + " bytes");
  }

  // The file's bytes as they are now, through the descriptor written (1 MiB at a time).
  std::string read_back_sha256() {
    sha256 h;
    std::vector<char> buf(std::size_t(std::min<std::uint64_t>(bytes_, std::uint64_t(1) << 20)));
    for (std::uint64_t at = 0; at < bytes_;) {
      const ssize_t n = ::pread(fd_, buf.data(), std::size_t(std::min<std::uint64_t>(buf.size(), bytes_ - at)), off_t(at));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) fail("cannot read back " + tmp_.string() + ": " + (n < 0 ? errno_text() : "it shrank"));
      h.update(buf.data(), std::size_t(n));
      at += std::uint64_t(n);
    }
    return h.hex();
  }

  std::filesystem::path path_, tmp_;
  checkpoint_fault fault_;
  bool rewrites_;
  int fd_ = -1;
  std::uint64_t bytes_ = 0;
  sha256 hash_;
};

/// Writes `pieces` to `path` crash-safely (see the file comment).
inline written write_atomically(const std::filesystem::path& path, std::span<const piece> pieces,
                                const checkpoint_fault& fault = {}) {
  atomic_file f(path, fault);
  for (const auto& p : pieces) f.append(p.data, p.size);
  return f.commit();
}

inline written write_text_atomically(const std::filesystem::path& path, const std::string& text) {
  const piece p{text.data(), text.size()};
  return write_atomically(path, std::span<const piece>(&p, 1));
}

}  // namespace detail::ckpt
}  // namespace dtf
