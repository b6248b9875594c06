// The Kubernetes client against the real kube-apiserver (the test program's
// control plane) over TLS on loopback, with the fault proxy in front where a
// test needs faults: kubeconfig and in-cluster configuration,
// authentication, retries, rate limits, and the informer's list/watch
// semantics (410 Gone from a real etcd compaction).

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <thread>

#include "common/base64.h"
#include "tests/testing/test_pki.h"
#include "controller/kube/client.h"
#include "controller/kube/config.h"
#include "controller/kube/informer.h"
#include "tests/controller/test_env.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/wait.h"

namespace meshload::controller::kube {
namespace {

using meshload::testing::TempDir;
using meshload::testing::TestCluster;
using meshload::testing::WaitFor;
using nlohmann::json;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

void Write(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

json ConfigMap(const std::string& ns, const std::string& name) {
  return {{"apiVersion", "v1"},
          {"kind", "ConfigMap"},
          {"metadata", {{"name", name}, {"namespace", ns}}},
          {"data", {{"k", "v"}}}};
}

// ---- configuration ----------------------------------------------------------

TEST(KubeConfig, ReadsCurrentContextWithCaAndClientCertificateData) {
  TestCluster cluster;
  TempDir dir;
  cluster.WriteKubeconfig(dir.path() + "/config");
  auto cfg = LoadKubeconfig(dir.path() + "/config");
  ASSERT_OK(cfg);
  EXPECT_EQ(cfg->server, cluster.control_plane().server());
  EXPECT_EQ(cfg->ca_pem, cluster.control_plane().ca_pem());
  EXPECT_FALSE(cfg->client_cert_pem.empty());
  EXPECT_EQ(cfg->namespace_, cluster.ns());
  auto client = KubeClient::Create(*cfg);
  ASSERT_OK(client);
  ApiResponse r = (*client)->Get("/api/v1/namespaces/" + cluster.ns() + "/configmaps");
  EXPECT_EQ(r.code, 200) << r.message();
}

TEST(KubeConfig, FilePathsAreRelativeToTheKubeconfigAndTokenFilesAreRead) {
  TestCluster cluster;
  TempDir dir;
  Write(dir.path() + "/ca.pem", cluster.control_plane().ca_pem());
  Write(dir.path() + "/token", cluster.ServiceAccountToken("reader") + "\n");
  Write(dir.path() + "/config",
        "apiVersion: v1\nkind: Config\ncurrent-context: b\n"
        "clusters:\n- name: c\n  cluster:\n    server: " +
            cluster.control_plane().server() +
            "\n    certificate-authority: ca.pem\n"
            "users:\n- name: u\n  user:\n    tokenFile: token\n"
            "contexts:\n- name: a\n  context: {cluster: nope, user: u}\n"
            "- name: b\n  context: {cluster: c, user: u, namespace: training}\n");
  auto cfg = LoadKubeconfig(dir.path() + "/config");
  ASSERT_OK(cfg);
  EXPECT_EQ(cfg->namespace_, "training");
  EXPECT_EQ(cfg->token_file, dir.path() + "/token");
  auto client = KubeClient::Create(*cfg);
  ASSERT_OK(client);
  EXPECT_EQ((*client)->Get("/api/v1/namespaces").code, 200);
  // Another context by name: its cluster does not exist.
  auto other = LoadKubeconfig(dir.path() + "/config", "a");
  EXPECT_THAT(other, meshload::testing::StatusIs(StatusCode::kNotFound, HasSubstr("nope")));
}

TEST(KubeConfig, ErrorsNameTheFieldAndUnsupportedAuthIsRefused) {
  TempDir dir;
  const std::string head =
      "apiVersion: v1\nkind: Config\ncurrent-context: x\n"
      "contexts:\n- name: x\n  context: {cluster: c, user: u}\n";
  Write(dir.path() + "/bad-b64", head +
                                     "clusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:1\n"
                                     "    certificate-authority-data: '!!notbase64'\nusers:\n- name: u\n  user: {}\n");
  auto r = LoadKubeconfig(dir.path() + "/bad-b64");
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().ToString(), HasSubstr("certificate-authority-data"));

  Write(dir.path() + "/exec", head +
                                  "clusters:\n- name: c\n  cluster: {server: 'https://127.0.0.1:1'}\n"
                                  "users:\n- name: u\n  user:\n    exec: {command: aws}\n");
  r = LoadKubeconfig(dir.path() + "/exec");
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().ToString(), HasSubstr("exec"));

