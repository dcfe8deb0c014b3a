#include <dtf/dtf.hpp>
#include <dtf/torch/module_model.hpp>

int main(int argc, char** argv) {
  dtf::train_flags tf;
  dtf::flag_parser flags("A LibTorch network trained by dtf with ring-allreduce.");
  tf.add_to(flags, dtf::train_flag_set::collective);
  if (!flags.parse(argc, argv)) return 0;
  const dtf::cluster cluster = tf.resolve_cluster();

  namespace nn = torch::nn;  // any torch::nn::Module with float32 parameters
  dtf::libtorch::module_model<nn::Sequential> net(
      nn::Sequential(nn::Conv2d(nn::Conv2dOptions(1, 8, 3).padding(1)), nn::ReLU(), nn::MaxPool2d(2),
                     nn::Flatten(), nn::Linear(8 * 14 * 14, 10)),
      {.input_shape = {1, 28, 28}});
  auto train = dtf::data::load_fashion_mnist(dtf::data::split::train).normalize();
  auto test = dtf::data::load_fashion_mnist(dtf::data::split::test).normalize().batch(1000);
  auto options = tf.options(cluster, "torch_readme");
  options.evaluate = dtf::evaluate_on(net, test);
  return dtf::train(cluster, net, train, dtf::strategies::ring_allreduce<>(), options).exit_code;
}
