// Every example graph runs headless with shrunk sizes (params changed on the loaded document, as --set does),
// and its values are checked against an independent computation; the traces show what each example is about.
// The examples of sequences and tables (sine-series, rnn-language-model, lstm-fashion-mnist-rows,
// table-regression) are checked against what their data allows: the noise of the series and of the CSV, the
// letter frequencies of the text, chance for the images; the CSV against the script that makes it.
#include <QDir>
#include <QFile>
#include <QFileInfo>
#include <QProcess>
#include <QtTest>
#include <array>
#include <cmath>
#include <numbers>

#include "nodes_test_util.h"
#include "time_scale.h"

using namespace nodes_test;

namespace {

const QStringList kExamples{"devices",      "tensors-and-copies",  "matmul-cpu-vs-gpu",
                            "log-per-step", "two-device-parallel", "compute-copy-overlap",
                            "quickstart"};

// Runs of a graph in which an overlap of two threads' spans must show up at least once.
constexpr int kOverlapAttempts = 5;

void setShape(GraphDocument& doc, const QString& id, int n) {
  doc.setParam(id, "shape", QJsonArray{n, n});
}

// A series, a text, images read row by row and a table; test_training covers the image classifiers.
const QStringList kDataExamples{"sine-series", "rnn-language-model", "lstm-fashion-mnist-rows",
                                "table-regression"};

QString repoRoot() {
  return QDir::cleanPath(QStringLiteral(GN_EXAMPLES_DIR "/../.."));
}

const QString kGpl = "/usr/share/common-licenses/GPL-3";  // Debian's base-files: on every Debian
const QString kFashionMnist = "/usr/share/datasets/fashion-mnist";
const QString kRegressionCsv = "resources/data/regression.csv";  // from the repository root
const QString kRegressionCsvFromExample = "../data/regression.csv";  // as the example names it

bool haveFashionMnist() {
  for (const char* f : {"train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                        "t10k-labels-idx1-ubyte"})
    if (!QFileInfo::exists(kFashionMnist + "/" + f + ".gz") && !QFileInfo::exists(kFashionMnist + "/" + f))
      return false;
  return true;
}

// Makes an example runnable from the test's directory: table-regression names its CSV relative to its own
// folder (the CLI and the editor resolve it there; a program's run through the API uses paths as they are),
// and the LSTM example falls back to the synthetic set of the same shape where the dataset-fashion-mnist
// package is missing.
void runnableHere(GraphDocument& doc) {
  for (const GraphNode& n : doc.nodes()) {
    if (n.type != "Dataset") continue;
    const QString name = n.params["name"].toString(), path = n.params["path"].toString();
    if (name == "table" && QFileInfo(path).isRelative())
      doc.setParam(n.id, "path", QFileInfo(examplePath("table-regression")).absolutePath() + "/" + path);
    if (name == "fashion-mnist" && !haveFashionMnist()) doc.setParam(n.id, "name", "synthetic");
  }
}

// A JSON array of numbers; null (what the report writes for NaN) becomes NaN.
std::vector<double> numbers(const QJsonValue& v) {
  std::vector<double> out;
  for (const QJsonValue& x : v.toArray()) out.push_back(x.isDouble() ? x.toDouble() : NAN);
  return out;
}

double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s / static_cast<double>(v.size());
}

double variance(const std::vector<double>& v) {
  const double m = mean(v);
  double s = 0;
  for (double x : v) s += (x - m) * (x - m);
  return s / static_cast<double>(v.size());
}

bool nearRel(double got, double want, double rel = 1e-6) {
  return std::fabs(got - want) <= rel * std::max(1.0, std::fabs(want));
}

// The text as the text Dataset's preprocess makes it (d2l's: lower case, every run of anything but the
// letters A-Z and a-z one space).
QByteArray d2lPreprocessed(const QByteArray& raw) {
  QByteArray out;
  bool space = false;
  for (char c : raw) {
    const bool letter = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
    if (letter) {
      if (space) out.append(' ');
      space = false;
      out.append(c >= 'A' && c <= 'Z' ? char(c - 'A' + 'a') : c);
    } else {
      space = true;
    }
  }
  if (space) out.append(' ');
  return out;
}

// The perplexity of a unigram model on the last `testFraction` of the text: each character's probability its
// frequency in the rest. What a model that knows nothing but letter frequencies scores.
double unigramPerplexity(const QByteArray& text, double testFraction) {
  const qsizetype cut = text.size() - qsizetype(std::llround(testFraction * double(text.size())));
  std::array<double, 256> counts{};
  for (qsizetype i = 0; i < cut; ++i) counts[uchar(text[i])] += 1;
  double nll = 0;
  for (qsizetype i = cut; i < text.size(); ++i)
    nll -= std::log(std::max(counts[uchar(text[i])], 0.5) / double(cut));
  return std::exp(nll / double(text.size() - cut));
}

// Friedman's first function, which scripts/make_regression_table.py adds N(0, 1) noise to.
double friedman1(const std::vector<double>& x) {
  return 10 * std::sin(std::numbers::pi * x[0] * x[1]) + 20 * (x[2] - 0.5) * (x[2] - 0.5) + 10 * x[3] +
         5 * x[4];
}

}  // namespace

class ExamplesTest : public QObject {
  Q_OBJECT

