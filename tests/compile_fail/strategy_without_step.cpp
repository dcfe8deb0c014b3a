// Must not compile: an asynchronous strategy without step(). The error names the missing expression.
#include <dtf/concepts.hpp>

struct state {};
struct strategy_without_step {
  using config_type = int;
  using state_type = state;
  static constexpr dtf::strategy_kind kind = dtf::strategy_kind::asynchronous;
  dtf::optim::rule ps_rule() const { return dtf::optim::sgd{}; }
  bool lock_free() const { return false; }
  void begin(state&) {}
  void end(state&) {}
};
static_assert(dtf::check_strategy<strategy_without_step>());
