// Fashion-MNIST's IDX files through zlib, the synthetic set, augmentation, and the background loader of
// image and value datasets.
#include "gpunodes/nn/data.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>

#include "cuda_support.h"
#include "gpunodes/backend.h"
#include "gpunodes/errors.h"

namespace gn::nn {
namespace {

const char* kInstallHint =
    "Install the Debian package dataset-fashion-mnist (apt-get install dataset-fashion-mnist), or give the "
    "directory that holds train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz "
    "and t10k-labels-idx1-ubyte.gz";

struct GzFile {
  gzFile f = nullptr;
  ~GzFile() {
    if (f) gzclose(f);
  }
};

[[noreturn]] void corrupt(const std::string& path, const std::string& what) {
  throw Error("Fashion-MNIST: " + path + " is corrupt or not an IDX file: " + what + ". " + kInstallHint);
}

// Reads exactly n bytes; a short read means the file is truncated or not gzip-compressed data.
void read_exact(GzFile& gz, const std::string& path, void* dst, size_t n, const char* what) {
  auto* p = static_cast<unsigned char*>(dst);
  while (n > 0) {
    const unsigned chunk = static_cast<unsigned>(std::min<size_t>(n, 1u << 30));
    const int got = gzread(gz.f, p, chunk);
    if (got <= 0) {
      int err = 0;
      const char* msg = gzerror(gz.f, &err);
      corrupt(path, std::string("it ends inside the ") + what +
                        (err != Z_OK && err != Z_STREAM_END && msg ? std::string(" (") + msg + ")"
                                                                   : std::string()));
    }
    p += got;
    n -= static_cast<size_t>(got);
  }
}

uint32_t big_endian(const unsigned char* b) {
  return (uint32_t(b[0]) << 24) | (uint32_t(b[1]) << 16) | (uint32_t(b[2]) << 8) | uint32_t(b[3]);
}

// Opens name.gz, or name when only the uncompressed file exists (gzread passes plain files through).
std::string find_file(const std::string& dir, const std::string& name) {
  namespace fs = std::filesystem;
  const std::string gz = (fs::path(dir) / (name + ".gz")).string();
  const std::string plain = (fs::path(dir) / name).string();
  std::error_code ec;
  if (fs::exists(gz, ec)) return gz;
  if (fs::exists(plain, ec)) return plain;
  if (!fs::is_directory(dir, ec))
    throw Error("Fashion-MNIST: the directory " + dir + " does not exist. " + kInstallHint);
  throw Error("Fashion-MNIST: " + gz + " is missing. " + kInstallHint);
}

// An IDX file of unsigned bytes: magic 0x0000 08 <dims>, then dims big-endian uint32 sizes, then the data.
std::vector<uint8_t> read_idx(const std::string& path, int want_dims, std::vector<uint32_t>& dims) {
  GzFile gz;
  gz.f = gzopen(path.c_str(), "rb");
  if (!gz.f)
    throw Error("Fashion-MNIST: cannot open " + path + ": " + std::strerror(errno) + ". " + kInstallHint);
  unsigned char head[4];
  read_exact(gz, path, head, 4, "header");
  const uint32_t magic = big_endian(head);
  const uint32_t expect = 0x00000800u | static_cast<uint32_t>(want_dims);
  if (magic != expect) {
    char buf[96];
    std::snprintf(buf, sizeof buf, "magic number 0x%08X, expected 0x%08X", magic, expect);
    corrupt(path, buf);
  }
  dims.assign(static_cast<size_t>(want_dims), 0);
  constexpr uint64_t kMaxTotal = uint64_t(1) << 32;
  uint64_t total = 1;
  for (int i = 0; i < want_dims; ++i) {
    read_exact(gz, path, head, 4, "header");
    dims[i] = big_endian(head);
    // Checked at each step: three 32-bit dimensions can wrap a 64-bit product around to a small number.
    if (dims[i] == 0 || total > kMaxTotal / dims[i]) corrupt(path, "implausible dimensions");
    total *= dims[i];
  }
  // Grown as the data arrives: a header that claims gigabytes in a file of a few bytes costs nothing.
  constexpr size_t kChunk = size_t(16) << 20;
  std::vector<uint8_t> data;
  while (data.size() < total) {
    const size_t have = data.size(), n = std::min<size_t>(kChunk, static_cast<size_t>(total) - have);
    data.resize(have + n);
    read_exact(gz, path, data.data() + have, n, "data");
  }
  return data;
}

std::shared_ptr<Dataset> read_fashion_mnist(Split split, const std::string& dir) {
  const std::string prefix = split == Split::Train ? "train" : "t10k";
  const std::string img_path = find_file(dir, prefix + "-images-idx3-ubyte");
  const std::string lbl_path = find_file(dir, prefix + "-labels-idx1-ubyte");
  auto d = std::make_shared<Dataset>();
  std::vector<uint32_t> idims, ldims;
  d->images = read_idx(img_path, 3, idims);
  d->labels = read_idx(lbl_path, 1, ldims);
  if (idims[1] != 28 || idims[2] != 28)
    corrupt(img_path,
            "images are " + std::to_string(idims[1]) + "x" + std::to_string(idims[2]) + ", not 28x28");
  if (idims[0] != ldims[0])
    corrupt(lbl_path,
            std::to_string(ldims[0]) + " labels for " + std::to_string(idims[0]) + " images in " + img_path);
  for (size_t i = 0; i < d->labels.size(); ++i)
    if (d->labels[i] >= 10)
      corrupt(lbl_path, "label " + std::to_string(d->labels[i]) + " at " + std::to_string(i));
  d->name = std::string("fashion-mnist/") + (split == Split::Train ? "train" : "test");
  d->count = idims[0];
  d->channels = 1, d->height = 28, d->width = 28, d->classes = 10;
  d->class_names = {"t-shirt", "trouser", "pullover", "dress", "coat",
                    "sandal",  "shirt",   "sneaker",  "bag",   "ankle boot"};
  return d;
}

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// One 64-bit state from two values, so that draws keyed by (seed, epoch, sample) are unrelated to each other.
uint64_t mix(uint64_t a, uint64_t b) {
  uint64_t state = a ^ (b * 0xD1B54A32D192ED03ull);
  return splitmix64(state);
}

// Bilinear weights for one axis, align_corners=False (PyTorch's and PIL's pixel-centre convention).
struct Tap {
  int64_t i0, i1;
  float w1;
};
std::vector<Tap> taps(int64_t in, int64_t out) {
  std::vector<Tap> t(static_cast<size_t>(out));
  const double scale = static_cast<double>(in) / static_cast<double>(out);
  for (int64_t o = 0; o < out; ++o) {
    double src = (static_cast<double>(o) + 0.5) * scale - 0.5;
    if (src < 0) src = 0;
    int64_t i0 = std::min<int64_t>(static_cast<int64_t>(src), in - 1);
    int64_t i1 = std::min<int64_t>(i0 + 1, in - 1);
    t[o] = {i0, i1, static_cast<float>(src - static_cast<double>(i0))};
  }
  return t;
}

int64_t product(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

}  // namespace

int64_t Dataset::sample_numel() const {
  return has_values() ? product(sample_shape) : channels * height * width;
}

int64_t Dataset::target_numel() const {
  return has_values() ? product(target_shape) : 1;
}

int64_t HostBatch::sample_numel() const {
  return product(sample_dims());
}

int64_t HostBatch::target_numel() const {
  return product(target_shape);
}

int64_t HostBatch::padded_targets() const {
  if (pad_target < 0 || !labels) return 0;
  const auto pad = static_cast<float>(pad_target);
  return std::count(labels, labels + size * target_numel(), pad);
}

const char* default_fashion_mnist_dir() {
  return "/usr/share/datasets/fashion-mnist";
}

DatasetPtr load_fashion_mnist(Split split, const std::string& dir_in) {
  const std::string dir = dir_in.empty() ? default_fashion_mnist_dir() : dir_in;
  static std::mutex mutex;
  static std::map<std::pair<std::string, int>, std::weak_ptr<const Dataset>> cache;
  std::lock_guard lock(mutex);
  auto key =
      std::make_pair(std::filesystem::absolute(dir).lexically_normal().string(), static_cast<int>(split));
  if (auto hit = cache[key].lock()) return hit;
  DatasetPtr d = read_fashion_mnist(split, dir);
  cache[key] = d;
  return d;
}

DatasetPtr make_synthetic(const SyntheticOptions& o) {
  if (o.count < 1 || o.classes < 1 || o.classes > 255 || o.channels < 1 || o.height < 1 || o.width < 1)
    throw Error("synthetic dataset: count, channels, height, width must be positive and classes in 1..255");
  auto d = std::make_shared<Dataset>();
  d->name = "synthetic";
  d->count = o.count, d->classes = o.classes;
  d->channels = o.channels, d->height = o.height, d->width = o.width;
  const int64_t numel = d->sample_numel();
  uint64_t state = o.seed * 0x2545F4914F6CDD1Dull + 1;
  std::vector<uint8_t> protos(static_cast<size_t>(numel * o.classes));
  for (auto& v : protos) v = static_cast<uint8_t>(splitmix64(state) >> 56);
  d->images.resize(static_cast<size_t>(numel * o.count));
  d->labels.resize(static_cast<size_t>(o.count));
  const int noise = std::clamp(o.noise, 0, 255);
  for (int64_t i = 0; i < o.count; ++i) {
    const int64_t label = static_cast<int64_t>(splitmix64(state) % static_cast<uint64_t>(o.classes));
    d->labels[i] = static_cast<uint8_t>(label);
    for (int64_t j = 0; j < numel; ++j) {
      const int delta = noise ? static_cast<int>(splitmix64(state) % (2 * noise + 1)) - noise : 0;
      d->images[i * numel + j] = static_cast<uint8_t>(std::clamp(protos[label * numel + j] + delta, 0, 255));
    }
  }
  for (int64_t c = 0; c < o.classes; ++c) d->class_names.push_back("class " + std::to_string(c));
  return d;
}

DatasetPtr take(const DatasetPtr& data, int64_t limit) {
  if (!data) throw Error("take: no dataset");
  if (limit <= 0 || limit >= data->count) return data;
  auto d = std::make_shared<Dataset>(*data);
  d->name = data->name + "[:" + std::to_string(limit) + "]";
  d->count = limit;
  if (data->has_values()) {
    d->values.resize(static_cast<size_t>(limit * data->sample_numel()));
    d->targets.resize(static_cast<size_t>(limit * data->target_numel()));
  } else {
    d->images.resize(static_cast<size_t>(limit * data->sample_numel()));
    d->labels.resize(static_cast<size_t>(limit));
  }
  return d;
}

ChannelStats channel_stats(const Dataset& data) {
  if (data.has_values())
    throw Error("channel statistics: " + data.name + " holds values, not images with channels");
  const int64_t c = data.channels, plane = data.height * data.width;
  ChannelStats out;
  out.mean.assign(static_cast<size_t>(c), 0.0);
  out.std.assign(static_cast<size_t>(c), 0.0);
  if (data.count == 0 || plane == 0) return out;
  // Integer sums of bytes and their squares are exact; 2^64 / 255^2 leaves room for 2.8e14 pixels.
  std::vector<uint64_t> sum(static_cast<size_t>(c), 0), squares(static_cast<size_t>(c), 0);
  for (int64_t i = 0; i < data.count; ++i)
    for (int64_t ch = 0; ch < c; ++ch) {
      const uint8_t* p = data.images.data() + (i * c + ch) * plane;
      uint64_t s = 0, q = 0;
      for (int64_t j = 0; j < plane; ++j) s += p[j], q += uint64_t(p[j]) * p[j];
      sum[ch] += s, squares[ch] += q;
    }
  const double n = static_cast<double>(data.count) * static_cast<double>(plane);
  for (int64_t ch = 0; ch < c; ++ch) {
    const double mean = static_cast<double>(sum[ch]) / n;
    const double var = std::max(0.0, static_cast<double>(squares[ch]) / n - mean * mean);
    out.mean[ch] = mean / 255.0;
    out.std[ch] = std::sqrt(var) / 255.0;
  }
  return out;
}

AugmentDraw draw_augment(const Transform& t, uint64_t seed, int64_t epoch, int64_t sample) {
  // A stream of its own: the salt keeps these draws apart from the epoch's shuffle of the same seed.
  uint64_t state =
      mix(mix(mix(seed, 0x61756720ull), static_cast<uint64_t>(epoch)), static_cast<uint64_t>(sample));
  AugmentDraw d;
  if (t.crop_padding > 0) {
    const uint64_t span = static_cast<uint64_t>(2 * t.crop_padding + 1);
    d.dy = static_cast<int64_t>(splitmix64(state) % span);
    d.dx = static_cast<int64_t>(splitmix64(state) % span);
  }
  if (t.flip) d.flip = (splitmix64(state) >> 63) != 0;
  return d;
}

void augment_sample(const Transform& t, const AugmentDraw& d, float* sample, int64_t channels, int64_t height,
                    int64_t width) {
  const int64_t h = height, w = width;
  // Output (y, x) reads input (y + sy, x + sx): RandomCrop's window in the image padded by crop_padding.
  const int64_t sy = t.crop_padding > 0 ? d.dy - t.crop_padding : 0;
  const int64_t sx = t.crop_padding > 0 ? d.dx - t.crop_padding : 0;
  if (sy != 0 || sx != 0) {
    const int64_t n = std::max<int64_t>(0, w - std::abs(sx));
    const int64_t out0 = std::max<int64_t>(0, -sx), in0 = std::max<int64_t>(0, sx);
    for (int64_t ch = 0; ch < channels; ++ch) {
      float* plane = sample + ch * h * w;
      // In place: rows are walked so that each source row is read before it is overwritten.
      for (int64_t k = 0; k < h; ++k) {
        const int64_t y = sy >= 0 ? k : h - 1 - k, ys = y + sy;
        float* dst = plane + y * w;
        if (ys < 0 || ys >= h || n == 0) {
          std::fill(dst, dst + w, 0.0f);
          continue;
        }
        std::memmove(dst + out0, plane + ys * w + in0, static_cast<size_t>(n) * sizeof(float));
        std::fill(dst, dst + out0, 0.0f);
        std::fill(dst + out0 + n, dst + w, 0.0f);
      }
    }
  }
  if (d.flip)
    for (int64_t r = 0; r < channels * h; ++r) std::reverse(sample + r * w, sample + (r + 1) * w);
}

void normalize_sample(const Transform& t, float* sample, int64_t channels, int64_t height, int64_t width) {
  if (!t.normalizes()) return;
  const int64_t plane = height * width;
  for (int64_t ch = 0; ch < channels; ++ch) {
    const float mean = t.mean[ch], std = t.std[ch];
    float* p = sample + ch * plane;
    for (int64_t j = 0; j < plane; ++j) p[j] = (p[j] - mean) / std;
  }
}

std::vector<int64_t> shuffled_indices(int64_t n, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) order[i] = i;
  uint64_t state = seed ^ (0x9E3779B97F4A7C15ull * static_cast<uint64_t>(epoch + 1));
  for (int64_t i = n - 1; i > 0; --i) {
    const int64_t j = static_cast<int64_t>(splitmix64(state) % static_cast<uint64_t>(i + 1));
    std::swap(order[i], order[j]);
  }
  return order;
}

// --- the loader --------------------------------------------------------------------------------------------

// Batch buffers of one size, reused: page-locked allocation costs milliseconds. Buffers come back when the
// last holder of a batch (often an op that copies it to a device) lets go, so the pool outlives the loader.
struct DataLoader::Pool {
  size_t bytes = 0;
  bool pinned = false;
  std::mutex mutex;
  std::vector<void*> free;

