#include "graph_checks.h"

#include <QDir>
#include <QFileInfo>
#include <QSet>
#include <algorithm>
#include <map>
#include <optional>

#include "gpunodes/core/file_access.h"
#include "gpunodes/errors.h"
#include "model_values.h"
#include "node_util.h"
#include "session.h"

namespace gn::nodes {

int DeviceCatalog::cudaCount() const {
  return static_cast<int>(
      std::count_if(devices.begin(), devices.end(), [](auto& i) { return i.device.is_cuda(); }));
}
int DeviceCatalog::cpuCount() const {
  return static_cast<int>(
      std::count_if(devices.begin(), devices.end(), [](auto& i) { return i.device.is_cpu(); }));
}
const DeviceInfo* DeviceCatalog::find(Device d) const {
  for (const DeviceInfo& i : devices)
    if (i.device == d) return &i;
  return nullptr;
}

// The walk: every node of this set after the nodes feeding it, each checked once by its type's check, with
// what the nodes upstream left on their outputs.
class GraphWalk {
 public:
  GraphWalk(const core::GraphDocument& doc, const core::NodeTypeRegistry& registry,
            const core::NodeSetPlugin* self, const DeviceCatalog& catalog,
            const std::map<Device, int64_t>& limits, core::ValidationReport& report)
      : doc_(doc), registry_(registry), self_(self), catalog_(catalog), limits_(limits), report_(report) {
    // Indexed once: the document's own lookups scan it, and a hostile file may hold 100,000 nodes.
    for (const core::GraphNode& n : doc_.nodes())
      if (!nodes_.contains(n.id)) nodes_.insert(n.id, &n);
    for (const core::GraphConnection& c : doc_.connections()) incoming_[c.to.node].append(&c);
    // Nodes the host already refused (a param of the wrong type or out of range): checking them again here
    // would say the same mistake twice. Their outputs stay unknown to the nodes downstream.
    for (const core::Issue& i : report_.errors()) alreadyRefused_.insert(i.node);
    // Files the graph's nodes write: a node that reads one may find it missing before the run.
    for (const core::FileTouch& t : core::filesTouched(doc_, registry_, {}))
      if (t.use == core::FileUse::WriteFile) writtenPaths_.insert(t.resolved);
  }

  void run() {
    // Inputs before the nodes they feed, found without recursion: a hostile file may chain 100,000 nodes.
    // A node on a cycle (the host reports those) sees the values it waits on as unknown.
    QHash<QString, int> state;  // 1: on the stack, 2: done
    for (const core::GraphNode& root : doc_.nodes()) {
      if (state.value(root.id)) continue;
      QList<QPair<QString, qsizetype>> stack{{root.id, 0}};
      state[root.id] = 1;
      while (!stack.isEmpty()) {
        auto& [id, next] = stack.last();
        const QList<const core::GraphConnection*> from = incoming_.value(id);  // shared, not copied
        if (next < from.size()) {
          const QString f = from[next++]->from.node;
          if (!state.value(f) && nodes_.contains(f)) {
            state[f] = 1;
            stack.append({f, 0});
          }
          continue;
        }
        const QString done = id;
        stack.removeLast();
        state[done] = 2;
        evaluate(done);
      }
    }
  }

  std::optional<Known> input(const QString& id, const QString& port) const {
    for (const core::GraphConnection* c : incoming_.value(id)) {
      if (c->to.port != port) continue;
      auto from = done_.find(c->from.node);
      if (from == done_.end()) return Known{};
      auto it = from->second.find(c->from.port);
      return it == from->second.end() ? Known{} : it->second;
    }
    return std::nullopt;
  }

  int64_t capacity(Device d) const {
    if (auto it = limits_.find(d); it != limits_.end()) return it->second;
    const DeviceInfo* info = catalog_.find(d);
    return info ? info->total_memory : 0;
  }
  bool limited(Device d) const { return limits_.count(d) > 0; }
  const DeviceCatalog& catalog() const { return catalog_; }
  bool written(const QString& path) const {
    return writtenPaths_.contains(core::resolvePath(QDir::currentPath(), path));
  }

