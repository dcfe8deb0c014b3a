// dtf/hooks.hpp — every built-in session hook (see dtf/session.hpp for how hooks are called).
#pragma once

#include <dtf/session.hpp>
#include <dtf/summary.hpp>

#include <dtf/hooks/agreed_stop.hpp>
#include <dtf/hooks/checkpoint_saver.hpp>
#include <dtf/hooks/collective_restore.hpp>
#include <dtf/hooks/feed_fn.hpp>
#include <dtf/hooks/final_ops.hpp>
#include <dtf/hooks/global_step_waiter.hpp>
#include <dtf/hooks/logging.hpp>
#include <dtf/hooks/nan_tensor.hpp>
#include <dtf/hooks/step_counter.hpp>
#include <dtf/hooks/stop_at_step.hpp>
#include <dtf/hooks/stop_on_signal.hpp>
#include <dtf/hooks/summary_saver.hpp>
#include <dtf/hooks/timer.hpp>
