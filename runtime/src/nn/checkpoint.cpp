// Training checkpoints as safetensors files: the layout in checkpoint.h.
#include "gpunodes/nn/checkpoint.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <regex>
#include <sstream>

#include "gpunodes/errors.h"
#include "gpunodes/nn/safetensors.h"
#include "gpunodes/nn/serialize.h"

namespace gn::nn {
namespace {

constexpr const char* kVersion = "1";
constexpr const char* kVersionKey = "gpunodes.checkpoint";
constexpr const char* kSignatureKey = "gpunodes.signature";
constexpr const char* kSettingPrefix = "setting.";
constexpr const char* kModelPrefix = "model/";
constexpr const char* kOptimizerPrefix = "optimizer/";
// The epochs table: 9 columns up to the sequence metrics, 15 since (test loss, perplexity, MSE, MAE, R^2 and
// the training MSE).
constexpr int64_t kEpochColumnsBefore = 9, kEpochColumns = 15, kMetricColumns = 5;

// Doubles as text that reads back to the same bits.
std::string exact(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

template <typename T>
std::vector<char> bytes_of(const std::vector<T>& v) {
  const char* b = reinterpret_cast<const char*>(v.data());
  return std::vector<char>(b, b + v.size() * sizeof(T));
}

uint32_t crc_of(const char* data, size_t size) {
  uLong crc = crc32(0L, Z_NULL, 0);
  // zlib takes at most 4 GiB per call.
  while (size > 0) {
    const size_t n = std::min<size_t>(size, size_t(1) << 30);
    crc = crc32(crc, reinterpret_cast<const Bytef*>(data), static_cast<uInt>(n));
    data += n;
    size -= n;
  }
  return static_cast<uint32_t>(crc);
}

// Reads the fields of one file, each failure an Error naming the file and the field.
class Reader {
 public:
  Reader(const std::string& path, const std::vector<char>& file, const SafetensorsHeader& h)
      : path_(path), file_(file), h_(h) {}

  [[noreturn]] void fail(const std::string& what) const {
    throw Error("checkpoint " + path_ + " is corrupt: " + what);
  }
  const std::string& text(const std::string& key) const {
    const std::string* v = h_.find_metadata(key);
    if (!v) fail("its metadata has no '" + key + "'");
    return *v;
  }
  int64_t integer(const std::string& key) const {
    const std::string& s = text(key);
    errno = 0;
    char* end = nullptr;
    const long long v = std::strtoll(s.c_str(), &end, 10);
    if (s.empty() || *end || errno || v < 0) fail("'" + key + "' is not a count: '" + s + "'");
    return v;
  }
  std::vector<double> numbers(const std::string& key) const {
    std::vector<double> out;
    std::istringstream in(text(key));
    std::string word;
    while (in >> word) {
      char* end = nullptr;
      const double v = std::strtod(word.c_str(), &end);
      if (*end || !std::isfinite(v)) fail("'" + key + "' holds '" + word + "', not a number");
      out.push_back(v);
    }
    return out;
  }
  double number(const std::string& key) const {
    const std::vector<double> v = numbers(key);
    if (v.size() != 1) fail("'" + key + "' is not one number");
    return v[0];
  }
  const char* data(const SafetensorsEntry& t) const { return file_.data() + h_.data_start + t.begin; }
  std::vector<double> f64(const SafetensorsEntry& t, int64_t columns) const {
    if (t.dtype != "F64" || t.shape.size() != 2 || t.shape[1] != columns)
      fail("'" + t.name + "' is " + t.dtype + " " + shape_str(t.shape) + ", not F64 [n, " +
           std::to_string(columns) + "]");
    std::vector<double> v(static_cast<size_t>(t.shape[0] * columns));
    std::memcpy(v.data(), data(t), v.size() * sizeof(double));
    return v;
  }

 private:
  const std::string& path_;
  const std::vector<char>& file_;
  const SafetensorsHeader& h_;
};

// The first line where two texts differ, for a signature (a drawn network's is one line per layer).
std::string first_different_line(const std::string& a, const std::string& b) {
  std::istringstream ia(a), ib(b);
  std::string la, lb;
  while (true) {
    const bool more_a = static_cast<bool>(std::getline(ia, la));
    const bool more_b = static_cast<bool>(std::getline(ib, lb));
    if (!more_a && !more_b) return {};
    if (!more_a) la = "(nothing)";
    if (!more_b) lb = "(nothing)";
    if (la != lb || !more_a || !more_b) return "'" + la + "' against '" + lb + "'";
  }
}

}  // namespace

void write_checkpoint(const std::string& path, const TrainingCheckpoint& c) {
  std::vector<SafetensorsBlob> tensors;
  for (const auto& v : c.state)
    tensors.push_back({kModelPrefix + v.name, "F32", v.shape, float_bytes(v.values)});
  for (const auto& v : c.optimizer)
    tensors.push_back({kOptimizerPrefix + v.name, "F32", v.shape, float_bytes(v.values)});
  std::vector<double> epochs;
  for (const EpochResult& e : c.epochs)
    epochs.insert(epochs.end(),
                  {static_cast<double>(e.epoch), e.train_loss, e.train_acc, e.test_acc, e.seconds,
                   e.images_per_second, e.loader_ms_per_batch, e.step_ms, e.loader_wait_ms, e.test_loss,
                   e.test_perplexity, e.test_mse, e.test_mae, e.test_r2, e.train_mse});
  // safetensors has no empty tensors in practice; an empty table is one row of nothing left out.
  if (!c.epochs.empty())
    tensors.push_back(
        {"epochs", "F64", {static_cast<int64_t>(c.epochs.size()), kEpochColumns}, bytes_of(epochs)});
  std::vector<std::string> series;
  std::map<std::string, size_t> series_index;
  std::vector<double> metrics;
  for (const MetricSample& m : c.metrics) {
    auto [it, added] = series_index.emplace(m.series, series.size());
    if (added) series.push_back(m.series);
    metrics.insert(metrics.end(), {static_cast<double>(it->second), m.epoch, static_cast<double>(m.step),
                                   m.seconds, m.value});
  }
  if (!c.metrics.empty())
    tensors.push_back(
        {"metrics", "F64", {static_cast<int64_t>(c.metrics.size()), kMetricColumns}, bytes_of(metrics)});

  std::vector<std::pair<std::string, std::string>> meta{
      {"format", "pt"}, {kVersionKey, kVersion}, {kSignatureKey, c.signature}};
  for (const auto& [name, value] : c.settings) meta.emplace_back(kSettingPrefix + name, value);
  std::string shares, names;
  for (double s : c.shares) shares += (shares.empty() ? "" : " ") + exact(s);
  for (const std::string& s : series) names += (names.empty() ? "" : "\n") + s;
  meta.insert(meta.end(), {{"epoch", std::to_string(c.epoch)},
                           {"batch", std::to_string(c.batch)},
                           {"global_step", std::to_string(c.global_step)},
                           {"optimizer_steps", std::to_string(c.optimizer_steps)},
                           {"batches_tracked", std::to_string(c.batches_tracked)},
                           {"seconds", exact(c.seconds)},
                           {"epoch_seconds", exact(c.epoch_seconds)},
                           {"totals", exact(c.totals.loss_sum) + " " + exact(c.totals.correct) + " " +
                                          std::to_string(c.totals.samples) + " " + std::to_string(c.totals.padded)},
                           {"shares", shares},
                           {"metric_series", names}});
  if (c.loss_scale > 0)
    meta.emplace_back("loss_scale", exact(c.loss_scale) + " " + std::to_string(c.loss_scale_good_steps) + " " +
                                        std::to_string(c.skipped_steps));
  // The checksum covers the data, which the header does not depend on: encode once without it to learn
  // where the data starts, then again with it (the data bytes stay the same).
  meta.emplace_back("crc32", "0000000000");
  std::vector<char> file = encode_safetensors(meta, tensors);
  uint64_t header = 0;
  std::memcpy(&header, file.data(), 8);
  const size_t data_start = 8 + static_cast<size_t>(header);
  char crc[16];
  std::snprintf(crc, sizeof crc, "%010u", crc_of(file.data() + data_start, file.size() - data_start));
  meta.back().second = crc;
  file = encode_safetensors(meta, tensors);
  write_params_file(path, file);
}

TrainingCheckpoint read_checkpoint(const std::string& path) {
  const std::vector<char> file = read_params_file(path);
  if (!looks_like_safetensors(file.data(), file.size()))
    throw Error("checkpoint " + path + " is corrupt: it is not a safetensors file");
  const SafetensorsHeader h = parse_safetensors(file, path);
  Reader r(path, file, h);
  if (r.text(kVersionKey) != kVersion)
    throw Error("checkpoint " + path + " has format version " + r.text(kVersionKey) +
                "; this gpunodes reads version " + kVersion);
  const int64_t crc = r.integer("crc32");
  if (crc != crc_of(file.data() + h.data_start, file.size() - h.data_start))
    r.fail("checksum mismatch (the file was changed or truncated)");

  TrainingCheckpoint c;
  c.signature = r.text(kSignatureKey);
  const std::string prefix = kSettingPrefix;
  for (const auto& [key, value] : h.metadata)
    if (key.compare(0, prefix.size(), prefix) == 0) c.settings.emplace_back(key.substr(prefix.size()), value);
  c.epoch = r.integer("epoch");
  c.batch = r.integer("batch");
  c.global_step = r.integer("global_step");
  c.optimizer_steps = r.integer("optimizer_steps");
  c.batches_tracked = r.integer("batches_tracked");
  c.seconds = r.number("seconds");
  c.epoch_seconds = r.number("epoch_seconds");
  const std::vector<double> totals = r.numbers("totals");
  // A checkpoint written before padded targets were counted has three numbers: none was padding.
  auto count = [](double v) { return v >= 0 && v == std::floor(v); };
  if ((totals.size() != 3 && totals.size() != 4) || !count(totals[2]) || (totals.size() == 4 && !count(totals[3])))
    r.fail("'totals' is not 'loss_sum correct samples padded'");
  c.totals.loss_sum = totals[0];
  c.totals.correct = totals[1];
  c.totals.samples = static_cast<int64_t>(totals[2]);
  c.totals.padded = totals.size() == 4 ? static_cast<int64_t>(totals[3]) : 0;
  c.shares = r.numbers("shares");
  if (h.find_metadata("loss_scale")) {
    const std::vector<double> ls = r.numbers("loss_scale");
    if (ls.size() != 3 || !(ls[0] > 0) || ls[1] < 0 || ls[1] != std::floor(ls[1]) || ls[2] < 0 ||
        ls[2] != std::floor(ls[2]))
      r.fail("'loss_scale' is not 'scale good_steps skipped_steps'");
    c.loss_scale = ls[0];
    c.loss_scale_good_steps = static_cast<int64_t>(ls[1]);
    c.skipped_steps = static_cast<int64_t>(ls[2]);
  }
  std::vector<std::string> series;
  {
    std::istringstream in(r.text("metric_series"));
    for (std::string line; std::getline(in, line);) series.push_back(line);
  }

  for (const SafetensorsEntry& t : h.tensors) {
    const bool model = t.name.compare(0, std::strlen(kModelPrefix), kModelPrefix) == 0;
    const bool optimizer = t.name.compare(0, std::strlen(kOptimizerPrefix), kOptimizerPrefix) == 0;
    if (model || optimizer) {
      if (t.dtype != "F32") r.fail("'" + t.name + "' is " + t.dtype + ", not F32");
      TrainingCheckpoint::Values v;
      v.name = t.name.substr(std::strlen(model ? kModelPrefix : kOptimizerPrefix));
      v.shape = t.shape;
      v.values.resize((t.end - t.begin) / sizeof(float));
      std::memcpy(v.values.data(), r.data(t), v.values.size() * sizeof(float));
      (model ? c.state : c.optimizer).push_back(std::move(v));
    } else if (t.name == "epochs") {
      const int64_t columns = t.shape.size() == 2 && t.shape[1] == kEpochColumnsBefore ? kEpochColumnsBefore
                                                                                         : kEpochColumns;
      const std::vector<double> v = r.f64(t, columns);
      for (size_t row = 0; row < v.size(); row += static_cast<size_t>(columns)) {
        EpochResult e;
        e.epoch = static_cast<int64_t>(v[row]);
        e.train_loss = v[row + 1];
        e.train_acc = v[row + 2];
        e.test_acc = v[row + 3];
        e.seconds = v[row + 4];
        e.images_per_second = v[row + 5];
        e.loader_ms_per_batch = v[row + 6];
        e.step_ms = v[row + 7];
        e.loader_wait_ms = v[row + 8];
        if (columns == kEpochColumns) {
          e.test_loss = v[row + 9];
          e.test_perplexity = v[row + 10];
          e.test_mse = v[row + 11];
          e.test_mae = v[row + 12];
          e.test_r2 = v[row + 13];
          e.train_mse = v[row + 14];
        }
        c.epochs.push_back(e);
      }
    } else if (t.name == "metrics") {
      const std::vector<double> v = r.f64(t, kMetricColumns);
      for (size_t row = 0; row < v.size(); row += kMetricColumns) {
        const double index = v[row];
        if (!(index >= 0 && index < static_cast<double>(series.size())) || index != std::floor(index))
          r.fail("metric sample " + std::to_string(row / kMetricColumns) + " names series " + exact(index) +
                 " of " + std::to_string(series.size()));
        c.metrics.push_back({series[static_cast<size_t>(index)], v[row + 1], static_cast<int64_t>(v[row + 2]),
                             v[row + 3], v[row + 4]});
      }
    } else {
      r.fail("tensor '" + t.name + "' is not part of a checkpoint");
    }
  }
  if (c.state.empty()) r.fail("it holds no model state");
  if (static_cast<int64_t>(c.epochs.size()) != c.epoch)
    r.fail("it is at epoch " + std::to_string(c.epoch) + " but records " + std::to_string(c.epochs.size()) +
           " epochs");
  return c;
}

std::string checkpoint_file_name(int64_t epoch, int64_t batch) {
  char buf[64];
  if (batch == 0)
    std::snprintf(buf, sizeof buf, "checkpoint-e%04lld.safetensors", static_cast<long long>(epoch));
  else
    std::snprintf(buf, sizeof buf, "checkpoint-e%04lld-b%06lld.safetensors", static_cast<long long>(epoch),
                  static_cast<long long>(batch));
  return buf;
}

std::vector<CheckpointFile> list_checkpoints(const std::string& dir) {
  namespace fs = std::filesystem;
  std::vector<CheckpointFile> out;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    // Exactly our names, so that nothing else in the directory is read or removed.
    static const std::regex ours(R"(checkpoint-e(\d{4,15})(?:-b(\d{6,15}))?\.safetensors)");
    std::smatch m;
    if (!std::regex_match(name, m, ours)) continue;
    const int64_t epoch = std::stoll(m[1].str()), batch = m[2].matched ? std::stoll(m[2].str()) : 0;
    if (name != checkpoint_file_name(epoch, batch)) continue;  // "-b000000", or a number padded twice
    out.push_back({it->path().string(), epoch, batch});
  }
  std::sort(out.begin(), out.end(), [](const CheckpointFile& a, const CheckpointFile& b) {
    return a.epoch != b.epoch ? a.epoch > b.epoch : a.batch > b.batch;
  });
  return out;
}

std::string checkpoint_mismatch(const TrainingCheckpoint& c, const std::string& signature,
                                const std::vector<std::pair<std::string, std::string>>& settings) {
  if (c.signature != signature)
    return "model: the checkpoint holds another model (" + first_different_line(c.signature, signature) + ")";
  std::map<std::string, std::string> theirs(c.settings.begin(), c.settings.end());
  for (const auto& [name, value] : settings) {
    const auto it = theirs.find(name);
    if (it == theirs.end()) return name + ": the checkpoint does not record it (this run has " + value + ")";
    if (it->second != value) return name + ": the checkpoint has " + it->second + ", this run " + value;
  }
  std::map<std::string, std::string> ours(settings.begin(), settings.end());
  for (const auto& [name, value] : c.settings)
    if (!ours.count(name)) return name + ": the checkpoint has " + value + ", this run does not set it";
  return {};
}

}  // namespace gn::nn
