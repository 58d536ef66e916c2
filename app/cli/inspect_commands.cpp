// gpunodes validate, devices and nodes: the commands that look at a graph, the devices and the node types
// without running anything. See docs/cli.md.
#include "cli/inspect_commands.h"

#include <unistd.h>
#include <QCommandLineParser>
#include <QCoreApplication>
#include <QDir>
#include <QElapsedTimer>
#include <QFile>
#include <QFileInfo>
#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QMap>
#include <QRegularExpression>
#include <QSaveFile>
#include <QSet>
#include <QSysInfo>
#include <atomic>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <vector>
#include "cli/cli_support.h"
#include "cli/convert_commands.h"
#include "cli/sweep.h"
#include "gpunodes/core/executor.h"
#include "gpunodes/core/graph_document.h"
#include "gpunodes/core/node_type.h"
#include "gpunodes/core/plugin.h"
#include "gpunodes/core/registry.h"
#include "gpunodes/core/report_format.h"
#include "gpunodes/core/serializer.h"
#include "gpunodes/core/subgraph.h"
#include "gpunodes/core/validation.h"
#include "gpunodes/dist/world.h"

namespace gn::cli {

using namespace gn::core;

// What the checks learned per node before any run (a layer's shape, a network's size), in file order; a
// node's table (a network's layers) under it with aligned columns.
void printFacts(const GraphDocument& doc, const ValidationReport& report) {
  if (report.facts().isEmpty()) return;
  for (const GraphNode& n : doc.nodes()) {
    auto it = report.facts().constFind(n.id);
    if (it == report.facts().constEnd()) continue;
    out(QStringLiteral("  %1 (%2): %3\n").arg(n.id, n.type, it->badge));
    if (it->columns.isEmpty()) continue;
    QList<qsizetype> width;
    for (const QString& c : it->columns) width.append(c.size());
    for (const QStringList& row : it->rows)
      for (qsizetype i = 0; i < row.size() && i < width.size(); ++i)
        width[i] = std::max(width[i], row[i].size());
    auto line = [&](const QStringList& cells) {  // names to the left, numbers to the right
      QString text;
      for (qsizetype i = 0; i < cells.size() && i < width.size(); ++i)
        text += (i < 2 ? cells[i].leftJustified(width[i]) : cells[i].rightJustified(width[i])) + "  ";
      out(QStringLiteral("    ") + text.trimmed() + u'\n');
    };
    line(it->columns);
    for (const QStringList& row : it->rows) line(row);
  }
}

int commandValidate(const QStringList& args) {
  QCommandLineParser parser;
  const FileAccessOptions files;
  parser.addOptions(files.all());
  const Parsed p = parse(parser, "validate", args, 1);
  if (!p.ok) return p.exitCode;
  const QString file = p.positional[0];
  NodeTypeRegistry registry;
  loadPlugins(registry);
  GraphDocument doc;
  QString error;
  if (!serializer::loadFile(file, doc, &error)) {
    err(QStringLiteral("error: %1\n").arg(error));
    return kFailed;
  }
  RunSettings settings = RunSettings::fromGraph(doc.settings());
  settings.files = files.policy(parser, file);
  const ValidationReport report = validate(doc, registry, settings);
  printIssues(file, report.issues(), true);
  if (!report.ok()) return kFailed;
  GraphDocument flat;  // facts are on the nodes that run: a subgraph's inner nodes, by path
  if (subgraph::hasSubgraphs(doc)) subgraph::flatten(doc, flat);
  printFacts(subgraph::hasSubgraphs(doc) ? flat : doc, report);
  out(QStringLiteral("%1: ok (%2 nodes, %3 connections)\n")
          .arg(file)
          .arg(doc.nodes().size())
          .arg(doc.connections().size()));
  return kOk;
}

int commandDevices(const QStringList& args) {
  QCommandLineParser parser;
  const QCommandLineOption json("json"), cpuDevices("cpu-devices", "", "N");
  parser.addOptions({json, cpuDevices});
  const Parsed p = parse(parser, "devices", args, 0);
  if (!p.ok) return p.exitCode;
  bool joinFailed = false;
  dist::World* world = joinWorld(&joinFailed);
  if (joinFailed) return kFailed;
  RunSettings settings;
  if (parser.isSet(cpuDevices)) {
    QString problem;
    const std::optional<int> cpus = parseCpuDevices(parser.value(cpuDevices), &problem);
    if (!cpus) return usageError(problem);
    settings.cpuDevices = *cpus;
    settings.all.insert("cpu_devices", *cpus);
  }
  NodeTypeRegistry registry;
  loadPlugins(registry);
  QJsonArray devices;
  QJsonObject sets;
  QString text;
  for (NodeSetPlugin* plugin : registry.plugins()) {
    QJsonObject env;
    try {
      env = plugin->environment(settings);
    } catch (const std::exception& e) {
      err(QStringLiteral("gpunodes: warning: %1: listing devices failed: %2\n")
              .arg(plugin->setName(), e.what()));
      continue;
    }
    if (env.isEmpty()) continue;
    sets.insert(plugin->setName(), env);
    for (const QJsonValue& d : env.value("devices").toArray()) devices.append(d);
    QString table = env.value("table").toString();
    if (table.isEmpty())  // a set that gives no table still gets its devices listed
      for (const QJsonValue& d : env.value("devices").toArray())
        table += QString::fromUtf8(QJsonDocument(d.toObject()).toJson(QJsonDocument::Compact)) + u'\n';
    if (!table.isEmpty()) {
      if (!text.isEmpty()) text += u'\n';
      text += table;
      if (!text.endsWith(u'\n')) text += u'\n';
    }
  }
  if (sets.isEmpty()) {
    err(QStringLiteral("gpunodes: no loaded node set reports devices\n"));
    return kFailed;
  }
  // What libgomp read at load: passive unless the user set OMP_WAIT_POLICY (main.cpp sets passive otherwise).
  const QString waits = qEnvironmentVariable("OMP_WAIT_POLICY", QStringLiteral("libgomp's default"));
  text += QStringLiteral("OpenMP waits: %1 (OMP_WAIT_POLICY)\n").arg(waits);
  QString shown =
      parser.isSet(json)
          ? QString::fromUtf8(QJsonDocument(QJsonObject{{"devices", devices}, {"node_sets", sets},
                                                        {"openmp_wait_policy", waits}})
                                  .toJson(QJsonDocument::Indented))
          : text;
  if (world && world->distributed()) {
    // Each rank sees its own machine and GPU: rank 0 prints every rank's view, in rank order.
    const QString host = QSysInfo::machineHostName();
    const QString mine =
        parser.isSet(json) ? QString::fromUtf8(QJsonDocument(QJsonObject{{"rank", world->rank()},
                                                                         {"host", host},
                                                                         {"local_rank", world->local_rank()},
                                                                         {"devices", devices},
                                                                         {"node_sets", sets}})
                                                   .toJson(QJsonDocument::Compact))
                           : QStringLiteral("== rank %1 (%2, local rank %3) ==\n%4")
                                 .arg(world->rank())
                                 .arg(host)
                                 .arg(world->local_rank())
                                 .arg(text);
    std::vector<std::string> all;
    try {
      all = world->allgather(mine.toStdString(), "gathering the ranks' devices");
    } catch (const std::exception& e) {
      err(QStringLiteral("error: %1\n").arg(e.what()));
      return kFailed;
    }
    if (!world->is_root()) return kOk;
    QJsonArray ranks;
    shown.clear();
    for (const std::string& r : all) {
      if (parser.isSet(json))
        ranks.append(QJsonDocument::fromJson(QByteArray::fromStdString(r)).object());
      else
        shown += QString::fromStdString(r) + (r.empty() || r.back() == '\n' ? "" : "\n");
    }
    if (parser.isSet(json))
      shown = QString::fromUtf8(QJsonDocument(QJsonObject{{"ranks", ranks}}).toJson(QJsonDocument::Indented));
  }
  out(shown);
  return kOk;
}

QJsonObject typeJson(const NodeTypeSpec& spec, const QString& plugin) {
  auto ports = [](const QList<PortSpec>& list, bool inputs) {
    QJsonArray a;
    for (const PortSpec& p : list) {
      QJsonObject o{{"name", p.name}, {"type", portTypeName(p.type)}, {"doc", p.doc}};
      if (inputs) o.insert("required", p.required);
      a.append(o);
    }
    return a;
  };
  QJsonArray params;
  for (const ParamSpec& p : spec.params) {
    QJsonObject o{
        {"name", p.name}, {"type", paramTypeName(p.type)}, {"default", p.defaultValue}, {"doc", p.doc}};
    if (p.min) o.insert("min", *p.min);
    if (p.max) o.insert("max", *p.max);
    if (!p.enumValues.isEmpty()) o.insert("values", QJsonArray::fromStringList(p.enumValues));
    if (p.file != FileUse::None) o.insert("file", fileUseName(p.file));  // "reads", "writes", "writes into"
    params.append(o);
  }
  return QJsonObject{
      {"name", spec.name}, {"category", spec.category},          {"description", spec.description},
      {"plugin", plugin},  {"inputs", ports(spec.inputs, true)}, {"outputs", ports(spec.outputs, false)},
      {"params", params}};
}

// A param's default or bound as `gpunodes nodes` lists it: as --set takes it, "(none)" without a default.
QString valueText(const QJsonValue& v) {
  return v.isUndefined() ? QStringLiteral("(none)") : paramValueText(v);
}

int commandNodes(const QStringList& args) {
  QCommandLineParser parser;
  const QCommandLineOption json("json");
  parser.addOption(json);
  const Parsed p = parse(parser, "nodes", args, 0);
  if (!p.ok) return p.exitCode;
  NodeTypeRegistry registry;
  loadPlugins(registry);
  if (parser.isSet(json)) {
    QJsonArray types, errors;
    for (const NodeTypePtr& t : registry.types())
      types.append(typeJson(t->spec(), registry.pluginOf(t->spec().name)->setName()));
    for (const NodeTypeRegistry::LoadError& e : registry.loadErrors())
      errors.append(QJsonObject{{"path", e.path}, {"reason", e.reason}});
    out(QString::fromUtf8(QJsonDocument(QJsonObject{{"node_types", types}, {"load_errors", errors}})
                              .toJson(QJsonDocument::Indented)));
    return kOk;
  }
  QString text, category;
  for (const NodeTypePtr& t : registry.types()) {
    const NodeTypeSpec& s = t->spec();
    if (s.category != category || text.isEmpty()) {
      category = s.category;
      text += QStringLiteral("\n%1\n").arg(category.isEmpty() ? QStringLiteral("(no category)") : category);
    }
    text += QStringLiteral("  %1  %2\n").arg(s.name, s.description);
    auto ports = [&](const char* label, const QList<PortSpec>& list, bool inputs) {
      if (list.isEmpty()) return;
      QStringList parts;
      for (const PortSpec& port : list)
        parts.append(QStringLiteral("%1: %2%3")
                         .arg(port.name, portTypeName(port.type),
                              inputs && !port.required ? QStringLiteral(" (optional)") : QString()));
      text += QStringLiteral("    %1 %2\n").arg(QString::fromLatin1(label), parts.join(", "));
    };
    ports("inputs: ", s.inputs, true);
    ports("outputs:", s.outputs, false);
    for (const ParamSpec& param : s.params) {
      QString kind = paramTypeName(param.type);
      if (param.min || param.max)
        kind += QStringLiteral(" %1..%2").arg(param.min ? valueText(*param.min) : QString(),
                                              param.max ? valueText(*param.max) : QString());
      if (!param.enumValues.isEmpty()) kind += QStringLiteral(" {%1}").arg(param.enumValues.join("|"));
      if (param.file != FileUse::None) kind += QStringLiteral(", a path it %1").arg(fileUseName(param.file));
      text += QStringLiteral("    %1 (%2) = %3  %4\n")
                  .arg(param.name, kind, valueText(param.defaultValue), param.doc);
    }
  }
  if (text.isEmpty()) {
    err(QStringLiteral("gpunodes: no node types: no plugin loaded\n"));
    return kFailed;
  }
  out(text.mid(1));
  return kOk;
}

}  // namespace gn::cli
