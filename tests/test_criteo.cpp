// The Criteo TSV reader, the synthetic logs with their planted model, and the binary metrics
// (AUC against a pair count, log loss against a hand computation).
#include <catch2/catch.hpp>

#include <dtf/data/criteo.hpp>
#include <dtf/data/criteo_synthetic.hpp>
#include <dtf/metrics/binary.hpp>
#include <dtf/metrics/binary_eval.hpp>
#include <dtf/nn/embedding_sequential.hpp>
#include <dtf/nn/sequential.hpp>

#include "helpers.hpp"
#include "../examples/recommender/model.hpp"

#include <zlib.h>

#include <cmath>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

namespace criteo_tests {

namespace data = dtf::data;
namespace metrics = dtf::metrics;

// A well-formed line: label, 13 integers, 26 categorical values, all present.
std::string good_line(int label = 1) {
  std::string s = std::to_string(label);
  for (int j = 0; j < 13; ++j) s += "\t" + std::to_string(j * 7);
  for (int c = 0; c < 26; ++c) s += "\t" + std::string(c % 2 ? "68fd1e64" : "05db9164");
  return s;
}

// The line with field `field` (0-based) replaced by `text`.
std::string with_field(std::size_t field, const std::string& text) {
  std::vector<std::string> f;
  std::string line = good_line(), cur;
  for (char ch : line) {
    if (ch == '\t') {
      f.push_back(cur);
      cur.clear();
    } else {
      cur += ch;
    }
  }
  f.push_back(cur);
  f.at(field) = text;
  std::string out;
  for (std::size_t i = 0; i < f.size(); ++i) out += (i ? "\t" : "") + f[i];
  return out;
}

void write_raw(const std::filesystem::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary) << bytes;
}

// The AUC as the fraction of positive-negative pairs ordered right, ties counting half: O(n^2).
double pair_count_auc(const std::vector<float>& s, const std::vector<int>& y) {
  double right = 0, pairs = 0;
  for (std::size_t i = 0; i < s.size(); ++i)
    for (std::size_t j = 0; j < s.size(); ++j)
      if (y[i] == 1 && y[j] == 0) {
        pairs += 1;
        right += s[i] > s[j] ? 1.0 : s[i] == s[j] ? 0.5 : 0.0;
      }
  return right / pairs;
}

TEST_CASE("AUC equals the pair count, ties counting half, whole or by batches", "[criteo][metrics]") {
  std::mt19937 gen(43);
  for (int trial = 0; trial < 6; ++trial) {
    const std::size_t n = 300 + 50 * trial;
    const int levels = 3 + 4 * trial;  // few score levels: many ties
    std::uniform_int_distribution<int> level(0, levels - 1), coin(0, 1);
    std::vector<float> s(n);
    std::vector<int> y(n);
    for (std::size_t i = 0; i < n; ++i) {
      y[i] = coin(gen);
      s[i] = float(level(gen) + y[i]) / float(levels);  // informative, with ties across classes
    }
    const double expected = pair_count_auc(s, y);
    CHECK(metrics::auc(s, y) == Approx(expected).margin(1e-12));
    metrics::binary_accumulator acc;
    for (std::size_t at = 0, step = 1; at < n; at += step, step = step * 2 + 1) {
      const std::size_t len = std::min(step, n - at);
      acc.add(std::span<const float>(s).subspan(at, len), std::span<const int>(y).subspan(at, len));
    }
    const auto m = acc.result();
    CHECK(m.examples == n);
    CHECK(m.auc == Approx(expected).margin(1e-12));
    CHECK(m.log_loss == Approx(metrics::log_loss(s, y)).epsilon(1e-12));
  }
  // Degenerate cases: constant scores are 0.5; one class alone leaves AUC undefined.
  CHECK(metrics::auc(std::vector<float>{0.3f, 0.3f, 0.3f}, std::vector<int>{1, 0, 1}) == 0.5);
  CHECK(metrics::auc(std::vector<float>{0.1f, 0.9f}, std::vector<float>{0.0f, 1.0f}) == 1.0);
  metrics::binary_accumulator acc;
  acc.add(std::vector<float>{0.2f, 0.4f}, std::vector<int>{1, 1});
  CHECK_FALSE(acc.result().auc_defined());
}