  Write(dir.path() + "/noserver", head + "clusters:\n- name: c\n  cluster: {}\nusers:\n- name: u\n  user: {}\n");
  r = LoadKubeconfig(dir.path() + "/noserver");
  EXPECT_THAT(r.status().ToString(), HasSubstr("server is missing"));
  EXPECT_EQ(LoadKubeconfig(dir.path() + "/missing").status().code(), StatusCode::kNotFound);
}

TEST(KubeConfig, InClusterReadsTheServiceAccountAndEnvironment) {
  TestCluster cluster;
  TempDir sa;
  Write(sa.path() + "/token", cluster.ServiceAccountToken("in-cluster"));
  Write(sa.path() + "/ca.crt", cluster.control_plane().ca_pem());
  Write(sa.path() + "/namespace", "meshload-system\n");
  const std::string port = std::to_string(cluster.control_plane().port("apiserver"));
  auto cfg = InClusterConfig(sa.path(), {{"KUBERNETES_SERVICE_HOST", "127.0.0.1"}, {"KUBERNETES_SERVICE_PORT", port}});
  ASSERT_OK(cfg);
  EXPECT_EQ(cfg->server, "https://127.0.0.1:" + port);
  EXPECT_EQ(cfg->namespace_, "meshload-system");
  auto client = KubeClient::Create(*cfg);
  ASSERT_OK(client);
  EXPECT_EQ((*client)->Get("/api/v1/namespaces").code, 200);

  // The token rotates (projected tokens do): the next request sends the new one.
  Write(sa.path() + "/token", "rotated-and-unknown");
  std::filesystem::last_write_time(sa.path() + "/token",
                                   std::filesystem::file_time_type::clock::now() + std::chrono::seconds(5));
  EXPECT_EQ((*client)->Get("/api/v1/namespaces").code, 401);

  auto missing = InClusterConfig(sa.path(), {{"KUBERNETES_SERVICE_HOST", ""}});
  EXPECT_EQ(missing.status().code(), StatusCode::kFailedPrecondition);
}

// ---- authentication and TLS --------------------------------------------------

TEST(KubeClient, WrongCaIsRefusedAndInsecureSkipVerifyConnects) {
  TestCluster cluster;
  ClusterConfig cfg = cluster.config();
  auto other = pki::MakeTestPki();  // another CA
  ASSERT_OK(other);
  cfg.ca_pem = other->ca.cert_pem;
  auto client = KubeClient::Create(cfg, {.max_attempts = 1});
  ASSERT_OK(client);
  ApiResponse r = (*client)->Get("/api/v1/namespaces");
  EXPECT_EQ(r.code, 0) << "a server certificate from an unknown CA must not be accepted";
  cfg.insecure_skip_tls_verify = true;
  auto insecure = KubeClient::Create(cfg, {.max_attempts = 1});
  ASSERT_OK(insecure);
  EXPECT_EQ((*insecure)->Get("/api/v1/namespaces").code, 200);
}

TEST(KubeClient, AnUnknownTokenIs401AndNoCredentialsAreTheAnonymousUser) {
  TestCluster cluster;
  ClusterConfig cfg = cluster.config();
  cfg.client_cert_pem.clear();
  cfg.client_key_pem.clear();
  auto anonymous = KubeClient::Create(cfg);
  ASSERT_OK(anonymous);
  ApiResponse r = (*anonymous)->Get("/api/v1/namespaces");
  EXPECT_EQ(r.code, 403) << "kube-apiserver authenticates no credentials as system:anonymous";
  EXPECT_THAT(r.message(), HasSubstr("system:anonymous"));
  cfg.bearer_token = "not-a-token";
  auto unknown = KubeClient::Create(cfg);
  r = (*unknown)->Get("/api/v1/namespaces");
  EXPECT_EQ(r.code, 401);
  EXPECT_EQ(r.reason(), "Unauthorized");
  EXPECT_EQ(r.attempts, 1) << "401 is an answer, not retried";
  cfg.bearer_token = cluster.ServiceAccountToken("tokened");
  auto with_token = KubeClient::Create(cfg);
  EXPECT_EQ((*with_token)->Get("/api/v1/namespaces").code, 200);
}

// ---- retries and rate limits -------------------------------------------------

TEST(KubeClient, TooManyRequestsHonoursRetryAfter) {
  TestCluster cluster({.fault_proxy = true});
  std::map<std::string, int> seen;
  std::mutex mu;
  auto client = cluster.ControllerClient({.observer = [&](std::string_view verb, int code) {
    std::lock_guard<std::mutex> lock(mu);
    seen[std::string(verb) + " " + std::to_string(code)]++;
  }});
  const std::string cms = "/api/v1/namespaces/" + cluster.ns() + "/configmaps";
  cluster.proxy().InjectErrors(cms, 429, 1, /*retry_after_seconds=*/1);
  auto start = std::chrono::steady_clock::now();
  ApiResponse r = client->Get(cms);
  auto took = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(r.code, 200);
  EXPECT_EQ(r.attempts, 2);
  EXPECT_GE(took, 950ms) << "Retry-After: 1 must be waited out";
  EXPECT_EQ(seen["LIST 429"], 1);
  EXPECT_EQ(seen["LIST 200"], 1);
}

TEST(KubeClient, ServerErrorsAreRetriedWithBackoffAndClientErrorsAreNot) {
  TestCluster cluster({.fault_proxy = true});
  auto client = cluster.ControllerClient({.backoff_base = 5ms});
  const std::string cms = "/api/v1/namespaces/" + cluster.ns() + "/configmaps";
  cluster.proxy().InjectErrors(cms, 500, 2);
  ApiResponse r = client->Post(cms, ConfigMap(cluster.ns(), "a"));
  EXPECT_EQ(r.code, 201) << r.body.dump();
  EXPECT_EQ(r.attempts, 3);
  r = client->Post(cms, ConfigMap(cluster.ns(), "a"));
  EXPECT_EQ(r.code, 409) << "AlreadyExists is an answer, not retried";
  EXPECT_EQ(r.reason(), "AlreadyExists");
  EXPECT_EQ(r.attempts, 1);
  EXPECT_EQ(r.ToStatus("create").code(), StatusCode::kAlreadyExists);

  cluster.proxy().InjectErrors(cms + "/a", 503, 100);
  r = client->Get(cms + "/a");
  EXPECT_EQ(r.code, 503) << "attempts are bounded";
  EXPECT_EQ(r.attempts, 5);
}

TEST(KubeClient, ConnectionErrorsAreRetriedThenReported) {
  ClusterConfig cfg;
  cfg.server = "http://127.0.0.1:1";  // nothing listens
  auto client = KubeClient::Create(cfg, {.max_attempts = 3, .backoff_base = 1ms});
  ASSERT_OK(client);
  ApiResponse r = (*client)->Get("/api/v1/namespaces");
  EXPECT_EQ(r.code, 0);
  EXPECT_EQ(r.attempts, 3);
  EXPECT_EQ(r.ToStatus("list").code(), StatusCode::kUnavailable);
  EXPECT_THAT(r.ToStatus("list").ToString(), HasSubstr("cannot reach"));
}

TEST(KubeClient, QpsAndBurstBoundTheRequestRate) {
  TestCluster cluster;
  auto client = cluster.NewClient({.qps = 50, .burst = 5});
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 30; ++i) ASSERT_EQ(client->Get("/api/v1/namespaces").code, 200);
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // 5 at once, then 25 at 50/s: at least 0.5 s.
  EXPECT_GE(s, 0.45);
}

