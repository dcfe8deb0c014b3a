// non_distributed — trains a 784-256-128-10 MLP on Fashion-MNIST in one process: the
// baseline every distributed scheme is compared with.
//
// Training runs inside the standard monitored session without parameter servers
// (../common/hooks.hpp, local_session): --last_step / --num_steps, --nan_policy, progress
// lines with dtfrun's key=value tokens, TensorBoard summaries with --model_dir, and
// SIGTERM/SIGINT as a stop request (the step in progress completes, the model is evaluated).
//
//   build/examples/non_distributed --epochs 5
//   build/examples/non_distributed --epochs 5 --model_dir run0    # then: tensorboard --logdir run0
#include <dtf/dtf.hpp>

#include "../common/hooks.hpp"

#include <chrono>
#include <cstdio>
#include <exception>

int main(int argc, char** argv) try {
  std::string data_dir = dtf::data::fashion_mnist_default_dir;
  std::string optimizer = "adam";
  int epochs = 5, batch = 64, log_every = 200, blas_threads = 0, device_threads = 1;
  int train_examples = 0;
  float lr = 1e-3f, target_accuracy = 0.0f;
  std::uint64_t seed = 42;
  examples::hook_flags hf;
  dtf::flag_parser flags("Trains a 784-256-128-10 MLP on Fashion-MNIST in one process.");
  hf.add_to(flags, /*local=*/true);
  flags.add("data", data_dir, "directory holding the Fashion-MNIST IDX files")
      .add("epochs", epochs, "passes over the training set")
      .add("batch", batch, "examples per step")
      .add("lr", lr, "learning rate")
      .add("optimizer", optimizer, "sgd, momentum, nesterov, adagrad or adam")
      .add("seed", seed, "seed for initialisation and shuffling")
      .add("log_every", log_every, "steps between progress lines")
      .add("train_examples", train_examples, "use only the first N training examples (0: all)")
      .add("blas_threads", blas_threads, "BLAS threads (0: the library's default)")
      .add("device_threads", device_threads, "OpenMP threads of Thrust's device system on CPU builds")
      .add("target_accuracy", target_accuracy, "exit with status 1 if the final test accuracy is lower");
  if (!flags.parse(argc, argv)) return 0;
  dtf::set_cpu_threads({.device = device_threads, .blas = blas_threads});

  using namespace dtf;
  auto train_set = data::load_fashion_mnist(data::split::train, data_dir);
  if (train_examples > 0) train_set = train_set.take(std::size_t(train_examples));
  const auto train = train_set.shuffle(seed).normalize().batch(std::size_t(batch)).repeat(epochs).prefetch(2);
  const auto test = data::load_fashion_mnist(data::split::test, data_dir).normalize().batch(1000);

  nn::sequential net{nn::dense(784, 256), nn::relu(), nn::dense(256, 128), nn::relu(), nn::dense(128, 10)};
  const std::size_t n = net.num_parameters();
  tensor params({n}), grads({n});
  net.initialize(params.span<float>(), seed);
  optim::optimizer<> opt(optim::make_rule(optimizer, lr), n);
  std::printf("model: 784-256-128-10 MLP, %zu parameters; optimizer %s lr %g; batch %d; %zu training examples\n", n,
              optimizer.c_str(), double(lr), batch, train.size());

  tensor x, y;
  using clock = std::chrono::steady_clock;
  const auto run_start = clock::now();
  double accuracy = 0.0;
  bool evaluated = false;
  auto evaluate = [&](const char* label) {
    const auto eval = nn::evaluate(net, params.span<float>(), test);
    accuracy = eval.accuracy;
    evaluated = true;
    std::printf("%s  test_loss %.4f  test_accuracy %.4f  elapsed %.1fs\n", label, eval.loss, eval.accuracy,
                std::chrono::duration<double>(clock::now() - run_start).count());
    std::fflush(stdout);
  };
  examples::local_session session(hf, "non_distributed", log_every);
  const auto vars = net.variables();
  session->create();
  auto stream = train.stream();
  while (!session->should_stop()) {
    auto b = stream.next();
    if (!b) break;
    session->run([&](run_context& ctx) {
      assign_from_host(x, b->features);
      assign_from_host(y, b->labels);
      run_values v;
      v.loss = net.loss_and_gradients(params.span<float>(), x, y, grads.span<float>());
      opt.apply(params.span<float>(), grads.span<float>());
      v.examples = b->labels.size();
      v.scalars["learning_rate"] = double(lr);
      if (ctx.summaries_requested()) {
        std::vector<float> host(n);
        params.copy_to_host<float>(std::span<float>(host));
        for (const auto& var : vars)
          v.histograms[var.name].assign(host.begin() + std::ptrdiff_t(var.offset),
                                        host.begin() + std::ptrdiff_t(var.offset + var.size()));
      }
      return v;
    });
    if (b->index + 1 == train.batches_per_epoch()) {
      evaluated = false;
      const std::string label = "epoch " + std::to_string(b->epoch + 1);
      evaluate(label.c_str());
    }
  }
  session->close();
  // Stopped part-way through an epoch (--last_step, --num_steps, a signal, --nan_policy stop):
  // evaluate what was trained.
  if (!evaluated) evaluate(("stopped at step " + std::to_string(session->global_step())).c_str());
  std::printf("final test accuracy %.4f\n", accuracy);
  if (accuracy < target_accuracy) {
    std::fprintf(stderr, "test accuracy %.4f is below the target %.4f\n", accuracy, double(target_accuracy));
    return 1;
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "non_distributed: %s\n", e.what());
  return 2;
}
