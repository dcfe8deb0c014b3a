// The collective test suite on dtf's MPI backend, run by every rank under mpirun:
//   mpirun -n 3 dtf_mpi_tests
// Every rank runs the same test cases in the same (declaration) order, so their collectives
// meet. Results are compared with the exact reference every rank computes for itself from
// the rank-indexed inputs (integers small enough for float sums to be exact).
#include <dtf/collectives.hpp>
#include <dtf/collectives/backends/mpi.hpp>

#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace {

using dtf::mpi_backend;
using dtf::mpi_communicator;
using dtf::reduce_op;

std::size_t world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return std::size_t(r);
}
std::size_t world_size() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return std::size_t(n);
}

mpi_communicator make(std::uint32_t timeout_ms = 20000) {
  return mpi_communicator(mpi_backend(MPI_COMM_WORLD, {.timeout_ms = timeout_ms}));
}

// Rank r's element i: small integers, so every float and double sum is exact.
template <class T>
T input(std::size_t r, std::size_t i) {
  if constexpr (std::is_same_v<T, std::uint8_t>) return T((r + i) % 7);
  else if constexpr (std::is_signed_v<T>) return T(int((i * 7 + r * 3) % 29) - 11 + int(r));
  else return T((i * 7 + r * 3) % 29);
}

template <class T>
std::vector<T> expected(std::size_t count, std::size_t n, reduce_op op) {
  std::vector<T> out(count);
  for (std::size_t i = 0; i < count; ++i) {
    T acc = input<T>(0, i);
    for (std::size_t r = 1; r < n; ++r) {
      const T v = input<T>(r, i);
      if (op == reduce_op::sum || op == reduce_op::average) acc = T(acc + v);
      else if (op == reduce_op::min) acc = v < acc ? v : acc;
      else acc = v > acc ? v : acc;
    }
    if (op == reduce_op::average) acc = T(acc / T(n));
    out[i] = acc;
  }
  return out;
}

template <class T>
void check_allreduce(mpi_communicator& comm, std::size_t count, reduce_op op) {
  std::vector<T> data(count);
  for (std::size_t i = 0; i < count; ++i) data[i] = input<T>(comm.rank(), i);
  comm.allreduce("t" + std::to_string(count), std::span<T>(data), op);
  const auto want = expected<T>(count, comm.size(), op);
  REQUIRE(data == want);
}

template <class T>
void check_all_ops(mpi_communicator& comm) {
  for (const std::size_t count : {std::size_t(0), std::size_t(1), std::size_t(7), std::size_t(1000),
                                  std::size_t(100003)})
    for (const auto op : {reduce_op::sum, reduce_op::average, reduce_op::min, reduce_op::max}) {
      INFO("count " << count << ", op " << dtf::name_of(op));
      check_allreduce<T>(comm, count, op);
    }
}

// Runs `body` (a collective that must be refused on every rank), and checks the error.
template <class F>
void expect_mismatch(F&& body, const std::vector<std::string>& needles) {
  try {
    body();
    FAIL("a mismatched collective completed on rank " << world_rank());
  } catch (const dtf::error& e) {
    INFO(e.message());
    CHECK(e.code() == dtf::make_error_code(dtf::errc::invalid_argument));
    CHECK(e.message().find("mismatched collective") != std::string::npos);
    for (const auto& n : needles) CHECK(e.message().find(n) != std::string::npos);
  }
}

}  // namespace

TEST_CASE("mpi backend: allreduce of every dtype and op equals the exact reference", "[mpi]") {
  auto comm = make();
  REQUIRE(comm.rank() == world_rank());
  REQUIRE(comm.size() == world_size());
  check_all_ops<float>(comm);
  check_all_ops<double>(comm);
  check_all_ops<std::int32_t>(comm);
  check_all_ops<std::int64_t>(comm);
  check_all_ops<std::uint8_t>(comm);
  CHECK(comm.sequence() == 5 * 5 * 4);
}

TEST_CASE("mpi backend: broadcast from every root gives root's values everywhere", "[mpi]") {
  auto comm = make();
  for (std::size_t root = 0; root < comm.size(); ++root) {
    std::vector<double> data(4099);
    for (std::size_t i = 0; i < data.size(); ++i) data[i] = input<double>(comm.rank(), i);
    comm.broadcast("b", std::span<double>(data), root);
    for (std::size_t i = 0; i < data.size(); ++i) REQUIRE(data[i] == input<double>(root, i));
  }
}

