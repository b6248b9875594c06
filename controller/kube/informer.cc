#include "controller/kube/informer.h"

#include <algorithm>
#include <random>

#include "common/logging.h"

namespace meshload::controller::kube {
namespace {

const nlohmann::json& Meta(const nlohmann::json& obj) {
  static const nlohmann::json kEmpty = nlohmann::json::object();
  auto it = obj.find("metadata");
  return it != obj.end() && it->is_object() ? *it : kEmpty;
}

std::string MetaString(const nlohmann::json& obj, const char* key) {
  const auto& m = Meta(obj);
  auto it = m.find(key);
  return it != m.end() && it->is_string() ? it->get<std::string>() : std::string();
}

}  // namespace

std::string ObjectKey(const nlohmann::json& obj) {
  return MetaString(obj, "namespace") + "/" + MetaString(obj, "name");
}

std::string ResourcePath::Collection(const std::string& ns) const {
  return ns.empty() ? group_version + "/" + plural : group_version + "/namespaces/" + ns + "/" + plural;
}

std::string ResourcePath::Object(const std::string& ns, const std::string& name) const {
  return Collection(ns) + "/" + name;
}

Informer::Informer(KubeClient* client, ResourcePath resource, InformerOptions options)
    : client_(client), resource_(std::move(resource)), options_(std::move(options)) {}

Informer::~Informer() { Stop(); }

void Informer::OnChange(Handler handler) { handlers_.push_back(std::move(handler)); }

void Informer::Start() {
  if (thread_.joinable()) return;
  watch_id_ = client_->NewWatchId();
  thread_ = std::thread([this] { Run(); });
}

void Informer::Stop() {
  if (stop_.exchange(true)) {
    if (thread_.joinable()) thread_.join();
    return;
  }
  {
    MutexLock lock(mu_);
    cv_.NotifyAll();
  }
  if (watch_id_ != 0) client_->CancelWatch(watch_id_);
  if (thread_.joinable()) thread_.join();
}

bool Informer::WaitForSync(std::chrono::milliseconds timeout) {
  MutexLock lock(mu_);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!(synced_.load() || stop_.load())) {
    if (!cv_.WaitUntil(mu_, deadline)) break;  // timed out: the condition as it is now
  }
  return (synced_.load() || stop_.load()) && synced_.load();
}

ObjectPtr Informer::Get(const std::string& ns, const std::string& name) const {
  MutexLock lock(mu_);
  auto it = cache_.find(ns);
  if (it == cache_.end()) return nullptr;
  auto jt = it->second.find(name);
  return jt == it->second.end() ? nullptr : jt->second;
}

std::vector<ObjectPtr> Informer::List(const std::string& ns) const {
  std::vector<ObjectPtr> out;
  MutexLock lock(mu_);
  auto add = [&](const std::map<std::string, ObjectPtr>& m) {
    for (const auto& [name, obj] : m) out.push_back(obj);
  };
  if (ns.empty()) {
    out.reserve(size_);
    for (const auto& [n, m] : cache_) add(m);
  } else if (auto it = cache_.find(ns); it != cache_.end()) {
    add(it->second);
  }
  return out;
}

size_t Informer::size() const {
  MutexLock lock(mu_);
  return size_;
}

std::string Informer::last_resource_version() const {
  MutexLock lock(mu_);
  return rv_;
}

bool Informer::SleepUnlessStopped(std::chrono::milliseconds d) {
  MutexLock lock(mu_);
  const auto deadline = std::chrono::steady_clock::now() + d;
  while (!stop_.load()) {
    if (!cv_.WaitUntil(mu_, deadline)) break;  // timed out: stop_ as it is now
  }
  return !stop_.load();
}

void Informer::Notify(const nlohmann::json& obj, bool deleted) {
  for (const auto& h : handlers_) h(obj, deleted);
}

