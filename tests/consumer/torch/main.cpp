// Links dtf::torch and nothing else: dtf's headers, LibTorch's C++ API headers (their include
// directory comes with LibTorch's target only) and its libraries must all come through it. Kept
// to headers that compile in about a second (torch/torch.h takes 15 s).
#include <dtf/error.hpp>
#include <torch/cuda.h>

#include <cstdio>

int main() {
  const dtf::error e(dtf::errc::invalid_argument, "dtf::torch consumer");
  std::printf("%s; LibTorch sees %zu CUDA devices\n", e.what(), torch::cuda::device_count());
  return 0;
}
