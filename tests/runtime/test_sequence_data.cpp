// Text, series and tables as value datasets (nn/sequence_data.h) and the loader serving them: vocabularies
// against counts made here, windows and their shifted targets, d2l's sequential order through a real
// DataLoader, the series of d2l 9.1, one clear message per bad file, and image batches shaped as before. The
// tables' checks are test_table_data.cpp's.
#include <sys/stat.h>

#include <QRegularExpression>
#include <QtTest>
#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "gpunodes/errors.h"
#include "gpunodes/nn/data.h"
#include "gpunodes/nn/sequence_data.h"
#include "gpunodes/ops.h"
#include "nn_test_util.h"

using namespace gn;
using namespace gn::nn;

namespace {

const char* const kGpl3 = "/usr/share/common-licenses/GPL-3";

// d2l's preprocessing, written independently of the loader's: re.sub('[^A-Za-z]+', ' ', text).lower().
QString d2lPreprocess(const QByteArray& text) {
  return QString::fromUtf8(text).replace(QRegularExpression("[^A-Za-z]+"), " ").toLower();
}

// A vocabulary as d2l builds it from tokens: "<unk>" first, then by count descending and first appearance.
struct Counted {
  std::vector<std::string> vocabulary{"<unk>"};
  std::vector<int64_t> counts{0};
};
Counted countTokens(const QStringList& tokens, int64_t minFreq) {
  std::map<QString, int64_t> count, first;
  for (qsizetype i = 0; i < tokens.size(); ++i) {
    ++count[tokens[i]];
    first.emplace(tokens[i], i);
  }
  std::vector<QString> order;
  for (const auto& [token, n] : count) order.push_back(token);
  std::sort(order.begin(), order.end(), [&](const QString& a, const QString& b) {
    return count[a] != count[b] ? count[a] > count[b] : first[a] < first[b];
  });
  Counted out;
  for (const QString& t : order) {
    if (count[t] >= minFreq) {
      out.vocabulary.push_back(t.toStdString());
      out.counts.push_back(count[t]);
    } else {
      out.counts[0] += count[t];
    }
  }
  return out;
}

QStringList characters(const QString& s) {
  QStringList out;
  for (QChar c : s) out.append(QString(c));
  return out;
}

std::vector<float> row(const float* base, int64_t numel, int64_t i) {
  return std::vector<float>(base + i * numel, base + (i + 1) * numel);
}

TextOptions textOptions(const QString& path, int64_t steps = 10) {
  TextOptions o;
  o.path = path.toStdString();
  o.num_steps = steps;
  return o;
}

QByteArray gpl3() {
  QFile f(kGpl3);
  return f.open(QIODevice::ReadOnly) ? f.readAll() : QByteArray();
}

}  // namespace

class SequenceDataTest : public QObject {
  Q_OBJECT

 private slots:
  // --- text
  // -------------------------------------------------------------------------------------------------

  void vocabulary_of_a_written_text_matches_an_independent_count() {
    Files files;
    const QByteArray text =
        "The Time Machine, by H. G. Wells [1898]\n\nI\n\nThe Time Traveller (for so it will be "
        "convenient to speak of him) was expounding a recondite matter to us.\n";
    const TextData d = load_text(textOptions(files.write("tm.txt", text)));
    const Counted want = countTokens(characters(d2lPreprocess(text)), 0);
    QCOMPARE(d.train->vocabulary, want.vocabulary);
    QCOMPARE(d.train->token_counts, want.counts);
    QCOMPARE(d.train->classes, static_cast<int64_t>(want.vocabulary.size()));
    QCOMPARE(d.train->vocabulary[1], std::string(" "));  // the most frequent character of English text
    QVERIFY(!d.test);

    TextOptions words = textOptions(files.path("tm.txt"), 3);
    words.tokens = TextOptions::Tokens::Word;
    const TextData w = load_text(words);
    const Counted wantWords = countTokens(d2lPreprocess(text).split(' ', Qt::SkipEmptyParts), 0);
    QCOMPARE(w.train->vocabulary, wantWords.vocabulary);
    QCOMPARE(w.train->token_counts, wantWords.counts);
  }

  void vocabulary_of_the_gpl_matches_an_independent_count() {
    const QByteArray text = gpl3();
    if (text.isEmpty()) QSKIP("/usr/share/common-licenses/GPL-3 is not installed");
    for (int64_t minFreq : {0, 5}) {
      TextOptions o = textOptions(kGpl3, 35);
      o.tokens = TextOptions::Tokens::Word;
      o.min_freq = minFreq;
      const TextData d = load_text(o);
      const Counted want = countTokens(d2lPreprocess(text).split(' ', Qt::SkipEmptyParts), minFreq);
      QCOMPARE(d.train->vocabulary.size(), want.vocabulary.size());
      QCOMPARE(d.train->vocabulary, want.vocabulary);
      QCOMPARE(d.train->token_counts, want.counts);
      QCOMPARE(d.train->vocabulary[1], std::string("the"));
    }
    // Without the preprocessing, every character is a token, capitals and punctuation too.
    TextOptions raw = textOptions(kGpl3);
    raw.preprocess = false;
    const TextData d = load_text(raw);
    const Counted want = countTokens(characters(QString::fromUtf8(text)), 0);
    QCOMPARE(d.train->vocabulary, want.vocabulary);
    QCOMPARE(d.train->token_counts, want.counts);
  }

