// A fake cluster for controller tests: the fake API server (TLS by default),
// a KubeClient authenticated with a client certificate, the real CRD from
// crds/, and helpers that create pods and play the kubelet's part.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "controller/fakeapi/fake_apiserver.h"
#include "controller/kube/client.h"
#include "controller/kube/config.h"

namespace meshload::testing {

using nlohmann::json;

class TestCluster {
 public:
  struct Options {
    bool tls = true;
    size_t history_limit = 1000;
    kube::ClientOptions client{};
  };
  /// Starts the server, installs the CRD, creates namespace `ns`. Fails the
  /// current test (ADD_FAILURE) on error.
  explicit TestCluster(Options options);
  TestCluster() : TestCluster(Options{}) {}
  ~TestCluster();

  fakeapi::FakeApiServer& server() { return *server_; }
  kube::KubeClient& client() { return *client_; }
  /// A kubeconfig authenticating with a client certificate.
  kube::ClusterConfig config() const { return config_; }
  /// Writes that kubeconfig to `path` (for controller processes).
  void WriteKubeconfig(const std::string& path) const;
  /// Another client (e.g. for a second controller) with its own options.
  std::unique_ptr<kube::KubeClient> NewClient(kube::ClientOptions options = {}) const;

  void CreateNamespace(const std::string& ns);
  /// A DataLoadJob from examples/local-fixedrecord.yaml's spec with
  /// `processes` processes (2 devices each), selecting app=<app>.
  json JobManifest(const std::string& ns, const std::string& name, int processes, const std::string& app) const;
  json CreateJob(const json& manifest);
  /// A trainer pod with labels {app: app} (+ `labels`) and optional
  /// completion index annotation; the kubelet part (SetSidecar) is separate.
  json CreatePod(const std::string& ns, const std::string& name, const std::string& app,
                 std::map<std::string, std::string> annotations = {});
  /// Writes pod status as the kubelet would: Running, a pod IP, and the
  /// sidecar container's readiness and restart count.
  void SetSidecar(const std::string& ns, const std::string& name, bool ready, int restarts = 0);
  void DeletePod(const std::string& ns, const std::string& name);
  json Get(const std::string& path);

  /// Polls `pred` until true or `timeout`.
  static bool Eventually(const std::function<bool()>& pred,
                         std::chrono::milliseconds timeout = std::chrono::seconds(20));

 private:
  std::unique_ptr<fakeapi::FakeApiServer> server_;
  std::unique_ptr<kube::KubeClient> client_;
  kube::ClusterConfig config_;
  int pod_ip_ = 10;
};

/// The source tree (for crds/ and examples/).
std::string SourceDir();

}  // namespace meshload::testing
