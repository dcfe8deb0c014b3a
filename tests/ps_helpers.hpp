// Test helpers for the parameter server: options with short timeouts, a ps on a background
// thread bound to a free loopback port, and a log collector.
#pragma once

#include <dtf/ps.hpp>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <regex>
#include <string>
#include <thread>
#include <vector>

namespace dtf::test {

// Collects a server's log lines for assertions.
struct log_sink {
  std::mutex mu;
  std::condition_variable logged;
  std::vector<std::string> lines;
  std::function<void(const std::string&)> fn() {
    return [this](const std::string& l) {
      {
        std::lock_guard g(mu);
        lines.push_back(l);
      }
      logged.notify_all();
    };
  }
  bool contains(const std::string& s) {
    std::lock_guard g(mu);
    return holds(s);
  }
  // Waits (bounded) until a line containing s is logged.
  bool wait_for(const std::string& s, std::chrono::milliseconds limit = std::chrono::seconds(10)) {
    std::unique_lock g(mu);
    return logged.wait_for(g, limit, [&] { return holds(s); });
  }
  // Lines containing s so far.
  std::size_t count(const std::string& s) {
    std::lock_guard g(mu);
    return count_of(s);
  }
  // Waits (bounded) until n lines containing s are logged; false when the limit passed first.
  bool wait_for_count(const std::string& s, std::size_t n, std::chrono::milliseconds limit) {
    std::unique_lock g(mu);
    return logged.wait_for(g, limit, [&] { return count_of(s) >= n; });
  }

 private:
  std::size_t count_of(const std::string& s) const {
    std::size_t n = 0;
    for (auto& l : lines) n += l.find(s) != std::string::npos;
    return n;
  }
  bool holds(const std::string& s) const {
    for (auto& l : lines)
      if (l.find(s) != std::string::npos) return true;
    return false;
  }
};

// The lines of `log` containing `marker`, and the events they stand for: a line a log_limiter
// let through stands for itself and the ones it held back before it ("(N similar lines
// suppressed)"; `held` matches the count in other wordings).
struct logged_count {
  std::size_t lines = 0, events = 0;
};
inline logged_count count_logged(log_sink& log, const std::string& marker,
                                 const std::regex& held = std::regex(R"(\((\d+) similar lines suppressed\))")) {
  std::lock_guard g(log.mu);
  logged_count c;
  for (const auto& l : log.lines) {
    if (l.find(marker) == std::string::npos) continue;
    ++c.lines;
    ++c.events;
    if (std::smatch m; std::regex_search(l, m, held)) c.events += std::stoul(m[1].str());
  }
  return c;
}

// n floats drawn uniformly from [-scale, scale] with `seed`.
inline std::vector<float> seeded_uniform(std::size_t n, std::uint32_t seed, float scale) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = scale * d(gen);
  return v;
}

inline transport_options opts(std::string identity, std::string secret = "", log_sink* log = nullptr) {
  transport_options o;
  o.cluster_id = "test-cluster";
  o.identity = std::move(identity);
  o.secret = std::move(secret);
  o.timeout_ms = 5000;
  o.connect_timeout_ms = 5000;
  o.handshake_timeout_ms = 2000;
  o.frame_timeout_ms = 300;
  o.refusal_log_interval_ms = 0;  // tests look for each refusal's line
  if (log) o.log = log->fn();
  return o;
}

// A ps task on a background thread; destroying it stops and joins it (like killing the task:
// its connections close).
struct running_ps {
  std::unique_ptr<parameter_server> ps;
  std::thread thread;
  explicit running_ps(transport_options o, int threads = 1) : running_ps(ps_options{std::move(o), threads}) {}
  explicit running_ps(ps_options o) {
    ps = std::make_unique<parameter_server>("127.0.0.1:0", std::move(o));
    thread = std::thread([p = ps.get()] { p->run(); });
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(ps->port()); }
  void kill() {
    if (!ps) return;
    ps->stop();
    thread.join();
    ps.reset();
  }
  /// Stops this ps and starts a fresh one (nothing of the old one's state) on the same port.
  void restart(ps_options o) {
    const std::string a = address();
    kill();
    ps = std::make_unique<parameter_server>(a, std::move(o));
    thread = std::thread([p = ps.get()] { p->run(); });
  }
  ~running_ps() { kill(); }
};

}  // namespace dtf::test
