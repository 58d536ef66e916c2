#include "node_util.h"

#include <QCryptographicHash>
#include <QDateTime>
#include <QDir>
#include <QDirIterator>
#include <QFileInfo>
#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>

#include "gpunodes/errors.h"

namespace gn::nodes {

QString qs(const std::string& s) {
  return QString::fromStdString(s);
}

bool GpuNode::reusable(const QJsonObject&) const {
  return reuse_ == Reuse::Pure;
}

Outputs GpuNode::check(NodeCheck&) const {
  return {};
}

QByteArray fileIdentity(const QString& path) {
  const QFileInfo info(path);
  QStringList entries;
  auto entry = [&entries](const QFileInfo& f, const QString& name) {
    entries.append(QString("%1 %2 %3").arg(name).arg(f.size()).arg(f.lastModified().toMSecsSinceEpoch()));
  };
  if (info.isDir()) {
    const QDir root(path);
    QDirIterator it(path, QDir::Files | QDir::NoDotAndDotDot, QDirIterator::Subdirectories);
    while (it.hasNext()) {
      it.next();
      entry(it.fileInfo(), root.relativeFilePath(it.filePath()));
    }
    entries.sort();  // the iterator's order is the file system's
  } else if (info.exists()) {
    entry(info, info.fileName());
  }
  QCryptographicHash hash(QCryptographicHash::Sha256);
  hash.addData(info.absoluteFilePath().toUtf8());
  for (const QString& e : entries) hash.addData(e.toUtf8() + '\n');
  return hash.result();
}

// --- values --------------------------------------------------------------------------------------------

QString TensorBatch::summary() const {
  if (tensors_.empty()) return "no tensors";
  const Tensor& first = tensors_.front();
  const bool uniform = std::all_of(tensors_.begin(), tensors_.end(), [&](const Tensor& t) {
    return t.shape() == first.shape() && t.device() == first.device();
  });
  if (uniform) return QString("%1 x %2").arg(tensors_.size()).arg(qs(first.str()));
  QStringList parts;
  for (size_t i = 0; i < tensors_.size() && i < 3; ++i) parts.append(qs(tensors_[i].str()));
  if (tensors_.size() > 3) parts.append("...");
  return QString("%1 tensors: %2").arg(tensors_.size()).arg(parts.join(", "));
}

qint64 TensorBatch::bytes() const {
  qint64 total = 0;
  for (const Tensor& t : tensors_) total += t.bytes();
  return total;
}

QString DeviceValue::summary() const {
  QStringList names;
  for (const Device& d : devices_) names.append(qs(d.str()));
  return devices_.size() == 1 ? names.front() : "[" + names.join(", ") + "]";
}

QString ScalarValue::summary() const {
  if (values_.size() == 1) return QString::number(values_.front());
  return QString("%1 values%2")
      .arg(values_.size())
      .arg(values_.empty() ? "" : ", last " + QString::number(values_.back()));
}

// --- specs ---------------------------------------------------------------------------------------------

core::PortSpec inPort(const QString& name, core::PortType type, const QString& doc, bool required) {
  core::PortSpec p;
  p.name = name;
  p.type = type;
  p.required = required;
  p.doc = doc;
  return p;
}

core::PortSpec outPort(const QString& name, core::PortType type, const QString& doc) {
  return inPort(name, type, doc, false);
}

namespace {
core::ParamSpec param(const QString& name, core::ParamType type, const QJsonValue& def, const QString& doc) {
  core::ParamSpec p;
  p.name = name;
  p.type = type;
  p.defaultValue = def;
  p.doc = doc;
  return p;
}
}  // namespace

core::ParamSpec intParam(const QString& name, qint64 def, double min, double max, const QString& doc) {
  core::ParamSpec p = param(name, core::ParamType::Int, QJsonValue(def), doc);
  p.min = min;
  p.max = max;
  return p;
}

core::ParamSpec floatParam(const QString& name, double def, const QString& doc) {
  return param(name, core::ParamType::Float, def, doc);
}

core::ParamSpec boolParam(const QString& name, bool def, const QString& doc) {
  return param(name, core::ParamType::Bool, def, doc);
}

core::ParamSpec pathParam(const QString& name, const QString& def, core::FileUse use, const QString& doc) {
  core::ParamSpec p = stringParam(name, def, doc);
  p.file = use;
  return p;
}

core::ParamSpec enumParam(const QString& name, const QStringList& values, const QString& def,
                          const QString& doc) {
  core::ParamSpec p = param(name, core::ParamType::Enum, def, doc);
  p.enumValues = values;
  return p;
}

core::ParamSpec precisionParam(const QString& what) {
  return enumParam("precision", {"fp32", "tf32", "bf16", "fp16"}, "fp32",
                   what +
                       ": fp32 in full float32; tf32, bf16 or fp16 on CUDA tensor cores (inputs rounded to "
                       "that format, float32 sums and results; much faster, fewer mantissa bits). A CPU "
                       "computes fp32 only: choosing another there is an error.");
}

core::ParamSpec stringParam(const QString& name, const QString& def, const QString& doc) {
  return param(name, core::ParamType::String, def, doc);
}

core::ParamSpec shapeParam(const QString& name, const QJsonArray& def, const QString& doc) {
  core::ParamSpec p = param(name, core::ParamType::Shape, def, doc);
  // Each dimension; cuBLAS and CBLAS take int dimensions.
  p.min = 1;
  p.max = 2147483647.0;
  return p;
}

// --- params --------------------------------------------------------------------------------------------

std::optional<Shape> shapeOf(const QJsonValue& v) {
  if (!v.isArray()) return std::nullopt;
  Shape shape;
  for (const QJsonValue& d : v.toArray()) {
    const double x = d.toDouble(std::nan(""));
    // Whole numbers within int64; checked_numel refuses what overflows later.
    if (!d.isDouble() || !std::isfinite(x) || x != std::floor(x) || std::fabs(x) > 9.0e18)
      return std::nullopt;
    shape.push_back(static_cast<int64_t>(x));
  }
  return shape;
}

std::optional<std::vector<float>> parseValues(const QString& text, QString* error) {
  // One pass over the bytes with from_chars: a hostile file may hold millions of numbers, and splitting
  // into a list of strings first took 1.6 s and 500 MB for five million of them.
  const QByteArray utf8 = text.toUtf8();
  const char* p = utf8.constData();
  const char* const end = p + utf8.size();
  auto isSeparator = [](char c) { return c == ',' || std::isspace(static_cast<unsigned char>(c)); };
  std::vector<float> out;
  while (p < end) {
    if (isSeparator(*p)) {
      ++p;
      continue;
    }
    const char* tokenEnd = std::find_if(p, end, isSeparator);
    // from_chars refuses a leading plus, which people write; one sign only, so "+-1" stays refused.
    const char* digits = (*p == '+' && p + 1 < tokenEnd && p[1] != '-') ? p + 1 : p;
    double v = 0;
    const auto [stop, ec] = std::from_chars(digits, tokenEnd, v);
    if (ec != std::errc() || stop != tokenEnd || digits == tokenEnd || !std::isfinite(v)) {
      if (error)
        *error =
            "\"" + QString::fromUtf8(p, std::min<qsizetype>(tokenEnd - p, 20)) + "\" is not a finite number";
      return std::nullopt;
    }
    out.push_back(static_cast<float>(v));
    p = tokenEnd;
  }
  return out;
}

Precision precisionOf(const QJsonObject& params) {
  return parse_precision(params["precision"].toString("fp32").toStdString()).value_or(Precision::Fp32);
}

// --- running -------------------------------------------------------------------------------------------

NodesSession& sessionOf(const core::NodeContext& ctx) {
  auto* s = dynamic_cast<NodesSession*>(ctx.session());
  if (!s) throw Error("this node needs the GPU node set's run session, and the host gave it none");
  return *s;
}

std::shared_ptr<const TensorBatch> tensorInput(const core::NodeContext& ctx, const QString& port) {
  core::PortValuePtr v = ctx.input(port);
  if (!v) throw Error(("input " + port + " is not connected").toStdString());
  auto batch = std::dynamic_pointer_cast<const TensorBatch>(v);
  if (!batch) throw Error(("input " + port + " carries " + v->summary() + ", not tensors").toStdString());
  if (batch->size() == 0) throw Error(("input " + port + " is an empty batch").toStdString());
  return batch;
}

std::vector<Device> deviceInput(const core::NodeContext& ctx, const QString& port) {
  core::PortValuePtr v = ctx.input(port);
  if (!v) return {};
  auto devices = std::dynamic_pointer_cast<const DeviceValue>(v);
  if (!devices) throw Error(("input " + port + " carries " + v->summary() + ", not a device").toStdString());
  return devices->devices();
}

void setTensors(core::NodeContext& ctx, const QString& port, std::vector<Tensor> tensors) {
  ctx.setOutput(port, std::make_shared<TensorBatch>(sessionOf(ctx).runtimePtr(), std::move(tensors)));
}

size_t pairedSize(const char* what, size_t a, size_t b) {
  if (a == b || b == 1) return a;
  if (a == 1) return b;
  throw Error(std::string(what) + ": batches of " + std::to_string(a) + " and " + std::to_string(b) +
              " tensors do not pair up (one side must hold a single tensor, or both the same number)");
}

void ensureFits(Runtime& rt, Device device, int64_t count, int64_t bytesEach, const QString& what) {
  const double need = static_cast<double>(count) * static_cast<double>(bytesEach);
  // With a memory_limit the allocator's own out-of-memory error says it best; without one a CPU allocation
  // may "succeed" and get the process killed later, so compare with what the device had free at the start.
  if (rt.allocator(device).limit() > 0) return;
  // CPU devices share the host's memory.
  int64_t used = 0;
  for (const DeviceInfo& info : rt.devices())
    if (info.device == device || (device.is_cpu() && info.device.is_cpu()))
      used += rt.memory_stats(info.device).reserved_bytes.current;
  const double free = static_cast<double>(rt.info(device).free_memory - used);
  if (need <= free) return;
  throw Error((what + QString(" needs %1 x %2 = %3 on %4, which has %5 free")
                          .arg(count)
                          .arg(qs(format_bytes(bytesEach)))
                          .arg(qs(format_bytes(static_cast<int64_t>(std::min(need, 9.0e18)))))
                          .arg(qs(device.str()))
                          .arg(qs(format_bytes(static_cast<int64_t>(std::max(free, 0.0))))))
                  .toStdString());
}

}  // namespace gn::nodes
