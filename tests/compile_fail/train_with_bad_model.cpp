// Must not compile: dtf::train with a model whose initialize is missing. The error is the
// check's one line naming the expression, raised by dtf::train itself.
#include <dtf/strategies/hogwild.hpp>
#include <dtf/train.hpp>

struct model_without_initialize {
  std::vector<dtf::variable_spec> variables() const { return {}; }
  float loss_and_gradients(std::span<const float>, const dtf::tensor&, const dtf::tensor&, std::span<float>) {
    return 0;
  }
};

int main() {
  model_without_initialize net;
  dtf::data::dataset d = dtf::data::dataset::from_idx("images", "labels");
  return dtf::train(dtf::local_cluster(), net, d, dtf::strategies::hogwild(), {}).exit_code;
}
