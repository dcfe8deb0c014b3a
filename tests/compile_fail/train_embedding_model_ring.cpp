// Must not compile: dtf::train with an embedding model (tables on the ps) and ring_allreduce,
// which holds the whole model on every rank. The error is dtf::train's one line pointing to
// dtf::strategies::hybrid.
#include <dtf/nn/embedding_sequential.hpp>
#include <dtf/strategies/ring_allreduce.hpp>
#include <dtf/train.hpp>

int main() {
  using namespace dtf::nn;
  embedding_sequential net({.table = {.name = "words", .rows = 100, .dim = 4}, .ids_per_example = 2},
                           sequential{dense(8, 100)});
  dtf::data::dataset d = dtf::data::dataset::from_idx("images", "labels");
  return dtf::train(dtf::local_cluster(), net, d, dtf::strategies::ring_allreduce<>(), {}).exit_code;
}
