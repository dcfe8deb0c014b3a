// The King James Bible as next-word examples, and the n-gram baselines the model is measured
// against. The text is Debian's bible-kjv-text, printed by its reader `bible` (package bible-kjv):
//   bible -l100000 Gen1:1-Rev22:21
// prints one verse per line ("  12 And God said, ..."), with headings ("Genesis 1") between.
//
// Tokens: lower-case runs of letters and apostrophes; every verse ends with </s>. Every tenth
// verse (verse 9, 19, 29, ... in book order) is held out. The vocabulary is the training verses'
// most frequent words (ties by spelling), then <unk> for the rest and </s>.
// Examples: for each token of a verse (its </s> included), the previous `context` tokens
// (</s> before the verse's start) as ids, and the token as the label.
#pragma once

#include <dtf/data/dataset.hpp>
#include <dtf/error.hpp>
#include <dtf/flags.hpp>
#include <dtf/nn/evaluate.hpp>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace examples {

inline constexpr std::int32_t end_of_verse = 0, unknown_word = 1;

/// The verses of `path`, or of `bible -l100000 Gen1:1-Rev22:21` when path is empty.
inline std::vector<std::string> read_verses(const std::string& path) {
  std::vector<std::string> lines;
  std::string line;
  if (!path.empty()) {
    std::ifstream in(path);
    if (!in) throw dtf::error(dtf::errc::io_error, "--text: cannot open '" + path + "'");
    while (std::getline(in, line)) lines.push_back(line);
  } else {
    std::unique_ptr<FILE, int (*)(FILE*)> p(popen("bible -l100000 Gen1:1-Rev22:21 2>/dev/null", "r"), pclose);
    if (!p) throw dtf::error(dtf::errc::io_error, "cannot run 'bible'");
    char buf[1 << 16];
    while (std::fgets(buf, sizeof buf, p.get())) {
      line = buf;
      if (!line.empty() && line.back() == '\n') line.pop_back();
      lines.push_back(line);
    }
  }
  std::vector<std::string> verses;
  for (const auto& l : lines) {  // "  12 text": a verse; anything else a heading or blank
    std::size_t i = 0;
    while (i < l.size() && l[i] == ' ') ++i;
    const std::size_t digits = i;
    while (i < l.size() && std::isdigit(static_cast<unsigned char>(l[i]))) ++i;
    if (i > digits && i < l.size() && l[i] == ' ') verses.push_back(l.substr(i + 1));
  }
  if (verses.size() < 20)
    throw dtf::error(dtf::errc::invalid_argument,
                     (path.empty() ? std::string("'bible' printed") : "'" + path + "' holds") + " " +
                         std::to_string(verses.size()) +
                         " verses (install the text with: apt-get install bible-kjv bible-kjv-text, or give --text FILE)");
  return verses;
}

inline std::vector<std::string> words_of(const std::string& verse) {
  std::vector<std::string> out;
  std::string w;
  for (char ch : verse) {
    const auto c = static_cast<unsigned char>(ch);
    if (std::isalpha(c) || (c == '\'' && !w.empty())) {
      w += char(std::tolower(c));
    } else if (!w.empty()) {
      out.push_back(std::move(w));
      w.clear();
    }
  }
  if (!w.empty()) out.push_back(std::move(w));
  return out;
}

struct corpus {
  std::vector<std::string> vocabulary;  ///< id -> word (0: </s>, 1: <unk>)
  std::vector<std::vector<std::int32_t>> train, test;  ///< verses as ids, each ending in </s>
  std::size_t train_tokens = 0, test_tokens = 0;
  double test_unknown = 0;  ///< fraction of held-out tokens that are <unk>

  /// verses: every tenth held out; vocabulary of at most `size` entries.
  corpus(const std::vector<std::string>& verses, std::size_t size) {
    if (size < 3) throw dtf::error(dtf::errc::invalid_config, "--vocabulary must be at least 3");
    std::vector<std::vector<std::string>> split[2];
    std::unordered_map<std::string, std::size_t> counts;
    for (std::size_t v = 0; v < verses.size(); ++v) {
      auto w = words_of(verses[v]);
      const bool held_out = v % 10 == 9;
      if (!held_out)
        for (const auto& x : w) ++counts[x];
      split[held_out].push_back(std::move(w));
    }
    std::vector<std::pair<std::string, std::size_t>> by_count(counts.begin(), counts.end());
    std::sort(by_count.begin(), by_count.end(),
              [](const auto& a, const auto& b) { return a.second != b.second ? a.second > b.second : a.first < b.first; });
    vocabulary = {"</s>", "<unk>"};
    std::unordered_map<std::string, std::int32_t> id;
    for (std::size_t i = 0; i < by_count.size() && vocabulary.size() < size; ++i) {
      id[by_count[i].first] = std::int32_t(vocabulary.size());
      vocabulary.push_back(by_count[i].first);
    }
    std::size_t unknown = 0;
    for (int s = 0; s < 2; ++s)
      for (const auto& verse : split[s]) {
        std::vector<std::int32_t> ids;
        for (const auto& w : verse) {
          const auto it = id.find(w);
          ids.push_back(it == id.end() ? unknown_word : it->second);
          if (s == 1 && ids.back() == unknown_word) ++unknown;
        }
        ids.push_back(end_of_verse);
        (s ? test_tokens : train_tokens) += ids.size();
        (s ? test : train).push_back(std::move(ids));
      }
    test_unknown = test_tokens ? double(unknown) / double(test_tokens) : 0.0;
  }

