// The Dataset node's image_folder with the real plugin: a folder of PNGs written here from real Fashion-MNIST
// images (the synthetic set where the package is missing) into class folders, with a corrupt PNG, a text file
// and an empty file among them. Loading (classes, counts, the one warning, the bytes themselves), training an
// MLP on it through Train and Evaluate, grey to RGB, resize, the train/test folder pair, the errors before
// and during a run, the memory refusal, augmentation (seeded, training batches only) and normalisation's
// statistics against a float64 computation.
#include <QBuffer>
#include <QDir>
#include <QFile>
#include <QFileInfo>
#include <QImage>
#include <QLoggingCategory>
#include <QSet>
#include <QTemporaryDir>
#include <QtTest>
#include <cmath>

#include "gpunodes/nn/data.h"
#include "model_values.h"
#include "nodes_test_util.h"

using namespace nodes_test;

namespace {

const QString kFashionMnist = "/usr/share/datasets/fashion-mnist";
// Fashion-MNIST's labels 0..9; sorted by name they are another order, which the folder's labels follow.
const QStringList kNames{"t-shirt", "trouser", "pullover", "dress", "coat",
                         "sandal",  "shirt",   "sneaker",  "bag",   "ankle boot"};
constexpr int kPerClass = 50;

bool haveFashionMnist() {
  for (const char* f : {"train-images-idx3-ubyte", "train-labels-idx1-ubyte"})
    if (!QFileInfo::exists(kFashionMnist + "/" + f + ".gz") && !QFileInfo::exists(kFashionMnist + "/" + f))
      return false;
  return true;
}

QByteArray bytesOf(const uint8_t* p, int64_t n) {
  return QByteArray(reinterpret_cast<const char*>(p), static_cast<qsizetype>(n));
}

bool savePng(const QString& path, const uint8_t* pixels, int w, int h) {
  QImage img(w, h, QImage::Format_Grayscale8);
  for (int y = 0; y < h; ++y) std::memcpy(img.scanLine(y), pixels + y * w, static_cast<size_t>(w));
  return img.save(path, "PNG");
}

void writeFile(const QString& path, const QByteArray& data) {
  QFile f(path);
  QVERIFY(f.open(QIODevice::WriteOnly));
  f.write(data);
}

// PNG's chunk checksum (ISO 3309 CRC-32), to forge a header that still passes libpng's check.
uint32_t crc32(const uchar* p, size_t n) {
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
  }
  return ~c;
}

// A real PNG whose IHDR claims side x side: the header reads, the pixels would not fit anywhere.
QByteArray forgedPng(uint32_t side) {
  const uint8_t px[4] = {1, 2, 3, 4};
  QImage img(2, 2, QImage::Format_Grayscale8);
  for (int y = 0; y < 2; ++y) std::memcpy(img.scanLine(y), px + 2 * y, 2);
  QByteArray png;
  QBuffer buf(&png);
  buf.open(QIODevice::WriteOnly);
  img.save(&buf, "PNG");
  auto* d = reinterpret_cast<uchar*>(png.data());
  for (int i = 0; i < 4; ++i) d[16 + i] = d[20 + i] = static_cast<uchar>(side >> (24 - 8 * i));
  const uint32_t crc = crc32(d + 12, 17);  // "IHDR" and its 13 bytes
  for (int i = 0; i < 4; ++i) d[29 + i] = static_cast<uchar>(crc >> (24 - 8 * i));
  return png;
}

std::shared_ptr<const gn::nodes::DatasetValue> datasetOf(const Harness::Context& ctx) {
  const PortValuePtr v = ctx.outputs.value("data");
  if (!v || !v->summary().startsWith("image_folder")) return nullptr;
  // The plugin's own type: its definition is shared through the header, its vtable stays in the plugin.
  return std::static_pointer_cast<const gn::nodes::DatasetValue>(v);
}

std::vector<float> epochImages(const gn::nn::DatasetPtr& data, const gn::nn::LoaderOptions& o,
                               int64_t epoch) {
  gn::nn::DataLoader loader(data, o);
  loader.start_epoch(epoch);
  std::vector<float> out;
  while (auto b = loader.next()) out.insert(out.end(), b->images, b->images + b->size * b->sample_numel());
  return out;
}