  // Every span belongs to a node of the graph: nothing the nodes enqueue goes untagged.
  static bool allTagged(const RunResult& r, const GraphDocument& doc) {
    for (const TraceSpan& s : r.spans)
      if (!doc.hasNode(s.node)) {
        qWarning("span %s on %s is tagged \"%s\"", qPrintable(s.op), qPrintable(s.device),
                 qPrintable(s.node));
        return false;
      }
    return !r.spans.isEmpty();
  }

  static QString resolved(const RunResult& r, const QString& deviceNode) {
    return r.node(deviceNode)["resolved"].toString();
  }

 private slots:
  void initTestCase() { QVERIFY2(plugin(), "the GPU node set did not load from " GN_NODES_PLUGIN); }

  void every_example_loads_validates_and_says_what_it_shows() {
    for (const QString& name : kExamples) {
      GraphDocument doc;
      QVERIFY2(loadExample(name, doc), qPrintable(name));
      QVERIFY2(doc.description().size() > 100, qPrintable(name + " needs a description of what to compare"));
      QVERIFY2(!doc.name().isEmpty(), qPrintable(name));
      const ValidationReport report = validate(doc, registry(), settingsOf(doc));
      QStringList errors;
      for (const Issue& i : report.errors()) errors.append(i.text());
      QVERIFY2(report.ok(), qPrintable(name + ": " + errors.join("; ")));
    }
    // The seeds' sizes stay in the files; tests shrink them.
    GraphDocument doc;
    QVERIFY(loadExample("two-device-parallel", doc));
    QCOMPARE(doc.node("x1")->params["shape"].toArray(), (QJsonArray{4000, 4000}));
    QCOMPARE(doc.node("mm1")->params["repeat"].toInt(), 50);
    QCOMPARE(doc.settings()["cpu_devices"].toInt(), 2);
    QVERIFY(loadExample("log-per-step", doc));
    QCOMPARE(doc.node("mm_step")->params["repeat"].toInt(), 1000);
    QCOMPARE(doc.node("x")->params["shape"].toArray(), (QJsonArray{100, 100}));
    QVERIFY(loadExample("compute-copy-overlap", doc));
    QCOMPARE(doc.node("run1")->params["repeat"].toInt(), 50);
    QCOMPARE(doc.node("x")->params["shape"].toArray(), (QJsonArray{4000, 4000}));
  }

  void devices_shows_try_gpu_and_try_all_gpus() {
    GraphDocument doc;
    QVERIFY(loadExample("devices", doc));
    const QJsonObject env = plugin()->environment(settingsOf(doc));
    RunResult r = runGraph(doc);
    QVERIFY2(r.failures().isEmpty(), qPrintable(r.failures().join("\n")));
    QVERIFY(allTagged(r, doc));
    QCOMPARE(resolved(r, "gpu0"), env["try_gpu(0)"].toString());
    QCOMPARE(resolved(r, "gpu10"), env["try_gpu(10)"].toString());
    QCOMPARE(r.node("all")["resolved"].toArray(), env["try_all_gpus()"].toArray());
    // try_gpu(10) has no 11th GPU to find: a fallback, which is a warning and not an error.
    QCOMPARE(r.node("gpu10")["fallback"].toBool(), true);
    QVERIFY(!r.node("gpu10")["warnings"].toArray().isEmpty());

    const QJsonObject x = r.node("show_x")["inspect"].toArray()[0].toObject();
    QCOMPARE(x["shape"].toArray(), (QJsonArray{2, 3}));
    QCOMPARE(x["device"].toString(), env["try_gpu(0)"].toString());
    QCOMPARE(r.inspected("show_x"), std::vector<double>(6, 1.0));
    const QJsonArray ys = r.node("show_y")["inspect"].toArray();
    QCOMPARE(ys.size(), env["try_all_gpus()"].toArray().size());
    for (int i = 0; i < ys.size(); ++i) {
      QCOMPARE(ys[i].toObject()["device"].toString(), env["try_all_gpus()"].toArray()[i].toString());
      QCOMPARE(r.inspected("show_y", i), r.inspected("show_y", 0));  // one seed, the same values everywhere
      for (double v : r.inspected("show_y", i)) QVERIFY(v >= 0 && v < 1);
    }
  }

  void tensors_and_copies_adds_on_device_one() {
    GraphDocument doc;
    QVERIFY(loadExample("tensors-and-copies", doc));
    RunResult r = runGraph(doc);
    QVERIFY2(r.failures().isEmpty(), qPrintable(r.failures().join("\n")));
    QVERIFY(allTagged(r, doc));
    const QString dev0 = resolved(r, "dev0"), dev1 = resolved(r, "dev1");
    QVERIFY(dev0 != dev1);
    const std::vector<double> x = r.inspected("show_x"), y = r.inspected("show_y"), z = r.inspected("show_z"),
                              yz = r.inspected("show_yz");
    QCOMPARE(x, std::vector<double>(6, 1.0));
    QCOMPARE(z, x);
    QCOMPARE(yz.size(), y.size());
    for (size_t i = 0; i < y.size(); ++i) QVERIFY2(std::fabs(yz[i] - (y[i] + x[i])) < 1e-6, "Y + Z != Y + 1");
    auto deviceOf = [&](const QString& inspect) {
      return r.node(inspect)["inspect"].toArray()[0].toObject()["device"].toString();
    };
    QCOMPARE(deviceOf("show_x"), dev0);
    QCOMPARE(deviceOf("show_y"), dev1);
    QCOMPARE(deviceOf("show_z"), dev1);
    QCOMPARE(deviceOf("show_yz"), dev1);
    QCOMPARE(r.node("add")["device"].toString(), dev1);
    // copyto always makes new memory; as_in_ctx / .to() returns Z itself, already on device 1.
    QCOMPARE(r.node("copy_z")["same_as_input"].toArray(), QJsonArray{false});
    QCOMPARE(r.node("z_again")["same_as_input"].toArray(), QJsonArray{true});
    QCOMPARE(r.spansOf("copy_z", "copy").size(), 1);
    QCOMPARE(r.spansOf("z_again").size(), 0);
  }

