// A mutex, its scoped lock and a condition variable that clang's
// thread-safety analysis understands (common/thread_annotations.h): the same
// std::mutex and std::condition_variable underneath, no other cost.
//
//   Mutex mu_;
//   int64_t ready_ MESHLOAD_GUARDED_BY(mu_) = 0;
//   CondVar changed_;
//   ...
//   MutexLock lock(mu_);
//   while (ready_ == 0) changed_.Wait(mu_);
//
// Waits are written as loops in the function that holds the lock, so the
// analysis sees the guarded reads (a predicate lambda would be a function of
// its own, analysed without the lock).
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <shared_mutex>

#include "common/thread_annotations.h"

namespace meshload {

class MESHLOAD_CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() MESHLOAD_ACQUIRE() { mu_.lock(); }
  void Unlock() MESHLOAD_RELEASE() { mu_.unlock(); }
  bool TryLock() MESHLOAD_TRY_ACQUIRE(true) { return mu_.try_lock(); }
  /// Tells the analysis the caller holds it (a callback run under the lock).
  void AssertHeld() const MESHLOAD_ASSERT_CAPABILITY(this) {}

 private:
  friend class CondVar;
  std::mutex mu_;
};

/// Holds a Mutex for its scope; Unlock() and Lock() release and take it
/// again within the scope (work done without the lock).
class MESHLOAD_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mu) MESHLOAD_ACQUIRE(mu) : mu_(mu) { mu_.Lock(); }
  ~MutexLock() MESHLOAD_RELEASE() {
    if (held_) mu_.Unlock();
  }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  void Unlock() MESHLOAD_RELEASE() {
    mu_.Unlock();
    held_ = false;
  }
  void Lock() MESHLOAD_ACQUIRE() {
    mu_.Lock();
    held_ = true;
  }

 private:
  Mutex& mu_;
  bool held_ = true;
};

/// A reader/writer mutex (std::shared_mutex): ReaderLock for lookups that
/// may run side by side, WriterLock to change what it guards.
class MESHLOAD_CAPABILITY("mutex") SharedMutex {
 public:
  SharedMutex() = default;
  SharedMutex(const SharedMutex&) = delete;
  SharedMutex& operator=(const SharedMutex&) = delete;

  void Lock() MESHLOAD_ACQUIRE() { mu_.lock(); }
  void Unlock() MESHLOAD_RELEASE() { mu_.unlock(); }
  void LockShared() MESHLOAD_ACQUIRE_SHARED() { mu_.lock_shared(); }
  void UnlockShared() MESHLOAD_RELEASE_SHARED() { mu_.unlock_shared(); }

 private:
  std::shared_mutex mu_;
};

class MESHLOAD_SCOPED_CAPABILITY ReaderLock {
 public:
  explicit ReaderLock(SharedMutex& mu) MESHLOAD_ACQUIRE_SHARED(mu) : mu_(mu) { mu_.LockShared(); }
  ~ReaderLock() MESHLOAD_RELEASE() { mu_.UnlockShared(); }
  ReaderLock(const ReaderLock&) = delete;
  ReaderLock& operator=(const ReaderLock&) = delete;

 private:
  SharedMutex& mu_;
};

class MESHLOAD_SCOPED_CAPABILITY WriterLock {
 public:
  explicit WriterLock(SharedMutex& mu) MESHLOAD_ACQUIRE(mu) : mu_(mu) { mu_.Lock(); }
  ~WriterLock() MESHLOAD_RELEASE() { mu_.Unlock(); }
  WriterLock(const WriterLock&) = delete;
  WriterLock& operator=(const WriterLock&) = delete;

 private:
  SharedMutex& mu_;
};

/// std::condition_variable on a meshload::Mutex the caller holds.
class CondVar {
 public:
  void Wait(Mutex& mu) MESHLOAD_REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu.mu_, std::adopt_lock);
    cv_.wait(lock);
    lock.release();
  }
  /// False when `deadline` passed (the lock is held again either way).
  template <class Clock, class Duration>
  bool WaitUntil(Mutex& mu, const std::chrono::time_point<Clock, Duration>& deadline) MESHLOAD_REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu.mu_, std::adopt_lock);
    const bool woke = cv_.wait_until(lock, deadline) == std::cv_status::no_timeout;
    lock.release();
    return woke;
  }
  /// False when `timeout` passed.
  template <class Rep, class Period>
  bool WaitFor(Mutex& mu, const std::chrono::duration<Rep, Period>& timeout) MESHLOAD_REQUIRES(mu) {
    return WaitUntil(mu, std::chrono::steady_clock::now() + timeout);
  }
  void NotifyOne() { cv_.notify_one(); }
  void NotifyAll() { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

}  // namespace meshload
