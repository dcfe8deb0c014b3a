// Test helpers: host copies of device tensors (work on CPU and CUDA builds alike) and a
// private temporary directory per test.
#pragma once

#include <dtf/data/fashion_mnist.hpp>
#include <dtf/tensor.hpp>

#include <thrust/copy.h>
#include <thrust/device_ptr.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <span>
#include <string>
#include <unistd.h>
#include <vector>

namespace dtf::test {

inline std::vector<float> get(const tensor& t) { return t.to_vector<float>(); }

inline void set(tensor& t, const std::vector<float>& v) { t.copy_from_host<float>(std::span<const float>(v)); }

/// A host copy of floats in device memory (what a strategy hands to o.evaluate): device memory
/// on CUDA builds, where reading the span on the host would fault; a plain copy on CPU builds.
inline std::vector<float> host_copy(std::span<const float> device) {
  std::vector<float> out(device.size());
  thrust::copy(thrust::device_pointer_cast(device.data()), thrust::device_pointer_cast(device.data() + device.size()),
               out.begin());
  return out;
}

/// A local reference computation on host vectors (a model's parameters and gradients are
/// device memory on CUDA builds): p and g copied through device tensors around the call.
template <class Model>
float loss_and_gradients_on_host(Model& net, const std::vector<float>& p, const tensor& x, const tensor& y,
                                 std::vector<float>& g) {
  tensor pt({p.size()}), gt({g.size()});
  set(pt, p);
  const float loss = net.loss_and_gradients(pt.span<float>(), x, y, gt.span<float>());
  g = get(gt);
  return loss;
}

/// The same for an embedding model, whose rows are host memory already.
template <class Model, class Rows>
float loss_and_gradients_on_host(Model& net, const std::vector<float>& p, Rows rows, const tensor& x, const tensor& y,
                                 std::vector<float>& g) {
  tensor pt({p.size()}), gt({g.size()});
  set(pt, p);
  const float loss = net.loss_and_gradients(pt.span<float>(), rows, x, y, gt.span<float>());
  g = get(gt);
  return loss;
}

/// A model's loss at host parameters (see loss_and_gradients_on_host).
template <class Model>
float loss_on_host(Model& net, const std::vector<float>& p, const tensor& x, const tensor& y) {
  tensor pt({p.size()});
  set(pt, p);
  return net.loss(pt.span<float>(), x, y);
}

/// A model's initial parameters as a host vector (see loss_and_gradients_on_host).
template <class Model>
std::vector<float> initial_parameters(const Model& net, std::uint64_t seed) {
  tensor pt({net.num_parameters()});
  net.initialize(pt.span<float>(), seed);
  return get(pt);
}

/// Where the tests read Fashion-MNIST: $DTF_TEST_FASHION_MNIST (scripts/gpu-check.sh, whose
/// machine has the data only in its bundle), else the Debian package's directory.
inline std::string fashion_mnist_dir() {
  const char* dir = std::getenv("DTF_TEST_FASHION_MNIST");
  return dir && *dir ? dir : data::fashion_mnist_default_dir;
}

/// A fresh directory under the system temp dir, removed when the object goes away.
class temp_dir {
 public:
  explicit temp_dir(const std::string& tag) {
    static int counter = 0;
    path_ = std::filesystem::temp_directory_path() /
            ("dtf-test-" + tag + "-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~temp_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace dtf::test