  void matmul_cpu_vs_gpu_reports_gflops() {
    GraphDocument doc;
    QVERIFY(loadExample("matmul-cpu-vs-gpu", doc));
    for (const QString id : {"big_gpu", "big_cpu"}) setShape(doc, id, 24);
    for (const QString id : {"small_gpu", "small_cpu"}) setShape(doc, id, 8);
    doc.setParam("mm_big_gpu", "repeat", 3);
    doc.setParam("mm_big_cpu", "repeat", 3);
    doc.setParam("mm_small_gpu", "repeat", 5);
    doc.setParam("mm_small_cpu", "repeat", 5);
    addInspect(doc, "check_x", "big_cpu.out");
    addInspect(doc, "check_cpu", "mm_big_cpu.out");
    addInspect(doc, "check_gpu", "mm_big_gpu.out");
    addInspect(doc, "check_small_x", "small_gpu.out");
    addInspect(doc, "check_small", "mm_small_gpu.out");
    RunResult r = runGraph(doc);
    QVERIFY2(r.failures().isEmpty(), qPrintable(r.failures().join("\n")));
    QVERIFY(allTagged(r, doc));
    const std::vector<double> want = naiveMatmul(r.inspected("check_x"), r.inspected("check_x"), 24);
    QVERIFY(near(r.inspected("check_cpu"), want));
    QVERIFY(near(r.inspected("check_gpu"), want));  // the same seed on either device
    QVERIFY(near(r.inspected("check_small"),
                 naiveMatmul(r.inspected("check_small_x"), r.inspected("check_small_x"), 8)));
    for (const QString id : {"mm_big_gpu", "mm_big_cpu", "mm_small_gpu", "mm_small_cpu"}) {
      const QJsonObject n = r.node(id);
      QCOMPARE(n["calls"].toInt(), id.contains("big") ? 3 : 5);
      QVERIFY2(n["gflops"].toDouble() > 0, qPrintable(id));
      QVERIFY2(n["pct_peak"].isDouble(), qPrintable(id + ": no % of peak"));
      QVERIFY(n["bytes"].toDouble() > 0);
    }
    QCOMPARE(r.node("mm_big_cpu")["device"].toString(), QString("cpu"));
    QCOMPARE(r.node("mm_big_gpu")["device"].toString(), resolved(r, "gpu"));
  }

  void log_per_step_reads_every_step_or_once() {
    GraphDocument doc;
    QVERIFY(loadExample("log-per-step", doc));
    setShape(doc, "x", 16);
    doc.setParam("mm_step", "repeat", 20);
    doc.setParam("mm_log", "repeat", 20);
    addInspect(doc, "check_x", "x.out");
    RunResult r = runGraph(doc);
    QVERIFY2(r.failures().isEmpty(), qPrintable(r.failures().join("\n")));
    QVERIFY(allTagged(r, doc));
    auto blockingReads = [&](const QString& node) {
      int n = 0;
      for (const TraceSpan& s : r.spansOf(node, "read to host")) n += s.hostBlocking;
      return n;
    };
    QCOMPARE(blockingReads("norm_step"), 20);  // one sync per step
    QCOMPARE(blockingReads("norm_log"), 1);    // the log stays on the device until the end
    const std::vector<double> x = r.inspected("check_x");
    const double want = frobenius(naiveMatmul(x, x, 16));
    for (const QString series : {"norm_step", "norm_log"}) {
      const QJsonArray samples = r.report["metrics"].toObject()[series].toArray();
      QCOMPARE(samples.size(), 20);
      for (int i = 0; i < samples.size(); ++i) {
        QCOMPARE(samples[i].toArray()[0].toDouble(), double(i));
        QVERIFY2(std::fabs(samples[i].toArray()[1].toDouble() - want) < 1e-4 * want, qPrintable(series));
      }
    }
  }

  void two_device_parallel_values() {
    GraphDocument doc;
    QVERIFY(loadExample("two-device-parallel", doc));
    setShape(doc, "x1", 24);
    setShape(doc, "x2", 24);
    doc.setParam("mm1", "repeat", 3);
    doc.setParam("mm2", "repeat", 3);
    for (const QString id : {"x1", "x2", "mm1", "mm2"}) addInspect(doc, "check_" + id, id + ".out");
    RunResult r = runGraph(doc);
    QVERIFY2(r.failures().isEmpty(), qPrintable(r.failures().join("\n")));
    QVERIFY(allTagged(r, doc));
    QVERIFY(
        near(r.inspected("check_mm1"), naiveMatmul(r.inspected("check_x1"), r.inspected("check_x1"), 24)));
    QVERIFY(
        near(r.inspected("check_mm2"), naiveMatmul(r.inspected("check_x2"), r.inspected("check_x2"), 24)));
    QVERIFY(resolved(r, "dev0") != resolved(r, "dev1"));
    // done waits for both branches: one host-blocking span per device.
    const QList<TraceSpan> waits = r.spansOf("done", "synchronize");
    QCOMPARE(waits.size(), 2);
    for (const TraceSpan& s : waits) QVERIFY(s.hostBlocking);
  }