TEST_CASE("log loss matches a hand computation, clipped", "[criteo][metrics]") {
  // -(ln 0.9 + ln 0.8 + ln 0.4 + ln 1e-7) / 4 = (0.1053605 + 0.2231436 + 0.9162907 + 16.1180957) / 4
  const std::vector<float> p{0.9f, 0.2f, 0.6f, 0.0f};
  const std::vector<int> y{1, 0, 0, 1};
  CHECK(metrics::log_loss(p, y) == Approx(4.3407226).epsilon(1e-6));
  // eps = 0.25 clips 0.9 to 0.75, 0.2 to 0.25 and 0 to 0.25: (ln 4/3 + ln 4/3 + ln 2.5 + ln 4) / 4.
  CHECK(metrics::log_loss(p, y, 0.25) == Approx((0.2876821 + 0.2876821 + 0.9162907 + 1.3862944) / 4).epsilon(1e-6));
  CHECK(metrics::log_loss(std::vector<float>{1.0f}, std::vector<int>{1}) == Approx(1e-7).epsilon(1e-3));
}

TEST_CASE("binary metrics refuse bad input naming the index", "[criteo][metrics][errors]") {
  using Catch::Contains;
  CHECK_THROWS_WITH(metrics::auc(std::vector<float>{0.1f, 0.2f}, std::vector<int>{0, 2}),
                    Contains("label 2") && Contains("index 1"));
  CHECK_THROWS_WITH(metrics::auc(std::vector<float>{0.1f, NAN}, std::vector<int>{0, 1}),
                    Contains("index 1") && Contains("not finite"));
  CHECK_THROWS_WITH(metrics::log_loss(std::vector<float>{1.5f}, std::vector<int>{1}),
                    Contains("index 0") && Contains("probability"));
  CHECK_THROWS_WITH(metrics::auc(std::vector<float>{0.1f}, std::vector<int>{0, 1}), Contains("1 scores but 2 labels"));
  metrics::binary_accumulator acc;
  acc.add(std::vector<float>{0.2f}, std::vector<int>{1});
  CHECK_THROWS(acc.add(std::vector<float>{0.2f, 0.3f, 7.0f}, std::vector<int>{0, 1, 1}));
  CHECK(acc.size() == 1);  // the bad batch added nothing
}

TEST_CASE("Criteo reader: fields, missing values, hashing, CRLF and a last line without newline",
          "[criteo][data]") {
  dtf::test::temp_dir dir("criteo-fields");
  std::string missing = "0";
  for (int j = 0; j < 13; ++j) missing += j == 0 ? "\t-2" : j == 1 ? "\t3" : "\t";
  for (int c = 0; c < 26; ++c) missing += c == 25 ? "\tABCDEF01" : "\t";
  write_raw(dir / "a.tsv", good_line() + "\r\n" + missing);
  const auto cols = data::read_criteo((dir / "a.tsv").string());
  REQUIRE(cols.size() == 2);
  CHECK(cols.labels == std::vector<float>{1.0f, 0.0f});
  for (int j = 0; j < 13; ++j) CHECK(cols.dense[j] == float(std::log1p(double(j * 7))));
  CHECK(cols.ids[0] == data::criteo_id(0, "05db9164"));
  CHECK(cols.ids[1] == data::criteo_id(1, "68fd1e64"));
  CHECK(data::criteo_id(0, "68fd1e64") != data::criteo_id(1, "68fd1e64"));  // salted by the column
  // The second line: -2 (a code) and missing are 0; 3 is log 4; missing ids are the reserved id.
  CHECK(cols.dense[13 + 0] == 0.0f);
  CHECK(cols.dense[13 + 1] == float(std::log1p(3.0)));
  for (int j = 2; j < 13; ++j) CHECK(cols.dense[13 + j] == 0.0f);
  for (int c = 0; c < 25; ++c) CHECK(cols.ids[26 + c] == data::criteo_missing_id);
  CHECK(cols.ids[26 + 25] == data::criteo_id(25, "ABCDEF01"));
  CHECK(cols.skipped == 0);
}

