// dtf/cluster/from_config.hpp — a cluster given outright: explicit flags (--job_name,
// --task_index, --ps_hosts, ...) or TF_CONFIG (dtf/cluster.hpp).
#pragma once

#include <dtf/cluster/parse.hpp>
#include <dtf/cluster/spec.hpp>
#include <dtf/error.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <charconv>
#include <compare>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dtf {

/// The cluster given by explicit flags: --ps_hosts, --worker_hosts and --chief_host list the
/// tasks, --job_name and --task_index say which one this process is. An evaluator may be
/// absent from the spec. Throws dtf::error(errc::invalid_config) naming the flag for an
/// unknown job, a negative or out-of-range index, an empty list entry, a bad or duplicate
/// address, more than one chief, or a cluster with neither a chief nor a worker.
inline cluster cluster_from_flags(const cluster_flags& flags) {
  if (flags.job_name.empty())
    detail::config_error(std::string("--job_name: required (one of ") + detail::known_jobs_text() + ")");
  const auto job = detail::canonical_job(flags.job_name);
  if (!job) detail::config_error("--job_name '" + flags.job_name + "' is not one of " + detail::known_jobs_text());
  if (flags.task_index < 0)
    detail::config_error("--task_index " + std::to_string(flags.task_index) +
                         " is negative: pass this task's index within --job_name");

  cluster c;
  c.source = "flags";
  detail::address_registry seen;
  const auto add_hosts = [&](const std::string& flag, std::string_view text, const std::string& job_name, bool single) {
    if (detail::trim_blanks(text).empty()) return;
    const auto entries = detail::split_top_level(text);
    if (single && entries.size() > 1)
      detail::config_error(flag + ": expected one host:port, got " + std::to_string(entries.size()));
    auto& tasks = c.spec.jobs[job_name];
    for (std::size_t i = 0; i < entries.size(); ++i) {
      const std::string address(detail::trim_blanks(entries[i]));
      if (address.empty()) detail::config_error(flag + ": empty entry " + detail::label(job_name, i) + " in '" + std::string(text) + "'");
      split_host_port(address, flag);
      seen.add(address, detail::label(job_name, i), flag);
      tasks[i] = address;
    }
  };
  add_hosts("--chief_host", flags.chief_host, "chief", true);
  add_hosts("--ps_hosts", flags.ps_hosts, "ps", false);
  add_hosts("--worker_hosts", flags.worker_hosts, "worker", false);
  if (c.spec.num_tasks("chief") + c.spec.num_tasks("worker") == 0)
    detail::config_error("--worker_hosts: empty: the cluster needs at least one worker (or a --chief_host)");

  c.self = {*job, std::size_t(flags.task_index)};
  if (*job != "evaluator" && c.self.index >= c.spec.num_tasks(*job)) {
    const std::string list_flag = *job == "chief" ? "--chief_host" : "--" + *job + "_hosts";
    detail::config_error("--task_index " + std::to_string(flags.task_index) + " out of range: " + list_flag + " lists " +
                         std::to_string(c.spec.num_tasks(*job)) + " " + *job + " tasks");
  }
  return c;
}

