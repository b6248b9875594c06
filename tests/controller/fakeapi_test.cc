// The fake API server through its HTTP API, as a controller would see it.
// Each test names one behaviour of a real kube-apiserver that it pins down.

#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <yaml-cpp/yaml.h>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/base64.h"
#include "controller/fakeapi/fake_apiserver.h"
#include "controller/fakeapi/schema.h"
#include "controller/fakeapi/yaml_json.h"

namespace {

using nlohmann::json;
using namespace std::chrono_literals;

struct Resp {
  int code = 0;
  json body;
  httplib::Headers headers;
};

constexpr char kPods[] = "/api/v1/namespaces/default/pods";
constexpr char kConfigMaps[] = "/api/v1/namespaces/default/configmaps";
constexpr char kJobs[] = "/apis/meshload.io/v1alpha1/namespaces/default/dataloadjobs";
constexpr char kCrds[] = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions";

json Crd() {
  return json::parse(R"({
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "dataloadjobs.meshload.io"},
    "spec": {"group": "meshload.io", "scope": "Namespaced",
             "names": {"plural": "dataloadjobs", "singular": "dataloadjob", "kind": "DataLoadJob"},
             "versions": [{"name": "v1alpha1", "served": true, "storage": true,
                           "subresources": {"status": {}},
                           "schema": {"openAPIV3Schema": {"type": "object"}}}]}})");
}

json Job(const std::string& name, int batch = 8) {
  return {{"apiVersion", "meshload.io/v1alpha1"},
          {"kind", "DataLoadJob"},
          {"metadata", {{"name", name}}},
          {"spec", {{"batchSize", batch}}}};
}

json ConfigMap(const std::string& name, json labels = json::object()) {
  return {{"apiVersion", "v1"},
          {"kind", "ConfigMap"},
          {"metadata", {{"name", name}, {"labels", labels}}},
          {"data", {{"k", "v"}}}};
}

std::string Rv(const json& obj) { return obj["metadata"]["resourceVersion"].get<std::string>(); }

// Collects the lines of one watch stream on a thread of its own.
class WatchStream {
 public:
  WatchStream(const std::string& url, const std::string& path) : client_(url) {
    client_.set_read_timeout(30, 0);
    thread_ = std::thread([this, path] {
      auto res = client_.Get(path, [this](const char* data, size_t len) {
        std::lock_guard<std::mutex> lock(mu_);
        buffer_.append(data, len);
        size_t nl;
        while ((nl = buffer_.find('\n')) != std::string::npos) {
          events_.push_back(json::parse(buffer_.substr(0, nl)));
          buffer_.erase(0, nl + 1);
        }
        cv_.notify_all();
        return true;
      });
      std::lock_guard<std::mutex> lock(mu_);
      ended_ = true;
      if (res) status_ = res->status;
      cv_.notify_all();
    });
  }
  ~WatchStream() {
    // stop() only interrupts a request in flight: repeat it until the stream
    // thread has seen its request start and end.
    while (!WaitEnded(0ms)) {
      client_.stop();
      WaitEnded(20ms);
    }
    thread_.join();
  }
  // Waits until `n` events have arrived (or the stream ended, or 5 s passed).
  std::vector<json> WaitFor(size_t n, std::chrono::milliseconds timeout = 5000ms) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, timeout, [&] { return events_.size() >= n || ended_; });
    return events_;
  }
  bool WaitEnded(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return ended_; });
  }
  std::vector<json> Events() {
    std::lock_guard<std::mutex> lock(mu_);
    return events_;
  }

 private:
  httplib::Client client_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::string buffer_;
  std::vector<json> events_;
  bool ended_ = false;
  int status_ = 0;
  std::thread thread_;
};

}  // namespace

class FakeApiServer : public ::testing::Test {
 protected:
  void SetUp() override { StartServer({}); }
  void TearDown() override { server_->Stop(); }

  void StartServer(meshload::fakeapi::FakeApiServerOptions options) {
    if (server_) server_->Stop();
    server_ = std::make_unique<meshload::fakeapi::FakeApiServer>(options);
    ASSERT_TRUE(server_->Start().ok());
  }

  Resp Do(const std::string& method, const std::string& path, const json& body = nullptr,
          const std::string& content_type = "application/json") {
    httplib::Client client(server_->url());
    client.set_read_timeout(10, 0);
    std::string payload = body.is_null() ? "" : body.dump();
    httplib::Result res = [&] {
      if (method == "POST") return client.Post(path, payload, content_type);
      if (method == "PUT") return client.Put(path, payload, content_type);
      if (method == "PATCH") return client.Patch(path, payload, content_type);
      if (method == "DELETE") return client.Delete(path, payload, content_type);
      return client.Get(path);
    }();
    Resp r;
    if (!res) {
      ADD_FAILURE() << method << " " << path << ": " << httplib::to_string(res.error());
      return r;
    }
    r.code = res->status;
    r.body = json::parse(res->body, nullptr, false);
    r.headers = res->headers;
    return r;
  }
  Resp Get(const std::string& path) { return Do("GET", path); }
  Resp Post(const std::string& path, const json& body) { return Do("POST", path, body); }
  Resp Put(const std::string& path, const json& body) { return Do("PUT", path, body); }
  Resp MergePatch(const std::string& path, const json& body) {
    return Do("PATCH", path, body, "application/merge-patch+json");
  }
  Resp Delete(const std::string& path) { return Do("DELETE", path); }

  json CreateJobCrd() {
    Resp r = Post(kCrds, Crd());
    EXPECT_EQ(r.code, 201) << r.body;
    return r.body;
  }
  json CreateJob(const std::string& name) {
    Resp r = Post(kJobs, Job(name));
    EXPECT_EQ(r.code, 201) << r.body;
    return r.body;
  }

  std::unique_ptr<meshload::fakeapi::FakeApiServer> server_;
};

namespace {

void ExpectStatus(const Resp& r, int code, const std::string& reason) {
  EXPECT_EQ(r.code, code) << r.body;
  EXPECT_EQ(r.body["kind"], "Status");
  EXPECT_EQ(r.body["apiVersion"], "v1");
  EXPECT_EQ(r.body["status"], "Failure");
  EXPECT_EQ(r.body["reason"], reason);
  EXPECT_EQ(r.body["code"], code);
  EXPECT_TRUE(r.body["message"].is_string());
}

std::set<std::string> Names(const json& list) {
  std::set<std::string> names;
  for (const json& item : list["items"]) names.insert(item["metadata"]["name"].get<std::string>());
  return names;
}

}  // namespace

// ---- 1. resourceVersion and server-owned metadata --------------------------

