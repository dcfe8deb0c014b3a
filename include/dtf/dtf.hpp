// dtf/dtf.hpp — umbrella header: everything a training program needs. Convenience only;
// dtf's own headers include exactly what they use.
#pragma once

#include <dtf/collectives.hpp>
#include <dtf/concepts.hpp>
#include <dtf/config.hpp>
#include <dtf/data.hpp>
#include <dtf/dtype.hpp>
#include <dtf/error.hpp>
#include <dtf/flags.hpp>
#include <dtf/host.hpp>
#include <dtf/nn.hpp>
#include <dtf/optim.hpp>
#include <dtf/runtime.hpp>
#include <dtf/tensor.hpp>