  ~Pool() {
    for (void* p : free) release(p);
  }
  void release(void* p) const {
    if (pinned)
      pinned_free(p);
    else
      std::free(p);
  }
  void* get() {
    {
      std::lock_guard lock(mutex);
      if (!free.empty()) {
        void* p = free.back();
        free.pop_back();
        return p;
      }
    }
    void* p = pinned ? pinned_alloc(bytes) : std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!p)
      throw Error("data loader: out of host memory for a batch of " +
                  format_bytes(static_cast<int64_t>(bytes)));
    return p;
  }
  void put(void* p) {
    std::lock_guard lock(mutex);
    free.push_back(p);
  }
};

namespace {
// An image dataset's transform must fit its channels.
void check_transform(const Dataset& data) {
  const Transform& t = data.transform;
  if (t.crop_padding < 0) throw Error("data loader: the crop padding must be 0 (none) or more");
  if (t.normalizes()) {
    if (static_cast<int64_t>(t.mean.size()) != data.channels ||
        static_cast<int64_t>(t.std.size()) != data.channels)
      throw Error("data loader: normalisation needs one mean and one std per channel (" +
                  std::to_string(data.channels) + "), got " + std::to_string(t.mean.size()) + " and " +
                  std::to_string(t.std.size()));
    for (float s : t.std)
      if (!(s > 0) || !std::isfinite(s))
        throw Error("data loader: normalisation needs standard deviations above 0");
  }
}

// A value dataset's buffers must hold what its shapes say, or batches would read past them.
void check_values(const Dataset& data) {
  for (int64_t d : data.sample_shape)
    if (d < 1) throw Error("data loader: " + data.name + " has samples " + shape_str(data.sample_shape));
  for (int64_t d : data.target_shape)
    if (d < 1) throw Error("data loader: " + data.name + " has targets " + shape_str(data.target_shape));
  const auto need_values = static_cast<size_t>(data.count * data.sample_numel());
  const auto need_targets = static_cast<size_t>(data.count * data.target_numel());
  if (data.count < 0 || data.values.size() != need_values || data.targets.size() != need_targets)
    throw Error("data loader: " + data.name + " has " + std::to_string(data.values.size()) + " values and " +
                std::to_string(data.targets.size()) + " targets for " + std::to_string(data.count) +
                " samples " + shape_str(data.sample_shape) + " with targets " + shape_str(data.target_shape));
}
}  // namespace

