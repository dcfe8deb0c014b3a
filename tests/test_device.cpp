// One GPU per process: the local rank from each launcher's variables and the device chosen from
// it (dtf/device/select.hpp). The decision is a pure function of the environment and the number
// of visible GPUs, so it is tested here on every build; CUDA builds apply it with cudaSetDevice.
#include <dtf/device/context.hpp>
#include <dtf/device/kernels.hpp>
#include <dtf/device/loss_ring.hpp>
#include <dtf/device/select.hpp>
#include <dtf/device/step_graph.hpp>
#include <dtf/nn/sequential.hpp>
#include <dtf/optim/optimizer.hpp>
#include <dtf/strategies/exchange_health.hpp>
#include <dtf/strategies/pinned_staging.hpp>

#include <catch2/catch.hpp>

#include <thrust/device_vector.h>
#include <thrust/reduce.h>
#include <thrust/sort.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>
#include <new>
#include <string>

#if DTF_CUDA
#include <cuda_runtime.h>
#endif

// Heap allocations made by the thread that armed the count (the steady-step test below): the
// replaceable global operator new, counting only while armed, so that the rest of the program
// is unaffected. On CPU builds device memory is heap memory, so this sees every allocation a
// step makes, tensors', Thrust's and the standard library's alike. CPU builds only (CUDA declares
// the global operator new for device code too; there the pool's counters and a graph capture say it).
#if !DTF_CUDA
namespace device_test {
thread_local bool count_heap = false;
thread_local std::size_t heap_allocations = 0;
}  // namespace device_test

