// eamsgd — Elastic Averaging SGD with Nesterov momentum on the workers (Zhang et al. 2015).
//   dtfrun --ps 1 --workers 2 -- build/examples/eamsgd
#include <dtf/strategies/eamsgd.hpp>

#include "../common/async_main.hpp"

int main(int argc, char** argv) {
  dtf::strategies::eamsgd_config c;
  int window = int(c.window);
  return examples::async_main<dtf::strategies::eamsgd>(
      argc, argv, "eamsgd",
      [&](dtf::flag_parser& f) {
        f.add("window", window, "τ: local steps between elastic updates")
            .add("lr", c.learning_rate, "η: local rate")
            .add("momentum", c.momentum, "μ: Nesterov momentum")
            .add("rho", c.rho, "ρ: elasticity (α = η ρ)");
      },
      [&] {
        c.window = std::size_t(window);
        return dtf::strategies::eamsgd(c);
      },
      {.learning_rate = [&](std::int64_t, std::size_t) { return double(c.learning_rate); }});
}
