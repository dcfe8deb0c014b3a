// Must not compile: a strategy that does not say its kind. The error names the missing member.
#include <dtf/concepts.hpp>

struct strategy_without_kind {
  using config_type = int;
};
static_assert(dtf::check_strategy<strategy_without_kind>());
