// Text (d2l 9.2-9.3) and series (d2l 9.1) datasets: tokens and their vocabulary, windows of them, encode and
// decode for prompts, and a series cut into tau-value samples. Tables are in table_data.cpp.
#include "gpunodes/nn/sequence_data.h"

#include <algorithm>
#include <cmath>
#include <string_view>
#include <unordered_map>

#include "data_files.h"
#include "gpunodes/errors.h"
#include "gpunodes/random.h"

namespace gn::nn {
namespace {

// More distinct words than this are refused: ids must stay exact as floats (below 2^24), and a vocabulary
// this large is a file that is not text in words (every token distinct) rather than a language.
constexpr size_t kMaxVocabulary = 10'000'000;
const char* const kUnknown = "<unk>";

bool is_ascii_letter(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z');
}

bool is_ascii_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

// d2l's re.sub('[^A-Za-z]+', ' ', text).lower().
std::string preprocessed(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  bool in_gap = false;
  for (char c : text) {
    if (is_ascii_letter(c)) {
      out += c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c;
      in_gap = false;
    } else if (!in_gap) {
      out += ' ';
      in_gap = true;
    }
  }
  return out;
}

// Calls token(piece) for each token of (checked UTF-8) text, in order.
template <class F>
void for_each_token(std::string_view text, TokenUnit unit, F&& token) {
  const size_t n = text.size();
  if (unit == TokenUnit::Char) {
    for (size_t i = 0; i < n;) {
      const size_t len = std::min(utf8_sequence_length(static_cast<unsigned char>(text[i])), n - i);
      token(text.substr(i, len));
      i += len;
    }
    return;
  }
  for (size_t i = 0; i < n;) {
    while (i < n && is_ascii_space(text[i])) ++i;
    size_t end = i;
    while (end < n && !is_ascii_space(text[end])) ++end;
    if (end > i) token(text.substr(i, end - i));
    i = end;
  }
}

const char* token_noun(TokenUnit unit) {
  return unit == TokenUnit::Char ? "character tokens" : "words";
}

// The windows x = ids[s : s + T], y = ids[s + 1 : s + T + 1] for s = offset, offset + T, ...
std::shared_ptr<Dataset> text_windows(const std::vector<int32_t>& ids, size_t begin, size_t end,
                                      int64_t offset, int64_t steps) {
  auto d = std::make_shared<Dataset>();
  const int64_t tokens = static_cast<int64_t>(end - begin);
  d->count = (tokens - offset - 1) / steps;
  d->channels = d->height = d->width = 0;
  d->sample_shape = {steps};
  d->target_shape = {steps};
  const auto numel = static_cast<size_t>(d->count * steps);
  d->values.resize(numel);
  d->targets.resize(numel);
  const int32_t* first = ids.data() + begin + offset;
  for (size_t k = 0; k < numel; ++k) {
    d->values[k] = static_cast<float>(first[k]);
    d->targets[k] = static_cast<float>(first[k + 1]);
  }
  return d;
}

}  // namespace

TextData load_text(const TextOptions& o) {
  const std::string kind = "text";
  if (o.num_steps < 1) throw Error("text: num_steps must be at least 1, not " + std::to_string(o.num_steps));
  if (o.min_freq < 0) throw Error("text: min_freq must be 0 or more");
  if (!(o.test_fraction >= 0 && o.test_fraction < 1))
    throw Error("text: test_fraction must be in [0, 1), not " + std::to_string(o.test_fraction));
  if (o.max_bytes < 0) throw Error("text: max_bytes must be 0 (automatic) or a size");
  std::string file = read_data_file(o.path, o.max_bytes, kind);
  check_utf8_text(file, kind, o.path);
  std::string processed;
  std::string_view body = without_bom(file);
  if (o.preprocess) {
    processed = preprocessed(body);
    std::string().swap(file);  // the original is no longer needed: give its memory back before counting
    body = processed;
  }

  // Each distinct token gets a provisional id in order of first appearance, which breaks frequency ties.
  std::unordered_map<std::string_view, int32_t> provisional;
  std::vector<std::string_view> distinct;
  std::vector<int32_t> corpus;
  if (o.tokens == TokenUnit::Char) corpus.reserve(body.size());
  for_each_token(body, o.tokens, [&](std::string_view token) {
    const auto [it, fresh] = provisional.emplace(token, static_cast<int32_t>(distinct.size()));
    if (fresh) {
      if (distinct.size() == kMaxVocabulary)
        throw Error("text: " + o.path + " has more than " + std::to_string(kMaxVocabulary) +
                    " distinct words, too many for a vocabulary (is it text in words?)");
      distinct.push_back(token);
    }
    corpus.push_back(it->second);
  });

  const int64_t steps = o.num_steps, tokens = static_cast<int64_t>(corpus.size());
  const int64_t test_tokens = std::llround(o.test_fraction * static_cast<double>(tokens));
  const int64_t train_tokens = tokens - test_tokens;
  const std::string one_sample = "one sample (num_steps + 1 = " + std::to_string(steps + 1) + " tokens)";
  if (tokens < steps + 1)
    throw Error("text: " + o.path + " has " + std::to_string(tokens) + " " + token_noun(o.tokens) +
                ", fewer than " + one_sample);
  if (train_tokens < steps + 1)
    throw Error("text: the training split of " + o.path + " (the first " + std::to_string(train_tokens) +
                " of " + std::to_string(tokens) + " " + token_noun(o.tokens) + ") is shorter than " +
                one_sample);
  if (o.test_fraction > 0 && test_tokens < steps + 1)
    throw Error("text: the test split of " + o.path + " (the last " + std::to_string(test_tokens) + " of " +
                std::to_string(tokens) + " " + token_noun(o.tokens) + ", test_fraction " +
                std::to_string(o.test_fraction) + ") is shorter than " + one_sample);

  // The vocabulary, from the training tokens only: the test split must not choose it.
  std::vector<int64_t> counts(distinct.size(), 0);
  for (int64_t i = 0; i < train_tokens; ++i) ++counts[static_cast<size_t>(corpus[i])];
  std::vector<int32_t> kept;
  for (size_t p = 0; p < distinct.size(); ++p)
    if (counts[p] > 0 && counts[p] >= o.min_freq && distinct[p] != kUnknown)
      kept.push_back(static_cast<int32_t>(p));
  std::stable_sort(kept.begin(), kept.end(), [&](int32_t a, int32_t b) { return counts[a] > counts[b]; });
  std::vector<int32_t> final_id(distinct.size(), 0);
  std::vector<std::string> vocabulary{kUnknown};
  std::vector<int64_t> token_counts{0};
  vocabulary.reserve(kept.size() + 1);
  for (size_t r = 0; r < kept.size(); ++r) {
    final_id[kept[r]] = static_cast<int32_t>(r + 1);
    vocabulary.emplace_back(distinct[kept[r]]);
    token_counts.push_back(counts[kept[r]]);
  }
  for (size_t p = 0; p < distinct.size(); ++p)
    if (final_id[p] == 0) token_counts[0] += counts[p];
  for (int32_t& id : corpus) id = final_id[static_cast<size_t>(id)];

  // The training windows start at an offset drawn from the seed, one that leaves room for a window.
  const int64_t max_offset = std::min(steps - 1, train_tokens - steps - 1);
  const int64_t offset =
      static_cast<int64_t>(philox::philox4x32_10(0, o.seed).v[0] % static_cast<uint64_t>(max_offset + 1));
  auto describe = [&](Dataset& d, const char* split) {
    d.name = std::string("text/") + split;
    d.source = o.path;
    d.classes = static_cast<int64_t>(vocabulary.size());
    d.sequential = o.partition == TextOptions::Partition::Sequential;
    d.vocabulary = vocabulary;
    d.token_counts = token_counts;
    d.tokenizer = {o.tokens, o.preprocess};
  };
  TextData out;
  if (o.test_fraction > 0) {
    auto test = text_windows(corpus, static_cast<size_t>(train_tokens), corpus.size(), 0, steps);
    describe(*test, "test");
    out.test = test;
  }
  auto train = text_windows(corpus, 0, static_cast<size_t>(train_tokens), offset, steps);
  describe(*train, "train");
  out.train = train;
  return out;
}

std::vector<int64_t> encode(const Dataset& text, const std::string& s) {
  if (text.vocabulary.empty())
    throw Error("encode: " + text.name + " is not a text dataset: it has no vocabulary");
  check_utf8_text(s, "encode", "the prompt");
  const std::string processed = text.tokenizer.preprocess ? preprocessed(s) : s;
  std::unordered_map<std::string_view, int64_t> ids;
  ids.reserve(text.vocabulary.size());
  for (size_t i = 0; i < text.vocabulary.size(); ++i)
    ids.emplace(text.vocabulary[i], static_cast<int64_t>(i));
  std::vector<int64_t> out;
  for_each_token(processed, text.tokenizer.unit, [&](std::string_view token) {
    const auto it = ids.find(token);
    out.push_back(it == ids.end() ? 0 : it->second);
  });
  return out;
}

std::string decode(const Dataset& text, const std::vector<int64_t>& ids) {
  const auto size = static_cast<int64_t>(text.vocabulary.size());
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= size)
      throw Error("decode: token id " + std::to_string(ids[i]) + " (at " + std::to_string(i) +
                  ") is outside the vocabulary of " + text.name + " (" + std::to_string(size) + " tokens)");
    if (i > 0 && text.tokenizer.unit == TokenUnit::Word) out += ' ';
    out += text.vocabulary[static_cast<size_t>(ids[i])];
  }
  return out;
}

