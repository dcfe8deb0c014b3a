// Shared by the examples: the Fashion-MNIST MLP every scheme trains.
#pragma once

#include <dtf/nn/sequential.hpp>

namespace examples {

/// 784-256-128-10 with ReLU: the network of non_distributed and every distributed example.
inline dtf::nn::sequential make_mlp() {
  using namespace dtf::nn;
  return sequential{dense(784, 256), relu(), dense(256, 128), relu(), dense(128, 10)};
}

}  // namespace examples
