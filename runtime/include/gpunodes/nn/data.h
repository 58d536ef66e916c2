// Data: Fashion-MNIST from its gzipped IDX files, a synthetic set for tests, and a loader that shuffles with
// a seed and prepares batches on a background thread (into page-locked memory when they go to a GPU).
#pragma once
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
#include "gpunodes/tensor.h"

namespace gn::nn {

// Images as bytes (0..255), each sample C*H*W in CHW order; labels are class indices.
struct Dataset {
  std::string name;  // "fashion-mnist/train", "synthetic"
  int64_t count = 0;
  int64_t channels = 1, height = 28, width = 28;
  int64_t classes = 10;
  std::vector<uint8_t> images;  // count * C * H * W
  std::vector<uint8_t> labels;  // count
  std::vector<std::string> class_names;
  int64_t sample_numel() const { return channels * height * width; }
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

// The first `limit` samples (all when limit <= 0 or >= count): the Dataset node's limit.
DatasetPtr take(const DatasetPtr& data, int64_t limit);

struct LoaderOptions {
  int64_t batch_size = 256;
  bool shuffle = true;
  uint64_t seed = 0;   // the permutation of epoch e comes from (seed, e)
  int64_t resize = 0;  // 0: keep the size; else bilinear resize to resize x resize (the seed's 96 for ResNet)
  bool drop_last = false;
  int prefetch = 3;     // batches prepared ahead
  bool pinned = false;  // page-locked buffers, for copies to a GPU; ignored without CUDA
};

// One batch in host memory: images [size, C, H, W] scaled to [0, 1], labels [size] as floats.
struct HostBatch {
  int64_t size = 0, channels = 0, height = 0, width = 0;
  const float* images = nullptr;
  const float* labels = nullptr;
  bool pinned = false;
  int64_t sample_numel() const { return channels * height * width; }

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

  // Starts producing epoch `epoch` on the background thread (stopping any epoch in progress).
  void start_epoch(int64_t epoch);
  // The next batch, waiting for it if needed; null after the last one. Rethrows a loader error.
  HostBatchPtr next();
  // Stops the background thread; next() then returns null.
  void stop();

 private:
  void produce(std::vector<int64_t> order);
  HostBatchPtr make_batch(const std::vector<int64_t>& order, int64_t begin, int64_t end);

  DatasetPtr data_;
  LoaderOptions options_;
  int64_t out_h_, out_w_;
  struct Pool;
  std::shared_ptr<Pool> pool_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<HostBatchPtr> queue_;
  bool finished_ = true, stopping_ = false;
  std::exception_ptr error_;
  std::thread thread_;
};

// Tensors for samples [begin, end) of a host batch on `device`: images [n, C, H, W] and labels [n]. The
// copies go on the device's copy stream, so they overlap compute; the batch stays alive until they ran.
struct DeviceBatch {
  Tensor images, labels;
};
DeviceBatch to_device(Runtime& rt, const HostBatchPtr& batch, int64_t begin, int64_t end, Device device);

// Fisher-Yates permutation of 0..n-1 from (seed, epoch), the same on every platform.
std::vector<int64_t> shuffled_indices(int64_t n, uint64_t seed, int64_t epoch);

}  // namespace gn::nn
