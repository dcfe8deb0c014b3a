// dtf/dtf.hpp — umbrella header: everything a training program needs (dtf::train, the standard
// flags, every built-in strategy, the model layer, data, cluster). Convenience only; dtf's own
// headers include exactly what they use.
#pragma once

#include <dtf/checkpoint.hpp>
#include <dtf/cluster.hpp>
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
#include <dtf/partitioners.hpp>
#include <dtf/runtime.hpp>
#include <dtf/session.hpp>
#include <dtf/strategies/aeasgd.hpp>
#include <dtf/strategies/agn.hpp>
#include <dtf/strategies/downpour.hpp>
#include <dtf/strategies/dyn_sgd.hpp>
#include <dtf/strategies/eamsgd.hpp>
#include <dtf/strategies/hogwild.hpp>
#include <dtf/strategies/mirrored.hpp>
#include <dtf/strategies/ring_allreduce.hpp>
#include <dtf/strategies/sync.hpp>
#include <dtf/tensor.hpp>
#include <dtf/train.hpp>
#include <dtf/train_flags.hpp>