TEST_CASE("Criteo reader refuses malformed lines naming file, line and column", "[criteo][data][errors]") {
  using Catch::Contains;
  dtf::test::temp_dir dir("criteo-bad");
  const std::string g = good_line();
  std::string garbage("\x00\xff\x01\x7f", 4);
  for (int i = 0; i < 100; ++i) garbage += char(i * 37 + 11) == '\n' ? '\x80' : char(i * 37 + 11);  // one line
  struct bad_case {
    std::string line, where, why;
  };
  const std::vector<bad_case> cases{
      {g.substr(0, g.rfind('\t')), "line 2, column 40 (C26)", "39 tab-separated fields, expected 40"},
      {g + "\t05db9164", "line 2, column 41 (past C26)", "41 tab-separated fields"},
      {with_field(3, "12a"), "line 2, column 4 (I3)", "not an integer: '12a'"},
      {with_field(5, "99999999999999999999"), "line 2, column 6 (I5)", "outside 64 bits"},
      {with_field(18, "zz12"), "line 2, column 19 (C5)", "not a hexadecimal categorical value: 'zz12'"},
      {with_field(40 - 1, "0123456789abcdef0"), "line 2, column 40 (C26)", "longer than 16 hex digits"},
      {with_field(0, "2"), "line 2, column 1 (label)", "the label is not 0 or 1: '2'"},
      {with_field(0, ""), "line 2, column 1 (label)", "the label is not 0 or 1"},
      {garbage, "line 2, column 2 (I1)", "1 tab-separated fields"},
      {std::string(5000, '7'), "line 2:", "longer than 4096 bytes"},
  };
  for (std::size_t k = 0; k < cases.size(); ++k) {
    const auto name = "bad" + std::to_string(k) + ".tsv";
    write_raw(dir / name, g + "\n" + cases[k].line + "\n" + g + "\n");
    INFO("case " << k);
    CHECK_THROWS_WITH(data::read_criteo((dir / name).string(), {.max_line_bytes = 4096}),
                      Contains(name) && Contains(cases[k].where) && Contains(cases[k].why));
  }
  // With skip_malformed every bad line is counted and the good ones kept, in order; a line of a
  // megabyte without a newline until its end is skipped to its newline, not held.
  std::string mixed = g + "\n";
  for (const auto& c : cases) mixed += c.line + "\n" + with_field(0, "0") + "\n";
  mixed += std::string(1 << 20, 'x') + "\n" + g;
  write_raw(dir / "mixed.tsv", mixed);
  const auto cols = data::read_criteo((dir / "mixed.tsv").string(), {.skip_malformed = true, .max_line_bytes = 4096});
  CHECK(cols.skipped == cases.size() + 1);
  CHECK(cols.size() == cases.size() + 2);
  CHECK(cols.labels.front() == 1.0f);
  CHECK(cols.labels[1] == 0.0f);
  CHECK(cols.labels.back() == 1.0f);
  CHECK_THAT(cols.first_skipped, Contains("mixed.tsv") && Contains("line 2, column 40 (C26)"));
  CHECK_THROWS_WITH(data::read_criteo((dir / "none.tsv").string()), Contains("none.tsv") && Contains("cannot open"));
}

