#include "tests/controller/test_env.h"

#include <gtest/gtest.h>

#include <fstream>
#include <thread>

#include "common/base64.h"
#include "controller/fakeapi/yaml_json.h"

namespace meshload::testing {

std::string SourceDir() { return MESHLOAD_SOURCE_DIR; }

TestCluster::TestCluster(Options options) {
  fakeapi::FakeApiServerOptions so;
  so.tls = options.tls;
  so.history_limit = options.history_limit;
  so.bearer_tokens = {"test-token"};
  server_ = std::make_unique<fakeapi::FakeApiServer>(so);
  Status st = server_->Start();
  if (!st.ok()) {
    ADD_FAILURE() << st.ToString();
    return;
  }
  config_.server = server_->url();
  config_.origin = "test";
  if (options.tls) {
    config_.ca_pem = server_->ca_pem();
    auto cert = server_->MakeClientCert("meshload-test");
    if (!cert.ok()) {
      ADD_FAILURE() << cert.status().ToString();
      return;
    }
    config_.client_cert_pem = cert->cert_pem;
    config_.client_key_pem = cert->key_pem;
  } else {
    config_.bearer_token = "test-token";
  }
  auto client = kube::KubeClient::Create(config_, options.client);
  if (!client.ok()) {
    ADD_FAILURE() << client.status().ToString();
    return;
  }
  client_ = std::move(*client);
  auto crd = fakeapi::LoadYamlDocuments(SourceDir() + "/crds/dataloadjobs.meshload.io.yaml");
  auto r = client_->Post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd.at(0));
  if (!r.ok()) ADD_FAILURE() << r.ToStatus("install the CRD").ToString();
}

TestCluster::~TestCluster() {
  if (client_) client_->Shutdown();
  if (server_) server_->Stop();
}

void TestCluster::WriteKubeconfig(const std::string& path) const {
  std::ofstream out(path);
  out << "apiVersion: v1\nkind: Config\ncurrent-context: test\n"
      << "clusters:\n- name: fake\n  cluster:\n    server: " << config_.server << "\n";
  if (!config_.ca_pem.empty()) out << "    certificate-authority-data: " << Base64Encode(config_.ca_pem) << "\n";
  out << "users:\n- name: tester\n  user:\n";
  if (!config_.client_cert_pem.empty()) {
    out << "    client-certificate-data: " << Base64Encode(config_.client_cert_pem) << "\n"
        << "    client-key-data: " << Base64Encode(config_.client_key_pem) << "\n";
  } else {
    out << "    token: " << config_.bearer_token << "\n";
  }
  out << "contexts:\n- name: test\n  context: {cluster: fake, user: tester, namespace: default}\n";
}

std::unique_ptr<kube::KubeClient> TestCluster::NewClient(kube::ClientOptions options) const {
  auto c = kube::KubeClient::Create(config_, std::move(options));
  if (!c.ok()) {
    ADD_FAILURE() << c.status().ToString();
    return nullptr;
  }
  return std::move(*c);
}

void TestCluster::CreateNamespace(const std::string& ns) {
  auto r = client_->Post("/api/v1/namespaces", {{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", ns}}}});
  if (!r.ok() && r.code != 409) ADD_FAILURE() << r.ToStatus("create namespace").ToString();
}

json TestCluster::JobManifest(const std::string& ns, const std::string& name, int processes,
                              const std::string& app) const {
  auto docs = fakeapi::LoadYamlDocuments(SourceDir() + "/examples/local-fixedrecord.yaml");
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
  auto r = client_->Post("/apis/meshload.io/v1alpha1/namespaces/" + ns + "/dataloadjobs", manifest);
  if (!r.ok()) ADD_FAILURE() << r.ToStatus("create job").ToString() << " " << r.body.dump();
  return r.body;
}

json TestCluster::CreatePod(const std::string& ns, const std::string& name, const std::string& app,
                            std::map<std::string, std::string> annotations) {
  json pod = {{"apiVersion", "v1"},
              {"kind", "Pod"},
              {"metadata", {{"name", name}, {"namespace", ns}, {"labels", {{"app", app}}}}},
              {"spec",
               {{"containers", json::array({{{"name", "trainer"}, {"image", "trainer:1"}},
                                            {{"name", "meshload-sidecar"}, {"image", "meshload/sidecar:0.1.0"}}})}}}};
  if (!annotations.empty()) pod["metadata"]["annotations"] = annotations;
  auto r = client_->Post("/api/v1/namespaces/" + ns + "/pods", pod);
  if (!r.ok()) ADD_FAILURE() << r.ToStatus("create pod").ToString();
  return r.body;
}

void TestCluster::SetSidecar(const std::string& ns, const std::string& name, bool ready, int restarts) {
  const std::string path = "/api/v1/namespaces/" + ns + "/pods/" + name + "/status";
  json patch = {{"status",
                 {{"phase", "Running"},
                  {"podIP", "10.0." + std::to_string(pod_ip_ / 250) + "." + std::to_string(pod_ip_ % 250 + 1)},
                  {"containerStatuses",
                   json::array({{{"name", "trainer"}, {"ready", true}, {"restartCount", 0}},
                                {{"name", "meshload-sidecar"}, {"ready", ready}, {"restartCount", restarts}}})}}}};
  ++pod_ip_;
  // Keep the IP stable across readiness changes of the same pod.
  json current = Get("/api/v1/namespaces/" + ns + "/pods/" + name);
  if (current["status"].contains("podIP")) patch["status"]["podIP"] = current["status"]["podIP"];
  auto r = client_->Patch(path, patch);
  if (!r.ok()) ADD_FAILURE() << r.ToStatus("set pod status").ToString();
}

void TestCluster::DeletePod(const std::string& ns, const std::string& name) {
  auto r = client_->Delete("/api/v1/namespaces/" + ns + "/pods/" + name);
  if (!r.ok()) ADD_FAILURE() << r.ToStatus("delete pod").ToString();
}

json TestCluster::Get(const std::string& path) {
  auto r = client_->Get(path);
  return r.ok() ? r.body : json();
}

bool TestCluster::Eventually(const std::function<bool()>& pred, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return pred();
}

}  // namespace meshload::testing