nlohmann::json Informer::Prepare(nlohmann::json obj) const {
  std::string ns, name, rv;
  if (auto md = obj.find("metadata"); md != obj.end() && md->is_object()) {
    md->erase("managedFields");
    ns = MetaString(obj, "namespace");
    name = MetaString(obj, "name");
    rv = MetaString(obj, "resourceVersion");
  }
  if (!options_.transform) return obj;
  obj = options_.transform(std::move(obj));
  if (!obj.is_object()) obj = nlohmann::json::object();
  nlohmann::json& md = obj["metadata"];
  if (!md.is_object()) md = nlohmann::json::object();
  if (!ns.empty()) md["namespace"] = ns;
  md["name"] = name;
  md["resourceVersion"] = rv;
  return obj;
}

void Informer::Apply(nlohmann::json obj, bool deleted) {
  obj = Prepare(std::move(obj));
  const std::string ns = MetaString(obj, "namespace"), name = MetaString(obj, "name");
  ObjectPtr ptr = std::make_shared<const nlohmann::json>(std::move(obj));
  {
    MutexLock lock(mu_);
    auto& m = cache_[ns];
    if (deleted) {
      size_ -= m.erase(name);
      if (m.empty()) cache_.erase(ns);
    } else {
      size_ += m.count(name) == 0;
      m[name] = ptr;
    }
  }
  Notify(*ptr, deleted);
}

Result<std::string> Informer::ListPaged(int64_t limit, std::vector<nlohmann::json>* items, int* gone_code) {
  std::string cont, rv;
  items->clear();
  do {
    std::string path = resource_.Collection(options_.namespace_) + "?";
    if (limit > 0) path += "limit=" + std::to_string(limit) + "&";
    if (!cont.empty()) path += "continue=" + QueryEscape(cont) + "&";
    if (!options_.label_selector.empty()) path += "labelSelector=" + QueryEscape(options_.label_selector) + "&";
    path.pop_back();
    ApiResponse r = client_->Get(path);
    if (r.code == 410) {
      *gone_code = 410;
      return r.ToStatus("list " + resource_.plural);
    }
    if (!r.ok()) return r.ToStatus("list " + resource_.plural);
    auto& list_items = r.body["items"];
    if (list_items.is_array()) {
      for (auto& item : list_items) items->push_back(Prepare(std::move(item)));
    }
    const auto& md = r.body["metadata"];
    cont = md.is_object() ? md.value("continue", "") : "";
    rv = md.is_object() ? md.value("resourceVersion", "") : "";
  } while (!cont.empty() && !stop_.load());
  return rv;
}

Result<std::string> Informer::ListAll() {
  std::vector<nlohmann::json> items;
  int gone = 0;
  auto rv = ListPaged(options_.page_size, &items, &gone);
  if (!rv.ok() && gone == 410) {
    // The continue token expired mid-list: one unpaged list is consistent.
    gone_.fetch_add(1);
    LogInfo("a paged list expired; listing without paging", {{"resource", resource_.plural}});
    rv = ListPaged(0, &items, &gone);
  }
  if (!rv.ok()) return rv.status();
  lists_.fetch_add(1);
  // Build the snapshot aside and swap it in at once, so that readers never
  // see a half-filled cache. Objects missing from the snapshot were deleted
  // while nobody watched: handlers hear about them too.
  std::map<std::string, std::map<std::string, ObjectPtr>> fresh;
  std::vector<ObjectPtr> changed;
  size_t count = 0;
  std::map<std::string, std::map<std::string, ObjectPtr>> old;
  {
    MutexLock lock(mu_);
    old = cache_;  // a copy of pointers only
  }
  for (auto& item : items) {
    const std::string ns = MetaString(item, "namespace"), name = MetaString(item, "name");
    const std::string item_rv = MetaString(item, "resourceVersion");
    ObjectPtr previous;
    if (auto it = old.find(ns); it != old.end()) {
      if (auto jt = it->second.find(name); jt != it->second.end()) {
        previous = jt->second;
        it->second.erase(jt);
      }
    }
    if (previous && MetaString(*previous, "resourceVersion") == item_rv) {
      fresh[ns][name] = previous;  // unchanged: no notification
    } else {
      auto ptr = std::make_shared<const nlohmann::json>(std::move(item));
      fresh[ns][name] = ptr;
      changed.push_back(ptr);
    }
    ++count;
  }
  {
    MutexLock lock(mu_);
    cache_.swap(fresh);
    size_ = count;
    rv_ = *rv;
  }
  for (const auto& obj : changed) Notify(*obj, false);
  for (auto& [ns, m] : old) {
    for (auto& [name, obj] : m) Notify(*obj, true);
  }
  return *rv;
}

