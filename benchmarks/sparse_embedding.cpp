// Sparse embedding throughput: one worker process gathers and pushes the rows of Zipf-drawn id
// batches from a table sharded over ps processes (forked here, on loopback).
//
//   bench_sparse_embedding [--rows 10000000] [--dim 20] [--ps 3] [--batch 4096] [--zipf 1.1]
//                          [--seconds 20] [--hashed_ids 0] [--max_rows 0] [--workers 1]
//
// --hashed_ids N > 0 uses a hashed table instead (ids Zipf-drawn from [1, N], rows created on
// first touch; --max_rows bounds it). Prints one line of key=value figures: the table's creation
// time, gathers and pushes per second, unique rows per step and per second, bytes on the wire per
// step against pulling and pushing the whole table, and the resident memory (VmRSS, VmHWM) of
// the worker and of each ps.
#include <dtf/optim.hpp>
#include <dtf/ps.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

namespace {

std::string arg(int argc, char** argv, const std::string& name, const std::string& def) {
  for (int i = 1; i + 1 < argc; ++i)
    if (argv[i] == "--" + name) return argv[i + 1];
  return def;
}

// VmRSS and VmHWM of a process, in MiB.
std::pair<double, double> memory_of(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  double rss = 0, hwm = 0;
  while (std::getline(f, line)) {
    std::istringstream s(line);
    std::string key;
    double kb = 0;
    s >> key >> kb;
    if (key == "VmRSS:") rss = kb / 1024;
    if (key == "VmHWM:") hwm = kb / 1024;
  }
  return {rss, hwm};
}

// Zipf(s) over [1, n] by rejection from the continuous tail (numpy's Generator.zipf algorithm
// for s > 1, drawing again above n), so the peer script's numpy draws follow the same law.
struct zipf {
  double am1, b;
  std::uint64_t n;
  std::mt19937_64 gen;
  std::uniform_real_distribution<double> u{0.0, 1.0};
  zipf(double s, std::uint64_t n, std::uint64_t seed) : am1(s - 1), b(std::pow(2.0, s - 1)), n(n), gen(seed) {}
  std::uint64_t operator()() {
    for (;;) {
      const double U = 1.0 - u(gen), V = u(gen);
      const double X = std::floor(std::pow(U, -1.0 / am1));
      if (X < 1 || X > double(n)) continue;
      const double T = std::pow(1.0 + 1.0 / X, am1);
      if (V * X * (T - 1.0) / (b - 1.0) <= T / b) return std::uint64_t(X);
    }
  }
};

dtf::transport_options options(const std::string& identity) {
  dtf::transport_options o;
  o.cluster_id = "bench-sparse";
  o.identity = identity;
  o.timeout_ms = 600000;
  o.log = [](const std::string&) {};
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  const std::uint64_t rows = std::stoull(arg(argc, argv, "rows", "10000000"));
  const std::uint32_t dim = std::uint32_t(std::stoul(arg(argc, argv, "dim", "20")));
  const std::size_t num_ps = std::stoul(arg(argc, argv, "ps", "3"));
  const std::size_t batch = std::stoul(arg(argc, argv, "batch", "4096"));
  const double s = std::stod(arg(argc, argv, "zipf", "1.1"));
  const double seconds = std::stod(arg(argc, argv, "seconds", "20"));
  const std::uint64_t hashed_ids = std::stoull(arg(argc, argv, "hashed_ids", "0"));
  const std::uint64_t max_rows = std::stoull(arg(argc, argv, "max_rows", "0"));
  const std::size_t workers = std::stoul(arg(argc, argv, "workers", "1"));

  // The ps processes, forked before this process starts any thread.
  std::vector<pid_t> pids;
  std::vector<std::uint16_t> ports;
  for (std::size_t p = 0; p < num_ps; ++p) {
    int fd[2];
    if (pipe(fd) != 0) return 1;
    const pid_t pid = fork();
    if (pid == 0) {
      close(fd[0]);
      dtf::ps_options o{options("ps." + std::to_string(p))};
      dtf::parameter_server ps("127.0.0.1:0", o);
      const std::uint16_t port = ps.port();
      if (write(fd[1], &port, sizeof port) != sizeof port) _exit(1);
      close(fd[1]);
      ps.run();
      _exit(0);
    }
    close(fd[1]);
    std::uint16_t port = 0;
    if (read(fd[0], &port, sizeof port) != sizeof port) return 1;
    close(fd[0]);
    pids.push_back(pid);
    ports.push_back(port);
  }
  int rc = 0;
  try {
    std::vector<std::string> addresses;
    for (auto port : ports) addresses.push_back("127.0.0.1:" + std::to_string(port));
    dtf::ps_client client(addresses, dtf::placement{{}, num_ps}, options("worker.0"));
    client.connect();
    dtf::embedding_tables tables(client);
    dtf::embedding_spec spec{.name = "embedding", .rows = hashed_ids > 0 ? 0 : rows, .dim = dim};
    if (max_rows > 0) spec.max_rows = max_rows;
    const auto t = hashed_ids > 0 ? tables.add_hashed(spec) : tables.add_fixed(spec, dtf::partitioners::fixed_size{num_ps});
    const auto t0 = std::chrono::steady_clock::now();
    tables.create(t, dtf::optim::sgd{0.1f});
    const double init_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

    // The workers: processes forked now (this one holds no thread of its own but the
    // client's), each with its own client, reporting through a pipe.
    struct report {
      std::uint64_t steps, unique;
      double elapsed, rss, hwm;
    };
    std::vector<pid_t> worker_pids;
    std::vector<int> reads;
    for (std::size_t w = 0; w < workers; ++w) {
      int fd[2];
      if (pipe(fd) != 0) return 1;
      const pid_t pid = fork();
      if (pid == 0) {
        close(fd[0]);
        dtf::ps_client wc(addresses, dtf::placement{{}, num_ps}, options("worker." + std::to_string(w + 1)));
        wc.connect();
        dtf::embedding_tables wt(wc);
        const auto wt_t = hashed_ids > 0 ? wt.add_hashed(spec) : wt.add_fixed(spec, dtf::partitioners::fixed_size{num_ps});
        zipf draw(s, hashed_ids > 0 ? hashed_ids : rows, 42 + w);
        std::vector<std::uint64_t> ids(batch);
        std::vector<float> values, grads;
        std::uint64_t steps = 0, unique = 0;
        const auto start = std::chrono::steady_clock::now();
        double elapsed = 0;
        while (elapsed < seconds) {
          for (auto& id : ids) id = hashed_ids > 0 ? draw() : draw() - 1;
          const auto l = wt.plan(wt_t, ids);
          values.resize(l.rows() * dim);
          grads.resize(values.size());
          wt.gather(l, values);
          for (std::size_t i = 0; i < values.size(); ++i) grads[i] = 2e-3f * values[i];  // d/dw of 1e-3 * sum w^2
          wt.push(l, grads);
          ++steps;
          unique += l.rows();
          elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        }
        const auto [rss, hwm] = memory_of(getpid());
        report r{steps, unique, elapsed, rss, hwm};
        if (write(fd[1], &r, sizeof r) != sizeof r) _exit(1);
        _exit(0);
      }
      close(fd[1]);
      worker_pids.push_back(pid);
      reads.push_back(fd[0]);
    }
    std::uint64_t steps = 0, unique = 0;
    double elapsed = 0, wrss = 0, whwm = 0, rows_per_s = 0, steps_per_s = 0;
    for (std::size_t w = 0; w < workers; ++w) {
      report r{};
      if (read(reads[w], &r, sizeof r) != sizeof r) throw std::runtime_error("a worker process failed");
      waitpid(worker_pids[w], nullptr, 0);
      steps += r.steps;
      unique += r.unique;
      elapsed = std::max(elapsed, r.elapsed);
      rows_per_s += double(r.unique) / r.elapsed;
      steps_per_s += double(r.steps) / r.elapsed;
      wrss = std::max(wrss, r.rss);
      whwm = std::max(whwm, r.hwm);
    }
    const double per_step = double(unique) / double(steps);
    const double wire = 2.0 * per_step * (8.0 + 4.0 * dim);  // ids out twice, rows back and forth
    const auto held = tables.rows(t);
    const double dense = 2.0 * double(hashed_ids > 0 ? held.held : rows) * dim * 4.0;
    std::printf("impl=dtf kind=%s rows=%llu dim=%u ps=%zu batch=%zu zipf=%.2f workers=%zu init_s=%.3f steps=%llu steps_per_s=%.1f "
                "unique_rows_per_step=%.0f rows_per_s=%.0f wire_bytes_per_step=%.0f dense_bytes_per_step=%.0f "
                "rows_held=%llu worker_rss_mib=%.1f worker_hwm_mib=%.1f",
                hashed_ids > 0 ? "hashed" : "fixed", (unsigned long long)(hashed_ids > 0 ? hashed_ids : rows), dim,
                num_ps, batch, s, workers, init_s, (unsigned long long)steps, steps_per_s, per_step, rows_per_s, wire, dense, (unsigned long long)held.held, wrss, whwm);
    for (std::size_t p = 0; p < num_ps; ++p) {
      const auto [rss, hwm] = memory_of(pids[p]);
      std::printf(" ps%zu_rss_mib=%.1f ps%zu_hwm_mib=%.1f", p, rss, p, hwm);
    }
    // The table's bytes: a fixed table's rows, a hashed table's rows held.
    std::printf(" table_mib=%.1f\n", double(hashed_ids > 0 ? held.held : rows) * dim * 4.0 / (1 << 20));
    client.shutdown();
  } catch (const std::exception& e) {
    std::cerr << "bench_sparse_embedding: " << e.what() << "\n";
    for (auto pid : pids) kill(pid, SIGTERM);
    rc = 1;
  }
  for (auto pid : pids) waitpid(pid, nullptr, 0);
  return rc;
}
