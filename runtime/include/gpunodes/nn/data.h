// Data: Fashion-MNIST from its gzipped IDX files, a synthetic set for tests, and a loader that shuffles with
// a seed and prepares batches on a background thread (into page-locked memory when they go to a GPU), with
// the random crop, flip and normalisation of a dataset's transform. Datasets of values (text, series, tables:
// sequence_data.h) go through the same loader, served as they are.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gpunodes/runtime.h"
#include "gpunodes/shape.h"
#include "gpunodes/tensor.h"

namespace gn::nn {

// How loaders serve a dataset's images, carried by the dataset as torchvision's ImageFolder carries its
// transform: a training split gets the augmentation, its test split only the normalisation. Applied after the
// scaling to [0, 1] and the loader's resize, in torchvision's order RandomCrop(size, padding),
// RandomHorizontalFlip, Normalize. The random parts apply only to shuffled (training) passes, so that an
// evaluation pass, which reads in order, sees every image as it is.
struct Transform {
  int64_t crop_padding = 0;      // > 0: a random crop of the image's own size after zero padding by this much
  bool flip = false;             // horizontal flip with probability 0.5
  std::vector<float> mean, std;  // per channel, of [0, 1] values; empty: no normalisation
  bool augments() const { return crop_padding > 0 || flip; }
  bool normalizes() const { return !mean.empty(); }
};

// How a text dataset cut its file into tokens, so that a prompt is cut alike (encode() in sequence_data.h).
enum class TokenUnit {
  Char,  // every character (a Unicode code point), spaces and line ends included
  Word,  // what lies between runs of whitespace
};
struct Tokenizer {
  TokenUnit unit = TokenUnit::Char;
  // d2l's preprocessing, before the cut: every run of anything but the ASCII letters A-Z and a-z becomes one
  // space, and letters become lower case.
  bool preprocess = true;
};

// A dataset of one of two kinds, which callers can treat alike through sample_dims(), target_dims() and
// the numels.
// - Images: bytes (0..255), each sample C*H*W in CHW order, and labels, class indices. Loaders scale them to
//   [0, 1], resize them and apply the transform.
// - Values (has_values()): sample i is the sample_numel() floats at values[i * sample_numel()] in
//   sample_shape, and its target the target_numel() floats at targets[i * target_numel()] in target_shape
//   ([]: one class index or one regression value; [T]: the next token of each of T steps). Loaders serve
//   them as they are: no scaling, resize, transform or augmentation. Text, series and tables
//   (sequence_data.h) are value datasets; their channels, height and width are 0.
struct Dataset {
  std::string name;  // "fashion-mnist/train", "synthetic", "image_folder/train", "text/train"
  int64_t count = 0;
  int64_t channels = 1, height = 28, width = 28;
  int64_t classes = 10;                  // the model's outputs: the class count, or 1 for regression
  std::vector<uint8_t> images;           // count * C * H * W
  std::vector<uint8_t> labels;           // count
  std::vector<std::string> class_names;  // label i is class_names[i] (an image folder's directories, a
                                         // table's target texts)
  Transform transform;                   // images only

  Shape sample_shape;          // a value dataset's sample, e.g. {T} token ids, {tau} past values, {features}
  std::vector<float> values;   // count * sample_numel()
  Shape target_shape;          // a value dataset's target: {} one value, {T} one per step
  std::vector<float> targets;  // count * target_numel(): class indices, regression values or token ids
  bool regression = false;     // targets are values to predict, not classes (classes is then 1)
  // Text read with the sequential partition: the loader serves consecutive windows in d2l's
  // seq_data_iter_sequential order and never shuffles (see LoaderOptions).
  bool sequential = false;
  // Targets equal to this (>= 0) are padding, not data: the cross-entropy gives them no loss, no gradient and
  // no count (text by lines pads with "<pad>", 1). -1: every target counts.
  int64_t pad_target = -1;
  std::string source;  // the file the dataset was read from, for messages; empty for a made one

  // Text: token id i is vocabulary[i], seen token_counts[i] times in the training tokens. Id 0 is "<unk>",
  // which stands for every token the vocabulary leaves out.
  std::vector<std::string> vocabulary;
  std::vector<int64_t> token_counts;
  Tokenizer tokenizer;

  // A series: every value of it, both splits (shared by them), and the time index in *series of sample 0's
  // target: sample i predicts (*series)[series_first + i] from the sample_shape[0] values before it. What
  // d2l's one-step and k-step-ahead predictions are drawn over.
  std::shared_ptr<const std::vector<float>> series;
  int64_t series_first = 0;

  // A table: the name of each feature (a sample's values, in order), and the training split's mean and
  // (population) standard deviation of each, with which both splits' values were standardised as
  // (x - mean) / std; a constant feature has std 1.
  std::vector<std::string> feature_names;
  std::vector<double> feature_mean, feature_std;