DataLoader::DataLoader(DatasetPtr data, LoaderOptions options) : data_(std::move(data)), options_(options) {
  if (!data_) throw Error("data loader: no dataset");
  if (options_.batch_size < 1) throw Error("data loader: batch size must be at least 1");
  if (options_.shards < 1 || options_.shard < 0 || options_.shard >= options_.shards)
    throw Error("data loader: shard " + std::to_string(options_.shard) + " of " +
                std::to_string(options_.shards));
  if (options_.resize < 0) throw Error("data loader: resize must be 0 (none) or a size");
  if (options_.prefetch < 1) options_.prefetch = 1;
  if (data_->has_values()) {
    check_values(*data_);
    if (options_.resize)
      throw Error("data loader: resize applies to images, and " + data_->name + " holds values " +
                  shape_str(data_->sample_shape));
    sample_floats_ = data_->sample_numel();
    target_floats_ = data_->target_numel();
  } else {
    check_transform(*data_);
    out_h_ = options_.resize ? options_.resize : data_->height;
    out_w_ = options_.resize ? options_.resize : data_->width;
    sample_floats_ = data_->channels * out_h_ * out_w_;
    target_floats_ = 1;
  }
  if (data_->sequential && data_->count > 0)
    sequential_batches_ = std::max<int64_t>(1, data_->count / options_.batch_size);
  pool_ = std::make_shared<Pool>();
  pool_->bytes = static_cast<size_t>(options_.batch_size * (sample_floats_ + target_floats_)) * sizeof(float);
  // Page-locked only where CUDA can give it; the probe buffer becomes the pool's first.
  if (options_.pinned) {
    if (void* p = pinned_alloc(pool_->bytes)) {
      pool_->pinned = true;
      pool_->free.push_back(p);
    }
  }
}