Status Informer::WatchOnce(std::string* rv, bool* relist) {
  thread_local std::mt19937_64 rng(std::random_device{}());
  int64_t base = std::max<int64_t>(1, options_.watch_timeout.count());
  int64_t timeout = std::uniform_int_distribution<int64_t>(base, 2 * base - 1)(rng);
  std::string path = resource_.Collection(options_.namespace_) + "?watch=true&allowWatchBookmarks=true" +
                     "&resourceVersion=" + QueryEscape(*rv) + "&timeoutSeconds=" + std::to_string(timeout);
  if (!options_.label_selector.empty()) path += "&labelSelector=" + QueryEscape(options_.label_selector);
  watches_.fetch_add(1);
  int code = 0;
  Status st = client_->Watch(
      path,
      [&](nlohmann::json& event) {
        const std::string type = event.value("type", "");
        auto& obj = event["object"];
        if (type == "ERROR") {
          int c = obj.is_object() ? obj.value("code", 0) : 0;
          LogInfo("watch error event; relisting", {{"resource", resource_.plural}, {"code", c}});
          if (c == 410) gone_.fetch_add(1);
          *relist = true;
          return false;
        }
        if (!obj.is_object()) return true;
        std::string new_rv = MetaString(obj, "resourceVersion");
        if (type == "ADDED" || type == "MODIFIED") {
          Apply(std::move(obj), false);
        } else if (type == "DELETED") {
          Apply(std::move(obj), true);
        }  // BOOKMARK: only the resourceVersion moves
        if (!new_rv.empty()) {
          *rv = new_rv;
          MutexLock lock(mu_);
          rv_ = new_rv;
        }
        return !stop_.load();
      },
      watch_id_, &code);
  if (code == 410) {
    gone_.fetch_add(1);
    *relist = true;
    return Status::Ok();
  }
  return st;
}

void Informer::Run() {
  int failures = 0;
  auto backoff = [&] {
    auto d = options_.error_backoff * (int64_t(1) << std::min(failures, 6));
    ++failures;
    return std::min<std::chrono::milliseconds>(d, std::chrono::seconds(30));
  };
  while (!stop_.load()) {
    auto rv = ListAll();
    if (!rv.ok()) {
      if (stop_.load()) break;
      LogWarn("list failed", {{"resource", resource_.plural}, {"error", rv.status().ToString()}});
      if (!SleepUnlessStopped(backoff())) break;
      continue;
    }
    if (!synced_.exchange(true)) {
      MutexLock lock(mu_);
      cv_.NotifyAll();
    }
    failures = 0;
    std::string current = *rv;
    bool relist = false;
    while (!stop_.load() && !relist) {
      Status st = WatchOnce(&current, &relist);
      if (st.code() == StatusCode::kCancelled || stop_.load()) break;
      if (!st.ok()) {
        LogWarn("watch failed", {{"resource", resource_.plural}, {"error", st.ToString()}});
        if (!SleepUnlessStopped(backoff())) break;
      } else {
        failures = 0;
      }
    }
  }
}

}  // namespace meshload::controller::kube
