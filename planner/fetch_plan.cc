#include "planner/fetch_plan.h"

#include <unordered_map>
#include <utility>
#include <vector>

namespace meshload::planner {

FetchEstimate EstimateFetch(const ShardPlanner& planner, const Loading& loading, int64_t process,
                            const BlockGeometry& geometry, uint64_t epoch, uint64_t max_samples) {
  const ResolvedJob& job = planner.job();
  const DatasetIndex& ds = job.dataset;
  FetchEstimate out;
  for (const DatasetFile& f : ds.files()) out.dataset_bytes += f.size;
  struct Use {
    uint64_t first, last, bytes;
  };
  // (file << 40 | block) -> the steps of the epoch (from 0) that read it.
  std::unordered_map<uint64_t, Use> uses;
  std::vector<Extent> extents;
  uint64_t samples = 0;
  const uint64_t K = job.steps_per_epoch;
  for (uint64_t j = 0; j < K; ++j) {
    if (samples >= max_samples) {
      out.complete = false;
      break;
    }
    const StepPlan plan = planner.PlanStep(static_cast<int64_t>(epoch * K + j), loading, process,
                                           ShardPlanner::Detail::kSamples);
    for (const ReadPlan& r : plan.reads) {
      samples += r.samples.size();
      for (uint64_t id : r.samples) {
        extents.clear();
        ds.AppendExtents(id, extents);
        for (const Extent& e : extents) {
          if (e.length == 0) continue;
          out.read_bytes += e.length;
          const uint64_t size = ds.files()[e.file].size;
          const uint64_t unit = geometry.Unit(size);
          for (uint64_t b = e.offset / unit; b <= (e.offset + e.length - 1) / unit; ++b) {
            auto [it, added] = uses.try_emplace((uint64_t{e.file} << 40) | b, Use{j, j, 0});
            if (added) it->second.bytes = std::min(unit, size - b * unit);
            it->second.last = j;
          }
        }
      }
    }
    out.steps += 1;
  }
  // The working set: the most block bytes between their first and last use
  // at any step (a sweep over the uses' starts and ends).
  std::vector<std::pair<uint64_t, int64_t>> events;
  events.reserve(uses.size() * 2);
  for (const auto& [key, u] : uses) {
    out.blocks += 1;
    out.block_bytes += u.bytes;
    events.push_back({u.first, static_cast<int64_t>(u.bytes)});
    events.push_back({u.last + 1, -static_cast<int64_t>(u.bytes)});
  }
  std::sort(events.begin(), events.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first < b.first : a.second < b.second;  // ends before starts at one step
  });
  int64_t live = 0, most = 0;
  for (const auto& [step, delta] : events) {
    live += delta;
    most = std::max(most, live);
  }
  out.working_set_bytes = static_cast<uint64_t>(most);
  return out;
}

}  // namespace meshload::planner