  // Whether samples are values rather than images: values are given or a sample shape is set (an empty
  // split of a value dataset has the shape but no values).
  bool has_values() const { return !values.empty() || !sample_shape.empty(); }
  // One sample's shape: {C, H, W} for images, sample_shape for values.
  Shape sample_dims() const { return has_values() ? sample_shape : Shape{channels, height, width}; }
  // One target's shape: {} for images (a label), target_shape for values.
  Shape target_dims() const { return has_values() ? target_shape : Shape{}; }
  int64_t sample_numel() const;  // floats (values) or bytes (images) per sample
  int64_t target_numel() const;  // floats per target: 1 for images
};
using DatasetPtr = std::shared_ptr<const Dataset>;

enum class Split { Train, Test };

// Where the Debian package dataset-fashion-mnist installs the files.
const char* default_fashion_mnist_dir();
// Reads {train,t10k}-{images-idx3,labels-idx1}-ubyte.gz (or the same names without .gz) from `dir`, the
// default when empty. Missing or corrupt files throw gn::Error naming the file, what is wrong, and how to
// install the data. Loaded sets are shared while anyone holds them.
DatasetPtr load_fashion_mnist(Split split, const std::string& dir = "");

struct SyntheticOptions {
  int64_t count = 512;
  int64_t classes = 10;
  int64_t channels = 1, height = 28, width = 28;
  uint64_t seed = 0;
  // Each class is a fixed random pattern; samples add uniform noise of this amplitude (0..255), so that a
  // model can learn the set in a few steps.
  int noise = 64;
};
DatasetPtr make_synthetic(const SyntheticOptions& options);

// The first `limit` samples (all when limit <= 0 or >= count), of either kind: the Dataset node's limit.
DatasetPtr take(const DatasetPtr& data, int64_t limit);

// Per-channel mean and standard deviation (over all pixels, dividing by their count) of a dataset's images
// scaled to [0, 1], summed in float64: what Transform::mean and Transform::std take for normalisation.
// Throws Error for a value dataset, which has no channels.
struct ChannelStats {
  std::vector<double> mean, std;
};
ChannelStats channel_stats(const Dataset& data);

// The random choices of one sample's augmentation, drawn from (seed, epoch, sample index): the same for a
// seed and epoch whichever batch, thread or run the sample lands in. (dy, dx): the crop window's corner in
// the padded image, each in 0..2*crop_padding (crop_padding on both: the image unmoved).
struct AugmentDraw {
  int64_t dy = 0, dx = 0;
  bool flip = false;
};
AugmentDraw draw_augment(const Transform& t, uint64_t seed, int64_t epoch, int64_t sample);
// Applies a draw to one sample [C, H, W] of floats in place: crop (zeros where the window leaves the image)
// and then flip.
void augment_sample(const Transform& t, const AugmentDraw& d, float* sample, int64_t channels, int64_t height,
                    int64_t width);
// (x - mean[c]) / std[c] for every value of one sample [C, H, W]; nothing without normalisation.
void normalize_sample(const Transform& t, float* sample, int64_t channels, int64_t height, int64_t width);

struct LoaderOptions {
  int64_t batch_size = 256;
  // A training pass: also applies the random part of the dataset's transform. Ignored for a sequential
  // dataset (Dataset::sequential), which is always read in its order: with M windows w_0..w_{M-1}, an epoch
  // has nb = M / batch_size batches (the last M - nb * batch_size windows are not read, and drop_last does
  // not matter), and row i of batch b is window i * nb + b, so that row i of each batch continues row i of
  // the batch before and a recurrent network can carry its state from one to the next. A sequential
  // dataset of fewer windows than batch_size is one batch of them all.
  bool shuffle = true;
  uint64_t seed = 0;   // the permutation of epoch e comes from (seed, e)
  int64_t resize = 0;  // 0: keep the size; else bilinear resize to resize x resize (the seed's 96 for ResNet)
  bool drop_last = false;
  int prefetch = 3;     // batches prepared ahead
  bool pinned = false;  // page-locked buffers, for copies to a GPU; ignored without CUDA
  // One process's share of a job of `shards` (the ranks of a distributed run): batch b of the epoch is
  // positions [b * batch_size, (b + 1) * batch_size) of the epoch's order over the whole dataset, of which
  // this shard takes every shards-th from position `shard` on, as PyTorch's DistributedSampler does within
  // a batch. Every sample is in exactly one shard once per epoch; nothing is padded or dropped, so the last
  // batch may give some shards one sample fewer (or none). A sequential dataset's shard is instead a
  // contiguous block of each batch's rows, [rows * shard / shards, rows * (shard + 1) / shards): the same
  // rows every batch, so each rank reads one stretch of the corpus and its rows still continue.
  int shard = 0, shards = 1;
};

// One batch in host memory: images [size, sample_dims()...], for an image dataset scaled to [0, 1] at the
// loader's size ([size, C, H, W]), for a value dataset its values; labels [size, target_shape...] as floats.
struct HostBatch {
  int64_t size = 0;
  int64_t channels = 0, height = 0, width = 0;  // an image batch's sample; 0 for values
  Shape sample_shape, target_shape;             // one sample's and one target's shape
  int64_t global_size = 0;  // the whole batch over every shard (LoaderOptions::shards); size alone: equal
  const float* images = nullptr;
  const float* labels = nullptr;
  bool pinned = false;
  int64_t pad_target = -1;  // Dataset::pad_target: labels equal to it are padding