QStringList errorsFor(const ValidationReport& report, const QString& node) {
  QStringList out;
  for (const Issue& i : report.forNode(node))
    if (i.severity == Issue::Severity::Error) out.append(i.field + ": " + i.message);
  return out;
}

}  // namespace

class ImageFolderTest : public QObject {
  Q_OBJECT

  QTemporaryDir tmp_;
  QString root_;     // the folder of 500 images and 3 bad files
  QStringList bad_;  // the bad files' paths
  // Each class's images as written, by the folder's label (the sorted position of its name).
  QList<QSet<QByteArray>> originals_;
  QStringList sorted_;

  QString dir(const QString& name) {
    const QString d = tmp_.filePath(name);
    QDir().mkpath(d);
    return d;
  }

  std::unique_ptr<Harness::Context> load(Harness& h, QJsonObject params, QString* thrown = nullptr) {
    params.insert("name", "image_folder");
    if (!params.contains("path")) params.insert("path", root_);
    static int n = 0;
    const QString id = QString("data%1").arg(n++);
    auto ctx = h.execute(id, "Dataset", params, {}, thrown);
    h.waitDone(id);
    return ctx;
  }

 private slots:
  void initTestCase() {
    QVERIFY2(plugin(), "the GPU node set did not load from " GN_NODES_PLUGIN);
    QVERIFY(tmp_.isValid());
    // Qt relays libpng's complaints about the corrupt file on every load; the node's warning says it once.
    QLoggingCategory::setFilterRules("qt.gui.imageio=false");
    root_ = dir("fashion");
    sorted_ = kNames;
    std::sort(sorted_.begin(), sorted_.end());
    originals_.resize(10);
    gn::nn::DatasetPtr source;
    if (haveFashionMnist()) {
      source = gn::nn::load_fashion_mnist(gn::nn::Split::Train, kFashionMnist.toStdString());
    } else {
      qInfo("dataset-fashion-mnist is not installed: the folder holds synthetic images instead");
      source = gn::nn::make_synthetic({.count = 2000, .classes = 10, .seed = 4});
    }
    // The first 50 images of each class, saved as 8-bit grey PNGs in a folder named after the class.
    std::vector<int> written(10, 0);
    for (int64_t i = 0; i < source->count; ++i) {
      const int label = source->labels[i];
      if (written[label] == kPerClass) continue;
      const QString classDir = dir("fashion/" + kNames[label]);
      const uint8_t* px = source->images.data() + i * 784;
      QVERIFY(savePng(QString("%1/img_%2.png").arg(classDir).arg(i, 5, 10, QChar('0')), px, 28, 28));
      originals_[sorted_.indexOf(kNames[label])].insert(bytesOf(px, 784));
      ++written[label];
    }
    for (int c = 0; c < 10; ++c) QCOMPARE(written[c], kPerClass);
    bad_ = {root_ + "/coat/corrupt.png", root_ + "/bag/notes.txt", root_ + "/dress/empty.png"};
    writeFile(bad_[0], QByteArray("\x89PNG\r\n\x1a\n", 8) + QByteArray(200, '\x5a'));
    writeFile(bad_[1], "not an image\n");
    writeFile(bad_[2], {});
  }

