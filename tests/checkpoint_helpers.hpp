// Test helpers for checkpoints: a fresh directory per test, a small model, seeded values and
// a cluster of ps tasks on threads of this process.
#pragma once

#include <dtf/checkpoint.hpp>
#include <dtf/partitioners.hpp>
#include <dtf/ps.hpp>

#include "ps_helpers.hpp"

#include <dtf/detail/sha256.hpp>

#include <nlohmann/json.hpp>

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace dtf::test::ckpt {

namespace fs = std::filesystem;


// A fresh directory per test under the build's temporary directory.
struct temp_dir {
  fs::path path;
  explicit temp_dir(const std::string& name) {
    path = fs::temp_directory_path() / ("dtf_test_ckpt_" + name + "_" + std::to_string(::getpid()));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

inline std::vector<variable_spec> model_vars() {
  return {{"dense_0/kernel", {7, 3}, 0}, {"dense_0/bias", {3}, 21}, {"dense_1/kernel", {5, 2}, 24}, {"step_scale", {}, 34}};
}

inline std::vector<float> seeded(std::size_t n, std::uint64_t seed) {
  std::mt19937 rng{std::uint32_t(seed)};
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// A cluster of k ps tasks and a client over the given placement.
struct cluster_of {
  std::vector<std::unique_ptr<parameter_server>> servers;
  std::vector<std::thread> threads;
  std::unique_ptr<ps_client> client;
  // patient: timeouts for tens of MiB per message on a loaded machine (the test options'
  // 300 ms frame deadline is for small models).
  // checkpoint_dir: the ps tasks' own checkpoint directory (ps_options::checkpoint_dir).
  cluster_of(const std::string& checkpoint_dir, const placement& layout, std::vector<checkpoint_fault> faults = {},
             bool patient = false) {
    auto opts = [patient](const std::string& identity) {
      auto o = dtf::test::opts(identity);
      if (patient) {
        o.timeout_ms = 120000;
        o.frame_timeout_ms = 30000;
      }
      return o;
    };
    std::vector<std::string> addresses;
    for (std::size_t i = 0; i < layout.num_ps; ++i) {
      ps_options o{opts("ps." + std::to_string(i))};
      o.transport.log = [](const std::string&) {};
      o.checkpoint_dir = checkpoint_dir;
      if (i < faults.size()) o.save_fault = faults[i];
      servers.push_back(std::make_unique<parameter_server>("127.0.0.1:0", o));
      threads.emplace_back([p = servers.back().get()] { p->run(); });
      addresses.push_back("127.0.0.1:" + std::to_string(servers.back()->port()));
    }
    client = std::make_unique<ps_client>(addresses, layout, opts("chief.0"));
    client->connect();
  }
  ~cluster_of() {
    for (auto& s : servers) s->stop();
    for (auto& t : threads) t.join();
  }
};

inline placement place_on(std::size_t num_ps, std::size_t shards_per_var = 2) {
  return partitioners::fixed_size{shards_per_var}.place(model_vars(), num_ps);
}

// Trains a few pushes of seeded gradients.
inline void train(ps_client& ps, int steps, std::uint64_t seed) {
  const auto n = num_parameters(model_vars());
  for (int i = 0; i < steps; ++i) ps.push_gradients(seeded(n, seed + std::uint64_t(i)));
}

inline std::vector<float> pull_all(ps_client& ps) {
  std::vector<float> v(num_parameters(model_vars()));
  ps.pull(v);
  return v;
}

// Crafts checkpoint `m` of `dir`: the header of ps `ps`'s shard file says `step` (its length
// kept where the writer's padding allows), the manifest records the file's new size and SHA-256,
// and `edit` changes the rest of the manifest (e.g. drops "synchronous").
inline void set_shard_step(const fs::path& dir, const checkpoint_manifest& m, std::size_t ps, std::int64_t step,
                           const std::function<void(nlohmann::json&)>& edit = {}) {
  auto j = m.to_json();
  for (auto& f : j["files"]) {
    if (f["ps"].get<std::size_t>() != ps) continue;
    const auto path = dir / f["name"].get<std::string>();
    std::string bytes;
    {
      std::ifstream in(path, std::ios::binary);
      bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    std::uint64_t len = 0;
    std::memcpy(&len, bytes.data() + 8, sizeof len);
    auto header = nlohmann::json::parse(bytes.substr(16, len));
    header["global_step"] = step;
    auto text = header.dump();
    const std::uint64_t was = len;
    len = std::max<std::uint64_t>(len, text.size());
    text.resize(len, ' ');
    bytes.replace(16, was, text);
    std::memcpy(bytes.data() + 8, &len, sizeof len);
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
    f["bytes"] = bytes.size();
    f["sha256"] = dtf::detail::sha256_hex(bytes.data(), bytes.size());
  }
  if (edit) edit(j);
  std::ofstream(dir / (m.name + ".manifest.json"), std::ios::trunc) << j.dump(1);
}

// Checkpoint `name` of `dir` made of step `step`: its manifest and every shard file say so.
inline void set_checkpoint_step(const fs::path& dir, const std::string& name, std::int64_t step) {
  for (const auto& f : read_manifest(dir, name).files)
    set_shard_step(dir, read_manifest(dir, name), f.ps, step, [&](nlohmann::json& j) { j["global_step"] = step; });
}

}  // namespace dtf::test::ckpt
