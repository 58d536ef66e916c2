#include "gpunodes/core/serializer.h"

#include <QFile>
#include <QFileInfo>
#include <QJsonArray>
#include <QJsonDocument>
#include <QSaveFile>
#include <QSet>
#include <QVariant>
#include <algorithm>
#include <cctype>
#include <cmath>
#include <functional>

#include "gpunodes/core/graph_document.h"
#include "gpunodes/core/subgraph.h"

namespace gn::core::serializer {

namespace {

const QString kFormat = QStringLiteral("gpunodes-graph");

// ---- canonical writer --------------------------------------------------------------------------------
// QJsonDocument sorts keys alphabetically and writes one value per line; ours puts format and version first
// and one node or connection per line, so files read well and diff well. Keys inside objects are sorted,
// so the same document always gives the same bytes.
//
// U+FEFF needs care (found by fuzzing): Qt's JSON drops it from the start of a string it reads raw, and a key
// that starts with one is stored under one spelling and read back under another, so QJsonObject's own order
// is not the order of the keys it hands out. Hence the writer escapes U+FEFF, which Qt reads back as it was,
// and sorts the members itself.

// The members in the order of their keys as read, each key once.
QList<QPair<QString, QJsonValue>> members(const QJsonObject& o) {
  QList<QPair<QString, QJsonValue>> m;
  m.reserve(o.size());
  for (auto it = o.begin(); it != o.end(); ++it) m.append({it.key(), it.value()});
  std::stable_sort(m.begin(), m.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  m.erase(std::unique(m.begin(), m.end(), [](const auto& a, const auto& b) { return a.first == b.first; }),
          m.end());
  return m;
}

void writeString(QByteArray& out, const QString& s) {
  out += '"';
  const QByteArray utf8 = s.toUtf8();
  for (qsizetype i = 0; i < utf8.size(); ++i) {
    const char ch = utf8[i];
    const auto c = static_cast<unsigned char>(ch);
    if (c == 0xEF && utf8.mid(i, 3) == "\xEF\xBB\xBF") {  // U+FEFF, escaped: see above
      out += "\\ufeff";
      i += 2;
      continue;
    }
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += ch;
        }
    }
  }
  out += '"';
}

void writeValue(QByteArray& out, const QJsonValue& v);

void writeObject(QByteArray& out, const QJsonObject& o) {
  out += '{';
  bool first = true;
  for (const auto& [key, value] : members(o)) {
    if (!first) out += ", ";
    first = false;
    writeString(out, key);
    out += ": ";
    writeValue(out, value);
  }
  out += '}';
}

void writeValue(QByteArray& out, const QJsonValue& v) {
  switch (v.type()) {
    case QJsonValue::Null:
    case QJsonValue::Undefined:
      out += "null";
      break;
    case QJsonValue::Bool:
      out += v.toBool() ? "true" : "false";
      break;
    case QJsonValue::Double: {
      const QVariant var = v.toVariant();
      if (var.typeId() == QMetaType::LongLong) {
        out += QByteArray::number(var.toLongLong());
      } else {
        const double d = v.toDouble();
        // JSON has no NaN or infinity; null is what QJsonDocument writes too.
        out += std::isfinite(d) ? QByteArray::number(d, 'g', QLocale::FloatingPointShortest) : "null";
      }
      break;
    }
    case QJsonValue::String:
      writeString(out, v.toString());
      break;
    case QJsonValue::Array: {
      out += '[';
      const QJsonArray a = v.toArray();
      for (qsizetype i = 0; i < a.size(); ++i) {
        if (i) out += ", ";
        writeValue(out, a[i]);
      }
      out += ']';
      break;
    }
    case QJsonValue::Object:
      writeObject(out, v.toObject());
      break;
  }
}

QJsonArray positionJson(QPointF p) {
  return QJsonArray{p.x(), p.y()};
}

QJsonObject nodeJson(const GraphNode& n);
QJsonObject connectionJson(const GraphConnection& c);

QJsonObject subgraphJson(const Subgraph& sub) {
  QJsonObject o = sub.extra;
  QJsonArray nodes, connections, inputs, outputs, promoted;
  for (const GraphNode& n : sub.nodes) nodes.append(nodeJson(n));
  for (const GraphConnection& c : sub.connections) connections.append(connectionJson(c));
  for (const SubgraphInput& in : sub.inputs) {
    QJsonArray targets;
    for (const Endpoint& e : in.targets) targets.append(e.str());
    QJsonObject p = in.extra;
    p.insert("name", in.name);
    p.insert("to", targets);
    inputs.append(p);
  }
  for (const SubgraphOutput& out : sub.outputs) {
    QJsonObject p = out.extra;
    p.insert("name", out.name);
    p.insert("from", out.source.str());
    outputs.append(p);
  }
  for (const PromotedParam& pp : sub.promoted) {
    QJsonObject p = pp.extra;
    p.insert("name", pp.name);
    p.insert("param", pp.node + u'.' + pp.param);
    promoted.append(p);
  }
  o.insert("nodes", nodes);
  o.insert("connections", connections);
  o.insert("inputs", inputs);
  o.insert("outputs", outputs);
  if (!promoted.isEmpty()) o.insert("promoted", promoted);
  if (!sub.block.name.isEmpty()) {
    QJsonObject b{{"name", sub.block.name}};
    if (!sub.block.hash.isEmpty()) b.insert("hash", sub.block.hash);
    o.insert("block", b);
  }
  return o;
}

// Known keys first in a fixed order, then the unknown ones in key order.
QJsonObject nodeJson(const GraphNode& n) {
  QJsonObject o = n.extra;
  o.insert("id", n.id);
  o.insert("type", n.type);
  o.insert("position", positionJson(n.position));
  o.insert("params", n.params);
  // Written only when set, so files without them stay as they were.
  if (n.bypassed) o.insert("bypass", true);
  if (n.muted) o.insert("mute", true);
  if (subgraph::isSubgraph(n)) o.insert("subgraph", subgraphJson(subgraph::of(n)));
  return o;
}

QJsonObject connectionJson(const GraphConnection& c) {
  QJsonObject o = c.extra;
  o.insert("from", c.from.str());
  o.insert("to", c.to.str());
  return o;
}

void writeOrdered(QByteArray& out, const QJsonObject& o, const QStringList& order) {
  out += '{';
  bool first = true;
  auto field = [&](const QString& key, const QJsonValue& value) {
    if (!first) out += ", ";
    first = false;
    writeString(out, key);
    out += ": ";
    writeValue(out, value);
  };
  const QList<QPair<QString, QJsonValue>> all = members(o);
  for (const QString& key : order)
    for (const auto& [k, value] : all)
      if (k == key) field(k, value);
  for (const auto& [key, value] : all)
    if (!order.contains(key)) field(key, value);
  out += '}';
}

const QStringList kTopKeys = {"format",   "version", "name",        "description",
                              "settings", "nodes",   "connections", "view"};
const QStringList kNodeKeys = {"id", "type", "position", "params", "bypass", "mute"};
const QStringList kConnectionKeys = {"from", "to"};

const QStringList kSubgraphKeys = {"inputs", "outputs", "promoted", "block", "nodes", "connections"};

void writeSubgraphBlock(QByteArray& out, const QJsonObject& sub, int indent);

// A node on one line; a subgraph node's inner graph follows on lines of its own, indented, so that nested
// graphs read and diff as well as the top level.
void writeNode(QByteArray& out, const QJsonObject& node, int indent) {
  const QJsonValue sub = node.value("subgraph");
  if (!sub.isObject()) {
    writeOrdered(out, node, kNodeKeys);
    return;
  }
  QJsonObject rest = node;
  rest.remove("subgraph");
  QByteArray head;
  writeOrdered(head, rest, kNodeKeys);
  head.chop(1);  // its closing brace: the subgraph comes last
  out += head;
  out += ", \"subgraph\": ";
  writeSubgraphBlock(out, sub.toObject(), indent);
  out += '}';
}

void writeSubgraphBlock(QByteArray& out, const QJsonObject& sub, int indent) {
  const QByteArray pad(indent, ' ');
  out += "{\n";
  bool first = true;
  auto field = [&](const QString& key, const QJsonValue& value) {
    if (!first) out += ",\n";
    first = false;
    out += pad + "  ";
    writeString(out, key);
    out += ": ";
    const bool lines = key == "nodes" || key == "connections";
    const QJsonArray items = value.toArray();
    if (!lines || items.isEmpty()) {
      writeValue(out, value);
      return;
    }
    out += "[\n";
    for (qsizetype i = 0; i < items.size(); ++i) {
      out += pad + "    ";
      if (key == "nodes")
        writeNode(out, items[i].toObject(), indent + 4);
      else
        writeOrdered(out, items[i].toObject(), kConnectionKeys);
      out += i + 1 < items.size() ? ",\n" : "\n";
    }
    out += pad + "  ]";
  };
  const QList<QPair<QString, QJsonValue>> all = members(sub);
  for (const QString& key : kSubgraphKeys)
    for (const auto& [k, value] : all)
      if (k == key) field(k, value);
  for (const auto& [key, value] : all)
    if (!kSubgraphKeys.contains(key)) field(key, value);
  out += "\n" + pad + "}";
}


// ---- reading -----------------------------------------------------------------------------------------

// A value quoted in an error message, cut short: a 10 MB string must not become a 10 MB message.
QString clip(const QString& s) {
  return s.size() > 64 ? s.left(64) + QStringLiteral("...") : s;
}

QString quoted(const QJsonValue& v) {
  QString s;
  if (v.isString()) {
    s = v.toString();
    if (s.size() > 40) s = s.left(40) + QStringLiteral("...");
    return u'"' + s + u'"';
  }
  if (v.isDouble()) return QString::number(v.toDouble(), 'g', 17);
  if (v.isBool()) return v.toBool() ? QStringLiteral("true") : QStringLiteral("false");
  if (v.isNull()) return QStringLiteral("null");
  if (v.isArray()) return QStringLiteral("an array");
  if (v.isObject()) return QStringLiteral("an object");
  return QStringLiteral("nothing");
}

struct LineColumn {
  qsizetype line = 1, column = 1;
};

// Column in characters, not bytes, so it matches what an editor shows.
LineColumn lineColumn(const QByteArray& bytes, qsizetype offset) {
  LineColumn lc;
  offset = std::clamp<qsizetype>(offset, 0, bytes.size());
  for (qsizetype i = 0; i < offset; ++i) {
    const auto c = static_cast<unsigned char>(bytes[i]);
    if (c == '\n') {
      ++lc.line;
      lc.column = 1;
    } else if ((c & 0xC0) != 0x80) {
      ++lc.column;
    }
  }
  return lc;
}

QString at(const QByteArray& bytes, qsizetype offset) {
  const LineColumn lc = lineColumn(bytes, offset);
  return QStringLiteral("line %1, column %2").arg(lc.line).arg(lc.column);
}

// The text just before a syntax error, so a message names the field even on a one-line file:
// `near "repeat": 1e400`. Cut at line ends and to a few dozen bytes, on UTF-8 character boundaries.
QString near(const QByteArray& bytes, qsizetype offset) {
  offset = std::clamp<qsizetype>(offset, 0, bytes.size());
  qsizetype begin = std::max<qsizetype>(0, offset - 32), end = std::min<qsizetype>(bytes.size(), offset + 8);
  // lastIndexOf(c, -1) would search from the end of the file, not before offset 0.
  const qsizetype lineStart = offset > 0 ? bytes.lastIndexOf('\n', offset - 1) + 1 : 0;
  begin = std::max(begin, lineStart);
  const qsizetype lineEnd = bytes.indexOf('\n', offset);
  if (lineEnd >= 0) end = std::min(end, lineEnd);
  while (begin < offset && (static_cast<unsigned char>(bytes[begin]) & 0xC0) == 0x80) ++begin;
  while (end < bytes.size() && end > offset && (static_cast<unsigned char>(bytes[end]) & 0xC0) == 0x80) --end;
  const QString text = QString::fromUtf8(bytes.mid(begin, end - begin)).simplified();
  return text.isEmpty() ? QString() : QStringLiteral(" (near %1)").arg(text);
}

// Offset of the first byte that is not well-formed UTF-8 (RFC 3629: no overlongs, surrogates or code points
// past U+10FFFF), or -1.
qsizetype firstInvalidUtf8(const QByteArray& bytes) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.constData());
  const qsizetype n = bytes.size();
  qsizetype i = 0;
  while (i < n) {
    const unsigned char c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    int len;
    unsigned char lo = 0x80, hi = 0xBF;  // bounds of the second byte
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    } else {
      return i;
    }
    if (i + len > n) return i;
    if (p[i + 1] < lo || p[i + 1] > hi) return i;
    for (int k = 2; k < len; ++k)
      if ((p[i + k] & 0xC0) != 0x80) return i;
    i += len;
  }
  return -1;
}

