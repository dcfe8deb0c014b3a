// bench_tls_overhead — what TLS 1.3 (--tls: transport_options::tls, collective_options::tls)
// costs: the parameter-server transport's pull and push_deltas throughput of one variable, and
// the ring's allreduce bus bandwidth (float32 sum, 2 ranks as threads of this process), at 1, 16
// and 64 MiB on loopback, with TLS off and on, measured alternately in one run (round k measures
// plain then TLS, so a change in the machine's load affects both), each result verified before
// it is reported. The load average is printed before and after: on a shared machine the
// figures are only as steady as it is.
//
//   build/benchmarks/bench_tls_overhead [--rounds 5] [--reps 5] [--sections ps,allreduce]
//
// Output: per size and operation, the median GB/s (1e9 bytes/s) of each mode over the rounds
// and the ratio TLS / plain. Allreduce figures are bus bandwidth, bytes/time * 2(n-1)/n (with
// n = 2 ranks: bytes/time), of rank 0's median call.
#include <dtf/collectives.hpp>
#include <dtf/error.hpp>
#include <dtf/flags.hpp>
#include <dtf/partitioners.hpp>
#include <dtf/ps.hpp>

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace {
using clock_type = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Median seconds of one call of f over `reps` timed calls, after one untimed call.
double median_call(const std::function<void()>& f, int reps) {
  f();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = clock_type::now();
    f();
    t.push_back(std::chrono::duration<double>(clock_type::now() - t0).count());
  }
  return median(t);
}

dtf::transport_options options(std::string identity, bool tls) {
  dtf::transport_options o;
  o.cluster_id = "bench";
  o.identity = std::move(identity);
  o.secret = "bench-secret";  // the same in both modes: only the encryption differs
  o.tls = tls;
  o.timeout_ms = 120000;
  o.log = [](const std::string&) {};
  return o;
}

// One ps on a background thread and a client holding one variable of n floats, all zero.
struct setup {
  std::unique_ptr<dtf::parameter_server> ps;
  std::thread thread;
  std::optional<dtf::ps_client> client;
  std::size_t n;
  int pushes = 0;
  setup(std::size_t floats, bool tls) : n(floats) {
    ps = std::make_unique<dtf::parameter_server>("127.0.0.1:0", dtf::ps_options{options("ps.0", tls), 1});
    thread = std::thread([p = ps.get()] { p->run(); });
    const std::vector<dtf::variable_spec> vars{{"v", {n}, 0}};
    client.emplace(std::vector<std::string>{"127.0.0.1:" + std::to_string(ps->port())},
                   dtf::partitioners::round_robin{}.place(vars, 1), options("worker.0", tls));
    client->connect();
    client->initialize(std::vector<float>(n, 0.0f), {dtf::optim::sgd{1.0f}});
  }
  ~setup() {
    client.reset();
    ps->stop();
    thread.join();
  }
  // Every element must be pushes / 8 (deltas of 1/8: exact sums).
  void verify(const std::vector<float>& pulled, const char* mode) const {
    const float want = float(pushes) / 8.0f;
    for (std::size_t i = 0; i < n; ++i)
      if (pulled[i] != want)
        throw dtf::error(dtf::errc::internal, std::string(mode) + ": element " + std::to_string(i) + " is " +
                                                  std::to_string(pulled[i]) + ", expected " + std::to_string(want));
  }
};

// Two ranks of a ring as threads of this process, on loopback, with TLS off or on.
struct ring_pair {
  std::optional<dtf::communicator> comm[2];

  explicit ring_pair(bool tls) {
    std::vector<dtf::ring_listener> listeners;
    std::vector<std::string> addresses;
    for (int r = 0; r < 2; ++r) {
      listeners.emplace_back("127.0.0.1:0");
      addresses.push_back("127.0.0.1:" + std::to_string(listeners.back().port()));
    }
    dtf::collective_options o;
    o.cluster_id = "bench";
    o.secret = "bench-secret";  // the same in both modes: only the encryption differs
    o.tls = tls;
    o.timeout_ms = 120000;
    on_both([&](int r) { comm[r].emplace(std::move(listeners[std::size_t(r)]), std::size_t(r), addresses,
                                         std::vector<std::string>{}, o); });
  }

  // Runs f(rank) on two threads; rethrows the first failure.
  template <class F>
  static void on_both(F f) {
    std::exception_ptr failure[2];
    std::thread other([&] {
      try {
        f(1);
      } catch (...) {
        failure[1] = std::current_exception();
      }
    });
    try {
      f(0);
    } catch (...) {
      failure[0] = std::current_exception();
    }
    other.join();
    for (auto& e : failure)
      if (e) std::rethrow_exception(e);
  }