  // The labels equal to pad_target: the target values a loss leaves out.
  int64_t padded_targets() const;

  // sample_shape, or {channels, height, width} for a batch built by hand that sets only those.
  Shape sample_dims() const {
    return sample_shape.empty() && channels > 0 ? Shape{channels, height, width} : sample_shape;
  }
  int64_t sample_numel() const;  // floats per sample at images
  int64_t target_numel() const;  // floats per target at labels

  // Owns the buffers and gives them back to the loader's pool.
  std::shared_ptr<void> storage;
};
using HostBatchPtr = std::shared_ptr<const HostBatch>;

class DataLoader {
 public:
  DataLoader(DatasetPtr data, LoaderOptions options);
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  int64_t batches_per_epoch() const;
  int64_t samples_per_epoch() const;
  const Dataset& dataset() const { return *data_; }
  const LoaderOptions& options() const { return options_; }

  // Starts producing epoch `epoch` on the background thread (stopping any epoch in progress), from batch
  // `first_batch` on (0 <= first_batch <= batches_per_epoch(); Error otherwise): a resumed epoch skips the
  // batches it trained before, and they are never read.
  void start_epoch(int64_t epoch, int64_t first_batch = 0);
  // The next batch, waiting for it if needed; null after the last one. Rethrows a loader error.
  HostBatchPtr next();
  // Stops the background thread; next() then returns null.
  void stop();

  // Time the background thread spent preparing each batch (reading, resizing, augmenting, normalising), on
  // average over every batch since the loader was made; 0 before the first. Thread-safe.
  double ms_per_batch() const;
  int64_t batches_prepared() const { return prepared_batches_.load(); }

 private:
  // Epoch `epoch`'s samples in reading order; batch b is positions [b * rows, (b + 1) * rows) of it, rows
  // being batch_rows().
  std::vector<int64_t> epoch_order(int64_t epoch) const;
  // The rows of a whole batch (before sharding): batch_size, or a sequential dataset's rows.
  int64_t batch_rows() const;
  void produce(std::vector<int64_t> order, int64_t epoch, int64_t first_batch);
  HostBatchPtr make_batch(const std::vector<int64_t>& samples, int64_t global_size, int64_t epoch);
  void read_images(const std::vector<int64_t>& samples, float* images, float* labels, int64_t epoch) const;
  void read_values(const std::vector<int64_t>& samples, float* images, float* labels) const;

  DatasetPtr data_;
  LoaderOptions options_;
  int64_t out_h_ = 0, out_w_ = 0;                  // an image batch's size after the resize
  int64_t sample_floats_ = 0, target_floats_ = 0;  // per row of a batch
  int64_t sequential_batches_ = 0;                 // nb of a sequential dataset
  struct Pool;
  std::shared_ptr<Pool> pool_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<HostBatchPtr> queue_;
  bool finished_ = true, stopping_ = false;
  std::exception_ptr error_;
  std::atomic<int64_t> prepared_batches_{0}, prepare_ns_{0};
  std::thread thread_;
};

// Tensors for samples [begin, end) of a host batch on `device`: images [n, sample_dims()...] and labels
// [n, target_shape...] ([n, C, H, W] and [n] for images). The copies go on the device's copy stream, so they
// overlap compute; the batch stays alive until they ran.
struct DeviceBatch {
  Tensor images, labels;
};
DeviceBatch to_device(Runtime& rt, const HostBatchPtr& batch, int64_t begin, int64_t end, Device device);
// Copies rows [begin, begin + n) of the batch into dst's tensors (n = dst.labels' first dimension), which
// keep their storage: a captured step's inputs. Their shapes must be to_device()'s for n rows.
void copy_batch_into(const HostBatchPtr& batch, int64_t begin, const DeviceBatch& dst);

// Fisher-Yates permutation of 0..n-1 from (seed, epoch), the same on every platform.
std::vector<int64_t> shuffled_indices(int64_t n, uint64_t seed, int64_t epoch);

}  // namespace gn::nn