QString sizeText(qint64 bytes) {
  if (bytes >= 1024 * 1024)
    return QString::number(bytes / (1024.0 * 1024.0), 'f', 1) + QStringLiteral(" MiB");
  if (bytes >= 1024) return QString::number(bytes / 1024.0, 'f', 1) + QStringLiteral(" KiB");
  return QString::number(bytes) + QStringLiteral(" bytes");
}

QString tooBig(qint64 size) {
  return QStringLiteral("the file is %1, over the %2 MiB limit for graph files (%3 bytes)")
      .arg(sizeText(size))
      .arg(kMaxFileBytes / (1024 * 1024))
      .arg(kMaxFileBytes);
}

bool setError(QString* error, const QString& message) {
  if (error) *error = message;
  return false;
}

std::optional<QPointF> readPosition(const QJsonValue& v) {
  if (!v.isArray()) return std::nullopt;
  const QJsonArray a = v.toArray();
  if (a.size() != 2 || !a[0].isDouble() || !a[1].isDouble()) return std::nullopt;
  const double x = a[0].toDouble(), y = a[1].toDouble();
  if (!std::isfinite(x) || !std::isfinite(y)) return std::nullopt;
  return QPointF(x, y);
}

// Declared here, defined after the node and connection readers it calls (subgraphs nest).
bool readSubgraph(const QJsonValue& value, GraphNode& node, const QString& where, int depth, int version,
                  QString* error);

