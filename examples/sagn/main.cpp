// sagn — synchronous AGN (the TF guide's SAGN): λ local Adam steps per worker, then the
// window's mean update is averaged over the workers and added to θ̃.
//   dtfrun --ps 1 --workers 2 -- build/examples/sagn --window 5
#include "../common/sync_main.hpp"

int main(int argc, char** argv) {
  int window = 5;
  float lr = 2e-3f;  // 1e-3 reached 0.867 in 5 epochs: the mean of N windows moves like one
  return examples::sync_main<dtf::strategies::sagn>(
      argc, argv, "sagn",
      [&](dtf::flag_parser& f) {
        f.add("window", window, "λ: local steps per contribution").add("lr", lr, "local Adam rate");
      },
      [&](std::size_t workers) {
        return dtf::strategies::sagn(
            {.replicas_to_aggregate = workers, .window = std::size_t(window), .local_rule = dtf::optim::adam{lr}});
      },
      {.learning_rate = [&](std::int64_t, std::size_t) { return double(lr); }});
}
