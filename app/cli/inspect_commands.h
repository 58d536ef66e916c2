// gpunodes validate, devices and nodes (docs/cli.md). Each takes the arguments after its command word and
// returns the exit code: 0 ok, 1 the graph has errors or nothing answered, 2 a usage error.
#pragma once
#include <QStringList>

namespace gn::cli {

// Checks a graph file without running it: its errors and warnings, and per node what the checks learned.
int commandValidate(const QStringList& args);
// Lists the devices the loaded plugins report (under mpirun: every rank's).
int commandDevices(const QStringList& args);
// Lists the node types of the loaded plugins, with their ports and params (--json for a machine).
int commandNodes(const QStringList& args);

}  // namespace gn::cli
