// bench_ps_throughput — parameter-server pull and push throughput against iperf3's
// single-stream TCP throughput on loopback, measured side by side in one run (DESIGN §9).
//
//   1. iperf3 -c 127.0.0.1 (one stream, forward and -R) against an iperf3 -s -1 child process
//   2. one ps on a background thread of this process, one ps_client, one variable of N floats
//      (4 KiB .. --max_mib MiB): median latency and GB/s of pull (locked and lock-free ps),
//      push_deltas and push_gradients (sgd), and the ratio of each to iperf3's GB/s
//   3. pushes (and pulls) per second of 4 KiB in a tight loop
//   4. one worker pulling and pushing the Fashion-MNIST MLP (784-256-128-10, 235,146 floats)
//      placed over 1, 2 and 4 ps by greedy_load_balancing and fixed_size{4}
//   5. push_gradients of one variable in 16 shards (4 MiB .. --max_mib), to a ps applying it as
//      it arrives and to one applying it once all in (ps_options::apply_as_received), alternately
// Everything talks to 127.0.0.1. GB/s is 1e9 bytes per second.
//
//   build/benchmarks/bench_ps_throughput [--repeats 7] [--max_mib 64] [--iperf_seconds 3] [--skip_iperf]
#include <dtf/error.hpp>
#include <dtf/flags.hpp>
#include <dtf/partitioners.hpp>
#include <dtf/ps.hpp>

#include <asio.hpp>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace {
using clock_type = std::chrono::steady_clock;
using dtf::errc;
using dtf::error;

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Median seconds of one call of f over `reps` timed calls, after `warmup` untimed ones.
double median_call(const std::function<void()>& f, int reps, int warmup = 2) {
  for (int i = 0; i < warmup; ++i) f();
  std::vector<double> t;
  t.reserve(std::size_t(reps));
  for (int i = 0; i < reps; ++i) {
    const auto t0 = clock_type::now();
    f();
    t.push_back(seconds_since(t0));
  }
  return median(t);
}

// ---- machine load --------------------------------------------------------------------------

