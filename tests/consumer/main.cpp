// train.cpp — one binary for every task of the job (ps, workers, chief):
//   dtfrun --ps 1 --workers 2 -- ./train --model_dir ckpt     # rerun the same command: it resumes
#include <dtf/dtf.hpp>

#include <cstdio>

int main(int argc, char** argv) try {
  dtf::train_flags tf;  // cluster, --model_dir, checkpoints, summaries, --epochs, ... (--help)
  int examples = 0;
  dtf::flag_parser flags("Trains an MLP on Fashion-MNIST with DOWNPOUR through parameter servers.");
  tf.add_to(flags);
  flags.add("train_examples", examples, "use only the first N training examples (0: all)");
  if (!flags.parse(argc, argv)) return 0;

  const dtf::cluster cluster = tf.resolve_cluster();  // from the flags, TF_CONFIG, Slurm or MPI
  auto train = dtf::data::load_fashion_mnist(dtf::data::split::train).normalize();
  if (examples > 0) train = train.take(std::size_t(examples));
  const auto test = dtf::data::load_fashion_mnist(dtf::data::split::test).normalize().batch(1000);
  dtf::nn::sequential net{dtf::nn::dense(784, 128), dtf::nn::relu(), dtf::nn::dense(128, 10)};
  dtf::strategies::downpour strategy({.push_every = 5});  // or agn, sync_sgd, ring_allreduce<>, ...

  auto options = tf.options(cluster, "readme");  // plain options: see dtf::train_options
  options.evaluate = dtf::evaluate_on(net, test);
  const dtf::train_result r = dtf::train(cluster, net, train, std::move(strategy), options);
  return r.exit_code;  // a ps task returns 0 once the chief has ended the job
} catch (const std::exception& e) {
  std::fprintf(stderr, "train: %s\n", e.what());
  return 2;
}
