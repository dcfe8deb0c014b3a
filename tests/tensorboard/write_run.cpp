// Writes a TensorBoard run with dtf for test_tensorboard.sh: trains the small test network on
// seeded synthetic data with SGD inside a monitored_training_session whose summary_saver and
// step_counter hooks write the event file; the step also records, independently of the
// writer, every value it hands to the summaries into <out>/expected.json (scalars and
// histogram statistics per tag and step), which check_run.py compares with what
// TensorBoard's own event reader finds in <out>/logdir.
//
//   write_run <out_dir> [steps]
#include <dtf/dtf.hpp>
#include <dtf/hooks.hpp>

#include <nlohmann/json.hpp>

#include "../train_helpers.hpp"

#include <algorithm>
#include <cstdio>
#include <fstream>

int main(int argc, char** argv) try {
  if (argc < 2) {
    std::fprintf(stderr, "usage: write_run <out_dir> [steps]\n");
    return 2;
  }
  const std::filesystem::path out = argv[1];
  const std::int64_t steps = argc > 2 ? std::stoll(argv[2]) : 60;
  using namespace dtf;
  auto net = test::small_net();
  const std::size_t n = net.num_parameters();
  tensor params({n}), grads({n}), x, y;
  net.initialize(params.span<float>(), 7);
  const float lr = 0.5f;
  optim::optimizer<> opt(optim::make_rule("sgd", lr), n);
  const auto data = test::synthetic(512, 11, test::labels::argmax).shuffle(3).batch(32).repeat(-1);
  auto stream = data.stream();

  nlohmann::json expected = {{"scalars", nlohmann::json::object()}, {"histograms", nlohmann::json::object()}};
  auto writer = std::make_shared<summary_writer>(out / "logdir");
  monitored_training_session session({.is_chief = true});
  session.add_hook(hooks::stop_at_step({.last_step = steps}));
  session.add_hook(hooks::nan_tensor());
  session.add_chief_hook(hooks::summary_saver({.every_n_steps = 10, .writer = writer}));
  auto& counter = session.add_chief_hook(hooks::step_counter({.every_n_steps = 20, .writer = writer}));
  session.add_chief_hook(hooks::logging({.every_n_iter = 20, .prefix = "write_run", .last_step = steps}));
  session.train([&](run_context& ctx) {
    auto b = stream.next();
    assign_from_host(x, b->features);
    assign_from_host(y, b->labels);
    run_values v;
    v.loss = net.loss_and_gradients(params.span<float>(), x, y, grads.span<float>());
    opt.apply(params.span<float>(), grads.span<float>());
    v.examples = b->labels.size();
    v.scalars["learning_rate"] = lr;
    const std::int64_t step = ctx.global_step() + 1;  // a local step: one global step per run
    if (ctx.summaries_requested()) {
      expected["scalars"]["loss"].push_back({step, *v.loss});
      expected["scalars"]["learning_rate"].push_back({step, lr});
      const auto host = params.to_vector<float>();
      for (const auto& var : net.variables()) {
        std::vector<float> values(host.begin() + std::ptrdiff_t(var.offset),
                                  host.begin() + std::ptrdiff_t(var.offset + var.size()));
        double sum = 0;
        for (float f : values) sum += f;
        const auto [lo, hi] = std::minmax_element(values.begin(), values.end());
        expected["histograms"][var.name].push_back({step, values.size(), sum, *lo, *hi});
        v.histograms[var.name] = std::move(values);
      }
    }
    return v;
  });
  expected["step_counter_measurements"] = counter.measurements();
  expected["last_step"] = steps;
  std::ofstream(out / "expected.json") << expected.dump(1) << "\n";
  std::printf("write_run: %lld steps written to %s\n", static_cast<long long>(session.global_step()),
              writer->path().c_str());
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "write_run: %s\n", e.what());
  return 1;
}
