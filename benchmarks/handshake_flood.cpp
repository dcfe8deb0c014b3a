// How long a worker waits to connect to a ps while strangers flood it (issue 44, item 3):
// 1,100 silent connections from 60 addresses (127.0.0.2 and up; Linux routes all of 127/8 to
// the loopback), each opened again as soon as the ps closes it; the worker, from 127.0.0.1,
// connects 3 s into the flood. Run twice: the ps with one handshake budget for everyone, and
// with the cluster's host (127.0.0.1) given slots of its own (transport_options::cluster_hosts).
// The ps uses the default budgets and deadlines (max_handshakes 256, 32 per source, 2 s).
//
// Usage: bench_handshake_flood [connections=1100] [addresses=60] [flood_before_s=3]
// Output: one line per run, "cluster_hosts=<off|on> connect_s=<seconds>" (or the error).
#include <dtf/partitioners.hpp>
#include <dtf/ps.hpp>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

namespace {

// A non-blocking connection from `source` to 127.0.0.1:port (-1 when no descriptor is left).
int open_from(const std::string& source, std::uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in from{};
  from.sin_family = AF_INET;
  ::inet_pton(AF_INET, source.c_str(), &from.sin_addr);
  ::bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof from);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(port);
  ::inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
  ::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof to);
  return fd;
}

// Keeps `n` silent connections from `addresses` sources open until `stop`, re-opening each one
// the ps closes.
void flood(std::uint16_t port, std::size_t n, std::size_t addresses, const std::atomic<bool>& stop) {
  std::vector<pollfd> fds(n);
  std::vector<std::string> source(n);
  for (std::size_t i = 0; i < n; ++i) {
    source[i] = "127.0.0." + std::to_string(2 + i % addresses);
    fds[i] = {open_from(source[i], port), POLLIN, 0};
  }
  char buf[256];
  while (!stop.load()) {
    if (::poll(fds.data(), fds.size(), 20) < 0) continue;
    for (std::size_t i = 0; i < n; ++i) {
      if (fds[i].revents == 0) continue;
      if (::read(fds[i].fd, buf, sizeof buf) > 0) continue;  // (the ps sends nothing first)
      ::close(fds[i].fd);
      fds[i].fd = open_from(source[i], port);
      fds[i].revents = 0;
    }
  }
  for (auto& p : fds) ::close(p.fd);
}

double connect_seconds(bool cluster_hosts, std::size_t n, std::size_t addresses, int flood_before_s) {
  const std::string secret = "a cluster secret of some length";
  dtf::transport_options o;
  o.identity = "ps.0";
  o.cluster_id = "bench";
  o.secret = secret;
  o.log = [](const std::string&) {};
  if (cluster_hosts) o.cluster_hosts = {"127.0.0.1:1"};
  dtf::parameter_server ps("127.0.0.1:0", dtf::ps_options{o});
  std::thread serving([&] { ps.run(); });
  std::atomic<bool> stop{false};
  std::thread strangers([&] { flood(ps.port(), n, addresses, stop); });
  std::this_thread::sleep_for(std::chrono::seconds(flood_before_s));  // the flood's head start
  dtf::transport_options w;
  w.identity = "worker.0";
  w.cluster_id = "bench";
  w.secret = secret;
  w.connect_timeout_ms = 60000;
  const std::vector<dtf::variable_spec> vars{{"w", {8, 4}, 0}};
  double seconds = -1;
  try {
    dtf::ps_client c({"127.0.0.1:" + std::to_string(ps.port())}, dtf::partitioners::round_robin{}.place(vars, 1), w);
    const auto t0 = std::chrono::steady_clock::now();
    c.connect();
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  } catch (const std::exception& e) {
    std::printf("cluster_hosts=%s error: %s\n", cluster_hosts ? "on" : "off", e.what());
  }
  stop = true;
  strangers.join();
  ps.stop();
  serving.join();
  return seconds;
}

}  // namespace

int main(int argc, char** argv) {
  const std::size_t n = argc > 1 ? std::size_t(std::atoi(argv[1])) : 1100;
  const std::size_t addresses = argc > 2 ? std::size_t(std::atoi(argv[2])) : 60;
  const int before = argc > 3 ? std::atoi(argv[3]) : 3;
  rlimit r{};
  ::getrlimit(RLIMIT_NOFILE, &r);
  r.rlim_cur = r.rlim_max;  // a descriptor per stranger here and one at the ps (same process)
  ::setrlimit(RLIMIT_NOFILE, &r);
  for (const bool on : {false, true}) {
    const double s = connect_seconds(on, n, addresses, before);
    if (s >= 0) std::printf("cluster_hosts=%s connections=%zu addresses=%zu connect_s=%.2f\n", on ? "on" : "off", n,
                            addresses, s);
    std::fflush(stdout);
  }
}
