#include "plugin.h"

#include "gpunodes/errors.h"
#include "gpunodes/runtime.h"
#include "node_util.h"
#include "session.h"

namespace gn::nodes {

GpuNodesPlugin::GpuNodesPlugin()
    : types_{makeDeviceNode(),     makeAllDevicesNode(),  makeTensorNode(),  makeCopyNode(),
             makeMatMulNode(),     makeElementwiseNode(), makeNormNode(),    makeSynchronizeNode(),
             makeInspectNode(),    makeModelNode(),       makeForwardNode(), makeParametersNode(),
             makeSaveParamsNode(), makeLoadParamsNode(),  makeDatasetNode(), makeTrainNode(),
             makeEvaluateNode()} {
  types_.append(makeLayerNodes());
}

std::unique_ptr<core::RunSession> GpuNodesPlugin::createSession(const core::RunSettings& settings) {
  return std::make_unique<NodesSession>(settings);
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