  void windows_are_consecutive_and_targets_shift_by_one() {
    Files files;
    QByteArray text;
    for (int i = 0; i < 40; ++i) text += "abcdefghij klmnopqrst uvwxyz " + QByteArray::number(i) + "\n";
    const QString path = files.write("letters.txt", text);
    std::set<int64_t> offsets;
    for (uint64_t seed : {0, 1, 2, 3, 4, 5, 6, 7}) {
      TextOptions o = textOptions(path, 7);
      o.seed = seed;
      const DatasetPtr d = load_text(o).train;
      QVERIFY(d->has_values());
      QCOMPARE(d->sample_shape, Shape{7});
      QCOMPARE(d->target_shape, Shape{7});
      QCOMPARE(d->sample_numel(), int64_t(7));
      QCOMPARE(d->target_numel(), int64_t(7));
      const std::vector<int64_t> corpus = encode(*d, d2lPreprocess(text).toStdString());
      // The first window says where the windows start; every later one follows it.
      int64_t offset = -1;
      for (int64_t s = 0; s < 7 && offset < 0; ++s)
        if (std::equal(d->values.begin(), d->values.begin() + 7, corpus.begin() + s,
                       [](float v, int64_t id) { return v == static_cast<float>(id); }))
          offset = s;
      QVERIFY2(offset >= 0, "the first window is not at an offset below num_steps");
      offsets.insert(offset);
      QCOMPARE(d->count, (static_cast<int64_t>(corpus.size()) - offset - 1) / 7);
      for (int64_t j = 0; j < d->count; ++j)
        for (int64_t k = 0; k < 7; ++k) {
          QCOMPARE(d->values[j * 7 + k], static_cast<float>(corpus[offset + j * 7 + k]));
          QCOMPARE(d->targets[j * 7 + k], static_cast<float>(corpus[offset + j * 7 + k + 1]));
        }
    }
    QVERIFY2(offsets.size() > 1, "the seed does not move the offset");
  }

