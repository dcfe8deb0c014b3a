// ring_allreduce — synchronous data-parallel training of the Fashion-MNIST MLP without
// parameter servers: every worker computes gradients on its shard, the gradients are averaged
// with a ring allreduce, and every worker applies the same Adam step (Horovod's scheme).
//
//   dtfrun --workers 2 -- build/examples/ring_allreduce
//   mpirun -np 2 --oversubscribe build/examples/ring_allreduce --rendezvous 127.0.0.1:29500
//
// Rank 0 (the chief) evaluates on the test set after every epoch, prints the RESULT line and
// writes --metrics_file. Training runs in the standard session (../common/hooks.hpp,
// collective_session): progress lines (step= last_step= loss= steps_per_sec= learning_rate=)
// from the logging hook, --last_step/--num_steps, --nan_policy, SIGTERM/SIGINT as a stop on
// every rank, and with --model_dir TensorBoard summaries and checkpoints by rank 0; rerunning
// with the same --model_dir resumes every rank from the latest checkpoint.
#include <dtf/strategies/ring_allreduce.hpp>

#include "../common/collective_job.hpp"

int main(int argc, char** argv) try {
  auto j = examples::collective_job::setup(
      argc, argv, "ring_allreduce",
      "Trains the Fashion-MNIST MLP with ring-allreduce (run one process per worker: dtfrun --workers N, or "
      "mpirun -np N with --rendezvous host:port).",
      "worker", [](dtf::flag_parser&) {});
  if (!j) return 0;
  auto& comm = *j->comm;
  j->set_shards(comm.size());
  auto stream = j->shard(comm.rank()).stream();

  auto net = examples::make_mlp();
  dtf::strategies::ring_allreduce<dtf::nn::sequential> strategy(
      comm, net, {.rule = dtf::optim::make_rule(j->optimizer, j->lr), .linear_scaling = j->linear_scaling,
                  .warmup_steps = j->warmup_steps});
  strategy.initialize(j->seed);
  examples::collective_session session(strategy, comm, net.variables(), j->hooks, j->me(), j->log_every, j->last_step);
  session->create();  // resumes from --model_dir's latest checkpoint
  if (comm.rank() == 0)
    std::printf("%s: ring_allreduce with %zu workers (source %s), %zu parameters, batch %d per worker; %lld steps\n",
                j->me().c_str(), comm.size(), j->source().c_str(), net.num_parameters(), j->batch,
                static_cast<long long>(j->last_step));
  std::fflush(stdout);
  return j->train(
      session, strategy,
      [&] {
        auto b = stream.next();
        session.run(b->labels.size(), [&] { return strategy.step(*b); });
      },
      [&] { return dtf::nn::evaluate(net, strategy.parameters(), j->test); }, "");
} catch (const std::exception& e) {
  std::fprintf(stderr, "ring_allreduce: %s\n", e.what());
  return 2;
}
