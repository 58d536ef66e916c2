// Checks of a whole graph that only the GPU node set can make before a run: it follows shapes, batch sizes
// and devices from node to node, so that conflicts known in advance are reported on the node, all at once.
#pragma once
#include <vector>

#include "gpunodes/core/graph_document.h"
#include "gpunodes/core/plugin.h"
#include "gpunodes/core/registry.h"
#include "gpunodes/core/validation.h"
#include "gpunodes/device.h"

namespace gn::nodes {

// What the checks know of the machine: every device the run would have.
struct DeviceCatalog {
  std::vector<DeviceInfo> devices;
  int cudaCount() const;
  int cpuCount() const;
  const DeviceInfo* find(Device d) const;
};

// Reports, per node: Device nodes that cannot resolve (an error) or fall back (a warning); binary ops and
// matmuls whose operands come from different devices (the runtime's exact message); tf32 on a non-CUDA
// device; shapes that cannot multiply or add; batches that do not pair up; sizes that cannot fit on their
// device; and graph settings the runtime would refuse. Nodes of other plugins are passed over.
void checkGraph(const core::GraphDocument& doc, const core::NodeTypeRegistry& registry,
                const core::NodeSetPlugin* self, const core::RunSettings& settings,
                const DeviceCatalog& catalog, core::ValidationReport& report);

}  // namespace gn::nodes