  // The lines partition against d2l 10.5's truncate_pad, written here from the line strings: each line
  // preprocessed by itself, <bos> line <eos> cut or padded with <pad> to T, the reserved ids after <unk>, the
  // last lines as the test split, and padding reaching a batch's pad_target so that the loss can leave it out.
  void the_lines_partition_pads_each_line_as_d2l_does() {
    Files files;
    const QByteArray text =
        "Go now.\r\n\n   \nI lost!\nA much longer line than the others, cut at num_steps.\nHi\nwe won\n";
    for (TokenUnit unit : {TokenUnit::Char, TokenUnit::Word}) {
      const int64_t steps = unit == TokenUnit::Char ? 8 : 4;
      TextOptions o = textOptions(files.write("lines.txt", text), steps);
      o.partition = TextOptions::Partition::Lines;
      o.tokens = unit;
      o.test_fraction = 0.4;  // 5 lines with tokens: the last 2 are the test split
      const TextData d = load_text(o);
      QVERIFY(d.test);
      // The independent cut: every line by itself, blank ones left out.
      std::vector<QStringList> lines;
      for (const QByteArray& raw : text.split('\n')) {
        const QString line = d2lPreprocess(raw).trimmed();
        if (line.isEmpty()) continue;
        lines.push_back(unit == TokenUnit::Char ? characters(line) : line.split(' ', Qt::SkipEmptyParts));
      }
      QCOMPARE(lines.size(), size_t(5));
      QStringList trainTokens;
      for (size_t l = 0; l < 3; ++l) trainTokens += lines[l];
      Counted want = countTokens(trainTokens, 0);
      want.vocabulary.insert(want.vocabulary.begin() + 1, {"<pad>", "<bos>", "<eos>"});
      want.counts.insert(want.counts.begin() + 1, {0, 0, 0});
      QCOMPARE(d.train->vocabulary, want.vocabulary);
      QCOMPARE(d.train->token_counts, want.counts);
      QCOMPARE(d.test->vocabulary, want.vocabulary);
      QCOMPARE(d.train->pad_target, int64_t(1));
      QCOMPARE(d.train->count, int64_t(3));
      QCOMPARE(d.test->count, int64_t(2));
      std::map<QString, float> id;
      for (size_t i = 0; i < want.vocabulary.size(); ++i) id[QString::fromStdString(want.vocabulary[i])] = float(i);
      for (size_t l = 0; l < lines.size(); ++l) {
        const Dataset& set = l < 3 ? *d.train : *d.test;
        const int64_t i = l < 3 ? int64_t(l) : int64_t(l - 3);
        // d2l: the input <bos> L, the target L <eos>, each through truncate_pad(·, T, <pad>).
        std::vector<float> ids;
        for (const QString& tok : lines[l]) ids.push_back(id.count(tok) ? id[tok] : 0.0f);
        std::vector<float> x{2}, y = ids;  // <bos>
        x.insert(x.end(), ids.begin(), ids.end());
        y.push_back(3);  // <eos>
        for (std::vector<float>* v : {&x, &y}) v->resize(size_t(steps), 1.0f);  // cut, or padded with <pad>
        QCOMPARE(row(set.values.data(), steps, i), x);
        QCOMPARE(row(set.targets.data(), steps, i), y);
      }
      // A batch says which labels are padding, and counts them.
      LoaderOptions lo;
      lo.batch_size = 3;
      lo.shuffle = false;
      DataLoader loader(d.train, lo);
      loader.start_epoch(0);
      const HostBatchPtr b = loader.next();
      QVERIFY(b);
      QCOMPARE(b->pad_target, int64_t(1));
      QCOMPARE(b->padded_targets(), int64_t(std::count(d.train->targets.begin(), d.train->targets.end(), 1.0f)));
      QVERIFY(b->padded_targets() > 0);
    }
    // Lines without tokens, or too few lines for both splits.
    TextOptions blank = textOptions(files.write("blank.txt", "\n  \n!!!\n"), 4);
    blank.partition = TextOptions::Partition::Lines;
    expect_error([&] { load_text(blank); }, {"blank.txt", "no line with character tokens"});
    TextOptions one = textOptions(files.write("one.txt", "just one line\n"), 4);
    one.partition = TextOptions::Partition::Lines;
    one.test_fraction = 0.2;
    expect_error([&] { load_text(one); }, {"one.txt", "1 lines", "too few", "test_fraction"});
    one.test_fraction = 0;
    QCOMPARE(load_text(one).train->count, int64_t(1));
  }

  void the_random_partition_is_shuffled_every_epoch() {
    if (gpl3().isEmpty()) QSKIP("/usr/share/common-licenses/GPL-3 is not installed");
    const DatasetPtr d = load_text(textOptions(kGpl3, 10)).train;
    QVERIFY(!d->sequential);
    LoaderOptions lo;
    lo.batch_size = 64;
    lo.seed = 5;
    DataLoader loader(d, lo);
    std::vector<std::vector<std::vector<float>>> epochs;
    for (int64_t epoch : {0, 1}) {
      loader.start_epoch(epoch);
      std::vector<std::vector<float>> rows;
      while (HostBatchPtr b = loader.next()) {
        QCOMPARE(b->sample_shape, Shape{10});
        QCOMPARE(b->target_shape, Shape{10});
        for (int64_t i = 0; i < b->size; ++i) rows.push_back(row(b->images, 10, i));
      }
      epochs.push_back(rows);
    }
    std::multiset<std::vector<float>> all, first(epochs[0].begin(), epochs[0].end()),
        second(epochs[1].begin(), epochs[1].end());
    for (int64_t j = 0; j < d->count; ++j) all.insert(row(d->values.data(), 10, j));
    QVERIFY(first == all);  // every window once per epoch
    QVERIFY(second == all);
    QVERIFY(epochs[0] != epochs[1]);
  }

