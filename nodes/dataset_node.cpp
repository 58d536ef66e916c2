// Dataset: Fashion-MNIST, a folder of images or a synthetic set; a text for language models, a series or a
// table of numbers (runtime's sequence_data.h); in batches, with the loader's speed measured.
#include <QDir>
#include <QFile>
#include <QFileInfo>
#include <QJsonArray>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>

#include "gpunodes/errors.h"
#include "gpunodes/nn/sequence_data.h"
#include "graph_checks.h"
#include "image_folder.h"
#include "model_values.h"
#include "node_util.h"

namespace gn::nodes {
namespace {

using core::PortType;

// "a, b,c" -> {"a", "b", "c"}: a list param written as text.
QStringList listParam(const QString& text) {
  QStringList out;
  for (const QString& part : text.split(',', Qt::SkipEmptyParts))
    if (!part.trimmed().isEmpty()) out.append(part.trimmed());
  return out;
}

// The most frequent tokens of a text's vocabulary with their counts, for the report: [[token, count], ...].
QJsonArray topTokens(const nn::Dataset& text, size_t shown) {
  std::vector<size_t> order(text.vocabulary.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return text.token_counts[a] > text.token_counts[b]; });
  QJsonArray out;
  for (size_t k = 0; k < order.size() && k < shown; ++k)
    out.append(QJsonArray{QString::fromStdString(text.vocabulary[order[k]]),
                          static_cast<double>(text.token_counts[order[k]])});
  return out;
}

// The synthetic set's sizes before `limit`: enough for a model to learn its patterns in an epoch or two.
constexpr int64_t kSyntheticTrain = 2048, kSyntheticTest = 512;

// `data` served with transform `t`. A set made for this node alone (`own`: an image folder's, which may fill
// most of memory) takes it in place; loaded sets are shared, so they are copied when `t` changes anything.
nn::DatasetPtr withTransform(const nn::DatasetPtr& data, const nn::Transform& t,
                             const std::shared_ptr<nn::Dataset>& own = nullptr) {
  if (own) {
    own->transform = t;
    return own;
  }
  if (!data || (!t.augments() && !t.normalizes())) return data;
  auto d = std::make_shared<nn::Dataset>(*data);
  d->transform = t;
  return d;
}

// The loader's milliseconds per batch over the first batches of epoch 0, as Train will read `data`: whether
// it can keep a device fed. A batch too large to probe cheaply is measured smaller and scaled (the cost is
// per sample).
double probeLoader(const nn::DatasetPtr& data, const DatasetSpec& spec, bool training) {
  constexpr int kBatches = 8;
  constexpr double kSeconds = 0.25, kMaxProbeBytes = 256.0 * (1 << 20);
  const int64_t side = spec.resize > 0 ? spec.resize : data->height;
  const double sampleFloats = data->has_values() ? static_cast<double>(data->sample_numel() + data->target_numel())
                                                 : static_cast<double>(data->channels * side * side + 1);
  const double sampleBytes = sampleFloats * sizeof(float);
  const int64_t full = std::min(spec.batchSize, data->count);
  const int64_t probe =
      std::clamp<int64_t>(static_cast<int64_t>(kMaxProbeBytes / sampleBytes), int64_t(1), full);
  nn::LoaderOptions lo;
  lo.batch_size = probe;
  lo.shuffle = training;
  lo.seed = spec.shuffleSeed;
  lo.resize = spec.resize;
  nn::DataLoader loader(data, lo);
  loader.start_epoch(0);
  const auto start = std::chrono::steady_clock::now();
  for (int b = 0; b < kBatches; ++b) {
    if (!loader.next()) break;
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > kSeconds) break;
  }
  loader.stop();
  return loader.ms_per_batch() * static_cast<double>(full) / static_cast<double>(probe);
}

// Samples per class; nothing for a regression or a text (whose targets are tokens, not sample classes).
QJsonArray classCounts(const nn::Dataset& d) {
  if (d.regression || d.target_numel() != 1) return {};
  std::vector<double> counts(static_cast<size_t>(d.classes), 0.0);
  for (uint8_t label : d.labels)
    if (label < counts.size()) counts[label] += 1;
  for (float label : d.targets)
    if (label >= 0 && static_cast<size_t>(label) < counts.size()) counts[static_cast<size_t>(label)] += 1;
  QJsonArray out;
  for (double c : counts) out.append(c);
  return out;
}

