// downpour — DOWNPOUR SGD (Dean et al. 2012): local SGD steps, accumulated gradients pushed
// every window to a ps that applies Adagrad.
//   dtfrun --ps 1 --workers 2 -- build/examples/downpour
#include <dtf/strategies/downpour.hpp>

#include "../common/async_main.hpp"

int main(int argc, char** argv) {
  int fetch_every = 5, push_every = 5;
  float local_lr = 0.01f, ps_lr = 0.05f;
  return examples::async_main<dtf::strategies::downpour>(
      argc, argv, "downpour",
      [&](dtf::flag_parser& f) {
        f.add("fetch_every", fetch_every, "steps between pulls")
            .add("push_every", push_every, "steps between pushes")
            .add("local_lr", local_lr, "rate of the worker's local SGD steps")
            .add("ps_lr", ps_lr, "rate of the Adagrad the ps applies");
      },
      [&] {
        dtf::strategies::downpour_config c;
        c.fetch_every = std::size_t(fetch_every);
        c.push_every = std::size_t(push_every);
        c.local_rule = dtf::optim::sgd{local_lr};
        c.ps_rule = dtf::optim::adagrad{ps_lr};
        return dtf::strategies::downpour(c);
      },
      {.learning_rate = [&](std::int64_t, std::size_t) { return double(local_lr); }});
}
