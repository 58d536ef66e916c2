#include "gpunodes/core/registry.h"

#include <QCoreApplication>
#include <QDir>
#include <QFileInfo>
#include <QJsonObject>
#include <QLibrary>
#include <QPluginLoader>
#include <QSet>
#include <algorithm>
#include <exception>

#include "gpunodes/core/plugin.h"

#ifndef GPUNODES_PLUGIN_INSTALL_DIR
#define GPUNODES_PLUGIN_INSTALL_DIR ""
#endif

namespace gn::core {

RunSettings RunSettings::fromGraph(const QJsonObject& settings) {
  RunSettings s;
  s.all = settings;
  if (settings.value("schedule").isString()) s.schedule = settings.value("schedule").toString();
  const double cpus = settings.value("cpu_devices").toDouble(0);
  if (cpus >= 1 && cpus <= 1024) s.cpuDevices = int(cpus);
  return s;
}

QStringList NodeTypeRegistry::defaultPluginDirs() {
  QStringList dirs;
  if (QCoreApplication::instance())
    dirs.append(QCoreApplication::applicationDirPath() + QStringLiteral("/plugins"));
  if (qstrlen(GPUNODES_PLUGIN_INSTALL_DIR) > 0) dirs.append(QStringLiteral(GPUNODES_PLUGIN_INSTALL_DIR));
  const QString env = qEnvironmentVariable("GPUNODES_PLUGIN_PATH");
  for (const QString& d : env.split(u':', Qt::SkipEmptyParts)) dirs.append(d);
  return dirs;
}

void NodeTypeRegistry::loadPlugins(const QStringList& dirs) {
  QSet<QString> seenDirs;
  for (const QString& dirPath : dirs) {
    const QFileInfo info(dirPath);
    if (!info.isDir()) continue;  // a default dir that does not exist is normal (no install, say)
    const QString canonical = info.canonicalFilePath();
    if (seenDirs.contains(canonical)) continue;
    seenDirs.insert(canonical);
    const QDir dir(canonical);
    for (const QFileInfo& file : dir.entryInfoList(QDir::Files, QDir::Name))
      if (QLibrary::isLibrary(file.fileName())) loadPluginFile(file.absoluteFilePath());
  }
}

bool NodeTypeRegistry::loadPluginFile(const QString& path) {
  const QFileInfo info(path);
  const QString canonical = info.exists() ? info.canonicalFilePath() : path;
  if (loadedPaths_.contains(canonical)) return true;
  // The build tree's plugin and an installed copy of it must not both load: the first directory wins.
  for (const QString& loaded : loadedPaths_) {
    if (QFileInfo(loaded).fileName() == info.fileName()) return true;
  }
  QPluginLoader loader(path);
  // Resolve every symbol now: a missing one must fail here with a reason, not crash the run later.
  loader.setLoadHints(QLibrary::ResolveAllSymbolsHint);
  const QString iid = loader.metaData().value("IID").toString();
  if (!iid.isEmpty() && iid != QStringLiteral(GN_NODESET_IID)) {
    errors_.append(
        {path,
         QStringLiteral("a Qt plugin for \"%1\", not a gpunodes node set (%2)").arg(iid, GN_NODESET_IID)});
    return false;
  }
  QObject* instance = loader.instance();
  if (!instance) {
    errors_.append({path, loader.errorString()});
    return false;
  }
  auto* plugin = qobject_cast<NodeSetPlugin*>(instance);
  if (!plugin) {
    errors_.append(
        {path,
         QStringLiteral("does not implement the gpunodes node-set interface (%1)").arg(GN_NODESET_IID)});
    loader.unload();
    return false;
  }
  // The loader object goes; the library stays loaded until the process exits (Qt keeps the instance).
  addPlugin(plugin, canonical);
  return true;
}

void NodeTypeRegistry::addPlugin(NodeSetPlugin* plugin, const QString& origin) {
  if (!plugin || plugins_.contains(plugin)) return;
  const QString where = origin.isEmpty() ? plugin->setName() : origin;
  QList<NodeTypePtr> types;
  try {
    types = plugin->nodeTypes();
  } catch (const std::exception& e) {
    errors_.append({where, QStringLiteral("listing its node types failed: %1").arg(e.what())});
    return;
  } catch (...) {
    errors_.append({where, QStringLiteral("listing its node types failed (an exception that is not a "
                                          "std::exception)")});
    return;
  }
  plugins_.append(plugin);
  loadedPaths_.append(where);  // parallel to plugins_: where each came from
  for (const NodeTypePtr& type : types) {
    if (!type || type->spec().name.isEmpty()) {
      errors_.append({where, QStringLiteral("a node type without a name was ignored")});
      continue;
    }
    const QString name = type->spec().name;
    const auto existing = types_.constFind(name);
    if (existing != types_.constEnd()) {
      const QString first = loadedPaths_.value(plugins_.indexOf(existing->second));
      errors_.append(
          {where, QStringLiteral("node type \"%1\" is already provided by %2; the first one is used")
                      .arg(name, first)});
      continue;
    }
    types_.insert(name, {type, plugin});
  }
}

NodeTypePtr NodeTypeRegistry::find(const QString& type) const {
  return types_.value(type).first;
}

NodeSetPlugin* NodeTypeRegistry::pluginOf(const QString& type) const {
  return types_.value(type).second;
}

QList<NodeTypePtr> NodeTypeRegistry::types() const {
  QList<NodeTypePtr> out;
  for (const auto& entry : types_) out.append(entry.first);
  std::sort(out.begin(), out.end(), [](const NodeTypePtr& a, const NodeTypePtr& b) {
    if (a->spec().category != b->spec().category) return a->spec().category < b->spec().category;
    return a->spec().name < b->spec().name;
  });
  return out;
}

}  // namespace gn::core
