// torch_cnn's network (421,834 parameters): two blocks of 3x3 convolution, BatchNorm, ReLU and
// 2x2 max-pooling, then dropout and two linear layers. Also benchmarks/torch_overhead.cpp's.
#pragma once

#include <torch/torch.h>

namespace examples {

struct CnnImpl : torch::nn::Cloneable<CnnImpl> {  // Cloneable: mirrored copies it per replica
  CnnImpl() { reset(); }
  void reset() override {
    namespace tnn = torch::nn;
    features = register_module("features",
        tnn::Sequential(tnn::Conv2d(tnn::Conv2dOptions(1, 32, 3).padding(1)), tnn::BatchNorm2d(32), tnn::ReLU(),
                        tnn::MaxPool2d(2), tnn::Conv2d(tnn::Conv2dOptions(32, 64, 3).padding(1)),
                        tnn::BatchNorm2d(64), tnn::ReLU(), tnn::MaxPool2d(2)));
    head = register_module("head", tnn::Sequential(tnn::Flatten(), tnn::Dropout(0.25), tnn::Linear(64 * 7 * 7, 128),
                                                   tnn::ReLU(), tnn::Linear(128, 10)));
  }
  torch::Tensor forward(torch::Tensor x) { return head->forward(features->forward(x)); }
  torch::nn::Sequential features{nullptr}, head{nullptr};
};
TORCH_MODULE(Cnn);

}  // namespace examples
