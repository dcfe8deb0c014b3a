// Must not compile: dtf::train with a model without tables and dtf::strategies::hybrid (nothing
// for the ps to hold). The error is dtf::train's one line pointing to ring_allreduce.
#include <dtf/nn/sequential.hpp>
#include <dtf/strategies/hybrid.hpp>
#include <dtf/train.hpp>

int main() {
  dtf::nn::sequential net{dtf::nn::dense(8, 3)};
  dtf::data::dataset d = dtf::data::dataset::from_idx("images", "labels");
  return dtf::train(dtf::local_cluster(), net, d, dtf::strategies::hybrid(), {}).exit_code;
}
