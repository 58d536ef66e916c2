// A valid Qt plugin for some other application: the host must refuse it by its IID, without running it.
#include <QObject>

class ForeignInterface {
 public:
  virtual ~ForeignInterface() = default;
};
Q_DECLARE_INTERFACE(ForeignInterface, "org.example.NotANodeSet/1")

class ForeignPlugin : public QObject, public ForeignInterface {
  Q_OBJECT
  Q_PLUGIN_METADATA(IID "org.example.NotANodeSet/1")
  Q_INTERFACES(ForeignInterface)
};

#include "foreign_plugin.moc"