  void loads_classes_counts_and_one_warning_for_the_bad_files() {
    Harness h(RunSettings{});
    QString thrown;
    auto ctx = load(h, {{"batch_size", 64}, {"shuffle_seed", 1}}, &thrown);
    QVERIFY2(thrown.isEmpty(), qPrintable(thrown));
    // One warning: the count and every bad path.
    QCOMPARE(ctx->warnings.size(), 1);
    const QString w = ctx->warnings[0];
    qInfo("the warning: %s", qPrintable(w));
    QVERIFY2(w.startsWith("3 files under " + root_), qPrintable(w));
    for (const QString& b : bad_) QVERIFY2(w.contains(b), qPrintable(w));
    QCOMPARE(ctx->fields["unreadable_files"].toDouble(), 3.0);
    QCOMPARE(ctx->fields["classes"].toArray(), QJsonArray::fromStringList(sorted_));
    // Stratified: 10 of each class's 50 held out.
    QCOMPARE(ctx->fields["train_samples"].toDouble(), 400.0);
    QCOMPARE(ctx->fields["test_samples"].toDouble(), 100.0);
    for (const QJsonValue& c : ctx->fields["train_class_counts"].toArray()) QCOMPARE(c.toDouble(), 40.0);
    for (const QJsonValue& c : ctx->fields["test_class_counts"].toArray()) QCOMPARE(c.toDouble(), 10.0);
    QCOMPARE(ctx->fields["image"].toArray(), (QJsonArray{1, 28, 28}));
    QVERIFY(ctx->fields["loader_ms_per_batch"].toDouble() > 0);
    qInfo("loader: %.3f ms per batch of 64", ctx->fields["loader_ms_per_batch"].toDouble());

    // The bytes themselves: each sample is one of its class's images, and no image is in both splits.
    auto data = datasetOf(*ctx);
    QVERIFY(data);
    const auto& s = data->spec();
    QCOMPARE(s.train->class_names.size(), size_t(10));
    for (int c = 0; c < 10; ++c) QCOMPARE(QString::fromStdString(s.train->class_names[c]), sorted_[c]);
    QSet<QByteArray> seen;
    for (const auto& split : {s.train, s.test})
      for (int64_t i = 0; i < split->count; ++i) {
        const QByteArray img = bytesOf(split->images.data() + i * 784, 784);
        QVERIFY(originals_[split->labels[i]].contains(img));
        seen.insert(img);
      }
    QCOMPARE(seen.size(), qsizetype(500));

    // The split and limit are drawn from shuffle_seed: the same seed gives the same test set, another does
    // not.
    auto again = datasetOf(*load(h, {{"shuffle_seed", 1}}));
    QCOMPARE(again->spec().test->images, s.test->images);
    auto other = datasetOf(*load(h, {{"shuffle_seed", 2}}));
    QVERIFY(other->spec().test->images != s.test->images);
    auto limited = load(h, {{"limit", 30}, {"shuffle_seed", 1}});
    QCOMPARE(limited->fields["train_samples"].toDouble(), 30.0);
    QCOMPARE(limited->fields["test_samples"].toDouble(), 30.0);
    int classesInLimit = 0;
    for (const QJsonValue& c : limited->fields["train_class_counts"].toArray())
      classesInLimit += c.toDouble() > 0;
    QVERIFY2(classesInLimit >= 7, "limit takes a seeded subset across the classes, not the first classes");
    // split=test alone loads no training images.
    auto testOnly = load(h, {{"split", "test"}});
    QCOMPARE(testOnly->fields["train_samples"].toDouble(), 0.0);
    QCOMPARE(testOnly->fields["test_samples"].toDouble(), 100.0);
  }

  void an_mlp_trains_on_it_well_above_chance() {
    GraphDocument doc;
    doc.setSettings(QJsonObject{{"cpu_devices", 1}});
    doc.addNode(makeNode("cpu", "Device", {{"kind", "cpu"}}));
    doc.addNode(makeNode("data", "Dataset", {{"name", "image_folder"}, {"path", root_}, {"batch_size", 32}}));
    doc.addNode(makeNode("data_aug", "Dataset",
                         {{"name", "image_folder"},
                          {"path", root_},
                          {"batch_size", 32},
                          {"normalize", true},
                          {"augment_flip", true},
                          {"augment_crop_padding", 2}}));
    doc.addNode(makeNode("net", "Model", {{"arch", "mlp"}}));
    wire(doc, "cpu.device", "net.device");
    for (const QString suffix : {"", "_aug"}) {
      doc.addNode(makeNode("train" + suffix, "Train", {{"epochs", 15}, {"lr", 0.1}, {"log_every", 0}}));
      doc.addNode(makeNode("eval" + suffix, "Evaluate"));
      wire(doc, "net.model", "train" + suffix + ".model");
      wire(doc, "data" + suffix + ".data", "train" + suffix + ".data");
      wire(doc, "cpu.device", "train" + suffix + ".devices");
      wire(doc, "train" + suffix + ".model", "eval" + suffix + ".model");
      wire(doc, "data" + suffix + ".data", "eval" + suffix + ".data");
    }
    const RunResult r = runGraph(doc);
    QVERIFY2(r.failures().isEmpty(), qPrintable(r.failures().join("\n")));
    QCOMPARE(r.node("data")["warnings"].toArray().size(), 1);
    const double plain = r.node("eval")["accuracy"].toDouble(),
                 aug = r.node("eval_aug")["accuracy"].toDouble();
    qInfo(
        "MLP on 400 training images, 15 epochs: test accuracy %.3f plain, %.3f with normalize, flip and "
        "crop (chance 0.1); train_acc %.3f and %.3f",
        plain, aug, r.node("train")["train_acc"].toDouble(), r.node("train_aug")["train_acc"].toDouble());
    QCOMPARE(r.node("eval")["samples"].toDouble(), 100.0);
    QVERIFY2(plain >= 0.5, qPrintable(QString::number(plain)));
    QVERIFY2(aug >= 0.5, qPrintable(QString::number(aug)));
  }