class DatasetNode final : public GpuNode {
 public:
  DatasetNode()
      : GpuNode({
            .name = "Dataset",
            .category = "Models",
            .description =
                "Fashion-MNIST from its gzipped IDX files (the Debian package dataset-fashion-mnist installs "
                "them under /usr/share/datasets/fashion-mnist), a folder of your own PNG or JPEG images in "
                "torchvision's ImageFolder layout (image_folder), or a small synthetic set for quick checks: "
                "10 classes of fixed random 28x28 patterns plus noise. Train and Evaluate read it in batches "
                "of batch_size, shuffled per epoch from shuffle_seed, prepared on a background thread, which "
                "also augments training batches (random crop, flip) and normalises both splits when asked. "
                "Beyond images: text (a UTF-8 file cut into windows of num_steps tokens, each with the next "
                "tokens as targets, for a language model: d2l 9.2-9.3), series (one numeric column of a CSV, "
                "or d2l 9.1's sin(0.01 t) + noise: the tau previous values predict the next; split by time) "
                "and table (a CSV with a header row: target and features columns, classes or regression, "
                "features standardised with the training split's statistics). "
                "Reports the classes, the samples per class, the loader's milliseconds per batch, and the "
                "normalisation's mean and std; for a text the vocabulary's size and its most frequent tokens.",
            .inputs = {},
            .outputs = {outPort("data", PortType::Dataset,
                                "The splits and how to batch them: Train trains on the training split and "
                                "reports test accuracy on the test split.")},
            .params =
                {
                    enumParam("name", {"fashion-mnist", "synthetic", "image_folder", "text", "series", "table",
                                       "attention_pooling"},
                              "fashion-mnist",
                              "fashion-mnist: 60,000 training and 10,000 test images, 28x28 grey. synthetic: "
                              "2,048 training and 512 test samples of the same shape, made in memory. "
                              "image_folder: the images under path, decoded into memory. text: token windows "
                              "of a text file. series: a time series. table: rows of a CSV file. attention_pooling: d2l 11.2's "
                              "data for Nadaraya-Watson regression, made in memory (one sample per split: "
                              "rows of query, key and value)."),
                    pathParam(
                        "path", nn::default_fashion_mnist_dir(), core::FileUse::Read,
                        "fashion-mnist: the directory holding train-images-idx3-ubyte.gz, "
                        "train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz and "
                        "t10k-labels-idx1-ubyte.gz (or the same names without .gz). image_folder: a "
                        "directory with one sub-directory of images per class (path/<class>/<image>, "
                        "classes sorted by name, class i is label i, as torchvision's ImageFolder), "
                        "or with train/ and test/ sub-directories of that layout (the same classes in "
                        "both). Files that do not read as images are skipped and listed in a "
                        "warning. text: a UTF-8 text file. series: a CSV file with a header row (empty: "
                        "d2l's synthetic sine). table: a CSV file with a header row."),
                    intParam("channels", 1, 1, 3,
                             "image_folder: 1 converts every image to grey, 3 to RGB (grey images give "
                             "R = G = B). The other sets are grey: 1."),
                    floatParam("test_fraction", 0.2,
                               "image_folder without train/ and test/ directories: the share of each class "
                               "held out as the test split (stratified, 0 to 0.9), drawn from shuffle_seed. "
                               "text: the end of the text, by tokens (by lines for the lines partition). series: the end of the series, by time "
                               "(d2l trains on the first 600 of 1,000 points: 0.4). table: rows drawn from "
                               "shuffle_seed, stratified by class. 0: no test split."),
                    enumParam("tokens", {"char", "word"}, "char",
                              "text: char makes every character a token (spaces too), word splits on "
                              "whitespace."),
                    boolParam("preprocess", true,
                              "text: d2l's preprocessing first: lower case, and every run of anything but "
                              "letters becomes one space."),
                    intParam("min_freq", 0, 0, 1000000000,
                             "text: tokens seen fewer times in the training text become <unk> (id 0)."),
                    intParam("num_steps", 35, 1, 100000,
                             "text: tokens per sample (d2l's num_steps); the targets are the same window "
                             "shifted by one token."),
                    enumParam("partition", {"random", "sequential", "lines"}, "random",
                              "text: random shuffles the windows every epoch; sequential reads them in d2l's "
                              "seq_data_iter_sequential order, so that row i of a batch continues row i of the "
                              "batch before and recurrent layers carry their state from batch to batch; lines "
                              "makes each line one sample, <bos> line in and line <eos> out, cut or padded with <pad> (id "
                              "1) to num_steps, and the loss leaves the padded steps out (a ValidLength gives "
                              "attention their lengths)."),
                    stringParam("column", "",
                                "series: the column to read, by its header name; empty: the file's only "
                                "numeric column."),
                    intParam("tau", 4, 1, 100000, "series: how many previous values predict the next."),
                    intParam("points", 50, 2, 100000,
                             "attention_pooling: training points (x from U(0, 5), y = 2 sin x + x^0.8 + "
                             "noise) and as many evenly spaced test points (d2l: 50)."),
                    stringParam("target", "", "table: the column to predict."),
                    stringParam("features", "",
                                "table: the columns to predict it from, separated by commas; empty: every "
                                "other column."),
                    enumParam("task", {"auto", "classification", "regression"}, "auto",
                              "table: auto is a regression when every target is a number, classification "
                              "when any is text."),
                    enumParam("split", {"both", "train", "test"}, "both",
                              "Which splits to load: both (training and test), train or test only."),
                    intParam("batch_size", 256, 1, 1000000,
                             "Samples per step, the whole minibatch: Train splits it across its devices "
                             "(unevenly when it does not divide)."),
                    intParam(
                        "limit", 0, 0, 100000000,
                        "Use only the first `limit` samples of each split (image_folder: of each split's "
                        "order drawn from shuffle_seed, so every class is represented); 0 uses them "
                        "all."),
                    intParam("shuffle_seed", 0, 0, 9007199254740991.0,
                             "The order of epoch e is a permutation drawn from (shuffle_seed, e): runs "
                             "repeat exactly."),
                    intParam("resize", 0, 0, 1024,
                             "0: images as stored (28x28; image_folder: all must share one square size). "
                             "Otherwise bilinear resize to resize x resize, as d2l's "
                             "load_data_fashion_mnist(resize=96) (image_folder: scaled once, when decoded); "
                             "the Model's image_size must match for mlp and lenet."),
                    intParam("augment_crop_padding", 0, 0, 1024,
                             "Training batches only: a random crop of the image's size after zero padding "
                             "by this many pixels on each side, as torchvision's RandomCrop(size, padding). "
                             "0: off."),
                    boolParam("augment_flip", false,
                              "Training batches only: a random horizontal flip with probability 0.5. Crop "
                              "and flip are drawn per image from (the Train's shuffle seed, epoch, image), "
                              "so runs repeat."),
                    boolParam("normalize", false,
                              "Subtract each channel's mean and divide by its standard deviation, both "
                              "computed once over the training split as stored (reported as mean and std), "
                              "on training and test batches alike."),
                },
        }, Reuse::Pure) {}

