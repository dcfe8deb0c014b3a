// dtf/optim.hpp — update rules, the optimizer that applies them, learning-rate schedules.
#pragma once

#include <dtf/optim/clip.hpp>
#include <dtf/optim/optimizer.hpp>
#include <dtf/optim/rules.hpp>
#include <dtf/optim/schedule.hpp>