  void two_device_parallel_overlaps_only_under_parallel() {
    for (const QString schedule : {"parallel", "sequential"}) {
      GraphDocument doc;
      QVERIFY(loadExample("two-device-parallel", doc));
      setShape(doc, "x1", 512);  // tens of ms per branch: long enough to overlap on a loaded machine
      setShape(doc, "x2", 512);
      // Under a sanitizer the host's work between the branches is several times slower, and OpenBLAS is
      // not: the branches get that much more work, so the second starts before the first ends. With 10, 2
      // TSan runs in 18 saw no overlap in any of their tries.
      const int repeat = 10 * kTimeScale;
      doc.setParam("mm1", "repeat", repeat);
      doc.setParam("mm2", "repeat", repeat);
      RunSettings settings = settingsOf(doc);
      settings.schedule = schedule;  // what --schedule does
      // Parallel: the two devices' products overlap in one of kOverlapAttempts runs (a busy machine may run
      // one thread at a time for a while). Sequential: they never do, in any run.
      int overlapping = 0;
      const int attempts = schedule == "parallel" ? kOverlapAttempts : 2;
      for (int attempt = 0; attempt < attempts && (overlapping == 0 || schedule != "parallel"); ++attempt) {
        RunResult r = runGraph(doc, settings);
        QVERIFY2(r.failures().isEmpty(), qPrintable(r.failures().join("\n")));
        const QList<TraceSpan> a = r.spansOf("mm1", "matmul"), b = r.spansOf("mm2", "matmul");
        QCOMPARE(a.size(), qsizetype(repeat));
        QCOMPARE(b.size(), qsizetype(repeat));
        QVERIFY(a[0].device != b[0].device);
        for (const TraceSpan& x : a)
          for (const TraceSpan& y : b) overlapping += overlap(x, y);
      }
      if (schedule == "parallel")
        QVERIFY2(overlapping > 0, "no matmul of device 0 overlapped one of device 1 under parallel");
      else
        QVERIFY2(overlapping == 0, "matmuls overlapped under sequential");
    }
  }

  void compute_copy_overlap_orders_the_phases() {
    GraphDocument doc;
    QVERIFY(loadExample("compute-copy-overlap", doc));
    setShape(doc, "x", 24);
    doc.setParam("run1", "repeat", 4);
    doc.setParam("run2", "repeat", 4);
    addInspect(doc, "check_x", "x.out");
    addInspect(doc, "check_blocking", "copy_blocking.out");
    addInspect(doc, "check_overlap", "copy_overlap.out");
    RunResult r = runGraph(doc);
    QVERIFY2(r.failures().isEmpty(), qPrintable(r.failures().join("\n")));
    QVERIFY(allTagged(r, doc));
    const std::vector<double> want = naiveMatmul(r.inspected("check_x"), r.inspected("check_x"), 24);
    for (const QString id : {"check_blocking", "check_overlap"}) {
      QCOMPARE(r.node(id)["inspect"].toArray().size(), 4);
      for (int i = 0; i < 4; ++i) {
        QVERIFY2(near(r.inspected(id, i), want), qPrintable(id));
        QCOMPARE(r.node(id)["inspect"].toArray()[i].toObject()["device"].toString(), QString("cpu"));
      }
    }
    const QList<TraceSpan> blocking = r.spansOf("copy_blocking"), overlapped = r.spansOf("copy_overlap");
    QCOMPARE(blocking.size(), 4);
    QCOMPARE(overlapped.size(), 4);
    for (const TraceSpan& s : blocking) QVERIFY(s.hostBlocking && s.stream == "compute");
    for (const TraceSpan& s : overlapped) QVERIFY(!s.hostBlocking && s.stream == "copy");
    // Phase 1 copies after its run; phase 2 starts after phase 1's copies (the gate).
    double run1End = 0, blockingStart = 1e300, blockingEnd = 0, run2Start = 1e300;
    for (const TraceSpan& s : r.spansOf("run1", "matmul")) run1End = std::max(run1End, s.endUs);
    for (const TraceSpan& s : blocking)
      blockingStart = std::min(blockingStart, s.startUs), blockingEnd = std::max(blockingEnd, s.endUs);
    for (const TraceSpan& s : r.spansOf("run2", "matmul")) run2Start = std::min(run2Start, s.startUs);
    QVERIFY(run1End <= blockingStart);
    QVERIFY(blockingEnd <= run2Start);
    QVERIFY(r.node("wait_copy")["at_ms"].toDouble() <= r.node("gate")["at_ms"].toDouble());
    QVERIFY(r.node("gate")["at_ms"].toDouble() <= r.node("wait_all")["at_ms"].toDouble());
  }

  void compute_copy_overlap_non_blocking_copies_overlap_compute() {
    GraphDocument doc;
    QVERIFY(loadExample("compute-copy-overlap", doc));
    setShape(doc, "x", 384);
    doc.setParam("run1", "repeat", 8);
    doc.setParam("run2", "repeat", 8);
    // Overlap needs the copy thread to be scheduled while a product runs, which a machine busy with other
    // tests may not do in one run: it must happen in one of kOverlapAttempts. Blocking copies must never.
    int overlapping = 0;
    for (int attempt = 0; attempt < kOverlapAttempts && overlapping == 0; ++attempt) {
      RunResult r = runGraph(doc);
      QVERIFY2(r.failures().isEmpty(), qPrintable(r.failures().join("\n")));
      int blockingOverlaps = 0;
      for (const TraceSpan& c : r.spansOf("copy_overlap"))
        for (const TraceSpan& m : r.spansOf("run2", "matmul")) overlapping += overlap(c, m);
      for (const TraceSpan& c : r.spansOf("copy_blocking"))
        for (const TraceSpan& m : r.spansOf("run1", "matmul")) blockingOverlaps += overlap(c, m);
      QCOMPARE(blockingOverlaps, 0);
    }
    QVERIFY2(overlapping > 0, "no non-blocking copy overlapped a product still being computed");
  }