TEST(KubeClient, VerbLabelsAreBounded) {
  EXPECT_EQ(VerbLabel("GET", "/api/v1/namespaces/a/pods"), "LIST");
  EXPECT_EQ(VerbLabel("GET", "/api/v1/pods?limit=5"), "LIST");
  EXPECT_EQ(VerbLabel("GET", "/api/v1/namespaces/a/pods/p"), "GET");
  EXPECT_EQ(VerbLabel("GET", "/api/v1/namespaces"), "LIST");
  EXPECT_EQ(VerbLabel("GET", "/api/v1/namespaces/a"), "GET");
  EXPECT_EQ(VerbLabel("GET", "/apis/meshload.io/v1alpha1/dataloadjobs?watch=true&x=1"), "WATCH");
  EXPECT_EQ(VerbLabel("GET", "/apis/meshload.io/v1alpha1/namespaces/a/dataloadjobs/j/status"), "GET");
  EXPECT_EQ(VerbLabel("PUT", "/x"), "PUT");
  EXPECT_EQ(QueryEscape("app=a,b c"), "app%3Da%2Cb%20c");
}

// ---- informer ------------------------------------------------------------------

TEST(Informer, ListsInPagesThenFollowsTheWatch) {
  TestCluster cluster;
  const std::string a = cluster.ns();
  for (int i = 0; i < 25; ++i)
    cluster.client().Post("/api/v1/namespaces/" + a + "/configmaps", ConfigMap(a, "cm-" + std::to_string(i)));
  // Every namespace's ConfigMaps, in pages: the control plane's own
  // (kube-root-ca.crt in each namespace) and the 25.
  Informer inf(&cluster.client(), {"/api/v1", "configmaps"}, {.page_size = 4});
  std::atomic<int> events{0};
  inf.OnChange([&](const json&, bool) { events.fetch_add(1); });
  inf.Start();
  ASSERT_TRUE(inf.WaitForSync(10s));
  const size_t all = cluster.client().Get("/api/v1/configmaps").body["items"].size();
  EXPECT_EQ(inf.size(), all);
  EXPECT_EQ(events.load(), static_cast<int>(all));
  EXPECT_EQ(inf.List(a).size(), 26u);  // and kube-root-ca.crt
  EXPECT_GE(inf.lists(), 1);
  ASSERT_NE(inf.Get(a, "cm-7"), nullptr);
  cluster.client().Post("/api/v1/namespaces/" + a + "/configmaps", ConfigMap(a, "late"));
  cluster.client().Delete("/api/v1/namespaces/" + a + "/configmaps/cm-0");
  EXPECT_TRUE(WaitFor([&] { return inf.Get(a, "late") && !inf.Get(a, "cm-0"); }, 20s));
  EXPECT_EQ(inf.List(a).size(), 26u);
  EXPECT_EQ(inf.List("other").size(), 0u);
  inf.Stop();
}