bool readNodes(const QJsonValue& nodesValue, const QString& prefix, int depth, int version,
               QList<GraphNode>& nodes, QString* error) {
  if (!nodesValue.isUndefined() && !nodesValue.isArray())
    return setError(error,
                    QStringLiteral("%1nodes: expected an array, got %2").arg(prefix, quoted(nodesValue)));
  const QJsonArray nodesArray = nodesValue.toArray();
  nodes.reserve(nodesArray.size());
  for (qsizetype i = 0; i < nodesArray.size(); ++i) {
    const QString where = QStringLiteral("%1nodes[%2]").arg(prefix).arg(i);
    if (!nodesArray[i].isObject())
      return setError(error,
                      QStringLiteral("%1: expected an object, got %2").arg(where, quoted(nodesArray[i])));
    QJsonObject o = nodesArray[i].toObject();
    GraphNode n;
    for (const char* key : {"id", "type"}) {
      const QJsonValue s = o.value(key);
      if (s.isUndefined()) return setError(error, QStringLiteral("%1.%2: missing").arg(where, key));
      if (!s.isString())
        return setError(error, QStringLiteral("%1.%2: expected a string, got %3").arg(where, key, quoted(s)));
    }
    n.id = o.take("id").toString();
    n.type = o.take("type").toString();
    if (o.contains("position")) {
      const std::optional<QPointF> p = readPosition(o.value("position"));
      if (!p)
        return setError(error,
                        QStringLiteral("%1.position: expected [x, y] (node %2)").arg(where, clip(n.id)));
      n.position = *p;
      o.remove("position");
    }
    if (o.contains("params")) {
      const QJsonValue p = o.take("params");
      if (!p.isObject())
        return setError(error, QStringLiteral("%1.params: expected an object, got %2 (node %3)")
                                   .arg(where, quoted(p), clip(n.id)));
      n.params = p.toObject();
    }
    for (const auto& [key, flag] : {std::pair{"bypass", &n.bypassed}, std::pair{"mute", &n.muted}}) {
      if (!o.contains(key)) continue;
      const QJsonValue v = o.take(key);
      if (!v.isBool())
        return setError(error, QStringLiteral("%1.%2: expected true or false, got %3 (node %4)")
                                   .arg(where, QLatin1String(key), quoted(v), clip(n.id)));
      *flag = v.toBool();
    }
    if (o.contains("subgraph") || n.type == subgraph::kType) {
      if (!readSubgraph(o.take("subgraph"), n, where, depth, version, error)) return false;
    }
    n.extra = o;
    nodes.append(std::move(n));
  }
  return true;

}

