// Every example graph runs headless with shrunk sizes (params changed on the loaded document, as --set does),
// and its values are checked against an independent computation; the traces show what each example is about.
#include <QtTest>

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
};

QTEST_GUILESS_MAIN(ExamplesTest)
#include "test_examples.moc"
