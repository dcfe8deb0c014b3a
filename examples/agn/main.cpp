// agn — Accumulated Gradient Normalization (Hermans 2017): λ local Adam steps, then the
// window's mean update is committed to the ps.
//   dtfrun --ps 1 --workers 2 -- build/examples/agn
#include <dtf/strategies/agn.hpp>

#include "../common/async_main.hpp"

int main(int argc, char** argv) {
  int window = 10;
  float lr = 1e-3f;
  std::string optimizer = "adam";
  return examples::async_main<dtf::strategies::agn>(
      argc, argv, "agn",
      [&](dtf::flag_parser& f) {
        f.add("window", window, "λ: local steps per commit")
            .add("lr", lr, "local learning rate")
            .add("optimizer", optimizer, "local optimiser: sgd, momentum, nesterov, adagrad or adam");
      },
      [&] { return dtf::strategies::agn({std::size_t(window), dtf::optim::make_rule(optimizer, lr)}); },
      {.learning_rate = [&](std::int64_t, std::size_t) { return double(lr); }});
}
