// libFuzzer harness: load, validate and dry-run arbitrary bytes as a graph file. A dry run validates with the
// real node plugin and builds the executor's schedule without enqueueing work, so it is fast and finds crashes
// in the paths every file from a stranger goes through.
#include <QCoreApplication>
#include <QDir>

#include "gpunodes/core/graph_document.h"
#include "gpunodes/core/registry.h"
#include "gpunodes/core/serializer.h"
#include "gpunodes/core/validation.h"

using namespace gn::core;

namespace {
NodeTypeRegistry& registry() {
  static NodeTypeRegistry* r = [] {
    static int argc = 1;
    static char name[] = "fuzz_graph";
    static char* argv[] = {name, nullptr};
    new QCoreApplication(argc, argv);
    auto* reg = new NodeTypeRegistry;
    reg->loadPluginFile(QStringLiteral(GN_NODES_PLUGIN));
    return reg;
  }();
  return *r;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  NodeTypeRegistry& reg = registry();
  GraphDocument doc;
  QString error;
  if (!serializer::load(QByteArray(reinterpret_cast<const char*>(data), static_cast<qsizetype>(size)), doc, &error))
    return 0;
  ValidationReport report = validate(doc, reg);
  // Round trip: what loads must save and load again to the same bytes.
  QByteArray saved = serializer::save(doc);
  GraphDocument again;
  if (!serializer::load(saved, again, &error) || serializer::save(again) != saved) __builtin_trap();
  return 0;
}
