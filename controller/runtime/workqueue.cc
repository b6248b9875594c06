#include "controller/runtime/workqueue.h"

#include <algorithm>

namespace meshload::controller::runtime {

WorkQueue::WorkQueue(WorkQueueOptions options)
    : options_(options), clock_(options.clock != nullptr ? options.clock : Clock::Real()) {
  delay_thread_ = std::thread([this] { DelayLoop(); });
}

WorkQueue::~WorkQueue() {
  ShutDown();
  if (delay_thread_.joinable()) delay_thread_.join();
}

void WorkQueue::AddLocked(const std::string& key) {
  if (shutting_down_ || dirty_.count(key) != 0) return;
  dirty_.insert(key);
  if (processing_.count(key) != 0) return;  // Done() queues it
  queue_.push_back(key);
  cv_.NotifyOne();
}

void WorkQueue::Add(const std::string& key) {
  MutexLock lock(mu_);
  AddLocked(key);
}

void WorkQueue::AddAfter(const std::string& key, std::chrono::milliseconds delay) {
  MutexLock lock(mu_);
  if (shutting_down_) return;
  if (delay.count() <= 0) {
    AddLocked(key);
    return;
  }
  auto at = clock_->Now() + delay;
  // Keep only the earliest pending time for a key, as client-go does.
  auto it = delayed_at_.find(key);
  if (it != delayed_at_.end()) {
    if (it->second <= at) return;
    for (auto range = delayed_.equal_range(it->second); range.first != range.second; ++range.first) {
      if (range.first->second == key) {
        delayed_.erase(range.first);
        break;
      }
    }
  }
  delayed_at_[key] = at;
  delayed_.emplace(at, key);
  delay_cv_.NotifyOne();
}

std::chrono::milliseconds WorkQueue::BackoffLocked(const std::string& key) const {
  auto it = failures_.find(key);
  int n = it == failures_.end() ? 0 : it->second;
  // base * 2^n, saturating at the cap (2^40 * 5 ms is far past it).
  if (n >= 40) return options_.max_delay;
  auto d = options_.base_delay * (int64_t(1) << n);
  return std::min(d, options_.max_delay);
}

void WorkQueue::AddRateLimited(const std::string& key) {
  std::chrono::milliseconds d;
  {
    MutexLock lock(mu_);
    d = BackoffLocked(key);
    ++failures_[key];
  }
  AddAfter(key, d);
}

void WorkQueue::Forget(const std::string& key) {
  MutexLock lock(mu_);
  failures_.erase(key);
}

int WorkQueue::NumRequeues(const std::string& key) const {
  MutexLock lock(mu_);
  auto it = failures_.find(key);
  return it == failures_.end() ? 0 : it->second;
}

std::chrono::milliseconds WorkQueue::NextBackoff(const std::string& key) const {
  MutexLock lock(mu_);
  return BackoffLocked(key);
}

bool WorkQueue::Get(std::string* key) {
  MutexLock lock(mu_);
  while (!shutting_down_ && queue_.empty()) cv_.Wait(mu_);
  if (shutting_down_) return false;
  *key = std::move(queue_.front());
  queue_.pop_front();
  processing_.insert(*key);
  dirty_.erase(*key);
  return true;
}

void WorkQueue::Done(const std::string& key) {
  MutexLock lock(mu_);
  processing_.erase(key);
  if (dirty_.count(key) != 0 && !shutting_down_) {
    queue_.push_back(key);
    cv_.NotifyOne();
  }
}

void WorkQueue::ShutDown() {
  MutexLock lock(mu_);
  shutting_down_ = true;
  cv_.NotifyAll();
  delay_cv_.NotifyAll();
}

bool WorkQueue::shutting_down() const {
  MutexLock lock(mu_);
  return shutting_down_;
}

size_t WorkQueue::Len() const {
  MutexLock lock(mu_);
  return queue_.size();
}

size_t WorkQueue::DelayedLen() const {
  MutexLock lock(mu_);
  return delayed_.size();
}

void WorkQueue::DelayLoop() {
  MutexLock lock(mu_);
  while (!shutting_down_) {
    if (delayed_.empty()) {
      delay_cv_.Wait(mu_);
      continue;
    }
    auto first = delayed_.begin()->first;
    if (clock_->Now() < first) {
      clock_->WaitUntil(delay_cv_, mu_, first);
      continue;
    }
    while (!delayed_.empty() && delayed_.begin()->first <= clock_->Now()) {
      std::string key = delayed_.begin()->second;
      delayed_.erase(delayed_.begin());
      delayed_at_.erase(key);
      AddLocked(key);
    }
  }
}

}  // namespace meshload::controller::runtime