TEST_F(FakeApiServer, CreateSetsServerOwnedMetadata) {
  CreateJobCrd();
  json job = CreateJob("a");
  const json& md = job["metadata"];
  EXPECT_TRUE(std::regex_match(md["uid"].get<std::string>(),
                               std::regex("[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-"
                                          "[0-9a-f]{12}")));
  EXPECT_TRUE(std::regex_match(md["creationTimestamp"].get<std::string>(),
                               std::regex(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)")));
  EXPECT_TRUE(std::regex_match(Rv(job), std::regex("[0-9]+")));
  EXPECT_EQ(md["generation"], 1);
  EXPECT_EQ(md["namespace"], "default");
}

TEST_F(FakeApiServer, ResourceVersionIsOneGlobalCounterAcrossResources) {
  json cm = Post(kConfigMaps, ConfigMap("a")).body;
  json lease = Post("/apis/coordination.k8s.io/v1/namespaces/default/leases",
                    {{"metadata", {{"name", "l"}}}, {"spec", json::object()}})
                   .body;
  EXPECT_EQ(std::stoull(Rv(lease)), std::stoull(Rv(cm)) + 1);
  json list = Get(kConfigMaps).body;
  EXPECT_EQ(list["metadata"]["resourceVersion"], Rv(lease));
  EXPECT_EQ(list["kind"], "ConfigMapList");
  EXPECT_EQ(server_->CurrentResourceVersion(), Rv(lease));
}

// ---- 2. create --------------------------------------------------------------

TEST_F(FakeApiServer, CreateDuplicateIsAlreadyExists409) {
  ASSERT_EQ(Post(kConfigMaps, ConfigMap("a")).code, 201);
  Resp r = Post(kConfigMaps, ConfigMap("a"));
  ExpectStatus(r, 409, "AlreadyExists");
  EXPECT_EQ(r.body["message"], "configmaps \"a\" already exists");
  EXPECT_EQ(r.body["details"], json({{"name", "a"}, {"kind", "configmaps"}}));
}

TEST_F(FakeApiServer, NamesAndLabelsAreValidatedAsTheRealServerDoes) {
  // A label value of 64 characters, a name that is not an RFC 1123
  // subdomain, a label key with a bad prefix: 422 Invalid naming the field,
  // on create and on update; 422 comes before 409.
  json cm = ConfigMap("ok");
  cm["metadata"]["labels"] = {{"meshload.io/job", std::string(63, 'x')}, {"app", ""}};
  ASSERT_EQ(Post(kConfigMaps, cm).code, 201);

  json long_value = ConfigMap("long");
  long_value["metadata"]["labels"] = {{"meshload.io/job", std::string(64, 'x')}};
  Resp r = Post(kConfigMaps, long_value);
  EXPECT_EQ(r.code, 422);
  EXPECT_EQ(r.body["reason"], "Invalid");
  EXPECT_EQ(r.body["details"]["causes"][0]["field"], "metadata.labels");
  EXPECT_NE(r.body["message"].get<std::string>().find("must be no more than 63 characters"), std::string::npos)
      << r.body.dump();

  for (const std::string& bad : std::vector<std::string>{"Upper", "-lead", "trail-", "a..b", std::string(254, 'a')}) {
    Resp n = Post(kConfigMaps, ConfigMap(bad));
    EXPECT_EQ(n.code, 422) << bad;
    EXPECT_EQ(n.body["details"]["causes"][0]["field"], "metadata.name") << bad;
  }
  EXPECT_EQ(Post(kConfigMaps, ConfigMap("a.b-c.d")).code, 201);

  json bad_key = ConfigMap("key");
  bad_key["metadata"]["labels"] = {{"Not_A_Domain/x", "v"}};
  EXPECT_EQ(Post(kConfigMaps, bad_key).code, 422);
  bad_key["metadata"]["labels"] = {{"x/", "v"}};
  EXPECT_EQ(Post(kConfigMaps, bad_key).code, 422);

  // Before 409: the same name again, with a bad label.
  json again = ConfigMap("ok");
  again["metadata"]["labels"] = {{"bad", "-x"}};
  EXPECT_EQ(Post(kConfigMaps, again).code, 422);

  // On update.
  json stored = Get(std::string(kConfigMaps) + "/ok").body;
  stored["metadata"]["labels"]["meshload.io/job"] = std::string(64, 'y');
  EXPECT_EQ(Put(std::string(kConfigMaps) + "/ok", stored).code, 422);
}

TEST_F(FakeApiServer, DeleteCollectionDeletesWhatTheSelectorPicksAndHonoursFinalizers) {
  auto labelled = [&](const std::string& name, const std::string& team, bool finalizer) {
    json cm = ConfigMap(name);
    cm["metadata"]["labels"] = {{"team", team}};
    if (finalizer) cm["metadata"]["finalizers"] = json::array({"example.com/hold"});
    return Post(kConfigMaps, cm).code;
  };
  ASSERT_EQ(labelled("a", "x", false), 201);
  ASSERT_EQ(labelled("b", "x", true), 201);
  ASSERT_EQ(labelled("c", "y", false), 201);
  Resp r = Do("DELETE", std::string(kConfigMaps) + "?labelSelector=team%3Dx");
  ASSERT_EQ(r.code, 200) << r.body.dump();
  EXPECT_EQ(r.body["kind"], "ConfigMapList");
  EXPECT_EQ(r.body["items"].size(), 2u);
  EXPECT_EQ(Get(std::string(kConfigMaps) + "/a").code, 404);
  json b = Get(std::string(kConfigMaps) + "/b").body;
  EXPECT_TRUE(b["metadata"].contains("deletionTimestamp")) << "a finalizer holds it, marked";
  EXPECT_EQ(Get(std::string(kConfigMaps) + "/c").code, 200) << "not picked by the selector";
  // Nothing picked: 200 with no items.
  Resp none = Do("DELETE", std::string(kConfigMaps) + "?labelSelector=team%3Dnobody");
  EXPECT_EQ(none.code, 200);
  EXPECT_TRUE(none.body["items"].empty());
  EXPECT_EQ(Do("DELETE", std::string(kConfigMaps) + "?labelSelector=%3D%3D%3D").code, 400);
}

TEST_F(FakeApiServer, GenerateNameMakesDistinctNames) {
  json cm = {{"metadata", {{"generateName", "job-"}}}, {"data", json::object()}};
  std::string a = Post(kConfigMaps, cm).body["metadata"]["name"];
  std::string b = Post(kConfigMaps, cm).body["metadata"]["name"];
  EXPECT_NE(a, b);
  EXPECT_TRUE(std::regex_match(a, std::regex("job-[a-z0-9]{5}")));
}

TEST_F(FakeApiServer, CreateInMissingNamespaceIsNotFound404) {
  Resp r = Post("/api/v1/namespaces/nope/configmaps", ConfigMap("a"));
  ExpectStatus(r, 404, "NotFound");
  EXPECT_EQ(r.body["message"], "namespaces \"nope\" not found");
}

TEST_F(FakeApiServer, CreateWithWrongKindOrApiVersionIsBadRequest400) {
  json wrong_kind = ConfigMap("a");
  wrong_kind["kind"] = "Secret";
  ExpectStatus(Post(kConfigMaps, wrong_kind), 400, "BadRequest");
  json wrong_version = ConfigMap("b");
  wrong_version["apiVersion"] = "v2";
  ExpectStatus(Post(kConfigMaps, wrong_version), 400, "BadRequest");
  EXPECT_EQ(Get(kConfigMaps).body["items"].size(), 0u);
}

TEST_F(FakeApiServer, CustomResourcesAreServedOnlyAfterTheirCrdExists) {
  ExpectStatus(Post(kJobs, Job("a")), 404, "NotFound");
  json crd = CreateJobCrd();
  EXPECT_EQ(crd["status"]["conditions"][1]["type"], "Established");
  EXPECT_EQ(Post(kJobs, Job("a")).code, 201);
  EXPECT_EQ(Get(std::string(kJobs) + "/a").body["spec"]["batchSize"], 8);
}

// ---- 3. get and delete --------------------------------------------------------

TEST_F(FakeApiServer, GetMissingIsNotFound404) {
  Resp r = Get("/apis/coordination.k8s.io/v1/namespaces/default/leases/x");
  ExpectStatus(r, 404, "NotFound");
  EXPECT_EQ(r.body["message"], "leases.coordination.k8s.io \"x\" not found");
  EXPECT_EQ(r.body["details"]["group"], "coordination.k8s.io");
}

TEST_F(FakeApiServer, DeleteWithoutFinalizersRemovesTheObject) {
  json cm = Post(kConfigMaps, ConfigMap("a")).body;
  Resp r = Delete(std::string(kConfigMaps) + "/a");
  EXPECT_EQ(r.code, 200);
  EXPECT_EQ(r.body["metadata"]["name"], "a");
  EXPECT_GT(std::stoull(Rv(r.body)), std::stoull(Rv(cm)));
  ExpectStatus(Get(std::string(kConfigMaps) + "/a"), 404, "NotFound");
  ExpectStatus(Delete(std::string(kConfigMaps) + "/a"), 404, "NotFound");
}

TEST_F(FakeApiServer, FinalizersDelayDeletionUntilCleared) {
  CreateJobCrd();
  json job = Job("a");
  job["metadata"]["finalizers"] = {"meshload.io/cleanup"};
  json created = Post(kJobs, job).body;
  std::string path = std::string(kJobs) + "/a";
  WatchStream watch(server_->url(), std::string(kJobs) + "?watch=1&resourceVersion=" + Rv(created));

  Resp del = Delete(path);
  EXPECT_EQ(del.code, 202);  // accepted, not yet deleted
  json marked = Get(path).body;
  EXPECT_TRUE(marked["metadata"].contains("deletionTimestamp"));
  EXPECT_GT(std::stoull(Rv(marked)), std::stoull(Rv(created)));

  marked["metadata"]["finalizers"] = json::array();
  Resp cleared = Put(path, marked);
  EXPECT_EQ(cleared.code, 200) << cleared.body;
  ExpectStatus(Get(path), 404, "NotFound");

  std::vector<json> events = watch.WaitFor(2);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0]["type"], "MODIFIED");
  EXPECT_EQ(events[1]["type"], "DELETED");
  EXPECT_EQ(events[1]["object"]["metadata"]["name"], "a");
}