 private:
  // The node's type when this set provides it.
  const GpuNode* ours(const core::GraphNode& node) const {
    if (registry_.pluginOf(node.type) != self_) return nullptr;
    const core::NodeTypePtr type = registry_.find(node.type);
    return dynamic_cast<const GpuNode*>(type.get());
  }

  void evaluate(const QString& id) {
    const core::GraphNode* node = nodes_.value(id);
    if (!node || done_.count(id)) return;
    const GpuNode* type = ours(*node);
    if (!type) return;
    if (alreadyRefused_.contains(id)) {
      done_[id] = {};
      return;
    }
    NodeCheck check(*this, *node, core::withDefaults(type->spec(), node->params), report_);
    done_[id] = type->check(check);
  }

  const core::GraphDocument& doc_;
  const core::NodeTypeRegistry& registry_;
  const core::NodeSetPlugin* self_;
  const DeviceCatalog& catalog_;
  const std::map<Device, int64_t>& limits_;
  core::ValidationReport& report_;
  QSet<QString> alreadyRefused_;
  QHash<QString, const core::GraphNode*> nodes_;
  QHash<QString, QList<const core::GraphConnection*>> incoming_;
  std::map<QString, Outputs> done_;
  QSet<QString> writtenPaths_;
};

std::optional<Known> NodeCheck::input(const QString& port) const {
  return walk_.input(id(), port);
}

const DeviceCatalog& NodeCheck::catalog() const {
  return walk_.catalog();
}

bool NodeCheck::writtenByGraph(const QString& path) const {
  return walk_.written(path);
}

bool NodeCheck::checkFits(const QString& field, Device d, double bytes, const QString& what) {
  const int64_t cap = walk_.capacity(d);
  if (cap <= 0 || bytes <= static_cast<double>(cap)) return true;
  error(field, QString("%1 (%2) cannot fit on %3, which has %4%5")
                   .arg(what)
                   .arg(qs(format_bytes(static_cast<int64_t>(std::min(bytes, 9.0e18)))))
                   .arg(qs(d.str()))
                   .arg(qs(format_bytes(cap)))
                   .arg(walk_.limited(d) ? " (memory_limit)" : ""));
  return false;
}

bool NodeCheck::checkFits(const QString& field, Device d, double count, const Shape& shape,
                          const QString& what) {
  double numel = 1;
  for (int64_t x : shape) numel *= static_cast<double>(x);
  return checkFits(field, d, count * numel * sizeof(float),
                   QString("%1 %2 x Tensor%3").arg(what).arg(count, 0, 'g', 15).arg(qs(shape_str(shape))));
}

void NodeCheck::checkSameDevice(const QString& field, const QString& portA, const Known& a,
                                const QString& portB, const Known& b) {
  const std::optional<Device> da = a.single(), db = b.single();
  if (!da || !db || *da == *db) return;
  const QString message = QString::fromUtf8(DeviceMismatchError(*da, *db).what());
  if (b.isTensors && a.deviceOutput)
    report_.error(id(), field, message, copyFix({id(), portB}, *da, *a.deviceOutput));
  else if (a.isTensors && b.deviceOutput)
    report_.error(id(), field, message, copyFix({id(), portA}, *db, *b.deviceOutput));
  else
    error(field, message);
}

std::optional<double> NodeCheck::pairCounts(const QString& field, const Known& a, const Known& b) {
  if (!a.count || !b.count) return std::nullopt;
  if (*a.count == *b.count || *b.count == 1) return a.count;
  if (*a.count == 1) return b.count;
  error(field, QString("batches of %1 and %2 tensors do not pair up (one side must hold a single tensor, or "
                       "both the same number)")
                   .arg(*a.count, 0, 'g', 15)
                   .arg(*b.count, 0, 'g', 15));
  return std::nullopt;
}

void NodeCheck::checkPrecision(const std::vector<Device>& devices, const QString& where) {
  const Precision precision = precisionOf(params_);
  if (precision == Precision::Fp32) return;
  for (const Device& d : devices)
    if (!precision_supported(precision, d)) {
      // bf16 also runs on a CPU whose oneDNN ISA has it; say which ISA this one has.
      const QString cpu = precision == Precision::Bf16
                              ? QString(" or a CPU with native bf16 (oneDNN's ISA here: %1)").arg(qs(cpu_dnnl_isa()))
                              : QString();
      error("params.precision", QString("%1 needs a CUDA device%2, but %3 on %4 (use fp32 there)")
                                    .arg(precision_name(precision), cpu, where, qs(d.str())));
      return;
    }
}

Known NodeCheck::modelDevice(const QString& port) const {
  Known m;
  const std::optional<Known> dev = input(port);
  if (!dev)
    m.devices = {Device::cpu()};
  else if (dev->isDevices && !dev->devices.empty())
    m.devices = {dev->devices.front()};
  if (dev && dev->devices.size() == 1) m.deviceOutput = dev->deviceOutput;
  return m;
}

void NodeCheck::checkData(const Known& model, const Known& data, std::optional<nn::LossKind> loss) {
  if (!model.model) return;
  QString why;
  if (data.channels && data.side)
    why = imageMismatch(*model.model, *data.channels, *data.side);
  else if (data.data && !data.data->images())
    why = dataMismatch(*model.model, *data.data);
  if (why.isEmpty() && loss && data.data) why = targetMismatch(*model.model, *data.data, *loss);
  if (!why.isEmpty()) error("inputs.data", why);
  if (why.isEmpty()) checkAttentionFits(model, data);
}

// Each MultiheadAttention layer holds its weights, queries x keys per head and sample, for a batch at once:
// refused before the run where that alone could never fit the model's device.
void NodeCheck::checkAttentionFits(const Known& model, const Known& data) {
  if (!model.model->network || !data.batch || model.devices.empty()) return;
  const nn::NetworkSpec& net = *model.model->network;
  std::vector<nn::LayerInfo> infos;
  try {
    infos = net.infer();
  } catch (const Error&) {
    return;  // the Network node reports it
  }
  for (size_t i = 0; i < net.layers.size(); ++i) {
    const nn::LayerSpec& l = net.layers[i];
    if (l.kind != nn::LayerKind::MultiheadAttention) continue;
    const Shape& q = infos[static_cast<size_t>(l.inputs[0])].out;
    const Shape& k = infos[static_cast<size_t>(l.inputs.size() > 1 && l.inputs[1] >= 0 ? l.inputs[1] : l.inputs[0])].out;
    const double bytes = static_cast<double>(q[0]) * static_cast<double>(k[0]) * static_cast<double>(l.heads) *
                         static_cast<double>(*data.batch) * sizeof(float);
    if (!checkFits("inputs.data", model.devices.front(), bytes,
                   QString("%1's attention weights, %2 x %3 steps x %4 heads x a batch of %5 x 4 bytes")
                       .arg(qs(l.id))
                       .arg(q[0])
                       .arg(k[0])
                       .arg(l.heads)
                       .arg(*data.batch)))
      return;
  }
}

void checkGraph(const core::GraphDocument& doc, const core::NodeTypeRegistry& registry,
                const core::NodeSetPlugin* self, const core::RunSettings& settings,
                const DeviceCatalog& catalog, core::ValidationReport& report) {
  ParsedSettings parsed = parseSettings(settings);
  // The host checks schedule and cpu_devices itself; the rest of the settings are this set's.
  for (const auto& [field, message] : parsed.errors)
    if (field != "settings.schedule" && field != "settings.cpu_devices")
      report.error(QString(), field, message);
  for (auto it = parsed.options.memory_limits.begin(); it != parsed.options.memory_limits.end();) {
    if (!catalog.find(it->first)) {
      report.error(QString(), "settings.memory_limit." + qs(it->first.str()),
                   qs(it->first.str()) + " does not exist in this run");
      it = parsed.options.memory_limits.erase(it);
    } else {
      ++it;
    }
  }
  GraphWalk(doc, registry, self, catalog, parsed.options.memory_limits, report).run();
}

}  // namespace gn::nodes