// The machine is shared: CPU time that other processes (and the hypervisor, as steal) took
// while a section ran, from /proc/stat minus this process's and its waited-for children's
// own time. Tick-sampled (4 ms), so only a rough figure; it says whether a section's numbers
// were disturbed.
struct cpu_meter {
  struct sample {
    double busy = 0, steal = 0, own = 0;
    clock_type::time_point at;
  };
  static sample now() {
    sample s;
    s.at = clock_type::now();
    std::ifstream f("/proc/stat");
    std::string cpu;
    double user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
    if (f >> cpu >> user >> nice >> system >> idle >> iowait >> irq >> softirq >> steal) {
      const double hz = double(::sysconf(_SC_CLK_TCK));
      s.busy = (user + nice + system + irq + softirq) / hz;
      s.steal = steal / hz;
    }
    for (int who : {RUSAGE_SELF, RUSAGE_CHILDREN}) {
      rusage u{};
      ::getrusage(who, &u);
      s.own += double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + 1e-6 * double(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
    }
    return s;
  }
  sample start = now();
  // "other processes: 0.03 cores, steal 0.00 cores" over the time since construction.
  std::string report() const {
    const sample e = now();
    const double wall = std::chrono::duration<double>(e.at - start.at).count();
    const double others = std::max(0.0, (e.busy - start.busy) - (e.own - start.own)) / wall;
    const double steal = (e.steal - start.steal) / wall;
    char buf[200];
    std::snprintf(buf, sizeof buf, "other processes used %.2f cores, steal %.2f cores, over %.1f s%s", others, steal,
                  wall, others + steal > 0.25 ? "  << DISTURBED: figures unreliable, rerun on a quiet machine" : "");
    return buf;
  }
};

// ---- iperf3 ---------------------------------------------------------------------------------

// A free TCP port on loopback: bind port 0, read it, close (iperf3 binds it next).
std::uint16_t free_port() {
  asio::io_context io;
  dtf::detail::tcp_acceptor a(io, asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
  const auto port = a.local_endpoint().port();
  a.close();
  return port;
}

// `iperf3 -s -1 -p port` as a child process, output discarded; killed if still running.
struct iperf_server {
  pid_t pid = -1;
  explicit iperf_server(std::uint16_t port) {
    const std::string p = std::to_string(port);
    pid = ::fork();
    if (pid < 0) throw error(errc::io_error, "fork failed");
    if (pid == 0) {
      const int null = ::open("/dev/null", O_RDWR);
      if (null >= 0) {
        ::dup2(null, 1);
        ::dup2(null, 2);
      }
      ::execlp("iperf3", "iperf3", "-s", "-1", "-B", "127.0.0.1", "-p", p.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
  }
  bool exited() {
    if (pid < 0) return true;
    int st = 0;
    if (::waitpid(pid, &st, WNOHANG) == pid) {
      pid = -1;
      return true;
    }
    return false;
  }
  // Waits (bounded) for the one-shot server to exit after its client, then kills it.
  ~iperf_server() {
    for (int i = 0; i < 200 && !exited(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  }
};

std::pair<int, std::string> run_capture(const std::string& cmd) {
  FILE* f = ::popen(cmd.c_str(), "r");
  if (!f) throw error(errc::io_error, "popen failed: " + cmd);
  std::string out;
  std::array<char, 4096> buf;
  std::size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), f)) > 0) out.append(buf.data(), n);
  const int st = ::pclose(f);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

struct iperf_result {
  double gbps = 0;  // GB/s received
  int attempts = 0;
  double retrans = 0;
};

// One single-stream iperf3 run on loopback; the client is retried (bounded, with a short
// growing back-off) until the freshly started server accepts it.
iperf_result run_iperf(int seconds, bool reverse) {
  const std::uint16_t port = free_port();
  iperf_server server(port);
  const std::string cmd = "iperf3 -c 127.0.0.1 -p " + std::to_string(port) + " -t " + std::to_string(seconds) +
                          " -J" + (reverse ? " -R" : "") + " 2>&1";
  std::string last;
  auto backoff = std::chrono::milliseconds(2);
  for (int attempt = 1; attempt <= 60; ++attempt) {
    auto [rc, out] = run_capture(cmd);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(out);
    } catch (const std::exception&) {
      j = nullptr;
    }
    if (rc == 0 && j.is_object() && j.contains("end") && j["end"].contains("sum_received")) {
      iperf_result r;
      r.gbps = j["end"]["sum_received"]["bits_per_second"].get<double>() / 8e9;
      if (j["end"].contains("sum_sent") && j["end"]["sum_sent"].contains("retransmits"))
        r.retrans = j["end"]["sum_sent"]["retransmits"].get<double>();
      r.attempts = attempt;
      return r;
    }
    last = j.is_object() && j.contains("error") ? j["error"].get<std::string>() : out.substr(0, 200);
    while (!last.empty() && std::isspace(static_cast<unsigned char>(last.back()))) last.pop_back();
    if (server.exited())
      throw error(errc::io_error, "iperf3 server on port " + std::to_string(port) + " exited: " + last +
                                      " (is iperf3 installed? --skip_iperf runs without it)");
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(100));
  }
  throw error(errc::timeout, "iperf3 client never got through: " + last + " (--skip_iperf runs without it)");
}

// ---- parameter servers ----------------------------------------------------------------------

dtf::transport_options quiet(std::string identity) {
  dtf::transport_options o;
  o.cluster_id = "bench";
  o.identity = std::move(identity);
  o.timeout_ms = 120000;
  o.connect_timeout_ms = 10000;
  o.log = [](const std::string&) {};  // init/shutdown lines; failures reach the client as errors
  return o;
}

// A ps task on a background thread of this process (as in tests/test_transport.cpp).
struct running_ps {
  std::unique_ptr<dtf::parameter_server> ps;
  std::thread thread;
  explicit running_ps(std::string identity, bool as_received = true, int threads = 1) {
    dtf::ps_options o{quiet(std::move(identity)), threads};
    o.apply_as_received = as_received;
    ps = std::make_unique<dtf::parameter_server>("127.0.0.1:0", o);
    thread = std::thread([p = ps.get()] { p->run(); });
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(ps->port()); }
  ~running_ps() {
    ps->stop();
    thread.join();
  }
};

// n ps tasks and a connected, initialised client for `vars` placed by `layout`.
struct cluster {
  std::vector<std::unique_ptr<running_ps>> ps;
  std::optional<dtf::ps_client> client;
  cluster(const dtf::placement& layout, std::span<const float> init, const dtf::optim::rule& rule, bool lock_free,
          bool as_received = true, int threads = 1) {
    std::vector<std::string> addrs;
    for (std::size_t i = 0; i < layout.num_ps; ++i) {
      ps.push_back(std::make_unique<running_ps>("ps." + std::to_string(i), as_received, threads));
      addrs.push_back(ps.back()->address());
    }
    client.emplace(addrs, layout, quiet("worker.0"));
    client->connect();
    client->initialize(init, {rule, lock_free ? dtf::apply_mode::lock_free : dtf::apply_mode::locked});
  }
};

void expect_equal(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  for (std::size_t i = 0; i < want.size(); ++i)
    if (!(got[i] == want[i]))
      throw error(errc::internal, what + ": element " + std::to_string(i) + " is " + std::to_string(got[i]) +
                                      ", expected " + std::to_string(want[i]));
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  for (std::size_t i = 0; i < want.size(); ++i)
    if (!(std::abs(got[i] - want[i]) <= 1e-6f * (1.0f + std::abs(want[i]))))
      throw error(errc::internal, what + ": element " + std::to_string(i) + " is " + std::to_string(got[i]) +
                                      ", expected " + std::to_string(want[i]));
}

std::vector<float> pattern(std::size_t n, std::uint32_t seed) {
  std::vector<float> v(n);
  std::uint32_t x = seed * 2654435761u + 1;
  for (auto& e : v) {
    x = x * 1664525u + 1013904223u;
    e = float(int(x >> 9) % 2001 - 1000) / 256.0f;  // multiples of 1/256: sums are exact
  }
  return v;
}

std::string human_size(std::size_t bytes) {
  if (bytes >= (std::size_t(1) << 20)) return std::to_string(bytes >> 20) + " MiB";
  return std::to_string(bytes >> 10) + " KiB";
}

struct size_row {
  std::size_t bytes;
  int reps;
  double pull, pull_lf, push_delta, push_sgd;  // median seconds
};

// Section 2 for one size: locked and lock-free ps, each op timed `reps` times, verified.
size_row measure_size(std::size_t bytes, int min_reps) {
  const std::size_t n = bytes / sizeof(float);
  const std::vector<dtf::variable_spec> vars{{"v", {n}, 0}};
  const auto layout = dtf::partitioners::round_robin{}.place(vars, 1);
  // Enough repetitions that each measurement moves ~1 GiB (at least min_reps, at most 2000).
  const int reps = int(std::clamp<std::size_t>((std::size_t(1) << 30) / bytes, std::size_t(min_reps), 2000));
  const float lr = 0.5f;
  const auto init = pattern(n, 1), deltas = pattern(n, 2), grads = pattern(n, 3);
  std::vector<float> buf(n, 0.0f);
  size_row row{bytes, reps, 0, 0, 0, 0};

  {
    cluster c(layout, init, dtf::optim::sgd{lr}, /*lock_free=*/false);
    auto& cl = *c.client;
    cl.pull(buf);
    expect_equal(buf, init, "locked pull after initialize (" + human_size(bytes) + ")");
    row.pull = median_call([&] { cl.pull(buf); }, reps);
    row.push_delta = median_call([&] { cl.push_deltas(deltas, false); }, reps);
    row.push_sgd = median_call([&] { cl.push_gradients(grads, std::nullopt, false); }, reps);
    // Verify: a push_deltas of known values, then a pull, returns exactly current + delta;
    // a push of gradients returns current - lr * g (the ps applies sgd).
    std::vector<float> before(n), want(n);
    cl.pull(before);
    cl.push_deltas(deltas, false);
    cl.pull(buf);
    for (std::size_t i = 0; i < n; ++i) want[i] = before[i] + deltas[i];
    expect_equal(buf, want, "pull after push_deltas (" + human_size(bytes) + ")");
    before = buf;
    cl.push_gradients(grads, std::nullopt, false);
    cl.pull(buf);
    for (std::size_t i = 0; i < n; ++i) want[i] = before[i] - lr * grads[i];
    expect_close(buf, want, "pull after push_gradients/sgd (" + human_size(bytes) + ")");
  }
  {
    cluster c(layout, init, dtf::optim::sgd{lr}, /*lock_free=*/true);
    auto& cl = *c.client;
    cl.pull(buf);
    expect_equal(buf, init, "lock-free pull after initialize (" + human_size(bytes) + ")");
    row.pull_lf = median_call([&] { cl.pull(buf); }, reps);
    std::vector<float> want(n);
    cl.push_deltas(deltas, false);
    cl.pull(buf);
    for (std::size_t i = 0; i < n; ++i) want[i] = init[i] + deltas[i];
    expect_equal(buf, want, "lock-free pull after push_deltas (" + human_size(bytes) + ")");
  }
  return row;
}

// Section 5 for one size: a push of gradients (sgd) of one variable cut into 16 shards, to a
// ps applying it as it arrives and to one applying it once it is all in (each `threads` I/O
// threads), measured alternately, `rounds` medians of `reps` calls each; verified equal.
struct pieces_row {
  std::size_t bytes;
  int threads;
  double whole, pieced;  // median seconds
  std::uint64_t pieced_pushes;
};
pieces_row measure_pieces(std::size_t bytes, int threads, int reps, int rounds) {
  const std::size_t n = bytes / sizeof(float);
  const auto layout = dtf::partitioners::fixed_size{16}.place({{"v", {16, n / 16}, 0}}, 1);
  const auto init = pattern(n, 8), grads = pattern(n, 9);
  cluster whole(layout, init, dtf::optim::sgd{0.5f}, false, false, threads);
  cluster pieced(layout, init, dtf::optim::sgd{0.5f}, false, true, threads);
  std::vector<double> w, p;
  for (int r = 0; r < rounds; ++r) {
    w.push_back(median_call([&] { whole.client->push_gradients(grads, std::nullopt, false); }, reps));
    p.push_back(median_call([&] { pieced.client->push_gradients(grads, std::nullopt, false); }, reps));
  }
  std::vector<float> a(n), b(n);
  whole.client->pull(a);
  pieced.client->pull(b);
  expect_equal(b, a, "push applied as it arrives against one applied whole (" + human_size(bytes) + ")");
  return {bytes, threads, median(w), median(p), pieced.ps[0]->ps->pushes_applied_as_received()};
}

std::vector<dtf::variable_spec> mlp_vars() {
  std::vector<dtf::variable_spec> v{{"dense_0/kernel", {784, 256}, 0}, {"dense_0/bias", {256}, 0},
                                    {"dense_1/kernel", {256, 128}, 0}, {"dense_1/bias", {128}, 0},
                                    {"dense_2/kernel", {128, 10}, 0},  {"dense_2/bias", {10}, 0}};
  std::size_t at = 0;
  for (auto& s : v) {
    s.offset = at;
    at += s.size();
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) try {
  using namespace dtf;
  int repeats = 7, max_mib = 64, iperf_seconds = 3;
  bool skip_iperf = false;
  flag_parser flags("Parameter-server pull/push throughput on loopback against iperf3's single stream, one run.");
  flags.add("repeats", repeats, "minimum timed repetitions per measurement (small sizes get more; median reported)")
      .add("max_mib", max_mib, "largest variable in MiB (sizes 4 KiB .. this, x4 steps)")
      .add("iperf_seconds", iperf_seconds, "duration of each iperf3 run")
      .add("skip_iperf", skip_iperf, "do not run iperf3 (ratios are then not printed)");
  if (!flags.parse(argc, argv)) return 0;
  repeats = std::max(repeats, 5);
  ::signal(SIGPIPE, SIG_IGN);
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // tables appear as they are measured, in order with errors

  std::printf("== bench_ps_throughput: loopback 127.0.0.1, %u hardware threads, GB/s = 1e9 B/s ==\n",
              std::thread::hardware_concurrency());

  // 1. iperf3
  double ref = 0;
  if (!skip_iperf) {
    std::printf("\n== 1. iperf3, one TCP stream on loopback, %d s each (measured now) ==\n", iperf_seconds);
    cpu_meter load1;
    const auto fwd = run_iperf(iperf_seconds, false);
    const auto rev = run_iperf(iperf_seconds, true);
    std::printf("%-22s %10s %10s\n", "direction", "GB/s", "attempts");
    std::printf("%-22s %10.3f %10d\n", "client -> server", fwd.gbps, fwd.attempts);
    std::printf("%-22s %10.3f %10d\n", "server -> client (-R)", rev.gbps, rev.attempts);
    std::printf("load during section 1: %s\n", load1.report().c_str());
    ref = fwd.gbps;
  }

  // 2. one variable, sizes 4 KiB .. max_mib MiB
  cpu_meter load2;
  std::printf("\n== 2. one ps (thread in this process, 1 I/O thread) + one ps_client, one variable ==\n");
  std::printf("ps in LOCKED mode (default): each pull leases the shard and its reply is written from the\n"
              "shard's memory (copy on write: no copy); 'pull lf' = the same pull from a ps initialised with\n"
              "lock_free=true (values copied with relaxed atomic loads into a reply buffer).\n"
              "push d = push_deltas (ps adds), push g = push_gradients (ps applies sgd).\n"
              "Median of `reps` calls after 2 warm-up calls; every size verified (pull after push_deltas exact).\n\n");
  std::vector<size_row> rows;
  for (std::size_t bytes = 4 << 10; bytes <= (std::size_t(max_mib) << 20); bytes *= 4) rows.push_back(measure_size(bytes, repeats));

  const std::string load2_report = load2.report();
  if (!skip_iperf) {
    // iperf3 again, so that a change of the machine's load during section 2 shows; the
    // reference is the mean of the forward runs before and after.
    const auto after = run_iperf(iperf_seconds, false);
    std::printf("iperf3 forward again after the ps measurements: %.3f GB/s (before %.3f, change %+.0f%%)\n",
                after.gbps, ref, 100.0 * (after.gbps / ref - 1.0));
    ref = 0.5 * (ref + after.gbps);
    std::printf("reference for ratios: %.3f GB/s (mean of the two forward single-stream runs)\n\n", ref);
  }
  std::printf("%9s %5s | %10s %10s %10s %10s  (median us)\n", "size", "reps", "pull", "pull lf", "push d", "push g");
  for (const auto& r : rows)
    std::printf("%9s %5d | %10.1f %10.1f %10.1f %10.1f\n", human_size(r.bytes).c_str(), r.reps, 1e6 * r.pull,
                1e6 * r.pull_lf, 1e6 * r.push_delta, 1e6 * r.push_sgd);
  std::printf("\n%9s | %8s %8s %8s %8s |", "size", "pull", "pull lf", "push d", "push g");
  if (ref > 0) std::printf(" %7s %7s %7s %7s  (ratio to iperf3 %.2f GB/s)", "pull", "pull lf", "push d", "push g", ref);
  std::printf("\n%9s | %35s |\n", "", "GB/s");
  for (const auto& r : rows) {
    const double b = double(r.bytes);
    const double g[4] = {b / r.pull / 1e9, b / r.pull_lf / 1e9, b / r.push_delta / 1e9, b / r.push_sgd / 1e9};
    std::printf("%9s | %8.3f %8.3f %8.3f %8.3f |", human_size(r.bytes).c_str(), g[0], g[1], g[2], g[3]);
    if (ref > 0) std::printf(" %7.2f %7.2f %7.2f %7.2f", g[0] / ref, g[1] / ref, g[2] / ref, g[3] / ref);
    std::printf("\n");
  }
  if (ref > 0) {
    bool any = false;
    std::printf("target (issue): pull and push >= 0.70 x iperf3 for 16 MiB and up:");
    for (const auto& r : rows) {
      if (r.bytes < (std::size_t(16) << 20)) continue;
      const double b = double(r.bytes), worst = std::min({b / r.pull, b / r.push_delta, b / r.push_sgd}) / 1e9 / ref;
      std::printf(" %s %s (min %.2f);", human_size(r.bytes).c_str(), worst >= 0.7 ? "MET" : "MISSED", worst);
      any = true;
    }
    std::printf("%s\n", any ? "" : " no size >= 16 MiB measured (raise --max_mib)");
  }
  std::printf("load during section 2: %s\n", load2_report.c_str());

  // 3. small-message rate
  {
    std::printf("\n== 3. 4 KiB messages in a tight loop, ~1 s each (locked ps) ==\n");
    cpu_meter load3;
    const std::size_t n = 1024;
    const auto layout = partitioners::round_robin{}.place({{"v", {n}, 0}}, 1);
    const auto init = pattern(n, 4), deltas = pattern(n, 5);
    cluster c(layout, init, optim::sgd{0.1f}, false);
    std::vector<float> buf(n);
    auto rate = [&](const std::function<void()>& f) {
      for (int i = 0; i < 100; ++i) f();
      std::size_t count = 0;
      const auto t0 = clock_type::now();
      double el = 0;
      do {
        for (int i = 0; i < 64; ++i) f();
        count += 64;
      } while ((el = seconds_since(t0)) < 1.0);
      return double(count) / el;
    };
    const double pushes = rate([&] { c.client->push_deltas(deltas); });
    const double pulls = rate([&] { c.client->pull(buf); });
    std::printf("%-28s %12.0f /s  (%.1f us each)\n", "push_deltas (step counted)", pushes, 1e6 / pushes);
    std::printf("%-28s %12.0f /s  (%.1f us each)\n", "pull", pulls, 1e6 / pulls);
    std::printf("load during section 3: %s\n", load3.report().c_str());
  }

  // 4. the Fashion-MNIST MLP over 1, 2, 4 ps
  {
    cpu_meter load4;
    const auto vars = mlp_vars();
    const std::size_t n = num_parameters(vars);
    const double bytes = double(n * sizeof(float));
    std::printf("\n== 4. one worker, Fashion-MNIST MLP 784-256-128-10 (%zu floats, %.0f KiB), locked ps ==\n", n,
                bytes / 1024);
    std::printf("push = push_gradients (sgd on the ps, step counted); median of %d calls after 2 warm-up\n",
                std::max(repeats, 50));
    std::printf("%-14s %4s %7s %12s | %10s %8s | %10s %8s", "partitioner", "ps", "shards", "max KiB/ps", "pull us",
                "GB/s", "push us", "GB/s");
    if (ref > 0) std::printf(" | %10s", "iperf3 us");
    std::printf("\n");
    const auto init = pattern(n, 6), grads = pattern(n, 7);
    for (const std::string name : {"greedy", "fixed_size{4}"}) {
      for (std::size_t num_ps : {1, 2, 4}) {
        const placement layout = name == "greedy" ? partitioners::greedy_load_balancing{}.place(vars, num_ps)
                                                  : partitioners::fixed_size{4}.place(vars, num_ps);
        cluster c(layout, init, optim::sgd{0.01f}, false);
        std::vector<float> buf(n);
        c.client->pull(buf);
        expect_equal(buf, init, "MLP pull after initialize (" + name + ", " + std::to_string(num_ps) + " ps)");
        const int reps = std::max(repeats, 50);
        const double pull = median_call([&] { c.client->pull(buf); }, reps);
        const double push = median_call([&] { c.client->push_gradients(grads); }, reps);
        std::size_t max_bytes = 0;
        for (std::size_t p = 0; p < num_ps; ++p) max_bytes = std::max(max_bytes, layout.bytes_on(p));
        std::printf("%-14s %4zu %7zu %12.0f | %10.1f %8.3f | %10.1f %8.3f", name.c_str(), num_ps, layout.shards.size(),
                    double(max_bytes) / 1024, 1e6 * pull, bytes / pull / 1e9, 1e6 * push, bytes / push / 1e9);
        if (ref > 0) std::printf(" | %10.1f", 1e6 * bytes / (ref * 1e9));
        std::printf("\n");
      }
    }
    if (ref > 0) std::printf("(iperf3 us = the model's bytes at iperf3's single-stream rate)\n");
    std::printf("load during section 4: %s\n", load4.report().c_str());
  }

  // 5. a push applied as it arrives against one applied whole
  if (max_mib >= 4) {
    cpu_meter load5;
    std::printf("\n== 5. push_gradients (sgd) of one variable in 16 shards: applied as it arrives, or once all in ==\n");
    std::printf("two ps side by side (apply_as_received on / off), measured alternately: median of %d rounds of\n"
                "median-of-reps calls; values verified equal. ratio = GB/s / iperf3 reference.\n",
                std::max(3, repeats / 2));
    std::printf("%9s %8s | %10s %10s | %8s %8s | %7s %7s | %s\n", "size", "threads", "whole us", "pieces us",
                "whole", "pieces", "whole", "pieces", "pieces/whole speed");
    for (std::size_t mib = 4; mib <= std::size_t(max_mib); mib *= 4)
      for (int threads : {1, 2}) {
        const std::size_t bytes = mib << 20;
        const int reps = int(std::clamp<std::size_t>((std::size_t(1) << 29) / bytes, 5, 64));
        const auto r = measure_pieces(bytes, threads, reps, std::max(3, repeats / 2));
        const double gw = double(bytes) / r.whole / 1e9, gp = double(bytes) / r.pieced / 1e9;
        std::printf("%9s %8d | %10.1f %10.1f | %8.3f %8.3f |", human_size(bytes).c_str(), threads, 1e6 * r.whole,
                    1e6 * r.pieced, gw, gp);
        if (ref > 0)
          std::printf(" %7.2f %7.2f |", gw / ref, gp / ref);
        else
          std::printf(" %7s %7s |", "-", "-");
        std::printf(" %.2f (%llu pushes in pieces)\n", r.whole / r.pieced, (unsigned long long)r.pieced_pushes);
      }
    std::printf("load during section 5: %s\n", load5.report().c_str());
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_ps_throughput: %s\n", e.what());
  return 1;
}
