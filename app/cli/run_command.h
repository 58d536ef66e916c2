// gpunodes run (docs/cli.md).
#pragma once
#include <QStringList>

namespace gn::cli {

// Runs the graph file the arguments name, headless; returns the exit code: 0 the run succeeded (and its
// outputs were written), 1 it failed or was cancelled, 2 a usage error.
int commandRun(const QStringList& args);

}  // namespace gn::cli
