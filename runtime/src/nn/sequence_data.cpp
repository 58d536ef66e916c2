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
// The lines partition's reserved tokens, after "<unk>", as d2l's Vocab(reserved_tokens=[...]) numbers them.
const char* const kPad = "<pad>";
const char* const kBos = "<bos>";
const char* const kEos = "<eos>";
constexpr int32_t kPadId = 1, kBosId = 2, kEosId = 3;

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

// One sample per line of lines [first, last): with full = <bos> line <eos>, x = full[0 : |full| - 1] and y =
// full[1 : |full|], each cut or padded with <pad> to T (d2l's truncate_pad: <eos> is only a target).
// line_begin[l] is where line l starts in ids.
std::shared_ptr<Dataset> text_lines(const std::vector<int32_t>& ids, const std::vector<size_t>& line_begin,
                                    size_t first, size_t last, int64_t steps) {
  auto d = std::make_shared<Dataset>();
  d->count = static_cast<int64_t>(last - first);
  d->channels = d->height = d->width = 0;
  d->sample_shape = {steps};
  d->target_shape = {steps};
  d->pad_target = kPadId;
  const auto numel = static_cast<size_t>(d->count * steps);
  d->values.assign(numel, static_cast<float>(kPadId));
  d->targets.assign(numel, static_cast<float>(kPadId));
  std::vector<int32_t> full;
  for (size_t l = first; l < last; ++l) {
    full.assign({kBosId});
    full.insert(full.end(), ids.begin() + static_cast<std::ptrdiff_t>(line_begin[l]),
                ids.begin() + static_cast<std::ptrdiff_t>(line_begin[l + 1]));
    full.push_back(kEosId);
    const size_t row = (l - first) * static_cast<size_t>(steps);
    for (size_t t = 0; t < static_cast<size_t>(steps) && t + 1 < full.size(); ++t) {
      d->values[row + t] = static_cast<float>(full[t]);
      d->targets[row + t] = static_cast<float>(full[t + 1]);
    }
  }
  return d;
}

// The text's tokens with provisional ids in order of first appearance (which breaks frequency ties), and,
// for the lines partition, where each line that has a token starts.
struct Tokenized {
  std::vector<std::string_view> distinct;
  std::vector<int32_t> corpus;
  std::vector<size_t> line_begin;  // lines: one entry per kept line, then corpus.size()
};

// Cuts `body` into tokens. By lines, each line (its '\r' dropped) is preprocessed and trimmed by itself, and a
// line without tokens is left out. The views point into `file`, or with the preprocessing into `storage`;
// then `file` is emptied first, to give its memory back before counting.
Tokenized tokenize(std::string& file, const TextOptions& o, std::string& storage) {
  const bool lines = o.partition == TextOptions::Partition::Lines;
  std::string_view body = without_bom(file);
  if (o.preprocess) {
    if (!lines) {
      storage = preprocessed(body);
    } else {
      // Line by line, so that the line breaks survive d2l's folding of everything but letters into spaces.
      storage.reserve(body.size());
      for (size_t i = 0; i <= body.size();) {
        const size_t nl = std::min(body.find('\n', i), body.size());
        std::string line = preprocessed(body.substr(i, nl - i));
        const size_t a = line.find_first_not_of(' '), b = line.find_last_not_of(' ');
        if (a != std::string::npos) storage.append(line, a, b - a + 1);
        storage += '\n';
        i = nl + 1;
      }
    }
    std::string().swap(file);
    body = storage;
  }
  Tokenized t;
  std::unordered_map<std::string_view, int32_t> provisional;
  if (o.tokens == TokenUnit::Char) t.corpus.reserve(body.size());
  auto add = [&](std::string_view token) {
    const auto [it, fresh] = provisional.emplace(token, static_cast<int32_t>(t.distinct.size()));
    if (fresh) {
      if (t.distinct.size() == kMaxVocabulary)
        throw Error("text: " + o.path + " has more than " + std::to_string(kMaxVocabulary) +
                    " distinct words, too many for a vocabulary (is it text in words?)");
      t.distinct.push_back(token);
    }
    t.corpus.push_back(it->second);
  };
  if (!lines) {
    for_each_token(body, o.tokens, add);
    return t;
  }
  for (size_t i = 0; i < body.size();) {
    const size_t nl = std::min(body.find('\n', i), body.size());
    std::string_view line = body.substr(i, nl - i);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    const size_t before = t.corpus.size();
    for_each_token(line, o.tokens, add);
    if (t.corpus.size() > before) t.line_begin.push_back(before);
    i = nl + 1;
  }
  t.line_begin.push_back(t.corpus.size());
  return t;
}

struct Vocabulary {
  std::vector<std::string> tokens;  // by id
  std::vector<int64_t> counts;      // training tokens per id
  std::vector<int32_t> id_of;       // provisional id -> final id
};