  void the_sequential_partition_continues_each_row_from_batch_to_batch() {
    if (gpl3().isEmpty()) QSKIP("/usr/share/common-licenses/GPL-3 is not installed");
    TextOptions o = textOptions(kGpl3, 9);
    o.partition = TextOptions::Partition::Sequential;
    o.seed = 3;
    const DatasetPtr d = load_text(o).train;
    QVERIFY(d->sequential);
    const int64_t batch = 8, steps = 9, nb = d->count / batch;
    LoaderOptions lo;
    lo.batch_size = batch;
    lo.shuffle = true;  // ignored for a sequential dataset
    DataLoader loader(d, lo);
    QCOMPARE(loader.batches_per_epoch(), nb);
    QCOMPARE(loader.samples_per_epoch(), nb * batch);
    for (int64_t epoch : {0, 1}) {
      loader.start_epoch(epoch);
      std::vector<HostBatchPtr> batches;
      while (HostBatchPtr b = loader.next()) batches.push_back(b);
      QCOMPARE(static_cast<int64_t>(batches.size()), nb);
      for (int64_t b = 0; b < nb; ++b) {
        QCOMPARE(batches[b]->size, batch);
        for (int64_t i = 0; i < batch; ++i) {
          // Row i of batch b is window i * nb + b ...
          QCOMPARE(row(batches[b]->images, steps, i), row(d->values.data(), steps, i * nb + b));
          QCOMPARE(row(batches[b]->labels, steps, i), row(d->targets.data(), steps, i * nb + b));
          // ... so it starts where row i of the batch before ended: its last target is this row's first
          // token.
          if (b > 0) QCOMPARE(batches[b]->images[i * steps], batches[b - 1]->labels[i * steps + steps - 1]);
        }
      }
    }
    // Shards take contiguous blocks of rows, the same in every batch, and resume where they were.
    for (int shards : {2, 3}) {
      std::vector<std::vector<HostBatchPtr>> mine(static_cast<size_t>(shards));
      for (int s = 0; s < shards; ++s) {
        LoaderOptions so = lo;
        so.shard = s, so.shards = shards;
        DataLoader sl(d, so);
        sl.start_epoch(0, 1);
        while (HostBatchPtr b = sl.next()) mine[s].push_back(b);
        QCOMPARE(static_cast<int64_t>(mine[s].size()), nb - 1);
      }
      for (int64_t b = 0; b + 1 < nb; ++b) {
        int64_t next = 0;
        for (int s = 0; s < shards; ++s) {
          const HostBatch& part = *mine[s][b];
          QCOMPARE(part.global_size, batch);
          QCOMPARE(part.size, batch * (s + 1) / shards - batch * s / shards);
          for (int64_t i = 0; i < part.size; ++i, ++next)
            QCOMPARE(row(part.images, steps, i), row(d->values.data(), steps, next * nb + b + 1));
        }
        QCOMPARE(next, batch);
      }
    }
    // Fewer windows than a batch: one batch of them all.
    LoaderOptions big;
    big.batch_size = d->count + 5;
    DataLoader one(d, big);
    QCOMPARE(one.batches_per_epoch(), int64_t(1));
    one.start_epoch(0);
    QCOMPARE(one.next()->size, d->count);
  }

  void rare_tokens_become_unknown() {
    Files files;
    const QByteArray text = "aaaa bbbb cc d aaaa bbbb cc d e <unk> <unk> aaaa\n";
    TextOptions o = textOptions(files.write("rare.txt", text), 2);
    o.tokens = TextOptions::Tokens::Word;
    o.preprocess = false;  // keeps the literal "<unk>"
    o.min_freq = 2;
    const DatasetPtr d = load_text(o).train;
    QCOMPARE(d->vocabulary, (std::vector<std::string>{"<unk>", "aaaa", "bbbb", "cc", "d"}));
    QCOMPARE(d->token_counts, (std::vector<int64_t>{3, 3, 2, 2, 2}));  // "e" and the two literal "<unk>"
    QCOMPARE(encode(*d, "aaaa e zzz <unk> d"), (std::vector<int64_t>{1, 0, 0, 0, 4}));
    // The windows hold the corpus's ids, rare tokens as 0, from an offset of 0 or 1 (num_steps 2).
    const std::vector<float> corpus{1, 2, 3, 4, 1, 2, 3, 4, 0, 0, 0, 1};
    bool found = false;
    for (size_t offset : {0, 1}) {
      const auto windows = static_cast<int64_t>((corpus.size() - offset - 1) / 2);
      found = found || (d->count == windows &&
                        std::equal(d->values.begin(), d->values.end(), corpus.begin() + offset) &&
                        std::equal(d->targets.begin(), d->targets.end(), corpus.begin() + offset + 1));
    }
    QVERIFY(found);
  }

  void encode_and_decode_round_trip() {
    if (gpl3().isEmpty()) QSKIP("/usr/share/common-licenses/GPL-3 is not installed");
    const DatasetPtr chars = load_text(textOptions(kGpl3)).train;
    const std::string prompt = "time traveller";
    QCOMPARE(decode(*chars, encode(*chars, prompt)), prompt);
    // Encoding cuts as the dataset did: the preprocessing lowers case and folds punctuation into a space.
    QCOMPARE(decode(*chars, encode(*chars, "Time,  Traveller!")), std::string("time traveller "));
    TextOptions wo = textOptions(kGpl3, 5);
    wo.tokens = TextOptions::Tokens::Word;
    const DatasetPtr words = load_text(wo).train;
    QCOMPARE(words->tokenizer.unit, TokenUnit::Word);
    QCOMPARE(decode(*words, encode(*words, "the  program\nis free")), std::string("the program is free"));
    QCOMPARE(decode(*words, encode(*words, "the quixotically program")), std::string("the <unk> program"));
    expect_error(
        [&] {
          decode(*words, {1, static_cast<int64_t>(words->vocabulary.size())});
        },
        {"token id", "outside the vocabulary"});
    expect_error([&] { encode(*words, "bad \xff byte"); }, {"prompt", "UTF-8", "byte offset 4"});
    expect_error([&] { encode(*make_synthetic({}), "x"); }, {"no vocabulary"});
  }