  QStringList validateParams(const QJsonObject& p) const override {
    QStringList problems;
    const qint64 channels = p["channels"].toInteger();
    if (channels != 1 && channels != 3)
      problems.append("channels: must be 1 (grey) or 3 (RGB)");
    else if (channels == 3 && p["name"].toString() != "image_folder")
      problems.append("channels: " + p["name"].toString() + " is grey; 3 channels apply to image_folder");
    const double fraction = p["test_fraction"].toDouble();
    if (!(fraction >= 0 && fraction <= 0.9)) problems.append("test_fraction: must be between 0 and 0.9");
    return problems;
  }

  // The files read: changed or added images make another dataset. The synthetic set reads none.
  QByteArray cacheIdentity(const QJsonObject& p, core::RunSession* session) const override {
    Q_UNUSED(session);
    const QString name = p["name"].toString();
    const bool readsNothing = name == "synthetic" || name == "attention_pooling" ||
                              (name == "series" && p["path"].toString().isEmpty());
    return readsNothing ? QByteArray() : fileIdentity(p["path"].toString());
  }

  // The images' channels and side, the splits and the batch size; the loader's own complaints about the
  // files (missing, unreadable folders) before the run.
  Outputs check(NodeCheck& check) const override {
    const QJsonObject& p = check.params();
    Known d;
    const QString split = p["split"].toString();
    d.hasTrain = split != "test";
    d.hasTest = split != "train";
    d.channels = 1;
    const qint64 resize = p["resize"].toInteger();
    d.side = resize > 0 ? resize : 28;
    d.batch = p["batch_size"].toInteger();
    const QString name = p["name"].toString();
    if (name == "text" || name == "series" || name == "table" || name == "attention_pooling") {
      d.side.reset();
      d.channels.reset();
      d.hasTest = d.hasTest && (name == "attention_pooling" || p["test_fraction"].toDouble() > 0);
      d.data = checkValues(check, name);
      return {{"data", d}};
    }
    d.data = DataShape{Shape{1, *d.side, *d.side}, {}, 10, false, "images"};
    if (p["name"].toString() == "image_folder") {
      d.channels = p["channels"].toInteger();
      // Without resize the side is the images' own, known from one header once the folder scans.
      if (resize <= 0) d.side.reset();
      // The loader's own scan (class folders only, not their files).
      try {
        const ImageFolderLayout layout = scanImageFolder(p["path"].toString());
        d.data->classes = static_cast<int64_t>(layout.classes.size());
        d.data->sample.clear();  // the side may be unknown; the channels and side checks cover images
        if (resize <= 0)
          if (const std::optional<QSize> size = firstImageSize(layout);
              size && size->width() == size->height())
            d.side = size->width();
      } catch (const std::exception& e) {
        check.error("params.path", QString::fromUtf8(e.what()));
      }
      return {{"data", d}};
    }
    if (p["name"].toString() == "fashion-mnist") checkFashionMnist(check, d);
    return {{"data", d}};
  }

