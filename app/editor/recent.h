// What the editor keeps of a run's per-op streams (trace spans, memory samples). A run of millions of
// tiny ops would otherwise hold every one of them, several times over, and the timeline would repaint all
// of them twenty times a second.
#pragma once
#include <QList>

namespace gn::editor {

inline constexpr qsizetype kKeptRunItems = 200000;

// Appends items, and once the list is a quarter past `keep`, drops the oldest down to `keep`: each drop
// moves the list once per keep/4 appends, not once per append. Returns how many were dropped.
template <class T>
qsizetype appendKeepingNewest(QList<T>& list, const QList<T>& items, qsizetype keep = kKeptRunItems) {
  list.append(items);
  if (list.size() <= keep + keep / 4) return 0;
  const qsizetype dropped = list.size() - keep;
  list.remove(0, dropped);
  return dropped;
}

}  // namespace gn::editor
