// Entry point of the desktop editor, called by `gpunodes [FILE]`. Creates the QApplication, loads the node
// plugins, shows the main window (opening FILE when given, or offering to restore unsaved work after a crash)
// and runs the event loop. Returns the exit code.
//
// For screenshots and smoke checks without a person at the screen:
//   GPUNODES_EDITOR_SCREENSHOT=out.png  grab the window to out.png once the graph is shown (and run), quit
//   GPUNODES_EDITOR_RUN=1               run the graph first and grab after it finishes (a list runs it under
//                                       each schedule, or with each set of params: "train.lr=0.3,train.lr=0.1")
//   GPUNODES_EDITOR_PLOT=Confusion      before the grab, show that tab of the Plots dock, enlarged
//                                       (Attention: the attention of the node GPUNODES_EDITOR_SELECT selects)
//   GPUNODES_EDITOR_MISTAKE=N           and show mistake N of the Mistakes tab (its top 5)
//   GPUNODES_EDITOR_OVERLAY=1           and overlay every earlier run's series on the Training panes
// (docs/cli.md lists these with the others.)
#pragma once
#include <QString>

int runEditor(int argc, char** argv, const QString& file);