  void quickstart_values() {
    GraphDocument doc;
    QVERIFY(loadExample("quickstart", doc));
    setShape(doc, "x0", 20);
    setShape(doc, "x1", 20);
    doc.setParam("mm0", "repeat", 2);
    doc.setParam("mm1", "repeat", 2);
    addInspect(doc, "check_x0", "x0.out");
    addInspect(doc, "check_x1", "x1.out");
    RunResult r = runGraph(doc);
    QVERIFY2(r.failures().isEmpty(), qPrintable(r.failures().join("\n")));
    QVERIFY(allTagged(r, doc));
    const std::vector<double> x0 = r.inspected("check_x0"), x1 = r.inspected("check_x1");
    std::vector<double> sum = naiveMatmul(x0, x0, 20);
    const std::vector<double> p1 = naiveMatmul(x1, x1, 20);
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += p1[i];
    const std::vector<double> shown = r.inspected("show");
    QCOMPARE(shown.size(), size_t(1));
    QVERIFY(std::fabs(shown[0] - frobenius(sum)) < 1e-4 * frobenius(sum));
  }

  void quickstart_full_size_runs() {
    GraphDocument doc;
    QVERIFY(loadExample("quickstart", doc));
    RunResult r = runGraph(doc);
    QVERIFY2(r.failures().isEmpty(), qPrintable(r.failures().join("\n")));
    QCOMPARE(r.report["ok"].toBool(), true);
    QCOMPARE(r.node("mm0")["calls"].toInt(), 10);
    QVERIFY(r.node("show")["inspect"].toArray()[0].toObject()["values"].toArray()[0].toDouble() > 0);
    qInfo("quickstart: %.0f ms wall", r.report["wall_ms"].toDouble());
  }

  void data_examples_load_validate_and_keep_their_settings() {
    for (const QString& name : kDataExamples) {
      GraphDocument doc;
      QVERIFY2(loadExample(name, doc), qPrintable(name));
      QVERIFY2(doc.description().size() > 500, qPrintable(name + " needs a description of what to watch"));
      QVERIFY2(!doc.name().isEmpty(), qPrintable(name));
      runnableHere(doc);
      const ValidationReport report = validate(doc, registry(), settingsOf(doc));
      QStringList errors;
      for (const Issue& i : report.errors()) errors.append(i.text());
      QVERIFY2(report.ok(), qPrintable(name + ": " + errors.join("; ")));
    }
    auto param = [](const GraphDocument& doc, const QString& id, const QString& key) {
      return doc.node(id)->params[key];
    };
    // d2l's settings stay in the files (the language model's epochs are cut to fit a minute).
    GraphDocument doc;
    QVERIFY(loadExample("sine-series", doc));
    QCOMPARE(param(doc, "data", "name").toString(), QString("series"));
    QCOMPARE(param(doc, "data", "path").toString(), QString());  // d2l's sin(0.01 t) + noise
    QCOMPARE(param(doc, "data", "tau").toInt(), 4);
    QCOMPARE(param(doc, "data", "test_fraction").toDouble(), 0.4);
    QCOMPARE(param(doc, "data", "batch_size").toInt(), 16);
    QCOMPARE(param(doc, "x", "shape").toArray(), QJsonArray{4});
    QCOMPARE(param(doc, "fc1", "out_features").toInt(), 10);
    QCOMPARE(param(doc, "fc2", "out_features").toInt(), 1);
    QCOMPARE(param(doc, "net", "init").toString(), QString("xavier"));
    QCOMPARE(param(doc, "train", "optimizer").toString(), QString("adam"));
    QCOMPARE(param(doc, "train", "lr").toDouble(), 0.01);
    QCOMPARE(param(doc, "train", "loss").toString(), QString("mse"));
    QCOMPARE(param(doc, "train", "epochs").toInt(), 5);
    QVERIFY(loadExample("rnn-language-model", doc));
    QCOMPARE(param(doc, "data", "path").toString(), kGpl);
    QCOMPARE(param(doc, "data", "tokens").toString(), QString("char"));
    QCOMPARE(param(doc, "data", "num_steps").toInt(), 35);
    QCOMPARE(param(doc, "data", "batch_size").toInt(), 32);
    QCOMPARE(param(doc, "data", "partition").toString(), QString("sequential"));
    QCOMPARE(param(doc, "x", "shape").toArray(), QJsonArray{35});
    QCOMPARE(param(doc, "gru", "hidden_size").toInt(), 256);
    QCOMPARE(param(doc, "train", "optimizer").toString(), QString("sgd"));
    QCOMPARE(param(doc, "train", "lr").toDouble(), 1.0);
    QCOMPARE(param(doc, "train", "clip_grad_norm").toDouble(), 1.0);
    QCOMPARE(param(doc, "gen", "num_tokens").toInt(), 50);
    QVERIFY(loadExample("lstm-fashion-mnist-rows", doc));
    QCOMPARE(param(doc, "x", "shape").toArray(), (QJsonArray{1, 28, 28}));
    QCOMPARE(param(doc, "rows", "shape").toArray(), (QJsonArray{28, 28}));
    QCOMPARE(param(doc, "lstm", "hidden_size").toInt(), 128);
    QCOMPARE(param(doc, "train", "optimizer").toString(), QString("adam"));
    QVERIFY(param(doc, "data", "limit").toInt() > 0);  // the quick settings
    // The CSV's path is relative to the example's folder, as every relative path in a graph is.
    QVERIFY(loadExample("table-regression", doc));
    QCOMPARE(param(doc, "data", "path").toString(), kRegressionCsvFromExample);
    QVERIFY(QFileInfo(QFileInfo(examplePath("table-regression")).absolutePath() + "/" + kRegressionCsvFromExample)
                .canonicalFilePath() == QFileInfo(repoRoot() + "/" + kRegressionCsv).canonicalFilePath());
    QVERIFY(doc.description().contains("graph file's folder"));
    QCOMPARE(param(doc, "data", "task").toString(), QString("regression"));
    QCOMPARE(param(doc, "data", "target").toString(), QString("y"));
  }