void* operator new(std::size_t n) {
  if (device_test::count_heap) ++device_test::heap_allocations;
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
#endif

namespace device_test {

using env_map = std::map<std::string, std::string>;

dtf::device::env_lookup lookup(const env_map& m) {
  return [&m](const char* v) -> const char* {
    const auto it = m.find(v);
    return it == m.end() ? nullptr : it->second.c_str();
  };
}

std::optional<dtf::device::local_rank_info> local(const env_map& m) { return dtf::device::local_rank_from(lookup(m)); }

std::string error_of(const env_map& m) {
  try {
    (void)local(m);
  } catch (const dtf::error& e) {
    CHECK(e.code() == dtf::errc::invalid_config);
    return e.what();
  }
  return "";
}

struct square_index {
  float* out;
  DTF_HD void operator()(std::size_t i) const { out[i] = float(i) * float(i); }
};

}  // namespace device_test

TEST_CASE("the local rank comes from each launcher's variables", "[device]") {
  using namespace device_test;
  struct row {
    env_map env;
    int rank;
    std::optional<int> size;
    std::string source;
  };
  const row rows[] = {
      {{{"DTF_LOCAL_RANK", "1"}, {"DTF_LOCAL_SIZE", "3"}}, 1, 3, "DTF_LOCAL_RANK"},
      {{{"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "4"}}, 2, 4, "LOCAL_RANK"},
      {{{"LOCAL_RANK", "5"}}, 5, std::nullopt, "LOCAL_RANK"},
      {{{"OMPI_COMM_WORLD_LOCAL_RANK", "0"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}}, 0, 2, "OMPI_COMM_WORLD_LOCAL_RANK"},
      {{{"MV2_COMM_WORLD_LOCAL_RANK", "3"}, {"MV2_COMM_WORLD_LOCAL_SIZE", "8"}}, 3, 8, "MV2_COMM_WORLD_LOCAL_RANK"},
      {{{"MPI_LOCALRANKID", "1"}, {"MPI_LOCALNRANKS", "2"}}, 1, 2, "MPI_LOCALRANKID"},
      // srun: the step's tasks per node, at this node (2 on each of nodes 0-2, then 1 on node 3).
      {{{"SLURM_LOCALID", "1"}, {"SLURM_STEP_TASKS_PER_NODE", "2(x3),1"}, {"SLURM_NODEID", "2"}}, 1, 2, "SLURM_LOCALID"},
      {{{"SLURM_LOCALID", "0"}, {"SLURM_STEP_TASKS_PER_NODE", "2(x3),1"}, {"SLURM_NODEID", "3"}}, 0, 1, "SLURM_LOCALID"},
      {{{"SLURM_LOCALID", "0"}, {"SLURM_TASKS_PER_NODE", "4,2"}, {"SLURM_NODEID", "1"}}, 0, 2, "SLURM_LOCALID"},
      {{{"SLURM_LOCALID", "3"}, {"SLURM_TASKS_PER_NODE", "4"}}, 3, 4, "SLURM_LOCALID"},
      {{{"SLURM_LOCALID", "0"}, {"SLURM_TASKS_PER_NODE", "4"}, {"SLURM_NODEID", "7"}}, 0, std::nullopt, "SLURM_LOCALID"},
      // mpirun inside a Slurm allocation: Open MPI's ranks, not the batch script's.
      {{{"OMPI_COMM_WORLD_LOCAL_RANK", "1"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}, {"SLURM_LOCALID", "0"}}, 1, 2,
       "OMPI_COMM_WORLD_LOCAL_RANK"},
      // dtfrun's own variables first.
      {{{"DTF_LOCAL_RANK", "0"}, {"DTF_LOCAL_SIZE", "1"}, {"LOCAL_RANK", "3"}}, 0, 1, "DTF_LOCAL_RANK"},
  };
  for (const row& r : rows) {
    INFO(r.source << " rank " << r.rank);
    const auto got = local(r.env);
    REQUIRE(got);
    CHECK(got->rank == r.rank);
    CHECK(got->size == r.size);
    CHECK(got->source == r.source);
  }
  CHECK_FALSE(local({}));
  CHECK_FALSE(local({{"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}}));  // a size without a rank says nothing
}

TEST_CASE("a malformed local-rank variable is an error naming it", "[device]") {
  using namespace device_test;
  CHECK_THAT(error_of({{"LOCAL_RANK", "one"}}), Catch::Contains("$LOCAL_RANK='one'"));
  CHECK_THAT(error_of({{"LOCAL_RANK", "-1"}}), Catch::Contains("$LOCAL_RANK='-1'"));
  CHECK_THAT(error_of({{"LOCAL_RANK", ""}}), Catch::Contains("$LOCAL_RANK=''"));
  CHECK_THAT(error_of({{"LOCAL_RANK", "99999999999"}}), Catch::Contains("$LOCAL_RANK"));
  CHECK_THAT(error_of({{"DTF_LOCAL_RANK", "2"}, {"DTF_LOCAL_SIZE", "2"}}),
             Catch::Contains("$DTF_LOCAL_RANK=2 is not below its 2 local ranks"));
  CHECK_THAT(error_of({{"DTF_LOCAL_RANK", "0"}, {"DTF_LOCAL_SIZE", "x"}}), Catch::Contains("$DTF_LOCAL_SIZE='x'"));
  for (const char* bad : {"2(x", "2(y3)", "(x2)", "2,,1", "2(x0)", "a", "2,", "2(x3)1", "2(x)", ""}) {
    INFO(bad);
    CHECK_THAT(error_of({{"SLURM_LOCALID", "0"}, {"SLURM_STEP_TASKS_PER_NODE", bad}}),
               Catch::Contains("$SLURM_STEP_TASKS_PER_NODE"));
  }
  CHECK_THAT(error_of({{"SLURM_LOCALID", "0"}, {"SLURM_TASKS_PER_NODE", "2"}, {"SLURM_NODEID", "n1"}}),
             Catch::Contains("$SLURM_NODEID='n1'"));
}

TEST_CASE("each local rank gets a GPU of its own, or a clear error", "[device]") {
  using dtf::device::choose_device;
  using dtf::device::local_rank_info;
  const local_rank_info r1of2{1, 2, "DTF_LOCAL_RANK"};
  const local_rank_info r3of4{3, 4, "OMPI_COMM_WORLD_LOCAL_RANK"};

  // As many GPUs as local ranks, or more: device = local rank.
  auto s = choose_device(r1of2, 2, nullptr, {});
  CHECK(s.device == 1);
  CHECK_FALSE(s.shared);
  CHECK(s.reason == "GPU 1 of 2 (local rank 1 of 2 from DTF_LOCAL_RANK)");
  CHECK(choose_device(r3of4, 8, nullptr, {}).device == 3);
  // No launcher: GPU 0.
  s = choose_device(std::nullopt, 4, nullptr, {});
  CHECK(s.device == 0);
  CHECK_FALSE(s.local);
  // A rank without a size: its own index must be visible.
  CHECK(choose_device(local_rank_info{2, std::nullopt, "LOCAL_RANK"}, 4, nullptr, {}).device == 2);

  // More local ranks than GPUs: an error naming the counts and the ways out...
  try {
    (void)choose_device(r3of4, 2, "0,1", {});
    FAIL("4 ranks on 2 GPUs were accepted");
  } catch (const dtf::error& e) {
    CHECK(e.code() == dtf::errc::invalid_config);
    CHECK_THAT(e.what(), Catch::Contains("4 local ranks on this host (local rank 3 of 4 from OMPI_COMM_WORLD_LOCAL_RANK)") &&
                             Catch::Contains("but 2 GPUs visible (CUDA_VISIBLE_DEVICES=0,1)") &&
                             Catch::Contains("--share_gpus"));
  }
  // ...the same on one GPU that CUDA_VISIBLE_DEVICES does not single out for this process...
  CHECK_THROWS_WITH(choose_device(r1of2, 1, nullptr, {}), Catch::Contains("2 local ranks on this host"));
  // ...unless sharing was asked for (round-robin over the visible GPUs)...
  s = choose_device(r3of4, 2, nullptr, {.share = true});
  CHECK(s.device == 1);
  CHECK(s.shared);
  CHECK(choose_device(r1of2, 1, nullptr, {.share = true}).device == 0);
  // ...or the launcher showed this process exactly one GPU (Slurm's --gpus-per-task).
  s = choose_device(r3of4, 1, "5", {});
  CHECK(s.device == 0);
  CHECK_FALSE(s.shared);
  CHECK_THAT(s.reason, Catch::Contains("CUDA_VISIBLE_DEVICES=5 shows this process one GPU of its own"));

  // An explicit device is used as given, and must be visible.
  s = choose_device(r3of4, 2, nullptr, {.device = 1});
  CHECK(s.device == 1);
  CHECK(s.reason == "GPU 1 of 2 (--gpu)");
  CHECK_THROWS_WITH(choose_device(std::nullopt, 2, nullptr, {.device = 2}), Catch::Contains("--gpu 2: only 2 GPUs are visible"));
  // No GPU at all.
  CHECK_THROWS_WITH(choose_device(std::nullopt, 0, "", {}),
                    Catch::Contains("no GPU is visible to this process (CUDA_VISIBLE_DEVICES=)"));
  CHECK(dtf::device::devices_named("") == 0);
  CHECK(dtf::device::devices_named("2,3") == 2);
  CHECK_FALSE(dtf::device::devices_named(nullptr));
}

TEST_CASE("select_device reads the environment: sharing from DTF_SHARE_GPUS, bad variables refused", "[device]") {
  using namespace device_test;
  const env_map share{{"DTF_SHARE_GPUS", "1"}};
  CHECK(dtf::device::share_from_environment(lookup(share)));
  CHECK_FALSE(dtf::device::share_from_environment(lookup({{"DTF_SHARE_GPUS", "0"}})));
  const env_map bad{{"DTF_LOCAL_RANK", "4"}, {"DTF_LOCAL_SIZE", "2"}};
  CHECK_THROWS_WITH(dtf::device::select_device({}, lookup(bad)), Catch::Contains("$DTF_LOCAL_RANK=4"));
#if !DTF_CUDA
  // A CPU build chooses no GPU.
  CHECK_FALSE(dtf::device::select_device({}, lookup({{"DTF_LOCAL_RANK", "1"}, {"DTF_LOCAL_SIZE", "2"}})));
#endif
}

TEST_CASE("a context's pool serves a repeated step's temporaries without new allocations", "[device]") {
  dtf::device::context ctx;
  auto& pool = ctx.pool();
#if !DTF_CUDA
  // The CPU pool itself: a freed block serves the next request of its size. (CUDA's pool
  // reserves in its own granularity and may hand out another address.)
  void* a = pool.allocate(1000);
  pool.deallocate(a, 1000);
  void* b = pool.allocate(1000);
  CHECK(b == a);
  void* c = pool.allocate(1000);  // the first is in use: a new block
  CHECK(c != b);
  pool.deallocate(b, 1000);
  pool.deallocate(c, 1000);
  auto st = pool.stats();
  CHECK(st.requests == 3);
  CHECK(st.system_allocations == 2);
  CHECK(st.bytes_reserved == 2000);
#else
  const auto st = pool.stats();
#endif

  // A "step" of Thrust algorithms with temporaries (a sort and a reduction) on the context's
  // policy: the first step fills the pool, the following ones take nothing more from the system,
  // and the results are those of the default policy.
  std::vector<float> host(10000);
  for (std::size_t i = 0; i < host.size(); ++i) host[i] = float((i * 7919) % 10007) - 5000.0f;
  thrust::device_vector<float> v(host.begin(), host.end());
  auto step = [&] {
    thrust::device_vector<float> w = v;
    thrust::sort(ctx.policy(), w.begin(), w.end());
    const float sum = thrust::reduce(ctx.policy(), w.begin(), w.end(), 0.0f);
    ctx.synchronize();
    return std::pair{std::vector<float>(w.begin(), w.end()), sum};
  };
  const auto first = step();
  const auto warm = pool.stats();
  REQUIRE(warm.requests > st.requests);  // the algorithms' temporaries came from the pool
  for (int i = 0; i < 3; ++i) CHECK(step() == first);
  const auto after = pool.stats();
  CHECK(after.requests > warm.requests);
  CHECK(after.system_allocations == warm.system_allocations);
  CHECK(after.bytes_reserved == warm.bytes_reserved);
  std::vector<float> sorted = host;
  std::sort(sorted.begin(), sorted.end());
  CHECK(first.first == sorted);
  thrust::device_vector<float> w = v;
  thrust::sort(w.begin(), w.end());
  CHECK(first.second == thrust::reduce(w.begin(), w.end(), 0.0f));
}

TEST_CASE("device kernels: one call per index, and a deterministic mean against a double sum", "[device]") {
  using namespace device_test;
  thrust::device_vector<float> v(1000);
  dtf::device::for_each_index({}, v.size(), square_index{thrust::raw_pointer_cast(v.data())});
  const std::vector<float> squares(v.begin(), v.end());
  for (std::size_t i = 0; i < squares.size(); ++i) REQUIRE(squares[i] == float(i) * float(i));
  dtf::device::for_each_index({}, 0, square_index{nullptr});  // nothing to do, nothing launched

  // Sizes around the reduction block's width (256 threads): fewer values than threads, exactly
  // as many, one more, several per thread.
  thrust::device_vector<float> mean(1);
  for (std::size_t n : {0, 1, 255, 256, 257, 1000, 4099}) {
    std::vector<float> host(n);
    for (std::size_t i = 0; i < n; ++i) host[i] = float(std::sin(double(i) * 0.37) * 3.0 + 0.25);
    thrust::device_vector<float> d(host.begin(), host.end());
    double ref = 0;
    for (float x : host) ref += x;
    ref = n == 0 ? 0.0 : ref / double(n);
    dtf::device::mean_of({}, thrust::raw_pointer_cast(d.data()), n, thrust::raw_pointer_cast(mean.data()));
    const float first = mean[0];
    dtf::device::mean_of({}, thrust::raw_pointer_cast(d.data()), n, thrust::raw_pointer_cast(mean.data()));
    INFO("n " << n);
    CHECK(mean[0] == first);  // the same bits every time: a fixed order, no atomics
    CHECK(first == Approx(ref).margin(1e-6));
  }
}

TEST_CASE("the loss ring returns each step once, in order, and the first non-finite step", "[device]") {
  using dtf::device::step_loss;
  dtf::device::loss_ring ring(3);
  CHECK(ring.capacity() == 3);
  CHECK(ring.poll().empty());
  thrust::device_vector<float> loss(1);
  const float* at = thrust::raw_pointer_cast(loss.data());
  auto flag = [&] {
    thrust::device_vector<std::int64_t> f(thrust::device_pointer_cast(ring.device_flag()),
                                          thrust::device_pointer_cast(ring.device_flag()) + 1);
    return std::int64_t(f[0]);
  };
  // Five steps into three slots without a poll: the two oldest are kept for the next poll.
  std::vector<step_loss> pushed;
  for (std::int64_t s = 10; s < 15; ++s) {
    loss[0] = 0.5f * float(s);
    ring.push(s, at);
    pushed.push_back({s, 0.5f * float(s)});
  }
  CHECK(ring.drain() == pushed);
  CHECK(ring.poll().empty());
  CHECK_FALSE(ring.first_nonfinite());
  CHECK(flag() == 0);

  // A NaN at step 16 and an infinity at step 18: the flag names the first, and keeps it.
  std::vector<step_loss> got;
  const float values[] = {1.0f, std::numeric_limits<float>::quiet_NaN(), 2.0f, std::numeric_limits<float>::infinity()};
  for (std::int64_t s = 15; s < 19; ++s) {
    loss[0] = values[s - 15];
    ring.push(s, at);
    for (const auto& e : ring.poll()) got.push_back(e);
  }
  for (const auto& e : ring.drain()) got.push_back(e);
  REQUIRE(got.size() == 4);
  for (std::size_t i = 0; i < got.size(); ++i) CHECK(got[i].step == std::int64_t(15 + i));
  CHECK(got[0].loss == 1.0f);
  CHECK(std::isnan(got[1].loss));
  CHECK(std::isinf(got[3].loss));
  REQUIRE(ring.first_nonfinite());
  CHECK(*ring.first_nonfinite() == 16);
  CHECK(flag() == 17);

  CHECK_THROWS_WITH(dtf::device::loss_ring(0), Catch::Contains("at least one slot"));
}

// A device exchange's health (section 6.1 of docs/design/gpu-execution.md): a wait fails when no
// step completed for the bound since the later of its start and the last completion seen. A
// stand-in clock (time points built by hand) and stand-in events (ints: the step each marks,
// "complete" when the stand-in device has reached it).
TEST_CASE("exchange health: a wait gives up after the bound without progress, never while steps complete",
          "[device][health]") {
  using dtf::strategies::detail::progress_bound;
  using dtf::strategies::detail::step_marks;
  using ms = std::chrono::milliseconds;
  const progress_bound::clock::time_point t0{};
  progress_bound bound(ms(100));
  // A wait that began at t0 with no progress: alive at t0 + 100 ms, expired just after.
  CHECK_FALSE(bound.expired(t0, t0 + ms(100)));
  CHECK(bound.expired(t0, t0 + ms(101)));
  // Progress at t0 + 90 ms moves the bound: the wait lives until t0 + 190 ms.
  bound.observe(1, t0 + ms(90));
  CHECK_FALSE(bound.expired(t0, t0 + ms(150)));
  CHECK(bound.expired(t0, t0 + ms(191)));
  // The same count again is no progress.
  bound.observe(1, t0 + ms(180));
  CHECK(bound.expired(t0, t0 + ms(191)));
  // A later wait is bounded from its own start, whatever happened before.
  CHECK_FALSE(bound.expired(t0 + ms(500), t0 + ms(550)));
  CHECK(bound.expired(t0 + ms(500), t0 + ms(601)));
  CHECK(bound.completed() == 1);

  // Step marks: 3 slots; the stand-in device completes steps in order up to `reached`.
  step_marks<int> marks(3);
  int next = 1;
  auto record = [&](int& e) { e = next++; };
  std::uint64_t reached = 0;
  auto query = [&](int e) { return std::uint64_t(e) <= reached; };
  CHECK(marks.completed(query) == 0);
  marks.mark(record);
  marks.mark(record);
  CHECK(marks.completed(query) == 0);
  reached = 1;
  CHECK(marks.completed(query) == 1);
  reached = 2;
  CHECK(marks.completed(query) == 2);
  // Five more steps into three slots: the two oldest slots were recorded again; the steps they
  // marked before are counted with the newer ones, in order.
  for (int i = 0; i < 5; ++i) marks.mark(record);
  CHECK(marks.issued() == 7);
  CHECK(marks.completed(query) == 4);  // steps 5..7 unknown; 3 and 4 were overwritten
  reached = 6;
  CHECK(marks.completed(query) == 6);
  reached = 7;
  CHECK(marks.completed(query) == 7);
}

TEST_CASE("the loss ring calls its wait check in every wait and ends the wait with its error", "[device][health]") {
  thrust::device_vector<float> loss(1, 1.0f);
  const float* at = thrust::raw_pointer_cast(loss.data());
  dtf::device::loss_ring ring(2);
  int calls = 0;
  bool dead = false;
  ring.set_wait_check([&](std::chrono::steady_clock::time_point since) {
    CHECK(since <= std::chrono::steady_clock::now());
    ++calls;
    if (dead) throw dtf::error(dtf::errc::timeout, "stand-in: no step completed");
  });
  ring.push(1, at);
  ring.push(2, at);
  CHECK(calls == 0);  // nothing waited yet
  ring.push(3, at);   // a full ring: the oldest is waited for
  CHECK(calls >= 1);
  calls = 0;
  CHECK(ring.drain().size() == 3);
  CHECK(calls >= 2);  // each entry in flight
  ring.push(4, at);
  ring.push(5, at);
  dead = true;
  CHECK_THROWS_WITH(ring.push(6, at), Catch::Contains("no step completed"));
  CHECK_THROWS_WITH(ring.drain(), Catch::Contains("no step completed"));
  dead = false;
  ring.set_wait_check({});  // none: the waits block as before
  calls = 0;
  const auto rest = ring.drain();
  CHECK(calls == 0);
  REQUIRE(rest.size() == 2);
  CHECK(rest[0].step == 4);
}

// The TCP ring's pinned staging (section 6.0 of docs/design/gpu-execution.md, rule 1): which
// event each bucket's device-to-host copy waits for. Stand-in events (ints, 0: none) on every
// build; the expected waits are worked out by hand from the ranges below.
TEST_CASE("pinned staging: each bucket's copy waits for the event of the range that completed it", "[device][staging]") {
  using waits_t = dtf::strategies::detail::bucket_waits<int>;
  // Three buckets tiling [0, 100) from the end down, as plan_buckets cuts them.
  waits_t w({{60, 100}, {30, 60}, {0, 30}});
  // Backprop from the top layer down: two layers complete bucket 0 (the second's event follows
  // the first's writes on the model's stream), one layer straddles buckets 1 and 2, and the
  // floats [0, 16) (the loss's slot) are never reported: bucket 2 waits for the step's event.
  w.note(80, 20, 1);
  CHECK_FALSE(w.at(0).reported);  // half of bucket 0
  w.note(60, 20, 2);
  w.note(40, 20, 3);
  w.note(25, 15, 4);
  w.note(16, 9, 5);
  CHECK(w.at(0).reported);
  CHECK(w.at(0).event == 2);
  CHECK(w.at(1).reported);
  CHECK(w.at(1).event == 4);
  CHECK_FALSE(w.at(2).reported);
  // A model that waited on the host reports no event: a completed bucket then waits for nothing.
  w.begin_step();
  CHECK_FALSE(w.at(0).reported);
  w.note(60, 40, 0);
  CHECK(w.at(0).reported);
  CHECK(w.at(0).event == 0);
  CHECK_FALSE(w.at(1).reported);
  // A range reported twice, or outside the buffer, is an error naming it.
  CHECK_THROWS_WITH(w.note(70, 5, 6), Catch::Contains("[70, 75) reported twice"));
  CHECK_THROWS_WITH(w.note(95, 10, 6), Catch::Contains("outside the buffer"));
}

TEST_CASE("a steady-state step of sequential, loss and optimizer allocates nothing", "[device][step]") {
  // Two hidden layers (Dense+ReLU fused, a plain ReLU after a Dense is not: both forms), the
  // fused loss with trusted labels, Adam; the step on a context, its loss left on the device.
  using namespace dtf;
  auto make_net = [] {
    nn::sequential net{nn::dense(6, 8), nn::relu(), nn::dense(8, 5), nn::relu(), nn::dense(5, 3)};
    net.set_label_check(nn::label_check::trusted);
    return net;
  };
  nn::sequential net = make_net(), reference = make_net();
  const std::size_t n = net.num_parameters();
  tensor params({n}), grads({n}), ref_params({n}), ref_grads({n});
  net.initialize(params.span<float>(), 7);
  reference.initialize(ref_params.span<float>(), 7);
  std::vector<float> xs(4 * 6);
  for (std::size_t i = 0; i < xs.size(); ++i) xs[i] = float(int(i * 37 % 11) - 5) / 4.0f;
  const std::vector<std::int32_t> ys{0, 2, 1, 2};
  const tensor x = tensor::from_host<float>({4, 6}, xs);
  const tensor y = tensor::from_host<std::int32_t>({4}, ys);

  device::context ctx;
  net.set_context(ctx);
  optim::optimizer<> opt(optim::adam{.learning_rate = 0.05f}, n), ref_opt(optim::adam{.learning_rate = 0.05f}, n);
#if DTF_CUDA
  opt.set_stream(ctx.compute_stream());
  // cuBLAS may pick its algorithms by the handle's workspace: the reference gets a context of its
  // own (the same handle settings), so that bit-for-bit equality is a fair demand.
  device::context ref_ctx;
  reference.set_context(ref_ctx);
  ref_opt.set_stream(ref_ctx.compute_stream());
#endif
  auto step = [&] {
    net.enqueue_loss_and_gradients(params.span<const float>(), x, y, grads.span<float>());
    opt.apply(params.span<float>(), grads.span<const float>());
  };
  // The reference: the same model without a context, its loss read per step (today's path).
  std::vector<float> ref_losses;
  auto ref_step = [&] {
    ref_losses.push_back(reference.loss_and_gradients(ref_params.span<const float>(), x, y, ref_grads.span<float>()));
    ref_opt.apply(ref_params.span<float>(), ref_grads.span<const float>());
  };
  auto read_loss = [&] {
    float v = 0;
#if DTF_CUDA
    ctx.synchronize();
    REQUIRE(cudaMemcpy(&v, net.device_loss(), sizeof v, cudaMemcpyDeviceToHost) == cudaSuccess);
#else
    v = *net.device_loss();
#endif
    return v;
  };

  step();  // the first step of this batch size: workspaces and the pool fill
  ref_step();
  CHECK(read_loss() == ref_losses.back());
  step();
  ref_step();
  const auto warm = ctx.pool().stats();
  constexpr int steady = 5;
#if DTF_CUDA
  for (int i = 0; i < steady; ++i) step();
  ctx.synchronize();
#else
  device_test::heap_allocations = 0;
  device_test::count_heap = true;
  ::operator delete(::operator new(4));  // the count sees an allocation (a direct call is never elided)
  const std::size_t probe = device_test::heap_allocations;
  for (int i = 0; i < steady; ++i) step();
  device_test::count_heap = false;
  CHECK(probe == 1);
  CHECK(device_test::heap_allocations - probe == 0);  // device memory is heap memory here: no tensor, shape or workspace allocated
#endif
  const auto after = ctx.pool().stats();
  CHECK(after.system_allocations == warm.system_allocations);
  CHECK(after.bytes_reserved == warm.bytes_reserved);
  for (int i = 0; i < steady; ++i) ref_step();
#if DTF_CUDA
  ref_ctx.synchronize();  // the reference's last update, before its parameters are read
#endif
  CHECK(read_loss() == ref_losses.back());
  CHECK(params.to_vector<float>() == ref_params.to_vector<float>());  // bit for bit: the same kernels, in order

#if DTF_CUDA
  // The steady step captured in a CUDA graph: capture fails on any call that allocates outside the
  // stream's pool, blocks the host or leaves the compute stream; each replay is one more step.
  cudaGraph_t graph{};
  cudaGraphExec_t exec{};
  REQUIRE(cudaStreamBeginCapture(ctx.compute_stream(), cudaStreamCaptureModeThreadLocal) == cudaSuccess);
  step();
  REQUIRE(cudaStreamEndCapture(ctx.compute_stream(), &graph) == cudaSuccess);
  REQUIRE(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
  const auto before_replay = ctx.pool().stats();
  for (int i = 0; i < 3; ++i) REQUIRE(cudaGraphLaunch(exec, ctx.compute_stream()) == cudaSuccess);
  ctx.synchronize();
  for (int i = 0; i < 3; ++i) ref_step();
  ref_ctx.synchronize();
  CHECK(ctx.pool().stats().system_allocations == before_replay.system_allocations);
  CHECK(read_loss() == ref_losses.back());
  CHECK(params.to_vector<float>() == ref_params.to_vector<float>());
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
#endif
}

TEST_CASE("step graphs: a key's first step eager, its second captured, later ones replayed, drops", "[device][graph]") {
  // The cache's policy (its CPU twin here: every segment's code runs, the phases and counts are
  // those a CUDA build keeps). A stand-in step of two segments on a counter: a segment's code
  // runs on the host except on a CUDA build's replays.
  using dtf::device::graph_counts;
  using phase = dtf::device::step_graphs::phase;
  dtf::device::step_graphs graphs(2);
  int full_x = 0, short_x = 0, other_x = 0, y = 0;  // stand-ins for the batches' addresses
  std::uint64_t generation = 1;
  int ran = 0;
  auto step = [&](std::size_t rows, const void* x) {
    const phase p = graphs.begin(rows, x, &y, generation);
    graphs.segment(0, {}, [&] { ++ran; });
    graphs.segment(1, {}, [&] { ++ran; });
    graphs.end(generation);
    CHECK(graphs.current_phase() == p);
    CHECK_FALSE(graphs.launched());  // CPU builds: never
    return p;
  };
  CHECK(step(32, &full_x) == phase::eager);
  CHECK(step(32, &full_x) == phase::capture);
  CHECK(step(32, &full_x) == phase::replay);
  CHECK(step(4, &short_x) == phase::eager);  // the short last batch: a key of its own
  CHECK(step(32, &full_x) == phase::replay);
  CHECK(step(4, &short_x) == phase::capture);
  CHECK(step(4, &short_x) == phase::replay);
  CHECK(graphs.captured_keys() == 2);
  CHECK(ran == 14);  // the twin ran every segment
  CHECK(graphs.counts(32) == graph_counts{.eager = 1, .captures = 1, .replays = 2});
  CHECK(graphs.counts(4) == graph_counts{.eager = 1, .captures = 1, .replays = 1});
  CHECK(graphs.counts(7) == graph_counts{});

  // The batch moved: that key starts again; the other keeps its graphs.
  CHECK(step(32, &other_x) == phase::eager);
  CHECK(step(4, &short_x) == phase::replay);
  CHECK(step(32, &other_x) == phase::capture);
  // The buffers' generation moved before a step: every graph goes.
  ++generation;
  CHECK(step(4, &short_x) == phase::eager);
  CHECK(step(32, &other_x) == phase::eager);
  CHECK(step(32, &other_x) == phase::capture);
  // An eager step that grew the buffers (the generation moves during it): the other keys' graphs
  // go; that key, which ran on the new buffers, captures next.
  CHECK(graphs.begin(4, &short_x, &y, generation) == phase::capture);
  graphs.segment(0, {}, [] {});
  graphs.segment(1, {}, [] {});
  graphs.end(generation);
  CHECK(graphs.begin(64, &other_x, &y, generation) == phase::eager);
  graphs.segment(0, {}, [] {});
  graphs.segment(1, {}, [] {});
  graphs.end(++generation);
  CHECK(graphs.captured_keys() == 0);
  CHECK(step(64, &other_x) == phase::capture);
  CHECK(step(4, &short_x) == phase::eager);
  // invalidate(): every key starts again.
  graphs.invalidate();
  CHECK(step(64, &other_x) == phase::eager);
  CHECK(graphs.captured_keys() == 0);

  // Segments out of order, a step ended early, a step of no segments: errors naming the cause.
  graphs.begin(64, &other_x, &y, generation);
  CHECK_THROWS_WITH(graphs.segment(1, {}, [] {}), Catch::Contains("segment 1 out of order"));
  graphs.segment(0, {}, [] {});
  CHECK_THROWS_WITH(graphs.end(generation), Catch::Contains("before its last segment"));
  CHECK_THROWS_WITH(dtf::device::step_graphs(0), Catch::Contains("at least one segment"));
}
