// A node-set plugin that cannot load: it calls a function no library defines. The host loads plugins with
// every symbol resolved up front, so this must be reported with its path and the dynamic linker's reason.
#include <QObject>

#include "gpunodes/core/plugin.h"

extern "C" int gn_test_symbol_that_no_library_defines();

class BrokenNodesPlugin : public QObject, public gn::core::NodeSetPlugin {
  Q_OBJECT
  Q_PLUGIN_METADATA(IID GN_NODESET_IID)
  Q_INTERFACES(gn::core::NodeSetPlugin)

 public:
  QString setName() const override { return QString::number(gn_test_symbol_that_no_library_defines()); }
  QList<gn::core::NodeTypePtr> nodeTypes() const override { return {}; }
  std::unique_ptr<gn::core::RunSession> createSession(const gn::core::RunSettings&) override {
    return nullptr;
  }
};

#include "broken_nodes.moc"
