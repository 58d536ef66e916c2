// Predictions over a dataset and what the Evaluate node reads from them.
#include "gpunodes/nn/predict.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <numeric>

#include "gpunodes/errors.h"
#include "gpunodes/ops.h"

namespace gn::nn {

int64_t Predictions::correct() const {
  int64_t n = 0;
  for (int64_t i = 0; i < count; ++i) n += predicted[i] == labels[i];
  return n;
}

double Predictions::accuracy() const {
  return count ? static_cast<double>(correct()) / static_cast<double>(count) : NAN;
}

int64_t argmax(const float* logits, int64_t n) {
  // Spelled as the softmax_cross_entropy kernels spell it (CPU and CUDA): strict >, from the first.
  int64_t arg = 0;
  float mx = logits[0];
  for (int64_t j = 1; j < n; ++j)
    if (logits[j] > mx) mx = logits[j], arg = j;
  return arg;
}

void softmax(const float* logits, int64_t n, float* out) {
  const double mx = logits[argmax(logits, n)];
  double sum = 0;
  for (int64_t j = 0; j < n; ++j) sum += std::exp(static_cast<double>(logits[j]) - mx);
  for (int64_t j = 0; j < n; ++j)
    out[j] = static_cast<float>(std::exp(static_cast<double>(logits[j]) - mx) / sum);
}

std::vector<float> predict_values(Model& model, const DatasetPtr& data, int64_t batch_size) {
  if (!data || data->count == 0) throw Error("predict: empty dataset");
  LoaderOptions lo;
  lo.batch_size = batch_size;
  lo.shuffle = false;
  lo.pinned = model.device().is_cuda();
  DataLoader loader(data, lo);
  loader.start_epoch(0);
  std::vector<float> out;
  while (HostBatchPtr batch = loader.next()) {
    if (model.runtime().engine().cancelled()) throw CancelledError();
    DeviceBatch db = to_device(model.runtime(), batch, 0, batch->size, model.device());
    const std::vector<float> y = to_host(model.forward(db.images, Mode::Eval));
    out.insert(out.end(), y.begin(), y.end());
  }
  return out;
}

std::vector<AttentionMap> attention_maps(Model& model, const DatasetPtr& data, int64_t index, int64_t resize) {
  if (!data || index < 0 || index >= data->count)
    throw Error("attention: sample " + std::to_string(index) + " is not in the dataset's " +
                std::to_string(data ? data->count : 0) + " samples");
  LoaderOptions lo;
  lo.batch_size = 1;
  lo.shuffle = false;
  lo.resize = resize;
  DataLoader loader(data, lo);
  loader.start_epoch(0);
  // Batches of one, in order: only the one asked for goes through the model.
  HostBatchPtr batch;
  for (int64_t i = 0; i <= index; ++i)
    if (!(batch = loader.next())) throw Error("attention: the loader ended before sample " + std::to_string(index));
  DeviceBatch db = to_device(model.runtime(), batch, 0, 1, model.device());
  (void)model.forward(db.images, Mode::Eval);
  std::vector<AttentionMap> out;
  for (const auto& [layer, w] : model.attention_weights()) {
    AttentionMap m;
    m.layer = layer;
    m.heads = w.shape()[0], m.queries = w.shape()[1], m.keys = w.shape()[2];
    m.weights = to_host(w);
    out.push_back(std::move(m));
  }
  return out;
}

SeriesPredictions predict_series(Model& model, const Dataset& data, int64_t start) {
  if (!data.series || data.sample_shape.size() != 1) throw Error("predict_series: the dataset is not a series");
  const std::vector<float>& x = *data.series;
  const auto n = static_cast<int64_t>(x.size());
  const int64_t tau = data.sample_shape[0];
  start = std::clamp<int64_t>(start, tau, n);
  Runtime& rt = model.runtime();
  auto predict_windows = [&](const std::vector<float>& windows, int64_t count) {
    const std::vector<float> y = to_host(model.forward(from_values(rt, {count, tau}, model.device(), windows), Mode::Eval));
    if (static_cast<int64_t>(y.size()) != count)
      throw Error("predict_series: the model gives " + std::to_string(y.size() / std::max<int64_t>(count, 1)) +
                  " values per window, not 1");
    return y;
  };
  SeriesPredictions p;
  p.one_step.assign(static_cast<size_t>(n), NAN);
  p.k_step.assign(static_cast<size_t>(n), NAN);
  if (n > tau) {
    // Every window at once: the true values before each t.
    std::vector<float> windows;
    windows.reserve(static_cast<size_t>((n - tau) * tau));
    for (int64_t t = tau; t < n; ++t) windows.insert(windows.end(), x.begin() + (t - tau), x.begin() + t);
    const std::vector<float> y = predict_windows(windows, n - tau);
    for (int64_t t = tau; t < n; ++t) p.one_step[static_cast<size_t>(t)] = y[static_cast<size_t>(t - tau)];
  }
  // One step at a time, each prediction the next window's last value.
  std::vector<float> fed(x.begin(), x.begin() + start);
  for (int64_t t = start; t < n; ++t) {
    if (rt.engine().cancelled()) throw CancelledError();
    const std::vector<float> window(fed.end() - tau, fed.end());
    const float y = predict_windows(window, 1)[0];
    fed.push_back(y);
    p.k_step[static_cast<size_t>(t)] = y;
  }
  return p;
}

Predictions predict(Model& model, const DatasetPtr& data, int64_t batch_size, int64_t resize) {
  if (!data || data->count == 0) throw Error("predict: empty dataset");
  Runtime& rt = model.runtime();
  const Device device = model.device();
  LoaderOptions lo;
  lo.batch_size = batch_size;
  lo.shuffle = false;
  lo.resize = resize;
  lo.pinned = device.is_cuda();
  DataLoader loader(data, lo);
  loader.start_epoch(0);

  Predictions out;
  out.count = data->count;
  out.labels.resize(static_cast<size_t>(data->count));
  out.predicted.resize(static_cast<size_t>(data->count));
  // Logits read back while the next batches run: the device stays busy, and the host holds two at most.
  struct Pending {
    Tensor logits;
    int64_t begin = 0, size = 0;
  };
  std::deque<Pending> pending;
  auto read_back = [&](const Pending& b) {
    const std::vector<float> z = to_host(b.logits);
    for (int64_t i = 0; i < b.size; ++i) {
      const float* row = z.data() + i * out.classes;
      const int64_t s = b.begin + i;
      out.predicted[s] = argmax(row, out.classes);
      softmax(row, out.classes, out.probabilities.data() + s * out.classes);
    }
  };
  int64_t offset = 0;
  while (HostBatchPtr batch = loader.next()) {
    if (rt.engine().cancelled()) throw CancelledError();
    DeviceBatch db = to_device(rt, batch, 0, batch->size, device);
    Tensor logits = model.forward(db.images, Mode::Eval);
    const Shape& shape = logits.shape();
    if (shape.size() != 2 || shape[0] != batch->size || shape[1] < 1)
      throw Error("predict: the model gives " + shape_str(shape) + " for a batch of " +
                  std::to_string(batch->size) + ", not [" + std::to_string(batch->size) +
                  ", classes] logits");
    if (out.classes == 0) {
      out.classes = shape[1];
      if (data->target_numel() != 1)
        throw Error("predict: the dataset's targets are " + shape_str(data->target_dims()) +
                    " per sample, not one class label");
      for (int64_t i = 0; i < data->count; ++i) {
        // An image set's labels are bytes; a table's classes are floats among its values' targets.
        const double label = data->has_values() ? data->targets[static_cast<size_t>(i)] : data->labels[i];
        if (label >= static_cast<double>(out.classes))
          throw Error("predict: sample " + std::to_string(i) + " has label " + std::to_string(label) +
                      ", but the model has " + std::to_string(out.classes) + " classes");
      }
      out.probabilities.resize(static_cast<size_t>(data->count * out.classes));
    }
    for (int64_t i = 0; i < batch->size; ++i) out.labels[offset + i] = static_cast<int64_t>(batch->labels[i]);
    pending.push_back({logits, offset, batch->size});
    offset += batch->size;
    while (pending.size() > 2) {
      read_back(pending.front());
      pending.pop_front();
    }
  }
  for (const Pending& b : pending) read_back(b);
  if (offset != data->count)
    throw Error("predict: the loader gave " + std::to_string(offset) + " of " + std::to_string(data->count) +
                " samples");
  return out;
}

ConfusionMatrix confusion_matrix(const Predictions& p) {
  ConfusionMatrix m(static_cast<size_t>(p.classes), std::vector<int64_t>(static_cast<size_t>(p.classes), 0));
  for (int64_t i = 0; i < p.count; ++i) ++m[p.labels[i]][p.predicted[i]];
  return m;
}

std::vector<double> per_class_accuracy(const ConfusionMatrix& confusion) {
  std::vector<double> out;
  out.reserve(confusion.size());
  for (size_t t = 0; t < confusion.size(); ++t) {
    const int64_t total = std::accumulate(confusion[t].begin(), confusion[t].end(), int64_t(0));
    out.push_back(total ? static_cast<double>(confusion[t][t]) / static_cast<double>(total) : NAN);
  }
  return out;
}

std::vector<ClassProbability> top_k(const float* probabilities, int64_t classes, int64_t k, int64_t first) {
  std::vector<int64_t> order(static_cast<size_t>(classes));
  std::iota(order.begin(), order.end(), int64_t(0));
  // A strict weak order even with NaNs: the forced first, then numbers high to low, then NaNs; ties by class.
  auto rank = [&](int64_t c) { return c == first ? 0 : std::isnan(probabilities[c]) ? 2 : 1; };
  const size_t n = static_cast<size_t>(std::clamp<int64_t>(k, 0, classes));
  std::partial_sort(order.begin(), order.begin() + n, order.end(), [&](int64_t a, int64_t b) {
    const int ra = rank(a), rb = rank(b);
    if (ra != rb) return ra < rb;
    if (ra == 1 && probabilities[a] != probabilities[b]) return probabilities[a] > probabilities[b];
    return a < b;
  });
  std::vector<ClassProbability> out;
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) out.push_back({order[i], probabilities[order[i]]});
  return out;
}