  void the_test_split_is_the_end_of_the_corpus_with_the_training_vocabulary() {
    Files files;
    QByteArray text;
    for (int i = 0; i < 30; ++i) text += "abc abd ";
    text += "xyz xyz xyz xyz abc";  // x, y and z appear only in the last part
    TextOptions o = textOptions(files.write("end.txt", text), 4);
    o.test_fraction = 0.1;
    o.partition = TextOptions::Partition::Sequential;
    const TextData d = load_text(o);
    QVERIFY(d.test);
    QCOMPARE(d.test->vocabulary, d.train->vocabulary);
    QCOMPARE(d.test->name, std::string("text/test"));
    QVERIFY(d.test->sequential);
    const std::set<std::string> vocab(d.train->vocabulary.begin(), d.train->vocabulary.end());
    QVERIFY(!vocab.count("x") && !vocab.count("y") && !vocab.count("z"));
    const int64_t tokens = d2lPreprocess(text).size(), test = std::llround(0.1 * tokens);
    QCOMPARE(d.test->count, (test - 1) / 4);  // from offset 0
    const std::vector<int64_t> tail = encode(*d.train, d2lPreprocess(text).right(test).toStdString());
    for (int64_t k = 0; k < d.test->count * 4; ++k) QCOMPARE(d.test->values[k], static_cast<float>(tail[k]));
    QVERIFY(std::count(d.test->values.begin(), d.test->values.end(), 0.0f) >= 4);  // x, y, z are <unk>
  }

  // --- series
  // -----------------------------------------------------------------------------------------------

  void the_made_series_is_d2ls() {
    const SeriesData s = load_series({});
    QVERIFY(s.train && s.test);
    QCOMPARE(s.train->count, int64_t(600));  // d2l trains on the first 600 of 1000
    QCOMPARE(s.test->count, int64_t(1000 - 4 - 600));
    QVERIFY(s.train->regression);
    QCOMPARE(s.train->classes, int64_t(1));
    QCOMPARE(s.train->sample_shape, Shape{4});
    QCOMPARE(s.train->target_shape, Shape{});
    QCOMPARE(s.train->target_numel(), int64_t(1));
    const std::vector<float>& x = *s.train->series;
    QCOMPARE(x.size(), size_t(1000));
    QCOMPARE(s.test->series.get(), s.train->series.get());
    // x_t = sin(0.01 t) + N(0, 0.2) for t = 1..1000.
    double sum = 0, squares = 0;
    for (int t = 1; t <= 1000; ++t) {
      const double noise = x[t - 1] - std::sin(0.01 * t);
      sum += noise, squares += noise * noise;
    }
    const double mean = sum / 1000, sd = std::sqrt(squares / 1000 - mean * mean);
    QVERIFY2(std::abs(mean) < 0.03 && sd > 0.18 && sd < 0.22, qPrintable(QString("%1 %2").arg(mean).arg(sd)));
    // Samples are the tau values before each target, split by time.
    for (const DatasetPtr& d : {s.train, s.test})
      for (int64_t i = 0; i < d->count; ++i) {
        const int64_t t = d->series_first + i;
        QCOMPARE(d->targets[i], x[t]);
        for (int64_t k = 0; k < 4; ++k) QCOMPARE(d->values[i * 4 + k], x[t - 4 + k]);
      }
    QCOMPARE(s.train->series_first, int64_t(4));
    QCOMPARE(s.test->series_first, int64_t(604));
    // The seed picks the noise.
    SeriesOptions other;
    other.seed = 1;
    QVERIFY(*load_series(other).train->series != x);
    QVERIFY(*load_series({}).train->series == x);
  }

  void a_series_from_a_csv_column() {
    Files files;
    const QString path = files.write("s.csv",
                                     "date,value,note\r\n2024-01-01,1.5,a\r\n2024-01-02,2.5,b\r\n"
                                     "2024-01-03,-3,c\r\n2024-01-04,4e1,d\r\n2024-01-05,+5,e\r\n");
    SeriesOptions o;
    o.path = path.toStdString();
    o.tau = 2;
    o.test_fraction = 0;
    const SeriesData s = load_series(o);  // the only numeric column
    QCOMPARE(*s.train->series, (std::vector<float>{1.5f, 2.5f, -3, 40, 5}));
    QCOMPARE(s.train->count, int64_t(3));
    QVERIFY(!s.test);
    QCOMPARE(s.train->values, (std::vector<float>{1.5f, 2.5f, 2.5f, -3, -3, 40}));
    QCOMPARE(s.train->targets, (std::vector<float>{-3, 40, 5}));
    o.column = "note";
    expect_error([&] { load_series(o); }, {"line 2", "'note'", "number 3", "'a'", "not a number"});
    o.column = "price";
    expect_error([&] { load_series(o); }, {"no column 'price'", "'date', 'value', 'note'"});
    o.column.clear();
    o.path = files.write("two.csv", "a,b\n1,2\n3,4\n").toStdString();
    expect_error([&] { load_series(o); }, {"several columns", "'a', 'b'"});
    o.path = files.write("short.csv", "a\n1\n2\n").toStdString();
    expect_error([&] { load_series(o); }, {"2 values", "tau = 2"});
  }

