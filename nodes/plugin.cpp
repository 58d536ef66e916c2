#include "plugin.h"

#include "gpunodes/errors.h"
#include "gpunodes/runtime.h"
#include "node_util.h"
#include "onnx/onnx_converter.h"
#include "session.h"

namespace gn::nodes {

GpuNodesPlugin::GpuNodesPlugin()
    : types_{makeDeviceNode(),     makeAllDevicesNode(),  makeTensorNode(),  makeCopyNode(),
             makeMatMulNode(),     makeElementwiseNode(), makeNormNode(),    makeSynchronizeNode(),
             makeInspectNode(),    makeModelNode(),       makeForwardNode(), makeParametersNode(),
             makeSaveParamsNode(), makeLoadParamsNode(),  makeDatasetNode(), makeTrainNode(),
             makeEvaluateNode(), makeGenerateNode(), makeExportOnnxNode()} {
  types_.append(makeLayerNodes());
}

namespace {

// Whether a runtime made with `a` has the devices `b` asks for; the schedule is the session's to set.
bool sameDevices(const RuntimeOptions& a, const RuntimeOptions& b) {
  return a.cpu_devices == b.cpu_devices && a.use_cuda == b.use_cuda && a.memory_limits == b.memory_limits;
}

}  // namespace

std::unique_ptr<core::RunSession> GpuNodesPlugin::createSession(const core::RunSettings& settings) {
  const RuntimeOptions options = usableOptions(settings);
  std::lock_guard lock(keptMutex_);
  if (lent_) {
    // Another run is going on the kept runtime: this one gets its own, with a scope no cache has seen.
    return std::make_unique<NodesSession>(std::make_shared<Runtime>(options), options.schedule,
                                          QString("runtime-%1").arg(++nextGeneration_));
  }
  std::shared_ptr<Runtime> runtime = kept_.lock();
  if (!runtime || !sameDevices(runtime->options(), options)) {
    runtime = std::make_shared<Runtime>(options);
    kept_ = runtime;
    keptGeneration_ = ++nextGeneration_;
  }
  lent_ = true;
  // The plugin outlives every session it makes: the registry holds it for the process.
  std::shared_ptr<void> lease(nullptr, [this](void*) {
    std::lock_guard relock(keptMutex_);
    lent_ = false;
  });
  return std::make_unique<NodesSession>(std::move(runtime), options.schedule,
                                        QString("runtime-%1").arg(keptGeneration_), std::move(lease));
}

DeviceCatalog GpuNodesPlugin::catalog(int cpuDevices, bool useCuda) const {
  std::lock_guard lock(catalogMutex_);
  auto key = std::make_pair(cpuDevices, useCuda);
  if (auto it = catalogs_.find(key); it != catalogs_.end()) return it->second;
  // A runtime that never runs an op starts no worker thread: it is only asked what it has.
  Runtime probe({.cpu_devices = cpuDevices, .use_cuda = useCuda});
  DeviceCatalog c{probe.devices()};
  catalogs_[key] = c;
  return c;
}

void GpuNodesPlugin::validateGraph(const core::GraphDocument& doc, const core::NodeTypeRegistry& registry,
                                   const core::RunSettings& settings, core::ValidationReport& report) const {
  const ParsedSettings parsed = parseSettings(settings);
  DeviceCatalog devices;
  try {
    devices = catalog(parsed.options.cpu_devices, parsed.options.use_cuda);
  } catch (const std::exception& e) {
    report.error(QString(), "settings", "cannot set up the devices: " + QString::fromUtf8(e.what()));
    return;
  }
  checkGraph(doc, registry, this, settings, devices, report);
}

QList<core::FormatConverterPtr> GpuNodesPlugin::converters() const {
  static const core::FormatConverterPtr onnx = std::make_shared<onnx::OnnxConverter>();
  return {onnx};
}

QJsonObject GpuNodesPlugin::environment(const core::RunSettings& settings) const {
  const ParsedSettings parsed = parseSettings(settings);
  RuntimeOptions options = parsed.options;
  options.memory_limits.clear();  // a limit naming a device that does not exist must not hide the table
  try {
    Runtime rt(options);
    QJsonObject env = environmentOf(rt);
    QJsonArray problems;
    for (const auto& [field, message] : parsed.errors) problems.append(field + ": " + message);
    if (!problems.isEmpty()) env["settings_errors"] = problems;
    return env;
  } catch (const std::exception& e) {
    return QJsonObject{{"devices", QJsonArray{}},
                       {"table", "cannot set up the devices: " + QString::fromUtf8(e.what()) + "\n"}};
  }
}

}  // namespace gn::nodes
