// Plugin loading: the test node set loads from its file; plugins that cannot load are reported with path and
// reason while the rest load; duplicate type names keep the first.
#include <QFile>
#include <QFileInfo>
#include <QTemporaryDir>
#include <QtTest>

#include "gpunodes/core/plugin.h"
#include "gpunodes/core/registry.h"

using namespace gn::core;

namespace {

class NamedType : public NodeType {
 public:
  NamedType(const QString& name, const QString& category) {
    spec_.name = name;
    spec_.category = category;
  }
  const NodeTypeSpec& spec() const override { return spec_; }
  void execute(NodeContext&) const override {}

 private:
  NodeTypeSpec spec_;
};

class InlineSet : public NodeSetPlugin {
 public:
  InlineSet(QString name, QList<NodeTypePtr> types) : name_(std::move(name)), types_(std::move(types)) {}
  QString setName() const override { return name_; }
  QList<NodeTypePtr> nodeTypes() const override { return types_; }
  std::unique_ptr<RunSession> createSession(const RunSettings&) override { return nullptr; }

 private:
  QString name_;
  QList<NodeTypePtr> types_;
};

QString pluginDir() {
  return QFileInfo(QStringLiteral(GN_TEST_PLUGIN)).absolutePath();
}
QString brokenDir() {
  return QFileInfo(QStringLiteral(GN_BROKEN_PLUGIN)).absolutePath();
}

QString reasonFor(const NodeTypeRegistry& r, const QString& path) {
  for (const auto& e : r.loadErrors())
    if (QFileInfo(e.path).canonicalFilePath() == QFileInfo(path).canonicalFilePath()) return e.reason;
  return {};
}

}  // namespace

class RegistryTest : public QObject {
  Q_OBJECT

 private slots:
  void loadsTheTestPluginFromItsFile() {
    NodeTypeRegistry r;
    QVERIFY(r.loadPluginFile(QStringLiteral(GN_TEST_PLUGIN)));
    QVERIFY(r.loadErrors().isEmpty());
    QCOMPARE(r.plugins().size(), 1);
    QCOMPARE(r.plugins()[0]->setName(), QStringLiteral("test-nodes"));
    QVERIFY(r.find("TestAdd"));
    QCOMPARE(r.find("TestAdd")->spec().inputs.size(), 3);
    QCOMPARE(r.pluginOf("TestConst"), r.plugins()[0]);
    QVERIFY(!r.find("Nope"));
    QVERIFY(!r.pluginOf("Nope"));
    // Loading the same file again adds nothing and is no error.
    QVERIFY(r.loadPluginFile(QStringLiteral(GN_TEST_PLUGIN)));
    QCOMPARE(r.plugins().size(), 1);
    QVERIFY(r.loadErrors().isEmpty());
  }

  void typesAreSortedByCategoryThenName() {
    NodeTypeRegistry r;
    InlineSet set("inline",
                  {std::make_shared<NamedType>("Zeta", "B"), std::make_shared<NamedType>("Beta", "B"),
                   std::make_shared<NamedType>("Omega", "A")});
    r.addPlugin(&set);
    QStringList names;
    for (const NodeTypePtr& t : r.types()) names.append(t->spec().name);
    QCOMPARE(names, (QStringList{"Omega", "Beta", "Zeta"}));
  }

  void aBrokenPluginIsReportedAndTheRestLoad() {
    QTemporaryDir junk;
    // Not a shared library at all, though it is named like one.
    QFile fake(junk.filePath("libfake_nodes.so"));
    QVERIFY(fake.open(QIODevice::WriteOnly));
    fake.write("this is not an ELF file\n");
    fake.close();
    QFile readme(junk.filePath("README.txt"));  // not a library: skipped without a word
    QVERIFY(readme.open(QIODevice::WriteOnly));
    readme.close();

    NodeTypeRegistry r;
    r.loadPlugins({brokenDir(), junk.path(), pluginDir(), "/no/such/dir"});
    QCOMPARE(r.plugins().size(), 1);
    QVERIFY(r.find("TestAdd"));
    QCOMPARE(r.loadErrors().size(), 3);

    const QString unresolved = reasonFor(r, QStringLiteral(GN_BROKEN_PLUGIN));
    QVERIFY2(unresolved.contains("gn_test_symbol_that_no_library_defines"), qPrintable(unresolved));
    const QString foreign = reasonFor(r, QStringLiteral(GN_FOREIGN_PLUGIN));
    QVERIFY2(foreign.contains("org.example.NotANodeSet/1") && foreign.contains("not a gpunodes node set"),
             qPrintable(foreign));
    const QString notElf = reasonFor(r, fake.fileName());
    QVERIFY2(!notElf.isEmpty(), qPrintable(notElf));
    for (const auto& e : r.loadErrors()) {
      QVERIFY2(QFileInfo(e.path).isAbsolute(), qPrintable(e.path));
      QVERIFY(!e.reason.isEmpty());
    }
  }

  void aDuplicateTypeNameIsAnErrorAndTheFirstWins() {
    NodeTypeRegistry r;
    auto first = std::make_shared<NamedType>("Same", "A");
    InlineSet one("one", {first}),
        two("two", {std::make_shared<NamedType>("Same", "B"), std::make_shared<NamedType>("Other", "B")});
    r.addPlugin(&one, "/path/one.so");
    r.addPlugin(&two);
    QCOMPARE(r.find("Same"), NodeTypePtr(first));
    QCOMPARE(r.pluginOf("Same"), &one);
    QVERIFY(r.find("Other"));  // the rest of the second set still loads
    QCOMPARE(r.loadErrors().size(), 1);
    QCOMPARE(r.loadErrors()[0].path, QStringLiteral("two"));
    QCOMPARE(r.loadErrors()[0].reason,
             QStringLiteral("node type \"Same\" is already provided by /path/one.so; the first one is used"));
    QCOMPARE(r.plugins().size(), 2);
  }

  void unnamedTypesAreRefused() {
    NodeTypeRegistry r;
    InlineSet set("set", {std::make_shared<NamedType>("", "A"), nullptr});
    r.addPlugin(&set);
    QCOMPARE(r.types().size(), 0);
    QCOMPARE(r.loadErrors().size(), 2);
  }

  void defaultDirsIncludeTheBinaryTheInstallPrefixAndTheEnvironment() {
    qputenv("GPUNODES_PLUGIN_PATH", "/opt/a::/opt/b");
    const QStringList dirs = NodeTypeRegistry::defaultPluginDirs();
    qunsetenv("GPUNODES_PLUGIN_PATH");
    QCOMPARE(dirs.value(0), QCoreApplication::applicationDirPath() + "/plugins");
    QVERIFY2(dirs.value(1).endsWith("/lib/gpunodes/plugins"), qPrintable(dirs.join(", ")));
    QCOMPARE(dirs.mid(2), (QStringList{"/opt/a", "/opt/b"}));
  }

  void thePluginPathEnvironmentIsSearched() {
    qputenv("GPUNODES_PLUGIN_PATH", pluginDir().toUtf8());
    NodeTypeRegistry r;
    r.loadPlugins();
    qunsetenv("GPUNODES_PLUGIN_PATH");
    QVERIFY(r.find("TestConst"));
  }
};

QTEST_GUILESS_MAIN(RegistryTest)
#include "test_registry.moc"
