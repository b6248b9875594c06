/// \file
/// Values made once per key and kept in memory, least recently used first
/// out, within a byte bound: what the sources that decode stored objects
/// keep (DecodingSource's decompressed files, ParquetRowSource's decoded row
/// groups).
///
/// Thread safety: thread-safe. A key being made is made once: other callers
/// wait for it.
#pragma once

#include <cstdint>
#include <iterator>
#include <list>
#include <map>
#include <memory>
#include <utility>

#include "common/mutex.h"
#include "common/status.h"
#include "common/thread_annotations.h"

namespace meshload::sidecar::source {

template <typename Key, typename Value>
class KeptValues {
 public:
  /// `capacity_bytes`: what the values kept take together at most (one is
  /// kept whatever its size while it is used); `bytes(v)` what `v` takes.
  KeptValues(uint64_t capacity_bytes, uint64_t (*bytes)(const Value&)) : capacity_(capacity_bytes), bytes_(bytes) {}

  /// The value of `key`: the one kept, else what `make()` returns (kept
  /// then, the least recently used others evicted until the rest fit). A
  /// failure is returned and nothing kept.
  template <typename Make>
  Result<std::shared_ptr<const Value>> Get(const Key& key, Make&& make) MESHLOAD_EXCLUDES(mu_) {
    MutexLock lock(mu_);
    while (true) {
      auto it = held_.find(key);
      if (it == held_.end()) break;
      if (it->second.value) {
        lru_.splice(lru_.end(), lru_, it->second.lru);
        return it->second.value;
      }
      done_.Wait(mu_);  // another caller is making it
    }
    lru_.push_back(key);
    held_[key] = Held{nullptr, std::prev(lru_.end())};
    lock.Unlock();
    Result<std::shared_ptr<const Value>> made = make();
    lock.Lock();
    auto it = held_.find(key);
    if (!made.ok()) {
      lru_.erase(it->second.lru);
      held_.erase(it);
      done_.NotifyAll();
      return made.status();
    }
    ++made_;
    it->second.value = *made;
    held_bytes_ += bytes_(**made);
    while (held_bytes_ > capacity_ && lru_.front() != key) {
      auto old = held_.find(lru_.front());
      if (!old->second.value) break;  // being made: it is the newest use
      held_bytes_ -= bytes_(*old->second.value);
      held_.erase(old);
      lru_.pop_front();
    }
    done_.NotifyAll();
    return *made;
  }

  /// Values made so far (one evicted and made again counts again).
  uint64_t made() const MESHLOAD_EXCLUDES(mu_) {
    MutexLock lock(mu_);
    return made_;
  }

 private:
  struct Held {
    std::shared_ptr<const Value> value;  // null while being made
    typename std::list<Key>::iterator lru;
  };
  const uint64_t capacity_;
  uint64_t (*const bytes_)(const Value&);
  mutable Mutex mu_;
  CondVar done_;
  std::map<Key, Held> held_ MESHLOAD_GUARDED_BY(mu_);
  std::list<Key> lru_ MESHLOAD_GUARDED_BY(mu_);  // least recently used first
  uint64_t held_bytes_ MESHLOAD_GUARDED_BY(mu_) = 0;
  uint64_t made_ MESHLOAD_GUARDED_BY(mu_) = 0;
};

}  // namespace meshload::sidecar::source