TEST_F(FakeApiServer, TerminatingObjectCannotGainFinalizers) {
  json cm = ConfigMap("a");
  cm["metadata"]["finalizers"] = {"x/one"};
  Post(kConfigMaps, cm);
  Delete(std::string(kConfigMaps) + "/a");
  json marked = Get(std::string(kConfigMaps) + "/a").body;
  marked["metadata"]["finalizers"] = {"x/one", "x/two"};
  ExpectStatus(Put(std::string(kConfigMaps) + "/a", marked), 422, "Invalid");
}

// ---- 4. update ----------------------------------------------------------------

TEST_F(FakeApiServer, StaleUpdateIsConflict409) {
  CreateJobCrd();
  json v1 = CreateJob("a");
  std::string path = std::string(kJobs) + "/a";
  json v2 = v1;
  v2["spec"]["batchSize"] = 16;
  ASSERT_EQ(Put(path, v2).code, 200);
  v1["spec"]["batchSize"] = 32;  // still carries the old resourceVersion
  Resp r = Put(path, v1);
  ExpectStatus(r, 409, "Conflict");
  EXPECT_EQ(r.body["message"],
            "Operation cannot be fulfilled on dataloadjobs.meshload.io \"a\": the object has been "
            "modified; please apply your changes to the latest version and try again");
  EXPECT_EQ(Get(path).body["spec"]["batchSize"], 16);
}

TEST_F(FakeApiServer, UpdateWithoutResourceVersionIsUnconditional) {
  Post(kConfigMaps, ConfigMap("a"));
  json cm = ConfigMap("a");
  cm["data"]["k"] = "w";
  Resp r = Put(std::string(kConfigMaps) + "/a", cm);
  EXPECT_EQ(r.code, 200) << r.body;
  EXPECT_EQ(r.body["data"]["k"], "w");
}

TEST_F(FakeApiServer, UpdateOfMissingObjectIsNotFound404) {
  ExpectStatus(Put(std::string(kConfigMaps) + "/a", ConfigMap("a")), 404, "NotFound");
}

TEST_F(FakeApiServer, UpdateOfMissingLeaseCreatesIt) {
  // Leases (like events) allow create-on-update on a real server.
  Resp r = Put("/apis/coordination.k8s.io/v1/namespaces/default/leases/l",
               {{"metadata", {{"name", "l"}}}, {"spec", {{"holderIdentity", "me"}}}});
  EXPECT_EQ(r.code, 201) << r.body;
  EXPECT_EQ(r.body["kind"], "Lease");
}

TEST_F(FakeApiServer, UpdateThatChangesNothingKeepsResourceVersion) {
  json cm = Post(kConfigMaps, ConfigMap("a")).body;
  Resp r = Put(std::string(kConfigMaps) + "/a", cm);
  EXPECT_EQ(r.code, 200);
  EXPECT_EQ(Rv(r.body), Rv(cm));
}

TEST_F(FakeApiServer, GenerationBumpsOnlyOnSpecChange) {
  CreateJobCrd();
  json job = CreateJob("a");
  std::string path = std::string(kJobs) + "/a";
  job["metadata"]["labels"] = {{"x", "y"}};
  job = Put(path, job).body;
  EXPECT_EQ(job["metadata"]["generation"], 1);
  job["spec"]["batchSize"] = 99;
  job = Put(path, job).body;
  EXPECT_EQ(job["metadata"]["generation"], 2);
}

// ---- 5. status subresource ------------------------------------------------------

TEST_F(FakeApiServer, MainResourceUpdateIgnoresStatus) {
  CreateJobCrd();
  json job = CreateJob("a");
  std::string path = std::string(kJobs) + "/a";
  job["status"] = {{"phase", "Running"}};
  job["spec"]["batchSize"] = 4;
  json updated = Put(path, job).body;
  EXPECT_FALSE(updated.contains("status"));
  EXPECT_EQ(updated["spec"]["batchSize"], 4);
}

TEST_F(FakeApiServer, StatusUpdateIgnoresSpecAndKeepsGeneration) {
  CreateJobCrd();
  json job = CreateJob("a");
  std::string path = std::string(kJobs) + "/a";
  job["status"] = {{"phase", "Running"}};
  job["spec"]["batchSize"] = 4;
  job["metadata"]["labels"] = {{"x", "y"}};
  Resp r = Put(path + "/status", job);
  ASSERT_EQ(r.code, 200) << r.body;
  EXPECT_EQ(r.body["status"]["phase"], "Running");
  EXPECT_EQ(r.body["spec"]["batchSize"], 8);
  EXPECT_FALSE(r.body["metadata"].contains("labels"));
  EXPECT_EQ(r.body["metadata"]["generation"], 1);
}

TEST_F(FakeApiServer, StaleStatusUpdateIsConflict409) {
  CreateJobCrd();
  json job = CreateJob("a");
  std::string path = std::string(kJobs) + "/a";
  json newer = job;
  newer["spec"]["batchSize"] = 1;
  ASSERT_EQ(Put(path, newer).code, 200);
  job["status"] = {{"phase", "Running"}};
  ExpectStatus(Put(path + "/status", job), 409, "Conflict");
}

TEST_F(FakeApiServer, StatusSubresourceIsAbsentWhenNotDeclared) {
  Post(kConfigMaps, ConfigMap("a"));
  ExpectStatus(Put(std::string(kConfigMaps) + "/a/status", ConfigMap("a")), 404, "NotFound");
}

// ---- 6. merge patch ------------------------------------------------------------

TEST_F(FakeApiServer, MergePatchMergesObjectsAndNullRemovesKeys) {
  json cm = ConfigMap("a");
  cm["data"] = {{"keep", "1"}, {"drop", "2"}};
  Post(kConfigMaps, cm);
  Resp r =
      MergePatch(std::string(kConfigMaps) + "/a", {{"data", {{"drop", nullptr}, {"add", "3"}}}});
  ASSERT_EQ(r.code, 200) << r.body;
  EXPECT_EQ(r.body["data"], json({{"keep", "1"}, {"add", "3"}}));
}

TEST_F(FakeApiServer, MergePatchWithStaleResourceVersionIsConflict409) {
  json cm = Post(kConfigMaps, ConfigMap("a")).body;
  MergePatch(std::string(kConfigMaps) + "/a", {{"data", {{"x", "1"}}}});
  ExpectStatus(MergePatch(std::string(kConfigMaps) + "/a",
                          {{"metadata", {{"resourceVersion", Rv(cm)}}}, {"data", {{"y", "1"}}}}),
               409, "Conflict");
}

TEST_F(FakeApiServer, MergePatchOnStatusTouchesOnlyStatus) {
  CreateJobCrd();
  CreateJob("a");
  std::string path = std::string(kJobs) + "/a";
  Resp r = MergePatch(path + "/status",
                      {{"status", {{"phase", "Ready"}}}, {"spec", {{"batchSize", 1}}}});
  ASSERT_EQ(r.code, 200) << r.body;
  EXPECT_EQ(r.body["status"]["phase"], "Ready");
  EXPECT_EQ(r.body["spec"]["batchSize"], 8);
  r = MergePatch(path, {{"status", {{"phase", "Lost"}}}, {"spec", {{"batchSize", 2}}}});
  EXPECT_EQ(r.body["status"]["phase"], "Ready");
  EXPECT_EQ(r.body["spec"]["batchSize"], 2);
  EXPECT_EQ(r.body["metadata"]["generation"], 2);
}