DataLoader::~DataLoader() {
  stop();
}

int64_t DataLoader::batch_rows() const {
  if (!data_->sequential) return options_.batch_size;
  return std::min(options_.batch_size, data_->count);
}

int64_t DataLoader::batches_per_epoch() const {
  if (data_->sequential) return sequential_batches_;
  const int64_t b = options_.batch_size;
  return options_.drop_last ? data_->count / b : (data_->count + b - 1) / b;
}

int64_t DataLoader::samples_per_epoch() const {
  if (data_->sequential) return sequential_batches_ * batch_rows();
  return options_.drop_last ? batches_per_epoch() * options_.batch_size : data_->count;
}

std::vector<int64_t> DataLoader::epoch_order(int64_t epoch) const {
  if (data_->sequential) {
    // d2l's seq_data_iter_sequential: position b * rows + i, row i of batch b, is window i * nb + b.
    const int64_t rows = batch_rows(), nb = sequential_batches_;
    std::vector<int64_t> order(static_cast<size_t>(rows * nb));
    for (int64_t b = 0; b < nb; ++b)
      for (int64_t i = 0; i < rows; ++i) order[static_cast<size_t>(b * rows + i)] = i * nb + b;
    return order;
  }
  if (options_.shuffle) return shuffled_indices(data_->count, options_.seed, epoch);
  std::vector<int64_t> order(static_cast<size_t>(data_->count));
  for (int64_t i = 0; i < data_->count; ++i) order[i] = i;
  return order;
}

