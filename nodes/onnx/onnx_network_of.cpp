// onnx_exporter.h's networkModelOf: the model a Network node of a document builds, which export writes. The
// document's layer nodes are read as a run reads them (subgraphs flattened, bypassed layers passed through).
#include <QFileInfo>
#include <QHash>
#include <QSet>

#include "../layer_nodes.h"
#include "../node_util.h"
#include "gpunodes/core/graph_document.h"
#include "gpunodes/core/subgraph.h"
#include "gpunodes/errors.h"
#include "gpunodes/nn/serialize.h"
#include "onnx_exporter.h"
#include "onnx_reader.h"

namespace gn::nodes::onnx {

using nn::LayerKind;
using nn::LayerSpec;

namespace {

// The params of every layer node type and the Network, with their defaults: a document lists only the
// params it sets.
const QHash<QString, QJsonObject>& layerDefaults() {
  static const QHash<QString, QJsonObject> d = [] {
    QHash<QString, QJsonObject> all;
    for (const core::NodeTypePtr& t : makeLayerNodes()) {
      QJsonObject p;
      for (const core::ParamSpec& s : t->spec().params) p[s.name] = s.defaultValue;
      all.insert(t->spec().name, p);
    }
    return all;
  }();
  return d;
}

QJsonObject withDefaults(const QString& type, const QJsonObject& params) {
  QJsonObject p = layerDefaults().value(type);
  for (auto it = params.begin(); it != params.end(); ++it) p[it.key()] = it.value();
  return p;
}

}  // namespace

std::unique_ptr<nn::Model> networkModelOf(Runtime& rt, const core::GraphDocument& doc,
                                          const QString& networkNode, const QString& paramsFile) {
  core::GraphDocument flat;
  core::subgraph::flatten(doc, flat);
  const core::GraphNode* net = flat.node(networkNode);
  if (!net) throw OnnxError("the graph has no node " + networkNode.toStdString());
  if (net->type != "Network")
    throw OnnxError("node " + networkNode.toStdString() + " is a " + net->type.toStdString() +
                    ", not a Network: give the Network node that ends the layers to export");
  QHash<QString, core::Endpoint> source;  // "node.port" of an input -> the output wired into it
  for (const core::GraphConnection& c : flat.connections()) source.insert(c.to.str(), c.from);
  // The node wired into an input; a bypassed layer passes on its first input, as in a run (run_graph.h).
  auto upstream = [&](const QString& nodeId, const QString& port) -> const core::GraphNode* {
    auto it = source.find(nodeId + "." + port);
    if (it == source.end()) return nullptr;
    const core::GraphNode* n = flat.node(it->node);
    for (int hops = 0; n && n->bypassed && hops <= flat.nodes().size(); ++hops) {
      const std::optional<LayerKind> kind = nn::parse_layer_kind(n->type.toStdString());
      if (!kind || nn::layer_ports(*kind).empty()) break;
      it = source.find(n->id + "." + QString::fromStdString(nn::layer_ports(*kind).front()));
      if (it == source.end())
        throw OnnxError("layer " + n->id.toStdString() + " is bypassed and has nothing on its input");
      n = flat.node(it->node);
    }
    if (!n)
      throw OnnxError("node " + nodeId.toStdString() + " reads the missing node " + it->node.toStdString());
    if (n->muted) throw OnnxError("layer " + n->id.toStdString() + " is muted: the network does not run");
    return n;
  };
  const core::GraphNode* last = upstream(net->id, "out");
  if (!last)
    throw OnnxError("Network " + networkNode.toStdString() + ": nothing is wired into its input out");

  // The layers upstream, built after their inputs without recursion (a long chain is no deep stack).
  QHash<QString, nn::LayerNodePtr> built;
  QSet<QString> open;
  std::vector<std::pair<const core::GraphNode*, bool>> stack{{last, false}};
  while (!stack.empty()) {
    auto [n, expanded] = stack.back();
    stack.pop_back();
    if (built.contains(n->id)) continue;
    const std::optional<LayerKind> kind = nn::parse_layer_kind(n->type.toStdString());
    if (!kind)
      throw OnnxError("node " + n->id.toStdString() + " (" + n->type.toStdString() +
                      ") feeds the Network but is no layer node");
    const std::vector<std::string> ports = nn::layer_ports(*kind);
    // An open port before a wired one (MultiheadAttention's k and v before valid_lens) is a hole, nullptr, as
    // the layer node makes it: the layer says whether it takes it.
    std::vector<const core::GraphNode*> ins;
    for (const std::string& p : ports) ins.push_back(upstream(n->id, QString::fromStdString(p)));
    while (!ins.empty() && !ins.back()) ins.pop_back();
    if (!expanded) {
      if (open.contains(n->id)) throw OnnxError("layer " + n->id.toStdString() + " is on a cycle");
      open.insert(n->id);
      stack.push_back({n, true});
      for (auto it = ins.rbegin(); it != ins.rend(); ++it)
        if (*it && !built.contains((*it)->id)) stack.push_back({*it, false});
      continue;
    }
    std::vector<nn::LayerNodePtr> inputs;
    for (const core::GraphNode* u : ins) {
      if (!u) {
        inputs.push_back(nullptr);
        continue;
      }
      if (!built.contains(u->id)) throw OnnxError("layer " + u->id.toStdString() + " is on a cycle");
      inputs.push_back(built.value(u->id));
    }
    try {
      built.insert(n->id, nn::make_layer(layerSpecOf(*kind, n->id, withDefaults(n->type, n->params)),
                                         std::move(inputs)));
    } catch (const std::exception& e) {
      throw OnnxError("layer " + n->id.toStdString() + " (" + n->type.toStdString() + "): " + e.what());
    }
    open.remove(n->id);
  }
  nn::ModelOptions options;
  try {
    options = networkOptionsOf(*built.value(last->id), withDefaults("Network", net->params));
  } catch (const std::exception& e) {
    throw OnnxError("Network " + networkNode.toStdString() + ": " + e.what());
  }
  std::unique_ptr<nn::Model> model = nn::Model::create(rt, options, Device::cpu());
  if (!paramsFile.isEmpty()) {
    if (!QFileInfo(paramsFile).isFile())
      throw OnnxError("the parameter file " + QFileInfo(paramsFile).absoluteFilePath().toStdString() +
                      " does not exist");
    try {
      nn::load_params(*model, paramsFile.toStdString());
    } catch (const std::exception& e) {
      throw OnnxError("the parameter file " + paramsFile.toStdString() + " does not fit Network " +
                      networkNode.toStdString() + ": " + e.what());
    }
  }
  return model;
}

}  // namespace gn::nodes::onnx
