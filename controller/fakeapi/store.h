/// \file
/// ObjectStore: the fake API server's state and every semantic a controller
/// can observe through the REST API, independent of HTTP.
///
/// Contract (mirrors a real kube-apiserver backed by etcd):
///  - one global resourceVersion counter, bumped by every write that changes
///    an object; writes that change nothing are no-ops (no bump, no event);
///  - create/get/update/patch/delete answer with the stored object or with a
///    `Status` object whose code, reason, message and details are those of a
///    real server (AlreadyExists 409, NotFound 404, Conflict 409, ...);
///  - optimistic concurrency: a write carrying metadata.resourceVersion must
///    match the stored one; a write without it is unconditional;
///  - the status subresource splits an object into spec (main resource) and
///    status (/status): each endpoint ignores the other half;
///  - metadata.generation moves only when non-metadata, non-status content
///    changes (and when deletion starts);
///  - finalizers: deleting an object that has them sets deletionTimestamp; an
///    update that empties them removes the object;
///  - an event history of the last `history_limit` writes backs watches from a
///    resourceVersion and consistent paged lists; anything older is 410 Gone.
///
/// Thread safety: all public methods are thread-safe (one mutex); watchers
/// block in WaitForEvents on a condition variable that every write signals.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "controller/fakeapi/resources.h"
#include "controller/fakeapi/selectors.h"

namespace meshload::fakeapi {

/// An HTTP status code and JSON body: an object, a list, or a `Status`.
struct ApiResponse {
  int code = 200;
  nlohmann::json body;
  bool ok() const { return code >= 200 && code < 300; }
};

/// A real server's `Status` failure object. `details` may be null.
nlohmann::json StatusObject(int code, const std::string& reason, const std::string& message,
                            nlohmann::json details = nullptr);
/// The reason a real server gives for an HTTP code (429 -> "TooManyRequests").
std::string ReasonForCode(int code);
ApiResponse ErrorResponse(int code, const std::string& reason, const std::string& message,
                          nlohmann::json details = nullptr);

/// What a request path names.
struct RequestTarget {
  ResourceType type;
  std::string version;
  std::string ns;       // empty: cluster-scoped, or all namespaces
  std::string name;     // empty: the collection
  bool status = false;  // the /status subresource
};

struct ListOptions {
  std::string label_selector;
  std::string field_selector;
  int64_t limit = 0;  // 0: no limit
  std::string continue_token;
};

struct WatchOptions {
  std::string resource_version;  // empty or "0": current state as ADDED, then live
  std::string label_selector;
  std::string field_selector;
};

/// A watch in progress: the position in the event history and its filters.
struct WatchCursor {
  RequestTarget target;
  LabelSelector labels;
  FieldSelector fields;
  uint64_t rv = 0;                // events up to this RV have been delivered
  uint64_t close_generation = 0;  // CloseAllWatches() ends watches started before it
};

class ObjectStore {
 public:
  explicit ObjectStore(size_t history_limit = 200);

  /// Parses an API path (`/api/v1/namespaces/ns/pods/name/status`, ...).
  std::optional<RequestTarget> Resolve(const std::string& path, ApiResponse* error) const;

  ApiResponse Create(const RequestTarget& target, const std::string& body);
  ApiResponse Get(const RequestTarget& target) const;
  ApiResponse List(const RequestTarget& target, const ListOptions& options) const;
  ApiResponse Update(const RequestTarget& target, const std::string& body);
  /// `application/merge-patch+json`, `application/json-patch+json`, and for
  /// built-in kinds `application/strategic-merge-patch+json` (simplified, see
  /// merge_patch.h); other types get 415, as on a real server.
  ApiResponse Patch(const RequestTarget& target, const std::string& content_type,
                    const std::string& body);
  /// `body` may hold DeleteOptions with preconditions (uid, resourceVersion).
  ApiResponse Delete(const RequestTarget& target, const std::string& body);
  /// DELETE on a collection (deletecollection): every object the label and
  /// field selectors match, each as Delete() would; 200 with their list.
  ApiResponse DeleteCollection(const RequestTarget& target, const ListOptions& options, const std::string& body);

  /// Starts a watch. On success `*initial` holds the events to send first
  /// (synthetic ADDED, or nothing when replaying from an RV: the first
  /// WaitForEvents returns the replay). When the RV is too old, `*initial`
  /// holds the single ERROR event and the cursor is unset.
  std::optional<WatchCursor> BeginWatch(const RequestTarget& target, const WatchOptions& options,
                                        std::vector<nlohmann::json>* initial, ApiResponse* error);

  enum class WaitResult { kEvents, kTimeout, kExpired, kClosed, kShutdown };
  /// Blocks until events after `cursor->rv` exist (appended to `*events`,
  /// cursor advanced), `deadline` passes, the cursor falls out of the history
  /// (kExpired: `*events` gets the ERROR event), CloseAllWatches() or Shutdown().
  WaitResult WaitForEvents(WatchCursor* cursor, std::chrono::steady_clock::time_point deadline,
                           std::vector<nlohmann::json>* events);
  /// A BOOKMARK event at the cursor's RV.
  nlohmann::json Bookmark(const WatchCursor& cursor) const;

  /// Ends every open watch (a clean end of stream, as when a real server
  /// drops a watch); clients are expected to re-watch.
  void CloseAllWatches();
  /// Watches begun so far (each one CloseAllWatches() would now end, unless
  /// it has ended already).
  uint64_t watches_begun() const;
  /// Wakes and ends all watches for good; used by the server's Stop().
  void Shutdown();
  /// Drops the whole event history: every RV older than now is 410 Gone.
  void CompactHistory();
  std::string CurrentResourceVersion() const;
  /// A snapshot of the served resource types (built-ins and established
  /// CRDs), by ResourceType::Key(); discovery is generated from it.
  std::map<std::string, ResourceType> ResourceTypes() const;

 private:
  struct Event {
    uint64_t rv;
    std::string type_key;
    std::string type;  // ADDED, MODIFIED, DELETED
    nlohmann::json object;
    nlohmann::json old;  // the previous state (null for ADDED)
  };
  using ObjectMap = std::map<std::string, nlohmann::json>;  // "ns/name" -> object

  ApiResponse CreateLocked(const RequestTarget& target, nlohmann::json obj);
  ApiResponse UpdateLocked(const RequestTarget& target, nlohmann::json obj);
  ApiResponse RemoveLocked(const RequestTarget& target, const std::string& key, nlohmann::json obj);
  ApiResponse DeleteLocked(const RequestTarget& target, const nlohmann::json& options);
  ApiResponse CheckTypeMeta(const RequestTarget& target, nlohmann::json* obj) const;
  nlohmann::json Output(const RequestTarget& target, nlohmann::json obj) const;
  std::string Qualified(const RequestTarget& target) const { return target.type.QualifiedName(); }
  void Record(const std::string& type_key, const std::string& type, const nlohmann::json& object,
              const nlohmann::json& old);
  uint64_t NextRv() { return ++rv_; }
  std::optional<nlohmann::json> FilterEvent(const WatchCursor& cursor, const Event& event) const;
  nlohmann::json ExpiredWatchEvent(uint64_t rv) const;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  ResourceRegistry registry_;
  std::map<std::string, ObjectMap> objects_;  // by ResourceType::Key()
  std::deque<Event> history_;
  size_t history_limit_;
  uint64_t rv_ = 0;
  uint64_t oldest_valid_rv_ = 0;  // every event after this RV is in history_
  uint64_t close_generation_ = 0;
  uint64_t watches_begun_ = 0;
  bool shutdown_ = false;
};

}  // namespace meshload::fakeapi