bool readConnections(const QJsonValue& connValue, const QString& prefix, QList<GraphConnection>& connections,
                     QString* error) {
  if (!connValue.isUndefined() && !connValue.isArray())
    return setError(error, QStringLiteral("%1connections: expected an array, got %2")
                               .arg(prefix, quoted(connValue)));
  const QJsonArray connArray = connValue.toArray();
  connections.reserve(connArray.size());
  for (qsizetype i = 0; i < connArray.size(); ++i) {
    const QString where = QStringLiteral("%1connections[%2]").arg(prefix).arg(i);
    if (!connArray[i].isObject())
      return setError(error,
                      QStringLiteral("%1: expected an object, got %2").arg(where, quoted(connArray[i])));
    QJsonObject o = connArray[i].toObject();
    GraphConnection c;
    for (const char* key : {"from", "to"}) {
      const QJsonValue s = o.take(key);
      if (s.isUndefined()) return setError(error, QStringLiteral("%1.%2: missing").arg(where, key));
      const std::optional<Endpoint> e = s.isString() ? Endpoint::parse(s.toString()) : std::nullopt;
      if (!e)
        return setError(error,
                        QStringLiteral("%1.%2: expected \"node.port\", got %3").arg(where, key, quoted(s)));
      (qstrcmp(key, "from") == 0 ? c.from : c.to) = *e;
    }
    c.extra = o;
    connections.append(std::move(c));
  }
  return true;
}

