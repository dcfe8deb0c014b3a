// hogwild — lock-free SGD on the parameter server (Niu et al. 2011).
//   dtfrun --ps 1 --workers 2 -- build/examples/hogwild
#include <dtf/strategies/hogwild.hpp>

#include <cmath>

#include "../common/async_main.hpp"

int main(int argc, char** argv) {
  dtf::strategies::hogwild_config c;
  return examples::async_main<dtf::strategies::hogwild>(
      argc, argv, "hogwild",
      [&](dtf::flag_parser& f) {
        f.add("lr", c.learning_rate, "SGD step size the ps applies").add("epoch_decay", c.epoch_decay, "per-epoch step-size factor");
      },
      [&] { return dtf::strategies::hogwild(c); },
      {.learning_rate = [&](std::int64_t, std::size_t epoch) {
        return double(c.learning_rate) * std::pow(double(c.epoch_decay), double(epoch));
      }});
}
