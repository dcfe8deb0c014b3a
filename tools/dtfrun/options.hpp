// dtfrun's command line: the help text, the options it sets and how each flag is read.
// Errors are usage_error (exit status 2, nothing started) naming the flag and the value.
#pragma once

#include <algorithm>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common.hpp"

namespace dtfrun {

// More tasks than this on one machine is a typo, not a cluster (and would exhaust fds).
inline constexpr long long max_tasks_per_job = 1024;

inline constexpr std::string_view usage_text =
    R"(usage: dtfrun [options] -- CMD [ARGS...]
       dtfrun --print-tf-config --hosts H1,H2,... [--ps N] [--workers M] [--chief]
              [--evaluator] [--port-base P] [--task NAME]
       dtfrun status [PID]
       dtfrun sweep --grid KEY=V1,V2,... [--grid ...] [--parallel P] [--out DIR]
              [--sort METRIC[:asc|desc]] -- CMD [ARGS...]
(dtfrun status --help and dtfrun sweep --help describe the last two.)

Starts a dtf cluster on this machine. Every task runs CMD ARGS with its own TF_CONFIG
and DTF_TASK=<job>.<index> added to dtfrun's environment, stdin from /dev/null, in a
process group of its own. The chief and the workers also get DTF_LOCAL_RANK (0 for the
chief, then the workers in order) and DTF_LOCAL_SIZE, from which each picks a GPU of
its own on CUDA builds. Each line a task writes is printed with the task's name in
front ("ps.0     | ..."), stdout to stdout and stderr to stderr.

ports: dtfrun binds and listens on each task's port when it picks it, and hands the
listening socket to the task (DTF_LISTEN_FD=<fd>, as systemd's socket activation does);
a dtf server listening on that exact address takes it instead of binding again, so no
port is ever free between its choice and its use. With restarts left the socket stays
open in dtfrun while the task is down: peers' connections wait for the restarted task.
A program that binds its ports itself (not a dtf program) needs --release_ports.

options:
  --ps N          parameter-server tasks (default 0)
  --workers M     worker tasks (default 1); 0 needs --chief
  --chief         add a chief task; without it worker 0 is the chief
  --evaluator     add an evaluator task (not listed in the cluster, as in TensorFlow)
  --host H        address the tasks listen on; free ports are picked on it
                  (default 127.0.0.1)
  --port-base P   use ports P, P+1, ... on --host instead of free ones (each is
                  bound before anything starts: one taken is an error)
  --release_ports close the picked ports before the tasks start, for programs that
                  bind them themselves (another may take one meanwhile)
  --grace_ms MS   after the chief exits, how long the other tasks may take to end by
                  themselves before they get SIGTERM (default 10000)
  --timeout_s S   time limit for the job, counted until the chief exits; 0: none
                  (default 0)
  --max-restarts N | ps=N,worker=M,chief=K,evaluator=E
                  how often each task of a role may be restarted after it failed
                  (non-zero exit or killed by a signal); a bare N applies to every
                  role, a role left out gets 0 (default 0)
  --restart_delay_ms MS
                  wait before a failed task is started again (default 1000)
  --worker-failures-allowed K
                  how many worker tasks (role worker only: not the chief, a ps or the
                  evaluator) may fail with no restarts left without ending the job;
                  the others go on without them, and the job's status is still the
                  chief's (default 0)
  --live, --no-live
                  force the live view on or off (default: on when stdout is a
                  terminal)
  -h, --help      print this help and exit
Flags take their value as the next argument or after '=' (--ps=2); '-' and '_' in a
flag's name are the same (--max_restarts, --grace-ms).

live view: on a terminal, a table at the bottom of the screen (state, restarts, step,
steps/s, loss, CPU % and resident memory of each task's process group) and a bar of the
chief's step towards its last step, redrawn in place while the tasks' lines scroll above
it. Steps, losses and rates are read from key=value tokens in any line a task prints:
step=, last_step=, loss=, steps_per_sec=. The same table goes to a state file about once
a second ($XDG_RUNTIME_DIR/dtfrun/<pid>.json, else /tmp/dtfrun-<uid>/<pid>.json; removed
at exit), which `dtfrun status` prints from another shell (only from a directory of
yours with mode 0700). The values of flags named *secret*, *password* or *token* are
shown as ***.

credentials: with DTF_CLUSTER_SECRET in dtfrun's environment (at least 16 bytes), only
the ps tasks get it; every other task gets its own key (DTF_TASK_KEY, HMAC-SHA256 of the
secret and its name) and the ring key (DTF_RING_KEY) instead, so it can connect under
no other name. Pass the secret in the environment, never on a command line.

--print-tf-config: prints one line per task, its name, a tab and its TF_CONFIG, for a
cluster spread over the hosts given (nothing is started). A host list of plain names
places the tasks round-robin (ps first, then chief, workers, evaluator), each on the next
port from --port-base (default 2222) on its host; a list of host:port entries gives every
cluster member its own entry, in that order. With --task NAME only that task's TF_CONFIG
is printed (for `export TF_CONFIG=$(dtfrun --print-tf-config ... --task worker.$RANK)`).

restarts: a failed task with restarts left is started again with the same TF_CONFIG
(same address and port) and DTF_RESTART_COUNT=<k> (0 on the first start); whatever it
left running in its process group is killed first. This holds for the chief too; a
chief that exits with status 0 ends the job. A task without restarts left that fails
ends the job as described below, with a line saying which task failed and how; up to
--worker-failures-allowed workers may fail that way, each with a line saying the job
goes on without it (a synchronous job with backup workers can finish without them).

SIGINT (Ctrl-C): the first asks the chief to stop: SIGTERM goes to the chief's process
group only (a dtf chief saves a checkpoint and ends the job normally); the other tasks
then get the grace period as after any end of the chief. A second SIGINT kills every
task at once. SIGTERM and SIGHUP tear the whole cluster down.

teardown: tasks still running get SIGTERM (to their whole process group), and SIGKILL
3 s later; a second SIGINT/SIGTERM skips the wait. When dtfrun exits, whatever the tasks
left running in their process groups is killed. Tasks die with dtfrun even when it is
killed with SIGKILL (PR_SET_PDEATHSIG; this reaches the task processes themselves, not
processes they started).

exit status:
  the chief's       when the chief ends the job (128+N if signal N killed the chief)
  1                 a non-chief task failed (non-zero exit or killed by a signal) with no
                    restarts left before the chief ended (a worker: beyond
                    --worker-failures-allowed), or a task could not be started
  2                 bad command line; nothing was started
  124               the --timeout_s limit was reached
  128+N             dtfrun got signal N (SIGHUP 129, SIGINT 130, SIGTERM 143); after a
                    SIGINT this holds however the chief then ended
)";

// --max-restarts: per task of each role.
struct restart_limits {
  long long ps = 0;
  long long chief = 0;
  long long worker = 0;
  long long evaluator = 0;

  long long for_job(std::string_view job) const {
    if (job == "ps") return ps;
    if (job == "chief") return chief;
    if (job == "worker") return worker;
    return evaluator;
  }
};

struct options {
  long long ps_count = 0;
  long long worker_count = 1;
  bool chief = false;
  bool evaluator = false;
  std::string host = "127.0.0.1";
  long long grace_ms = 10000;
  long long timeout_s = 0;
  restart_limits max_restarts;
  long long restart_delay_ms = 1000;
  long long worker_failures_allowed = 0;  // workers that may fail for good, the job going on
  std::optional<long long> port_base;
  std::optional<bool> live;  // unset: when stdout is a terminal
  bool print_tf_config = false;
  bool release_ports = false;      // close the picked sockets before the tasks start
  std::vector<std::string> hosts;  // --hosts, for --print-tf-config
  std::string only_task;           // --task, for --print-tf-config
  std::vector<std::string> command;
  bool help = false;
};


inline constexpr long long max_restarts_limit = 1'000'000;

// "N" or "ps=N,worker=M,chief=K,evaluator=E" (any subset, any order).
inline restart_limits parse_restarts(std::string_view text) {
  restart_limits limits;
  if (text.find('=') == std::string_view::npos) {
    const long long n = parse_count("max-restarts", text, max_restarts_limit);
    return {n, n, n, n};
  }
  std::vector<std::string_view> seen;
  while (true) {
    const auto comma = text.find(',');
    const std::string_view item = text.substr(0, comma);
    const auto eq = item.find('=');
    const std::string_view role = item.substr(0, eq);
    if (eq == std::string_view::npos ||
        (role != "ps" && role != "worker" && role != "chief" && role != "evaluator")) {
      throw usage_error("--max-restarts needs N or role=N,... with roles ps, worker, chief, "
                        "evaluator, not '" + std::string(item) + "'");
    }
    if (std::find(seen.begin(), seen.end(), role) != seen.end()) {
      throw usage_error("--max-restarts names '" + std::string(role) + "' twice");
    }
    seen.push_back(role);
    const long long n = parse_count("max-restarts " + std::string(role), item.substr(eq + 1),
                                    max_restarts_limit);
    (role == "ps" ? limits.ps : role == "worker" ? limits.worker
                             : role == "chief" ? limits.chief : limits.evaluator) = n;
    if (comma == std::string_view::npos) break;
    text.remove_prefix(comma + 1);
  }
  return limits;
}

inline options parse_options(int argc, char** argv) {
  options opts;
  // '-' and '_' are the same in a flag's name; messages show the name as written.
  const flags_end end = scan_flags(argc, argv, 1, "dtfrun --help", [&](const flag_arg& f, auto next_value) {
    const auto& [written, name, inline_value] = f;
    if (name == "chief" || name == "evaluator" || name == "live" || name == "no_live" ||
        name == "print_tf_config" || name == "release_ports") {
      if (inline_value) throw usage_error("--" + std::string(written) + " takes no value");
      if (name == "chief") opts.chief = true;
      if (name == "evaluator") opts.evaluator = true;
      if (name == "live") opts.live = true;
      if (name == "no_live") opts.live = false;
      if (name == "print_tf_config") opts.print_tf_config = true;
      if (name == "release_ports") opts.release_ports = true;
      return;
    }
    const bool takes_value = name == "ps" || name == "workers" || name == "host" ||
                             name == "grace_ms" || name == "timeout_s" ||
                             name == "max_restarts" || name == "restart_delay_ms" ||
                             name == "worker_failures_allowed" || name == "port_base" ||
                             name == "hosts" || name == "task";
    if (!takes_value) {
      throw usage_error("unknown flag '--" + std::string(written) + "' (see dtfrun --help)");
    }
    const std::string_view value = next_value();
    if (name == "ps") {
      opts.ps_count = parse_count(written, value, max_tasks_per_job);
    } else if (name == "workers") {
      opts.worker_count = parse_count(written, value, max_tasks_per_job);
    } else if (name == "host") {
      if (value.empty()) throw usage_error("--host needs a non-empty address");
      opts.host = value;
    } else if (name == "grace_ms") {
      opts.grace_ms = parse_count(written, value, 1'000'000'000LL);
    } else if (name == "max_restarts") {
      opts.max_restarts = parse_restarts(value);
    } else if (name == "restart_delay_ms") {
      opts.restart_delay_ms = parse_count(written, value, 1'000'000'000LL);
    } else if (name == "worker_failures_allowed") {
      opts.worker_failures_allowed = parse_count(written, value, max_tasks_per_job);
    } else if (name == "port_base") {
      opts.port_base = parse_count(written, value, 65535);
      if (*opts.port_base == 0) throw usage_error("--" + std::string(written) + " needs a port from 1 to 65535");
    } else if (name == "hosts") {
      opts.hosts.clear();
      std::string_view rest = value;
      while (true) {
        const auto comma = rest.find(',');
        const std::string_view host = rest.substr(0, comma);
        if (host.empty()) throw usage_error("--hosts needs a comma-separated list of hosts, not '" +
                                            std::string(value) + "'");
        opts.hosts.emplace_back(host);
        if (comma == std::string_view::npos) break;
        rest.remove_prefix(comma + 1);
      }
    } else if (name == "task") {
      opts.only_task = value;
    } else {
      opts.timeout_s = parse_count(written, value, 1'000'000'000LL);
    }
  });
  if (end.help) {
    opts.help = true;
    return opts;
  }
  const bool saw_separator = end.saw_separator;
  int i = end.command_at;
  if (opts.print_tf_config) {
    if (saw_separator) throw usage_error("--print-tf-config starts nothing: drop the command after '--'");
    if (opts.hosts.empty()) throw usage_error("--print-tf-config needs --hosts H1,H2,...");
    if (opts.worker_count == 0 && !opts.chief) {
      throw usage_error("--workers 0 leaves no chief; add --chief or start at least one worker");
    }
    return opts;
  }
  if (!opts.hosts.empty() || !opts.only_task.empty()) {
    throw usage_error(std::string(!opts.hosts.empty() ? "--hosts" : "--task") +
                      " only goes with --print-tf-config");
  }
  if (!saw_separator) throw usage_error("missing '--' before the command (see dtfrun --help)");
  if (i >= argc) throw usage_error("missing the command after '--' (see dtfrun --help)");
  if (opts.worker_count == 0 && !opts.chief) {
    throw usage_error("--workers 0 leaves no chief; add --chief or start at least one worker");
  }
  for (; i < argc; ++i) opts.command.emplace_back(argv[i]);
  return opts;
}

}  // namespace dtfrun