// Each entry of a subgraph's port or promoted list: an object with a string "name" and one endpoint field
// (`key`), "node.port" or, for inputs, a list of them. Other fields are kept in `extra`.
bool readBoundary(const QJsonValue& listValue, const QString& where, const char* key, bool many,
                  const std::function<void(QString, QList<Endpoint>, QJsonObject)>& add, QString* error) {
  if (listValue.isUndefined()) return true;
  if (!listValue.isArray())
    return setError(error, QStringLiteral("%1: expected an array, got %2").arg(where, quoted(listValue)));
  const QJsonArray list = listValue.toArray();
  for (qsizetype i = 0; i < list.size(); ++i) {
    const QString at = QStringLiteral("%1[%2]").arg(where).arg(i);
    if (!list[i].isObject())
      return setError(error, QStringLiteral("%1: expected an object, got %2").arg(at, quoted(list[i])));
    QJsonObject o = list[i].toObject();
    const QJsonValue name = o.take("name");
    if (!name.isString())
      return setError(error, QStringLiteral("%1.name: expected a string, got %2").arg(at, quoted(name)));
    const QJsonValue ends = o.take(QLatin1String(key));
    QList<Endpoint> endpoints;
    const QJsonArray items = many && ends.isArray() ? ends.toArray() : QJsonArray{ends};
    for (const QJsonValue& e : items) {
      const std::optional<Endpoint> parsed = e.isString() ? Endpoint::parse(e.toString()) : std::nullopt;
      if (!parsed)
        return setError(error, QStringLiteral("%1.%2: expected %3, got %4")
                                   .arg(at, QLatin1String(key),
                                        many ? QStringLiteral("a list of \"node.port\"")
                                             : QStringLiteral("\"node.port\""),
                                        quoted(e)));
      endpoints.append(*parsed);
    }
    add(name.toString(), endpoints, o);
  }
  return true;
}

