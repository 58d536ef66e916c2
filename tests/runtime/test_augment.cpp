// The loader's augmentation and normalisation (runtime/nn/data): the random crop and flip against an
// independent pad-then-crop, draws keyed by (seed, epoch, sample), per-channel statistics against a float64
// sum, and the loader applying the dataset's transform to shuffled passes only, the same in any batching.
#include <QtTest>
#include <cmath>
#include <functional>
#include <set>

#include "gpunodes/errors.h"
#include "gpunodes/nn/data.h"
#include "nn_test_util.h"

using namespace gn;
using namespace gn::nn;

namespace {

// torchvision's RandomCrop(size, padding) then RandomHorizontalFlip, written out the long way: build the
// zero-padded image, cut the window at (dy, dx), mirror each row.
std::vector<float> reference(const std::vector<float>& in, int64_t c, int64_t h, int64_t w, int64_t pad,
                             const AugmentDraw& d) {
  const int64_t ph = h + 2 * pad, pw = w + 2 * pad;
  std::vector<float> padded(static_cast<size_t>(c * ph * pw), 0.0f);
  for (int64_t ch = 0; ch < c; ++ch)
    for (int64_t y = 0; y < h; ++y)
      for (int64_t x = 0; x < w; ++x) padded[(ch * ph + y + pad) * pw + x + pad] = in[(ch * h + y) * w + x];
  std::vector<float> out(in.size());
  for (int64_t ch = 0; ch < c; ++ch)
    for (int64_t y = 0; y < h; ++y)
      for (int64_t x = 0; x < w; ++x) {
        const int64_t sx = d.flip ? w - 1 - x : x;
        out[(ch * h + y) * w + x] = padded[(ch * ph + y + d.dy) * pw + sx + d.dx];
      }
  return out;
}

// A dataset of `count` random byte images with a transform.
std::shared_ptr<Dataset> randomSet(int64_t count, int64_t c, int64_t h, int64_t w, uint64_t seed) {
  SyntheticOptions so;
  so.count = count, so.channels = c, so.height = h, so.width = w, so.seed = seed, so.classes = 3;
  return std::make_shared<Dataset>(*make_synthetic(so));
}

// The images of one epoch's batches, concatenated in the loader's order.
std::vector<float> epochImages(DataLoader& loader, int64_t epoch) {
  loader.start_epoch(epoch);
  std::vector<float> out;
  while (HostBatchPtr b = loader.next())
    out.insert(out.end(), b->images, b->images + b->size * b->sample_numel());
  return out;
}

}  // namespace

class AugmentTest : public QObject {
  Q_OBJECT

 private slots:
  void crop_and_flip_match_pad_then_crop() {
    const int64_t c = 3, h = 5, w = 7, pad = 2;
    std::vector<float> img(static_cast<size_t>(c * h * w));
    for (size_t i = 0; i < img.size(); ++i) img[i] = static_cast<float>(i + 1);
    Transform t;
    t.crop_padding = pad;
    t.flip = true;
    // Every window and both flips, each checked against the long way round.
    for (int64_t dy = 0; dy <= 2 * pad; ++dy)
      for (int64_t dx = 0; dx <= 2 * pad; ++dx)
        for (bool flip : {false, true}) {
          const AugmentDraw d{dy, dx, flip};
          std::vector<float> got = img;
          augment_sample(t, d, got.data(), c, h, w);
          QCOMPARE(got, reference(img, c, h, w, pad, d));
        }
    // The centred window without a flip leaves the image as it was.
    std::vector<float> same = img;
    augment_sample(t, {pad, pad, false}, same.data(), c, h, w);
    QCOMPARE(same, img);
    // Padding wider than the image: whole rows and columns of zeros.
    Transform wide;
    wide.crop_padding = 9;
    std::vector<float> gone = img;
    augment_sample(wide, {0, 0, false}, gone.data(), c, h, w);
    QCOMPARE(gone, std::vector<float>(img.size(), 0.0f));
  }

  void draws_are_keyed_by_seed_epoch_and_sample() {
    Transform t;
    t.crop_padding = 4;
    t.flip = true;
    std::set<int64_t> dys, dxs;
    int flips = 0;
    const int n = 20000;
    for (int s = 0; s < n; ++s) {
      const AugmentDraw a = draw_augment(t, 7, 3, s), b = draw_augment(t, 7, 3, s);
      QCOMPARE(a.dy, b.dy);
      QCOMPARE(a.dx, b.dx);
      QCOMPARE(a.flip, b.flip);
      QVERIFY(a.dy >= 0 && a.dy <= 8 && a.dx >= 0 && a.dx <= 8);
      dys.insert(a.dy);
      dxs.insert(a.dx);
      flips += a.flip;
    }
    QCOMPARE(dys.size(), size_t(9));
    QCOMPARE(dxs.size(), size_t(9));
    // p = 0.5: 20,000 draws land within 3% of half (about 8 standard deviations).
    QVERIFY2(std::abs(flips - n / 2) < n * 3 / 100, qPrintable(QString::number(flips)));
    // Another epoch or seed draws otherwise.
    int sameEpoch = 0, sameSeed = 0;
    for (int s = 0; s < 1000; ++s) {
      const AugmentDraw a = draw_augment(t, 7, 3, s), e = draw_augment(t, 7, 4, s),
                        k = draw_augment(t, 8, 3, s);
      sameEpoch += a.dy == e.dy && a.dx == e.dx && a.flip == e.flip;
      sameSeed += a.dy == k.dy && a.dx == k.dx && a.flip == k.flip;
    }
    // 1 in 162 agree by chance.
    QVERIFY2(sameEpoch < 30 && sameSeed < 30, qPrintable(QString("%1 %2").arg(sameEpoch).arg(sameSeed)));
    // Nothing to draw without crop or flip.
    const AugmentDraw none = draw_augment(Transform{}, 7, 3, 5);
    QVERIFY(none.dy == 0 && none.dx == 0 && !none.flip);
  }

