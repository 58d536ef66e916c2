// A distributed run's data order: the ranks' shards of every batch together are the batch, and over an epoch
// every sample is read exactly once, by one rank, including a short last batch (nothing padded or dropped).
#include <QtTest>
#include <map>
#include <set>

#include "gpunodes/errors.h"
#include "gpunodes/nn/data.h"

using namespace gn;
using namespace gn::nn;

namespace {

// Each image's first two pixels spell its index, so a batch tells which samples it holds.
DatasetPtr numbered(int64_t count) {
  auto d = std::make_shared<Dataset>();
  d->name = "numbered";
  d->count = count;
  d->channels = 1, d->height = 2, d->width = 2;
  d->images.resize(static_cast<size_t>(count * 4));
  d->labels.resize(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    d->images[static_cast<size_t>(4 * i)] = static_cast<uint8_t>(i % 256);
    d->images[static_cast<size_t>(4 * i + 1)] = static_cast<uint8_t>(i / 256);
    d->labels[static_cast<size_t>(i)] = static_cast<uint8_t>(i % 10);
  }
  return d;
}

int64_t indexOf(const HostBatch& b, int64_t row) {
  const float* px = b.images + row * b.sample_numel();
  return static_cast<int64_t>(std::lround(px[0] * 255)) + 256 * static_cast<int64_t>(std::lround(px[1] * 255));
}

// Sample indices per batch, for one shard of an epoch.
std::vector<std::vector<int64_t>> readEpoch(const DatasetPtr& data, int shard, int shards, int64_t batch,
                                            int64_t epoch, std::vector<int64_t>* globalSizes = nullptr) {
  LoaderOptions o;
  o.batch_size = batch;
  o.seed = 3;
  o.shard = shard;
  o.shards = shards;
  DataLoader loader(data, o);
  loader.start_epoch(epoch);
  std::vector<std::vector<int64_t>> out;
  while (HostBatchPtr b = loader.next()) {
    std::vector<int64_t> ids;
    for (int64_t r = 0; r < b->size; ++r) ids.push_back(indexOf(*b, r));
    out.push_back(ids);
    if (globalSizes) globalSizes->push_back(b->global_size);
  }
  return out;
}

}  // namespace

class ShardsTest : public QObject {
  Q_OBJECT

 private slots:
  void shards_cover_every_sample_once_per_epoch() {
    const int64_t count = 1003, batch = 64;  // 16 batches, the last of 43
    const DatasetPtr data = numbered(count);
    for (int shards : {1, 2, 3, 5}) {
      for (int64_t epoch : {0, 1}) {
        const auto whole = readEpoch(data, 0, 1, batch, epoch);
        std::multiset<int64_t> seen;
        for (int s = 0; s < shards; ++s) {
          std::vector<int64_t> sizes;
          const auto mine = readEpoch(data, s, shards, batch, epoch, &sizes);
          QCOMPARE(mine.size(), whole.size());  // every rank steps every batch
          for (size_t b = 0; b < mine.size(); ++b) {
            QCOMPARE(sizes[b], static_cast<int64_t>(whole[b].size()));
            // The shard is every shards-th sample of the global batch, from position s.
            for (size_t k = 0; k < mine[b].size(); ++k)
              QCOMPARE(mine[b][k], whole[b][static_cast<size_t>(s) + k * static_cast<size_t>(shards)]);
            seen.insert(mine[b].begin(), mine[b].end());
          }
        }
        QCOMPARE(static_cast<int64_t>(seen.size()), count);
        for (int64_t i = 0; i < count; ++i) QCOMPARE(static_cast<int64_t>(seen.count(i)), int64_t(1));
      }
    }
  }

  void the_order_changes_with_the_epoch_and_repeats_with_the_seed() {
    const DatasetPtr data = numbered(300);
    QVERIFY(readEpoch(data, 1, 2, 32, 0) != readEpoch(data, 1, 2, 32, 1));
    QVERIFY(readEpoch(data, 1, 2, 32, 4) == readEpoch(data, 1, 2, 32, 4));
  }

  void a_bad_shard_is_refused() {
    LoaderOptions o;
    o.shard = 2;
    o.shards = 2;
    QVERIFY_THROWS_EXCEPTION(Error, DataLoader(numbered(10), o));
  }
};

QTEST_APPLESS_MAIN(ShardsTest)
#include "test_shards.moc"