  /// Next-word examples of `verses`: `context` previous ids as features, the id as the label.
  static dtf::data::dataset examples(const std::vector<std::vector<std::int32_t>>& verses, std::size_t context,
                                     std::size_t vocabulary_size) {
    std::size_t n = 0;
    for (const auto& v : verses) n += v.size();
    xt::xtensor<float, 2> x = xt::xtensor<float, 2>::from_shape({n, context});
    xt::xtensor<std::int32_t, 1> y = xt::xtensor<std::int32_t, 1>::from_shape({n});
    std::size_t row = 0;
    for (const auto& v : verses)
      for (std::size_t i = 0; i < v.size(); ++i, ++row) {
        for (std::size_t c = 0; c < context; ++c)  // column context-1 is the previous word
          x(row, c) = i + c >= context ? float(v[i + c - context]) : float(end_of_verse);
        y(row) = v[i];
      }
    return dtf::data::dataset(std::move(x), std::move(y), 0.0f, float(vocabulary_size));
  }
};

/// Held-out perplexities of the n-gram baselines fitted on the training verses.
struct baselines {
  double unigram = 0, bigram = 0;
  /// For the RESULT line (train_options::result_extra).
  std::string result_extra() const {
    return "unigram_ppl=" + std::to_string(unigram) + " bigram_ppl=" + std::to_string(bigram);
  }
  /// The model's held-out perplexity (exp of its mean loss) beside the baselines.
  void print_against(const dtf::nn::evaluation& e) const {
    std::printf("next_word: held-out perplexity: model %.1f, bigram %.1f, unigram %.1f (next-word accuracy %.3f)\n",
                std::exp(e.loss), bigram, unigram, e.accuracy);
  }
};

/// unigram: add-one estimate over the vocabulary. bigram: interpolated Kneser-Ney with discount
/// 0.75 (Chen & Goodman's interpolated form), the previous token (</s> at a verse's start) as
/// the history; its continuation distribution add-one smoothed so no word has probability 0.
inline baselines ngram_baselines(const corpus& c) {
  const std::size_t V = c.vocabulary.size();
  std::vector<double> unigram(V, 0.0), continuation(V, 0.0), history(V, 0.0), followers(V, 0.0);
  std::unordered_map<std::uint64_t, double> pair;  // (previous, word) -> count
  for (const auto& verse : c.train) {
    std::int32_t prev = end_of_verse;
    for (auto w : verse) {
      unigram[std::size_t(w)] += 1;
      history[std::size_t(prev)] += 1;
      auto& n = pair[std::uint64_t(prev) * V + std::uint64_t(w)];
      if (n == 0) {
        continuation[std::size_t(w)] += 1;
        followers[std::size_t(prev)] += 1;
      }
      n += 1;
      prev = w;
    }
  }
  const double D = 0.75, types = double(pair.size()), tokens = double(c.train_tokens);
  double log_uni = 0, log_bi = 0;
  std::size_t n = 0;
  for (const auto& verse : c.test) {
    std::int32_t prev = end_of_verse;
    for (auto w : verse) {
      const auto wi = std::size_t(w), pi = std::size_t(prev);
      log_uni += std::log((unigram[wi] + 1) / (tokens + double(V)));
      const double p_cont = (continuation[wi] + 1) / (types + double(V));
      double p = p_cont;
      if (history[pi] > 0) {
        const auto it = pair.find(std::uint64_t(prev) * V + std::uint64_t(w));
        const double cw = it == pair.end() ? 0.0 : it->second;
        p = std::max(cw - D, 0.0) / history[pi] + D * followers[pi] / history[pi] * p_cont;
      }
      log_bi += std::log(p);
      ++n;
      prev = w;
    }
  }
  return {std::exp(-log_uni / double(n)), std::exp(-log_bi / double(n))};
}

/// The text's flags, and the corpus and datasets they describe.
struct text_flags {
  std::string text;
  int max_verses = 0, vocabulary = 4000, context = 3;

  void add_to(dtf::flag_parser& f) {
    f.add("text", text, "verses, one per line after its number (default: the output of 'bible -l100000 Gen1:1-Rev22:21')")
        .add("max_verses", max_verses, "use only the first N verses (0: all)")
        .add("vocabulary", vocabulary, "words in the vocabulary, </s> and <unk> included")
        .add("context", context, "previous words the model sees");
  }
  corpus load() const {
    if (context < 1) throw dtf::error(dtf::errc::invalid_config, "--context must be positive");
    auto verses = read_verses(text);
    if (max_verses > 0 && std::size_t(max_verses) < verses.size()) verses.resize(std::size_t(max_verses));
    return corpus(verses, std::size_t(vocabulary));
  }
};

/// The chief's first line: the corpus and the baselines' held-out perplexities.
inline baselines report_baselines(const corpus& c) {
  const auto b = ngram_baselines(c);
  std::printf("next_word: %zu training verses (%zu tokens), %zu held out (%zu tokens, %.1f%% <unk>); vocabulary %zu; "
              "held-out perplexity of the unigram %.1f, of the Kneser-Ney bigram %.1f\n",
              c.train.size(), c.train_tokens, c.test.size(), c.test_tokens, 100 * c.test_unknown, c.vocabulary.size(),
              b.unigram, b.bigram);
  std::fflush(stdout);
  return b;
}

}  // namespace examples
