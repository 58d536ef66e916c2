// Datasets that are not images, as value datasets (Dataset::has_values()) the DataLoader serves as they are:
// text for language models (d2l 9.2-9.3), a time series (d2l 9.1) and tables from CSV files. Each loader
// reads its whole file, refuses a bad one with one gn::Error that names the file and where in it (line and
// column, or the byte offset), and checks the file's size against a limit before reading it.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "gpunodes/nn/data.h"

namespace gn::nn {

// --- text ------------------------------------------------------------------------------------------------

struct TextOptions {
  std::string path;  // a UTF-8 text file (a leading byte order mark is skipped)
  using Tokens = TokenUnit;
  // Char: every character is a token, spaces included; Word: what lies between runs of whitespace.
  Tokens tokens = Tokens::Char;
  bool preprocess = true;  // d2l's: runs of anything but the letters A-Z, a-z become one space, lower case
  // Tokens seen fewer times than this in the training text become "<unk>" (0 or 1: every token is kept).
  int64_t min_freq = 0;
  int64_t num_steps = 35;  // T: tokens per sample
  // Random: the loader shuffles the windows every epoch (when its options say so). Sequential: it reads them
  // in d2l's seq_data_iter_sequential order, so that a recurrent network can carry its state between
  // batches (Dataset::sequential, LoaderOptions::shuffle). Lines: one sample per line, padded (below).
  enum class Partition { Random, Sequential, Lines } partition = Partition::Random;
  // The end of the corpus, this fraction of its tokens, is the test split, in [0, 1); 0: no test split.
  double test_fraction = 0;
  uint64_t seed = 0;      // draws the training windows' offset
  int64_t max_bytes = 0;  // the largest file read; 0: 1/32 of physical memory
};

// The training split, and the test split (null when test_fraction is 0) with the training split's vocabulary.
struct TextData {
  DatasetPtr train, test;
};

// Reads a text as d2l 9.2-9.3 does. The corpus is the file's tokens (after the preprocessing).
//
// The vocabulary counts the training tokens (the corpus before the test split): "<unk>" is id 0, then every
// token seen at least min_freq times, most frequent first and, among equally frequent ones, in order of first
// appearance (what d2l's sorted Counter gives). A token the vocabulary leaves out, including one that appears
// only in the test split, is id 0, and so is a literal "<unk>" word; token_counts[0] counts the training
// tokens that became id 0.
//
// Samples are the non-overlapping windows of num_steps tokens, x = corpus[s : s + T] and y = corpus[s + 1 :
// s + T + 1] for s = offset, offset + T, ... while s + T + 1 fits. The training split's offset is drawn from
// `seed` in [0, T) (lower when the text is too short for one window after it) once; d2l draws a new one each
// epoch, whereas here every epoch reads the same windows, in a new order for the random partition. The test
// split starts at offset 0. Values and targets are token ids as floats (exact: the vocabulary is smaller
// than 2^24), sample_shape and target_shape {T}, classes the vocabulary's size; Dataset::tokenizer says how
// the text was cut.
//
// The lines partition (d2l 10.5's sentences, padded): each line of the file that has a token is one sample,
// preprocessed and cut by itself (its line break and surrounding spaces dropped). The vocabulary reserves
// "<pad>" 1, "<bos>" 2 and "<eos>" 3 after "<unk>" (d2l's Vocab(reserved_tokens=[...]); counted 0; a token
// spelled as one of them is id 0). With the line's ids L, x = <bos> L and y = L <eos>, each cut to T or
// padded with <pad> (d2l's truncate_pad), so that every real token and the
// end of the line is a target, and padded steps have the target <pad>: Dataset::pad_target is 1, which the
// trainer's cross-entropy leaves out. A ValidLength (pad_id 1) on x gives min(|L| + 1, T). The last
// round(test_fraction * lines) lines are the test split; the lines keep the file's order (the loader shuffles
// them when asked).
//
// Refused: a file that is not UTF-8 or holds a NUL byte (its byte offset, line and column), empty, larger
// than max_bytes, with fewer tokens than one sample (num_steps + 1) in either split (by lines: without a line
// of tokens, or too few lines for one in each split), or with more than
// 10,000,000 distinct words (checked while counting, before any window is made).
TextData load_text(const TextOptions& options);

// The token ids of `s` cut as `text` (a dataset load_text made) cut its file, each unknown token 0. Throws
// Error when `text` has no vocabulary or `s` is not UTF-8.
std::vector<int64_t> encode(const Dataset& text, const std::string& s);
// The text of token ids: for character tokens their characters run together, for word tokens the words with
// one space between them. "<unk>" stands for id 0. Throws Error for an id outside the vocabulary.
std::string decode(const Dataset& text, const std::vector<int64_t>& ids);

// --- a series ---------------------------------------------------------------------------------------------

struct SeriesOptions {
  // A CSV file with a header row; empty: d2l 9.1's series x_t = sin(0.01 t) + N(0, 0.2) for t = 1..count.
  std::string path;
  std::string column;  // the column to read, by its header name; empty: the file's only numeric column
  int64_t tau = 4;     // each sample is the tau values before its target
  // The last part of the series by time is the test split, in [0, 1): the first round((1 - test_fraction) *
  // N) samples of N values train, as d2l trains on the first 600 of 1000. 0: no test split.
  double test_fraction = 0.4;
  uint64_t seed = 0;      // the noise of the made series
  int64_t count = 1000;   // the made series' length (without a path)
  int64_t max_bytes = 0;  // the largest file read; 0: 1/32 of physical memory
};

// Both splits are regression sets: sample i is (x_{i}, ..., x_{i+tau-1}) and its target x_{i+tau}
// (sample_shape {tau}, target_shape {}, classes 1), and each holds the whole series (Dataset::series, with
// series_first) for drawing d2l's one-step and k-step-ahead predictions, which need a model and so are the
// caller's. The test split is null when test_fraction is 0.
struct SeriesData {
  DatasetPtr train, test;
};
// Refused: a bad file (as for tables), a column that is not there or holds a non-number (its line, the
// column's name and number, the text), no or several numeric columns when none is named, a series too short
// for one sample per split (tau + 1 values at least).
SeriesData load_series(const SeriesOptions& options);

// --- attention pooling ------------------------------------------------------------------------------------

// d2l 11.2's data for Nadaraya-Watson kernel regression: `points` training inputs x_i, sorted, from U(0, 5),
// with y_i = 2 sin(x_i) + x_i^0.8 + N(0, 0.5), and as many test inputs evenly spaced from 0 (0, 0.1, ... for
// 50) with the noise-free targets. Each split is one sample [points, 3] of rows (query, key, value), with a
// target [points]: the training split's rows are (x_i, x_i, y_i), so every training point is a query over all
// of them (a NadarayaWatson layer leaves each query's own key out in training, as d2l does); the test split's
// are (x_test_i, x_i, y_i), the test inputs as queries over the training pairs. Regression sets.
struct AttentionPoolingData {
  DatasetPtr train, test;
};
AttentionPoolingData make_attention_pooling(int64_t points, uint64_t seed);

// --- a table -----------------------------------------------------------------------------------------------

struct TableOptions {
  std::string path;                   // a CSV file (RFC 4180, comma separated, LF or CRLF) with a header row
  std::string target;                 // the column to predict
  std::vector<std::string> features;  // the columns to predict it from, in this order; empty: all others
  // Auto: regression when every target is a number, classification when any is text.
  enum class Task { Auto, Classification, Regression } task = Task::Auto;
  double test_fraction = 0.2;  // in [0, 1); 0: no test split
  uint64_t seed = 0;           // draws the test rows
  int64_t max_bytes = 0;       // the largest file read; 0: 1/32 of physical memory
};

struct TableData {
  DatasetPtr train, test;  // test: null when test_fraction is 0
};

// Rows become samples of the feature values (sample_shape {features}, target_shape {}), standardised with the
// training split's mean and population standard deviation (Dataset::feature_mean, feature_std; a constant
// feature gets std 1), so that the test split is standardised as the training split was. Each split keeps
// the file's order.
// - Classification: targets are indices into class_names, the target's distinct texts sorted (by value when
//   all are numbers, else by their bytes). The test split takes round(test_fraction * n) of each class's n
//   rows, at least one and at most n - 1 (a class of one row stays in training), drawn with the seed: every
//   class of two rows or more is in both splits, in its proportion within one row.
// - Regression: targets are the raw numbers (not standardised; classes 1); the test rows are drawn with the
//   seed.
// Unquoted cells lose surrounding spaces and tabs; empty lines are skipped. Refused: a bad file (not UTF-8, a
// NUL byte, empty, too large, a quote never closed), a header that names a column twice, a target or feature
// that is not a column (the message lists the columns), a row whose field count is not the header's, a
// feature cell or a regression target that is not a number (line, column name and number, the text), an
// empty target, a table without rows or features, too few rows to split.
TableData load_table(const TableOptions& options);

}  // namespace gn::nn
