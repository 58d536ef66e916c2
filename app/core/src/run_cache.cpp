#include "gpunodes/core/run_cache.h"

#include <QCryptographicHash>
#include <QJsonDocument>
#include <algorithm>

#include "gpunodes/core/plugin.h"

namespace gn::core {

RunCache::~RunCache() {
  clear();
}

qint64 RunCache::maxBytes() const {
  std::lock_guard lock(mutex_);
  return maxBytes_;
}

void RunCache::setMaxBytes(qint64 bytes) {
  QList<std::shared_ptr<const CachedNode>> dropped;
  std::lock_guard lock(mutex_);
  maxBytes_ = std::max<qint64>(0, bytes);
  evictLocked(maxBytes_, &dropped);
}

qint64 RunCache::bytes() const {
  std::lock_guard lock(mutex_);
  return bytes_;
}

int RunCache::size() const {
  std::lock_guard lock(mutex_);
  return int(slots_.size());
}

void RunCache::clear() {
  QList<std::shared_ptr<const CachedNode>> dropped;
  std::lock_guard lock(mutex_);
  evictLocked(-1, &dropped);
  scopes_.clear();
}

std::shared_ptr<const CachedNode> RunCache::find(const QByteArray& key) {
  std::lock_guard lock(mutex_);
  const auto it = slots_.find(key);
  if (it == slots_.end()) return nullptr;
  lru_.splice(lru_.begin(), lru_, it->at);
  return it->node;
}

void RunCache::insert(const QByteArray& key, CachedNode entry) {
  QList<std::shared_ptr<const CachedNode>> dropped;
  std::lock_guard lock(mutex_);
  if (const auto it = slots_.find(key); it != slots_.end()) eraseLocked(it, &dropped);
  if (entry.bytes > maxBytes_) return;
  bytes_ += entry.bytes;
  lru_.push_front(key);
  slots_.insert(key, Slot{std::make_shared<const CachedNode>(std::move(entry)), lru_.begin()});
  evictLocked(maxBytes_, &dropped);
}

void RunCache::useScope(const QString& plugin, const QString& scope) {
  QList<std::shared_ptr<const CachedNode>> dropped;
  std::lock_guard lock(mutex_);
  const auto known = scopes_.constFind(plugin);
  const bool changed = known != scopes_.constEnd() && *known != scope;
  scopes_.insert(plugin, scope);
  if (!changed) return;
  for (auto it = slots_.begin(); it != slots_.end();) {
    if (it->node->plugin == plugin)
      it = eraseLocked(it, &dropped);
    else
      ++it;
  }
}

QHash<QByteArray, RunCache::Slot>::iterator RunCache::eraseLocked(QHash<QByteArray, Slot>::iterator it,
                                                                  QList<std::shared_ptr<const CachedNode>>* out) {
  bytes_ -= it->node->bytes;
  out->append(it->node);
  lru_.erase(it->at);
  return slots_.erase(it);
}

void RunCache::evictLocked(qint64 bound, QList<std::shared_ptr<const CachedNode>>* out) {
  while (!lru_.empty() && (bound < 0 || bytes_ > bound)) eraseLocked(slots_.find(lru_.back()), out);
}

QByteArray settingsCacheKey(const RunSettings& settings) {
  QJsonObject s = settings.all;
  s.remove(QStringLiteral("schedule"));
  s.insert(QStringLiteral("cpu_devices"), settings.cpuDevices);
  return QJsonDocument(s).toJson(QJsonDocument::Compact);  // keys sorted: the same settings, the same bytes
}

QByteArray cacheKey(const QString& type, const QString& id, const QJsonObject& params,
                    const QByteArray& identity, const QByteArray& settingsKey, QList<CacheKeyInput> inputs) {
  QCryptographicHash hash(QCryptographicHash::Sha256);
  // Each field with its length first, so that no two different field lists make the same bytes.
  auto field = [&hash](const QByteArray& bytes) {
    const qint64 n = bytes.size();
    hash.addData(QByteArrayView(reinterpret_cast<const char*>(&n), sizeof n));
    hash.addData(bytes);
  };
  field(type.toUtf8());
  field(id.toUtf8());
  field(QJsonDocument(params).toJson(QJsonDocument::Compact));
  field(identity);
  field(settingsKey);
  std::sort(inputs.begin(), inputs.end(),
            [](const CacheKeyInput& a, const CacheKeyInput& b) { return a.port < b.port; });
  for (const CacheKeyInput& in : inputs) {
    field(in.port.toUtf8());
    field(in.upstream);
    field(in.fromPort.toUtf8());
  }
  return hash.result();
}

}  // namespace gn::core
