// A node set made in the test itself: the editing tests and the benchmark need node types with ports and
// params, not a runtime. Its names and ports follow the GPU node set's (Device, Tensor, MatMul, Copy...).
#pragma once
#include <QHash>
#include <QJsonArray>

#include "gpunodes/core/graph_document.h"
#include "gpunodes/core/plugin.h"
#include "gpunodes/core/validation.h"

namespace gn::testing {

class FakeType : public core::NodeType {
 public:
  explicit FakeType(core::NodeTypeSpec spec) : spec_(std::move(spec)) {}
  const core::NodeTypeSpec& spec() const override { return spec_; }
  void execute(core::NodeContext&) const override {}

 private:
  core::NodeTypeSpec spec_;
};

class FakeNodeSet : public core::NodeSetPlugin {
 public:
  QString setName() const override { return "fake"; }
  QList<core::NodeTypePtr> nodeTypes() const override {
    using core::ParamType;
    using core::PortType;
    auto in = [](const char* n, PortType t, bool req = true) {
      return core::PortSpec{n, t, req, QString("input ") + n};
    };
    auto out = [](const char* n, PortType t) { return core::PortSpec{n, t, true, QString("output ") + n}; };
    auto param = [](const char* n, ParamType t, QJsonValue def, std::optional<double> lo = {},
                    std::optional<double> hi = {}, QStringList values = {}) {
      return core::ParamSpec{n, t, def, lo, hi, values, QString("the %1 param").arg(n)};
    };
    QList<core::NodeTypePtr> types;
    auto add = [&](core::NodeTypeSpec s) { types << std::make_shared<FakeType>(std::move(s)); };
    add({"Device",
         "Devices",
         "A device",
         {},
         {out("device", PortType::Device)},
         {param("kind", ParamType::Enum, "gpu", {}, {}, {"cpu", "gpu"}),
          param("index", ParamType::Int, 0, 0, 15), param("fallback", ParamType::Bool, true)}});
    add({"Tensor",
         "Tensors",
         "A tensor on a device",
         {in("device", PortType::Device)},
         {out("out", PortType::Tensor)},
         {param("shape", ParamType::Shape, QJsonArray{64, 64}, 1, 100000),
          param("init", ParamType::Enum, "uniform", {}, {}, {"uniform", "zeros", "ones"}),
          param("seed", ParamType::Int, 0, 0, 1e12)}});
    add({"MatMul",
         "Compute",
         "a @ b",
         {in("a", PortType::Tensor), in("b", PortType::Tensor)},
         {out("out", PortType::Tensor)},
         {param("repeat", ParamType::Int, 1, 1, 1000000),
          param("keep", ParamType::Enum, "all", {}, {}, {"all", "last"}),
          param("alpha", ParamType::Float, 1.0, 0, 10)}});
    add({"Elementwise",
         "Compute",
         "a op b",
         {in("a", PortType::Tensor), in("b", PortType::Tensor, false)},
         {out("out", PortType::Tensor)},
         {param("op", ParamType::Enum, "add", {}, {}, {"add", "mul"})}});
    add({"Copy",
         "Tensors",
         "Moves tensors to a device",
         {in("in", PortType::Tensor), in("device", PortType::Device)},
         {out("out", PortType::Tensor)},
         {param("mode", ParamType::Enum, "copy", {}, {}, {"copy", "to"}),
          param("non_blocking", ParamType::Bool, false)}});
    add({"Synchronize", "Sync", "A barrier", {in("in", PortType::Tensor, false)}, {}, {}});
    return types;
  }
  std::unique_ptr<core::RunSession> createSession(const core::RunSettings&) override { return nullptr; }

  // Operands on two devices, reported as the GPU node set does, with its fix: a Copy of b onto a's device.
  // Here every Device node is a device of its own, and a tensor lives on the Device node wired into the node
  // that makes it (none: unknown, nothing reported).
  void validateGraph(const core::GraphDocument& doc, const core::NodeTypeRegistry&, const core::RunSettings&,
                     core::ValidationReport& report) const override {
    QHash<QString, QList<core::GraphConnection>> into;  // indexed once: the benchmark's graphs are large
    for (const core::GraphConnection& c : doc.connections()) into[c.to.node].append(c);
    const auto wiredInto = [&](const QString& node, const QString& port) -> std::optional<core::Endpoint> {
      for (const core::GraphConnection& c : into.value(node))
        if (c.to.port == port) return c.from;
      return std::nullopt;
    };
    const auto deviceOf = [&](const std::optional<core::Endpoint>& tensor) -> std::optional<core::Endpoint> {
      if (!tensor) return std::nullopt;
      const std::optional<core::Endpoint> device = wiredInto(tensor->node, "device");
      const core::GraphNode* node = device ? doc.node(device->node) : nullptr;
      return node && node->type == "Device" ? device : std::nullopt;
    };
    for (const core::GraphNode& n : doc.nodes()) {
      if (n.type != "MatMul" && n.type != "Elementwise") continue;
      const std::optional<core::Endpoint> a = deviceOf(wiredInto(n.id, "a")),
                                          b = deviceOf(wiredInto(n.id, "b"));
      if (!a || !b || a->node == b->node) continue;
      report.error(
          n.id, "inputs.b",
          QString("Expected all tensors to be on the same device, but found at least two devices, %1 "
                  "and %2!")
              .arg(a->node, b->node),
          core::IssueFix{.label = "Insert Copy node: b to " + a->node,
                         .nodeType = "Copy",
                         .params = {},
                         .input = {n.id, "b"},
                         .throughInput = "in",
                         .throughOutput = "out",
                         .alsoWired = {{.port = "device", .source = *a}}});
    }
  }
};

}  // namespace gn::testing