  void sine_series_predicts_one_step_and_k_steps_ahead() {
    GraphDocument doc;
    QVERIFY(loadExample("sine-series", doc));
    doc.setParam("train", "epochs", 3);  // d2l's 5 take about 3 s; 3 reach nearly the same loss
    // The trained weights, to compute the MLP here.
    doc.addNode(makeNode("params", "Parameters"));
    wire(doc, "train.model", "params.model");
    addInspect(doc, "check_params", "params.out");
    RunResult r = runGraph(doc);
    QVERIFY2(r.failures().isEmpty(), qPrintable(r.failures().join("\n")));
    const QJsonObject test = r.node("test");
    QCOMPARE(test["task"].toString(), QString("regression"));
    QCOMPARE(test["samples"].toInt(), 396);  // 1000 values and tau 4: 996 windows, the first 600 train
    const QJsonObject series = test["series"].toObject();
    const std::vector<double> x = numbers(series["values"]), one = numbers(series["one_step"]),
                              k = numbers(series["k_step"]);
    QCOMPARE(x.size(), size_t(1000));
    QCOMPARE(one.size(), x.size());
    QCOMPARE(k.size(), x.size());
    QCOMPARE(series["tau"].toInt(), 4);
    const int start = series["train_end"].toInt();
    QCOMPARE(start, 604);  // the first test target: 600 training windows, then tau

    // The data is d2l's: x_t - sin(0.01 t) for t = 1..1000 is N(0, 0.2) noise.
    std::vector<double> noise;
    for (int t = 1; t <= 1000; ++t) noise.push_back(x[t - 1] - std::sin(0.01 * t));
    QVERIFY2(std::fabs(mean(noise)) < 0.03, qPrintable(QString::number(mean(noise))));
    QVERIFY2(std::fabs(std::sqrt(variance(noise)) - 0.2) < 0.03,
             qPrintable(QString::number(variance(noise))));

    // The MLP computed here from the trained weights (fc1.weight [10, 4], fc1.bias, fc2.weight [1, 10],
    // fc2.bias) gives every one-step prediction, each from the 4 true values before it.
    const QJsonArray shown = r.node("check_params")["inspect"].toArray();
    QCOMPARE(shown.size(), 4);
    QCOMPARE(shown[0].toObject()["shape"].toArray(), (QJsonArray{10, 4}));
    QCOMPARE(shown[2].toObject()["shape"].toArray(), (QJsonArray{1, 10}));
    const std::vector<double> w1 = r.inspected("check_params", 0), b1 = r.inspected("check_params", 1),
                              w2 = r.inspected("check_params", 2), b2 = r.inspected("check_params", 3);
    auto mlp = [&](const double* window) {
      double y = b2[0];
      for (int j = 0; j < 10; ++j) {
        double h = b1[j];
        for (int i = 0; i < 4; ++i) h += w1[j * 4 + i] * window[i];
        y += w2[j] * std::max(h, 0.0);
      }
      return y;
    };
    for (int t = 0; t < 4; ++t) QVERIFY(std::isnan(one[t]));  // no 4 values before these
    for (int t = 4; t < 1000; ++t)
      QVERIFY2(std::fabs(one[t] - mlp(&x[t - 4])) < 1e-4, qPrintable(QString("one_step[%1]").arg(t)));

    // Evaluate's numbers are the one-step predictions over the test part.
    const QJsonObject predictions = test["predictions"].toObject();
    const std::vector<double> truth = numbers(predictions["true"]),
                              predicted = numbers(predictions["predicted"]);
    QCOMPARE(truth.size(), size_t(396));
    QCOMPARE(predicted.size(), truth.size());
    double sse = 0, sae = 0;
    for (size_t i = 0; i < truth.size(); ++i) {
      QCOMPARE(truth[i], x[start + i]);
      QVERIFY(std::fabs(predicted[i] - one[start + i]) < 1e-5);
      sse += (predicted[i] - truth[i]) * (predicted[i] - truth[i]);
      sae += std::fabs(predicted[i] - truth[i]);
    }
    const double mse = sse / 396, testVariance = variance(truth);
    QVERIFY(nearRel(test["mse"].toDouble(), mse));
    QVERIFY(nearRel(test["mae"].toDouble(), sae / 396));
    QVERIFY(nearRel(test["r2"].toDouble(), 1 - mse / testVariance));
    // Far below the test part's variance (about 0.23), and not below what the noise (variance 0.04) allows.
    QVERIFY2(mse < 0.4 * testVariance, qPrintable(QString("mse %1, variance %2").arg(mse).arg(testVariance)));
    QVERIFY2(mse > 0.5 * 0.04, qPrintable(QString("mse %1 beats the noise").arg(mse)));

    // k steps ahead: from point 604 on, each prediction is fed the ones before it; the first is the one-step
    // prediction (only true values before it), and then the errors pile up.
    for (int t = 0; t < start; ++t) QVERIFY(std::isnan(k[t]));
    QVERIFY(std::fabs(k[start] - one[start]) < 1e-5);
    std::vector<double> fed(x.begin(), x.begin() + start);
    double kSse = 0;
    for (int t = start; t < 1000; ++t) {
      fed.push_back(mlp(&fed[t - 4]));
      QVERIFY2(std::fabs(k[t] - fed[t]) < 1e-3, qPrintable(QString("k_step[%1]").arg(t)));
      kSse += (k[t] - x[t]) * (k[t] - x[t]);
    }
    qInfo("sine-series: test mse %.4f (variance %.3f, noise 0.04), k steps ahead %.3f", mse, testVariance,
          kSse / 396);
    QVERIFY2(kSse / 396 > 2 * mse,
             qPrintable(QString("k-step mse %1, one-step %2").arg(kSse / 396).arg(mse)));
  }

