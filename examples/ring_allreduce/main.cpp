// ring_allreduce — synchronous data-parallel training of the Fashion-MNIST MLP without
// parameter servers: every worker computes gradients on its shard, the gradients are averaged
// with a ring allreduce, and every worker applies the same Adam step (Horovod's scheme).
//
//   dtfrun --workers 2 -- build/examples/ring_allreduce
//   mpirun -np 2 --oversubscribe build/examples/ring_allreduce --rendezvous 127.0.0.1:29500
//
// Rank 0 (the chief) evaluates, checkpoints and prints the RESULT line; every rank stops at
// the same step; rerunning with the same --model_dir resumes (dtf/train.hpp).
#include <dtf/dtf.hpp>

#include "../common/fashion_mnist.hpp"
#include "../common/mlp.hpp"

#include <cstdio>

int main(int argc, char** argv) try {
  dtf::train_flags tf;
  examples::fashion_mnist data;
  dtf::strategies::ring_allreduce_config c{.linear_scaling = true, .warmup_steps = 100};
  std::string optimizer = "adam";
  float lr = 1e-3f;
  std::string backend = "automatic";
  dtf::flag_parser flags("Trains the Fashion-MNIST MLP with ring-allreduce (one process per worker: dtfrun "
                         "--workers N, or mpirun -np N with --rendezvous host:port).");
  tf.add_to(flags, dtf::train_flag_set::collective);
  data.add_to(flags);
  flags.add("optimizer", optimizer, "sgd, momentum, nesterov, adagrad or adam")
      .add("lr", lr, "base learning rate (for one worker's batch)")
      .add("linear_scaling", c.linear_scaling, "scale the rate by the workers in all; --nolinear_scaling: off")
      .add("warmup_steps", c.warmup_steps, "ramp from lr to the scaled rate over this many steps")
      .add("overlap", c.overlap, "reduce each bucket of gradients while backprop runs; --nooverlap: after backprop")
      .add("bucket_bytes", c.bucket_bytes, "gradients cross processes in buckets of at least this many bytes (0: one)")
      .add("backend", backend, "where the gradients are averaged: automatic (NCCL on CUDA builds linking it, one GPU "
                               "per rank; else the TCP ring), tcp or nccl");
  if (!flags.parse(argc, argv)) return 0;

  const dtf::cluster cluster = tf.resolve_cluster();
  const auto train = data.train();
  auto net = examples::make_mlp();
  c.rule = tf.rule(optimizer, lr);
  c.backend = dtf::strategies::parse_exchange_backend(backend);
  dtf::strategies::ring_allreduce<> strategy(c);
  auto options = tf.options(cluster, "ring_allreduce");
  options.evaluate = dtf::evaluate_on(net, data.test());
  return dtf::train(cluster, net, train, std::move(strategy), options).exit_code;
} catch (const std::exception& e) {
  std::fprintf(stderr, "ring_allreduce: %s\n", e.what());
  return 2;
}
