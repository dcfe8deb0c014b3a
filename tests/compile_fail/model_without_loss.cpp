// Must not compile: a model without loss_and_gradients. The error names the missing expression.
#include <dtf/concepts.hpp>

struct model_without_loss {
  std::vector<dtf::variable_spec> variables() const { return {}; }
  void initialize(std::span<float>, std::uint64_t) {}
};
static_assert(dtf::check_model<model_without_loss>());