void DataLoader::stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::lock_guard lock(mutex_);
  queue_.clear();
  finished_ = true;
}

void DataLoader::start_epoch(int64_t epoch, int64_t first_batch) {
  stop();
  if (first_batch < 0 || first_batch > batches_per_epoch())
    throw Error("data loader: batch " + std::to_string(first_batch) + " is outside an epoch of " +
                std::to_string(batches_per_epoch()) + " batches");
  std::vector<int64_t> order = epoch_order(epoch);
  {
    std::lock_guard lock(mutex_);
    stopping_ = false;
    finished_ = false;
    error_ = nullptr;
  }
  thread_ = std::thread([this, order = std::move(order), epoch, first_batch]() mutable {
    produce(std::move(order), epoch, first_batch);
  });
}

double DataLoader::ms_per_batch() const {
  const int64_t n = prepared_batches_.load();
  return n ? static_cast<double>(prepare_ns_.load()) / 1e6 / static_cast<double>(n) : 0.0;
}

void DataLoader::produce(std::vector<int64_t> order, int64_t epoch, int64_t first_batch) {
  try {
    const int64_t batches = batches_per_epoch(), rows = batch_rows();
    for (int64_t b = first_batch; b < batches; ++b) {
      {
        std::unique_lock lock(mutex_);
        cv_.wait(lock, [&] { return stopping_ || static_cast<int>(queue_.size()) < options_.prefetch; });
        if (stopping_) return;
      }
      const int64_t begin = b * rows;
      const int64_t end = std::min<int64_t>(begin + rows, static_cast<int64_t>(order.size()));
      const auto t0 = std::chrono::steady_clock::now();
      std::vector<int64_t> mine;
      if (data_->sequential) {
        // A contiguous block of rows, the same in every batch, so that this shard's rows continue too.
        const int64_t lo = rows * options_.shard / options_.shards;
        const int64_t hi = rows * (options_.shard + 1) / options_.shards;
        mine.assign(order.begin() + begin + lo, order.begin() + begin + hi);
      } else {
        // This shard's samples of the global batch: every shards-th from its own offset.
        for (int64_t k = begin + options_.shard; k < end; k += options_.shards) mine.push_back(order[k]);
      }
      HostBatchPtr batch = make_batch(mine, end - begin, epoch);
      prepare_ns_ +=
          std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
      ++prepared_batches_;
      {
        std::lock_guard lock(mutex_);
        queue_.push_back(std::move(batch));
      }
      cv_.notify_all();
    }
  } catch (...) {
    std::lock_guard lock(mutex_);
    error_ = std::current_exception();
  }
  {
    std::lock_guard lock(mutex_);
    finished_ = true;
  }
  cv_.notify_all();
}

