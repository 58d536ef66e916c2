// The run cache: what nodes produced in earlier runs, so that a run executes only what changed. After
// ComfyUI's cache, a node's key is a hash of its type, its id, its params with defaults filled in, what its
// type adds (NodeType::cacheIdentity: the device a Device node resolves to, the files a node reads), the
// settings that shape values (all but the schedule) and its inputs' keys by port. A change anywhere
// upstream therefore changes every key below it, and nothing else. Only reusable node types have keys
// (NodeType::reusable), and a node fed by one without a key has none either. A hit hands the node's outputs
// on without running it and replays what it reported (report fields, run-time warnings, metric points), so
// the report, the plots and the views look as after the run that made them.
//
// The id is part of the key because what a node reports is named by it (Train's series <id>.loss): two
// identical nodes do not share an entry.
//
// Lifetime. A value on a wire belongs to the plugin that made it and may need run-wide state: the GPU node
// set's tensors live in the allocators and engine of its runtime. Keeping a value keeps what it holds, and
// the GPU node set hands the same runtime to its next session while the settings stay the same
// (nodes/plugin.h), so a cached tensor meets new ones on the same devices, allocators and engine, and the
// same-device rule still holds. Each session names that state (RunSession::valueScope); when it changes
// (other settings, a new runtime), the cache drops that plugin's values, which could not be mixed with the
// new session's. Kept values stay allocated, so the devices' memory counts them; the cache is bounded in
// bytes (PortValue::bytes), least recently used out first.
//
// Thread-safe: the editor reads the size from the UI thread while a run fills the cache.
#pragma once
#include <QByteArray>
#include <QHash>
#include <QJsonObject>
#include <QList>
#include <QString>
#include <QStringList>
#include <list>
#include <memory>
#include <mutex>

#include "gpunodes/core/node_type.h"

namespace gn::core {

struct RunSettings;

// What a node left behind: its outputs and what it reported while it ran.
struct CachedNode {
  struct Point {
    QString series;
    double t = 0, value = 0;
  };
  QString plugin;  // the set name of the plugin that made the values
  QHash<QString, PortValuePtr> outputs;
  QJsonObject fields;  // NodeContext::reportField
  QStringList warnings;
  QList<Point> metrics;
  QStringList devices;  // where its work ran, for the report
  qint64 bytes = 0;     // the outputs' PortValue::bytes, counted once per distinct value
};

class RunCache {
 public:
  static constexpr qint64 kDefaultMaxBytes = qint64(2) << 30;  // 2 GiB

  explicit RunCache(qint64 maxBytes = kDefaultMaxBytes) : maxBytes_(maxBytes) {}
  ~RunCache();
  RunCache(const RunCache&) = delete;
  RunCache& operator=(const RunCache&) = delete;

  qint64 maxBytes() const;
  void setMaxBytes(qint64 bytes);  // evicts down to the new bound
  qint64 bytes() const;            // what the kept values hold
  int size() const;                // entries
  void clear();

  // The entry under `key`, now the most recently used; null when there is none.
  std::shared_ptr<const CachedNode> find(const QByteArray& key);
  // Keeps `entry` under `key` (replacing one there) and evicts the least recently used entries beyond the
  // bound. An entry larger than the whole bound is not kept.
  void insert(const QByteArray& key, CachedNode entry);
  // The values `plugin` makes from now on belong to `scope`: its entries from another scope are dropped.
  void useScope(const QString& plugin, const QString& scope);

 private:
  using Lru = std::list<QByteArray>;  // most recently used first
  struct Slot {
    std::shared_ptr<const CachedNode> node;
    Lru::iterator at;
  };
  // Under the lock; the dropped entries go to *out, to be released after it (a last reference to a runtime
  // waits for its threads).
  void evictLocked(qint64 bound, QList<std::shared_ptr<const CachedNode>>* out);
  // Removes the slot at `it` (its value goes to `out`, to be released outside the lock) and returns the
  // iterator after it: a QHash erase moves other entries, so no iterator taken before stays valid.
  QHash<QByteArray, Slot>::iterator eraseLocked(QHash<QByteArray, Slot>::iterator it,
                                                QList<std::shared_ptr<const CachedNode>>* out);

  mutable std::mutex mutex_;
  qint64 maxBytes_;
  qint64 bytes_ = 0;
  Lru lru_;
  QHash<QByteArray, Slot> slots_;
  QHash<QString, QString> scopes_;
};

// The part of the settings a key includes: every setting but the schedule, which changes when work runs,
// not what it makes. cpu_devices as RunSettings has it (after command-line overrides).
QByteArray settingsCacheKey(const RunSettings& settings);

// One input of a node, for its key: the port, the upstream node's key and the output it comes from.
struct CacheKeyInput {
  QString port;
  QByteArray upstream;
  QString fromPort;
};
// A node's key (SHA-256). `params` with defaults filled in; inputs in any order.
QByteArray cacheKey(const QString& type, const QString& id, const QJsonObject& params,
                    const QByteArray& identity, const QByteArray& settingsKey, QList<CacheKeyInput> inputs);

}  // namespace gn::core