bool readSubgraph(const QJsonValue& value, GraphNode& node, const QString& where, int depth, int version,
                  QString* error) {
  const QString at = where + QStringLiteral(".subgraph");
  if (node.type != subgraph::kType)
    return setError(error, QStringLiteral("%1: only a node of type %2 has one (node %3 is a %4)")
                               .arg(at, subgraph::kType, clip(node.id), clip(node.type)));
  if (value.isUndefined())
    return setError(error,
                    QStringLiteral("%1: missing (node %2 is a %3)").arg(at, clip(node.id), subgraph::kType));
  if (version < kSubgraphFormatVersion)
    return setError(error, QStringLiteral("%1: subgraphs need format version %2, the file says %3")
                               .arg(at)
                               .arg(kSubgraphFormatVersion)
                               .arg(version));
  if (!value.isObject())
    return setError(error, QStringLiteral("%1: expected an object, got %2 (node %3)")
                               .arg(at, quoted(value), clip(node.id)));
  if (depth + 1 > subgraph::kMaxDepth)
    return setError(error, QStringLiteral("%1: subgraphs nested more than %2 deep (node %3)")
                               .arg(at)
                               .arg(subgraph::kMaxDepth)
                               .arg(clip(node.id)));
  QJsonObject o = value.toObject();
  auto sub = std::make_shared<Subgraph>();
  const QString prefix = at + u'.';
  if (!readNodes(o.take("nodes"), prefix, depth + 1, version, sub->nodes, error)) return false;
  if (!readConnections(o.take("connections"), prefix, sub->connections, error)) return false;
  if (!readBoundary(o.take("inputs"), prefix + QStringLiteral("inputs"), "to", true,
                    [&](QString name, QList<Endpoint> ends, QJsonObject extra) {
                      sub->inputs.append({std::move(name), std::move(ends), std::move(extra)});
                    },
                    error))
    return false;
  if (!readBoundary(o.take("outputs"), prefix + QStringLiteral("outputs"), "from", false,
                    [&](QString name, QList<Endpoint> ends, QJsonObject extra) {
                      sub->outputs.append({std::move(name), ends.first(), std::move(extra)});
                    },
                    error))
    return false;
  if (!readBoundary(o.take("promoted"), prefix + QStringLiteral("promoted"), "param", false,
                    [&](QString name, QList<Endpoint> ends, QJsonObject extra) {
                      const Endpoint& target = ends.first();
                      sub->promoted.append({std::move(name), target.node, target.port, std::move(extra)});
                    },
                    error))
    return false;
  const QJsonValue block = o.take("block");
  if (!block.isUndefined()) {
    const QJsonObject b = block.toObject();
    const QJsonValue hash = b.value("hash");
    if (!block.isObject() || !b.value("name").isString() || (!hash.isUndefined() && !hash.isString()))
      return setError(error,
                      QStringLiteral("%1block: expected {\"name\": \"...\", \"hash\": \"...\"}, got %2")
                          .arg(prefix, quoted(block)));
    sub->block = {b.value("name").toString(), b.value("hash").toString()};
  }
  sub->extra = o;
  node.subgraph = std::move(sub);
  return true;
}

}  // namespace

QString versionProblem(const QJsonValue& version, int newest) {
  if (version.isUndefined()) return QStringLiteral("version: missing");
  const double v = version.toDouble(-1);
  if (!version.isDouble() || v != std::floor(v))
    return QStringLiteral("version: expected an integer, got %1").arg(quoted(version));
  if (v > newest)
    return QStringLiteral("version %1 is newer than this build (%2); update gpunodes to open it")
        .arg(v, 0, 'g', 17)
        .arg(newest);
  if (v < kFirstFormatVersion)
    return QStringLiteral("version %1 is not a version this build reads (%2 to %3)")
        .arg(v, 0, 'g', 17)
        .arg(kFirstFormatVersion)
        .arg(newest);
  return {};
}

QJsonObject toJson(const GraphDocument& doc) {
  QJsonObject o = doc.extra();
  o.insert("format", kFormat);
  // Version 2 only when the file needs it: a graph without subgraphs stays readable by a version-1 build.
  o.insert("version", subgraph::hasSubgraphs(doc) ? kSubgraphFormatVersion : kFirstFormatVersion);
  if (!doc.name().isEmpty()) o.insert("name", doc.name());
  if (!doc.description().isEmpty()) o.insert("description", doc.description());
  if (!doc.settings().isEmpty()) o.insert("settings", doc.settings());
  QJsonArray nodes, connections;
  for (const GraphNode& n : doc.nodes()) nodes.append(nodeJson(n));
  for (const GraphConnection& c : doc.connections()) connections.append(connectionJson(c));
  o.insert("nodes", nodes);
  o.insert("connections", connections);
  if (!doc.view().isEmpty()) o.insert("view", doc.view());
  return o;
}

