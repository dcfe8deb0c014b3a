// bench_checkpoint_throughput — how fast a ps cluster saves and restores a checkpoint, next to
// the disk's own speed measured in the same run.
//
//   1. baseline: one file of the same bytes written with write(2) + fsync + rename (what every
//      checkpoint file costs at best), and read back
//   2. a model of --mib MiB of float32 (4 variables) with Adam on the ps (a checkpoint holds 3x
//      the model's bytes: values and two slots) or, --rule sgd, plain SGD (1x), placed by
//      fixed_size{4} over 1, 2 and 4 ps
//      running on threads of this process: median seconds of save_checkpoint (every ps writes
//      its shard file, the chief the manifest) and of restore_latest into the same number of
//      ps (streamed through the chief), of restore_checkpoint with each ps reading its own
//      slices (restore_transfer::ps_reads_files), and of a resharded restore into 3 ps; GB/s
//      of checkpoint bytes and the ratio to the baseline
//   3. pulls during a save: one ps with one I/O thread holds the model; a worker pulls the whole
//      model in a loop while the chief saves: the pulls' median and longest latency, next to
//      the same pulls with no save (the ps writes its file on a thread of its own, so a pull
//      waits for the copy of the shards at most, not for the file)
// Every restore verifies SHA-256 of every file (one pass over the files), then streams each ps's
// slices from them (a second pass, usually from the page cache), so it also measures both.
// benchmarks/checkpoint_throughput.sh runs it beside dd and cp of the same bytes.
//
//   build/benchmarks/bench_checkpoint_throughput [--mib 64] [--rule adam|sgd] [--repeats 3] [--dir /tmp/dtf_ckpt_bench]
#include <dtf/checkpoint.hpp>
#include <dtf/flags.hpp>
#include <dtf/partitioners.hpp>
#include <dtf/ps.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