namespace {

// One sample as [0, 1] floats at the loader's size: scaled, and bilinearly resized when taps are given.
void read_sample(const uint8_t* src, float* dst, int64_t c, int64_t h, int64_t w, int64_t out_h,
                 int64_t out_w, const std::vector<Tap>& ty, const std::vector<Tap>& tx,
                 std::vector<float>& plane) {
  constexpr float kScale = 1.0f / 255.0f;
  if (ty.empty()) {
    for (int64_t j = 0; j < c * h * w; ++j) dst[j] = static_cast<float>(src[j]) * kScale;
    return;
  }
  for (int64_t ch = 0; ch < c; ++ch) {
    for (int64_t j = 0; j < h * w; ++j) plane[j] = static_cast<float>(src[ch * h * w + j]) * kScale;
    float* out = dst + ch * out_h * out_w;
    for (int64_t oy = 0; oy < out_h; ++oy) {
      const Tap& a = ty[oy];
      const float* r0 = plane.data() + a.i0 * w;
      const float* r1 = plane.data() + a.i1 * w;
      for (int64_t ox = 0; ox < out_w; ++ox) {
        const Tap& b = tx[ox];
        const float top = r0[b.i0] + (r0[b.i1] - r0[b.i0]) * b.w1;
        const float bot = r1[b.i0] + (r1[b.i1] - r1[b.i0]) * b.w1;
        out[oy * out_w + ox] = top + (bot - top) * a.w1;
      }
    }
  }
}

}  // namespace

