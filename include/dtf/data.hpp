// dtf/data.hpp — IDX reader, dataset pipeline, the shard on the device, Fashion-MNIST, the
// Criteo TSV reader and its synthetic logs (with dtf/metrics/binary.hpp: AUC, log loss).
#pragma once

#include <dtf/data/criteo.hpp>
#include <dtf/data/criteo_synthetic.hpp>
#include <dtf/data/dataset.hpp>
#include <dtf/data/device_shard.hpp>
#include <dtf/data/fashion_mnist.hpp>
#include <dtf/data/idx.hpp>
