// dtf/data/fashion_mnist.hpp — Fashion-MNIST (Xiao et al. 2017): 60,000 training and 10,000
// test images of 28x28 8-bit pixels in 10 classes, as shipped by Debian's
// dataset-fashion-mnist package.
#pragma once

#include <dtf/data/dataset.hpp>

#include <filesystem>
#include <string>

namespace dtf::data {

/// Where Debian's dataset-fashion-mnist package installs the files.
inline constexpr const char* fashion_mnist_default_dir = "/usr/share/datasets/fashion-mnist";

/// Which Fashion-MNIST split: 60,000 training or 10,000 test examples.
enum class split { train, test };

/// Loads one split from `dir`, which holds {train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz].
/// Features are [N, 784] raw pixel values in [0, 255] (call normalize()); labels in [0, 10).
/// Errors: errc::io_error naming the missing file (and the package that provides it).
inline dataset load_fashion_mnist(split which, const std::string& dir = fashion_mnist_default_dir) {
  const std::string prefix = which == split::train ? "train" : "t10k";
  auto find = [&](const std::string& stem) {
    for (const char* ext : {".gz", ""}) {
      const std::filesystem::path p = std::filesystem::path(dir) / (stem + ext);
      if (std::filesystem::exists(p)) return p.string();
    }
    throw error(errc::io_error, (std::filesystem::path(dir) / (stem + ".gz")).string() +
                                    ": Fashion-MNIST file not found (apt-get install dataset-fashion-mnist, or pass "
                                    "the directory that holds it)");
  };
  const std::string images = find(prefix + "-images-idx3-ubyte");
  const std::string labels = find(prefix + "-labels-idx1-ubyte");
  return dataset::from_idx(images, labels);
}

}  // namespace dtf::data
