#include <catch2/catch.hpp>

#include <dtf/data.hpp>
#include <dtf/device/batch_upload.hpp>
#include <dtf/device/pinned_upload.hpp>
#include <dtf/flags.hpp>
#include <dtf/host.hpp>

#include <xtensor/xmath.hpp>

#include "helpers.hpp"

#include <zlib.h>

#include <cstring>
#include <fstream>
#include <set>

using namespace dtf;

namespace {

// IDX bytes: magic 00 00 <type> <ndims>, big-endian dims, then raw element bytes.
std::string idx_bytes(std::uint8_t type, const std::vector<std::uint32_t>& dims, const std::string& payload) {
  std::string s{'\0', '\0', char(type), char(dims.size())};
  for (auto d : dims) {
    s += char(d >> 24);
    s += char((d >> 16) & 0xff);
    s += char((d >> 8) & 0xff);
    s += char(d & 0xff);
  }
  return s + payload;
}

void write_raw(const std::filesystem::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary).write(bytes.data(), std::streamsize(bytes.size()));
}

void write_gz(const std::filesystem::path& p, const std::string& bytes) {
  gzFile f = gzopen(p.c_str(), "wb");
  REQUIRE(f);
  REQUIRE(gzwrite(f, bytes.data(), unsigned(bytes.size())) == int(bytes.size()));
  gzclose(f);
}

std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

std::string pixels(std::size_t n) {
  std::string s;
  for (std::size_t i = 0; i < n; ++i) s += char(i % 251);
  return s;
}

}  // namespace

TEST_CASE("IDX reader reads plain and gzip files alike", "[data][idx]") {
  test::temp_dir dir("idx");
  const auto bytes = idx_bytes(0x08, {3, 2, 2}, pixels(12));
  write_raw(dir / "a.idx", bytes);
  write_gz(dir / "a.idx.gz", bytes);
  for (const char* name : {"a.idx", "a.idx.gz"}) {
    const auto a = data::read_idx((dir / name).string());
    CHECK(a.type == data::idx_type::u8);
    CHECK(a.shape == std::vector<std::size_t>{3, 2, 2});
    CHECK(a.as<int>()[11] == 11);
  }
}

TEST_CASE("IDX reader converts big-endian multi-byte elements", "[data][idx]") {
  test::temp_dir dir("idx-be");
  // int32 {1, -2} and float32 {1.5}.
  write_gz(dir / "i.gz", idx_bytes(0x0C, {2}, std::string("\0\0\0\x01\xff\xff\xff\xfe", 8)));
  CHECK(data::read_idx((dir / "i.gz").string()).as<int>() == std::vector<int>{1, -2});
  write_raw(dir / "f", idx_bytes(0x0D, {1}, std::string("\x3f\xc0\0\0", 4)));
  CHECK(data::read_idx((dir / "f").string()).as<float>() == std::vector<float>{1.5f});
}