  void channel_stats_match_a_float64_sum() {
    auto d = randomSet(40, 3, 6, 5, 11);
    const ChannelStats st = channel_stats(*d);
    QCOMPARE(st.mean.size(), size_t(3));
    const int64_t plane = 30;
    for (int64_t ch = 0; ch < 3; ++ch) {
      double sum = 0, sq = 0;
      for (int64_t i = 0; i < d->count; ++i)
        for (int64_t j = 0; j < plane; ++j) sum += d->images[(i * 3 + ch) * plane + j] / 255.0;
      const double n = static_cast<double>(d->count * plane), mean = sum / n;
      for (int64_t i = 0; i < d->count; ++i)
        for (int64_t j = 0; j < plane; ++j) {
          const double v = d->images[(i * 3 + ch) * plane + j] / 255.0 - mean;
          sq += v * v;
        }
      QVERIFY(std::abs(st.mean[ch] - mean) < 1e-12);
      QVERIFY(std::abs(st.std[ch] - std::sqrt(sq / n)) < 1e-12);
    }
    float sample[6] = {0.5f, 0.25f, 1.0f, 0.0f, 0.75f, 0.5f};
    Transform t;
    t.mean = {0.5f, 0.25f, 0.5f};
    t.std = {0.5f, 0.25f, 2.0f};
    normalize_sample(t, sample, 3, 1, 2);
    QCOMPARE(std::vector<float>(sample, sample + 6),
             (std::vector<float>{0.0f, -0.5f, 3.0f, -1.0f, 0.125f, 0.0f}));
  }

  void loader_augments_shuffled_passes_the_same_in_any_batching() {
    auto d = randomSet(50, 2, 8, 8, 3);
    d->transform.crop_padding = 3;
    d->transform.flip = true;
    const ChannelStats st = channel_stats(*d);
    for (int ch = 0; ch < 2; ++ch) {
      d->transform.mean.push_back(static_cast<float>(st.mean[ch]));
      d->transform.std.push_back(static_cast<float>(st.std[ch]));
    }
    DatasetPtr data = d;
    const int64_t numel = d->sample_numel();

    DataLoader a(data, {.batch_size = 7, .seed = 5}), b(data, {.batch_size = 32, .seed = 5});
    const std::vector<float> e0 = epochImages(a, 0);
    QCOMPARE(e0, epochImages(a, 0));  // the same seed and epoch: the same floats
    QCOMPARE(e0, epochImages(b, 0));  // whatever the batch size
    QVERIFY(e0 != epochImages(a, 1));
    QVERIFY(a.batches_prepared() > 0 && a.ms_per_batch() > 0);

    // Each sample as the loader's order, draw and normalisation make it, computed here.
    const std::vector<int64_t> order = shuffled_indices(50, 5, 0);
    int64_t changed = 0;
    for (int64_t k = 0; k < 50; ++k) {
      const int64_t s = order[k];
      std::vector<float> x(static_cast<size_t>(numel));
      for (int64_t j = 0; j < numel; ++j) x[j] = d->images[s * numel + j] / 255.0f;
      const std::vector<float> plain = x;
      std::vector<float> want = reference(x, 2, 8, 8, 3, draw_augment(d->transform, 5, 0, s));
      changed += want != plain;
      for (int64_t ch = 0; ch < 2; ++ch)
        for (int64_t j = 0; j < 64; ++j) {
          float& v = want[ch * 64 + j];
          v = (v - d->transform.mean[ch]) / d->transform.std[ch];
        }
      const std::vector<float> got(e0.begin() + k * numel, e0.begin() + (k + 1) * numel);
      for (int64_t j = 0; j < numel; ++j) QVERIFY(std::abs(got[j] - want[j]) < 1e-5f);
    }
    QVERIFY2(changed > 40, qPrintable(QString::number(changed)));

    // An evaluation pass (in order) is normalised and nothing more.
    DataLoader eval(data, {.batch_size = 16, .shuffle = false});
    const std::vector<float> plain = epochImages(eval, 0);
    QCOMPARE(plain, epochImages(eval, 3));
    for (int64_t s = 0; s < 50; ++s)
      for (int64_t j = 0; j < numel; ++j) {
        const int64_t ch = j / 64;
        const float want = (d->images[s * numel + j] / 255.0f - d->transform.mean[ch]) / d->transform.std[ch];
        QVERIFY(std::abs(plain[s * numel + j] - want) < 1e-5f);
      }
  }

  void loader_refuses_a_transform_that_does_not_fit() {
    auto d = randomSet(4, 3, 4, 4, 1);
    d->transform.mean = {0.5f};
    d->transform.std = {0.5f};
    expect_error([&] { DataLoader l(d, {}); }, {"one mean and one std per channel (3)"});
    d->transform.mean = {0.5f, 0.5f, 0.5f};
    d->transform.std = {0.5f, 0.0f, 0.5f};
    expect_error([&] { DataLoader l(d, {}); }, {"above 0"});
    d->transform = {};
    d->transform.crop_padding = -1;
    expect_error([&] { DataLoader l(d, {}); }, {"crop padding"});
  }
};

QTEST_GUILESS_MAIN(AugmentTest)
#include "test_augment.moc"
