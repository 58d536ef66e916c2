// The one `gpunodes` binary: headless subcommands, or the editor.
#include <unistd.h>

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

// libgomp, behind OpenBLAS's and oneDNN's threads, reads OMP_WAIT_POLICY once, when it loads, before main. Its
// default lets every thread spin at a barrier before it sleeps: with as many busy processes as cores, small
// training steps then lose most of their time (a GRU language model's epoch took 10 to 45 s instead of 2 s
// on two shared cores, a ViT's 36 s instead of 17), while passive waits cost nothing measurable on a quiet
// machine. So, unless the user chose a policy, gpunodes starts itself once more with passive waits (the same
// process: exec keeps its id; children inherit the setting and do not start again).
void preferPassiveOpenMpWaits(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") || setenv("OMP_WAIT_POLICY", "passive", 1) != 0) return;
  execv("/proc/self/exe", argv);  // returns only when it failed: go on with libgomp's default
}

}  // namespace

int main(int argc, char** argv) {
  preferPassiveOpenMpWaits(argv);
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
