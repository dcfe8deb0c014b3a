// dtf/data.hpp — IDX reader, dataset pipeline, the shard on the device, Fashion-MNIST.
#pragma once

#include <dtf/data/dataset.hpp>
#include <dtf/data/device_shard.hpp>
#include <dtf/data/fashion_mnist.hpp>
#include <dtf/data/idx.hpp>
