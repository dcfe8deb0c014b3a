// dtfrun: starts a whole dtf cluster on this machine from one command (DESIGN.md §8).
//
//   dtfrun --ps 2 --workers 3 -- ./build/examples/downpour --lr 0.01
//
// Every task runs the same command with its own TF_CONFIG (and DTF_TASK=<job>.<index>),
// each line of a task's output is printed with the task's name in front of it, a failed
// task may be restarted (--max-restarts), the job ends when the chief ends, and no task
// outlives dtfrun. On a terminal a table of the tasks stays at the bottom of the screen.
// `dtfrun --help` lists the flags and the exit-status rules.
//
// This file: main, which picks the mode (launch, --print-tf-config, status, sweep). The parts,
// in tools/dtfrun/, each using only those listed before it:
//   common.hpp    output, messages, command-line errors, finding the program
//   process.hpp   starting a child in its own process group, signals, how a child ended
//   json.hpp      reading JSON documents (nlohmann/json)
//   view.*        the task table, the state file, `dtfrun status`, JSON strings
//   options.hpp   the command line and --help
//   ports.hpp     picking and holding the tasks' ports
//   cluster.hpp   the tasks, their TF_CONFIG, --print-tf-config
//   output.hpp    a task's output cut into prefixed lines
//   monitor.hpp   the live view and the state file of a running job
//   restarts.hpp  restarting a failed task
//   starter.hpp   starting a task with its environment and pipes
//   launcher.hpp  the job's phases, from start to teardown
//   sweep*        `dtfrun sweep`
//
// Linux only: it relies on prctl(PR_SET_PDEATHSIG), signalfd and /proc.

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <exception>
#include <string>
#include <string_view>
#include <utility>

#include "dtfrun/cluster.hpp"
#include "dtfrun/common.hpp"
#include "dtfrun/launcher.hpp"
#include "dtfrun/options.hpp"
#include "dtfrun/sweep.hpp"
#include "dtfrun/view.hpp"

int main(int argc, char** argv) {
  using namespace dtfrun;
  // With stdin, stdout or stderr closed, the tasks' pipes could land on fds 0-2 and be
  // clobbered when a task's standard streams are set up; /dev/null holds those places.
  for (int fd = 0; fd <= 2; ++fd) {
    if (::fcntl(fd, F_GETFD) == -1 && errno == EBADF) ::open("/dev/null", O_RDWR);
  }
  if (argc >= 2 && std::string_view(argv[1]) == "status") return status_main(argc, argv);
  if (argc >= 2 && std::string_view(argv[1]) == "sweep") return sweep_main(argc, argv);
  options opts;
  std::string program;
  try {
    opts = parse_options(argc, argv);
    if (opts.print_tf_config) return print_tf_config(opts);
    if (opts.help) {
      write_all(STDOUT_FILENO, usage_text);
      return 0;
    }
    program = resolve_command(opts.command.front());
    launcher cluster(std::move(opts), std::move(program));
    return cluster.run();
  } catch (const usage_error& e) {
    say(e.what());
    return exit_usage;
  } catch (const std::exception& e) {
    say(e.what());
    return exit_failure;
  }
}