  void three_channels_repeat_grey_and_resize_scales() {
    Harness h(RunSettings{});
    auto rgb = load(h, {{"channels", 3}});
    QCOMPARE(rgb->fields["image"].toArray(), (QJsonArray{3, 28, 28}));
    auto d = datasetOf(*rgb)->spec().train;
    QCOMPARE(d->channels, int64_t(3));
    for (int64_t i = 0; i < d->count; ++i) {
      const uint8_t* p = d->images.data() + i * 3 * 784;
      const QByteArray r = bytesOf(p, 784), g = bytesOf(p + 784, 784), b = bytesOf(p + 2 * 784, 784);
      QVERIFY(r == g && g == b);
      QVERIFY(originals_[d->labels[i]].contains(r));
    }

    auto small = load(h, {{"resize", 14}, {"shuffle_seed", 1}});
    QCOMPARE(small->fields["image"].toArray(), (QJsonArray{1, 14, 14}));
    auto full = datasetOf(*load(h, {{"shuffle_seed", 1}}))->spec().train;
    auto half = datasetOf(*small)->spec().train;
    QCOMPARE(half->height, int64_t(14));
    QCOMPARE(half->count, full->count);
    // The same images (the same seeded order) at half the size keep their mean brightness.
    for (int64_t i = 0; i < half->count; ++i) {
      QCOMPARE(half->labels[i], full->labels[i]);
      double a = 0, b = 0;
      for (int j = 0; j < 196; ++j) a += half->images[i * 196 + j];
      for (int j = 0; j < 784; ++j) b += full->images[i * 784 + j];
      QVERIFY2(std::abs(a / 196 - b / 784) < 4.0, qPrintable(QString("%1 vs %2").arg(a / 196).arg(b / 784)));
    }
  }

  void colour_jpegs_read_as_rgb_or_grey() {
    // Two classes of flat colours, as JPEG (lossy: compared within a few levels).
    const QString jpegs = dir("jpegs");
    const QList<QPair<QString, QColor>> colours{{"blue", QColor(20, 40, 220)}, {"red", QColor(200, 30, 10)}};
    for (const auto& [name, colour] : colours)
      for (int i = 0; i < 3; ++i) {
        QImage img(16, 16, QImage::Format_RGB888);
        img.fill(colour);
        QVERIFY(img.save(dir("jpegs/" + name) + QString("/%1.jpg").arg(i), "JPEG", 95));
      }
    Harness h(RunSettings{});
    QString thrown;
    auto rgb = load(h, {{"path", jpegs}, {"channels", 3}, {"test_fraction", 0.0}}, &thrown);
    QVERIFY2(thrown.isEmpty(), qPrintable(thrown));
    QVERIFY(rgb->warnings.isEmpty());
    auto d = datasetOf(*rgb)->spec().train;
    QCOMPARE(d->count, int64_t(6));
    for (int64_t i = 0; i < d->count; ++i) {
      const QColor want = colours[d->labels[i]].second;
      const uint8_t* p = d->images.data() + i * 3 * 256;
      for (int j = 0; j < 256; ++j) {
        QVERIFY(std::abs(p[j] - want.red()) <= 6);
        QVERIFY(std::abs(p[256 + j] - want.green()) <= 6);
        QVERIFY(std::abs(p[512 + j] - want.blue()) <= 6);
      }
    }
    // Grey: one plane of ITU-R 601-2 luma, as PIL's convert("L") and torchvision's Grayscale give.
    auto grey = datasetOf(*load(h, {{"path", jpegs}, {"test_fraction", 0.0}}))->spec().train;
    QCOMPARE(grey->channels, int64_t(1));
    for (int64_t i = 0; i < grey->count; ++i) {
      const QColor c = colours[grey->labels[i]].second;
      const double luma = 0.299 * c.red() + 0.587 * c.green() + 0.114 * c.blue();
      for (int j = 0; j < 256; ++j)
        QVERIFY2(std::abs(grey->images[i * 256 + j] - luma) <= 6,
                 qPrintable(QString("%1 vs %2").arg(grey->images[i * 256 + j]).arg(luma)));
    }
  }