TEST_CASE("synthetic Criteo logs: deterministic, a planted model with a best AUC, read back as written",
          "[criteo][data]") {
  dtf::test::temp_dir dir("criteo-synth");
  const data::criteo_synthetic_config cfg{.examples = 4000, .seed = 11};
  const auto a = data::synthetic_criteo(cfg), b = data::synthetic_criteo(cfg);
  CHECK(a.labels == b.labels);
  CHECK(a.click_probability == b.click_probability);
  CHECK(a.integers == b.integers);
  CHECK(a.categorical == b.categorical);
  auto other = cfg;
  other.seed = 12;
  CHECK(data::synthetic_criteo(other).categorical != a.categorical);

  // The planted model: clicks near its mean probability, a best AUC well inside (0.5, 1).
  double clicks = 0, mean_p = 0;
  for (std::size_t i = 0; i < a.size(); ++i) clicks += a.labels[i], mean_p += a.click_probability[i];
  CHECK(clicks / a.size() == Approx(mean_p / a.size()).margin(0.03));
  CHECK(clicks / a.size() > 0.1);
  CHECK(clicks / a.size() < 0.35);
  CHECK(a.best_auc() > 0.75);
  CHECK(a.best_auc() < 0.9);
  // Zipf ids: column C1's most frequent value takes a large share, and many values appear.
  std::map<std::int64_t, int> freq;
  int missing = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const auto v = a.categorical[i * 26];
    if (v == data::criteo_synthetic::missing_categorical) ++missing;
    else ++freq[v];
  }
  int top = 0;
  for (const auto& [v, n] : freq) top = std::max(top, n);
  CHECK(top > int(a.size()) / 10);
  CHECK(freq.size() > 100);
  CHECK(missing > 0);

  // Written plain and gzip, read back as columns() says, bit for bit.
  const auto expected = a.columns();
  for (bool gz : {false, true}) {
    const auto path = (dir / (gz ? "logs.tsv.gz" : "logs.tsv")).string();
    a.write(path, gz);
    const auto cols = data::read_criteo(path);
    CHECK(cols.labels == expected.labels);
    CHECK(cols.dense == expected.dense);
    CHECK(cols.ids == expected.ids);
    CHECK(cols.skipped == 0);
    // In chunks, the same columns.
    data::criteo_reader r(path);
    data::criteo_columns chunked;
    while (r.read(chunked, 999) > 0) {
    }
    CHECK(chunked.ids == expected.ids);
    CHECK(r.lines() == a.size());
  }
  std::ifstream gz_head(dir / "logs.tsv.gz", std::ios::binary);
  CHECK(gz_head.get() == 0x1f);  // the gzip magic: compressed indeed
  CHECK(data::read_criteo((dir / "logs.tsv").string(), {.max_examples = 10}).size() == 10);
}