  // What a text, series or table gives, as far as the params and the file's header tell, with the file's
  // problems that need no more than its first line: missing, a directory, a target that is not a column.
  // Nothing when the file cannot serve: its error is this node's, and nothing downstream is checked against it.
  static std::optional<DataShape> checkValues(NodeCheck& check, const QString& name) {
    const QJsonObject& p = check.params();
    const QString path = p["path"].toString();
    DataShape d;
    d.kind = name;
    if (name == "attention_pooling") {
      const int64_t points = p["points"].toInteger();
      d.sample = {points, 3};
      d.target = {points};
      d.regression = true;
      d.classes = 1;
      return d;
    }
    if (!(name == "series" && path.isEmpty())) {
      const QFileInfo info(path);
      if (path.isEmpty() || !info.exists()) {
        check.error("params.path", QString("%1: the file '%2' does not exist").arg(name, path));
        return std::nullopt;
      }
      if (info.isDir()) {
        check.error("params.path", QString("%1: '%2' is a directory, not a file").arg(name, path));
        return std::nullopt;
      }
    }
    if (name == "text") {
      const int64_t steps = p["num_steps"].toInteger();
      d.sample = d.target = {steps};
    } else if (name == "series") {
      d.sample = {p["tau"].toInteger()};
      d.regression = true;
      d.classes = 1;
    } else if (!checkTableHeader(check, path, d)) {
      return std::nullopt;
    }
    return d;
  }

  // The table's header row: the target and features must be columns (false, with the error, when they are
  // not). The task is known only from the rows.
  static bool checkTableHeader(NodeCheck& check, const QString& path, DataShape& d) {
    const QJsonObject& p = check.params();
    const QString target = p["target"].toString().trimmed();
    if (target.isEmpty()) {
      check.error("params.target", "table: name the column to predict");
      return false;
    }
    QFile f(path);
    if (!f.open(QIODevice::ReadOnly)) {
      check.error("params.path", QString("table: cannot read '%1': %2").arg(path, f.errorString()));
      return false;
    }
    // A header longer than this is no header a person wrote; the loader reports what is wrong with it.
    const QByteArray line = f.readLine(1 << 20);
    QStringList columns;
    for (const QString& c : QString::fromUtf8(line).trimmed().split(',')) {
      QString name = c.trimmed();
      if (name.size() >= 2 && name.startsWith('"') && name.endsWith('"')) name = name.mid(1, name.size() - 2);
      columns.append(name);
    }
    if (!columns.contains(target)) {
      check.error("params.target", QString("table: '%1' is not a column of %2; its columns are %3")
                                       .arg(target, path, columns.join(", ")));
      return false;
    }
    QStringList features = listParam(p["features"].toString());
    for (const QString& f : features)
      if (!columns.contains(f)) {
        check.error("params.features",
                    QString("table: '%1' is not a column of %2; its columns are %3").arg(f, path, columns.join(", ")));
        return false;
      }
    const qsizetype count = features.isEmpty() ? columns.size() - 1 : features.size();
    d.sample = {static_cast<int64_t>(count)};
    const QString task = p["task"].toString();
    if (task == "regression") d.regression = true, d.classes = 1;
    d.targetsKnown = task != "auto";  // auto: the rows say which task it is, at the run
    return true;
  }

