#include "graph_checks.h"

#include <QDir>
#include <QFileInfo>
#include <QSet>
#include <algorithm>
#include <cmath>
#include <map>
#include <optional>

#include "gpunodes/errors.h"
#include "image_folder.h"
#include "layer_nodes.h"
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

namespace {

// What is known before the run about the value on one output port. Unknown parts stay empty.
struct Known {
  bool isDevices = false, isTensors = false;
  // Devices: the list. Tensors: the devices the batch lives on, when known. Model: the model's device.
  std::vector<Device> devices;
  std::optional<Shape> shape;   // Tensors: every element's shape
  std::optional<double> count;  // Tensors: the batch size (a double: unchecked params may be absurd)
  std::optional<nn::ModelOptions> model;  // Model: the architecture
  nn::LayerNodePtr layer;                 // Layer: the activation and what it is built from
  // Dataset: image channels and side (after resize), which splits it has, the batch size.
  std::optional<int64_t> channels, side, batch;
  bool hasTrain = true, hasTest = true;

  static Known deviceList(std::vector<Device> d) {
    Known k;
    k.isDevices = true;
    k.devices = std::move(d);
    return k;
  }
  std::optional<Device> single() const {
    if (devices.empty()) return std::nullopt;
    for (const Device& d : devices)
      if (d != devices.front()) return std::nullopt;
    return devices.front();
  }
};

using Outputs = std::map<QString, Known>;  // port -> value

class Checker {
 public:
  Checker(const core::GraphDocument& doc, const core::NodeTypeRegistry& registry,
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
    // Files a SaveParams of this graph writes: a LoadParams may read one that does not exist yet.
    for (const core::GraphNode& n : doc_.nodes())
      if (n.type == "SaveParams" && registry_.pluginOf(n.type) == self_)
        if (core::NodeTypePtr t = registry_.find(n.type))
          savedPaths_.insert(absolute(core::withDefaults(t->spec(), n.params)["path"].toString()));
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

 private:
  void evaluate(const QString& id) {
    const core::GraphNode* node = nodes_.value(id);
    if (!node || done_.count(id) || registry_.pluginOf(node->type) != self_) return;
    if (alreadyRefused_.contains(id)) {
      done_[id] = {};
      return;
    }
    core::NodeTypePtr type = registry_.find(node->type);
    if (type) done_[id] = evalNode(*node, core::withDefaults(type->spec(), node->params));
  }

  // The value wired into node.port: nullopt when the port is open, empty when nothing is known about it.
  std::optional<Known> input(const QString& id, const QString& port) {
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

  // Something of `bytes` that cannot fit on its device even when the device is otherwise empty: false, and
  // the error, when it does not.
  bool checkFits(const QString& id, const QString& field, Device d, double bytes, const QString& what) {
    const int64_t cap = capacity(d);
    if (cap <= 0 || bytes <= static_cast<double>(cap)) return true;
    report_.error(id, field,
                  QString("%1 (%2) cannot fit on %3, which has %4%5")
                      .arg(what)
                      .arg(qs(format_bytes(static_cast<int64_t>(std::min(bytes, 9.0e18)))))
                      .arg(qs(d.str()))
                      .arg(qs(format_bytes(cap)))
                      .arg(limits_.count(d) ? " (memory_limit)" : ""));
    return false;
  }
  bool checkFits(const QString& id, const QString& field, Device d, double count, const Shape& shape,
                 const QString& what) {
    double numel = 1;
    for (int64_t x : shape) numel *= static_cast<double>(x);
    return checkFits(id, field, d, count * numel * sizeof(float),
                     QString("%1 %2 x Tensor%3").arg(what).arg(count, 0, 'g', 15).arg(qs(shape_str(shape))));
  }

  void checkSameDevice(const QString& id, const QString& field, const Known& a, const Known& b) {
    auto da = a.single(), db = b.single();
    if (da && db && *da != *db)
      report_.error(id, field, QString::fromUtf8(DeviceMismatchError(*da, *db).what()));
  }

  std::optional<double> pairCounts(const QString& id, const QString& field, const Known& a, const Known& b) {
    if (!a.count || !b.count) return std::nullopt;
    if (*a.count == *b.count || *b.count == 1) return a.count;
    if (*a.count == 1) return b.count;
    report_.error(
        id, field,
        QString("batches of %1 and %2 tensors do not pair up (one side must hold a single tensor, or "
                "both the same number)")
            .arg(*a.count, 0, 'g', 15)
            .arg(*b.count, 0, 'g', 15));
    return std::nullopt;
  }

  // A layer whose inputs are known gets its shape, or the error that names the port and both shapes.
  Known evalLayer(const QString& id, nn::LayerKind kind, const QJsonObject& p) {
    Known k;
    std::vector<nn::LayerNodePtr> inputs;
    for (const std::string& port : nn::layer_ports(kind)) {
      std::optional<Known> in = input(id, qs(port));
      if (!in || !in->layer) return k;  // open (the host says so) or unknown upstream
      inputs.push_back(in->layer);
    }
    try {
      k.layer = nn::make_layer(layerSpecOf(kind, id, p), std::move(inputs));
      report_.setFacts(id, layerFacts(*k.layer));
    } catch (const nn::LayerError& e) {
      report_.error(id, e.port().empty() ? QString("params") : "inputs." + qs(e.port()), qs(e.what()));
    }
    return k;
  }

  Known evalNetwork(const QString& id, const QJsonObject& p) {
    Known m;
    auto dev = input(id, "device");
    if (!dev)
      m.devices = {Device::cpu()};
    else if (dev->isDevices && !dev->devices.empty())
      m.devices = {dev->devices.front()};
    const Known out = input(id, "out").value_or(Known{});
    if (!out.layer) return m;
    try {
      m.model = networkOptionsOf(*out.layer, p);
    } catch (const Error& e) {  // no Input, or two
      report_.error(id, "inputs.out", qs(e.what()));
      return m;
    }
    report_.setFacts(id, networkFacts(*m.model->network));
    if (m.devices.size() == 1) {
      const double values = nn::state_elements(*m.model);
      if (!checkFits(id, "inputs.out", m.devices.front(), values * sizeof(float),
                     QString("the network's %1 parameter and buffer values").arg(values, 0, 'g', 4)))
        m.model.reset();
    }
    return m;
  }

  Outputs evalNode(const core::GraphNode& node, const QJsonObject& p) {
    const QString& id = node.id;
    const QString& type = node.type;
    Outputs out;
    if (type == "Device") {
      DeviceChoice c = resolveDevice(p["kind"].toString(), p["index"].toInteger(), p["fallback"].toBool(),
                                     catalog_.cudaCount(), catalog_.cpuCount());
      if (!c.device) {
        report_.error(id, p["kind"].toString() == "cpu" ? "params.index" : "params.fallback", c.message);
      } else {
        if (c.fellBack) report_.warning(id, "params.index", c.message);
        out["device"] = Known::deviceList({*c.device});
      }
    } else if (type == "AllDevices") {
      std::vector<Device> all;
      for (const DeviceInfo& i : catalog_.devices)
        if (i.device.is_cuda()) all.push_back(i.device);
      if (all.empty()) {
        for (int i = 0; i < catalog_.cpuCount(); ++i) all.push_back(Device::cpu(i));
        report_.warning(id, QString(),
                        QString("no GPU: try_all_gpus() falls back to the %1 CPU device%2")
                            .arg(all.size())
                            .arg(all.size() == 1 ? "" : "s"));
      }
      const qint64 count = p["count"].toInteger();
      if (count > 0 && static_cast<size_t>(count) < all.size()) all.resize(static_cast<size_t>(count));
      out["devices"] = Known::deviceList(all);
    } else if (type == "Tensor") {
      Known t;
      t.isTensors = true;
      auto dev = input(id, "device");
      std::vector<Device> devices = dev ? dev->devices : std::vector<Device>{Device::cpu()};
      t.shape = shapeOf(p["shape"]);
      const qint64 count = p["count"].toInteger();
      if (!devices.empty() && (!dev || dev->isDevices)) {
        t.devices = devices;
        t.count = double(count) * double(devices.size());
        // A batch refused here is unknown downstream, so that its consumers do not say the same again.
        if (t.shape)
          for (const Device& d : devices)
            if (!checkFits(id, "params.shape", d, double(count), *t.shape, "the batch of")) {
              t.shape.reset();
              t.count.reset();
              break;
            }
      }
      out["out"] = t;
    } else if (type == "Copy") {
      Known t = input(id, "in").value_or(Known{});
      t.isTensors = true;
      auto target = input(id, "device");
      const bool toMode = p["mode"].toString() == "to";
      const std::optional<Device> from = t.single();
      t.devices.clear();
      if (target && target->isDevices && target->devices.size() == 1) {
        t.devices = target->devices;
        // mode to on the same device copies nothing; everything else needs room on the target.
        if (t.shape && t.count && !(toMode && from == t.devices.front()))
          checkFits(id, "inputs.device", t.devices.front(), double(*t.count), *t.shape, "copying");
      }
      out["out"] = t;
    } else if (type == "MatMul") {
      out["out"] = evalMatMul(id, p);
    } else if (type == "Elementwise") {
      out["out"] = evalElementwise(id, p);
    } else if (type == "Norm") {
      Known in = input(id, "in").value_or(Known{});
      Known t;
      t.isTensors = true;
      t.devices = in.devices;
      const bool atEnd = p["log"].toString() == "at_end";
      if (atEnd) {
        if (!in.devices.empty() && !in.single())
          report_.error(id, "params.log",
                        "log at_end keeps one log on one device, but the batch spans several");
        if (in.count && *in.count < 1e15) t.shape = Shape{static_cast<int64_t>(*in.count)};
        t.count = 1;
        if (auto d = in.single()) t.devices = {*d};
      } else {
        t.shape = Shape{};
        t.count = in.count;
      }
      out["out"] = t;
    } else if (type == "Synchronize" || type == "Inspect") {
      Known t = input(id, "in").value_or(Known{});
      t.isTensors = true;
      out["out"] = t;
    } else if (auto kind = nn::parse_layer_kind(type.toStdString())) {
      out["out"] = evalLayer(id, *kind, p);
    } else if (type == "Network") {
      out["model"] = evalNetwork(id, p);
    } else if (type == "Model") {
      Known m;
      auto dev = input(id, "device");
      if (!dev)
        m.devices = {Device::cpu()};
      else if (dev->isDevices && !dev->devices.empty())
        m.devices = {dev->devices.front()};
      try {
        m.model = modelOptionsOf(p);
      } catch (const std::exception&) {
        // The params' own checks name the bad value.
      }
      // Parameters and buffers that cannot fit: refused before the run, not by the allocator mid-way.
      if (m.model && m.devices.size() == 1) {
        const double values = nn::state_elements(*m.model);
        checkFits(id, "params.arch", m.devices.front(), values * sizeof(float),
                  QString("the %1's %2 parameter and buffer values")
                      .arg(p["arch"].toString())
                      .arg(values, 0, 'g', 4));
      }
      out["model"] = m;
    } else if (type == "Dataset") {
      out["data"] = evalDataset(id, p);
    } else if (type == "Train") {
      out["model"] = evalTrain(id, p);
    } else if (type == "Evaluate") {
      const Known model = input(id, "model").value_or(Known{}), data = input(id, "data").value_or(Known{});
      const QString split = p["split"].toString();
      if (!(split == "train" ? data.hasTrain : data.hasTest))
        report_.error(id, "params.split",
                      "the dataset has no " + split + " split (set its split to both or " + split + ")");
      checkImages(id, model, data);
    } else if (type == "Forward") {
      const Known model = input(id, "model").value_or(Known{}), in = input(id, "in").value_or(Known{});
      checkSameDevice(id, "inputs.in", in, model);
      if (model.model && in.shape) {
        const QString why = inputMismatch(*model.model, *in.shape);
        if (!why.isEmpty()) report_.error(id, "inputs.in", why);
      }
      Known t;
      t.isTensors = true;
      t.devices = model.devices;
      t.count = in.count;
      if (model.model && in.shape && !in.shape->empty()) {
        if (model.model->arch == nn::Arch::Network) {
          t.shape = model.model->network->infer().back().out;
          t.shape->insert(t.shape->begin(), (*in.shape)[0]);
        } else {
          t.shape = Shape{(*in.shape)[0], model.model->classes};
        }
      }
      out["out"] = t;
    } else if (type == "Parameters") {
      Known t;
      t.isTensors = true;
      t.devices = input(id, "model").value_or(Known{}).devices;
      out["out"] = t;
    } else if (type == "SaveParams") {
      out["model"] = input(id, "model").value_or(Known{});
    } else if (type == "LoadParams") {
      const QString path = p["path"].toString();
      if (!path.trimmed().isEmpty() && !QFileInfo::exists(path) && !savedPaths_.contains(absolute(path)))
        report_.error(id, "params.path",
                      "the parameter file " + absolute(path) +
                          " does not exist, and no SaveParams in this graph writes it");
      Known m;
      if (auto like = input(id, "like")) m.model = like->model;
      if (auto dev = input(id, "device"); dev && dev->isDevices && dev->devices.size() == 1)
        m.devices = dev->devices;
      out["model"] = m;
    }
    return out;
  }

  Known evalDataset(const QString& id, const QJsonObject& p) {
    Known d;
    const QString split = p["split"].toString();
    d.hasTrain = split != "test";
    d.hasTest = split != "train";
    d.channels = 1;
    const qint64 resize = p["resize"].toInteger();
    d.side = resize > 0 ? resize : 28;
    d.batch = p["batch_size"].toInteger();
    if (p["name"].toString() == "image_folder") {
      d.channels = p["channels"].toInteger();
      // Without resize the side is the images' own, known from one header once the folder scans.
      if (resize <= 0) d.side.reset();
      // The loader's own scan (class folders only, not their files).
      try {
        const ImageFolderLayout layout = scanImageFolder(p["path"].toString());
        if (resize <= 0)
          if (const std::optional<QSize> size = firstImageSize(layout);
              size && size->width() == size->height())
            d.side = size->width();
      } catch (const std::exception& e) {
        report_.error(id, "params.path", QString::fromUtf8(e.what()));
      }
      return d;
    }
    if (p["name"].toString() != "fashion-mnist") return d;
    // The loader's message, before the run: what is missing, where, and how to install it.
    const QString dir = p["path"].toString();
    const QString hint =
        "Install the Debian package dataset-fashion-mnist (apt-get install dataset-fashion-mnist), or set "
        "path "
        "to the directory that holds train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, "
        "t10k-images-idx3-ubyte.gz and t10k-labels-idx1-ubyte.gz";
    if (!QFileInfo(dir).isDir()) {
      report_.error(id, "params.path", "Fashion-MNIST: the directory " + dir + " does not exist. " + hint);
      return d;
    }
    QStringList missing;
    QStringList files;
    // normalize reads the training split for its statistics, even when only the test split goes on.
    if (d.hasTrain || p["normalize"].toBool())
      files << "train-images-idx3-ubyte"
            << "train-labels-idx1-ubyte";
    if (d.hasTest)
      files << "t10k-images-idx3-ubyte"
            << "t10k-labels-idx1-ubyte";
    for (const QString& f : files) {
      const QString gz = QDir(dir).filePath(f + ".gz");
      if (!QFileInfo::exists(gz) && !QFileInfo::exists(QDir(dir).filePath(f))) missing << gz;
    }
    if (!missing.isEmpty())
      report_.error(id, "params.path",
                    "Fashion-MNIST: " + missing.join(", ") + (missing.size() == 1 ? " is" : " are") +
                        " missing. " + hint);
    return d;
  }

  // A model that cannot take the dataset's images, reported on the data input.
  void checkImages(const QString& id, const Known& model, const Known& data) {
    if (!model.model || !data.channels || !data.side) return;
    const QString why = imageMismatch(*model.model, *data.channels, *data.side);
    if (!why.isEmpty()) report_.error(id, "inputs.data", why);
  }

  Known evalTrain(const QString& id, const QJsonObject& p) {
    Known model = input(id, "model").value_or(Known{});
    const Known data = input(id, "data").value_or(Known{});
    std::vector<Device> devices;
    bool allKnown = true;
    for (const QString port : {"devices", "devices_2", "devices_3", "devices_4"}) {
      auto dev = input(id, port);
      if (!dev) continue;
      if (!dev->isDevices) {
        allKnown = false;
        continue;
      }
      for (const Device& d : dev->devices) {
        if (std::find(devices.begin(), devices.end(), d) != devices.end())
          report_.error(id, "inputs." + port,
                        qs(d.str()) + " is wired in twice: each device holds one replica");
        devices.push_back(d);
      }
    }
    if (!data.hasTrain)
      report_.error(id, "inputs.data", "the dataset has no training split (set its split to both or train)");
    checkImages(id, model, data);
    if (allKnown) checkPrecision(id, p, devices, "it trains");
    if (allKnown && !devices.empty() && data.batch && *data.batch < static_cast<int64_t>(devices.size()))
      report_.warning(id, "inputs.devices",
                      QString("a batch of %1 over %2 devices leaves some devices without samples in a step")
                          .arg(*data.batch)
                          .arg(devices.size()));
    model.devices.clear();
    if (allKnown && !devices.empty()) model.devices = {devices.front()};
    return model;
  }

  // Every precision but fp32 needs CUDA devices (check_precision's rule); `where` names what runs on them.
  void checkPrecision(const QString& id, const QJsonObject& p, const std::vector<Device>& devices,
                      const QString& where) {
    const Precision precision = precisionOf(p);
    if (precision == Precision::Fp32) return;
    for (const Device& d : devices)
      if (!d.is_cuda()) {
        report_.error(id, "params.precision",
                      QString("%1 needs a CUDA device, but %2 on %3 (use fp32 there)")
                          .arg(precision_name(precision), where, qs(d.str())));
        return;
      }
  }

  Known evalMatMul(const QString& id, const QJsonObject& p) {
    Known a = input(id, "a").value_or(Known{}), b = input(id, "b").value_or(Known{});
    Known out;
    out.isTensors = true;
    out.devices = a.devices;
    checkSameDevice(id, "inputs.b", a, b);
    checkPrecision(id, p, a.devices, "a is");
    const bool ta = p["trans_a"].toBool(), tb = p["trans_b"].toBool();
    if (a.shape && b.shape) {
      const Shape &x = *a.shape, &y = *b.shape;
      if (x.size() != 2 || y.size() != 2) {
        report_.error(id, x.size() != 2 ? "inputs.a" : "inputs.b",
                      "matmul needs 2-d tensors, got " + qs(shape_str(x)) + " and " + qs(shape_str(y)));
      } else {
        const int64_t k = ta ? x[0] : x[1], kb = tb ? y[1] : y[0];
        if (k != kb) {
          report_.error(id, "inputs.b",
                        QString("shapes %1%2 and %3%4 cannot be multiplied (%5 != %6)")
                            .arg(qs(shape_str(x)), ta ? "^T" : "", qs(shape_str(y)), tb ? "^T" : "")
                            .arg(k)
                            .arg(kb));
        } else {
          out.shape = Shape{ta ? x[1] : x[0], tb ? y[0] : y[1]};
        }
      }
    }
    const qint64 repeat = p["repeat"].toInteger();
    const bool keepAll = p["keep"].toString() != "last";
    if (auto n = pairCounts(id, "inputs.b", a, b)) {
      out.count = *n * (keepAll ? double(repeat) : 1.0);
      if (out.shape && keepAll)
        if (auto d = a.single())
          checkFits(id, "params.repeat", *d, double(*out.count), *out.shape, "keep=all holds");
    }
    return out;
  }

  Known evalElementwise(const QString& id, const QJsonObject& p) {
    const QString op = p["op"].toString();
    const bool binary = op == "add" || op == "sub" || op == "mul" || op == "div";
    Known a = input(id, "a").value_or(Known{});
    std::optional<Known> b = input(id, "b");
    Known out;
    out.isTensors = true;
    out.devices = a.devices;
    out.shape = a.shape;
    out.count = a.count;
    if (!binary) {
      if (b) report_.warning(id, "inputs.b", "op " + op + " uses only input a; b is ignored");
      return out;
    }
    if (!b) {
      report_.error(id, "inputs.b", "op " + op + " needs input b");
      return out;
    }
    checkSameDevice(id, "inputs.b", a, *b);
    if (a.shape && b->shape && *a.shape != *b->shape)
      report_.error(
          id, "inputs.b",
          QString("%1: shapes %2 and %3 differ").arg(op, qs(shape_str(*a.shape)), qs(shape_str(*b->shape))));
    out.count = pairCounts(id, "inputs.b", a, *b);
    return out;
  }

  static QString absolute(const QString& path) { return QDir::cleanPath(QFileInfo(path).absoluteFilePath()); }

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
  QSet<QString> savedPaths_;
};

}  // namespace

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
  Checker(doc, registry, self, catalog, parsed.options.memory_limits, report).run();
}

}  // namespace gn::nodes
