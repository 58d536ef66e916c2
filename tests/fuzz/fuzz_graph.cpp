// libFuzzer harness: arbitrary bytes through everything `gpunodes validate` and `gpunodes run` do with a file
// from a stranger, and what the editor does with a paste.
//   load    the serializer, with its error message checked for being present and short;
//   check   validation with the real node plugin, under the file's settings and under command-line overrides;
//   save    save, load and save again must give the same bytes; the clipboard's copy and paste of all nodes;
//   dry run the executor on the graph with every device's memory_limit at 1 byte: the schedule, the sessions,
//           each node's execute, failure propagation and the report all run, but the first allocation of
//           every node fails, so no real work is enqueued and an input cannot ask for gigabytes or hours.
#include <QCoreApplication>
#include <QDir>
#include <QJsonArray>
#include <QJsonDocument>
#include <QTemporaryDir>

#include "gpunodes/core/executor.h"
#include "gpunodes/core/graph_document.h"
#include "gpunodes/core/plugin.h"
#include "gpunodes/core/registry.h"
#include "gpunodes/core/serializer.h"
#include "gpunodes/core/validation.h"

using namespace gn::core;

namespace {

// Longer messages mean a hostile value was copied into one instead of being cut short.
constexpr qsizetype kMaxMessage = 4096;
constexpr int kDryRunCpuDevices = 2;

NodeTypeRegistry& registry() {
  static NodeTypeRegistry* r = [] {
    static int argc = 1;
    static char name[] = "fuzz_graph";
    static char* argv[] = {name, nullptr};
    new QCoreApplication(argc, argv);
    // Relative paths in a graph (SaveParams' "model.params") land in a scratch folder, not the checkout.
    static QTemporaryDir scratch;
    QDir::setCurrent(scratch.path());
    auto* reg = new NodeTypeRegistry;
    if (!reg->loadPluginFile(QStringLiteral(GN_NODES_PLUGIN))) {
      for (const NodeTypeRegistry::LoadError& e : reg->loadErrors())
        fprintf(stderr, "fuzz_graph: %s: %s\n", qPrintable(e.path), qPrintable(e.reason));
      abort();
    }
    return reg;
  }();
  return *r;
}

void check(bool ok, const char* what, const QString& detail = {}) {
  if (ok) return;
  fprintf(stderr, "fuzz_graph: %s\n%s\n", what, qPrintable(detail.left(2000)));
  abort();
}

void checkMessages(const ValidationReport& report) {
  for (const Issue& i : report.issues())
    check(i.text().size() <= kMaxMessage && !i.message.isEmpty(), "an empty or unbounded issue", i.text());
}

// Settings for the dry run: the file's own, with few CPU devices and every device limited to one byte.
QJsonObject dryRunSettings(const QJsonObject& file) {
  QJsonObject s = file;
  s.insert("cpu_devices", kDryRunCpuDevices);
  s.insert("use_cuda", false);
  QJsonObject limits;
  for (int i = 0; i < kDryRunCpuDevices; ++i) limits.insert(QStringLiteral("cpu:%1").arg(i), 1);
  s.insert("memory_limit", limits);
  return s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  NodeTypeRegistry& reg = registry();
  const QByteArray bytes(reinterpret_cast<const char*>(data), static_cast<qsizetype>(size));
  GraphDocument doc;
  QString error;
  if (!serializer::load(bytes, doc, &error)) {
    check(!error.isEmpty() && error.size() <= kMaxMessage, "a refused file without a short message", error);
    check(doc.nodes().isEmpty() && doc.connections().isEmpty(), "a refused file changed the document");
    return 0;
  }

  const ValidationReport report = validate(doc, reg);
  checkMessages(report);
  RunSettings overridden = RunSettings::fromGraph(doc.settings());
  overridden.schedule = QStringLiteral("sequential");
  overridden.cpuDevices = 2;
  overridden.all.insert("schedule", overridden.schedule);
  overridden.all.insert("cpu_devices", overridden.cpuDevices);
  checkMessages(validate(doc, reg, overridden));

  // What loads must save and load again to the same bytes.
  const QByteArray saved = serializer::save(doc);
  GraphDocument again;
  check(serializer::load(saved, again, &error), "a saved document does not load", error);
  check(serializer::save(again) == saved, "save, load, save changed the bytes");

  // The clipboard: all nodes copied and pasted into a second document under fresh ids.
  QStringList ids;
  for (const GraphNode& n : doc.nodes()) ids.append(n.id);
  GraphDocument pasted;
  const QStringList added = serializer::pasteNodes(pasted, serializer::copyNodes(doc, ids), {10, 10}, &error);
  check(ids.isEmpty() || added.size() == ids.size(), "paste lost nodes", error);

  // The dry run.
  doc.setSettings(dryRunSettings(doc.settings()));
  const RunSettings settings = RunSettings::fromGraph(doc.settings());
  Executor executor(reg);
  ValidationReport runReport;
  const bool started = executor.start(doc, settings, &runReport);
  checkMessages(runReport);
  if (started) {
    executor.wait();
    executor.events().drain();
  }
  const QJsonObject result = executor.report();
  check(!result.isEmpty(), "no report after a run or a refused start");
  check(!started || !result.value("running").toBool(), "the run still says running after wait()");
  // The report must be writable as JSON, as --report does.
  check(!QJsonDocument(result).toJson(QJsonDocument::Compact).isEmpty(), "the report does not serialize");
  return 0;
}