/// The cluster given by a TF_CONFIG document. Jobs may be lists of addresses or sparse
/// {"index": "address"} objects; "master" is the legacy name of "chief" (stored as "chief");
/// task.index may be a number or a numeric string; a task of type "evaluator" may be absent
/// from the cluster. Keys other than "cluster" and "task" ("environment", "rpc_layer") are
/// ignored. Throws dtf::error(errc::invalid_config) naming the field for malformed JSON, a
/// missing or mistyped cluster or task, an unknown job, both chief and master, a chief job
/// without exactly one task (index 0), a bad or duplicate address, a bad sparse index, an
/// unknown task type, or a task index the cluster does not list.
inline cluster cluster_from_tf_config(std::string_view text) {
  using nlohmann::json;
  const std::string prefix = "TF_CONFIG: ";
  const auto fail = [&](const std::string& message) { detail::config_error(prefix + message); };
  json doc;
  try {
    doc = json::parse(text.begin(), text.end());
  } catch (const json::parse_error& e) {
    fail(std::string("malformed JSON: ") + e.what());
  }
  if (!doc.is_object()) fail(std::string("expected an object with \"cluster\" and \"task\", got ") + doc.type_name());

  cluster c;
  c.source = "TF_CONFIG";
  const auto cluster_it = doc.find("cluster");
  if (cluster_it == doc.end()) fail("cluster: missing");
  if (!cluster_it->is_object()) fail(std::string("cluster: expected an object of jobs, got ") + cluster_it->type_name());
  if (cluster_it->contains("chief") && cluster_it->contains("master")) fail("cluster has both 'chief' and 'master'");

  detail::address_registry seen;
  for (const auto& [name, list] : cluster_it->items()) {
    const auto job = detail::canonical_job(name);
    if (!job) fail("cluster." + name + ": unknown job (expected one of " + detail::known_jobs_text() + ")");
    std::map<std::size_t, std::string> tasks;
    const auto add = [&](std::size_t index, const json& value) {
      const std::string field = prefix + "cluster." + detail::label(name, index);
      if (!value.is_string()) detail::config_error(field + ": expected a \"host:port\" string, got " + value.type_name());
      const auto& address = value.get_ref<const std::string&>();
      split_host_port(address, field);
      seen.add(address, detail::label(name, index), field);
      tasks[index] = address;
    };
    if (list.is_array()) {
      for (std::size_t i = 0; i < list.size(); ++i) add(i, list[i]);
    } else if (list.is_object()) {
      for (const auto& [key, value] : list.items()) {
        const auto index = detail::parse_decimal(key);
        if (!index) fail("cluster." + name + ": index '" + key + "' is not a non-negative integer");
        if (tasks.count(std::size_t(*index))) fail("cluster." + name + ": index " + std::to_string(*index) + " appears twice");
        add(std::size_t(*index), value);
      }
    } else {
      fail("cluster." + name + ": expected a list of addresses or an {\"index\": \"address\"} object, got " +
           list.type_name());
    }
    if (*job == "chief" && (tasks.size() != 1 || tasks.begin()->first != 0))
      fail("cluster." + name + ": must have exactly one task, with index 0 (has " + std::to_string(tasks.size()) + ")");
    if (!tasks.empty()) c.spec.jobs[*job] = std::move(tasks);
  }
  if (c.spec.num_tasks("chief") + c.spec.num_tasks("worker") == 0) fail("cluster: has neither a chief nor a worker");

  const auto task_it = doc.find("task");
  if (task_it == doc.end()) fail("task: missing (expected {\"type\": ..., \"index\": ...})");
  if (!task_it->is_object()) fail(std::string("task: expected an object, got ") + task_it->type_name());
  const auto type_it = task_it->find("type");
  if (type_it == task_it->end()) fail("task.type: missing");
  if (!type_it->is_string()) fail(std::string("task.type: expected a string, got ") + type_it->type_name());
  const auto& type = type_it->get_ref<const std::string&>();
  const auto job = detail::canonical_job(type);
  if (!job) fail("task.type '" + type + "' is not one of " + detail::known_jobs_text());

  const auto index_it = task_it->find("index");
  if (index_it == task_it->end()) fail("task.index: missing");
  std::uint64_t index = 0;
  if (index_it->is_number_unsigned()) {
    index = index_it->get<std::uint64_t>();
  } else if (index_it->is_number_integer()) {
    fail("task.index " + index_it->dump() + " is negative");
  } else if (index_it->is_string()) {
    const auto parsed = detail::parse_decimal(index_it->get_ref<const std::string&>());
    if (!parsed) fail("task.index " + index_it->dump() + " is not a non-negative integer");
    index = *parsed;
  } else {
    fail("task.index " + index_it->dump() + " is not a non-negative integer");
  }
  c.self = {*job, std::size_t(index)};

  const bool outside_evaluator = *job == "evaluator" && c.spec.num_tasks("evaluator") == 0;
  if (!outside_evaluator) {
    const auto job_it = c.spec.jobs.find(*job);
    if (job_it == c.spec.jobs.end() || !job_it->second.count(c.self.index)) {
      const std::size_t n = c.spec.num_tasks(*job);
      const bool dense = n == 0 || job_it->second.rbegin()->first == n - 1;
      if (dense)
        fail("task.index " + std::to_string(index) + " out of range: the cluster has " + std::to_string(n) + " " + type +
             " tasks");
      fail("task.index " + std::to_string(index) + ": cluster." + type + " lists no task " + std::to_string(index));
    }
  }
  return c;
}

}  // namespace dtf
