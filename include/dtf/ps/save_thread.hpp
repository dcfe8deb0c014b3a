// dtf/ps/save_thread.hpp — where a parameter server writes its checkpoint files: a thread of
// its own, so the I/O threads go on serving pulls and pushes while a multi-GiB file is written
// (each shard copied under its lock just before its bytes are written, into one buffer: a save
// holds at most one shard's values and slots, dtf/ps/shard_snapshot.hpp). One save at a time:
// a save that arrives while the previous one is still writing waits for it (so at most one
// such buffer exists).
#pragma once

#include <functional>
#include <mutex>
#include <thread>
#include <utility>

namespace dtf::ps_detail {

class save_thread {
 public:
  save_thread() = default;
  save_thread(const save_thread&) = delete;
  save_thread& operator=(const save_thread&) = delete;
  /// Waits for the save being written.
  ~save_thread() { join(); }

  /// Runs `job` on the save thread, after the previous job ended. `job` must not throw (it
  /// answers its request itself, with the error when there is one).
  void run(std::function<void()> job) {
    std::lock_guard g(mu_);
    if (thread_.joinable()) thread_.join();
    thread_ = std::thread(std::move(job));
  }

  /// Waits for the job being run, if any.
  void join() {
    std::lock_guard g(mu_);
    if (thread_.joinable()) thread_.join();
  }

 private:
  std::mutex mu_;
  std::thread thread_;
};

}  // namespace dtf::ps_detail
