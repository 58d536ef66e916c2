// Node types from loaded plugins. Plugins are found next to the binary (<bin>/plugins), in the install
// prefix (<prefix>/lib/gpunodes/plugins) and on GPUNODES_PLUGIN_PATH (colon-separated), in that order. A
// plugin file whose name was already loaded from an earlier directory is skipped, so a build tree and an
// installed copy do not both load. Plugins load with every symbol resolved, so a missing one is a load error
// (with the dynamic linker's reason) rather than a crash later. Two plugins providing one type name: the
// first wins and the second is recorded in loadErrors().
#pragma once
#include <QList>
#include <QMap>
#include <QString>
#include <QStringList>

#include "gpunodes/core/node_type.h"

namespace gn::core {

class NodeSetPlugin;

class NodeTypeRegistry {
 public:
  struct LoadError {
    QString path, reason;
  };
  static QStringList defaultPluginDirs();
  // Loads every plugin in the dirs (default: defaultPluginDirs()); one that fails is recorded, the rest load.
  void loadPlugins(const QStringList& dirs = defaultPluginDirs());
  bool loadPluginFile(const QString& path);
  // For plugins linked in, or made by tests. The registry does not own the plugin.
  void addPlugin(NodeSetPlugin* plugin, const QString& origin = {});

  NodeTypePtr find(const QString& type) const;
  NodeSetPlugin* pluginOf(const QString& type) const;
  QList<NodeTypePtr> types() const;  // sorted by category, then name
  QList<NodeSetPlugin*> plugins() const { return plugins_; }
  const QList<LoadError>& loadErrors() const { return errors_; }

 private:
  QList<NodeSetPlugin*> plugins_;
  QMap<QString, QPair<NodeTypePtr, NodeSetPlugin*>> types_;
  QList<LoadError> errors_;
  QStringList loadedPaths_;
};

}  // namespace gn::core