  void mixed_or_non_square_sizes_need_resize() {
    const QString mixed = dir("mixed");
    const std::vector<uint8_t> px(32 * 32, 128);
    QVERIFY(savePng(dir("mixed/a") + "/one.png", px.data(), 28, 28));
    QVERIFY(savePng(dir("mixed/b") + "/two.png", px.data(), 32, 32));
    Harness h(RunSettings{});
    QString thrown;
    load(h, {{"path", mixed}}, &thrown);
    QVERIFY2(thrown.contains(mixed + "/b/two.png is 32x32") &&
                 thrown.contains(mixed + "/a/one.png is 28x28") && thrown.contains("resize"),
             qPrintable(thrown));
    thrown.clear();
    auto ok = load(h, {{"path", mixed}, {"resize", 20}, {"test_fraction", 0.0}}, &thrown);
    QVERIFY2(thrown.isEmpty(), qPrintable(thrown));
    QCOMPARE(ok->fields["image"].toArray(), (QJsonArray{1, 20, 20}));
    QCOMPARE(ok->fields["train_samples"].toDouble(), 2.0);

    const QString wide = dir("wide");
    QVERIFY(savePng(dir("wide/a") + "/w.png", px.data(), 32, 16));
    thrown.clear();
    load(h, {{"path", wide}}, &thrown);
    QVERIFY2(thrown.contains("32x16, not square"), qPrintable(thrown));
  }

  void train_and_test_folders_are_the_split() {
    const QString pair = dir("pair");
    const std::vector<uint8_t> px(784, 0);
    // Three classes, 4 training and 2 test images each, with a distinct value per image.
    for (const QString split : {"train", "test"})
      for (const QString c : {"cat", "dog", "emu"})
        for (int i = 0; i < (split == QString("train") ? 4 : 2); ++i) {
          std::vector<uint8_t> v(784, static_cast<uint8_t>(10 * i + (split == QString("test") ? 100 : 0)));
          QVERIFY(savePng(dir("pair/" + split + "/" + c) + QString("/%1.png").arg(i), v.data(), 28, 28));
        }
    Harness h(RunSettings{});
    QString thrown;
    auto ctx = load(h, {{"path", pair}, {"test_fraction", 0.5}}, &thrown);
    QVERIFY2(thrown.isEmpty(), qPrintable(thrown));
    QCOMPARE(ctx->fields["classes"].toArray(), (QJsonArray{"cat", "dog", "emu"}));
    QCOMPARE(ctx->fields["train_samples"].toDouble(), 12.0);
    QCOMPARE(ctx->fields["test_samples"].toDouble(), 6.0);
    QCOMPARE(ctx->fields["split_by"].toString(), QString("the train and test folders"));
    QVERIFY(ctx->warnings.isEmpty());
    auto s = datasetOf(*ctx)->spec();
    for (int64_t i = 0; i < s.test->count; ++i) QVERIFY(s.test->images[i * 784] >= 100);
    for (int64_t i = 0; i < s.train->count; ++i) QVERIFY(s.train->images[i * 784] < 100);

    // The two folders must name the same classes.
    QVERIFY(savePng(dir("pair/train/fox") + "/0.png", px.data(), 28, 28));
    thrown.clear();
    load(h, {{"path", pair}}, &thrown);
    QVERIFY2(thrown.contains("must hold the same class folders") && thrown.contains("only in train: fox"),
             qPrintable(thrown));
  }