// --- series ----------------------------------------------------------------------------------------------

namespace {

// The column the options name, or else the only column whose every cell is a number.
int64_t series_column(std::string_view body, const SeriesOptions& o) {
  CsvReader reader(body, "series", o.path);
  const CsvHeader header = read_csv_header(reader, "series", o.path);
  if (!o.column.empty()) {
    const int64_t c = header.find(o.column);
    if (c < 0) throw_no_such_column("series", o.path, header, o.column, "the series");
    return c;
  }
  std::vector<bool> numeric(header.names.size(), true);
  std::vector<std::string> fields;
  while (reader.next(fields)) {
    check_field_count(reader, fields, header);
    double v;
    for (size_t c = 0; c < fields.size(); ++c)
      if (numeric[c] && !parse_number(fields[c], v)) numeric[c] = false;
  }
  std::vector<std::string> names;
  int64_t found = -1;
  for (size_t c = 0; c < numeric.size(); ++c)
    if (numeric[c]) names.push_back(quote_for_message(header.names[c])), found = static_cast<int64_t>(c);
  if (names.size() == 1) return found;
  if (names.empty())
    throw Error("series: " + o.path + " has no column of numbers only (its columns are " + header.listed() +
                "): name the column to read");
  std::string listed;
  for (const std::string& n : names) listed += (listed.empty() ? "" : ", ") + n;
  throw Error("series: " + o.path + " has several columns of numbers (" + listed +
              "): name one as the column");
}

std::vector<float> read_series(const SeriesOptions& o) {
  const std::string file = read_data_file(o.path, o.max_bytes, "series");
  check_utf8_text(file, "series", o.path);
  const std::string_view body = without_bom(file);
  const int64_t column = series_column(body, o);
  CsvReader reader(body, "series", o.path);
  const CsvHeader header = read_csv_header(reader, "series", o.path);
  std::vector<std::string> fields;
  std::vector<float> x;
  while (reader.next(fields)) {
    check_field_count(reader, fields, header);
    double v;
    if (!parse_number(fields[column], v)) throw_not_a_number(reader, header, column, fields[column]);
    x.push_back(static_cast<float>(v));
  }
  if (x.empty()) throw Error("series: " + o.path + " has a header but no rows");
  return x;
}

// Samples [first, first + n) of the series: the tau values before each target.
std::shared_ptr<Dataset> series_split(const std::shared_ptr<const std::vector<float>>& series, int64_t first,
                                      int64_t n, int64_t tau, const SeriesOptions& o, const char* split) {
  auto d = std::make_shared<Dataset>();
  d->name = std::string("series/") + split;
  d->source = o.path;
  d->count = n;
  d->channels = d->height = d->width = 0;
  d->classes = 1;
  d->regression = true;
  d->sample_shape = {tau};
  d->target_shape = {};
  d->values.resize(static_cast<size_t>(n * tau));
  d->targets.resize(static_cast<size_t>(n));
  const std::vector<float>& x = *series;
  for (int64_t i = 0; i < n; ++i) {
    std::copy_n(x.begin() + first + i, tau, d->values.begin() + i * tau);
    d->targets[i] = x[first + i + tau];
  }
  d->series = series;
  d->series_first = first + tau;
  return d;
}

}  // namespace