TEST_F(FakeApiServer, UnsupportedPatchTypeIs415) {
  Post(kConfigMaps, ConfigMap("a"));
  for (const char* type : {"application/apply-patch+yaml", "application/json"}) {
    ExpectStatus(Do("PATCH", std::string(kConfigMaps) + "/a", {{"data", json::object()}}, type),
                 415, "UnsupportedMediaType");
  }
}

TEST_F(FakeApiServer, StrategicMergePatchOnlyForBuiltInKinds) {
  // A custom resource has no patch merge keys: a real server answers 415.
  CreateJobCrd();
  CreateJob("j");
  ExpectStatus(Do("PATCH", std::string(kJobs) + "/j", {{"spec", {{"batchSize", 2}}}},
                  "application/strategic-merge-patch+json"),
               415, "UnsupportedMediaType");
  // On a built-in it merges maps, replaces lists and drops directives.
  Post(kConfigMaps, ConfigMap("a", {{"app", "x"}}));
  Resp r = Do("PATCH", std::string(kConfigMaps) + "/a",
              {{"metadata", {{"labels", {{"tier", "web"}}}, {"$setElementOrder/finalizers", {}}}},
               {"data", {{"k", nullptr}, {"n", "1"}}}},
              "application/strategic-merge-patch+json");
  ASSERT_EQ(r.code, 200) << r.body;
  EXPECT_EQ(r.body["metadata"]["labels"], json({{"app", "x"}, {"tier", "web"}}));
  EXPECT_EQ(r.body["data"], json({{"n", "1"}}));
  EXPECT_FALSE(r.body["metadata"].contains("$setElementOrder/finalizers"));
}

TEST_F(FakeApiServer, JsonPatchAppliesOperationsAndFailedTestIs422) {
  Post(kConfigMaps, ConfigMap("a"));
  const std::string path = std::string(kConfigMaps) + "/a";
  Resp r = Do("PATCH", path,
              json::array({{{"op", "test"}, {"path", "/data/k"}, {"value", "v"}},
                           {{"op", "add"}, {"path", "/data/n"}, {"value", "1"}},
                           {{"op", "replace"}, {"path", "/data/k"}, {"value", "w"}}}),
              "application/json-patch+json");
  ASSERT_EQ(r.code, 200) << r.body;
  EXPECT_EQ(r.body["data"], json({{"k", "w"}, {"n", "1"}}));
  ExpectStatus(Do("PATCH", path, json::array({{{"op", "test"}, {"path", "/data/k"}, {"value", "v"}}}),
                  "application/json-patch+json"),
               422, "Invalid");
  r = Do("PATCH", path, json::array({{{"op", "remove"}, {"path", "/data/n"}}}),
         "application/json-patch+json");
  ASSERT_EQ(r.code, 200) << r.body;
  EXPECT_EQ(r.body["data"], json({{"k", "w"}}));
}

// ---- discovery, OpenAPI and Tables (what kubectl needs) ------------------------------

TEST_F(FakeApiServer, DiscoveryServesVersionAndCoreGroup) {
  Resp r = Get("/version");
  ASSERT_EQ(r.code, 200);
  EXPECT_EQ(r.body["major"], "1");
  EXPECT_EQ(r.body["gitVersion"], "v1.29.0-meshload-fake");
  r = Get("/api");
  ASSERT_EQ(r.code, 200);
  EXPECT_EQ(r.body["versions"], json::array({"v1"}));
  EXPECT_EQ(r.body["serverAddressByClientCIDRs"][0]["serverAddress"],
            "127.0.0.1:" + std::to_string(server_->port()));
  r = Get("/api/v1");
  ASSERT_EQ(r.code, 200);
  EXPECT_EQ(r.body["kind"], "APIResourceList");
  std::set<std::string> names;
  for (const json& res : r.body["resources"]) names.insert(res["name"].get<std::string>());
  EXPECT_TRUE(names.count("pods") && names.count("pods/status") && names.count("configmaps") &&
              names.count("namespaces"));
  EXPECT_FALSE(names.count("configmaps/status"));
}

TEST_F(FakeApiServer, DiscoveryFollowsCrdsAtRunTime) {
  EXPECT_EQ(Get("/apis/meshload.io/v1alpha1").code, 404);
  json crd = Crd();
  crd["spec"]["names"]["shortNames"] = {"dlj"};
  crd["spec"]["names"]["categories"] = {"meshload"};
  ASSERT_EQ(Post(kCrds, crd).code, 201);
  Resp r = Get("/apis");
  ASSERT_EQ(r.code, 200);
  json group;
  for (const json& g : r.body["groups"]) {
    if (g["name"] == "meshload.io") group = g;
  }
  ASSERT_TRUE(group.is_object()) << r.body;
  EXPECT_EQ(group["preferredVersion"]["groupVersion"], "meshload.io/v1alpha1");
  r = Get("/apis/meshload.io/v1alpha1");
  ASSERT_EQ(r.code, 200);
  ASSERT_EQ(r.body["resources"].size(), 2u) << r.body;
  const json& jobs = r.body["resources"][0];
  EXPECT_EQ(jobs["name"], "dataloadjobs");
  EXPECT_EQ(jobs["singularName"], "dataloadjob");
  EXPECT_EQ(jobs["kind"], "DataLoadJob");
  EXPECT_EQ(jobs["namespaced"], true);
  EXPECT_EQ(jobs["shortNames"], json::array({"dlj"}));
  EXPECT_EQ(jobs["categories"], json::array({"meshload"}));
  EXPECT_EQ(r.body["resources"][1]["name"], "dataloadjobs/status");
  // The OpenAPI index names the group-version too.
  r = Get("/openapi/v3");
  ASSERT_EQ(r.code, 200);
  EXPECT_TRUE(r.body["paths"].contains("apis/meshload.io/v1alpha1")) << r.body;
  ASSERT_EQ(Delete(std::string(kCrds) + "/dataloadjobs.meshload.io").code, 200);
  EXPECT_EQ(Get("/apis/meshload.io/v1alpha1").code, 404);
}

TEST_F(FakeApiServer, TableUsesTheCrdsPrinterColumns) {
  json crd = Crd();
  crd["spec"]["versions"][0]["additionalPrinterColumns"] =
      json::parse(R"([{"name": "Batch", "type": "integer", "jsonPath": ".spec.batchSize"},
                      {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
                      {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}])");
  ASSERT_EQ(Post(kCrds, crd).code, 201);
  CreateJob("j");
  httplib::Client client(server_->url());
  auto res = client.Get(kJobs, {{"Accept", "application/json;as=Table;v=v1;g=meta.k8s.io,"
                                           "application/json"}});
  ASSERT_TRUE(res);
  json table = json::parse(res->body);
  EXPECT_EQ(table["kind"], "Table");
  std::vector<std::string> columns;
  for (const json& c : table["columnDefinitions"]) columns.push_back(c["name"]);
  EXPECT_EQ(columns, (std::vector<std::string>{"Name", "Batch", "Phase", "Age"}));
  ASSERT_EQ(table["rows"].size(), 1u);
  const json& cells = table["rows"][0]["cells"];
  EXPECT_EQ(cells[0], "j");
  EXPECT_EQ(cells[1], 8);
  EXPECT_TRUE(cells[2].is_null());
  EXPECT_TRUE(cells[3].is_string());
  EXPECT_EQ(table["rows"][0]["object"]["kind"], "PartialObjectMetadata");
  // Without the Accept header the same path is a plain list.
  EXPECT_EQ(Get(kJobs).body["kind"], "DataLoadJobList");
}

// ---- 7. list: selectors and paging -------------------------------------------------