TEST_CASE("mpi backend: allgather places rank k's block at k", "[mpi]") {
  auto comm = make();
  const std::size_t block = 513;
  std::vector<std::int64_t> in(block), out(block * comm.size());
  for (std::size_t i = 0; i < block; ++i) in[i] = input<std::int64_t>(comm.rank(), i);
  comm.allgather("g", std::span<const std::int64_t>(in), std::span<std::int64_t>(out));
  for (std::size_t r = 0; r < comm.size(); ++r)
    for (std::size_t i = 0; i < block; ++i) REQUIRE(out[r * block + i] == input<std::int64_t>(r, i));
  std::vector<std::int64_t> wrong(block);
  if (comm.size() > 1)
    CHECK_THROWS_AS(comm.allgather("g", std::span<const std::int64_t>(in), std::span<std::int64_t>(wrong)),
                    dtf::error);
}

TEST_CASE("mpi backend: tensors, fused lists and barriers", "[mpi]") {
  auto comm = make();
  const std::size_t n = comm.size(), r = comm.rank();
  std::vector<float> a_in(300), b_in(17);
  for (std::size_t i = 0; i < a_in.size(); ++i) a_in[i] = input<float>(r, i);
  for (std::size_t i = 0; i < b_in.size(); ++i) b_in[i] = input<float>(r, i);
  auto a = dtf::tensor::from_host<float>({10, 30}, a_in);
  auto b = dtf::tensor::from_host<float>({17}, b_in);
  std::vector<dtf::named_tensor> list{{"a", &a}, {"b", &b}};
  comm.allreduce(std::span<const dtf::named_tensor>(list), reduce_op::average);
  CHECK(a.to_vector<float>() == expected<float>(300, n, reduce_op::average));
  CHECK(b.to_vector<float>() == expected<float>(17, n, reduce_op::average));
  comm.broadcast("a", a, n - 1);
  std::vector<float> last(300);
  for (std::size_t i = 0; i < last.size(); ++i) last[i] = expected<float>(300, n, reduce_op::average)[i];
  CHECK(a.to_vector<float>() == last);
  const auto before = comm.sequence();
  comm.barrier();
  comm.barrier();
  CHECK(comm.sequence() == before + 2);
}

TEST_CASE("mpi backend: a mismatched name, count, dtype or op fails every rank naming the rank and tensor",
          "[mpi]") {
  const std::size_t n = world_size(), r = world_rank();
  if (n < 2) return;
  const std::size_t odd = n - 1;  // the rank that differs
  // Every rank names the first rank whose descriptor differs from its own: the odd rank sees
  // rank 0, every other rank sees the odd one.
  const std::string other = r == odd ? "rank 0 (MPI)" : "rank " + std::to_string(odd) + " (MPI)";
  {
    auto comm = make();
    std::vector<float> v(10, 1.0f);
    expect_mismatch([&] { comm.allreduce(r == odd ? "gradz" : "grads", std::span<float>(v)); },
                    {other, "'grads'", "'gradz'"});
    // Broken afterwards, on every rank alike.
    try {
      comm.allreduce("grads", std::span<float>(v));
      FAIL("a broken communicator served a collective");
    } catch (const dtf::error& e) {
      CHECK(e.code() == dtf::make_error_code(dtf::errc::peer_failure));
    }
  }
  {
    auto comm = make();
    std::vector<float> v(r == odd ? 11 : 10, 1.0f);
    expect_mismatch([&] { comm.allreduce("w", std::span<float>(v)); }, {other, "'w'", "11 float32"});
  }
  {
    auto comm = make();
    std::vector<double> d(10, 1.0);
    std::vector<float> f(10, 1.0f);
    expect_mismatch(
        [&] {
          if (r == odd) comm.allreduce("w", std::span<double>(d));
          else comm.allreduce("w", std::span<float>(f));
        },
        {other, "dtype"});
  }
  {
    auto comm = make();
    std::vector<float> v(10, 1.0f);
    expect_mismatch([&] { comm.allreduce("w", std::span<float>(v), r == odd ? reduce_op::max : reduce_op::sum); },
                    {other, "op "});
  }
  {
    auto comm = make();
    std::vector<float> v(10, 1.0f);
    expect_mismatch(
        [&] {
          if (r == odd) comm.broadcast("w", std::span<float>(v), 0);
          else comm.allreduce("w", std::span<float>(v));
        },
        {other, "broadcast"});
  }
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  const int rc = Catch::Session().run(argc, argv);
  // Every rank's result reaches mpirun through its exit status; the worst one wins.
  int worst = 0;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return worst;
}
template class dtf::basic_communicator<dtf::mpi_backend>;