TEST(Informer, ClosedWatchesResumeFromTheLastResourceVersion) {
  TestCluster cluster({.fault_proxy = true});
  const std::string ns = cluster.ns();
  auto through_proxy = cluster.ControllerClient();
  Informer inf(through_proxy.get(), {"/api/v1", "configmaps"}, {.namespace_ = ns});
  inf.Start();
  ASSERT_TRUE(inf.WaitForSync(10s));
  for (int round = 0; round < 3; ++round) {
    // Close only once the proxy holds the informer's watch (a close before
    // that would miss it), and wait for the informer to re-watch.
    ASSERT_TRUE(WaitFor([&] { return inf.watches() >= round + 1; }, 20s));
    ASSERT_TRUE(WaitFor([&] { return cluster.proxy().WatchesBegun() >= round + 1; }, 20s));
    cluster.proxy().CloseAllWatches();
    cluster.client().Post("/api/v1/namespaces/" + ns + "/configmaps", ConfigMap(ns, "r" + std::to_string(round)));
  }
  EXPECT_TRUE(WaitFor([&] { return inf.size() == 4; }, 20s));  // and kube-root-ca.crt
  EXPECT_EQ(inf.lists(), 1) << "a closed watch resumes; it does not relist";
  EXPECT_GE(inf.watches(), 2);
}

TEST(Informer, GoneResourceVersionRelistsAndSeesDeletionsItMissed) {
  TestCluster cluster({.fault_proxy = true});
  const std::string ns = cluster.ns();
  const std::string cms = "/api/v1/namespaces/" + ns + "/configmaps";
  for (int i = 0; i < 3; ++i) cluster.client().Post(cms, ConfigMap(ns, "x" + std::to_string(i)));
  auto through_proxy = cluster.ControllerClient();
  Informer inf(through_proxy.get(), {"/api/v1", "configmaps"}, {.namespace_ = ns, .error_backoff = 1000ms});
  std::mutex mu;
  std::vector<std::string> deleted;
  inf.OnChange([&](const json& obj, bool del) {
    if (!del) return;
    std::lock_guard<std::mutex> lock(mu);
    deleted.push_back(obj["metadata"]["name"]);
  });
  inf.Start();
  ASSERT_TRUE(inf.WaitForSync(10s));
  // While the watch is down (the re-watch fails with a 500 and backs off
  // for a second), x1 goes away and etcd's history is compacted: the resumed
  // watch gets 410 Gone and the relist must report x1 as deleted.
  ASSERT_TRUE(WaitFor([&] { return inf.watches() >= 1 && cluster.proxy().WatchesBegun() >= 1; }, 20s));
  const int64_t watches = inf.watches();
  cluster.proxy().InjectErrors(cms, 500, 1);
  cluster.proxy().CloseAllWatches();
  ASSERT_TRUE(WaitFor([&] { return inf.watches() > watches; }, 20s));
  // The re-watch has taken the 500.
  ASSERT_TRUE(WaitFor([&] { return cluster.proxy().InjectedErrorsPending() == 0; }, 20s));
  ASSERT_EQ(cluster.client().Delete(cms + "/x1").code, 200);
  // Other writes move etcd's revision on, then history is compacted past
  // the informer's resource version.
  for (int i = 0; i < 3; ++i) cluster.client().Post(cms, ConfigMap(ns, "y" + std::to_string(i)));
  ASSERT_OK(cluster.control_plane().Compact());
  EXPECT_TRUE(WaitFor([&] { return inf.Get(ns, "x1") == nullptr && inf.Get(ns, "y2") != nullptr; }, 20s));
  EXPECT_GE(inf.relists_after_gone(), 1);
  EXPECT_GE(inf.lists(), 2);
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(deleted, std::vector<std::string>{"x1"});
}