TEST_F(FakeApiServer, LabelSelectorVariants) {
  Post(kConfigMaps, ConfigMap("a", {{"app", "x"}, {"tier", "web"}}));
  Post(kConfigMaps, ConfigMap("b", {{"app", "y"}}));
  Post(kConfigMaps, ConfigMap("c", json::object()));
  struct Case {
    std::string selector;
    std::set<std::string> want;
  };
  for (const Case& c : std::vector<Case>{
           {"app=x", {"a"}},
           {"app==y", {"b"}},
           {"app!=x", {"b", "c"}},
           {"app in (x,y)", {"a", "b"}},
           {"app notin (x)", {"b", "c"}},
           {"app", {"a", "b"}},
           {"!app", {"c"}},
           {"app,tier=web", {"a"}},
           {"app in (x, y),!tier", {"b"}},
       }) {
    Resp r = Get(std::string(kConfigMaps) +
                 "?labelSelector=" + httplib::detail::encode_query_param(c.selector));
    ASSERT_EQ(r.code, 200) << c.selector << ": " << r.body;
    EXPECT_EQ(Names(r.body), c.want) << c.selector;
  }
  ExpectStatus(Get(std::string(kConfigMaps) +
                   "?labelSelector=" + httplib::detail::encode_query_param("app in x")),
               400, "BadRequest");
}

TEST_F(FakeApiServer, FieldSelectorOnNameAndNamespace) {
  Post(kConfigMaps, ConfigMap("a"));
  Post(kConfigMaps, ConfigMap("b"));
  Post("/api/v1/namespaces", {{"metadata", {{"name", "other"}}}});
  Post("/api/v1/namespaces/other/configmaps", ConfigMap("a"));
  EXPECT_EQ(Names(Get(std::string(kConfigMaps) + "?fieldSelector=metadata.name%3Da").body),
            std::set<std::string>{"a"});
  EXPECT_EQ(Names(Get(std::string(kConfigMaps) + "?fieldSelector=metadata.name!%3Da").body),
            std::set<std::string>{"b"});
  Resp all = Get("/api/v1/configmaps?fieldSelector=metadata.namespace%3D%3Dother");
  ASSERT_EQ(all.body["items"].size(), 1u);
  EXPECT_EQ(all.body["items"][0]["metadata"]["namespace"], "other");
  ExpectStatus(Get("/api/v1/configmaps?fieldSelector=spec.x%3D1"), 400, "BadRequest");
}

TEST_F(FakeApiServer, PagingReturnsEveryObjectExactlyOnce) {
  for (int i = 0; i < 7; ++i) Post(kConfigMaps, ConfigMap("cm-" + std::to_string(i)));
  std::multiset<std::string> seen;
  std::string token;
  std::string list_rv;
  int pages = 0;
  do {
    std::string path = std::string(kConfigMaps) + "?limit=3";
    if (!token.empty()) path += "&continue=" + httplib::detail::encode_query_param(token);
    Resp r = Get(path);
    ASSERT_EQ(r.code, 200) << r.body;
    EXPECT_LE(r.body["items"].size(), 3u);
    for (const json& item : r.body["items"])
      seen.insert(item["metadata"]["name"].get<std::string>());
    if (pages == 0) {
      list_rv = r.body["metadata"]["resourceVersion"];
      Post(kConfigMaps, ConfigMap("late"));  // not part of the snapshot being paged
    }
    EXPECT_EQ(r.body["metadata"]["resourceVersion"], list_rv);
    token = r.body["metadata"].value("continue", "");
    ++pages;
  } while (!token.empty() && pages < 10);
  EXPECT_EQ(pages, 3);
  EXPECT_EQ(seen.size(), 7u);
  EXPECT_EQ(std::set<std::string>(seen.begin(), seen.end()).size(), 7u);
}

TEST_F(FakeApiServer, ExpiredContinueTokenIsGone410) {
  for (int i = 0; i < 3; ++i) Post(kConfigMaps, ConfigMap("cm-" + std::to_string(i)));
  std::string token = Get(std::string(kConfigMaps) + "?limit=1").body["metadata"]["continue"];
  Post(kConfigMaps, ConfigMap("newer"));
  server_->CompactHistory();
  Resp r = Get(std::string(kConfigMaps) +
               "?limit=1&continue=" + httplib::detail::encode_query_param(token));
  ExpectStatus(r, 410, "Expired");
  EXPECT_EQ(
      r.body["message"].get<std::string>().rfind(
          "The provided continue parameter is too old to display a consistent list result.", 0),
      0u);
}

TEST_F(FakeApiServer, ListItemsOfBuiltinTypesOmitKindAndApiVersion) {
  Post(kConfigMaps, ConfigMap("a"));
  json item = Get(kConfigMaps).body["items"][0];
  EXPECT_FALSE(item.contains("kind"));
  CreateJobCrd();
  CreateJob("j");
  EXPECT_EQ(Get(kJobs).body["items"][0]["kind"], "DataLoadJob");
}

// ---- 8. watch ---------------------------------------------------------------------

TEST_F(FakeApiServer, WatchWithoutResourceVersionSendsAddedThenLiveEvents) {
  Post(kConfigMaps, ConfigMap("a"));
  WatchStream watch(server_->url(), std::string(kConfigMaps) + "?watch=true");
  ASSERT_EQ(watch.WaitFor(1).size(), 1u);
  Post(kConfigMaps, ConfigMap("b"));
  std::vector<json> events = watch.WaitFor(2);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0]["type"], "ADDED");
  EXPECT_EQ(events[0]["object"]["metadata"]["name"], "a");
  EXPECT_EQ(events[0]["object"]["kind"], "ConfigMap");
  EXPECT_EQ(events[1]["type"], "ADDED");
  EXPECT_EQ(events[1]["object"]["metadata"]["name"], "b");
}

TEST_F(FakeApiServer, WatchReplaysEventsAfterResourceVersionInOrder) {
  json a = Post(kConfigMaps, ConfigMap("a")).body;
  Post(kConfigMaps, ConfigMap("b"));
  MergePatch(std::string(kConfigMaps) + "/a", {{"data", {{"k", "2"}}}});
  Delete(std::string(kConfigMaps) + "/b");
  WatchStream watch(server_->url(), std::string(kConfigMaps) + "?watch=1&resourceVersion=" + Rv(a));
  std::vector<json> events = watch.WaitFor(3);
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0]["type"], "ADDED");
  EXPECT_EQ(events[0]["object"]["metadata"]["name"], "b");
  EXPECT_EQ(events[1]["type"], "MODIFIED");
  EXPECT_EQ(events[1]["object"]["data"]["k"], "2");
  EXPECT_EQ(events[2]["type"], "DELETED");
  EXPECT_LT(std::stoull(Rv(events[0]["object"])), std::stoull(Rv(events[1]["object"])));
  EXPECT_LT(std::stoull(Rv(events[1]["object"])), std::stoull(Rv(events[2]["object"])));
}

TEST_F(FakeApiServer, WatchFromCompactedResourceVersionGetsError410) {
  json a = Post(kConfigMaps, ConfigMap("a")).body;
  Post(kConfigMaps, ConfigMap("b"));
  server_->CompactHistory();
  WatchStream watch(server_->url(), std::string(kConfigMaps) + "?watch=1&resourceVersion=" + Rv(a));
  ASSERT_TRUE(watch.WaitEnded(5000ms));  // the server closes after the error
  std::vector<json> events = watch.Events();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0]["type"], "ERROR");
  EXPECT_EQ(events[0]["object"]["kind"], "Status");
  EXPECT_EQ(events[0]["object"]["code"], 410);
  EXPECT_EQ(events[0]["object"]["reason"], "Expired");
}

TEST_F(FakeApiServer, WatchFromResourceVersionBeyondHistoryLimitGetsError410) {
  meshload::fakeapi::FakeApiServerOptions options;
  options.history_limit = 3;
  StartServer(options);
  json a = Post(kConfigMaps, ConfigMap("a")).body;
  for (int i = 0; i < 4; ++i) Post(kConfigMaps, ConfigMap("x" + std::to_string(i)));
  WatchStream watch(server_->url(), std::string(kConfigMaps) + "?watch=1&resourceVersion=" + Rv(a));
  std::vector<json> events = watch.WaitFor(1);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0]["type"], "ERROR");
  EXPECT_EQ(events[0]["object"]["code"], 410);
}