// "<unk>" is id 0, then the reserved tokens (counted 0), then every token seen at least min_freq times in
// the first `train_tokens` of the corpus, most frequent first, ties in order of first appearance. A token
// spelled as "<unk>" or as a reserved token is id 0.
Vocabulary make_vocabulary(const Tokenized& t, size_t train_tokens, int64_t min_freq,
                           const std::vector<std::string>& reserved) {
  std::vector<int64_t> counts(t.distinct.size(), 0);
  for (size_t i = 0; i < train_tokens; ++i) ++counts[static_cast<size_t>(t.corpus[i])];
  auto is_special = [&](std::string_view token) {
    return token == kUnknown || std::find(reserved.begin(), reserved.end(), token) != reserved.end();
  };
  std::vector<int32_t> kept;
  for (size_t p = 0; p < t.distinct.size(); ++p)
    if (counts[p] > 0 && counts[p] >= min_freq && !is_special(t.distinct[p])) kept.push_back(static_cast<int32_t>(p));
  std::stable_sort(kept.begin(), kept.end(), [&](int32_t a, int32_t b) { return counts[a] > counts[b]; });
  Vocabulary v;
  v.tokens.emplace_back(kUnknown);
  v.tokens.insert(v.tokens.end(), reserved.begin(), reserved.end());
  v.counts.assign(v.tokens.size(), 0);
  v.id_of.assign(t.distinct.size(), 0);
  for (int32_t p : kept) {
    v.id_of[static_cast<size_t>(p)] = static_cast<int32_t>(v.tokens.size());
    v.tokens.emplace_back(t.distinct[static_cast<size_t>(p)]);
    v.counts.push_back(counts[static_cast<size_t>(p)]);
  }
  for (size_t p = 0; p < t.distinct.size(); ++p)
    if (v.id_of[p] == 0) v.counts[0] += counts[p];
  return v;
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
  Tokenized t = tokenize(file, o, processed);

  const bool by_lines = o.partition == TextOptions::Partition::Lines;
  const int64_t steps = o.num_steps, tokens = static_cast<int64_t>(t.corpus.size());
  size_t train_tokens = 0, train_lines = 0;
  if (by_lines) {
    const auto lines = static_cast<int64_t>(t.line_begin.size() - 1);
    const int64_t test_lines = std::llround(o.test_fraction * static_cast<double>(lines));
    if (lines == 0)
      throw Error("text: " + o.path + " has no line with " + token_noun(o.tokens) + " in it");
    if (lines - test_lines < 1 || (o.test_fraction > 0 && test_lines < 1))
      throw Error("text: " + o.path + " has " + std::to_string(lines) + " lines with " + token_noun(o.tokens) +
                  ": too few for a training and a test split of at least one line each (test_fraction " +
                  std::to_string(o.test_fraction) + ")");
    train_lines = static_cast<size_t>(lines - test_lines);
    train_tokens = t.line_begin[train_lines];
  } else {
    const int64_t test_tokens = std::llround(o.test_fraction * static_cast<double>(tokens));
    train_tokens = static_cast<size_t>(tokens - test_tokens);
    const std::string one_sample = "one sample (num_steps + 1 = " + std::to_string(steps + 1) + " tokens)";
    if (tokens < steps + 1)
      throw Error("text: " + o.path + " has " + std::to_string(tokens) + " " + token_noun(o.tokens) +
                  ", fewer than " + one_sample);
    if (static_cast<int64_t>(train_tokens) < steps + 1)
      throw Error("text: the training split of " + o.path + " (the first " + std::to_string(train_tokens) +
                  " of " + std::to_string(tokens) + " " + token_noun(o.tokens) + ") is shorter than " +
                  one_sample);
    if (o.test_fraction > 0 && test_tokens < steps + 1)
      throw Error("text: the test split of " + o.path + " (the last " + std::to_string(test_tokens) + " of " +
                  std::to_string(tokens) + " " + token_noun(o.tokens) + ", test_fraction " +
                  std::to_string(o.test_fraction) + ") is shorter than " + one_sample);
  }

  // The vocabulary, from the training tokens only: the test split must not choose it.
  const Vocabulary v = make_vocabulary(t, train_tokens, o.min_freq,
                                       by_lines ? std::vector<std::string>{kPad, kBos, kEos}
                                                : std::vector<std::string>{});
  std::vector<int32_t>& ids = t.corpus;
  for (int32_t& id : ids) id = v.id_of[static_cast<size_t>(id)];

  auto describe = [&](Dataset& d, const char* split) {
    d.name = std::string("text/") + split;
    d.source = o.path;
    d.classes = static_cast<int64_t>(v.tokens.size());
    d.sequential = o.partition == TextOptions::Partition::Sequential;
    d.vocabulary = v.tokens;
    d.token_counts = v.counts;
    d.tokenizer = {o.tokens, o.preprocess};
  };
  std::shared_ptr<Dataset> train, test;
  if (by_lines) {
    // The last round(test_fraction * lines) lines are the test split.
    const size_t lines = t.line_begin.size() - 1;
    if (o.test_fraction > 0) test = text_lines(ids, t.line_begin, train_lines, lines, steps);
    train = text_lines(ids, t.line_begin, 0, train_lines, steps);
  } else {
    // The training windows start at an offset drawn from the seed, one that leaves room for a window.
    const int64_t max_offset = std::min(steps - 1, static_cast<int64_t>(train_tokens) - steps - 1);
    const int64_t offset =
        static_cast<int64_t>(philox::philox4x32_10(0, o.seed).v[0] % static_cast<uint64_t>(max_offset + 1));
    if (o.test_fraction > 0) test = text_windows(ids, train_tokens, ids.size(), 0, steps);
    train = text_windows(ids, 0, train_tokens, offset, steps);
  }
  TextData out;
  if (test) describe(*test, "test");
  describe(*train, "train");
  out.train = train;
  out.test = test;
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