  void rnn_language_model_beats_letter_frequencies() {
    QFile gpl(kGpl);
    QVERIFY2(gpl.open(QIODevice::ReadOnly), qPrintable(kGpl + " (Debian's base-files) cannot be read"));
    const QByteArray text = d2lPreprocessed(gpl.readAll());
    GraphDocument doc;
    QVERIFY(loadExample("rnn-language-model", doc));
    doc.setParam("gru", "hidden_size", 64);  // 256 units and 24 epochs take a minute; this takes seconds
    doc.setParam("train", "epochs", 6);
    RunResult r = runGraph(doc);
    QVERIFY2(r.failures().isEmpty(), qPrintable(r.failures().join("\n")));
    // 26 letters, the space and <unk>: what OneHot and the last Linear are sized for.
    QCOMPARE(r.node("data")["vocab_size"].toInt(), 28);
    QCOMPARE(doc.node("onehot")->params["num_classes"].toInt(), 28);
    QCOMPARE(doc.node("fc")->params["out_features"].toInt(), 28);
    const QJsonObject test = r.node("test");
    QCOMPARE(test["task"].toString(), QString("language_model"));
    const double perplexity = test["perplexity"].toDouble();
    QVERIFY(nearRel(perplexity, std::exp(test["loss"].toDouble())));
    QVERIFY(nearRel(perplexity, r.node("train")["test_perplexity"].toDouble()));
    // A uniform guess scores the vocabulary's size; letter frequencies (computed here from the file)
    // about 17.
    const double unigram = unigramPerplexity(text, doc.node("data")->params["test_fraction"].toDouble());
    QVERIFY2(unigram > 12 && unigram < 28, qPrintable(QString::number(unigram)));
    QVERIFY2(perplexity > 1 && perplexity < 0.9 * unigram,
             qPrintable(QString("perplexity %1, letter frequencies %2").arg(perplexity).arg(unigram)));
    qInfo("rnn-language-model: test perplexity %.2f (letter frequencies %.2f); %s", perplexity, unigram,
          qPrintable(r.node("gen")["generated_text"].toString()));
    // Generate continues the prefix by 50 characters of the vocabulary.
    const QString prefix = doc.node("gen")->params["prefix"].toString();
    const QString generated = r.node("gen")["generated_text"].toString();
    QVERIFY2(generated.startsWith(prefix), qPrintable(generated));
    QCOMPARE(generated.size(), prefix.size() + 50);
    for (QChar c : generated.mid(prefix.size()))
      QVERIFY2(c == ' ' || (c >= 'a' && c <= 'z'), qPrintable(generated));
  }

  void lstm_reads_images_row_by_row() {
    GraphDocument doc;
    QVERIFY(loadExample("lstm-fashion-mnist-rows", doc));
    runnableHere(doc);
    doc.setParam("data", "limit", 1024);
    doc.setParam("lstm", "hidden_size", 32);
    doc.setParam("train", "epochs", 2);
    RunResult r = runGraph(doc);
    QVERIFY2(r.failures().isEmpty(), qPrintable(r.failures().join("\n")));
    // Reshape makes every image 28 steps of 28 pixels: the LSTM's input weights take 28 features per step,
    // and Linear reads the last step's 32 hidden values.
    QMap<QString, QJsonArray> shapes;
    for (const QJsonValue& p : r.node("net")["parameters"].toArray())
      shapes[p.toObject()["name"].toString()] = p.toObject()["shape"].toArray();
    QCOMPARE(shapes["lstm.weight_ih_l0"], (QJsonArray{4 * 32, 28}));
    QCOMPARE(shapes["lstm.weight_hh_l0"], (QJsonArray{4 * 32, 32}));
    QCOMPARE(shapes["fc.weight"], (QJsonArray{10, 32}));
    const QJsonObject test = r.node("test");
    const int samples = haveFashionMnist() ? 1024 : 512;  // the synthetic set has 512 test images
    QCOMPARE(test["samples"].toInt(), samples);
    // The accuracy is the confusion matrix's diagonal, and beats chance (0.1) by a margin.
    double right = 0, all = 0;
    const QJsonArray confusion = test["confusion"].toArray();
    QCOMPARE(confusion.size(), 10);
    for (int i = 0; i < 10; ++i)
      for (int j = 0; j < 10; ++j) {
        const double n = confusion[i].toArray()[j].toDouble();
        all += n;
        right += i == j ? n : 0;
      }
    QCOMPARE(all, double(samples));
    QVERIFY(nearRel(test["accuracy"].toDouble(), right / all));
    QCOMPARE(test["accuracy"].toDouble(), r.node("train")["test_acc"].toDouble());
    qInfo("lstm-fashion-mnist-rows: test accuracy %.3f on %d images", test["accuracy"].toDouble(), samples);
    QVERIFY2(test["accuracy"].toDouble() > 0.3, qPrintable(QString::number(test["accuracy"].toDouble())));
  }

