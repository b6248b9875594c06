#include "tests/controller/test_env.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <thread>

#include "tests/testing/wait.h"
#include "tests/testing/yaml_json.h"

namespace meshload::testing {

using namespace std::chrono_literals;

std::string SourceDir() { return MESHLOAD_SOURCE_DIR; }

namespace {

// The CRD, installed once per program and Established before any test uses it.
void InstallCrd(controller::kube::KubeClient& client) {
  static std::once_flag once;
  std::call_once(once, [&] {
    auto crd = LoadYamlDocuments(SourceDir() + "/crds/dataloadjobs.meshload.io.yaml").at(0);
    auto r = client.Post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd);
    if (!r.ok() && r.code != 409) {
      ADD_FAILURE() << r.ToStatus("install the CRD").ToString();
      return;
    }
    const bool established = WaitFor(
        [&] {
          auto got = client.Get("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/dataloadjobs.meshload.io");
          if (!got.ok()) return false;
          for (const auto& c : got.body["status"]["conditions"]) {
            if (c["type"] == "Established" && c["status"] == "True") return true;
          }
          return false;
        },
        20s);
    if (!established) ADD_FAILURE() << "the CRD did not become Established";
    // Served once the discovery and the storage for it are up (if not, the
    // tests' own requests say so).
    (void)WaitFor([&] { return client.Get("/apis/meshload.io/v1alpha1/dataloadjobs").ok(); }, 20s);
  });
}

// The program's controller identities bound to the chart's roles, and the
// grants those roles hold ("verb group/resource"), for ChartGrantsNeverUsed.
struct ChartIdentities {
  std::mutex mu;
  std::set<std::string> users;
  std::set<std::string> grants;
};
ChartIdentities& Identities() {
  static ChartIdentities ids;
  return ids;
}

std::string Quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// Runs `argv` and returns its standard output; `ok` says whether it exited 0
// (its standard error goes to the test's).
std::string Capture(const std::vector<std::string>& argv, bool* ok) {
  std::string cmd;
  for (const auto& a : argv) cmd += Quote(a) + " ";
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) {
    *ok = false;
    return out;
  }
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  int status = pclose(p);
  *ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  return out;
}

std::string GrantName(const std::string& verb, const std::string& group, const std::string& resource) {
  return verb + " " + (group.empty() ? "core" : group) + "/" + resource;
}

std::string UniqueSuffix() {
  static std::atomic<int> counter{0};
  return std::to_string(::getpid()) + "-" + std::to_string(counter++);
}

}  // namespace

TestCluster::TestCluster(Options options)
    : cp_(ControlPlane::Get()),
      ns_("t" + UniqueSuffix()),
      controller_user_(options.chart_rbac ? "system:serviceaccount:" + ns_ + ":" + chart_release()
                                          : "meshload-controller-" + ns_),
      chart_rbac_(options.chart_rbac) {
  auto client = controller::kube::KubeClient::Create(cp_.AdminConfig(), options.client);
  if (!client.ok()) {
    ADD_FAILURE() << client.status().ToString();
    return;
  }
  client_ = std::move(*client);
  if (options.fault_proxy) proxy_ = std::make_unique<FaultProxy>(cp_);
  InstallCrd(*client_);
  CreateNamespace(ns_);
  if (chart_rbac_) BindChartRbac();
}

TestCluster::~TestCluster() {
  if (chart_rbac_ && client_ && !forbidden_expected_) {
    auto refused = Forbidden();
    if (!refused.empty()) {
      std::string list;
      for (const auto& r : refused) list += "\n  " + r;
      ADD_FAILURE() << "the server refused the controller (the chart's roles) " << refused.size()
                    << " request(s): the chart must grant what the controller needs" << list;
    }
  }
  if (client_) client_->Shutdown();
}