TEST_F(FakeApiServer, WatchSendsBookmarksWhenAllowed) {
  json a = Post(kConfigMaps, ConfigMap("a")).body;
  WatchStream watch(
      server_->url(),
      std::string(kConfigMaps) + "?watch=1&allowWatchBookmarks=true&resourceVersion=" + Rv(a));
  std::vector<json> events = watch.WaitFor(1, 3000ms);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0]["type"], "BOOKMARK");
  EXPECT_EQ(events[0]["object"]["kind"], "ConfigMap");
  EXPECT_EQ(events[0]["object"]["metadata"], json({{"resourceVersion", Rv(a)}}));
}

TEST_F(FakeApiServer, WatchEndsAfterTimeoutSeconds) {
  WatchStream watch(server_->url(), std::string(kConfigMaps) + "?watch=1&timeoutSeconds=1");
  auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(watch.WaitEnded(5000ms));
  EXPECT_GE(std::chrono::steady_clock::now() - start, 900ms);
}

TEST_F(FakeApiServer, WatchWithLabelSelectorReportsObjectsLeavingItAsDeleted) {
  json a = Post(kConfigMaps, ConfigMap("a", {{"app", "x"}})).body;
  Post(kConfigMaps, ConfigMap("b", {{"app", "y"}}));
  WatchStream watch(server_->url(), std::string(kConfigMaps) + "?watch=1&labelSelector=app%3Dx");
  ASSERT_EQ(watch.WaitFor(1).size(), 1u);  // only "a"
  MergePatch(std::string(kConfigMaps) + "/a", {{"metadata", {{"labels", {{"app", "z"}}}}}});
  std::vector<json> events = watch.WaitFor(2);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0]["object"]["metadata"]["name"], "a");
  EXPECT_EQ(events[1]["type"], "DELETED");
  EXPECT_EQ(events[1]["object"]["metadata"]["name"], "a");
}

TEST_F(FakeApiServer, CloseAllWatchesEndsOpenStreams) {
  WatchStream watch(server_->url(), std::string(kConfigMaps) + "?watch=1");
  std::this_thread::sleep_for(100ms);  // let the watch start
  server_->CloseAllWatches();
  EXPECT_TRUE(watch.WaitEnded(3000ms));
}

TEST_F(FakeApiServer, StopDoesNotHangOnOpenWatches) {
  WatchStream w1(server_->url(), std::string(kConfigMaps) + "?watch=1");
  WatchStream w2(server_->url(), std::string(kPods) + "?watch=1&allowWatchBookmarks=1");
  std::this_thread::sleep_for(100ms);
  auto start = std::chrono::steady_clock::now();
  server_->Stop();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 3s);
  EXPECT_TRUE(w1.WaitEnded(3000ms));
}

// ---- 9. test hooks ------------------------------------------------------------------

TEST_F(FakeApiServer, InjectedTooManyRequestsCarriesRetryAfter) {
  server_->InjectErrors("/api/v1/namespaces/default/configmaps", 429, 2, 3);
  Resp r = Get(kConfigMaps);
  ExpectStatus(r, 429, "TooManyRequests");
  EXPECT_EQ(httplib::detail::get_header_value(r.headers, "Retry-After", 0, ""), std::string("3"));
  EXPECT_EQ(Get(kConfigMaps).code, 429);
  EXPECT_EQ(Get(kConfigMaps).code, 200);  // the count is spent
}

TEST_F(FakeApiServer, InjectedInternalErrorMatchesPathPrefixOnly) {
  server_->InjectErrors(kPods, 500, 1);
  EXPECT_EQ(Get(kConfigMaps).code, 200);
  ExpectStatus(Get(kPods), 500, "InternalError");
  EXPECT_EQ(Get(kPods).code, 200);
}

TEST_F(FakeApiServer, WriteCountCountsOnlySuccessfulWrites) {
  EXPECT_EQ(server_->WriteCount(), 0);
  Post(kConfigMaps, ConfigMap("a"));                                      // counted
  Post(kConfigMaps, ConfigMap("a"));                                      // 409
  MergePatch(std::string(kConfigMaps) + "/a", {{"data", {{"x", "1"}}}});  // counted
  Put(std::string(kConfigMaps) + "/missing", ConfigMap("missing"));       // 404
  server_->InjectErrors(kConfigMaps, 500, 1);
  Delete(std::string(kConfigMaps) + "/a");  // injected 500
  Get(kConfigMaps);                         // a read
  Delete(std::string(kConfigMaps) + "/a");  // counted
  Post("/apis/coordination.k8s.io/v1/namespaces/default/leases",
       {{"metadata", {{"name", "l"}}}, {"spec", json::object()}});  // counted
  EXPECT_EQ(server_->WriteCount("configmaps"), 3);
  EXPECT_EQ(server_->WriteCount("leases.coordination.k8s.io"), 1);
  EXPECT_EQ(server_->WriteCount(), 4);
}

TEST_F(FakeApiServer, RequestCountCountsEveryHandledRequestByMethodAndResource) {
  Post(kConfigMaps, ConfigMap("a"));  // 201
  Post(kConfigMaps, ConfigMap("a"));  // 409
  Get(kConfigMaps);
  Get(std::string(kConfigMaps) + "/missing");  // 404
  Get(kPods);
  EXPECT_EQ(server_->RequestCount("POST", "configmaps"), 2);
  EXPECT_EQ(server_->RequestCount("GET", "configmaps"), 2);
  EXPECT_EQ(server_->RequestCount("", "configmaps"), 4);
  EXPECT_EQ(server_->RequestCount("GET", "pods"), 1);
  EXPECT_EQ(server_->RequestCount("", "secrets"), 0);
}

// ---- core/v1 Secret ---------------------------------------------------------

constexpr char kSecrets[] = "/api/v1/namespaces/default/secrets";

TEST_F(FakeApiServer, SecretStringDataIsMergedIntoDataAndTypeDefaultsToOpaque) {
  Resp r = Post(kSecrets, {{"apiVersion", "v1"},
                           {"kind", "Secret"},
                           {"metadata", {{"name", "s"}}},
                           {"data", {{"a", "YWFh"}, {"b", "YmJi"}}},  // "aaa", "bbb"
                           {"stringData", {{"b", "over"}, {"c", "ccc"}}}});
  ASSERT_EQ(r.code, 201) << r.body;
  EXPECT_FALSE(r.body.contains("stringData")) << "stringData is write-only";
  EXPECT_EQ(r.body["data"], json({{"a", "YWFh"}, {"b", "b3Zlcg=="}, {"c", "Y2Nj"}}));
  EXPECT_EQ(r.body["type"], "Opaque");
  EXPECT_EQ(Get(std::string(kSecrets) + "/s").body["data"], r.body["data"]);
}