QByteArray save(const GraphDocument& doc) {
  const QJsonObject o = toJson(doc);
  QByteArray out = "{\n";
  bool first = true;
  auto key = [&](const QString& k) {
    if (!first) out += ",\n";
    first = false;
    out += "  ";
    writeString(out, k);
    out += ": ";
  };
  auto list = [&](const QJsonArray& items, const QStringList& order) {
    if (items.isEmpty()) {
      out += "[]";
      return;
    }
    out += "[\n";
    for (qsizetype i = 0; i < items.size(); ++i) {
      out += "    ";
      if (order == kNodeKeys)
        writeNode(out, items[i].toObject(), 4);
      else
        writeOrdered(out, items[i].toObject(), order);
      out += i + 1 < items.size() ? ",\n" : "\n";
    }
    out += "  ]";
  };
  for (const QString& k : kTopKeys) {
    if (!o.contains(k)) continue;
    key(k);
    if (k == "nodes")
      list(o.value(k).toArray(), kNodeKeys);
    else if (k == "connections")
      list(o.value(k).toArray(), kConnectionKeys);
    else
      writeValue(out, o.value(k));
  }
  for (const auto& [k, value] : members(o)) {
    if (kTopKeys.contains(k)) continue;
    key(k);
    writeValue(out, value);
  }
  out += "\n}\n";
  return out;
}

bool fromJson(const QJsonObject& json, GraphDocument& into, QString* error) {
  const QJsonValue format = json.value("format");
  if (format.isUndefined())
    return setError(error,
                    QStringLiteral("format: missing; not a gpunodes graph (expected \"%1\")").arg(kFormat));
  if (format.toString() != kFormat)
    return setError(
        error,
        QStringLiteral("format: %1 is not a gpunodes graph (expected \"%2\")").arg(quoted(format), kFormat));
  const QJsonValue version = json.value("version");
  const QString versionError = versionProblem(version);
  if (!versionError.isEmpty()) return setError(error, versionError);
  const int v = version.toInt();

  for (const char* key : {"name", "description"}) {
    const QJsonValue s = json.value(key);
    if (!s.isUndefined() && !s.isString())
      return setError(error, QStringLiteral("%1: expected a string, got %2").arg(key, quoted(s)));
  }
  for (const char* key : {"settings", "view"}) {
    const QJsonValue s = json.value(key);
    if (!s.isUndefined() && !s.isObject())
      return setError(error, QStringLiteral("%1: expected an object, got %2").arg(key, quoted(s)));
  }

  QList<GraphNode> nodes;
  if (!readNodes(json.value("nodes"), QString(), 0, int(v), nodes, error)) return false;
  QList<GraphConnection> connections;
  if (!readConnections(json.value("connections"), QString(), connections, error)) return false;

  GraphDocument loaded;
  loaded.setName(json.value("name").toString());
  loaded.setDescription(json.value("description").toString());
  loaded.setSettings(json.value("settings").toObject());
  loaded.setView(json.value("view").toObject());
  QJsonObject extra = json;
  for (const QString& k : kTopKeys) extra.remove(k);
  loaded.setExtra(extra);
  loaded.setContents(std::move(nodes), std::move(connections));
  into.replaceAll(loaded);
  return true;
}

bool load(const QByteArray& raw, GraphDocument& into, QString* error) {
  QByteArray bytes = raw;
  if (bytes.startsWith("\xEF\xBB\xBF")) bytes.remove(0, 3);  // a UTF-8 BOM says nothing JSON needs
  if (bytes.startsWith("\xFF\xFE") || bytes.startsWith("\xFE\xFF"))
    return setError(error, QStringLiteral("the file is UTF-16 (it starts with a UTF-16 byte order mark); "
                                          "graph files are UTF-8"));
  if (bytes.trimmed().isEmpty()) return setError(error, QStringLiteral("the file is empty"));
  const qsizetype bad = firstInvalidUtf8(bytes);
  if (bad >= 0)
    return setError(error, QStringLiteral("%1: invalid UTF-8 (byte 0x%2); graph files are UTF-8")
                               .arg(at(bytes, bad))
                               .arg(static_cast<unsigned char>(bytes[bad]), 2, 16, QChar(u'0')));
  QJsonParseError parseError;
  // Qt's parser refuses nesting past 1024 levels with DeepNesting, so hostile depth cannot overflow the
  // stack.
  const QJsonDocument json = QJsonDocument::fromJson(bytes, &parseError);
  if (parseError.error != QJsonParseError::NoError) {
    // Qt reads only an object or an array at the top level; "null", 42 or prose would get "illegal value".
    qsizetype first = 0;
    while (first < bytes.size() && std::isspace(static_cast<unsigned char>(bytes[first]))) ++first;
    if (first < bytes.size() && bytes[first] != '{' && bytes[first] != '[')
      return setError(error, QStringLiteral("%1: expected a JSON object at the top level%2")
                                 .arg(at(bytes, first), near(bytes, first + 1)));
    const QString reason = parseError.error == QJsonParseError::DeepNesting
                               ? QStringLiteral("JSON nested too deeply (the limit is 1024 levels)")
                               : parseError.errorString();
    return setError(
        error,
        QStringLiteral("%1: %2%3").arg(at(bytes, parseError.offset), reason, near(bytes, parseError.offset)));
  }
  if (!json.isObject()) return setError(error, QStringLiteral("expected a JSON object at the top level"));
  return fromJson(json.object(), into, error);
}