SeriesData load_series(const SeriesOptions& o) {
  if (o.tau < 1) throw Error("series: tau must be at least 1, not " + std::to_string(o.tau));
  if (!(o.test_fraction >= 0 && o.test_fraction < 1))
    throw Error("series: test_fraction must be in [0, 1), not " + std::to_string(o.test_fraction));
  if (o.max_bytes < 0) throw Error("series: max_bytes must be 0 (automatic) or a size");
  std::vector<float> x;
  if (o.path.empty()) {
    if (o.count < 1) throw Error("series: count must be at least 1, not " + std::to_string(o.count));
    // d2l 9.1: x = sin(0.01 * time) + randn(T) * 0.2 for time = 1..T.
    x.resize(static_cast<size_t>(o.count));
    for (int64_t t = 1; t <= o.count; ++t)
      x[t - 1] = static_cast<float>(std::sin(0.01 * static_cast<double>(t))) +
                 philox::normal_at(o.seed, static_cast<uint64_t>(t - 1), 0.0f, 0.2f);
  } else {
    x = read_series(o);
  }
  const int64_t values = static_cast<int64_t>(x.size()), samples = values - o.tau;
  const std::string what = o.path.empty() ? std::string("the made series") : o.path;
  if (samples < 1)
    throw Error("series: " + what + " has " + std::to_string(values) +
                " values, fewer than one sample of tau = " + std::to_string(o.tau) + " needs (tau + 1)");
  int64_t train = samples;
  if (o.test_fraction > 0) {
    if (samples < 2)
      throw Error("series: " + what + " has " + std::to_string(values) +
                  " values, too few for a sample in each "
                  "split with tau = " +
                  std::to_string(o.tau) + " (tau + 2 at least)");
    train = std::clamp<int64_t>(std::llround((1 - o.test_fraction) * static_cast<double>(values)), 1,
                                samples - 1);
  }
  auto series = std::make_shared<const std::vector<float>>(std::move(x));
  SeriesData out;
  out.train = series_split(series, 0, train, o.tau, o, "train");
  if (o.test_fraction > 0) out.test = series_split(series, train, samples - train, o.tau, o, "test");
  return out;
}

