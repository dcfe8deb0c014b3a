// bench_large_model — a large model (default 6 GiB of float32) on 2 ps with momentum, each task
// a process of its own, so that each one's peak resident memory is its own (issue 31).
// The same binary plays every role; benchmarks/large_model.sh starts the processes, kills them
// between runs and prints the summary table:
//
//   --role ps      a parameter server on --host (default 127.0.0.1), port 0: writes "PORT PID"
//                  to --port_file (through a rename) and serves until shut down or killed;
//                  --dir is its ps_options::checkpoint_dir
//   --role chief   the chief, which also trains (the job's one worker), in one of three runs:
//     --run train          1. init: initialize() with the model's values and the momentum rule
//                          2. --steps steps: pull the whole model, the gradient of the loss
//                             0.5 ||w - t||^2 computed in place in the pulled buffer (g = w - t,
//                             t computed from the index: no second model-sized buffer),
//                             push_gradients; pull, gradient and push timed apart (median)
//                          3. save_checkpoint into --dir
//     --run restore_chief  restore_checkpoint through the chief into fresh ps, then
//     --run restore_files  ... with restore_transfer::ps_reads_files (each ps reads its files)
//                          after either: pull and check a sample of --samples elements against
//                          values recomputed here from the initial values and momentum SGD
//                          (v = mu v + g; w -= lr v, dtf/optim/rules.hpp), then one more step
//                          (push, pull) checked the same way: the restored momentum slot counts
// The chief prints a line "result RUN PHASE SECONDS BYTES CHIEF_VMHWM_KIB" per phase (GB/s is
// bytes / seconds / 1e9): init, pull, push and gradient move the model's bytes; save and restore
// the checkpoint's (values and momentum, as on disk). Peak resident memory is VmHWM of
// /proc/PID/status: the chief's read by itself after each phase, the ps's read by the script
// before it kills them (a ps that is shut down prints its own).
// The model: 4 variables of [rows, 1024] float32, placed by variable_axis_size with
// --shard_mib MiB shards (default 64: a 6 GiB model is 96 shards) over the ps.
// Transport options (transport(), the chief's and every ps's), for a loopback or a link of
// 1 Gbit/s (large_model.sh --netns). A ps's share moves in requests of at most
// max_request_bytes (64 MiB: about 0.55 s at 1 Gbit/s, 1.1 s when the two ps share the link),
// one request per ps at a time, and the server's deadlines follow progress, so:
//   frame_timeout_ms, write_timeout_ms  10 s (the defaults): the longest pause between two
//       bytes of a frame or of a reply, which on a working link is far below a second whatever
//       the frame's size (the shaper holds a packet at most 50 ms)
//   timeout_ms  10 min: the longest request is not a transfer but a save or a restore with
//       ps_reads_files: one request per ps that writes or reads the ps's whole share, values
//       and momentum (6 GiB a ps for a 6 GiB model), so the disk sets it: 10 min allows 10 MB/s
//   idle_timeout_ms  10 min (the default): the chief's longest quiet spell on a connection
//       (filling the initial values, a gradient of the whole model: seconds)
//
//   build/benchmarks/bench_large_model --role ps --index 0 --port_file /tmp/d/ps0.port --dir /tmp/d/ckpt
//       [--host 127.0.0.1]
//   build/benchmarks/bench_large_model --role chief --run train --ps 127.0.0.1:P0,127.0.0.1:P1
//       --dir /tmp/d/ckpt [--gib 6] [--steps 3] [--shard_mib 64] [--lr 0.1] [--momentum 0.9]
//       [--secret_file F]
#include <dtf/checkpoint.hpp>
#include <dtf/flags.hpp>
#include <dtf/partitioners.hpp>
#include <dtf/ps.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

namespace {
using clock_type = std::chrono::steady_clock;

struct settings {
  std::string role, run = "train", ps, port_file, dir = "/tmp/dtf_large_model/ckpt", secret_file, host = "127.0.0.1";
  int index = 0, steps = 3, samples = 1024, shard_mib = 64, ps_threads = 1;
  double gib = 6;
  float lr = 0.1f, momentum = 0.9f;
};

// Peak resident memory of this process (VmHWM of /proc/self/status), KiB.
long vm_hwm_kib() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("VmHWM:", 0) == 0) return std::stol(line.substr(6));
  return -1;
}