TEST(Informer, AnExpiredContinueTokenFallsBackToAFullList) {
  TestCluster cluster({.fault_proxy = true});
  const std::string a = cluster.ns();
  for (int i = 0; i < 30; ++i)
    cluster.client().Post("/api/v1/namespaces/" + a + "/configmaps", ConfigMap(a, "c" + std::to_string(i)));
  // Slow pages while another writer moves etcd on and history is compacted
  // past the list's resource version: its continue token expires (410).
  cluster.proxy().SetLatency(20ms);
  std::atomic<bool> stop{false};
  auto writer_client = cluster.NewClient({.qps = 0});
  std::thread writer([&] {
    for (int i = 0; !stop.load(); ++i) {
      writer_client->Post(
          "/api/v1/namespaces/" + a + "/secrets",
          {{"apiVersion", "v1"}, {"kind", "Secret"}, {"metadata", {{"name", "w" + std::to_string(i)}}}});
      if (i % 5 == 4) (void)cluster.control_plane().Compact();
    }
  });
  auto through_proxy = cluster.ControllerClient();
  Informer inf(through_proxy.get(), {"/api/v1", "configmaps"}, {.namespace_ = a, .page_size = 2});
  inf.Start();
  bool synced = inf.WaitForSync(60s);
  stop = true;
  writer.join();
  cluster.proxy().SetLatency(0ms);
  ASSERT_TRUE(synced);
  EXPECT_EQ(inf.size(), 31u);  // and kube-root-ca.crt
  EXPECT_GE(inf.relists_after_gone(), 1) << "the continue token should have expired mid-list";
}

TEST(Informer, TransformBoundsWhatIsCachedAndKeepsTheObjectsIdentity) {
  TestCluster cluster;
  const std::string ns = cluster.ns();
  for (int i = 0; i < 5; ++i) {
    cluster.client().Post("/api/v1/namespaces/" + ns + "/configmaps", ConfigMap(ns, "t" + std::to_string(i)));
  }
  ASSERT_TRUE(
      cluster.client().Get("/api/v1/namespaces/" + ns + "/configmaps/t0").body["metadata"].contains("managedFields"))
      << "the real server records managedFields";
  // A transform that keeps nothing of the metadata, listed in pages of 2:
  // every object is made small as its page arrives, and keeps its identity.
  Informer inf(&cluster.client(), {"/api/v1", "configmaps"},
               {.namespace_ = ns, .page_size = 2, .transform = [](json obj) {
                  return json{{"data", obj["data"]}};
                }});
  inf.Start();
  ASSERT_TRUE(inf.WaitForSync(10s));
  auto obj = inf.Get(ns, "t3");
  ASSERT_NE(obj, nullptr);
  EXPECT_EQ((*obj)["data"]["k"], "v");
  EXPECT_EQ((*obj)["metadata"]["name"], "t3");
  EXPECT_FALSE((*obj)["metadata"].value("resourceVersion", "").empty());
  EXPECT_EQ(obj->size(), 2u) << obj->dump();
  // Without a transform, managedFields are dropped all the same, on list and watch.
  Informer plain(&cluster.client(), {"/api/v1", "configmaps"}, {.namespace_ = ns});
  plain.Start();
  ASSERT_TRUE(plain.WaitForSync(10s));
  cluster.client().Post("/api/v1/namespaces/" + ns + "/configmaps", ConfigMap(ns, "late"));
  ASSERT_TRUE(WaitFor([&] { return plain.Get(ns, "late") != nullptr; }, 20s));
  for (const char* name : {"t0", "late"}) {
    auto o = plain.Get(ns, name);
    ASSERT_NE(o, nullptr);
    EXPECT_FALSE((*o)["metadata"].contains("managedFields")) << name;
    EXPECT_EQ((*o)["data"]["k"], "v");
  }
}

}  // namespace
}  // namespace meshload::controller::kube