TEST_CASE("IDX reader names the file and the fault", "[data][idx][errors]") {
  test::temp_dir dir("idx-bad");
  const auto good = idx_bytes(0x08, {4, 3}, pixels(12));

  CHECK_THROWS_WITH(data::read_idx((dir / "missing.gz").string()),
                    Catch::Contains("missing.gz") && Catch::Contains("cannot open"));

  write_raw(dir / "magic", "\x12\x34\x08\x01" + good.substr(4));
  CHECK_THROWS_WITH(data::read_idx((dir / "magic").string()),
                    Catch::Contains("magic") && Catch::Contains("wrong magic number 0x12340801"));

  write_raw(dir / "type", idx_bytes(0x07, {1}, "x"));
  CHECK_THROWS_WITH(data::read_idx((dir / "type").string()), Catch::Contains("wrong magic number"));

  write_raw(dir / "short", good.substr(0, good.size() - 3));
  CHECK_THROWS_WITH(data::read_idx((dir / "short").string()),
                    Catch::Contains("short") && Catch::Contains("truncated") && Catch::Contains("elements"));

  write_raw(dir / "dims", good.substr(0, 6));
  CHECK_THROWS_WITH(data::read_idx((dir / "dims").string()), Catch::Contains("truncated") && Catch::Contains("dimensions"));

  write_raw(dir / "trailing", good + "zz");
  CHECK_THROWS_WITH(data::read_idx((dir / "trailing").string()), Catch::Contains("trailing bytes"));

  // A gzip file cut in half.
  write_gz(dir / "whole.gz", idx_bytes(0x08, {1000}, pixels(1000)));
  const auto gz = read_file(dir / "whole.gz");
  write_raw(dir / "cut.gz", gz.substr(0, gz.size() / 2));
  CHECK_THROWS_WITH(data::read_idx((dir / "cut.gz").string()), Catch::Contains("cut.gz"));
  CHECK_THROWS_AS(data::read_idx((dir / "cut.gz").string()), dtf::error);

  // A gzip file with its compressed bytes damaged.
  auto damaged = gz;
  for (std::size_t i = 20; i < 40 && i < damaged.size(); ++i) damaged[i] = char(damaged[i] ^ 0x5a);
  write_raw(dir / "damaged.gz", damaged);
  CHECK_THROWS_WITH(data::read_idx((dir / "damaged.gz").string()), Catch::Contains("damaged.gz"));
}

TEST_CASE("dataset from IDX checks that images and labels agree", "[data][errors]") {
  test::temp_dir dir("ds-bad");
  write_gz(dir / "img.gz", idx_bytes(0x08, {3, 2, 2}, pixels(12)));
  write_gz(dir / "lab.gz", idx_bytes(0x08, {2}, std::string("\x01\x02", 2)));
  CHECK_THROWS_WITH(data::dataset::from_idx((dir / "img.gz").string(), (dir / "lab.gz").string()),
                    Catch::Contains("2 labels for 3 images"));
}

namespace {
// 10 examples of 2 features: example i has features (i, 2i) and label i % 3.
data::dataset ten() {
  xt::xtensor<float, 2> x = xt::xtensor<float, 2>::from_shape({10, 2});
  xt::xtensor<std::int32_t, 1> y = xt::xtensor<std::int32_t, 1>::from_shape({10});
  for (std::size_t i = 0; i < 10; ++i) x(i, 0) = float(i), x(i, 1) = float(2 * i), y(i) = std::int32_t(i % 3);
  return data::dataset(std::move(x), std::move(y), 0.0f, 20.0f);
}

std::vector<std::vector<int>> collect(const data::dataset& d) {
  std::vector<std::vector<int>> out;
  auto s = d.stream();
  while (auto b = s.next()) {
    std::vector<int> ids;
    for (std::size_t r = 0; r < b->features.shape(0); ++r) ids.push_back(int(b->features(r, 0)));
    out.push_back(ids);
  }
  return out;
}
}  // namespace

TEST_CASE("batch keeps order and a smaller last batch unless dropped", "[data][pipeline]") {
  CHECK(collect(ten().batch(4)) == std::vector<std::vector<int>>{{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9}});
  CHECK(collect(ten().batch(4, true)) == std::vector<std::vector<int>>{{0, 1, 2, 3}, {4, 5, 6, 7}});
  CHECK(ten().batch(4).batches_per_epoch() == 3);
  CHECK_THROWS(ten().batch(0));
}

