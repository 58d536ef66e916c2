#include "gpunodes/core/node_type.h"

namespace gn::core {

QString portTypeName(PortType t) {
  switch (t) {
    case PortType::Device:
      return QStringLiteral("Device");
    case PortType::Devices:
      return QStringLiteral("Devices");
    case PortType::Tensor:
      return QStringLiteral("Tensor");
    case PortType::Model:
      return QStringLiteral("Model");
    case PortType::Dataset:
      return QStringLiteral("Dataset");
    case PortType::Scalar:
      return QStringLiteral("Scalar");
    case PortType::Layer:
      return QStringLiteral("Layer");
  }
  return QStringLiteral("?");
}

std::optional<PortType> portTypeFromName(const QString& name) {
  for (PortType t : {PortType::Device, PortType::Devices, PortType::Tensor, PortType::Model,
                     PortType::Dataset, PortType::Scalar, PortType::Layer})
    if (portTypeName(t) == name) return t;
  return std::nullopt;
}

bool portAccepts(PortType to, PortType from) {
  // A single device is a set of one: try_gpu() can feed whatever wants try_all_gpus().
  return to == from || (to == PortType::Devices && from == PortType::Device);
}

QString paramTypeName(ParamType t) {
  switch (t) {
    case ParamType::Int:
      return QStringLiteral("int");
    case ParamType::Float:
      return QStringLiteral("float");
    case ParamType::Bool:
      return QStringLiteral("bool");
    case ParamType::String:
      return QStringLiteral("string");
    case ParamType::Enum:
      return QStringLiteral("enum");
    case ParamType::Shape:
      return QStringLiteral("shape");
  }
  return QStringLiteral("?");
}

template <typename T>
static const T* findByName(const QList<T>& list, const QString& name) {
  for (const T& item : list)
    if (item.name == name) return &item;
  return nullptr;
}

const PortSpec* NodeTypeSpec::input(const QString& port) const {
  return findByName(inputs, port);
}
const PortSpec* NodeTypeSpec::output(const QString& port) const {
  return findByName(outputs, port);
}
const ParamSpec* NodeTypeSpec::param(const QString& n) const {
  return findByName(params, n);
}

QJsonObject withDefaults(const NodeTypeSpec& spec, const QJsonObject& params) {
  QJsonObject out = params;
  for (const ParamSpec& p : spec.params)
    // A spec without a default (null) adds nothing: execute() sees only real values.
    if (!out.contains(p.name) && !p.defaultValue.isUndefined() && !p.defaultValue.isNull())
      out.insert(p.name, p.defaultValue);
  return out;
}

}  // namespace gn::core