  // Median seconds of rank 0's allreduce (float32 sum) of `bytes` over `reps` timed calls after
  // one untimed call; each call starts from fresh values after a barrier; the first and the
  // last result are verified on both ranks.
  double allreduce_median(std::size_t bytes, int reps, const char* mode) {
    std::vector<double> times;
    on_both([&](int r) {
      dtf::communicator& c = *comm[r];
      std::vector<float> v(bytes / sizeof(float));
      for (int it = 0; it <= reps; ++it) {
        for (std::size_t i = 0; i < v.size(); ++i) v[i] = float(i % 17) + float(r);
        c.barrier();
        const auto t0 = clock_type::now();
        c.allreduce<float>("bench", v);
        const double t = std::chrono::duration<double>(clock_type::now() - t0).count();
        if (it == 0 || it == reps)
          for (std::size_t i = 0; i < v.size(); ++i)
            if (v[i] != 2.0f * float(i % 17) + 1.0f)
              throw dtf::error(dtf::errc::internal, std::string(mode) + " allreduce: element " + std::to_string(i) +
                                                        " is " + std::to_string(v[i]));
        if (r == 0 && it > 0) times.push_back(t);
      }
    });
    return median(times);
  }
};

std::string load_average() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  if (!(f >> a >> b >> c)) return "unknown";
  return a + " " + b + " " + c;
}

}  // namespace

int main(int argc, char** argv) try {
  int rounds = 5, reps = 5;
  std::string sections = "ps,allreduce";
  dtf::flag_parser flags("Parameter-server pull/push throughput and ring allreduce bus bandwidth with TLS off and "
                         "on, alternately, in one run.");
  flags.add("rounds", rounds, "alternations of plain and TLS per size (median reported)")
      .add("reps", reps, "timed calls per operation per round (median taken)")
      .add("sections", sections, "what to measure: ps, allreduce or both (comma-separated)");
  if (!flags.parse(argc, argv)) return 0;
  rounds = std::max(rounds, 1);
  reps = std::max(reps, 1);
  ::signal(SIGPIPE, SIG_IGN);
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  std::printf("== bench_tls_overhead: loopback 127.0.0.1, %u hardware threads, GB/s = 1e9 B/s, %d rounds x %d reps ==\n",
              std::thread::hardware_concurrency(), rounds, reps);
  std::printf("load average (1, 5, 15 min) at start: %s\n", load_average().c_str());
  std::printf("%-8s %-15s %12s %12s %10s\n", "size", "op", "plain GB/s", "TLS GB/s", "TLS/plain");
  const bool ps_section = sections.find("ps") != std::string::npos;
  const bool allreduce_section = sections.find("allreduce") != std::string::npos;
  for (const std::size_t mib : {1, 16, 64}) {
    if (!ps_section) break;
    const std::size_t bytes = mib << 20, n = bytes / sizeof(float);
    setup plain(n, false), tls(n, true);
    const std::vector<float> delta(n, 0.125f);
    std::vector<float> pulled(n);
    std::vector<double> pull_gbps[2], push_gbps[2];
    for (int r = 0; r < rounds; ++r) {
      for (int m = 0; m < 2; ++m) {
        setup& s = m == 0 ? plain : tls;
        const double t_push = median_call([&] { s.client->push_deltas(delta), ++s.pushes; }, reps);
        const double t_pull = median_call([&] { s.client->pull(pulled); }, reps);
        s.verify(pulled, m == 0 ? "plain" : "TLS");
        push_gbps[m].push_back(double(bytes) / t_push / 1e9);
        pull_gbps[m].push_back(double(bytes) / t_pull / 1e9);
      }
    }
    for (int op = 0; op < 2; ++op) {
      const auto& g = op == 0 ? pull_gbps : push_gbps;
      const double p = median(g[0]), t = median(g[1]);
      std::printf("%-8s %-15s %12.3f %12.3f %10.2f\n", (std::to_string(mib) + " MiB").c_str(),
                  op == 0 ? "pull" : "push", p, t, t / p);
    }
  }
  if (allreduce_section) {
    ring_pair plain(false), tls(true);
    for (const std::size_t mib : {1, 16, 64}) {
      const std::size_t bytes = mib << 20;
      std::vector<double> busbw[2];
      for (int r = 0; r < rounds; ++r)
        for (int m = 0; m < 2; ++m) {
          ring_pair& p = m == 0 ? plain : tls;
          const double t = p.allreduce_median(bytes, reps, m == 0 ? "plain" : "TLS");
          busbw[m].push_back(double(bytes) / t / 1e9);  // 2 ranks: 2(n-1)/n = 1
        }
      const double p = median(busbw[0]), t = median(busbw[1]);
      std::printf("%-8s %-15s %12.3f %12.3f %10.2f\n", (std::to_string(mib) + " MiB").c_str(), "allreduce busbw", p, t,
                  t / p);
    }
  }
  std::printf("load average (1, 5, 15 min) at end: %s\n", load_average().c_str());
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_tls_overhead: %s\n", e.what());
  return 1;
}
