// A cluster for controller tests on the real control plane
// (tests/testing/control_plane.h: etcd, kube-apiserver,
// kube-controller-manager, one per test program): each TestCluster has a
// namespace of its own, the real CRD installed, the test's own client (the
// admin), the controller's identity, an optional fault proxy in front of the
// server, and helpers that create pods and play the kubelet's part (there is
// no kubelet: pods are stored, never run).
//
// The controller's identity is the chart's: the ServiceAccount, ClusterRole,
// leader-election Role and their bindings that `helm template` renders from
// charts/meshload for this namespace, authorized by the server's RBAC (a
// client certificate named as that ServiceAccount, so the audit log tells
// its requests from the test's). A request the server refuses with 403 fails
// the test when the TestCluster goes; ChartGrantsNeverUsed() lists what the
// chart grants that no controller of the program has used.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "controller/kube/client.h"
#include "controller/kube/config.h"
#include "tests/testing/control_plane.h"

namespace meshload::testing {

using nlohmann::json;

class TestCluster {
 public:
  struct Options {
    controller::kube::ClientOptions client{};
    /// Put a fault proxy (tests/tools/faultproxy) in front of the server for
    /// the controller's identity: proxy(), ControllerConfig().
    bool fault_proxy = false;
    /// The controller's identity: the chart's ServiceAccount and roles
    /// (true), or a user in system:masters (false: for tests of the client
    /// itself, which do what no controller does).
    bool chart_rbac = true;
  };
  /// Makes this cluster's namespace (ns()) and installs the CRD (once per
  /// program). Fails the current test (ADD_FAILURE) on error.
  explicit TestCluster(Options options);
  TestCluster() : TestCluster(Options{}) {}
  ~TestCluster();

  /// This cluster's namespace, unique in the program's control plane.
  const std::string& ns() const { return ns_; }
  ControlPlane& control_plane() { return cp_; }
  FaultProxy& proxy();

  /// The test's own client (the admin).
  controller::kube::KubeClient& client() { return *client_; }
  /// The admin's configuration.
  controller::kube::ClusterConfig config() const { return cp_.AdminConfig(); }
  /// The controller's configuration: user controller_user() (the chart's
  /// ServiceAccount, or in system:masters without Options::chart_rbac),
  /// through the fault proxy when there is one.
  controller::kube::ClusterConfig ControllerConfig() const;
  const std::string& controller_user() const { return controller_user_; }
  /// A client with the controller's identity.
  std::unique_ptr<controller::kube::KubeClient> ControllerClient(controller::kube::ClientOptions options = {}) const;
  /// Writes the controller's configuration as a kubeconfig file.
  void WriteKubeconfig(const std::string& path) const { testing::WriteKubeconfig(path, ControllerConfig()); }
  /// Another client with `config` (the admin's by default).
  std::unique_ptr<controller::kube::KubeClient> NewClient(controller::kube::ClientOptions options = {}) const;
  std::unique_ptr<controller::kube::KubeClient> NewClient(const controller::kube::ClusterConfig& config,
                                                          controller::kube::ClientOptions options = {}) const;

  /// A token (TokenRequest) of service account `name` in ns(), made and
  /// bound to cluster-admin on first use.
  std::string ServiceAccountToken(const std::string& name);

  /// Creates namespace `ns` (and counts it as this cluster's).
  void CreateNamespace(const std::string& ns);
  /// A DataLoadJob from examples/local-fixedrecord.yaml's spec with
  /// `processes` processes (2 devices each), selecting app=<app>.
  json JobManifest(const std::string& ns, const std::string& name, int processes, const std::string& app) const;
  /// The API paths of the DataLoadJobs in `ns` and of job `name` there.
  static std::string JobsPath(const std::string& ns) {
    return "/apis/meshload.io/v1alpha1/namespaces/" + ns + "/dataloadjobs";
  }
  static std::string JobPath(const std::string& ns, const std::string& name) { return JobsPath(ns) + "/" + name; }
  json CreateJob(const json& manifest);
  /// A trainer pod with labels {app: app} and optional annotations (the
  /// completion index); the kubelet's part (SetSidecar) is separate.
  json CreatePod(const std::string& ns, const std::string& name, const std::string& app,
                 std::map<std::string, std::string> annotations = {});
  /// Writes pod status as the kubelet would: Running, a pod IP, and the
  /// sidecar container's readiness and restart count; the pod IP is `ip`
  /// when given (a loopback address, where a test serves the sidecar's
  /// endpoints), else one of 10.0.0.0/16, kept across calls.
  void SetSidecar(const std::string& ns, const std::string& name, bool ready, int restarts = 0,
                  const std::string& ip = "");
  void DeletePod(const std::string& ns, const std::string& name);
  json Get(const std::string& path);

  /// From the audit log, requests by anyone but the test itself (the admin)
  /// in this cluster's namespaces: successful writes (on `resource`:
  /// "secrets", "leases.coordination.k8s.io", "dataloadjobs.meshload.io"; all
  /// when empty); successful writes whose User-Agent contains `part`; and
  /// requests of any outcome with HTTP `method` ("GET" covers get, list and
  /// watch; empty: any) on `resource`.
  int64_t WriteCount(std::string_view resource = {}) const;
  int64_t WriteCountByUserAgent(std::string_view part) const;
  int64_t RequestCount(std::string_view method, std::string_view resource) const;

  /// Requests by the controller's identity that the server refused (403),
  /// from the audit log, as "verb group/resource[/subresource] ns/name".
  std::vector<std::string> Forbidden() const;
  /// For a test that takes a grant away on purpose: refusals no longer fail
  /// the test when the TestCluster goes.
  void ExpectForbidden() { forbidden_expected_ = true; }
  /// The name of the chart's release for this namespace (its ServiceAccount,
  /// ClusterRole and bindings are named so).
  std::string chart_release() const { return "meshload-" + ns_; }
  /// What the chart's roles grant ("verb group/resource[/subresource]") that
  /// no controller identity of this program has asked for (any answer but
  /// 403), from the audit log. The finalizers grant counts as used by each
  /// create of an object owned with blockOwnerDeletion (the admission
  /// plugin OwnerReferencesPermissionEnforcement checks it there).
  static std::vector<std::string> ChartGrantsNeverUsed();

 private:
  bool Ours(const AuditEvent& e) const;
  void BindChartRbac();

  ControlPlane& cp_;
  std::string ns_, controller_user_;
  bool chart_rbac_ = true;
  bool forbidden_expected_ = false;
  std::set<std::string> namespaces_;
  std::unique_ptr<FaultProxy> proxy_;
  std::unique_ptr<controller::kube::KubeClient> client_;
  int pod_ip_ = 10;
};

/// The source tree (for crds/ and examples/).
std::string SourceDir();

}  // namespace meshload::testing