  void empty_or_missing_folders_are_clear_errors_before_and_during_the_run() {
    const QString emptyClass = dir("emptyclass");
    const std::vector<uint8_t> px(784, 7);
    QVERIFY(savePng(dir("emptyclass/full") + "/0.png", px.data(), 28, 28));
    dir("emptyclass/hollow");
    const QString noClasses = dir("noclasses");
    writeFile(noClasses + "/stray.png", {});
    const QString missing = tmp_.filePath("no-such-folder");
    const QList<QPair<QString, QString>> cases{
        {emptyClass, "the class folder " + emptyClass + "/hollow is empty"},
        {noClasses, noClasses + " has no class folders"},
        {missing, "the directory " + missing + " does not exist"}};
    Harness h(RunSettings{});
    for (const auto& [path, want] : cases) {
      GraphDocument doc;
      doc.addNode(makeNode("data", "Dataset", {{"name", "image_folder"}, {"path", path}}));
      const QStringList before = errorsFor(validate(doc, registry(), settingsOf(doc)), "data");
      QCOMPARE(before.size(), 1);
      QVERIFY2(before[0].startsWith("params.path: image_folder: ") && before[0].contains(want),
               qPrintable(before.join("\n")));
      QString thrown;
      load(h, {{"path", path}}, &thrown);
      QVERIFY2(thrown.contains(want), qPrintable(thrown));
    }
    // A class whose only files are unreadable.
    const QString unreadable = dir("unreadable");
    QVERIFY(savePng(dir("unreadable/good") + "/0.png", px.data(), 28, 28));
    writeFile(dir("unreadable/junk") + "/a.txt", "text");
    QString thrown;
    load(h, {{"path", unreadable}}, &thrown);
    QVERIFY2(thrown.contains("the class folder " + unreadable + "/junk has no readable image"),
             qPrintable(thrown));
  }

  void channels_and_resize_are_checked_against_the_model_before_the_run() {
    GraphDocument doc;
    doc.addNode(makeNode("cpu", "Device", {{"kind", "cpu"}}));
    doc.addNode(makeNode("net", "Model", {{"arch", "mlp"}}));
    wire(doc, "cpu.device", "net.device");
    const QList<QPair<QJsonObject, QString>> cases{
        {{}, {}},  // resize 0: the side comes from the first image's header, 28
        {{{"channels", 3}}, "the mlp model takes 1-channel images, but the dataset's have 3 channels"},
        {{{"resize", 32}}, "the mlp model is built for 28x28 images, but the dataset gives 32x32"}};
    int n = 0;
    for (const auto& [extra, want] : cases) {
      const QString data = QString("data%1").arg(n), train = QString("train%1").arg(n++);
      QJsonObject p{{"name", "image_folder"}, {"path", root_}};
      for (auto it = extra.begin(); it != extra.end(); ++it) p.insert(it.key(), it.value());
      doc.addNode(makeNode(data, "Dataset", p));
      doc.addNode(makeNode(train, "Train"));
      wire(doc, "net.model", train + ".model");
      wire(doc, data + ".data", train + ".data");
      wire(doc, "cpu.device", train + ".devices");
    }
    const ValidationReport report = validate(doc, registry(), settingsOf(doc));
    QCOMPARE(errorsFor(report, "train0"), QStringList{});
    QCOMPARE(errorsFor(report, "train1").size(), 1);
    QVERIFY2(errorsFor(report, "train1")[0].contains(cases[1].second),
             qPrintable(errorsFor(report, "train1")[0]));
    QCOMPARE(errorsFor(report, "train2").size(), 1);
    QVERIFY2(errorsFor(report, "train2")[0].contains(cases[2].second),
             qPrintable(errorsFor(report, "train2")[0]));
    // channels 3 is for image folders only, and test_fraction stays below 0.9.
    GraphDocument bad;
    bad.addNode(makeNode("fm", "Dataset", {{"channels", 3}}));
    bad.addNode(
        makeNode("tf", "Dataset", {{"name", "image_folder"}, {"path", root_}, {"test_fraction", 0.95}}));
    const ValidationReport refused = validate(bad, registry(), settingsOf(bad));
    QVERIFY2(errorsFor(refused, "fm").join("\n").contains("channels: fashion-mnist is grey"),
             qPrintable(errorsFor(refused, "fm").join("\n")));
    QVERIFY2(errorsFor(refused, "tf").join("\n").contains("test_fraction: must be between 0 and 0.9"),
             qPrintable(errorsFor(refused, "tf").join("\n")));
  }

  void images_that_cannot_fit_in_memory_are_refused_before_decoding() {
    // Twelve headers of 100,000 x 100,000 grey pixels: 120 GB once decoded.
    const QString huge = dir("huge");
    for (int i = 0; i < 12; ++i) writeFile(dir("huge/c") + QString("/%1.png").arg(i), forgedPng(100000));
    Harness h(RunSettings{});
    QString thrown;
    load(h, {{"path", huge}}, &thrown);
    qInfo("the refusal: %s", qPrintable(thrown));
    QVERIFY2(
        thrown.contains("12 images of 1x100000x100000 need") && thrown.contains("of memory is available"),
        qPrintable(thrown));
  }