TEST_CASE("binary evaluation: AUC, log loss and accuracy of a model's logits against a pair count",
          "[criteo][metrics]") {
  // 300 examples of 3 features, labels 0/1; models with 2 logits (p = softmax[1]) and 1 (sigmoid).
  std::mt19937 gen(5);
  std::normal_distribution<float> normal;
  const std::size_t n = 300;
  xt::xtensor<float, 2> x = xt::zeros<float>({n, std::size_t(3)});
  xt::xtensor<std::int32_t, 1> y = xt::zeros<std::int32_t>({n});
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t j = 0; j < 3; ++j) x(i, j) = normal(gen);
    y(i) = x(i, 0) + 0.5f * normal(gen) > 0 ? 1 : 0;
  }
  const data::dataset ds(x, y, -4.0f, 4.0f);
  for (std::size_t classes : {std::size_t(2), std::size_t(1)}) {
    dtf::nn::sequential net{dtf::nn::dense(3, 4), dtf::nn::relu(), dtf::nn::dense(4, classes)};
    std::vector<float> p(net.num_parameters());
    net.initialize(p, 3);
    // The reference: the logits of all examples at once, the probabilities computed here.
    dtf::tensor xt_all, logits;
    dtf::assign_from_host(xt_all, x);
    net.logits(p, xt_all, logits);
    std::vector<float> z(logits.size()), prob(n);
    logits.copy_to_host<float>(std::span<float>(z));
    std::vector<int> labels(y.begin(), y.end());
    double loss = 0, right = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const double d = classes == 2 ? double(z[2 * i + 1]) - z[2 * i] : z[i];
      prob[i] = float(1.0 / (1.0 + std::exp(-d)));
      loss -= labels[i] ? std::log(prob[i]) : std::log(1.0 - prob[i]);
      right += (prob[i] >= 0.5f) == (labels[i] == 1);
    }
    auto sink = std::make_shared<metrics::binary_metrics>();
    const auto e = metrics::binary_evaluate_on(net, ds.batch(64), sink)(p);  // 5 batches, the last short
    CHECK(e.examples == n);
    CHECK(e.accuracy == Approx(right / n));
    CHECK(e.loss == Approx(loss / n).epsilon(1e-5));
    REQUIRE(e.metrics.size() == 2);
    CHECK(e.metrics[0].first == "auc");
    CHECK(e.metrics[0].second == Approx(pair_count_auc(prob, labels)).epsilon(1e-6));
    CHECK(e.metrics[1] == std::pair<std::string, double>("log_loss", e.loss));
    CHECK(sink->examples == n);
    CHECK(sink->auc == e.metrics[0].second);
  }
  // Three logits: not a binary classifier, an error naming the counts.
  dtf::nn::sequential three{dtf::nn::dense(3, 3)};
  std::vector<float> p3(three.num_parameters());
  CHECK_THROWS_WITH(metrics::evaluate_binary(three, p3, ds.batch(64)),
                    Catch::Contains("192 logits for 64 examples"));
}

TEST_CASE("binary evaluation of an embedding classifier reads its rows through the reader",
          "[criteo][metrics]") {
  // One id per example from 10; the rows come from a map (the reader), the same logits as
  // the model computes from those rows directly.
  dtf::nn::embedding_sequential net({.table = {.name = "t", .rows = 10, .dim = 2}, .ids_per_example = 1},
                                    dtf::nn::sequential{dtf::nn::dense(2, 2)});
  std::vector<float> p(net.num_parameters());
  net.initialize(p, 9);
  std::vector<float> table(20);
  for (std::size_t i = 0; i < table.size(); ++i) table[i] = std::sin(float(i));
  const std::size_t n = 50;
  xt::xtensor<float, 2> x = xt::zeros<float>({n, std::size_t(1)});
  xt::xtensor<std::int32_t, 1> y = xt::zeros<std::int32_t>({n});
  std::vector<float> prob(n);
  std::vector<int> labels(n);
  for (std::size_t i = 0; i < n; ++i) {
    x(i, 0) = float(i % 10);
    y(i) = labels[i] = (i * 7) % 3 == 0 ? 1 : 0;
    // the model: logits = W^T row + b; p = sigmoid(z1 - z0) (kernel [2, 2] row-major, then bias)
    const float* r = &table[(i % 10) * 2];
    const float z0 = r[0] * p[0] + r[1] * p[2] + p[4], z1 = r[0] * p[1] + r[1] * p[3] + p[5];
    prob[i] = float(1.0 / (1.0 + std::exp(-(double(z1) - z0))));
  }
  std::size_t reads = 0;
  const dtf::row_reader read = [&](std::size_t t, std::span<const std::uint64_t> ids, std::span<float> rows) {
    REQUIRE(t == 0);
    ++reads;
    for (std::size_t k = 0; k < ids.size(); ++k) std::copy_n(&table[ids[k] * 2], 2, &rows[k * 2]);
  };
  const auto e = metrics::binary_evaluate_on(net, data::dataset(x, y, 0, 9).batch(20))(p, read);
  CHECK(reads == 3);
  CHECK(e.metrics[0].second == Approx(pair_count_auc(prob, labels)).epsilon(1e-6));
}