namespace {
using clock_type = std::chrono::steady_clock;

double median_secs(const std::function<void()>& f, int reps) {
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = clock_type::now();
    f();
    t.push_back(std::chrono::duration<double>(clock_type::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

struct cluster {
  std::vector<std::unique_ptr<dtf::parameter_server>> servers;
  std::vector<std::thread> threads;
  std::unique_ptr<dtf::ps_client> client;
  cluster(const std::string& checkpoint_dir, const dtf::placement& layout) {
    std::vector<std::string> addresses;
    for (std::size_t i = 0; i < layout.num_ps; ++i) {
      dtf::ps_options o;
      o.transport.cluster_id = "bench";
      o.transport.identity = "ps." + std::to_string(i);
      o.transport.timeout_ms = 600000;
      o.transport.log = [](const std::string&) {};
      o.checkpoint_dir = checkpoint_dir;
      servers.push_back(std::make_unique<dtf::parameter_server>("127.0.0.1:0", o));
      threads.emplace_back([p = servers.back().get()] { p->run(); });
      addresses.push_back("127.0.0.1:" + std::to_string(servers.back()->port()));
    }
    dtf::transport_options co;
    co.cluster_id = "bench";
    co.identity = "chief.0";
    co.timeout_ms = 600000;
    client = std::make_unique<dtf::ps_client>(addresses, layout, co);
    client->connect();
  }
  ~cluster() {
    for (auto& s : servers) s->stop();
    for (auto& t : threads) t.join();
  }
};
}  // namespace

int main(int argc, char** argv) try {
  int mib = 64, repeats = 3;
  std::string dir = "/tmp/dtf_ckpt_bench", rule_name = "adam";
  dtf::flag_parser flags("Checkpoint save and restore throughput of a ps cluster, next to the disk's.");
  flags.add("mib", mib, "model size in MiB of float32")
      .add("repeats", repeats, "timed runs (median)")
      .add("rule", rule_name, "update rule on the ps: adam (a checkpoint holds 3x the model) or sgd (1x)")
      .add("dir", dir, "checkpoint directory (emptied first and at the end)");
  if (!flags.parse(argc, argv)) return 0;
  if (rule_name != "adam" && rule_name != "sgd") throw dtf::error(dtf::errc::invalid_argument, "--rule: adam or sgd");
  namespace fs = std::filesystem;
  fs::remove_all(dir);
  fs::create_directories(dir);

  const std::size_t n = std::size_t(mib) * (1 << 20) / sizeof(float);
  const std::size_t rows = n / 4 / 256;
  std::vector<dtf::variable_spec> vars;
  for (std::size_t v = 0; v < 4; ++v) vars.push_back({"layer_" + std::to_string(v) + "/kernel", {rows, 256}, v * rows * 256});
  const std::size_t total = dtf::num_parameters(vars);
  const dtf::optim::rule rule = rule_name == "adam" ? dtf::optim::rule(dtf::optim::adam{}) : dtf::optim::sgd{};
  const double tensors = 1.0 + double(dtf::optim::detail::slot_count(rule));
  const double ckpt_bytes = tensors * double(total) * sizeof(float);

  // 1. Baseline: the same bytes as one file, written crash-safely, and read back.
  double base_write = 0, base_read = 0;
  {
    std::vector<char> blob(static_cast<std::size_t>(ckpt_bytes));
    for (std::size_t i = 0; i < blob.size(); i += 4096) blob[i] = char(i / 4096);
    base_write = median_secs(
        [&] {
          const dtf::detail::ckpt::piece p{blob.data(), blob.size()};
          dtf::detail::ckpt::write_atomically(fs::path(dir) / "baseline.bin", std::span(&p, 1));
        },
        repeats);
  }
  base_read = median_secs([&] { (void)dtf::detail::ckpt::read_file(fs::path(dir) / "baseline.bin"); }, repeats);
  fs::remove(fs::path(dir) / "baseline.bin");
  std::printf("checkpoint bytes: %.1f MiB (model %d MiB, %s: values%s)\n", ckpt_bytes / (1 << 20), mib,
              rule_name.c_str(), rule_name == "adam" ? " + 2 slots" : " only");
  std::printf("baseline  write+fsync+rename %.3f s (%.2f GB/s)   read %.3f s (%.2f GB/s)\n", base_write,
              ckpt_bytes / base_write / 1e9, base_read, ckpt_bytes / base_read / 1e9);
  std::printf("%-4s %9s %7s %7s   %10s %7s %7s   %11s %7s   %12s %7s\n", "ps", "save s", "GB/s", "x base",
              "restore s", "GB/s", "x base", "ps-read s", "GB/s", "reshard->3 s", "GB/s");

  // 2. Save and restore through 1, 2 and 4 ps; one cluster alive at a time (a 1 GiB model
  // fits a small machine). Restore streams: the chief holds one ps's share at a time.
  std::vector<float> saved(total), restored(total);
  for (std::size_t num_ps : {1u, 2u, 4u}) {
    const auto layout = dtf::partitioners::fixed_size{4}.place(vars, num_ps);
    const dtf::checkpoint_options ck{dir, "bench" + std::to_string(num_ps), 2};
    double save = 0, restore = 0, by_ps = 0, reshard = 0;
    {
      cluster a(dir, layout);
      for (std::size_t i = 0; i < total; ++i) restored[i] = float(i % 1000) * 1e-3f;
      a.client->initialize(restored, {rule});
      a.client->push_gradients(restored);  // values (and Adam's slots) change
      std::int64_t step = 0;
      save = median_secs([&] { save_checkpoint(*a.client, ck, vars, ++step); }, repeats);
      a.client->pull(saved);
    }
    // The restored values are the saved ones (a benchmark that verifies what it measures).
    auto check = [&](cluster& c) {
      c.client->pull(restored);
      if (restored != saved) throw dtf::error(dtf::errc::internal, "restored values differ from the saved ones");
    };
    {
      cluster b(dir, layout);
      restore = median_secs([&] { (void)restore_latest(*b.client, dir, vars, {rule}); }, repeats);
      check(b);
    }
    {
      cluster b(dir, layout);
      const auto name = *dtf::latest_checkpoint(dir);
      by_ps = median_secs(
          [&] {
            (void)restore_checkpoint(*b.client, dir, name, vars, {rule}, {},
                                               dtf::restore_transfer::ps_reads_files);
          },
          repeats);
      check(b);
    }
    {
      cluster c(dir, dtf::partitioners::fixed_size{3}.place(vars, 3));
      reshard = median_secs([&] { (void)restore_latest(*c.client, dir, vars, {rule}); }, repeats);
      check(c);
    }
    std::printf("%-4zu %9.3f %7.2f %7.2f   %10.3f %7.2f %7.2f   %11.3f %7.2f   %12.3f %7.2f\n", num_ps, save,
                ckpt_bytes / save / 1e9, base_write / save, restore, ckpt_bytes / restore / 1e9, base_read / restore,
                by_ps, ckpt_bytes / by_ps / 1e9, reshard, ckpt_bytes / reshard / 1e9);
    std::fflush(stdout);
  }
  // 3. Pull latency while a save is written.
  {
    const auto layout = dtf::partitioners::fixed_size{4}.place(vars, 1);
    cluster a(dir, layout);
    a.client->initialize(saved, {rule});
    dtf::transport_options wo;
    wo.cluster_id = "bench";
    wo.identity = "worker.0";
    wo.timeout_ms = 600000;
    dtf::ps_client worker({"127.0.0.1:" + std::to_string(a.servers[0]->port())}, layout, wo);
    worker.connect();
    auto pulls_while = [&](const std::function<bool()>& go_on) {
      std::vector<double> t;
      do {
        const auto t0 = clock_type::now();
        worker.pull(restored);
        t.push_back(std::chrono::duration<double>(clock_type::now() - t0).count());
      } while (go_on());
      std::sort(t.begin(), t.end());
      return t;
    };
    std::size_t k = 0;
    const auto idle = pulls_while([&] { return ++k < 20; });
    std::atomic<bool> saving{true};
    double save_s = 0;
    std::thread saver([&] {
      const auto t0 = clock_type::now();
      save_checkpoint(*a.client, {dir, "latency", 1}, vars, 1);
      save_s = std::chrono::duration<double>(clock_type::now() - t0).count();
      saving = false;
    });
    const auto during = pulls_while([&] { return saving.load(); });
    saver.join();
    std::printf("pulls of the whole model (%d MiB) on 1 ps, 1 I/O thread: idle median %.1f ms, max %.1f ms (%zu pulls)\n",
                mib, idle[idle.size() / 2] * 1e3, idle.back() * 1e3, idle.size());
    std::printf("  during a %.2f s save: median %.1f ms, max %.1f ms (%zu pulls)\n", save_s,
                during[during.size() / 2] * 1e3, during.back() * 1e3, during.size());
  }
  fs::remove_all(dir);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_checkpoint_throughput: %s\n", e.what());
  return 1;
}