  void table_regression_learns_the_function_up_to_the_noise() {
    // The bound comes from the committed CSV itself: y - f(x) is the noise the script added, so R^2 cannot
    // exceed 1 - var(noise) / var(y) (0.959), and a least-squares line gets 0.722 (the script's figure).
    QFile csv(repoRoot() + "/" + kRegressionCsv);
    QVERIFY(csv.open(QIODevice::ReadOnly | QIODevice::Text));
    const QList<QByteArray> lines = csv.readAll().split('\n');
    QCOMPARE(lines[0], QByteArray("x1,x2,x3,x4,x5,x6,y"));
    std::vector<double> ys, noise;
    for (qsizetype i = 1; i < lines.size(); ++i) {
      if (lines[i].isEmpty()) continue;
      const QList<QByteArray> cells = lines[i].split(',');
      QCOMPARE(cells.size(), 7);
      std::vector<double> x;
      for (int c = 0; c < 6; ++c) x.push_back(cells[c].toDouble());
      ys.push_back(cells[6].toDouble());
      noise.push_back(ys.back() - friedman1(x));
    }
    QCOMPARE(ys.size(), size_t(4000));
    QVERIFY2(std::fabs(mean(noise)) < 0.1 && std::fabs(variance(noise) - 1) < 0.1,
             qPrintable(QString("noise mean %1, variance %2").arg(mean(noise)).arg(variance(noise))));
    const double ceiling = 1 - variance(noise) / variance(ys);

    GraphDocument doc;
    QVERIFY(loadExample("table-regression", doc));
    runnableHere(doc);
    // 60 epochs of 50 batches in the file; 20 of 13 larger batches at a larger rate reach an R^2 of 0.94 too.
    doc.setParam("data", "batch_size", 256);
    doc.setParam("train", "lr", 0.01);
    doc.setParam("train", "epochs", 20);
    RunResult r = runGraph(doc);
    QVERIFY2(r.failures().isEmpty(), qPrintable(r.failures().join("\n")));
    QCOMPARE(r.node("data")["train_samples"].toInt(), 3200);
    QCOMPARE(r.node("data")["test_samples"].toInt(), 800);
    QCOMPARE(r.node("data")["features"].toArray(), (QJsonArray{"x1", "x2", "x3", "x4", "x5", "x6"}));
    const QJsonObject test = r.node("test");
    QCOMPARE(test["task"].toString(), QString("regression"));
    const std::vector<double> truth = numbers(test["predictions"].toObject()["true"]),
                              predicted = numbers(test["predictions"].toObject()["predicted"]);
    QCOMPARE(truth.size(), size_t(800));
    QCOMPARE(predicted.size(), truth.size());
    double sse = 0, sae = 0;
    for (size_t i = 0; i < truth.size(); ++i) {
      sse += (predicted[i] - truth[i]) * (predicted[i] - truth[i]);
      sae += std::fabs(predicted[i] - truth[i]);
    }
    const double mse = sse / 800, r2 = 1 - mse / variance(truth);
    QVERIFY(nearRel(test["mse"].toDouble(), mse));
    QVERIFY(nearRel(test["mae"].toDouble(), sae / 800));
    QVERIFY(nearRel(test["r2"].toDouble(), r2));
    // Within 0.1 of the ceiling (so far above the line), and no better than the noise allows: 800 test rows
    // may be a little easier than the file as a whole, not 0.03 easier.
    qInfo("table-regression: test R^2 %.3f (ceiling %.3f), mse %.3f (noise %.3f)", r2, ceiling, mse,
          variance(noise));
    QVERIFY2(r2 > ceiling - 0.1 && r2 < ceiling + 0.03,
             qPrintable(QString("R^2 %1, ceiling %2").arg(r2).arg(ceiling)));
    QVERIFY2(mse > 0.75 * variance(noise), qPrintable(QString("mse %1 beats the noise").arg(mse)));
  }

  void regression_csv_is_what_its_script_makes() {
    QProcess script;
    script.start("/usr/bin/python3", {repoRoot() + "/scripts/make_regression_table.py", "-"});
    QVERIFY2(script.waitForFinished(120000), "make_regression_table.py did not finish in 2 minutes");
    QCOMPARE(script.exitStatus(), QProcess::NormalExit);
    QVERIFY2(script.exitCode() == 0, script.readAllStandardError().constData());
    QFile committed(repoRoot() + "/" + kRegressionCsv);
    QVERIFY(committed.open(QIODevice::ReadOnly));
    QVERIFY2(script.readAllStandardOutput() == committed.readAll(),
             "resources/data/regression.csv is not what scripts/make_regression_table.py makes: run it and "
             "commit the file");
  }
};

QTEST_GUILESS_MAIN(ExamplesTest)
#include "test_examples.moc"
