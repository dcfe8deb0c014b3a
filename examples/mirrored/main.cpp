// mirrored — R replicas of the Fashion-MNIST MLP in one process (threads; one per GPU on CUDA
// builds), reduced in shared memory, composed with the ring across processes.
//
//   build/examples/mirrored --replicas 2                                 # one process, 2 replicas
//   dtfrun --workers 2 -- build/examples/mirrored --replicas 2           # 2 processes x 2 replicas
//   mpirun -np 2 --oversubscribe build/examples/mirrored --replicas 2 --rendezvous 127.0.0.1:29500
//
// Rank 0 evaluates, checkpoints and prints the RESULT line; rerunning with the same
// --model_dir resumes (dtf/train.hpp).
#include <dtf/dtf.hpp>

#include "../common/fashion_mnist.hpp"
#include "../common/mlp.hpp"

#include <cstdio>

int main(int argc, char** argv) try {
  dtf::train_flags tf;
  examples::fashion_mnist data;
  dtf::strategies::mirrored_config c{.linear_scaling = true, .warmup_steps = 100};
  std::string optimizer = "adam";
  float lr = 1e-3f;
  int replicas = 2;
  dtf::flag_parser flags("Trains the Fashion-MNIST MLP with R mirrored replicas per process (threads), allreduced "
                         "across processes (alone, under dtfrun --workers N, or mpirun -np N --rendezvous host:port).");
  tf.add_to(flags, dtf::train_flag_set::collective);
  data.add_to(flags);
  flags.add("replicas", replicas, "model replicas (threads) in this process")
      .add("optimizer", optimizer, "sgd, momentum, nesterov, adagrad or adam")
      .add("lr", lr, "base learning rate (for one replica's batch)")
      .add("linear_scaling", c.linear_scaling, "scale the rate by the replicas in all; --nolinear_scaling: off")
      .add("warmup_steps", c.warmup_steps, "ramp from lr to the scaled rate over this many steps")
      .add("overlap", c.overlap, "reduce each bucket of gradients while backprop runs; --nooverlap: after backprop")
      .add("bucket_bytes", c.bucket_bytes, "gradients cross processes in buckets of at least this many bytes (0: one)");
  if (!flags.parse(argc, argv)) return 0;
  if (replicas < 1) throw dtf::error(dtf::errc::invalid_config, "--replicas " + std::to_string(replicas) + " < 1");

  const dtf::cluster cluster = tf.resolve_cluster();
  const auto train = data.train();
  auto net = examples::make_mlp();
  c.rule = tf.rule(optimizer, lr);
  c.timeout_ms = tf.train.timeout_ms;
  dtf::strategies::mirrored<> strategy(c, std::size_t(replicas));
  auto options = tf.options(cluster, "mirrored");
  options.evaluate = dtf::evaluate_on(net, data.test());
  options.result_extra = "replicas=" + std::to_string(replicas);
  return dtf::train(cluster, net, train, std::move(strategy), options).exit_code;
} catch (const std::exception& e) {
  std::fprintf(stderr, "mirrored: %s\n", e.what());
  return 2;
}
