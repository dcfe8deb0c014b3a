// Test helpers: host copies of device tensors (work on CPU and CUDA builds alike) and a
// private temporary directory per test.
#pragma once

#include <dtf/tensor.hpp>

#include <thrust/copy.h>
#include <thrust/device_ptr.h>

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