  // --- bad files
  // --------------------------------------------------------------------------------------------

  void every_bad_file_is_one_clear_message() {
    Files files;
    auto text = [&](const QString& name, const QByteArray& bytes, int64_t steps = 3) {
      return textOptions(files.write(name, bytes), steps);
    };
    expect_error([&] { load_text(text("latin1.txt", "abc\ndef\xe9gh\n")); },
                 {"latin1.txt", "not UTF-8", "0xE9", "byte offset 7", "line 2", "column 4"});
    expect_error([&] { load_text(text("overlong.txt", "ab\xc0\xaf")); }, {"byte offset 2", "0xC0"});
    expect_error([&] { load_text(text("surrogate.txt", "ab\xed\xa0\x80")); }, {"surrogate", "byte offset 2"});
    expect_error([&] { load_text(text("cut.txt", "abcd\xe2\x82")); }, {"cut short", "byte offset 4"});
    expect_error([&] { load_text(text("nul.txt", QByteArray("ab\0cd", 5))); },
                 {"nul.txt", "NUL", "byte offset 2", "line 1", "column 3"});
    expect_error([&] { load_text(text("utf16.txt", QByteArray("a\0b\0c\0", 6))); }, {"UTF-16"});
    expect_error([&] { load_text(text("empty.txt", "")); }, {"empty.txt", "is empty"});
    expect_error([&] { load_text(textOptions(files.path("missing.txt"))); },
                 {"missing.txt", "does not exist"});
    expect_error([&] { load_text(textOptions(files.path(""))); }, {"is a directory"});
    expect_error([&] { load_text(TextOptions{}); }, {"no file given"});
    const QString fifo = files.path("fifo");
    QCOMPARE(::mkfifo(qPrintable(fifo), 0600), 0);
    expect_error([&] { load_text(textOptions(fifo)); },
                 {"fifo", "not a regular file"});  // and does not block
    expect_error([&] { load_text(text("short.txt", "abc", 35)); }, {"short.txt", "3 character tokens", "36"});
    TextOptions split = text("split.txt", "abcdefghijklmnopqrstuvwxyz", 3);
    split.test_fraction = 0.1;
    expect_error([&] { load_text(split); }, {"test split", "last 3 of 26", "4 tokens"});
    TextOptions small = text("big.txt", QByteArray(200, 'a'));
    small.max_bytes = 100;
    expect_error([&] { load_text(small); }, {"big.txt", "200 B", "more than", "max_bytes"});

    TableOptions t;
    t.target = "y";
    t.test_fraction = 0;
    auto table = [&](const QString& name, const QByteArray& bytes) {
      t.path = files.write(name, bytes).toStdString();
      return t;
    };
    expect_error([&] { load_table(table("ragged.csv", "a,b,y\n1,2,3\n1,2\n")); },
                 {"ragged.csv", "line 3", "has 2 fields", "header has 3"});
    expect_error([&] { load_table(table("word.csv", "a,b,y\n1,2,3\n\n1,x7,3\n")); },
                 {"word.csv", "line 4", "'b'", "number 2", "'x7'", "not a number"});
    expect_error([&] { load_table(table("nan.csv", "a,y\nnan,1\n")); }, {"line 2", "'nan'"});
    expect_error([&] { load_table(table("empty-cell.csv", "a,y\n,1\n")); }, {"line 2", "''"});
    expect_error([&] { load_table(table("no-target.csv", "a,b,price\n1,2,3\n")); },
                 {"no-target.csv", "no column 'y'", "'a', 'b', 'price'"});
    expect_error([&] { load_table(table("quote.csv", "a,b,y\n1,\"2,3\n4,5,6\n")); },
                 {"quote.csv", "never closed", "line 2, column 3"});
    expect_error([&] { load_table(table("after-quote.csv", "a,y\n\"1\"2,3\n")); },
                 {"line 2", "after its closing"});
    expect_error([&] { load_table(table("twice.csv", "a,a,y\n1,2,3\n")); }, {"'a' twice", "columns 1 and 2"});
    expect_error([&] { load_table(table("header-only.csv", "a,y\n")); }, {"no rows"});
    expect_error([&] { load_table(table("blank-target.csv", "a,y\n1,\n")); }, {"line 2", "'y'", "is empty"});
    expect_error([&] { load_table(table("nul.csv", QByteArray("a,y\n1,\0\n", 8))); }, {"NUL", "line 2"});
    t.target.clear();
    expect_error([&] { load_table(table("unnamed.csv", "a,y\n1,2\n")); }, {"no column is named", "'a', 'y'"});
    t.target = "y";
    t.test_fraction = 0.5;
    expect_error([&] { load_table(table("one-row.csv", "a,y\n1,2\n")); }, {"too few rows"});
  }

