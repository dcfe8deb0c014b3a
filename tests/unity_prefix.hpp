// Included before every source of a test executable's unity batch (tests/CMakeLists.txt):
// dtf's headers and the libraries they include come first, before any source's
// `using namespace dtf;`, which would otherwise change what a later-included library finds
// (e.g. xtl's unqualified data(v) would find the namespace dtf::data).
#pragma once

#include <dtf/dtf.hpp>
#include <dtf/ps.hpp>
#include <dtf/collectives.hpp>
#include <dtf/data.hpp>
#include <dtf/train.hpp>
#include <dtf/train_flags.hpp>
