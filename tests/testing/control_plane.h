// The real Kubernetes control plane for C++ tests: etcd, kube-apiserver and
// kube-controller-manager started by scripts/control-plane (one per test
// program, on first use, stopped at exit and with the program if it
// crashes), client identities signed by its CA, the audit log read back for
// counting requests from the server's side, etcd compaction (for 410 Gone),
// and the fault-injecting proxy (tests/tools/faultproxy).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/status.h"
#include "controller/kube/config.h"

namespace meshload::testing {

/// One request as the audit log saw it (ResponseComplete, or ResponseStarted
/// for a watch still open).
struct AuditEvent {
  std::string audit_id;
  std::string verb;  // get, list, watch, create, update, patch, delete, deletecollection
  std::string user;  // the identity authorized (the impersonated one behind the fault proxy)
  std::string user_agent;
  std::string resource;   // "secrets", "dataloadjobs", "leases"
  std::string api_group;  // "" for the core group
  std::string subresource;
  std::string namespace_;
  std::string name;
  int code = 0;  // HTTP status (0: a watch still open)
  bool write() const {
    return verb == "create" || verb == "update" || verb == "patch" || verb == "delete" || verb == "deletecollection";
  }
};

class ControlPlane {
 public:
  /// The program's control plane, started on the first call (call it first
  /// from the main thread: the control plane's parent-death signal follows
  /// the thread that started it). Fails the program if it cannot start.
  static ControlPlane& Get();

  const std::string& dir() const { return dir_; }
  const std::string& bin_dir() const { return bin_dir_; }
  /// https://127.0.0.1:PORT of kube-apiserver.
  const std::string& server() const { return server_; }
  const std::string& ca_pem() const { return ca_pem_; }
  int port(const std::string& component) const;

  /// The admin's configuration (a client certificate in system:masters).
  controller::kube::ClusterConfig AdminConfig() const;
  /// A configuration for user `name` in `groups`, with a client certificate
  /// signed by the control plane's CA (made once per identity).
  controller::kube::ClusterConfig UserConfig(const std::string& name, const std::vector<std::string>& groups) const;

  /// Every request in the audit log so far that `match` accepts (all when
  /// empty).
  std::vector<AuditEvent> Audit(const std::function<bool(const AuditEvent&)>& match = {}) const;

  /// Compacts etcd's history to its current revision: resource versions
  /// before now become 410 Gone.
  Status Compact() const;

  ControlPlane(const ControlPlane&) = delete;
  ControlPlane& operator=(const ControlPlane&) = delete;
  ~ControlPlane();

 private:
  ControlPlane() = default;
  Status Start();
  void Stop();

  std::string dir_, bin_dir_, server_, ca_pem_;
  std::map<std::string, int> ports_;
  pid_t supervisor_ = -1;
  mutable std::mutex mu_;
  mutable std::map<std::string, std::pair<std::string, std::string>> certs_;  // user -> cert, key
  // The audit log, parsed incrementally.
  mutable size_t audit_offset_ = 0;
  mutable std::vector<AuditEvent> audit_;
  mutable std::map<std::string, size_t> audit_index_;  // audit id -> position in audit_
};

/// A trainer pod as the tests and benchmarks make it: containers "trainer"
/// and "meshload-sidecar", labels {app: app}, and `annotations` (the
/// completion index).
nlohmann::json TrainerPod(const std::string& ns, const std::string& name, const std::string& app,
                          const std::map<std::string, std::string>& annotations = {});
/// The status a kubelet writes for a TrainerPod (there is no kubelet): Running
/// at `ip`, the trainer ready, the sidecar ready or not, with `restarts`.
nlohmann::json RunningPodStatus(const std::string& ip, bool sidecar_ready, int restarts = 0);

/// Writes `config` as a kubeconfig file (certificates and keys inline).
void WriteKubeconfig(const std::string& path, const controller::kube::ClusterConfig& config);

/// tests/tools/faultproxy in front of the control plane's kube-apiserver:
/// clients use url() instead of the server's; faults are set per proxy.
class FaultProxy {
 public:
  /// Starts a proxy; fails the current test (ADD_FAILURE) if it cannot.
  explicit FaultProxy(ControlPlane& cp);
  ~FaultProxy();
  FaultProxy(const FaultProxy&) = delete;
  FaultProxy& operator=(const FaultProxy&) = delete;

  const std::string& url() const { return url_; }
  /// A configuration like `base` that goes through the proxy.
  controller::kube::ClusterConfig Through(controller::kube::ClusterConfig base) const;

  /// The next `count` requests whose path starts with `path_prefix` are
  /// answered with `status` (with Retry-After when retry_after_seconds > 0).
  void InjectErrors(const std::string& path_prefix, int status, int count, int retry_after_seconds = 0);
  void ClearInjectedErrors();
  int InjectedErrorsPending();
  void SetLatency(std::chrono::milliseconds latency);
  /// Ends every watch stream open through the proxy.
  void CloseAllWatches();
  /// Watch requests begun through the proxy.
  int64_t WatchesBegun();

 private:
  std::string Admin(const std::string& method, const std::string& path);

  pid_t pid_ = -1;
  std::string url_, admin_host_;
  int admin_port_ = 0;
};

}  // namespace meshload::testing
