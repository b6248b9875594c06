#include "controller/kube/config.h"

#include <yaml-cpp/yaml.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/base64.h"

namespace meshload::controller::kube {
namespace {

namespace fs = std::filesystem;

Result<std::string> ReadFile(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound("cannot read " + what, path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string Str(const YAML::Node& n, const char* key) {
  YAML::Node v = n[key];
  return v && v.IsScalar() ? v.as<std::string>() : std::string();
}

// Finds the entry named `name` in a kubeconfig list (clusters, users, contexts).
YAML::Node Named(const YAML::Node& list, const std::string& name) {
  if (!list || !list.IsSequence()) return YAML::Node();
  for (const auto& item : list) {
    if (item["name"] && item["name"].IsScalar() && item["name"].as<std::string>() == name) return item;
  }
  return YAML::Node();
}

// Reads `field` (a path relative to the kubeconfig's dir) or `field-data`
// (base64): whichever is set, data winning as in client-go.
Result<std::string> FileOrData(const YAML::Node& n, const std::string& field, const fs::path& base,
                               const std::string& where) {
  std::string data = Str(n, (field + "-data").c_str());
  if (!data.empty()) {
    auto decoded = Base64Decode(data);
    if (!decoded) return InvalidArgument("not valid base64", where + "." + field + "-data");
    return *decoded;
  }
  std::string file = Str(n, field.c_str());
  if (file.empty()) return std::string();
  fs::path p(file);
  if (p.is_relative()) p = base / p;
  return ReadFile(p.string(), where + "." + field);
}

}  // namespace

Result<ClusterConfig> LoadKubeconfig(const std::string& path, const std::string& context_name) {
  MESHLOAD_ASSIGN_OR_RETURN(std::string text, ReadFile(path, "the kubeconfig"));
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    return InvalidArgument("not YAML: " + std::string(e.what()), path);
  }
  if (!root.IsMap()) return InvalidArgument("a kubeconfig must be a mapping", path);
  std::string ctx_name = context_name.empty() ? Str(root, "current-context") : context_name;
  if (ctx_name.empty()) return InvalidArgument("no current-context and no context was given", path);
  YAML::Node ctx_entry = Named(root["contexts"], ctx_name);
  if (!ctx_entry) return NotFound("context '" + ctx_name + "' is not in contexts", path);
  YAML::Node ctx = ctx_entry["context"];
  if (!ctx || !ctx.IsMap()) return InvalidArgument("contexts[" + ctx_name + "].context is missing", path);
  std::string cluster_name = Str(ctx, "cluster"), user_name = Str(ctx, "user");
  YAML::Node cluster_entry = Named(root["clusters"], cluster_name);
  if (!cluster_entry || !cluster_entry["cluster"]) {
    return NotFound("cluster '" + cluster_name + "' of context '" + ctx_name + "' is not in clusters", path);
  }
  YAML::Node cluster = cluster_entry["cluster"];
  const fs::path base = fs::path(path).parent_path();
  const std::string cwhere = path + ": clusters[" + cluster_name + "].cluster";

  ClusterConfig cfg;
  cfg.origin = "kubeconfig " + path + " (context " + ctx_name + ")";
  cfg.server = Str(cluster, "server");
  if (cfg.server.empty()) return InvalidArgument("server is missing", cwhere);
  while (!cfg.server.empty() && cfg.server.back() == '/') cfg.server.pop_back();
  if (cfg.server.rfind("https://", 0) != 0 && cfg.server.rfind("http://", 0) != 0) {
    return InvalidArgument("server must be an http:// or https:// URL, got '" + cfg.server + "'", cwhere);
  }
  MESHLOAD_ASSIGN_OR_RETURN(cfg.ca_pem, FileOrData(cluster, "certificate-authority", base, cwhere));
  std::string insecure = Str(cluster, "insecure-skip-tls-verify");
  cfg.insecure_skip_tls_verify = insecure == "true";
  if (!Str(cluster, "tls-server-name").empty()) {
    return InvalidArgument("tls-server-name is not supported", cwhere);
  }
  if (!user_name.empty()) {
    YAML::Node user_entry = Named(root["users"], user_name);
    if (!user_entry) return NotFound("user '" + user_name + "' of context '" + ctx_name + "' is not in users", path);
    YAML::Node user = user_entry["user"];
    const std::string uwhere = path + ": users[" + user_name + "].user";
    if (user && user.IsMap()) {
      if (user["exec"] || user["auth-provider"]) {
        return InvalidArgument(
            "exec and auth-provider plugins are not supported; use a token or a client "
            "certificate",
            uwhere);
      }
      if (user["username"] || user["password"]) {
        return InvalidArgument("basic authentication is not supported", uwhere);
      }
      cfg.bearer_token = Str(user, "token");
      std::string token_file = Str(user, "tokenFile");
      if (!token_file.empty() && cfg.bearer_token.empty()) {
        fs::path p(token_file);
        if (p.is_relative()) p = base / p;
        cfg.token_file = p.string();
        MESHLOAD_ASSIGN_OR_RETURN(std::string t, ReadFile(cfg.token_file, uwhere + ".tokenFile"));
        (void)t;
      }
      MESHLOAD_ASSIGN_OR_RETURN(cfg.client_cert_pem, FileOrData(user, "client-certificate", base, uwhere));
      MESHLOAD_ASSIGN_OR_RETURN(cfg.client_key_pem, FileOrData(user, "client-key", base, uwhere));
      if (cfg.client_cert_pem.empty() != cfg.client_key_pem.empty()) {
        return InvalidArgument("client-certificate and client-key must be given together", uwhere);
      }
    }
  }
  std::string ns = Str(ctx, "namespace");
  if (!ns.empty()) cfg.namespace_ = ns;
  return cfg;
}

Result<ClusterConfig> InClusterConfig(const std::string& dir, const std::map<std::string, std::string>& env) {
  auto get = [&](const char* name) -> std::string {
    if (!env.empty()) {
      auto it = env.find(name);
      return it == env.end() ? std::string() : it->second;
    }
    const char* v = std::getenv(name);
    return v ? v : "";
  };
  std::string host = get("KUBERNETES_SERVICE_HOST"), port = get("KUBERNETES_SERVICE_PORT");
  if (host.empty() || port.empty()) {
    return FailedPrecondition(
        "not running in a cluster: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT "
        "must be set");
  }
  ClusterConfig cfg;
  cfg.origin = "in-cluster";
  // An IPv6 service address needs brackets in a URL.
  bool v6 = host.find(':') != std::string::npos;
  cfg.server = "https://" + (v6 ? "[" + host + "]" : host) + ":" + port;
  cfg.token_file = dir + "/token";
  MESHLOAD_ASSIGN_OR_RETURN(std::string token, ReadFile(cfg.token_file, "the service account token"));
  (void)token;
  MESHLOAD_ASSIGN_OR_RETURN(cfg.ca_pem, ReadFile(dir + "/ca.crt", "the cluster CA"));
  auto ns = ReadFile(dir + "/namespace", "the namespace");
  if (ns.ok()) {
    std::string n = *ns;
    while (!n.empty() && (n.back() == '\n' || n.back() == ' ')) n.pop_back();
    if (!n.empty()) cfg.namespace_ = n;
  }
  return cfg;
}

Result<ClusterConfig> LoadClusterConfig(const std::string& kubeconfig_flag) {
  if (!kubeconfig_flag.empty()) return LoadKubeconfig(kubeconfig_flag);
  if (const char* env = std::getenv("KUBECONFIG"); env != nullptr && *env != '\0') {
    std::stringstream ss(env);
    std::string item;
    while (std::getline(ss, item, ':')) {
      if (!item.empty() && fs::exists(item)) return LoadKubeconfig(item);
    }
    return NotFound("no file named in KUBECONFIG exists", env);
  }
  if (const char* host = std::getenv("KUBERNETES_SERVICE_HOST"); host != nullptr && *host != '\0') {
    return InClusterConfig();
  }
  if (const char* home = std::getenv("HOME"); home != nullptr) {
    std::string path = std::string(home) + "/.kube/config";
    if (fs::exists(path)) return LoadKubeconfig(path);
  }
  return FailedPrecondition("no cluster configuration: pass --kubeconfig, set KUBECONFIG, or run in a pod");
}

}  // namespace meshload::controller::kube