bool loadFile(const QString& path, GraphDocument& into, QString* error) {
  const QFileInfo info(path);
  if (!info.exists()) return setError(error, QStringLiteral("%1: no such file").arg(path));
  if (info.isDir()) return setError(error, QStringLiteral("%1: is a directory, not a graph file").arg(path));
  // Checked before reading, so a file of hundreds of MB costs nothing.
  if (info.size() > kMaxFileBytes) return setError(error, path + QStringLiteral(": ") + tooBig(info.size()));
  QFile file(path);
  if (!file.open(QIODevice::ReadOnly))
    return setError(error, QStringLiteral("%1: cannot open: %2").arg(path, file.errorString()));
  // Bounded read: a pipe or device reports size 0 and may never end.
  const QByteArray bytes = file.read(kMaxFileBytes + 1);
  if (file.error() != QFileDevice::NoError)
    return setError(error, QStringLiteral("%1: cannot read: %2").arg(path, file.errorString()));
  if (bytes.size() > kMaxFileBytes)
    return setError(error, path + QStringLiteral(": ") + tooBig(bytes.size()));
  QString e;
  if (!load(bytes, into, &e)) return setError(error, path + QStringLiteral(": ") + e);
  return true;
}

bool saveFile(const QString& path, const GraphDocument& doc, QString* error) {
  QSaveFile file(path);
  if (!file.open(QIODevice::WriteOnly))
    return setError(error, QStringLiteral("%1: cannot save: %2").arg(path, file.errorString()));
  const QByteArray bytes = save(doc);
  if (file.write(bytes) != bytes.size()) {
    const QString reason = file.errorString();
    file.cancelWriting();
    return setError(error,
                    QStringLiteral("%1: cannot save, the file on disk is unchanged: %2").arg(path, reason));
  }
  if (!file.commit())
    return setError(
        error,
        QStringLiteral("%1: cannot save, the file on disk is unchanged: %2").arg(path, file.errorString()));
  return true;
}

QByteArray copyNodes(const GraphDocument& doc, const QStringList& ids) {
  const QSet<QString> wanted(ids.begin(), ids.end());
  QList<GraphNode> nodes;
  QList<GraphConnection> connections;
  for (const GraphNode& n : doc.nodes())
    if (wanted.contains(n.id)) nodes.append(n);
  for (const GraphConnection& c : doc.connections())
    if (wanted.contains(c.from.node) && wanted.contains(c.to.node)) connections.append(c);
  GraphDocument clip;
  clip.setContents(std::move(nodes), std::move(connections));
  return save(clip);
}

QStringList pasteNodes(GraphDocument& doc, const QByteArray& clipboard, QPointF offset, QString* error) {
  GraphDocument clip;
  if (!load(clipboard, clip, error)) return {};
  if (clip.nodes().isEmpty()) {
    setError(error, QStringLiteral("the clipboard holds no nodes"));
    return {};
  }
  QHash<QString, QString> renamed;  // clipboard id -> id in doc
  QStringList added;
  for (GraphNode n : clip.nodes()) {
    const QString old = n.id;
    n.position += offset;
    // Pasting into the graph they came from needs fresh ids; addNode keeps an id only when it is free.
    const QString id = doc.addNode(std::move(n));
    if (!renamed.contains(old)) renamed.insert(old, id);
    added.append(id);
  }
  for (GraphConnection c : clip.connections()) {
    if (!renamed.contains(c.from.node) || !renamed.contains(c.to.node)) continue;
    c.from.node = renamed.value(c.from.node);
    c.to.node = renamed.value(c.to.node);
    doc.addConnection(c);
  }
  return added;
}

}  // namespace gn::core::serializer
