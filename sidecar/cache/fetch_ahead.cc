#include "sidecar/cache/fetch_ahead.h"

#include <algorithm>

#include "common/logging.h"

namespace meshload::sidecar::cache {

FetchAhead::FetchAhead(const planner::ShardPlanner& planner, planner::Loading loading, int64_t process,
                       CachedSource& source, std::vector<int64_t> object_of_file, FetchAheadOptions options)
    : planner_(planner),
      loading_(loading),
      process_(process),
      source_(source),
      object_of_file_(std::move(object_of_file)),
      options_(options) {}

FetchAhead::~FetchAhead() { Stop(); }

void FetchAhead::Stop() {
  {
    MutexLock lock(mu_);
    stop_ = true;
  }
  changed_.NotifyAll();
  work_.NotifyAll();
  filled_.NotifyAll();
  for (auto& t : threads_) t.join();
  threads_.clear();
}

void FetchAhead::Start(int64_t first) {
  {
    MutexLock lock(mu_);
    if (started_ || stop_) return;
    started_ = true;
    passed_ = first - 1;
    scanned_ = first - 1;
  }
  threads_.emplace_back([this] { WalkerMain(); });
  for (int i = 0; i < std::max(1, options_.threads); ++i) threads_.emplace_back([this] { FetcherMain(); });
}

void FetchAhead::Publish() {
  ahead_steps_.store(scanned_ - passed_, std::memory_order_relaxed);
  ahead_bytes_.store(bytes_, std::memory_order_relaxed);
}

void FetchAhead::Passed(int64_t step) {
  {
    MutexLock lock(mu_);
    if (step <= passed_) return;
    passed_ = step;
    while (!step_bytes_.empty() && step_bytes_.front().step <= passed_) {
      bytes_ -= step_bytes_.front().bytes;
      step_bytes_.pop_front();
    }
    if (scanned_ < passed_) scanned_ = passed_;
    Publish();
  }
  source_.cache().SetPassed(step);
  changed_.NotifyAll();
}

void FetchAhead::StartAt(int64_t first) {
  {
    MutexLock lock(mu_);
    generation_ += 1;
    passed_ = first - 1;
    scanned_ = first - 1;
    bytes_ = 0;
    step_bytes_.clear();
    for (const Item& it : queue_) queued_.erase(Key(it.ref));
    queue_.clear();
    Publish();
  }
  changed_.NotifyAll();
}

std::vector<BlockRef> FetchAhead::BlocksOf(int64_t step) const {
  const planner::DatasetIndex& ds = planner_.job().dataset;
  const planner::StepPlan plan = planner_.PlanStep(step, loading_, process_, planner::ShardPlanner::Detail::kSamples);
  std::vector<BlockRef> out;
  std::vector<planner::Extent> extents;
  for (const planner::ReadPlan& r : plan.reads) {
    for (uint64_t id : r.samples) {
      extents.clear();
      ds.AppendExtents(id, extents);
      for (const planner::Extent& e : extents) {
        const int64_t object = e.file < object_of_file_.size() ? object_of_file_[e.file] : -1;
        if (object < 0 || e.length == 0) continue;
        const auto [b0, b1] = source_.BlocksOf(static_cast<size_t>(object), e.offset, e.length);
        for (uint64_t b = b0; b <= b1; ++b) out.push_back({static_cast<uint32_t>(object), b});
      }
    }
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

void FetchAhead::WalkerMain() {
  std::vector<BlockRef> fresh;
  MutexLock lock(mu_);
  while (!stop_) {
    if (bytes_ >= options_.lookahead_bytes || scanned_ - passed_ >= options_.max_steps_ahead) {
      changed_.Wait(mu_);
      continue;
    }
    const int64_t step = scanned_ + 1;
    const uint64_t generation = generation_;
    lock.Unlock();
    // The plan and the cache's bookkeeping, without this lock.
    fresh.clear();
    for (const BlockRef& r : BlocksOf(step)) {
      if (!source_.cache().SetNextUse(source_.IdOf(r.object, r.block), step)) fresh.push_back(r);
    }
    lock.Lock();
    if (generation != generation_ || step != scanned_ + 1) continue;  // started over meanwhile
    uint64_t bytes = 0;
    for (const BlockRef& r : fresh) {
      if (!queued_.insert(Key(r)).second) continue;  // queued or being filled already (this use is noted)
      queue_.push_back({r, step, generation});
      bytes += source_.BlockExtent(r.object, r.block).second;
    }
    step_bytes_.push_back({step, bytes});
    bytes_ += bytes;
    scanned_ = step;
    Publish();
    if (bytes > 0) work_.NotifyAll();
  }
}

void FetchAhead::FetcherMain() {
  MutexLock lock(mu_);
  while (true) {
    while (!stop_ && queue_.empty()) work_.Wait(mu_);
    if (stop_) return;
    const Item item = queue_.front();
    queue_.pop_front();
    if (item.generation != generation_ || item.step <= passed_ || !source_.cache().storing()) {
      // Passed, started over, or a disk that refuses blocks: not worth it.
      queued_.erase(Key(item.ref));
      continue;
    }
    lock.Unlock();
    Status st = source_.Fill(item.ref.object, item.ref.block, item.step);
    lock.Lock();
    queued_.erase(Key(item.ref));
    if (!st.ok()) {
      fill_errors_.fetch_add(1, std::memory_order_relaxed);
      const int64_t now =
          std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
              .count();
      if (now - last_error_logged_ns_ >= 10'000'000'000) {
        last_error_logged_ns_ = now;
        LogWarn("fetching a block ahead failed; the step that needs it fetches it again (logged at most every 10 s)",
                {{"step", item.step}, {"error", st.ToString()}});
      }
    }
    filled_.NotifyAll();
  }
}

Status FetchAhead::WaitResident(int64_t first, int64_t steps, std::chrono::milliseconds timeout) {
  std::vector<BlockRef> want;
  for (int64_t s = first; s < first + steps; ++s) {
    for (const BlockRef& r : BlocksOf(s)) want.push_back(r);
  }
  std::sort(want.begin(), want.end());
  want.erase(std::unique(want.begin(), want.end()), want.end());
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::vector<BlockRef> orphans;
  bool retried = false;
  MutexLock lock(mu_);
  while (true) {
    size_t missing = 0;
    orphans.clear();
    for (const BlockRef& r : want) {
      if (source_.cache().Contains(source_.IdOf(r.object, r.block))) continue;
      ++missing;
      if (!queued_.count(Key(r))) orphans.push_back(r);
    }
    if (missing == 0) return Status::Ok();
    if (stop_) return Status(StatusCode::kCancelled, "stopped while the cache was being filled");
    if (!orphans.empty()) {
      // Not queued (a fill failed, or the walker is not there yet): filled
      // here, so a failure is this call's error. A block filled here that
      // is still not resident was not stored.
      if (retried) {
        return Status(StatusCode::kUnavailable,
                      std::to_string(missing) + " of the " + std::to_string(want.size()) + " blocks of steps " +
                          std::to_string(first) + ".." + std::to_string(first + steps - 1) +
                          " could not be stored: the cache's disk refuses blocks, or its capacity (" +
                          std::to_string(source_.cache().capacity_bytes()) + " bytes) is too small for them");
      }
      retried = true;
      lock.Unlock();
      for (const BlockRef& r : orphans) {
        if (Status st = source_.Fill(r.object, r.block, first); !st.ok()) return st;
      }
      lock.Lock();
      continue;
    }
    if (!filled_.WaitUntil(mu_, deadline) && std::chrono::steady_clock::now() >= deadline) {
      return Status(StatusCode::kUnavailable, std::to_string(missing) + " of the " + std::to_string(want.size()) +
                                                  " blocks of steps " + std::to_string(first) + ".." +
                                                  std::to_string(first + steps - 1) + " are not cached after " +
                                                  std::to_string(timeout.count()) + " ms");
    }
  }
}

}  // namespace meshload::sidecar::cache