  void augmentation_is_seeded_and_changes_training_batches_only() {
    Harness h(RunSettings{});
    const QJsonObject common{{"shuffle_seed", 3}, {"batch_size", 50}};
    QJsonObject withAug = common;
    withAug.insert("augment_crop_padding", 4);
    withAug.insert("augment_flip", true);
    auto plainCtx = load(h, common), augCtx = load(h, withAug);
    auto plain = datasetOf(*plainCtx)->spec(), aug = datasetOf(*augCtx)->spec();
    QVERIFY(augCtx->outputs.value("data")->summary().contains("augmented"));
    // Train's loader: shuffled, seeded from the Dataset's shuffle_seed.
    const gn::nn::LoaderOptions train{.batch_size = 50, .shuffle = true, .seed = 3};
    const std::vector<float> a0 = epochImages(aug.train, train, 0);
    QCOMPARE(epochImages(aug.train, train, 0), a0);  // the same seed and epoch: the same batches
    const std::vector<float> p0 = epochImages(plain.train, train, 0);
    QCOMPARE(a0.size(), p0.size());
    int64_t changed = 0;
    for (int64_t i = 0; i < 400; ++i)
      changed += !std::equal(a0.begin() + i * 784, a0.begin() + (i + 1) * 784, p0.begin() + i * 784);
    qInfo("augmentation changed %lld of 400 training images in epoch 0", static_cast<long long>(changed));
    QVERIFY(changed > 300);                           // (1/81 x 1/2 of draws leave an image as it was)
    QVERIFY(epochImages(aug.train, train, 1) != a0);  // another epoch draws anew
    // Test batches: exactly the stored bytes / 255, in evaluation's order and even in a shuffled pass.
    const std::vector<float> t = epochImages(aug.test, {.batch_size = 50, .shuffle = false}, 0);
    QCOMPARE(aug.test->images, plain.test->images);
    for (size_t i = 0; i < t.size(); ++i) QCOMPARE(t[i], aug.test->images[i] * (1.0f / 255.0f));
    QCOMPARE(epochImages(aug.test, train, 0), epochImages(plain.test, train, 0));
  }

  void normalize_uses_the_training_splits_float64_statistics() {
    Harness h(RunSettings{});
    for (int channels : {1, 3}) {
      auto ctx = load(h, {{"normalize", true}, {"channels", channels}, {"shuffle_seed", 5}});
      const auto s = datasetOf(*ctx)->spec();
      const QJsonArray mean = ctx->fields["mean"].toArray(), stdev = ctx->fields["std"].toArray();
      QCOMPARE(mean.size(), qsizetype(channels));
      const int64_t plane = 784;
      for (int c = 0; c < channels; ++c) {
        double sum = 0, sq = 0;
        const double n = static_cast<double>(s.train->count * plane);
        for (int64_t i = 0; i < s.train->count; ++i)
          for (int64_t j = 0; j < plane; ++j) sum += s.train->images[(i * channels + c) * plane + j] / 255.0;
        const double m = sum / n;
        for (int64_t i = 0; i < s.train->count; ++i)
          for (int64_t j = 0; j < plane; ++j) {
            const double v = s.train->images[(i * channels + c) * plane + j] / 255.0 - m;
            sq += v * v;
          }
        const double sd = std::sqrt(sq / n);
        qInfo("channels %d: channel %d mean %.6f std %.6f", channels, c, m, sd);
        QVERIFY(std::abs(mean[c].toDouble() - m) < 1e-12);
        QVERIFY(std::abs(stdev[c].toDouble() - sd) < 1e-12);
        // The test split's batches use the training statistics.
        const std::vector<float> t = epochImages(s.test, {.batch_size = 100, .shuffle = false}, 0);
        for (int64_t i = 0; i < s.test->count; ++i)
          for (int64_t j = 0; j < plane; ++j) {
            const size_t k = static_cast<size_t>((i * channels + c) * plane + j);
            const double want = (s.test->images[k] / 255.0 - m) / sd;
            QVERIFY(std::abs(t[k] - want) < 1e-5);
          }
      }
    }
  }
};

QTEST_GUILESS_MAIN(ImageFolderTest)
#include "test_image_folder.moc"