HostBatchPtr DataLoader::make_batch(const std::vector<int64_t>& samples, int64_t global_size, int64_t epoch) {
  auto batch = std::make_shared<HostBatch>();
  batch->size = static_cast<int64_t>(samples.size());
  if (data_->has_values()) {
    batch->sample_shape = data_->sample_shape;
    batch->target_shape = data_->target_shape;
  } else {
    batch->channels = data_->channels, batch->height = out_h_, batch->width = out_w_;
    batch->sample_shape = {data_->channels, out_h_, out_w_};
  }
  batch->global_size = global_size;
  batch->pad_target = data_->pad_target;
  void* raw = pool_->get();
  std::shared_ptr<Pool> pool = pool_;
  batch->storage = std::shared_ptr<void>(raw, [pool](void* p) { pool->put(p); });
  batch->pinned = pool_->pinned;
  auto* images = static_cast<float*>(raw);
  float* labels = images + options_.batch_size * sample_floats_;
  batch->images = images;
  batch->labels = labels;
  if (data_->has_values())
    read_values(samples, images, labels);
  else
    read_images(samples, images, labels, epoch);
  return batch;
}

void DataLoader::read_values(const std::vector<int64_t>& samples, float* images, float* labels) const {
  const auto sample = static_cast<size_t>(sample_floats_), target = static_cast<size_t>(target_floats_);
  for (size_t i = 0; i < samples.size(); ++i) {
    const auto s = static_cast<size_t>(samples[i]);
    std::memcpy(images + i * sample, data_->values.data() + s * sample, sample * sizeof(float));
    std::memcpy(labels + i * target, data_->targets.data() + s * target, target * sizeof(float));
  }
}

