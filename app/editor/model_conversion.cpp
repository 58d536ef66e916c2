#include "model_conversion.h"

#include <QEventLoop>
#include <QPointer>
#include <QProgressDialog>
#include <QThread>
#include <algorithm>
#include <exception>

#include "gpunodes/core/graph_document.h"
#include "gpunodes/core/registry.h"

namespace gn::editor {

core::ConvertResult runConversion(QWidget* parent, const QString& title,
                                  const std::function<core::ConvertResult(const core::ConvertProgress&)>& work) {
  QProgressDialog dialog(title, QString(), 0, 1000, parent);  // no Cancel: a converter cannot stop halfway
  dialog.setWindowTitle(title);
  dialog.setWindowModality(Qt::WindowModal);
  dialog.setMinimumDuration(400);
  dialog.setAutoClose(false);
  dialog.setAutoReset(false);
  QPointer<QProgressDialog> shown(&dialog);
  // Called on the worker: the dialog is updated on its own thread; updates still queued when it is gone
  // are dropped with it (the context object).
  const core::ConvertProgress progress = [shown](double fraction, const QString& what) {
    QMetaObject::invokeMethod(
        shown.data(),
        [shown, fraction, what] {
          if (!shown) return;
          shown->setValue(int(std::clamp(fraction, 0.0, 1.0) * 1000));
          shown->setLabelText(what);
        },
        Qt::QueuedConnection);
  };
  core::ConvertResult result;
  QThread* worker = QThread::create([&] {
    try {
      result = work(progress);
    } catch (const std::exception& e) {
      result = {.error = QString::fromUtf8(e.what())};
    }
  });
  QEventLoop loop;
  QObject::connect(worker, &QThread::finished, &loop, &QEventLoop::quit);
  worker->start();
  loop.exec(QEventLoop::ExcludeUserInputEvents);  // painted, and no click reaches the document meanwhile
  worker->wait();
  delete worker;
  return result;
}

QStringList modelNodes(const core::GraphDocument& doc, const core::NodeTypeRegistry& registry) {
  QStringList ids;
  for (const core::GraphNode& n : doc.nodes()) {
    const core::NodeTypePtr type = registry.find(n.type);
    if (!type) continue;
    for (const core::PortSpec& out : type->spec().outputs)
      if (out.type == core::PortType::Model) {
        ids.append(n.id);
        break;
      }
  }
  return ids;
}

QString converterFilter(const core::FormatConverter& converter) {
  QStringList patterns;
  for (const QString& e : converter.extensions()) patterns.append("*." + e);
  return QStringLiteral("%1 models (%2)").arg(converter.name(), patterns.join(u' '));
}

}  // namespace gn::editor
