/// \file
/// Where the Kubernetes API server is and how to authenticate to it: a
/// kubeconfig file (as kubectl reads it) or the in-cluster service account.
///
///   MESHLOAD_ASSIGN_OR_RETURN(ClusterConfig cfg, LoadClusterConfig(flag_kubeconfig));
///
/// Resolution order of LoadClusterConfig (client-go's): the --kubeconfig flag;
/// $KUBECONFIG (its first existing file); the in-cluster service account when
/// KUBERNETES_SERVICE_HOST is set; ~/.kube/config.
///
/// Supported kubeconfig fields: clusters[].cluster.{server,
/// certificate-authority, certificate-authority-data,
/// insecure-skip-tls-verify, tls-server-name}, users[].user.{token,
/// tokenFile, client-certificate, client-certificate-data, client-key,
/// client-key-data}, contexts[].context.{cluster, user, namespace},
/// current-context. Relative file paths are resolved against the
/// kubeconfig's directory, as kubectl does. Exec and auth-provider plugins
/// are refused with a clear error (the controller runs in-cluster).
///
/// Thread safety: pure functions over the file system.
#pragma once

#include <map>
#include <string>

#include "common/status.h"

namespace meshload::controller::kube {

inline constexpr char kServiceAccountDir[] = "/var/run/secrets/kubernetes.io/serviceaccount";

struct ClusterConfig {
  std::string server;  // "https://10.0.0.1:443"
  std::string ca_pem;  // CA bundle; empty: the system's trust store
  bool insecure_skip_tls_verify = false;
  std::string bearer_token;     // a literal token
  std::string token_file;       // re-read when it changes (projected tokens rotate)
  std::string client_cert_pem;  // client certificate authentication
  std::string client_key_pem;
  std::string namespace_ = "default";  // the context's (or the pod's) namespace
  std::string origin;                  // "kubeconfig FILE (context C)" or "in-cluster", for logs
};

/// Reads a kubeconfig file. `context` empty: current-context.
/// Errors name the file and the field ("users[fake].user.client-key-data: not base64").
Result<ClusterConfig> LoadKubeconfig(const std::string& path, const std::string& context = "");

/// The in-cluster configuration: KUBERNETES_SERVICE_HOST/PORT from `env`
/// (the process environment when empty) and token, ca.crt and namespace
/// from `service_account_dir`.
Result<ClusterConfig> InClusterConfig(const std::string& service_account_dir = kServiceAccountDir,
                                      const std::map<std::string, std::string>& env = {});

/// The resolution order in the file comment.
Result<ClusterConfig> LoadClusterConfig(const std::string& kubeconfig_flag);

}  // namespace meshload::controller::kube
