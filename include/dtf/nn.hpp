// dtf/nn.hpp — the small neural-network module: Dense, ReLU, softmax cross-entropy,
// Sequential, embedding bags over gathered rows, and evaluation helpers.
#pragma once

#include <dtf/nn/embedding.hpp>
#include <dtf/nn/init.hpp>
#include <dtf/nn/layers.hpp>
#include <dtf/nn/loss.hpp>
#include <dtf/nn/evaluate.hpp>
#include <dtf/nn/sequential.hpp>
