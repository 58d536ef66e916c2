// The GPU node set: Device, AllDevices, Tensor, Copy, MatMul, Elementwise, Norm, Synchronize and Inspect, and
// the training nodes Model, Forward, Parameters, SaveParams, LoadParams, ExportONNX, Dataset, Train and
// Evaluate, as one Qt plugin that the host loads. It is the only part of the app that links the runtime.
#pragma once
#include <QObject>
#include <map>
#include <memory>
#include <mutex>
#include <utility>

#include "gpunodes/core/plugin.h"
#include "gpunodes/runtime.h"
#include "graph_checks.h"

namespace gn::nodes {

class GpuNodesPlugin final : public QObject, public core::NodeSetPlugin {
  Q_OBJECT
  Q_PLUGIN_METADATA(IID GN_NODESET_IID FILE "gpunodes_nodes.json")
  Q_INTERFACES(gn::core::NodeSetPlugin)

 public:
  GpuNodesPlugin();
  QString setName() const override { return QStringLiteral("gpu"); }
  QList<core::NodeTypePtr> nodeTypes() const override { return types_; }
  std::unique_ptr<core::RunSession> createSession(const core::RunSettings& settings) override;
  void validateGraph(const core::GraphDocument& doc, const core::NodeTypeRegistry& registry,
                     const core::RunSettings& settings, core::ValidationReport& report) const override;
  QJsonObject environment(const core::RunSettings& settings) const override;
  QList<core::FormatConverterPtr> converters() const override;  // ONNX (nodes/onnx/)

 private:
  // The devices a run with these settings would have. Enumerating GPUs costs a driver call, and the editor
  // validates on every edit, so the answer is kept per (cpu_devices, use_cuda).
  DeviceCatalog catalog(int cpuDevices, bool useCuda) const;

  QList<core::NodeTypePtr> types_;
  mutable std::mutex catalogMutex_;
  // The runtime the last session ran on, while anything still holds it: values kept in the run cache hold
  // theirs. The next session with the same devices (cpu_devices, use_cuda, memory_limit; the schedule is
  // set per session) runs on it again, so cached tensors and models meet new ones on the same devices,
  // allocators and engine. Lent to one session at a time: a second run at once gets a runtime of its own.
  std::mutex keptMutex_;
  std::weak_ptr<Runtime> kept_;
  uint64_t keptGeneration_ = 0, nextGeneration_ = 0;
  bool lent_ = false;
  mutable std::map<std::pair<int, bool>, DeviceCatalog> catalogs_;
};

}  // namespace gn::nodes
