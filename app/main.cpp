// The one `gpunodes` binary: headless subcommands, or the editor.
#include <QString>
#include <cstdio>
#include <cstdlib>

#include "cli/cli.h"

#if defined(GPUNODES_WITH_GUI) && __has_include("editor/editor_main.h")
#include "editor/editor_main.h"
#define GPUNODES_HAS_EDITOR 1
#endif

namespace {

void print(FILE* to, const QString& text) {
  const QByteArray bytes = text.toLocal8Bit();
  std::fwrite(bytes.constData(), 1, size_t(bytes.size()), to);
}

#ifdef GPUNODES_HAS_EDITOR
// Without a display, Qt would abort in QApplication's constructor; say what to do instead.
bool hasDisplay() {
  return qEnvironmentVariableIsSet("DISPLAY") || qEnvironmentVariableIsSet("WAYLAND_DISPLAY") ||
         qEnvironmentVariableIsSet("QT_QPA_PLATFORM");
}
#endif

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 2 && gn::cli::isCommand(QString::fromLocal8Bit(argv[1])))
    return gn::cli::runCommand(argc, argv);

  const QString file = argc >= 2 ? QString::fromLocal8Bit(argv[1]) : QString();
  if (argc > 2 || file.startsWith(u'-')) {
    print(stderr, QStringLiteral("gpunodes: unknown command or option \"%1\"\n\n%2")
                      .arg(argc > 2 && !file.startsWith(u'-') ? QString::fromLocal8Bit(argv[2]) : file,
                           gn::cli::usage()));
    return gn::cli::kUsage;
  }
#ifdef GPUNODES_HAS_EDITOR
  if (!hasDisplay()) {
    print(stderr,
          QStringLiteral("gpunodes: no display (DISPLAY and WAYLAND_DISPLAY are unset), so the editor "
                         "cannot open.\nTo run a graph headless: gpunodes run %1\n")
              .arg(file.isEmpty() ? QStringLiteral("FILE") : file));
    return gn::cli::kUsage;
  }
  return runEditor(argc, argv, file);
#else
  print(stderr, QStringLiteral("gpunodes: this build has no editor (configured with GPUNODES_GUI=OFF).\n"
                               "To run a graph headless: gpunodes run %1\n\n%2")
                    .arg(file.isEmpty() ? QStringLiteral("FILE") : file, gn::cli::usage()));
  return gn::cli::kUsage;
#endif
}