  // A text, series, table or d2l 11.2's data, with what the report says about it.
  static void loadValues(core::NodeContext& ctx, const QString& name, nn::DatasetPtr& train, nn::DatasetPtr& test) {
    const QJsonObject& p = ctx.params();
    const std::string path = p["path"].toString().toStdString();
    const double fraction = p["test_fraction"].toDouble();
    const auto seed = static_cast<uint64_t>(p["shuffle_seed"].toInteger());
    if (name == "attention_pooling") {
      nn::AttentionPoolingData a = nn::make_attention_pooling(p["points"].toInteger(), seed);
      train = a.train, test = a.test;
      ctx.reportField("points", static_cast<double>(a.train->sample_shape[0]));
    } else if (name == "text") {
      nn::TextOptions o;
      o.path = path;
      o.tokens = p["tokens"].toString() == "word" ? nn::TokenUnit::Word : nn::TokenUnit::Char;
      o.preprocess = p["preprocess"].toBool();
      o.min_freq = p["min_freq"].toInteger();
      o.num_steps = p["num_steps"].toInteger();
      const QString partition = p["partition"].toString();
      o.partition = partition == "sequential" ? nn::TextOptions::Partition::Sequential
                    : partition == "lines"    ? nn::TextOptions::Partition::Lines
                                              : nn::TextOptions::Partition::Random;
      o.test_fraction = fraction;
      o.seed = seed;
      nn::TextData t = nn::load_text(o);
      train = t.train, test = t.test;
      const nn::Dataset& d = *t.train;
      ctx.reportField("vocab_size", static_cast<double>(d.vocabulary.size()));
      ctx.reportField("top_tokens", topTokens(d, 10));
      ctx.reportField("num_steps", static_cast<double>(o.num_steps));
      ctx.reportField("partition", partition);
      if (o.partition == nn::TextOptions::Partition::Lines) {
        // How much of the samples is padding: what the loss leaves out.
        const int64_t padded = std::count(d.targets.begin(), d.targets.end(), static_cast<float>(d.pad_target));
        ctx.reportField("lines", static_cast<double>(d.count));
        ctx.reportField("padded_fraction", d.targets.empty() ? 0.0 : double(padded) / double(d.targets.size()));
      }
    } else if (name == "series") {
      nn::SeriesOptions o;
      o.path = path;
      o.column = p["column"].toString().toStdString();
      o.tau = p["tau"].toInteger();
      o.test_fraction = fraction;
      o.seed = seed;
      nn::SeriesData sd = nn::load_series(o);
      train = sd.train, test = sd.test;
      ctx.reportField("series_length", static_cast<double>(sd.train->series ? sd.train->series->size() : 0));
      ctx.reportField("tau", static_cast<double>(o.tau));
    } else {
      nn::TableOptions o;
      o.path = path;
      o.target = p["target"].toString().trimmed().toStdString();
      for (const QString& f : listParam(p["features"].toString())) o.features.push_back(f.toStdString());
      const QString task = p["task"].toString();
      o.task = task == "classification" ? nn::TableOptions::Task::Classification
               : task == "regression"   ? nn::TableOptions::Task::Regression
                                        : nn::TableOptions::Task::Auto;
      o.test_fraction = fraction;
      o.seed = seed;
      nn::TableData td = nn::load_table(o);
      train = td.train, test = td.test;
      const nn::Dataset& d = *td.train;
      QJsonArray features;
      for (const std::string& f : d.feature_names) features.append(qs(f));
      ctx.reportField("features", features);
      ctx.reportField("task", d.regression ? "regression" : "classification");
      if (!d.regression) {
        QJsonArray classes;
        for (const std::string& c : d.class_names) classes.append(qs(c));
        ctx.reportField("classes", classes);
      }
    }
  }

