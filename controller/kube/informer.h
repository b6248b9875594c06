/// \file
/// Informer: a list + watch reflector and a local cache for one resource, as
/// client-go's shared informer.
///
///   Informer pods(client, {"/api/v1", "pods"}, {.transform = SlimPod});
///   pods.OnChange([&](const nlohmann::json& pod) { queue.Add(JobFor(pod)); });
///   pods.Start();
///   pods.WaitForSync(std::chrono::seconds(30));
///   for (const auto& pod : pods.List("training")) ...
///
/// The loop (one thread per informer):
/// 1. LIST in pages of `page_size` (limit/continue), each object made small
///    (`transform`) as its page arrives, so a list never holds every object
///    in full at once. A continue token that expired (410) restarts the list
///    without paging, so the result is one consistent snapshot. The cache is replaced by the snapshot; handlers
///    see every object that was added, changed or removed by the replacement.
/// 2. WATCH from the list's resourceVersion with allowWatchBookmarks=true and
///    timeoutSeconds jittered in [watch_timeout, 2 × watch_timeout), so that
///    many informers do not re-watch in step.
/// 3. ADDED/MODIFIED update the cache, DELETED removes from it, BOOKMARK
///    only moves the resourceVersion. When the stream ends it re-watches
///    from the last resourceVersion seen; an ERROR event or an HTTP 410 for a
///    resourceVersion that is too old goes back to step 1 (relist). Transport
///    errors back off exponentially (capped at 30 s) before trying again.
///
/// Handlers run on the informer's thread, in event order; they must be fast
/// (enqueue a key, nothing more). Objects in the cache are immutable and
/// shared: Get and List return shared pointers that stay valid after the
/// cache moves on.
///
/// Thread safety: Get, List, synced, WaitForSync and the counters are
/// thread-safe; OnChange must be called before Start.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "controller/kube/client.h"

namespace meshload::controller::kube {

/// What an informer watches: "/api/v1" + "pods", or
/// "/apis/meshload.io/v1alpha1" + "dataloadjobs".
struct ResourcePath {
  std::string group_version;  // "/api/v1" or "/apis/GROUP/VERSION"
  std::string plural;
  /// The path of a collection in `ns` (all namespaces when empty).
  std::string Collection(const std::string& ns) const;
  /// The path of one object.
  std::string Object(const std::string& ns, const std::string& name) const;
};

struct InformerOptions {
  std::string namespace_{};      // empty: all namespaces
  std::string label_selector{};  // a server-side filter
  int64_t page_size = 500;
  std::chrono::seconds watch_timeout{300};
  std::chrono::milliseconds error_backoff{500};
  /// Applied to every object as it arrives, before it is cached (client-go's
  /// TransformFunc): drop what the controller never reads to bound memory.
  /// The object's namespace, name and resourceVersion are kept whatever it
  /// returns (the cache is keyed and compared by them). metadata.managedFields
  /// is always dropped first (server-side apply's bookkeeping, often the
  /// largest part of an object, never read by an informer's user).
  std::function<nlohmann::json(nlohmann::json)> transform{};
};

using ObjectPtr = std::shared_ptr<const nlohmann::json>;

class Informer {
 public:
  /// Called with the object's new state, or its last state when deleted.
  using Handler = std::function<void(const nlohmann::json& obj, bool deleted)>;

  Informer(KubeClient* client, ResourcePath resource, InformerOptions options = {});
  ~Informer();
  Informer(const Informer&) = delete;
  Informer& operator=(const Informer&) = delete;

  void OnChange(Handler handler);
  void Start();
  /// Ends the watch and joins the thread. Idempotent.
  void Stop() MESHLOAD_EXCLUDES(mu_);

  /// True once the first LIST has filled the cache.
  bool synced() const { return synced_.load(); }
  bool WaitForSync(std::chrono::milliseconds timeout) MESHLOAD_EXCLUDES(mu_);

  ObjectPtr Get(const std::string& ns, const std::string& name) const MESHLOAD_EXCLUDES(mu_);
  /// Every cached object in `ns` (all namespaces when empty), by name.
  std::vector<ObjectPtr> List(const std::string& ns) const MESHLOAD_EXCLUDES(mu_);
  size_t size() const MESHLOAD_EXCLUDES(mu_);

  // Counters for tests and metrics.
  int64_t lists() const { return lists_.load(); }
  int64_t watches() const { return watches_.load(); }
  int64_t relists_after_gone() const { return gone_.load(); }
  std::string last_resource_version() const MESHLOAD_EXCLUDES(mu_);

 private:
  void Run() MESHLOAD_EXCLUDES(mu_);
  /// Lists and replaces the cache; returns the list's resourceVersion.
  Result<std::string> ListAll() MESHLOAD_EXCLUDES(mu_);
  Result<std::string> ListPaged(int64_t limit, std::vector<nlohmann::json>* items, int* gone_code);
  /// Watches once from `rv`; returns the new rv, or "" when a relist is needed.
  Status WatchOnce(std::string* rv, bool* relist) MESHLOAD_EXCLUDES(mu_);
  void Apply(nlohmann::json obj, bool deleted) MESHLOAD_EXCLUDES(mu_);
  /// Drops metadata.managedFields and applies the transform (keeping the
  /// object's namespace, name and resourceVersion).
  nlohmann::json Prepare(nlohmann::json obj) const;
  void Notify(const nlohmann::json& obj, bool deleted);
  bool SleepUnlessStopped(std::chrono::milliseconds d) MESHLOAD_EXCLUDES(mu_);

  // Set by the constructor, read-only after.
  KubeClient* client_;
  ResourcePath resource_;
  InformerOptions options_;
  // Filled by OnChange before Start, read-only (by the informer's thread) after.
  std::vector<Handler> handlers_;

  mutable Mutex mu_;
  CondVar cv_;
  // ns -> name -> object
  std::map<std::string, std::map<std::string, ObjectPtr>> cache_ MESHLOAD_GUARDED_BY(mu_);
  size_t size_ MESHLOAD_GUARDED_BY(mu_) = 0;
  std::string rv_ MESHLOAD_GUARDED_BY(mu_);

  std::atomic<bool> synced_{false};
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> lists_{0}, watches_{0}, gone_{0};
  // Written by Start before the thread starts; thread_ is started and joined
  // by the owner's Start and Stop only.
  uint64_t watch_id_ = 0;
  std::thread thread_;
};

/// "namespace/name" of an object.
std::string ObjectKey(const nlohmann::json& obj);

}  // namespace meshload::controller::kube