double secs_since(clock_type::time_point t0) { return std::chrono::duration<double>(clock_type::now() - t0).count(); }

// Element i's initial value and target: a hash of i mapped to [-1, 1] in steps of 1e-3, so the
// reference below recomputes any element without the model.
std::uint64_t mix(std::uint64_t x) {  // splitmix64's finaliser
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
float unit(std::uint64_t h) { return float(int(h % 2001) - 1000) * 1e-3f; }
float initial_value(std::size_t i) { return unit(mix(2 * i + 1)); }
float target_value(std::size_t i) { return unit(mix(2 * i + 2)); }

// f(begin, end) over [0, n) in contiguous parts, one per hardware thread.
void parallel_for(std::size_t n, const std::function<void(std::size_t, std::size_t)>& f) {
  const std::size_t parts = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::thread> threads;
  for (std::size_t p = 0; p < parts; ++p) threads.emplace_back(f, n * p / parts, n * (p + 1) / parts);
  for (auto& t : threads) t.join();
}

// --gib GiB of float32 as 4 variables of [rows, 1024].
std::vector<dtf::variable_spec> model_of(double gib) {
  constexpr std::size_t vars = 4, cols = 1024;
  const auto floats = std::size_t(std::llround(gib * double(std::size_t(1) << 30) / sizeof(float)));
  const std::size_t rows = floats / (vars * cols);
  if (rows == 0) throw dtf::error(dtf::errc::invalid_argument, "--gib: too small a model");
  std::vector<dtf::variable_spec> out;
  for (std::size_t v = 0; v < vars; ++v)
    out.push_back({"layer_" + std::to_string(v) + "/kernel", {rows, cols}, v * rows * cols});
  return out;
}

dtf::transport_options transport(const settings& s, const std::string& identity) {
  dtf::transport_options o;
  o.cluster_id = "large_model";
  o.identity = identity;
  if (!s.secret_file.empty()) o.secret = dtf::read_secret_file(s.secret_file);
  // Why these: the header comment (requests of at most 64 MiB; a save is one request per ps).
  o.timeout_ms = 600000;
  o.frame_timeout_ms = 10000;
  o.write_timeout_ms = 10000;
  o.idle_timeout_ms = 600000;
  return o;
}

int run_ps(const settings& s) {
  if (s.port_file.empty()) throw dtf::error(dtf::errc::invalid_config, "--role ps needs --port_file");
  dtf::ps_options o;
  o.transport = transport(s, "ps." + std::to_string(s.index));
  o.threads = s.ps_threads;
  o.checkpoint_dir = s.dir;
  o.chief = "chief.0";
  dtf::parameter_server server(s.host + ":0", o);
  {
    const std::string tmp = s.port_file + ".tmp";
    std::ofstream(tmp) << server.port() << ' ' << ::getpid() << '\n';
    std::filesystem::rename(tmp, s.port_file);  // the script sees the whole line or nothing
  }
  std::printf("ps.%d: serving on %s:%u, pid %d\n", s.index, s.host.c_str(), unsigned(server.port()),
              int(::getpid()));
  std::fflush(stdout);
  server.run();
  std::printf("ps.%d: VmHWM %ld KiB\n", s.index, vm_hwm_kib());
  return 0;
}

// The chief's side: the client, the model and the phases' results.
struct chief {
  const settings& s;
  std::vector<dtf::variable_spec> vars;
  dtf::placement layout;
  std::size_t n = 0;
  dtf::ps_config config;
  dtf::ps_client client;

  static std::vector<std::string> addresses(const std::string& list) {
    std::vector<std::string> out;
    std::stringstream in(list);
    for (std::string a; std::getline(in, a, ',');) out.push_back(a);
    if (out.size() != 2) throw dtf::error(dtf::errc::invalid_config, "--ps: two host:port, comma-separated");
    return out;
  }
  explicit chief(const settings& st)
      : s(st),
        vars(model_of(st.gib)),
        layout(dtf::partitioners::variable_axis_size{std::size_t(st.shard_mib) << 20}.place(vars, 2)),
        n(dtf::num_parameters(vars)),
        config{dtf::optim::momentum{.learning_rate = st.lr, .momentum = st.momentum}},
        client(addresses(st.ps), layout, transport(st, "chief.0")) {
    client.connect();
  }

  double model_bytes() const { return double(n) * sizeof(float); }
  void result(const char* phase, double seconds, double bytes) const {
    std::printf("result %s %s %.6f %.0f %ld\n", s.run.c_str(), phase, seconds, bytes, vm_hwm_kib());
    std::fflush(stdout);
  }

  // g = w - t, in place.
  void gradient_in_place(std::vector<float>& w) const {
    parallel_for(n, [&](std::size_t b, std::size_t e) {
      for (std::size_t i = b; i < e; ++i) w[i] -= target_value(i);
    });
  }

  // Element i after `steps` steps of momentum SGD from its initial value, as the ps computes it
  // (dtf::optim::detail::momentum_kernel, in float).
  float expected(std::size_t i, int steps) const {
    float w = initial_value(i), v = 0.0f;
    for (int k = 0; k < steps; ++k) {
      const float g = w - target_value(i);
      v = s.momentum * v + g;
      w -= s.lr * v;
    }
    return w;
  }

  // Compares a sample of w (the first and last element among them) with expected(., steps).
  void check(const std::vector<float>& w, int steps) const {
    double worst = 0;
    std::size_t moved = 0;
    const std::size_t k = std::size_t(std::max(2, s.samples));
    for (std::size_t j = 0; j < k; ++j) {
      const std::size_t i = (n - 1) * j / (k - 1);
      const float want = expected(i, steps);
      const double err = std::fabs(double(w[i]) - double(want));
      worst = std::max(worst, err);
      if (err > 1e-5 * (1 + std::fabs(double(want))))
        throw dtf::error(dtf::errc::internal, "element " + std::to_string(i) + " holds " + std::to_string(w[i]) +
                                                  ", momentum SGD gives " + std::to_string(want) + " after " +
                                                  std::to_string(steps) + " steps");
      moved += w[i] != initial_value(i);
    }
    if (steps > 0 && moved == 0) throw dtf::error(dtf::errc::internal, "no sampled element moved from its initial value");
    std::printf("check: %zu sampled elements hold their values after %d steps (largest difference %.3g)\n", k, steps,
                worst);
  }

  double time_pull(std::vector<float>& w) {
    const auto t0 = clock_type::now();
    client.pull(w);
    return secs_since(t0);
  }
  double time_push(const std::vector<float>& g) {
    const auto t0 = clock_type::now();
    client.push_gradients(g);
    return secs_since(t0);
  }
  double time_gradient(std::vector<float>& w) const {
    const auto t0 = clock_type::now();
    gradient_in_place(w);
    return secs_since(t0);
  }

  void train() {
    std::vector<float> w(n);
    parallel_for(n, [&](std::size_t b, std::size_t e) {
      for (std::size_t i = b; i < e; ++i) w[i] = initial_value(i);
    });
    auto t0 = clock_type::now();
    client.initialize(w, config);
    result("init", secs_since(t0), model_bytes());
    std::vector<double> pulls, grads, pushes;
    for (int step = 0; step < s.steps; ++step) {
      pulls.push_back(time_pull(w));
      grads.push_back(time_gradient(w));
      pushes.push_back(time_push(w));
    }
    const auto median = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v.empty() ? 0.0 : v[v.size() / 2];
    };
    result("pull", median(pulls), model_bytes());
    result("gradient", median(grads), model_bytes());
    result("push", median(pushes), model_bytes());
    t0 = clock_type::now();
    const auto m = dtf::save_checkpoint(client, {s.dir, "large", 1}, vars, s.steps);
    const double seconds = secs_since(t0);
    double bytes = 0;
    for (const auto& f : m.files) bytes += double(f.bytes);
    result("save", seconds, bytes);
    std::printf("saved %s: %zu files, %.3f GiB\n", m.name.c_str(), m.files.size(), bytes / double(1 << 30));
  }

  void restore(dtf::restore_transfer how) {
    const auto name = dtf::latest_checkpoint(s.dir);
    if (!name) throw dtf::error(dtf::errc::io_error, "no checkpoint in " + s.dir + " (run --run train first)");
    double bytes = 0;
    for (const auto& f : dtf::read_manifest(s.dir, *name).files) bytes += double(f.bytes);
    auto t0 = clock_type::now();
    const auto step = dtf::restore_checkpoint(client, s.dir, *name, vars, config, {}, how);
    result("restore", secs_since(t0), bytes);
    if (step != s.steps)
      throw dtf::error(dtf::errc::internal, "restored global step " + std::to_string(step) + ", saved at " +
                                                std::to_string(s.steps));
    std::vector<float> w(n);  // after the restore: its peak is the restore's own
    result("pull", time_pull(w), model_bytes());
    check(w, s.steps);
    // One more step: its values depend on the restored momentum slot.
    gradient_in_place(w);
    result("push", time_push(w), model_bytes());
    client.pull(w);
    check(w, s.steps + 1);
  }
};
}  // namespace