// The controller's ServiceAccount and roles exactly as the chart renders them
// for a release in this namespace (cluster-wide roles, as with the chart's
// default watchNamespace ""), its name meshload-<ns>, the Lease's name the
// controller's default.
void TestCluster::BindChartRbac() {
  static std::string kube_version;
  if (kube_version.empty()) {
    auto v = client_->Get("/version");
    if (v.ok()) kube_version = v.body.value("gitVersion", "");
  }
  bool ok = false;
  const std::string out =
      Capture({cp_.bin_dir() + "/helm", "template", chart_release(), SourceDir() + "/charts/meshload", "--namespace",
               ns_, "--kube-version", kube_version, "--set", "fullnameOverride=" + chart_release(), "--set",
               "leaderElection.id=meshload-controller", "--show-only", "templates/serviceaccount.yaml", "--show-only",
               "templates/rbac.yaml", "--show-only", "templates/lease.yaml"},
              &ok);
  if (!ok) {
    ADD_FAILURE() << "helm template of the chart's RBAC failed";
    return;
  }
  std::set<std::string> grants;
  for (const json& doc : ParseYamlDocuments(out)) {
    const std::string kind = doc.value("kind", "");
    std::string path;
    if (kind == "ServiceAccount") {
      path = "/api/v1/namespaces/" + ns_ + "/serviceaccounts";
    } else if (kind == "ClusterRole" || kind == "ClusterRoleBinding") {
      path = "/apis/rbac.authorization.k8s.io/v1/" +
             std::string(kind == "ClusterRole" ? "clusterroles" : "clusterrolebindings");
    } else if (kind == "Lease") {
      path = "/apis/coordination.k8s.io/v1/namespaces/" + doc["metadata"].value("namespace", ns_) + "/leases";
    } else if (kind == "Role" || kind == "RoleBinding") {
      path = "/apis/rbac.authorization.k8s.io/v1/namespaces/" + doc["metadata"].value("namespace", ns_) + "/" +
             (kind == "Role" ? "roles" : "rolebindings");
    } else {
      ADD_FAILURE() << "the chart's RBAC rendered a " << kind;
      continue;
    }
    auto r = client_->Post(path, doc);
    if (!r.ok()) ADD_FAILURE() << r.ToStatus("create the chart's " + kind).ToString();
    if (kind == "ClusterRole" || kind == "Role") {
      for (const auto& rule : doc["rules"]) {
        for (const auto& g : rule["apiGroups"]) {
          for (const auto& res : rule["resources"]) {
            for (const auto& verb : rule["verbs"]) grants.insert(GrantName(verb, g, res));
          }
        }
      }
    }
  }
  {
    auto& ids = Identities();
    std::lock_guard<std::mutex> lock(ids.mu);
    ids.users.insert(controller_user_);
    ids.grants.insert(grants.begin(), grants.end());
  }
  // The authorizer works from its own watch of the roles: wait until it
  // allows what they grant.
  auto allowed = [&](const json& attributes) {
    json review = {
        {"apiVersion", "authorization.k8s.io/v1"},
        {"kind", "SubjectAccessReview"},
        {"spec",
         {{"user", controller_user_},
          {"groups", json::array({"system:serviceaccounts", "system:serviceaccounts:" + ns_, "system:authenticated"})},
          {"resourceAttributes", attributes}}}};
    auto r = client_->Post("/apis/authorization.k8s.io/v1/subjectaccessreviews", review);
    return r.ok() && r.body["status"].value("allowed", false);
  };
  if (!WaitFor(
          [&] {
            return allowed({{"verb", "watch"}, {"group", "meshload.io"}, {"resource", "dataloadjobs"}}) &&
                   allowed({{"verb", "update"},
                            {"group", "coordination.k8s.io"},
                            {"resource", "leases"},
                            {"namespace", ns_},
                            {"name", "meshload-controller"}});
          },
          20s)) {
    ADD_FAILURE() << "the chart's roles never took effect for " << controller_user_;
  }
}

FaultProxy& TestCluster::proxy() {
  if (!proxy_) {
    ADD_FAILURE() << "this TestCluster has no fault proxy (Options::fault_proxy)";
    proxy_ = std::make_unique<FaultProxy>(cp_);
  }
  return *proxy_;
}

controller::kube::ClusterConfig TestCluster::ControllerConfig() const {
  controller::kube::ClusterConfig c =
      chart_rbac_ ? cp_.UserConfig(controller_user_, {"system:serviceaccounts", "system:serviceaccounts:" + ns_})
                  : cp_.UserConfig(controller_user_, {"system:masters"});
  c.namespace_ = ns_;
  return proxy_ ? proxy_->Through(c) : c;
}

std::unique_ptr<controller::kube::KubeClient> TestCluster::ControllerClient(
    controller::kube::ClientOptions options) const {
  return NewClient(ControllerConfig(), std::move(options));
}

std::unique_ptr<controller::kube::KubeClient> TestCluster::NewClient(controller::kube::ClientOptions options) const {
  return NewClient(cp_.AdminConfig(), std::move(options));
}