AttentionPoolingData make_attention_pooling(int64_t points, uint64_t seed) {
  if (points < 2 || points > 100000)
    throw Error("attention pooling: points must be between 2 and 100,000, not " + std::to_string(points));
  const auto n = static_cast<size_t>(points);
  std::vector<float> x(n), y(n);
  for (size_t i = 0; i < n; ++i) x[i] = philox::uniform_at(seed, i, 0.0f, 5.0f);
  std::sort(x.begin(), x.end());
  auto f = [](float v) { return 2.0f * std::sin(v) + std::pow(v, 0.8f); };
  for (size_t i = 0; i < n; ++i) y[i] = f(x[i]) + philox::normal_at(seed ^ 0x6e77ull, i, 0.0f, 0.5f);
  auto split = [&](bool train) {
    auto d = std::make_shared<Dataset>();
    d->count = 1;
    d->classes = 1;
    d->regression = true;
    d->sample_shape = {points, 3};
    d->target_shape = {points};
    d->values.resize(3 * n);
    d->targets.resize(n);
    for (size_t i = 0; i < n; ++i) {
      const float query = train ? x[i] : 5.0f * static_cast<float>(i) / static_cast<float>(points);
      d->values[3 * i] = query;
      d->values[3 * i + 1] = x[i];
      d->values[3 * i + 2] = y[i];
      d->targets[i] = train ? y[i] : f(query);
    }
    return d;
  };
  return {split(true), split(false)};
}

}  // namespace gn::nn
