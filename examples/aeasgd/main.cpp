// aeasgd — Asynchronous Elastic Averaging SGD (Zhang et al. 2015).
//   dtfrun --ps 1 --workers 2 -- build/examples/aeasgd
#include <dtf/strategies/aeasgd.hpp>

#include "../common/async_main.hpp"

int main(int argc, char** argv) {
  dtf::strategies::aeasgd_config c;
  int window = int(c.window);
  return examples::async_main<dtf::strategies::aeasgd>(
      argc, argv, "aeasgd",
      [&](dtf::flag_parser& f) {
        f.add("window", window, "τ: local steps between elastic updates")
            .add("lr", c.learning_rate, "η: local SGD rate")
            .add("rho", c.rho, "ρ: elasticity (α = η ρ)");
      },
      [&] {
        c.window = std::size_t(window);
        return dtf::strategies::aeasgd(c);
      },
      {.learning_rate = [&](std::int64_t, std::size_t) { return double(c.learning_rate); }});
}
