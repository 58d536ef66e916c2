// Tables from CSV files: the target and feature columns, the task, a seeded (stratified) test split, and
// features standardised with the training split's statistics.
#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "data_files.h"
#include "gpunodes/errors.h"
#include "gpunodes/nn/sequence_data.h"

namespace gn::nn {
namespace {

// The file's rows as the loader needs them: feature values row by row, each target's text, each row's line.
struct TableRows {
  CsvHeader header;
  int64_t target = -1;
  std::vector<int64_t> features;  // columns
  std::vector<double> x;          // rows * features
  std::vector<std::string> y;
  std::vector<int64_t> lines;
  size_t rows() const { return y.size(); }
};

std::vector<int64_t> feature_columns(const TableOptions& o, const CsvHeader& header, int64_t target) {
  std::vector<int64_t> columns;
  if (o.features.empty()) {
    for (size_t c = 0; c < header.names.size(); ++c)
      if (static_cast<int64_t>(c) != target) columns.push_back(static_cast<int64_t>(c));
    if (columns.empty())
      throw Error("table: " + o.path + " has no column besides the target " + quote_for_message(o.target) +
                  " to predict it from");
    return columns;
  }
  std::set<std::string> named;
  for (const std::string& name : o.features) {
    const int64_t c = header.find(name);
    if (c < 0) throw_no_such_column("table", o.path, header, name, "a feature");
    if (c == target)
      throw Error("table: the target " + quote_for_message(name) + " cannot also be a feature");
    if (!named.insert(name).second)
      throw Error("table: the feature " + quote_for_message(name) + " is named twice");
    columns.push_back(c);
  }
  return columns;
}

TableRows read_rows(const TableOptions& o) {
  const std::string file = read_data_file(o.path, o.max_bytes, "table");
  check_utf8_text(file, "table", o.path);
  CsvReader reader(without_bom(file), "table", o.path);
  TableRows t;
  t.header = read_csv_header(reader, "table", o.path);
  t.target = o.target.empty() ? -1 : t.header.find(o.target);
  if (t.target < 0) throw_no_such_column("table", o.path, t.header, o.target, "the target");
  t.features = feature_columns(o, t.header, t.target);
  std::vector<std::string> fields;
  while (reader.next(fields)) {
    check_field_count(reader, fields, t.header);
    for (int64_t c : t.features) {
      double v;
      if (!parse_number(fields[c], v))
        throw_not_a_number(reader, t.header, static_cast<size_t>(c), fields[c]);
      t.x.push_back(v);
    }
    if (fields[t.target].empty())
      throw Error(reader.where() + ": the target " + quote_for_message(o.target) + " (column " +
                  std::to_string(t.target + 1) + ") is empty");
    t.y.push_back(std::move(fields[t.target]));
    t.lines.push_back(reader.line());
  }
  if (t.rows() == 0) throw Error("table: " + o.path + " has a header but no rows");
  return t;
}

// Class names sorted (by value when every one is a number) and each row's class index.
std::vector<std::string> classify(const TableRows& t, std::vector<float>& targets) {
  std::map<std::string, double> distinct;  // text -> its number, NaN when it is none
  for (const std::string& y : t.y) {
    double v;
    distinct.emplace(y, parse_number(y, v) ? v : NAN);
  }
  std::vector<std::string> names;
  for (const auto& entry : distinct) names.push_back(entry.first);
  const bool numbers =
      std::all_of(distinct.begin(), distinct.end(), [](const auto& e) { return !std::isnan(e.second); });
  if (numbers)
    std::stable_sort(names.begin(), names.end(), [&](const std::string& a, const std::string& b) {
      return distinct.at(a) < distinct.at(b);
    });
  std::map<std::string, float> index;
  for (size_t i = 0; i < names.size(); ++i) index[names[i]] = static_cast<float>(i);
  targets.resize(t.rows());
  for (size_t r = 0; r < t.rows(); ++r) targets[r] = index[t.y[r]];
  return names;
}

// Test rows: per class (or over all rows for regression, one "class"), round(f * n) of its n rows, at least
// one and at most n - 1, drawn with the seed. Both lists come back in the file's order.
void split_rows(const std::vector<float>& targets, bool stratified, int64_t classes, const TableOptions& o,
                std::vector<int64_t>& train, std::vector<int64_t>& test) {
  const auto rows = static_cast<int64_t>(targets.size());
  std::vector<std::vector<int64_t>> groups(static_cast<size_t>(stratified ? classes : 1));
  for (int64_t r = 0; r < rows; ++r) groups[stratified ? static_cast<size_t>(targets[r]) : 0].push_back(r);
  for (size_t g = 0; g < groups.size(); ++g) {
    const std::vector<int64_t>& members = groups[g];
    const auto n = static_cast<int64_t>(members.size());
    const int64_t held =
        o.test_fraction > 0 && n >= 2
            ? std::clamp<int64_t>(std::llround(o.test_fraction * static_cast<double>(n)), 1, n - 1)
            : 0;
    const std::vector<int64_t> order = shuffled_indices(n, o.seed, static_cast<int64_t>(g));
    for (int64_t k = 0; k < n; ++k) (k < held ? test : train).push_back(members[order[k]]);
  }
  std::sort(train.begin(), train.end());
  std::sort(test.begin(), test.end());
  if (o.test_fraction > 0 && test.empty())
    throw Error("table: " + o.path + " has too few rows to hold out a test split (" + std::to_string(rows) +
                (stratified ? " rows, no class with two or more" : " rows") + ")");
}

}  // namespace

TableData load_table(const TableOptions& o) {
  if (!(o.test_fraction >= 0 && o.test_fraction < 1))
    throw Error("table: test_fraction must be in [0, 1), not " + std::to_string(o.test_fraction));
  if (o.max_bytes < 0) throw Error("table: max_bytes must be 0 (automatic) or a size");
  const TableRows t = read_rows(o);
  const size_t rows = t.rows(), features = t.features.size();

  bool regression = o.task == TableOptions::Task::Regression;
  if (o.task == TableOptions::Task::Auto) {
    double v;
    regression =
        std::all_of(t.y.begin(), t.y.end(), [&](const std::string& y) { return parse_number(y, v); });
  }
  std::vector<float> targets(rows);
  std::vector<std::string> class_names;
  if (regression) {
    for (size_t r = 0; r < rows; ++r) {
      double v;
      if (!parse_number(t.y[r], v))
        throw Error("table: " + o.path + ", line " + std::to_string(t.lines[r]) + ": column " +
                    quote_for_message(o.target) + " (number " + std::to_string(t.target + 1) + ") holds " +
                    quote_for_message(t.y[r]) + ", which is not a number (the task is regression)");
      targets[r] = static_cast<float>(v);
    }
  } else {
    class_names = classify(t, targets);
  }
  const int64_t classes = regression ? 1 : static_cast<int64_t>(class_names.size());
  std::vector<int64_t> train_rows, test_rows;
  split_rows(targets, !regression, classes, o, train_rows, test_rows);

  // The training split's mean and population standard deviation of each feature, in float64.
  std::vector<double> mean(features, 0.0), std_dev(features, 1.0);
  for (size_t f = 0; f < features; ++f) {
    const double first = t.x[static_cast<size_t>(train_rows[0]) * features + f];
    bool constant = true;
    double sum = 0;
    for (int64_t r : train_rows) {
      const double v = t.x[static_cast<size_t>(r) * features + f];
      sum += v;
      constant = constant && v == first;
    }
    mean[f] = sum / static_cast<double>(train_rows.size());
    if (constant) continue;  // std 1: nothing to scale, and no division by zero
    double squares = 0;
    for (int64_t r : train_rows) {
      const double d = t.x[static_cast<size_t>(r) * features + f] - mean[f];
      squares += d * d;
    }
    std_dev[f] = std::sqrt(squares / static_cast<double>(train_rows.size()));
  }

  std::vector<std::string> feature_names;
  for (int64_t c : t.features) feature_names.push_back(t.header.names[c]);
  auto split = [&](const std::vector<int64_t>& picked, const char* name) {
    auto d = std::make_shared<Dataset>();
    d->name = std::string("table/") + name;
    d->source = o.path;
    d->count = static_cast<int64_t>(picked.size());
    d->channels = d->height = d->width = 0;
    d->classes = classes;
    d->class_names = class_names;
    d->regression = regression;
    d->sample_shape = {static_cast<int64_t>(features)};
    d->target_shape = {};
    d->values.resize(picked.size() * features);
    d->targets.resize(picked.size());
    for (size_t i = 0; i < picked.size(); ++i) {
      const auto r = static_cast<size_t>(picked[i]);
      for (size_t f = 0; f < features; ++f)
        d->values[i * features + f] = static_cast<float>((t.x[r * features + f] - mean[f]) / std_dev[f]);
      d->targets[i] = targets[r];
    }
    d->feature_names = feature_names;
    d->feature_mean = mean;
    d->feature_std = std_dev;
    return d;
  };
  TableData out;
  out.train = split(train_rows, "train");
  if (o.test_fraction > 0) out.test = split(test_rows, "test");
  return out;
}

}  // namespace gn::nn
