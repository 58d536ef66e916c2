// A classifier's predictions over a dataset, and what is read from them: the confusion matrix, per-class
// accuracy and the mistakes, most confident first, each with its top-5 classes. predict() runs the model; the
// rest are pure functions of its result, so that they can be checked against a plain loop.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "gpunodes/nn/data.h"
#include "gpunodes/nn/model.h"

namespace gn::nn {

struct Predictions {
  int64_t count = 0;                 // samples, in the dataset's order
  int64_t classes = 0;               // the model's outputs per sample
  std::vector<float> probabilities;  // count x classes, row-major: the softmax of each sample's logits
  std::vector<int64_t> labels;       // each sample's true class
  std::vector<int64_t> predicted;    // argmax of each sample's logits (see argmax())
  const float* row(int64_t i) const { return probabilities.data() + i * classes; }
  int64_t correct() const;
  double accuracy() const;  // correct() / count; NaN when there are no samples
};

// Runs `model` in Eval mode over every sample of `data`, in order, in batches of `batch_size` on the model's
// device (a CPU device or a GPU), resized as the loader resizes, and reads the logits back to the host. The
// host softmax works in float64. Blocks until done; throws CancelledError once the engine is cancelled, and
// gn::Error when the model does not give [n, classes] logits or a label is not one of its classes.
Predictions predict(Model& model, const DatasetPtr& data, int64_t batch_size = 256, int64_t resize = 0);

// The model's outputs for every sample of `data`, in order, each flattened (count x outputs per sample): a
// regression's predictions.
std::vector<float> predict_values(Model& model, const DatasetPtr& data, int64_t batch_size = 256);

// d2l 9.1's predictions over a series dataset's whole series (Dataset::series; NaN where there is none):
// one_step[t] for every t >= tau from the true values before t, and k_step[t] for t >= start fed the model's
// own predictions after start - 1 (the true values before start). The model must give one value per window.
struct SeriesPredictions {
  std::vector<double> one_step, k_step;
};
SeriesPredictions predict_series(Model& model, const Dataset& data, int64_t start);

// What each MultiheadAttention layer of `model` attends to for sample `index` of `data` (Eval mode, resized as
// the loader resizes): its weights [heads, queries, keys] read back to the host, in construction order, under
// the layer's id. Empty for a model without attention. Throws Error for an index outside the dataset.
struct AttentionMap {
  std::string layer;
  int64_t heads = 0, queries = 0, keys = 0;
  std::vector<float> weights;  // heads x queries x keys, row-major; each row sums to 1 (masked keys 0)
};
std::vector<AttentionMap> attention_maps(Model& model, const DatasetPtr& data, int64_t index, int64_t resize = 0);

// The first maximum of n logits (a later equal value does not win; a NaN never does unless it comes first):
// the rule softmax_cross_entropy's accuracy count follows on every backend, so that accuracy read from
// predictions equals evaluate()'s.
int64_t argmax(const float* logits, int64_t n);
// exp(z - max) / sum, in float64, with max the argmax's logit.
void softmax(const float* logits, int64_t n, float* out);

// confusion[t][p]: the samples of true class t predicted as p. classes x classes.
using ConfusionMatrix = std::vector<std::vector<int64_t>>;
ConfusionMatrix confusion_matrix(const Predictions& p);
// Each row's diagonal over the row's sum: the recall of each true class. A class without samples has no
// accuracy: its entry is NaN (the Evaluate node writes it as null).
std::vector<double> per_class_accuracy(const ConfusionMatrix& confusion);

struct ClassProbability {
  int64_t cls = 0;
  float p = 0;
};
// The k most probable classes of one row, highest first, ties to the lower class; `first` (when >= 0) is put
// first whatever its probability, so that a list starts with the prediction even where two logits that
// differ round to the same probability. NaN probabilities come last.
std::vector<ClassProbability> top_k(const float* probabilities, int64_t classes, int64_t k,
                                    int64_t first = -1);

struct Mistake {
  int64_t index = 0;  // the sample's index in the dataset
  int64_t label = 0, predicted = 0;
  float confidence = 0;                // the predicted class's probability
  std::vector<ClassProbability> top5;  // starts with the predicted class; fewer when there are fewer classes
};
// Every sample whose prediction is not its label, the most confident first (ties in dataset order; NaN
// confidences last). limit >= 0 keeps only the first `limit`.
std::vector<Mistake> mistakes(const Predictions& p, int64_t limit = -1);

// d2l's get_fashion_mnist_labels: t-shirt, trouser, pullover, dress, coat, sandal, shirt, sneaker, bag,
// ankle boot.
const std::vector<std::string>& fashion_mnist_class_names();
// `classes` names for the classes of `data`: its class_names (an image folder's directories), Fashion-MNIST's
// for a set loaded by load_fashion_mnist, otherwise "class 0", "class 1", ...; a class beyond what the
// dataset names is "class i" too.
std::vector<std::string> class_names(const Dataset& data, int64_t classes);

}  // namespace gn::nn