TEST_F(FakeApiServer, SecretDataMustBeBase64WithValidKeysAndFitOneMebibyte) {
  auto secret = [](json data) {
    return json{{"apiVersion", "v1"}, {"kind", "Secret"}, {"metadata", {{"name", "s"}}}, {"data", data}};
  };
  Resp r = Post(kSecrets, secret({{"k", "not base64!"}}));
  ExpectStatus(r, 400, "BadRequest");
  EXPECT_EQ(r.body["message"], "json: illegal base64 data in Secret.data[k]");
  EXPECT_EQ(r.body["message"].get<std::string>().find("not base64"), std::string::npos) << "never echoes the value";
  r = Post(kSecrets, secret({{"k", 12}}));
  ExpectStatus(r, 400, "BadRequest");
  for (const char* loose : {"YQ", "YQ==\n", "Y Q==", "YQ===", "=YQ="}) {  // Go's decoder refuses these
    ExpectStatus(Post(kSecrets, secret({{"k", loose}})), 400, "BadRequest");
  }
  ExpectStatus(Post(kSecrets, secret({{"..k", "YQ=="}})), 422, "Invalid");
  r = Post(kSecrets, {{"apiVersion", "v1"}, {"kind", "Secret"}, {"metadata", {{"name", "s"}}}, {"type", 7}});
  ExpectStatus(r, 400, "BadRequest");
  r = Post(kSecrets, secret({{"bad key", "YQ=="}}));
  ExpectStatus(r, 422, "Invalid");
  EXPECT_NE(r.body["message"].get<std::string>().find("data[bad key]: Invalid value"), std::string::npos) << r.body;
  r = Post(kSecrets, secret({{"big", meshload::Base64Encode(std::string((1 << 20) + 1, 'x'))}}));
  ExpectStatus(r, 422, "Invalid");
  EXPECT_NE(r.body["message"].get<std::string>().find("data: Too long"), std::string::npos) << r.body;
  EXPECT_EQ(Get(kSecrets).body["items"].size(), 0u) << "nothing was stored";
  r = Post(kSecrets, {{"apiVersion", "v1"}, {"kind", "Secret"}, {"metadata", {{"name", "nulls"}}},
                      {"data", {{"a", nullptr}}}, {"stringData", {{"b", nullptr}}}});
  ASSERT_EQ(r.code, 201) << r.body;
  EXPECT_EQ(r.body["data"], json({{"a", ""}, {"b", ""}}));
  EXPECT_EQ(Post(kSecrets, secret({{"k", meshload::Base64Encode(std::string(1 << 20, 'x'))}})).code, 201);
}

TEST_F(FakeApiServer, AnImmutableSecretKeepsItsDataAndTypeNeverChanges) {
  json s = Post(kSecrets, {{"apiVersion", "v1"},
                           {"kind", "Secret"},
                           {"metadata", {{"name", "s"}, {"labels", {{"a", "1"}}}}},
                           {"type", "Opaque"},
                           {"immutable", true},
                           {"data", {{"k", "YQ=="}}}})
               .body;
  ASSERT_EQ(s["immutable"], true) << s;
  const std::string path = std::string(kSecrets) + "/s";
  json changed = s;
  changed["data"]["k"] = "Yg==";
  Resp r = Put(path, changed);
  ExpectStatus(r, 422, "Invalid");
  EXPECT_NE(r.body["message"].get<std::string>().find("data: Forbidden: field is immutable"), std::string::npos);
  r = MergePatch(path, {{"stringData", {{"k", "b"}}}});
  ExpectStatus(r, 422, "Invalid");
  r = MergePatch(path, {{"immutable", false}});
  ExpectStatus(r, 422, "Invalid");
  EXPECT_NE(r.body["message"].get<std::string>().find("immutable: Forbidden"), std::string::npos);
  r = MergePatch(path, {{"type", "kubernetes.io/tls"}});
  ExpectStatus(r, 422, "Invalid");
  EXPECT_NE(r.body["message"].get<std::string>().find("type: Invalid value"), std::string::npos);
  // Metadata may still change.
  r = MergePatch(path, {{"metadata", {{"labels", {{"a", "2"}}}}}});
  ASSERT_EQ(r.code, 200) << r.body;
  EXPECT_EQ(r.body["data"], json({{"k", "YQ=="}}));
  EXPECT_EQ(r.body["metadata"]["labels"]["a"], "2");
  // A mutable one may change its data.
  json m = Post(kSecrets, {{"apiVersion", "v1"}, {"kind", "Secret"}, {"metadata", {{"name", "m"}}},
                           {"data", {{"k", "YQ=="}}}})
               .body;
  r = MergePatch(std::string(kSecrets) + "/m", {{"stringData", {{"k", "b"}}}});
  ASSERT_EQ(r.code, 200) << r.body;
  EXPECT_EQ(r.body["data"], json({{"k", "Yg=="}}));
}

TEST_F(FakeApiServer, SetLatencyDelaysRequests) {
  server_->SetLatency(200ms);
  auto start = std::chrono::steady_clock::now();
  Get(kConfigMaps);
  EXPECT_GE(std::chrono::steady_clock::now() - start, 190ms);
}

TEST_F(FakeApiServer, PodStatusIsASubresource) {
  json pod = {{"metadata", {{"name", "p"}}},
              {"spec", {{"containers", {{{"name", "c"}, {"image", "busybox"}}}}}},
              {"status", {{"phase", "Running"}}}};
  json created = Post(kPods, pod).body;
  EXPECT_EQ(created["status"]["phase"], "Pending");  // create ignores status too
  Resp r = MergePatch(std::string(kPods) + "/p/status", {{"status", {{"phase", "Running"}}}});
  EXPECT_EQ(r.body["status"]["phase"], "Running");
  EXPECT_EQ(r.body["metadata"]["generation"], 1);
}

// ---- schema validation and defaulting of custom resources -------------------

namespace {

using meshload::fakeapi::YamlToJson;

json LoadYaml(const std::string& relative) {
  return YamlToJson(YAML::LoadFile(std::string(MESHLOAD_SOURCE_DIR) + "/" + relative));
}

// examples/hybrid-fsdp.yaml, in the fixture's namespace.
json HybridJob() {
  json job = LoadYaml("examples/hybrid-fsdp.yaml");
  job["metadata"]["namespace"] = "default";
  return job;
}

// The causes of a 422 Invalid, as field -> reason.
std::map<std::string, std::string> Causes(const Resp& r) {
  std::map<std::string, std::string> out;
  for (const json& c : r.body["details"]["causes"]) {
    out[c["field"].get<std::string>()] = c["reason"].get<std::string>();
  }
  return out;
}

}  // namespace

class SchemaApiServer : public FakeApiServer {
 protected:
  void SetUp() override {
    FakeApiServer::SetUp();
    Resp r = Post(kCrds, LoadYaml("crds/dataloadjobs.meshload.io.yaml"));
    ASSERT_EQ(r.code, 201) << r.body;
  }
  // Creates HybridJob() changed by `edit`; expects 422 Invalid with a cause
  // on `field` of `reason`.
  template <typename Edit>
  Resp ExpectInvalid(Edit edit, const std::string& field, const std::string& reason) {
    json job = HybridJob();
    edit(job);
    Resp r = Post(kJobs, job);
    ExpectStatus(r, 422, "Invalid");
    EXPECT_EQ(r.body["details"]["kind"], "DataLoadJob");
    EXPECT_EQ(r.body["details"]["group"], "meshload.io");
    EXPECT_EQ(r.body["details"]["name"], "hybrid-fsdp");
    std::map<std::string, std::string> causes = Causes(r);
    EXPECT_EQ(causes.count(field), 1u) << r.body;
    if (causes.count(field) != 0) {
      EXPECT_EQ(causes[field], reason) << r.body;
    }
    EXPECT_EQ(Get(std::string(kJobs) + "/hybrid-fsdp").code, 404);
    return r;
  }
};

TEST_F(SchemaApiServer, ValidExampleIsCreatedWithDefaults) {
  json job = HybridJob();
  job["spec"].erase("strategy");
  job["spec"]["mesh"].erase("devicesPerProcess");
  job["spec"]["mesh"]["processes"] = 8;
  job["spec"]["replication"].erase("fanout");
  job["spec"]["batch"].erase("prefetch");
  job["spec"]["shuffle"] = json::object();
  Resp r = Post(kJobs, job);
  ASSERT_EQ(r.code, 201) << r.body;
  const json& spec = r.body["spec"];
  EXPECT_EQ(spec["strategy"], "PerProcess");
  EXPECT_EQ(spec["mesh"]["devicesPerProcess"], 1);
  EXPECT_EQ(spec["replication"]["fanout"], "Load");
  EXPECT_EQ(spec["batch"]["prefetch"], 2);
  EXPECT_EQ(spec["shuffle"], json({{"mode", "Global"}, {"seed", 0}}));
  EXPECT_FALSE(spec.contains("resume"));  // resume itself has no default
  EXPECT_EQ(Get(std::string(kJobs) + "/hybrid-fsdp").body["spec"], spec);
}