std::unique_ptr<controller::kube::KubeClient> TestCluster::NewClient(const controller::kube::ClusterConfig& config,
                                                                     controller::kube::ClientOptions options) const {
  auto c = controller::kube::KubeClient::Create(config, std::move(options));
  if (!c.ok()) {
    ADD_FAILURE() << c.status().ToString();
    return nullptr;
  }
  return std::move(*c);
}

std::string TestCluster::ServiceAccountToken(const std::string& name) {
  const std::string sa = "/api/v1/namespaces/" + ns_ + "/serviceaccounts";
  auto r = client_->Post(sa, {{"apiVersion", "v1"}, {"kind", "ServiceAccount"}, {"metadata", {{"name", name}}}});
  if (r.ok()) {
    json binding = {
        {"apiVersion", "rbac.authorization.k8s.io/v1"},
        {"kind", "ClusterRoleBinding"},
        {"metadata", {{"name", ns_ + "-" + name}}},
        {"roleRef", {{"apiGroup", "rbac.authorization.k8s.io"}, {"kind", "ClusterRole"}, {"name", "cluster-admin"}}},
        {"subjects", json::array({{{"kind", "ServiceAccount"}, {"name", name}, {"namespace", ns_}}})}};
    auto b = client_->Post("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", binding);
    if (!b.ok()) ADD_FAILURE() << b.ToStatus("bind " + name).ToString();
  } else if (r.code != 409) {
    ADD_FAILURE() << r.ToStatus("create service account " + name).ToString();
  }
  auto t = client_->Post(
      sa + "/" + name + "/token",
      {{"apiVersion", "authentication.k8s.io/v1"}, {"kind", "TokenRequest"}, {"spec", {{"expirationSeconds", 3600}}}});
  if (!t.ok()) {
    ADD_FAILURE() << t.ToStatus("token for " + name).ToString();
    return "";
  }
  return t.body["status"]["token"].get<std::string>();
}