void DataLoader::read_images(const std::vector<int64_t>& samples, float* images, float* labels,
                             int64_t epoch) const {
  const int64_t n = static_cast<int64_t>(samples.size()), c = data_->channels, h = data_->height,
                w = data_->width;
  const bool resize = out_h_ != h || out_w_ != w;
  std::vector<Tap> ty, tx;
  if (resize) ty = taps(h, out_h_), tx = taps(w, out_w_);
  std::vector<float> plane(resize ? static_cast<size_t>(h * w) : 0);
  const Transform& transform = data_->transform;
  const bool augment = options_.shuffle && transform.augments();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t s = samples[static_cast<size_t>(i)];
    labels[i] = static_cast<float>(data_->labels[s]);
    float* dst = images + i * c * out_h_ * out_w_;
    read_sample(data_->images.data() + s * c * h * w, dst, c, h, w, out_h_, out_w_, ty, tx, plane);
    // Keyed by the sample, not its place in the batch: a seed and epoch give the same images in any order.
    if (augment)
      augment_sample(transform, draw_augment(transform, options_.seed, epoch, s), dst, c, out_h_, out_w_);
    normalize_sample(transform, dst, c, out_h_, out_w_);
  }
}

HostBatchPtr DataLoader::next() {
  std::unique_lock lock(mutex_);
  cv_.wait(lock, [&] { return !queue_.empty() || finished_ || error_; });
  if (error_) std::rethrow_exception(error_);
  if (queue_.empty()) return nullptr;
  HostBatchPtr b = std::move(queue_.front());
  queue_.pop_front();
  lock.unlock();
  cv_.notify_all();
  return b;
}

namespace {
Shape rows_of(int64_t n, const Shape& each) {
  Shape shape{n};
  shape.insert(shape.end(), each.begin(), each.end());
  return shape;
}
}  // namespace

DeviceBatch to_device(Runtime& rt, const HostBatchPtr& batch, int64_t begin, int64_t end, Device device) {
  if (!batch) throw Error("to_device: no batch");
  if (begin < 0 || end > batch->size || begin >= end)
    throw Error("to_device: rows [" + std::to_string(begin) + ", " + std::to_string(end) +
                ") of a batch of " + std::to_string(batch->size));
  const int64_t n = end - begin;
  DeviceBatch out{Tensor(rt, rows_of(n, batch->sample_dims()), device, StreamKind::Copy),
                  Tensor(rt, rows_of(n, batch->target_shape), device, StreamKind::Copy)};
  copy_batch_into(batch, begin, out);
  return out;
}

void copy_batch_into(const HostBatchPtr& batch, int64_t begin, const DeviceBatch& dst) {
  if (!batch) throw Error("copy_batch_into: no batch");
  const Tensor images = dst.images, labels = dst.labels;
  const int64_t n = labels.shape().empty() ? 0 : labels.shape()[0];
  if (labels.shape() != rows_of(n, batch->target_shape) ||
      images.shape() != rows_of(n, batch->sample_dims()) || begin < 0 || begin + n > batch->size)
    throw ShapeError("copy_batch_into: rows [" + std::to_string(begin) + ", " + std::to_string(begin + n) +
                     ") of a batch of " + std::to_string(batch->size) + " samples " +
                     shape_str(batch->sample_dims()) + " with targets " + shape_str(batch->target_shape) +
                     " do not fit " + images.str() + " and " + labels.str());
  Runtime& rt = images.runtime();
  const Device device = images.device();
  Backend* be = &rt.backend(device);
  const float* img = batch->images + begin * batch->sample_numel();
  const float* lbl = batch->labels + begin * batch->target_numel();
  // Page-locked sources copy asynchronously as they are; pageable ones go through the backend's staging.
  const bool staging = !batch->pinned;
  rt.engine().push(
      [be, batch, img, lbl, images, labels, staging](OpContext& c) {
        be->copy({images.data(), images.device()}, {const_cast<float*>(img), Device::cpu()}, images.bytes(),
                 staging, c);
        be->copy({labels.data(), labels.device()}, {const_cast<float*>(lbl), Device::cpu()}, labels.bytes(),
                 staging, c);
      },
      {}, {images.var(), labels.var()}, device, StreamKind::Copy,
      {"batch to device", "", images.bytes() + labels.bytes(), 0});
}

}  // namespace gn::nn