TEST_F(SchemaApiServer, UnchangedExampleKeepsItsValues) {
  Resp r = Post(kJobs, HybridJob());
  ASSERT_EQ(r.code, 201) << r.body;
  EXPECT_EQ(r.body["spec"], HybridJob()["spec"]);  // every defaulted field is given
}

TEST_F(SchemaApiServer, DefaultsApplyInsideListItemsAndDefaultedObjects) {
  json schema = json::parse(R"({"type": "object", "properties": {
      "a": {"type": "object", "default": {}, "properties": {"b": {"type": "integer", "default": 3}}},
      "l": {"type": "array", "items": {"type": "object",
            "properties": {"c": {"type": "string", "default": "x"}}}}}})");
  json value = {{"l", json::array({json::object(), {{"c", "y"}}})}};
  meshload::fakeapi::ApplyDefaults(schema, value);
  EXPECT_EQ(value, json::parse(R"({"a": {"b": 3}, "l": [{"c": "x"}, {"c": "y"}]})"));
}

TEST_F(SchemaApiServer, AxisSizeZeroIsInvalid) {
  Resp r = ExpectInvalid([](json& j) { j["spec"]["mesh"]["axes"][0]["size"] = 0; },
                         "spec.mesh.axes[0].size", "FieldValueInvalid");
  EXPECT_EQ(r.body["message"],
            "DataLoadJob.meshload.io \"hybrid-fsdp\" is invalid: spec.mesh.axes[0].size: Invalid "
            "value: 0: spec.mesh.axes[0].size in body should be greater than or equal to 1");
}

TEST_F(SchemaApiServer, MisspelledStrategyIsUnsupported) {
  Resp r = ExpectInvalid([](json& j) { j["spec"]["strategy"] = "PerProces"; }, "spec.strategy",
                         "FieldValueNotSupported");
  EXPECT_EQ(r.body["details"]["causes"][0]["message"],
            "Unsupported value: \"PerProces\": supported values: \"GlobalLoad\", \"PerDevice\", "
            "\"PerProcess\", \"LoadAndReshard\"");
}

TEST_F(SchemaApiServer, StringBatchSizeIsATypeError) {
  Resp r = ExpectInvalid([](json& j) { j["spec"]["batch"]["globalBatchSize"] = "32"; },
                         "spec.batch.globalBatchSize", "FieldValueTypeInvalid");
  EXPECT_EQ(r.body["details"]["causes"][0]["message"],
            "Invalid value: \"string\": spec.batch.globalBatchSize in body must be of type "
            "integer: \"string\"");
  ExpectInvalid([](json& j) { j["spec"]["batch"]["globalBatchSize"] = 32.5; },
                "spec.batch.globalBatchSize", "FieldValueTypeInvalid");
}

TEST_F(SchemaApiServer, MissingDatasetUriIsRequired) {
  Resp r = ExpectInvalid([](json& j) { j["spec"]["dataset"].erase("uri"); }, "spec.dataset.uri",
                         "FieldValueRequired");
  EXPECT_EQ(r.body["details"]["causes"][0]["message"], "Required value");
}

TEST_F(SchemaApiServer, DuplicateAxisNameIsDuplicate) {
  Resp r = ExpectInvalid([](json& j) { j["spec"]["mesh"]["axes"][1]["name"] = "data"; },
                         "spec.mesh.axes[1]", "FieldValueDuplicate");
  EXPECT_EQ(r.body["details"]["causes"][0]["message"], "Duplicate value: {\"name\":\"data\"}");
  ExpectInvalid([](json& j) { j["spec"]["mesh"]["batchAxes"] = {"data", "data"}; },
                "spec.mesh.batchAxes[1]", "FieldValueDuplicate");
}

TEST_F(SchemaApiServer, PrefetchAboveMaximumIsInvalid) {
  ExpectInvalid([](json& j) { j["spec"]["batch"]["prefetch"] = 4096; }, "spec.batch.prefetch",
                "FieldValueInvalid");
}

TEST_F(SchemaApiServer, OtherKeywordsAreChecked) {
  ExpectInvalid([](json& j) { j["spec"]["mesh"]["axes"][0]["name"] = "1bad"; },
                "spec.mesh.axes[0].name", "FieldValueInvalid");
  ExpectInvalid([](json& j) { j["spec"]["mesh"]["axes"][0]["name"] = std::string(64, 'a'); },
                "spec.mesh.axes[0].name", "FieldValueTooLong");
  ExpectInvalid([](json& j) { j["spec"]["mesh"]["axes"] = json::array(); }, "spec.mesh.axes",
                "FieldValueInvalid");
  ExpectInvalid([](json& j) { j["spec"]["selector"]["matchLabels"]["app"] = 7; },
                "spec.selector.matchLabels.app", "FieldValueTypeInvalid");
  ExpectInvalid([](json& j) { j.erase("spec"); }, "spec", "FieldValueRequired");
}

TEST_F(SchemaApiServer, EveryErrorIsListed) {
  Resp r = ExpectInvalid(
      [](json& j) {
        j["spec"]["mesh"]["axes"][0]["size"] = 0;
        j["spec"]["strategy"] = "PerProces";
        j["spec"]["dataset"].erase("uri");
      },
      "spec.strategy", "FieldValueNotSupported");
  EXPECT_EQ(Causes(r), (std::map<std::string, std::string>{
                           {"spec.mesh.axes[0].size", "FieldValueInvalid"},
                           {"spec.strategy", "FieldValueNotSupported"},
                           {"spec.dataset.uri", "FieldValueRequired"}}));
  std::string message = r.body["message"];
  EXPECT_EQ(message.rfind("DataLoadJob.meshload.io \"hybrid-fsdp\" is invalid: [", 0), 0u)
      << message;
}

TEST_F(SchemaApiServer, InvalidUpdateIsRejectedAndStoredObjectUnchanged) {
  Resp created = Post(kJobs, HybridJob());
  ASSERT_EQ(created.code, 201) << created.body;
  std::string path = std::string(kJobs) + "/hybrid-fsdp";
  json job = created.body;
  job["spec"]["mesh"]["axes"][0]["size"] = 0;
  Resp r = Put(path, job);
  ExpectStatus(r, 422, "Invalid");
  EXPECT_EQ(Causes(r).count("spec.mesh.axes[0].size"), 1u) << r.body;
  r = MergePatch(path, {{"spec", {{"batch", {{"prefetch", 4096}}}}}});
  ExpectStatus(r, 422, "Invalid");
  EXPECT_EQ(Causes(r).count("spec.batch.prefetch"), 1u) << r.body;
  EXPECT_EQ(Get(path).body, created.body);
  // A valid merge patch that drops a defaulted field gets the default back.
  r = MergePatch(path, {{"spec", {{"batch", {{"prefetch", nullptr}}}}}});
  ASSERT_EQ(r.code, 200) << r.body;
  EXPECT_EQ(r.body["spec"]["batch"]["prefetch"], 2);
}

TEST_F(SchemaApiServer, StatusWritesAreValidatedAgainstTheStatusSchema) {
  ASSERT_EQ(Post(kJobs, HybridJob()).code, 201);
  std::string path = std::string(kJobs) + "/hybrid-fsdp/status";
  Resp r = MergePatch(path, {{"status", {{"phase", "Runing"}}}});
  ExpectStatus(r, 422, "Invalid");
  EXPECT_EQ(Causes(r), (std::map<std::string, std::string>{
                           {"status.phase", "FieldValueNotSupported"}}));
  json job = Get(std::string(kJobs) + "/hybrid-fsdp").body;
  EXPECT_FALSE(job.contains("status"));
  job["status"] = {{"phase", "Running"}, {"processesReady", -1}};
  r = Put(path, job);
  ExpectStatus(r, 422, "Invalid");
  EXPECT_EQ(Causes(r).count("status.processesReady"), 1u) << r.body;
  r = MergePatch(path, {{"status", {{"phase", "Running"}, {"processesReady", 4}}}});
  ASSERT_EQ(r.code, 200) << r.body;
  EXPECT_EQ(r.body["status"]["phase"], "Running");
}