std::vector<Mistake> mistakes(const Predictions& p, int64_t limit) {
  std::vector<int64_t> wrong;
  for (int64_t i = 0; i < p.count; ++i)
    if (p.predicted[i] != p.labels[i]) wrong.push_back(i);
  auto confidence = [&](int64_t i) { return p.row(i)[p.predicted[i]]; };
  // stable_sort keeps dataset order among equal confidences.
  std::stable_sort(wrong.begin(), wrong.end(), [&](int64_t a, int64_t b) {
    const float ca = confidence(a), cb = confidence(b);
    if (std::isnan(ca) || std::isnan(cb)) return !std::isnan(ca) && std::isnan(cb);
    return ca > cb;
  });
  if (limit >= 0 && static_cast<size_t>(limit) < wrong.size()) wrong.resize(static_cast<size_t>(limit));
  std::vector<Mistake> out;
  out.reserve(wrong.size());
  for (int64_t i : wrong)
    out.push_back(
        {i, p.labels[i], p.predicted[i], confidence(i), top_k(p.row(i), p.classes, 5, p.predicted[i])});
  return out;
}

const std::vector<std::string>& fashion_mnist_class_names() {
  static const std::vector<std::string> names{"t-shirt", "trouser", "pullover", "dress", "coat",
                                              "sandal",  "shirt",   "sneaker",  "bag",   "ankle boot"};
  return names;
}

std::vector<std::string> class_names(const Dataset& data, int64_t classes) {
  // load_fashion_mnist names its sets "fashion-mnist/train" or "/test"; take() appends "[:n]".
  const bool fashion = data.class_names.empty() && data.name.rfind("fashion-mnist/", 0) == 0;
  const std::vector<std::string>& known = fashion ? fashion_mnist_class_names() : data.class_names;
  std::vector<std::string> out;
  for (int64_t i = 0; i < classes; ++i)
    out.push_back(static_cast<size_t>(i) < known.size() ? known[i] : "class " + std::to_string(i));
  return out;
}

}  // namespace gn::nn
