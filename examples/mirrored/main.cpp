// mirrored — R replicas of the Fashion-MNIST MLP in one process (threads; one per GPU on CUDA
// builds), reduced in shared memory, composed with the ring across processes.
//
//   build/examples/mirrored --replicas 2                                 # one process, 2 replicas
//   dtfrun --workers 2 -- build/examples/mirrored --replicas 2           # 2 processes x 2 replicas
//   mpirun -np 2 --oversubscribe build/examples/mirrored --replicas 2 --rendezvous 127.0.0.1:29500
//
// Rank 0 evaluates after every epoch, prints the RESULT line and writes --metrics_file.
// Training runs in the standard session (../common/hooks.hpp, collective_session): progress
// lines (step= last_step= loss= steps_per_sec= learning_rate=), --last_step/--num_steps,
// --nan_policy, SIGTERM/SIGINT as a stop on every rank, and with --model_dir TensorBoard
// summaries and checkpoints by rank 0; rerunning with the same --model_dir resumes.
#include <dtf/strategies/mirrored.hpp>

#include "../common/collective_job.hpp"

#include <deque>
#include <vector>

int main(int argc, char** argv) try {
  int replicas = 2;
  auto j = examples::collective_job::setup(
      argc, argv, "mirrored",
      "Trains the Fashion-MNIST MLP with R mirrored replicas per process (threads), allreduced across processes "
      "(alone, under dtfrun --workers N, or under mpirun -np N with --rendezvous host:port).",
      "replica", [&](dtf::flag_parser& f) { f.add("replicas", replicas, "model replicas (threads) in this process"); });
  if (!j) return 0;
  if (replicas < 1) throw dtf::error(dtf::errc::invalid_config, "--replicas " + std::to_string(replicas) + " < 1");
  auto& comm = *j->comm;
  const std::size_t r = std::size_t(replicas);
  j->set_shards(r * comm.size());
  struct stream_of {  // batch streams neither copy nor move: build them in place
    explicit stream_of(const dtf::data::dataset& d) : s(d.stream()) {}
    dtf::data::batch_stream s;
  };
  std::vector<dtf::data::dataset> shards;
  for (std::size_t k = 0; k < r; ++k) shards.push_back(j->shard(comm.rank() * r + k));
  std::deque<stream_of> streams(shards.begin(), shards.end());

  dtf::strategies::mirrored<dtf::nn::sequential> strategy(
      comm, examples::make_mlp(), r,
      {.rule = dtf::optim::make_rule(j->optimizer, j->lr), .linear_scaling = j->linear_scaling,
       .warmup_steps = j->warmup_steps, .timeout_ms = std::uint32_t(j->timeout_ms)});
  strategy.initialize(j->seed);
  examples::collective_session session(strategy, comm, strategy.model(0).variables(), j->hooks, j->me(), j->log_every,
                                       j->last_step);
  session->create();  // resumes from --model_dir's latest checkpoint
  if (comm.rank() == 0)
    std::printf("%s: mirrored with %zu replicas x %zu processes (source %s), batch %d per replica; %lld steps\n",
                j->me().c_str(), r, comm.size(), j->source().c_str(), j->batch, static_cast<long long>(j->last_step));
  std::fflush(stdout);
  std::vector<dtf::data::host_batch> batches(r);
  return j->train(
      session, strategy,
      [&] {
        std::size_t examples = 0;
        for (std::size_t k = 0; k < r; ++k) {
          batches[k] = *streams[k].s.next();
          examples += batches[k].labels.size();
        }
        session.run(examples, [&] { return strategy.step(batches); });
      },
      [&] { return dtf::nn::evaluate(strategy.model(0), strategy.parameters(0), j->test); },
      "replicas=" + std::to_string(r) + " ");
} catch (const std::exception& e) {
  std::fprintf(stderr, "mirrored: %s\n", e.what());
  return 2;
}
