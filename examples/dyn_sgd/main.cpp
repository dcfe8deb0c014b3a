// dyn_sgd — DynSGD (Jiang et al. 2017): windowed local steps whose residual the ps scales by
// 1/(staleness + 1).
//   dtfrun --ps 1 --workers 2 -- build/examples/dyn_sgd
#include <dtf/strategies/dyn_sgd.hpp>

#include "../common/async_main.hpp"

int main(int argc, char** argv) {
  int window = 5;
  float lr = 1e-3f;
  std::string optimizer = "adam";
  return examples::async_main<dtf::strategies::dyn_sgd>(
      argc, argv, "dyn_sgd",
      [&](dtf::flag_parser& f) {
        f.add("window", window, "local steps per commit")
            .add("lr", lr, "local learning rate")
            .add("optimizer", optimizer, "local optimiser: sgd, momentum, nesterov, adagrad or adam");
      },
      [&] { return dtf::strategies::dyn_sgd({std::size_t(window), dtf::optim::make_rule(optimizer, lr)}); },
      {.learning_rate = [&](std::int64_t, std::size_t) { return double(lr); }});
}