int main(int argc, char** argv) try {
  settings s;
  dtf::flag_parser flags("A large model on 2 ps with momentum, each task a process (benchmarks/large_model.sh).");
  flags.add("role", s.role, "ps or chief")
      .add("run", s.run, "chief: train (init, steps, save), restore_chief or restore_files")
      .add("index", s.index, "ps: its index (0 or 1)")
      .add("host", s.host, "ps: the address it listens on (port 0: the system picks)")
      .add("port_file", s.port_file, "ps: where it writes \"PORT PID\" once it listens")
      .add("ps", s.ps, "chief: the two ps, host:port,host:port")
      .add("dir", s.dir, "checkpoint directory, the chief's and every ps's")
      .add("gib", s.gib, "chief: model size in GiB of float32")
      .add("steps", s.steps, "chief: training steps before the save (the restores check against it)")
      .add("samples", s.samples, "chief: elements checked after a restore")
      .add("shard_mib", s.shard_mib, "chief: the partitioner's largest shard, MiB (variable_axis_size)")
      .add("lr", s.lr, "chief: momentum's learning rate")
      .add("momentum", s.momentum, "chief: momentum's mu")
      .add("ps_threads", s.ps_threads, "ps: I/O threads")
      .add("secret_file", s.secret_file, "the cluster's master secret (mode 0600); empty: no authentication");
  if (!flags.parse(argc, argv)) return 0;
  if (s.role == "ps") return run_ps(s);
  if (s.role != "chief") throw dtf::error(dtf::errc::invalid_config, "--role: ps or chief");
  if (s.steps < 1 || s.shard_mib < 1) throw dtf::error(dtf::errc::invalid_config, "--steps and --shard_mib: positive");
  chief c(s);
  std::printf("chief: %s, model %.3f GiB (%zu floats) in %zu shards over 2 ps (%.3f and %.3f GiB)\n", s.run.c_str(),
              c.model_bytes() / double(1 << 30), c.n, c.layout.shards.size(),
              double(c.layout.bytes_on(0)) / double(1 << 30), double(c.layout.bytes_on(1)) / double(1 << 30));
  std::fflush(stdout);
  if (s.run == "train")
    c.train();
  else if (s.run == "restore_chief")
    c.restore(dtf::restore_transfer::through_chief);
  else if (s.run == "restore_files")
    c.restore(dtf::restore_transfer::ps_reads_files);
  else
    throw dtf::error(dtf::errc::invalid_config, "--run: train, restore_chief or restore_files");
  std::printf("chief: VmHWM %ld KiB\n", vm_hwm_kib());
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_large_model: %s\n", e.what());
  return 1;
}