TEST_CASE("shard splits examples disjointly and completely", "[data][pipeline]") {
  std::multiset<int> all;
  for (std::size_t i = 0; i < 3; ++i) {
    auto batches = collect(ten().shard(3, i).batch(100));
    REQUIRE(batches.size() == 1);
    for (int v : batches[0]) {
      CHECK(std::size_t(v) % 3 == i);
      all.insert(v);
    }
  }
  CHECK(all == std::multiset<int>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
  CHECK_THROWS_WITH(ten().shard(3, 3), Catch::Contains("index=3"));
}

TEST_CASE("shuffle is a seeded permutation that changes every epoch", "[data][pipeline]") {
  auto a = collect(ten().shuffle(5).batch(10).repeat(2));
  auto b = collect(ten().shuffle(5).batch(10).repeat(2));
  auto c = collect(ten().shuffle(6).batch(10).repeat(2));
  REQUIRE(a.size() == 2);
  CHECK(a == b);
  CHECK(a != c);
  CHECK(a[0] != a[1]);
  for (auto& epoch : a) {
    std::sort(epoch.begin(), epoch.end());
    CHECK(epoch == std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
  }
}

TEST_CASE("repeat counts epochs and labels follow their features", "[data][pipeline]") {
  auto s = ten().batch(3).repeat(3).stream();
  std::size_t batches = 0, last_epoch = 0;
  while (auto b = s.next()) {
    ++batches;
    last_epoch = b->epoch;
    for (std::size_t r = 0; r < b->labels.size(); ++r) CHECK(b->labels(r) == int(b->features(r, 0)) % 3);
  }
  CHECK(batches == 12);
  CHECK(last_epoch == 2);
  // Endless repetition keeps going.
  auto forever = ten().batch(10).repeat().stream();
  for (int i = 0; i < 25; ++i) REQUIRE(forever.next().has_value());
}

TEST_CASE("normalize maps the value range to [0, 1]", "[data][pipeline]") {
  auto s = ten().normalize().batch(10).stream();
  auto b = s.next();
  REQUIRE(b);
  CHECK(b->features(9, 1) == Catch::Detail::Approx(18.0 / 20.0));
  CHECK(b->features(0, 0) == 0.0f);
}

TEST_CASE("prefetch yields the same batches as the synchronous pipeline", "[data][pipeline]") {
  const auto plain = ten().shuffle(1).batch(3).repeat(4);
  CHECK(collect(plain.prefetch(2)) == collect(plain));
  // Destroying a stream while its producer is ahead stops and joins the producer.
  {
    auto s = plain.repeat().prefetch(2).stream();
    REQUIRE(s.next());
  }
  CHECK(ten().take(4).size() == 4);
}

TEST_CASE("Fashion-MNIST from the Debian package: counts, shape, labels", "[data][fashion-mnist]") {
  const auto train = data::load_fashion_mnist(data::split::train, test::fashion_mnist_dir());
  const auto test = data::load_fashion_mnist(data::split::test, test::fashion_mnist_dir());
  CHECK(train.size() == 60000);
  CHECK(test.size() == 10000);
  CHECK(train.num_features() == 784);
  std::vector<int> counts(10, 0);
  for (std::size_t i = 0; i < test.size(); ++i) {
    const int l = test.label(i);
    REQUIRE(l >= 0);
    REQUIRE(l < 10);
    ++counts[std::size_t(l)];
  }
  for (int c : counts) CHECK(c == 1000);  // the test split is balanced
  auto s = test.normalize().batch(256).stream();
  auto b = s.next();
  REQUIRE(b);
  const float hi = xt::amax(b->features)(), lo = xt::amin(b->features)();
  CHECK(hi <= 1.0f);
  CHECK(lo >= 0.0f);
  CHECK(hi > 0.9f);
  CHECK_THROWS_WITH(data::load_fashion_mnist(data::split::train, "/nonexistent"),
                    Catch::Contains("/nonexistent/train-images-idx3-ubyte.gz") &&
                        Catch::Contains("dataset-fashion-mnist"));
}

TEST_CASE("flags parse values, reject unknown flags and bad values", "[flags]") {
  int epochs = 5;
  float lr = 0.1f;
  bool verbose = false;
  std::string name = "x";
  dtf::flag_parser f("test");
  f.add("epochs", epochs, "").add("lr", lr, "").add("verbose", verbose, "").add("name", name, "");
  const char* argv[] = {"prog", "--epochs", "7", "--lr=0.5", "--verbose", "--name", "abc", "pos"};
  CHECK(f.parse(8, argv));
  CHECK(epochs == 7);
  CHECK(lr == 0.5f);
  CHECK(verbose);
  CHECK(name == "abc");
  CHECK(f.positional() == std::vector<std::string>{"pos"});
  const char* unknown[] = {"prog", "--epoch", "3"};
  CHECK_THROWS_WITH(f.parse(3, unknown), Catch::Contains("unknown flag --epoch"));
  const char* bad[] = {"prog", "--epochs", "3x"};
  CHECK_THROWS_WITH(f.parse(3, bad), Catch::Contains("--epochs") && Catch::Contains("3x"));
  const char* missing[] = {"prog", "--lr"};
  CHECK_THROWS_WITH(f.parse(2, missing), Catch::Contains("--lr needs a value"));
}

TEST_CASE("IDX bytes stay bytes, and a shard keeps only its examples and normalises per batch", "[data][pipeline]") {
  // 50 images of 3x2 pixels (pixel j of image i is (7i + 13j) mod 256) and labels i % 10.
  test::temp_dir dir("ds-bytes");
  std::string img, lab;
  for (int i = 0; i < 50; ++i) {
    for (int j = 0; j < 6; ++j) img.push_back(char((7 * i + 13 * j) % 256));
    lab.push_back(char(i % 10));
  }
  write_gz(dir / "img.gz", idx_bytes(0x08, {50, 3, 2}, img));
  write_gz(dir / "lab.gz", idx_bytes(0x08, {50}, lab));
  const auto all = data::dataset::from_idx((dir / "img.gz").string(), (dir / "lab.gz").string());
  CHECK(all.num_features() == 6);
  CHECK(all.memory_bytes() == 50 * 6 + 50 * sizeof(std::int32_t));  // the file's bytes, not float32

  // Shard 1 of 3 after take(40): examples 1, 4, ..., 37 (13 of them), held alone.
  const auto shard = all.take(40).shard(3, 1);
  REQUIRE(shard.size() == 13);
  CHECK(shard.memory_bytes() == 13 * 6 + 13 * sizeof(std::int32_t));
  // The same shuffle of the shard, batched, equals the reference built from the raw pixels
  // with the same seeded permutation of the selected example numbers.
  std::vector<int> order;
  for (int i = 1; i < 40; i += 3) order.push_back(i);
  const std::uint64_t seed = 11;
  nn::splitmix64 rng(seed + 0x9E3779B97F4A7C15ull * 1);
  for (std::size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[rng() % i]);
  auto s = shard.shuffle(seed).normalize().batch(5).stream();
  std::size_t row = 0;
  while (auto b = s.next()) {
    for (std::size_t r = 0; r < b->labels.shape(0); ++r, ++row) {
      const int e = order.at(row);
      CHECK(b->labels(r) == e % 10);
      for (std::size_t j = 0; j < 6; ++j) CHECK(b->features(r, j) == Catch::Detail::Approx(float((7 * e + 13 * int(j)) % 256) / 255.0f).epsilon(1e-6));
    }
  }
  CHECK(row == 13);
}

namespace device_shard_test {
// Every batch of `d` (all its epochs) from the host stream and from a device_shard, compared bit
// for bit: features, labels and shapes.
void compare_with_stream(const data::dataset& d, std::size_t epochs, std::size_t classes) {
  data::device_shard shard(d, classes);
  tensor x, y;
  std::size_t batches = 0;
  auto s = d.stream();
  while (auto b = s.next()) {
    INFO("epoch " << b->epoch << " batch " << b->index);
    shard.gather(b->epoch, b->index, x, y);
    REQUIRE(x.shape() == dims{b->features.shape(0), b->features.shape(1)});
    REQUIRE(y.shape() == dims{b->labels.shape(0)});
    const auto xs = x.to_vector<float>();
    const auto ys = y.to_vector<std::int32_t>();
    CHECK(std::memcmp(xs.data(), b->features.data(), xs.size() * sizeof(float)) == 0);
    CHECK(std::equal(ys.begin(), ys.end(), b->labels.begin()));
    ++batches;
  }
  CHECK(batches == d.batches_per_epoch() * epochs);
}
}  // namespace device_shard_test

TEST_CASE("a shard gathered on the device equals the host stream's batches bit for bit", "[data][device]") {
  // Fashion-MNIST's bytes: a shard of a subset, shuffled and normalised, a partial last batch,
  // two epochs (two permutations).
  const auto fm = data::load_fashion_mnist(data::split::train, test::fashion_mnist_dir());
  device_shard_test::compare_with_stream(fm.take(1000).shard(3, 1).shuffle(7).normalize().batch(64).repeat(2), 2, 10);
  // float32 rows, unshuffled and not normalised, after take() of an unsharded set.
  device_shard_test::compare_with_stream(ten().take(7).batch(3).repeat(2), 2, 0);
  // Random access: a batch of a later epoch first, then an earlier one (a resumed position).
  const auto d = fm.take(300).shuffle(3).normalize().batch(50).repeat(3);
  data::device_shard shard(d, 10);
  tensor x, y;
  std::vector<std::vector<float>> want;
  for (auto s = d.stream(data::position{2, 4}); auto b = s.next();)
    want.emplace_back(b->features.begin(), b->features.end());
  REQUIRE(want.size() == 2);
  shard.gather(2, 5, x, y);
  CHECK(x.to_vector<float>() == want[1]);
  shard.gather(2, 4, x, y);
  CHECK(x.to_vector<float>() == want[0]);
  shard.gather(0, 0, x, y);
  CHECK(x.to_vector<float>() != want[0]);
  // Positions outside the dataset are errors naming them.
  CHECK_THROWS_WITH(shard.gather(0, 6, x, y), Catch::Contains("batch 6 is not one of the 6 of an epoch"));
  CHECK_THROWS_WITH(shard.gather(3, 0, x, y), Catch::Contains("epoch 3 is past the dataset's 3"));
}

TEST_CASE("a device shard's epoch orders go through one upload buffer, allocated once", "[data][device]") {
  // Three epochs uploaded in turn (each a different permutation) and one revisited: the buffer
  // is the one allocated for an epoch's order, and each upload lands whole.
  device::pinned_upload up(7 * sizeof(std::uint32_t));
  thrust::device_vector<std::uint32_t> dst(7);
  const auto d = ten().take(7).shuffle(11).batch(3).repeat(3);
  for (const std::size_t epoch : {0, 1, 2, 0}) {
    const auto order = d.epoch_order(epoch);
    up.upload(thrust::raw_pointer_cast(dst.data()), order.data(), order.size() * sizeof(std::uint32_t), {});
    std::vector<std::uint32_t> got(dst.size());
    thrust::copy(dst.begin(), dst.end(), got.begin());  // the legacy stream: after the upload's copy
    CHECK(got == order);
  }
  CHECK(d.epoch_order(0) != d.epoch_order(1));
  CHECK(up.allocations() == 1);
  CHECK(up.capacity() == 7 * sizeof(std::uint32_t));
  // A larger upload grows it once; an empty one copies nothing.
  const std::vector<std::uint32_t> more{9, 8, 7, 6, 5, 4, 3, 2};
  thrust::device_vector<std::uint32_t> big(8);
  up.upload(thrust::raw_pointer_cast(big.data()), more.data(), more.size() * sizeof(std::uint32_t), {});
  up.upload(thrust::raw_pointer_cast(big.data()), more.data(), 0, {});
  std::vector<std::uint32_t> got(8);
  thrust::copy(big.begin(), big.end(), got.begin());
  CHECK(got == more);
  CHECK(up.allocations() == 2);
}

namespace {
// The bytes of a tensor of T (copy_to_host checks the dtype).
template <class T>
std::vector<std::byte> bytes_of(const tensor& t) {
  std::vector<T> v(t.size());
  t.copy_to_host<T>(std::span<T>(v));
  std::vector<std::byte> out(v.size() * sizeof(T));
  if (!out.empty()) std::memcpy(out.data(), v.data(), out.size());
  return out;
}
}  // namespace

TEST_CASE("host batches go to the device through pinned slots, as assign_from_host copies them", "[data][device]") {
  // Ten examples in batches of 4, 4, 2 over two epochs (the short last batch and the full batch
  // after it change the tensors' bytes), then batches of 10 (larger than every slot), then one
  // of 4 again. Each upload equals assign_from_host's tensors, bit for bit.
  device::batch_upload up(3);
  CHECK(up.slots() == 3);
  tensor x, y, rx, ry;
  std::size_t settles = 0;
  auto check_with = [&](device::batch_upload& u, const auto& features, const auto& labels) {
    u.upload(x, features, y, labels, {}, [&] { ++settles; });
    assign_from_host(rx, features);
    assign_from_host(ry, labels);
    CHECK(x.shape() == rx.shape());
    CHECK(y.shape() == ry.shape());
    CHECK(x.type() == dtype::float32);
    CHECK(y.type() == dtype::int32);
    CHECK(bytes_of<float>(x) == bytes_of<float>(rx));  // the legacy stream's copies: after the upload's
    CHECK(bytes_of<std::int32_t>(y) == bytes_of<std::int32_t>(ry));
  };
  auto check_one = [&](const auto& features, const auto& labels) { check_with(up, features, labels); };
  auto s = ten().shuffle(5).batch(4).repeat(2).stream();
  // Slots 0, 1, 2 allocated when first used; only the empty tensors' growth calls settle (the
  // 2-row batches and the 4-row batches after them reshape the tensors within their allocations).
  const std::uint64_t allocs[] = {1, 2, 3, 3, 3, 3}, settled[] = {1, 1, 1, 1, 1, 1};
  for (std::size_t i = 0; i < 6; ++i) {
    const auto b = s.next();
    REQUIRE(b);
    CHECK(b->labels.size() == (i % 3 == 2 ? 2u : 4u));
    check_one(b->features, b->labels);
    CHECK(up.allocations() == allocs[i]);
    CHECK(up.settles() == settled[i]);
    CHECK(up.next_slot() == (i + 1) % 3);
  }
  CHECK(!s.next());
  // A larger batch grows each slot once, as it comes to it, and the tensors once.
  const auto big = ten().shuffle(7).batch(10).stream().next();
  REQUIRE(big);
  for (std::size_t i = 0; i < 3; ++i) check_one(big->features, big->labels);
  CHECK(up.allocations() == 6);
  CHECK(up.settles() == 2);
  // Back to 4 rows, and the same bytes under another shape: no allocation, no settle.
  const auto four = ten().batch(4).stream().next();
  REQUIRE(four);
  check_one(four->features, four->labels);
  xt::xtensor<float, 2> wide = xt::xtensor<float, 2>::from_shape({2, 4});
  std::copy(four->features.begin(), four->features.end(), wide.begin());
  check_one(wide, four->labels);
  CHECK(x.shape() == dims{2, 4});
  CHECK(up.allocations() == 6);
  CHECK(up.settles() == 2);
  CHECK(settles == up.settles());
  if constexpr (device_memory_is_host_accessible) CHECK(up.waits() == 0);  // CPU: every copy completed
  CHECK_THROWS_WITH(device::batch_upload(0), Catch::Contains("zero slots"));
  // A moved-to instance keeps the slots and the counters.
  device::batch_upload moved(std::move(up));
  CHECK(moved.allocations() == 6);
  check_with(moved, four->features, four->labels);
  CHECK(moved.allocations() == 6);
  CHECK_THROWS_WITH(up.upload(x, four->features, y, four->labels, {}, [] {}), Catch::Contains("moved-from"));  // NOLINT(bugprone-use-after-move)
}

TEST_CASE("a device shard checks its labels once, at upload", "[data][device][errors]") {
  // ten()'s labels are i % 3: with 2 classes, example 2 is the first out of range.
  CHECK_THROWS_WITH(data::device_shard(ten(), 2), Catch::Contains("example 2 has label 2, not in [0, 2)"));
  CHECK_NOTHROW(data::device_shard(ten(), 3));
}