void TestCluster::CreateNamespace(const std::string& ns) {
  namespaces_.insert(ns);
  auto r =
      client_->Post("/api/v1/namespaces", {{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", ns}}}});
  if (!r.ok() && r.code != 409) ADD_FAILURE() << r.ToStatus("create namespace").ToString();
  // Pods are admitted once the service-account controller has made the
  // namespace's default account.
  if (!WaitFor([&] { return client_->Get("/api/v1/namespaces/" + ns + "/serviceaccounts/default").ok(); }, 20s)) {
    ADD_FAILURE() << "namespace " << ns << " got no default service account";
  }
}

json TestCluster::JobManifest(const std::string& ns, const std::string& name, int processes,
                              const std::string& app) const {
  auto docs = LoadYamlDocuments(SourceDir() + "/examples/local-fixedrecord.yaml");
  json job = docs.at(0);
  job["metadata"] = {{"name", name}, {"namespace", ns}};
  job["spec"]["mesh"]["processes"] = processes;
  job["spec"]["mesh"]["devicesPerProcess"] = 2;
  job["spec"]["mesh"]["axes"] = json::array({{{"name", "data"}, {"size", processes * 2}}});
  job["spec"]["batch"]["globalBatchSize"] = processes * 2 * 8;
  job["spec"]["selector"] = {{"matchLabels", {{"app", app}}}};
  return job;
}

json TestCluster::CreateJob(const json& manifest) {
  const std::string ns = manifest["metadata"]["namespace"];
  auto r = client_->Post(JobsPath(ns), manifest);
  if (!r.ok()) ADD_FAILURE() << r.ToStatus("create job").ToString() << " " << r.body.dump();
  return r.body;
}

json TestCluster::CreatePod(const std::string& ns, const std::string& name, const std::string& app,
                            std::map<std::string, std::string> annotations) {
  auto r = client_->Post("/api/v1/namespaces/" + ns + "/pods", TrainerPod(ns, name, app, annotations));
  if (!r.ok()) ADD_FAILURE() << r.ToStatus("create pod").ToString();
  return r.body;
}

void TestCluster::SetSidecar(const std::string& ns, const std::string& name, bool ready, int restarts,
                             const std::string& given_ip) {
  json current = Get("/api/v1/namespaces/" + ns + "/pods/" + name);
  std::string ip = "10.0." + std::to_string(pod_ip_ / 250) + "." + std::to_string(pod_ip_ % 250 + 1);
  ++pod_ip_;
  // The IP stays the same across readiness changes of a pod.
  if (current.contains("status") && current["status"].contains("podIP")) ip = current["status"]["podIP"];
  if (!given_ip.empty()) ip = given_ip;
  auto r =
      client_->Patch("/api/v1/namespaces/" + ns + "/pods/" + name + "/status", RunningPodStatus(ip, ready, restarts));
  if (!r.ok()) ADD_FAILURE() << r.ToStatus("set pod status").ToString() << " " << r.body.dump();
}

void TestCluster::DeletePod(const std::string& ns, const std::string& name) {
  // No kubelet confirms the pod has stopped: delete it at once.
  auto r = client_->Delete("/api/v1/namespaces/" + ns + "/pods/" + name + "?gracePeriodSeconds=0");
  if (!r.ok()) ADD_FAILURE() << r.ToStatus("delete pod").ToString();
}

json TestCluster::Get(const std::string& path) {
  auto r = client_->Get(path);
  return r.ok() ? r.body : json();
}

bool TestCluster::Ours(const AuditEvent& e) const {
  if (e.user == "meshload-admin") return false;  // the test itself
  return e.namespace_.empty() ? false : namespaces_.count(e.namespace_) > 0;
}

namespace {

bool ResourceIs(const AuditEvent& e, std::string_view resource) {
  if (resource.empty()) return true;
  if (e.resource == resource) return true;
  return !e.api_group.empty() && e.resource + "." + e.api_group == resource;
}

bool VerbIs(const AuditEvent& e, std::string_view method) {
  if (method.empty()) return true;
  if (method == "GET") return e.verb == "get" || e.verb == "list" || e.verb == "watch";
  if (method == "POST") return e.verb == "create";
  if (method == "PUT") return e.verb == "update";
  if (method == "PATCH") return e.verb == "patch";
  if (method == "DELETE") return e.verb == "delete" || e.verb == "deletecollection";
  return false;
}

bool Succeeded(const AuditEvent& e) { return e.code >= 200 && e.code < 300; }

}  // namespace

int64_t TestCluster::WriteCount(std::string_view resource) const {
  return static_cast<int64_t>(
      cp_.Audit([&](const AuditEvent& e) { return Ours(e) && e.write() && Succeeded(e) && ResourceIs(e, resource); })
          .size());
}

int64_t TestCluster::WriteCountByUserAgent(std::string_view part) const {
  return static_cast<int64_t>(cp_.Audit([&](const AuditEvent& e) {
                                   return Ours(e) && e.write() && Succeeded(e) &&
                                          e.user_agent.find(part) != std::string::npos;
                                 })
                                  .size());
}

int64_t TestCluster::RequestCount(std::string_view method, std::string_view resource) const {
  return static_cast<int64_t>(
      cp_.Audit([&](const AuditEvent& e) { return Ours(e) && VerbIs(e, method) && ResourceIs(e, resource); }).size());
}

std::vector<std::string> TestCluster::Forbidden() const {
  std::vector<std::string> out;
  for (const auto& e : cp_.Audit([&](const AuditEvent& e) { return e.user == controller_user_ && e.code == 403; })) {
    out.push_back(GrantName(e.verb, e.api_group, e.resource + (e.subresource.empty() ? "" : "/" + e.subresource)) +
                  " " + (e.namespace_.empty() ? "" : e.namespace_ + "/") + e.name);
  }
  return out;
}

std::vector<std::string> TestCluster::ChartGrantsNeverUsed() {
  auto& ids = Identities();
  std::set<std::string> users, unused;
  {
    std::lock_guard<std::mutex> lock(ids.mu);
    users = ids.users;
    unused = ids.grants;
  }
  for (const auto& e : ControlPlane::Get().Audit([&](const AuditEvent& e) { return users.count(e.user) > 0; })) {
    if (e.code == 403) continue;
    unused.erase(GrantName(e.verb, e.api_group, e.resource + (e.subresource.empty() ? "" : "/" + e.subresource)));
    // OwnerReferencesPermissionEnforcement checks this right on each create
    // of an object owned by a DataLoadJob with blockOwnerDeletion.
    if (e.verb == "create" && e.code >= 200 && e.code < 300 &&
        (e.resource == "configmaps" || e.resource == "secrets")) {
      unused.erase(GrantName("update", "meshload.io", "dataloadjobs/finalizers"));
    }
  }
  return {unused.begin(), unused.end()};
}

}  // namespace meshload::testing