  // The loader's message, before the run: what is missing, where, and how to install it.
  static void checkFashionMnist(NodeCheck& check, const Known& d) {
    const QString dir = check.params()["path"].toString();
    const QString hint =
        "Install the Debian package dataset-fashion-mnist (apt-get install dataset-fashion-mnist), or set "
        "path "
        "to the directory that holds train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, "
        "t10k-images-idx3-ubyte.gz and t10k-labels-idx1-ubyte.gz";
    if (!QFileInfo(dir).isDir()) {
      check.error("params.path", "Fashion-MNIST: the directory " + dir + " does not exist. " + hint);
      return;
    }
    QStringList missing;
    QStringList files;
    // normalize reads the training split for its statistics, even when only the test split goes on.
    if (d.hasTrain || check.params()["normalize"].toBool())
      files << "train-images-idx3-ubyte"
            << "train-labels-idx1-ubyte";
    if (d.hasTest)
      files << "t10k-images-idx3-ubyte"
            << "t10k-labels-idx1-ubyte";
    for (const QString& f : files) {
      const QString gz = QDir(dir).filePath(f + ".gz");
      if (!QFileInfo::exists(gz) && !QFileInfo::exists(QDir(dir).filePath(f))) missing << gz;
    }
    if (!missing.isEmpty())
      check.error("params.path", "Fashion-MNIST: " + missing.join(", ") +
                                     (missing.size() == 1 ? " is" : " are") + " missing. " + hint);
  }

