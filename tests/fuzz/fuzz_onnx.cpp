// libFuzzer harness for the ONNX importer: arbitrary bytes as MODEL.onnx through the node plugin's converter,
// as `gpunodes import-onnx` calls it (read, check, import, lay out, write the weights). A refused model must
// give one short message, change nothing in the document and leave no weights file; a model that imports must
// give a graph whose weights file exists. The model lies in a scratch folder that also holds small.bin (48
// bytes), so that external data inside the folder is reached; the corpus (tests/data/hostile-onnx) has models
// reading it.
#include <QCoreApplication>
#include <QDir>
#include <QFile>
#include <QTemporaryDir>

#include "gpunodes/core/format_converter.h"
#include "gpunodes/core/graph_document.h"
#include "gpunodes/core/registry.h"

using namespace gn::core;

namespace {

constexpr qsizetype kMaxMessage = 4096;

struct Setup {
  NodeTypeRegistry registry;
  FormatConverterPtr onnx;
  QTemporaryDir scratch;
};

Setup& setup() {
  static Setup* s = [] {
    static int argc = 1;
    static char name[] = "fuzz_onnx";
    static char* argv[] = {name, nullptr};
    new QCoreApplication(argc, argv);
    auto* st = new Setup;
    if (!st->registry.loadPluginFile(QStringLiteral(GN_NODES_PLUGIN))) {
      for (const NodeTypeRegistry::LoadError& e : st->registry.loadErrors())
        fprintf(stderr, "fuzz_onnx: %s: %s\n", qPrintable(e.path), qPrintable(e.reason));
      abort();
    }
    st->onnx = findConverter(st->registry, QStringLiteral("onnx"));
    if (!st->onnx || !st->onnx->canImport()) {
      fprintf(stderr, "fuzz_onnx: the plugin has no ONNX importer\n");
      abort();
    }
    QDir::setCurrent(st->scratch.path());
    QFile small(st->scratch.filePath("small.bin"));
    if (!small.open(QIODevice::WriteOnly) || small.write(QByteArray(48, '\0')) != 48) abort();
    return st;
  }();
  return *s;
}

void check(bool ok, const char* what, const QString& detail = {}) {
  if (ok) return;
  fprintf(stderr, "fuzz_onnx: %s\n%s\n", what, qPrintable(detail.left(2000)));
  abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Setup& s = setup();
  const QString model = s.scratch.filePath("model.onnx"), weights = s.scratch.filePath("model.safetensors");
  {
    QFile f(model);
    if (!f.open(QIODevice::WriteOnly | QIODevice::Truncate)) abort();
    if (size && f.write(reinterpret_cast<const char*>(data), qint64(size)) != qint64(size)) abort();
  }
  GraphDocument doc;
  const ConvertResult r = s.onnx->importFile(model, weights, doc, {});
  if (!r.ok) {
    check(!r.error.isEmpty() && r.error.size() <= kMaxMessage && !r.error.contains('\n'),
          "a refused model without one short line", r.error);
    check(doc.nodes().isEmpty(), "a refused model changed the document");
    check(!QFile::exists(weights), "a refused model left its weights file");
  } else {
    check(!doc.nodes().isEmpty(), "an imported model gave no nodes");
    check(QFile::exists(weights), "an imported model wrote no weights");
    QFile::remove(weights);
  }
  return 0;
}