  void hostile_files_neither_crash_nor_hang() {
    Files files;
    // One line of 8 MB: a header of one huge name, then nothing.
    TableOptions t;
    t.target = "y";
    t.path = files.write("huge-line.csv", QByteArray(8 << 20, 'x')).toStdString();
    const std::string message = expect_error([&] { load_table(t); }, {"no column 'y'", "bytes)"});
    QVERIFY2(message.size() < 400, message.c_str());  // the name is cut for the message
    // A quote that never closes, over megabytes.
    t.path = files.write("open-quote.csv", "a,y\n1,\"" + QByteArray(4 << 20, 'q')).toStdString();
    expect_error([&] { load_table(t); }, {"never closed", "line 2"});
    // A text of one 4 MB line loads: one token, repeated.
    TextOptions o = textOptions(files.write("huge-line.txt", QByteArray(4 << 20, 'z')), 64);
    const DatasetPtr d = load_text(o).train;
    QCOMPARE(d->vocabulary, (std::vector<std::string>{"<unk>", "z"}));
    // By lines: the 4 MB line is one sample, cut to num_steps; four million line breaks are no samples, and
    // a million one-letter lines are a million samples.
    o.partition = TextOptions::Partition::Lines;
    const DatasetPtr one = load_text(o).train;
    QCOMPARE(one->count, int64_t(1));
    QCOMPARE(one->values[63], 4.0f);   // <bos> then 63 of "z" (id 4 after the reserved tokens)
    QCOMPARE(one->targets[63], 4.0f);     // cut: no <eos> in sight
    TextOptions breaks = textOptions(files.write("breaks.txt", QByteArray(4 << 20, '\n')), 64);
    breaks.partition = TextOptions::Partition::Lines;
    expect_error([&] { load_text(breaks); }, {"breaks.txt", "no line with"});
    QByteArray many;
    for (int i = 0; i < 1000000; ++i) many += "a\n";
    TextOptions short_lines = textOptions(files.write("many.txt", many), 3);
    short_lines.partition = TextOptions::Partition::Lines;
    QCOMPARE(load_text(short_lines).train->count, int64_t(1000000));
    // Random bytes: refused as not UTF-8 (or NUL), never a crash.
    QByteArray noise(1 << 16, '\0');
    uint32_t state = 12345;
    for (char& c : noise) c = static_cast<char>((state = state * 1664525u + 1013904223u) >> 24);
    t.path = files.write("noise.csv", noise).toStdString();
    expect_error([&] { load_table(t); }, {"noise.csv", "byte offset"});
    expect_error([&] { load_text(textOptions(QString::fromStdString(t.path))); }, {"byte offset"});
  }

  // --- the loader, for both kinds
  // -----------------------------------------------------------------------------

  void image_batches_are_shaped_as_before() {
    Runtime rt;
    SyntheticOptions so;
    so.count = 20;
    const DatasetPtr images = make_synthetic(so);
    QVERIFY(!images->has_values());
    QCOMPARE(images->sample_dims(), (Shape{1, 28, 28}));
    QCOMPARE(images->target_dims(), Shape{});
    QCOMPARE(images->sample_numel(), int64_t(784));
    QCOMPARE(images->target_numel(), int64_t(1));
    for (int64_t resize : {0, 32}) {
      LoaderOptions lo;
      lo.batch_size = 8;
      lo.shuffle = false;
      lo.resize = resize;
      DataLoader loader(images, lo);
      loader.start_epoch(0);
      const HostBatchPtr b = loader.next();
      const int64_t side = resize ? resize : 28;
      QCOMPARE(b->channels, int64_t(1));
      QCOMPARE(b->height, side);
      QCOMPARE(b->sample_shape, (Shape{1, side, side}));
      QCOMPARE(b->target_shape, Shape{});
      const DeviceBatch db = to_device(rt, b, 2, 5, Device::cpu());
      QCOMPARE(db.images.shape(), (Shape{3, 1, side, side}));
      QCOMPARE(db.labels.shape(), Shape{3});
      QCOMPARE(to_host(db.labels), (std::vector<float>{float(images->labels[2]), float(images->labels[3]),
                                                       float(images->labels[4])}));
      if (!resize) QCOMPARE(to_host(db.images)[0], images->images[2 * 784] * (1.0f / 255.0f));
    }
    // A batch made by hand with only channels, height and width is [n, C, H, W] as it was.
    std::vector<float> pixels(2 * 3 * 4 * 5, 0.5f), labels{1, 0};
    auto hand = std::make_shared<HostBatch>();
    hand->size = 2, hand->channels = 3, hand->height = 4, hand->width = 5;
    hand->images = pixels.data(), hand->labels = labels.data();
    QCOMPARE(hand->sample_numel(), int64_t(60));
    const DeviceBatch db = to_device(rt, hand, 0, 2, Device::cpu());
    QCOMPARE(db.images.shape(), (Shape{2, 3, 4, 5}));
    QCOMPARE(db.labels.shape(), Shape{2});
    // The copy is queued: it must run before the vectors it reads go (ASan caught the test leaving first).
    QCOMPARE(to_host(db.labels), labels);
    QCOMPARE(to_host(db.images), pixels);
  }