  void execute(core::NodeContext& ctx) const override {
    const QJsonObject& p = ctx.params();
    DatasetSpec spec;
    spec.name = p["name"].toString();
    spec.batchSize = p["batch_size"].toInteger();
    spec.resize = p["resize"].toInteger();
    spec.shuffleSeed = static_cast<uint64_t>(p["shuffle_seed"].toInteger());
    const int64_t limit = p["limit"].toInteger();
    const QString split = p["split"].toString();
    const bool wantTrain = split != "test", wantTest = split != "train";
    const bool normalize = p["normalize"].toBool();
    // Normalisation's statistics come from the training split, loaded for them even when not handed on.
    const bool loadTrain = wantTrain || normalize;
    nn::DatasetPtr train, test;
    std::shared_ptr<nn::Dataset> ownTrain, ownTest;
    if (spec.name == "synthetic") {
      const int64_t nTrain = limit > 0 ? std::min(limit, kSyntheticTrain) : kSyntheticTrain;
      const int64_t nTest = limit > 0 ? std::min(limit, kSyntheticTest) : kSyntheticTest;
      // One set cut in two, so that both splits share the class patterns.
      nn::SyntheticOptions so;
      so.count = nTrain + nTest;
      const nn::DatasetPtr all = nn::make_synthetic(so);
      if (loadTrain) train = sliceDataset(all, 0, nTrain, "synthetic/train");
      if (wantTest) test = sliceDataset(all, nTrain, nTrain + nTest, "synthetic/test");
    } else if (spec.name == "fashion-mnist") {
      const std::string dir = p["path"].toString().toStdString();
      if (loadTrain) train = nn::take(nn::load_fashion_mnist(nn::Split::Train, dir), limit);
      if (ctx.cancelled()) throw CancelledError();
      if (wantTest) test = nn::take(nn::load_fashion_mnist(nn::Split::Test, dir), limit);
    } else if (spec.name == "image_folder") {
      ImageFolderOptions fo;
      fo.channels = static_cast<int>(p["channels"].toInteger());
      fo.resize = spec.resize;
      fo.testFraction = p["test_fraction"].toDouble();
      fo.seed = spec.shuffleSeed;
      fo.limit = limit;
      fo.wantTrain = loadTrain;
      fo.wantTest = wantTest;
      fo.cancelled = [&ctx] { return ctx.cancelled(); };
      fo.progress = [&ctx](double f) { ctx.progress(f); };
      ImageFolderData folder = loadImageFolder(p["path"].toString(), fo);
      train = ownTrain = folder.train;
      test = ownTest = folder.test;
      // Scaled once when decoded: the loader hands the images out as they are.
      spec.resize = 0;
      const QJsonArray names = [&] {
        QJsonArray a;
        for (const QString& c : folder.layout.classes) a.append(c);
        return a;
      }();
      ctx.reportField("classes", names);
      ctx.reportField("split_by", folder.layout.trainTestDirs
                                      ? QString("the train and test folders")
                                      : QString("test_fraction %1 of each class").arg(fo.testFraction));
      ctx.reportField("unreadable_files", static_cast<double>(folder.unreadable.size()));
      if (!folder.unreadable.isEmpty()) {
        constexpr int kShown = 5;
        QStringList shown = folder.unreadable.mid(0, kShown);
        if (folder.unreadable.size() > kShown)
          shown.append(QString("and %1 more").arg(folder.unreadable.size() - kShown));
        const bool one = folder.unreadable.size() == 1;
        ctx.warning(QString("%1 file%2 under %3 did not read as images and %4 skipped: %5")
                        .arg(folder.unreadable.size())
                        .arg(one ? QString() : QString("s"), p["path"].toString(),
                             one ? QString("was") : QString("were"), shown.join(", ")));
      }
    } else if (spec.name == "text" || spec.name == "series" || spec.name == "table" ||
               spec.name == "attention_pooling") {
      loadValues(ctx, spec.name, train, test);
      if (!wantTrain) train.reset();
      if (!wantTest) test.reset();
      if (limit > 0) {
        if (train) train = nn::take(train, limit);
        if (test) test = nn::take(test, limit);
      }
    } else {
      throw Error("name: unknown dataset " + spec.name.toStdString());
    }

    nn::Transform both;
    const bool values = (train && train->has_values()) || (test && test->has_values());
    if (normalize && values)
      ctx.warning("normalize: applies to images; a table's features are standardised already, and token ids and "
                  "series values are served as they are");
    if (normalize && !values) {
      const nn::ChannelStats stats = nn::channel_stats(*train);
      QJsonArray mean, std;
      for (size_t c = 0; c < stats.mean.size(); ++c) {
        mean.append(stats.mean[c]);
        std.append(stats.std[c]);
        both.mean.push_back(static_cast<float>(stats.mean[c]));
        // A constant channel has nothing to scale: it is only centred.
        const bool constant = !(stats.std[c] > 1e-12);
        both.std.push_back(constant ? 1.0f : static_cast<float>(stats.std[c]));
        if (constant)
          ctx.warning(
              QString("normalize: channel %1 is the same value everywhere in the training split: it is "
                      "centred but not scaled")
                  .arg(c));
      }
      ctx.reportField("mean", mean);
      ctx.reportField("std", std);
    }
    nn::Transform augmented = both;
    augmented.crop_padding = p["augment_crop_padding"].toInteger();
    augmented.flip = p["augment_flip"].toBool();
    if (wantTrain) spec.train = withTransform(train, augmented, ownTrain);
    spec.test = withTransform(test, both, ownTest);

    auto value = std::make_shared<DatasetValue>(std::move(spec));
    const DatasetSpec& s = value->spec();
    ctx.reportField("train_samples", s.train ? static_cast<double>(s.train->count) : 0.0);
    ctx.reportField("test_samples", s.test ? static_cast<double>(s.test->count) : 0.0);
    if (s.train && !classCounts(*s.train).isEmpty()) ctx.reportField("train_class_counts", classCounts(*s.train));
    if (s.test && !classCounts(*s.test).isEmpty()) ctx.reportField("test_class_counts", classCounts(*s.test));
    QJsonArray sample;
    for (int64_t d : value->shape().sample) sample.append(static_cast<double>(d));
    ctx.reportField(values ? "sample" : "image", sample);
    if (const nn::DatasetPtr& probed = s.train ? s.train : s.test; probed && probed->count > 0)
      ctx.reportField("loader_ms_per_batch", probeLoader(probed, s, probed == s.train));
    ctx.reportField("summary", value->summary());
    ctx.progress(1.0);
    ctx.setOutput("data", value);
  }
};

}  // namespace

core::NodeTypePtr makeDatasetNode() {
  return std::make_shared<DatasetNode>();
}

}  // namespace gn::nodes