TEST_CASE("the recommender example's model: ids round-trip its input, gradients match finite differences",
          "[criteo][recommender]") {
  namespace rec = examples::recommender;
  const auto logs = data::synthetic_criteo({.examples = 12, .seed = 4, .vocabulary = 5}).columns();
  const auto ds = rec::to_dataset(logs, 0, logs.size());
  // No hidden layer: the loss is then smooth in the rows (no ReLU kink inside a difference step);
  // what is checked is the model's own backward through the dot products, the ids' weights, the
  // wide kernel and the lookup.
  rec::dlrm net({.dim = 3, .hidden = {}, .init_scale = 0.5f});
  REQUIRE(net.embeddings().front().dim == 4);  // e (3) and the id's weight b
  auto b = *ds.batch(12).stream().next();
  dtf::detail::batch_ids ids;
  net.embedding_ids(b, 0, ids.all);
  CHECK(ids.all == logs.ids);  // 64-bit ids, exact through the float features
  ids.deduplicate();
  std::vector<float> p(net.num_parameters()), g(p.size());
  net.initialize(p, 1);
  CHECK(net.variables().back().name == "wide/kernel");
  for (std::size_t j = 0; j < 13; ++j) p[p.size() - 13 + j] = 0.1f * float(j % 5) - 0.2f;  // w away from 0
  std::vector<double> values(ids.unique.size() * 4);
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = 0.5 * std::sin(double(i) * 1.7);
  dtf::tensor x, y;
  dtf::assign_from_host(x, b.features);
  dtf::assign_from_host(y, b.labels);
  // The loss and the gradients at rows v and parameters q (float), the model's own.
  auto loss_at = [&](const std::vector<double>& v, const std::vector<float>& q, std::vector<float>* grads,
                     std::vector<float>* dq) {
    std::vector<float> vf(v.begin(), v.end()), gr(v.size()), gd(q.size());
    const dtf::embedding_rows r{4, ids.index, vf, gr};
    const float l = net.loss_and_gradients(q, std::span<const dtf::embedding_rows>(&r, 1), x, y, gd);
    if (grads) *grads = gr;
    if (dq) *dq = gd;
    return double(l);
  };
  std::vector<float> analytic, analytic_p;
  const double l0 = loss_at(values, p, &analytic, &analytic_p);
  // The reference: binary cross-entropy of sigmoid(logit), the logits the model reports.
  dtf::tensor out;
  {
    std::vector<float> vf(values.begin(), values.end());
    const dtf::embedding_rows r{4, ids.index, vf, {}};
    net.logits(p, std::span<const dtf::embedding_rows>(&r, 1), x, out);
  }
  const auto t = out.to_vector<float>();
  REQUIRE(t.size() == 12);
  double ce = 0;
  for (std::size_t e = 0; e < 12; ++e) {
    const double q = 1 / (1 + std::exp(-double(t[e])));
    ce -= logs.labels[e] != 0 ? std::log(q) : std::log(1 - q);
  }
  CHECK(l0 == Approx(ce / 12).epsilon(1e-5));
  for (std::size_t i = 0; i < values.size(); ++i) {
    auto up = values, down = values;
    up[i] += 1e-2, down[i] -= 1e-2;
    CHECK(analytic[i] == Approx((loss_at(up, p, nullptr, nullptr) - loss_at(down, p, nullptr, nullptr)) / 2e-2).margin(2e-4));
  }
  for (std::size_t i = 0; i < p.size(); ++i) {  // the logit layer's kernel and bias, and w
    auto up = p, down = p;
    up[i] += 1e-2f, down[i] -= 1e-2f;
    const double fd = (loss_at(values, up, nullptr, nullptr) - loss_at(values, down, nullptr, nullptr)) / 2e-2;
    CHECK(analytic_p[i] == Approx(fd).margin(2e-4));
  }
  // A piece that is not 16 bits: an error naming the example and the column.
  b.features(2, 13 + 4 * 5 + 1) = 70000.0f;
  CHECK_THROWS_WITH(net.embedding_ids(b, 0, ids.all), Catch::Contains("example 2, C6"));
}

}  // namespace criteo_tests