  void value_batches_reach_the_device_as_they_are() {
    if (gpl3().isEmpty()) QSKIP("/usr/share/common-licenses/GPL-3 is not installed");
    Runtime rt;
    const DatasetPtr d = load_text(textOptions(kGpl3, 6)).train;
    LoaderOptions lo;
    lo.batch_size = 4;
    lo.shuffle = false;
    DataLoader loader(d, lo);
    loader.start_epoch(0);
    const HostBatchPtr b = loader.next();
    QCOMPARE(b->channels, int64_t(0));
    QCOMPARE(b->sample_numel(), int64_t(6));
    QCOMPARE(b->target_numel(), int64_t(6));
    const DeviceBatch db = to_device(rt, b, 1, 3, Device::cpu());
    QCOMPARE(db.images.shape(), (Shape{2, 6}));
    QCOMPARE(db.labels.shape(), (Shape{2, 6}));
    QCOMPARE(to_host(db.images), std::vector<float>(d->values.begin() + 6, d->values.begin() + 18));
    QCOMPARE(to_host(db.labels), std::vector<float>(d->targets.begin() + 6, d->targets.begin() + 18));
    // copy_batch_into takes the same shapes, and refuses others.
    const DeviceBatch into{Tensor(rt, {2, 6}, Device::cpu()), Tensor(rt, {2, 6}, Device::cpu())};
    copy_batch_into(b, 2, into);
    QCOMPARE(to_host(into.labels), std::vector<float>(d->targets.begin() + 12, d->targets.begin() + 24));
    const DeviceBatch wrong{Tensor(rt, {2, 6}, Device::cpu()), Tensor(rt, {2}, Device::cpu())};
    expect_error([&] { copy_batch_into(b, 0, wrong); }, {"do not fit"});

    // A table's scalar targets are [n].
    Files files;
    TableOptions to;
    to.path = files.write("t.csv", "a,b,y\n1,2,0\n3,4,1\n5,6,0\n").toStdString();
    to.target = "y";
    to.test_fraction = 0;
    LoaderOptions tl;
    tl.batch_size = 2;
    tl.shuffle = false;
    DataLoader tables(load_table(to).train, tl);
    tables.start_epoch(0);
    const DeviceBatch tb = to_device(rt, tables.next(), 0, 2, Device::cpu());
    QCOMPARE(tb.images.shape(), (Shape{2, 2}));
    QCOMPARE(tb.labels.shape(), Shape{2});
    QCOMPARE(to_host(tb.labels), (std::vector<float>{0, 1}));
  }

  void take_keeps_values_and_the_loader_refuses_what_does_not_fit() {
    if (gpl3().isEmpty()) QSKIP("/usr/share/common-licenses/GPL-3 is not installed");
    const DatasetPtr d = load_text(textOptions(kGpl3, 5)).train;
    const DatasetPtr few = take(d, 3);
    QCOMPARE(few->count, int64_t(3));
    QCOMPARE(few->values, std::vector<float>(d->values.begin(), d->values.begin() + 15));
    QCOMPARE(few->targets, std::vector<float>(d->targets.begin(), d->targets.begin() + 15));
    QCOMPARE(few->vocabulary, d->vocabulary);
    LoaderOptions lo;
    lo.resize = 32;
    expect_error([&] { DataLoader loader(d, lo); }, {"resize applies to images"});
    auto broken = std::make_shared<Dataset>(*few);
    broken->values.pop_back();
    expect_error([&] { DataLoader loader(broken, {}); }, {"14 values", "3 samples"});
    expect_error([&] { channel_stats(*d); }, {"holds values"});
  }
};

QTEST_GUILESS_MAIN(SequenceDataTest)
#include "test_sequence_data.moc"
