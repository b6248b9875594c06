#include "tests/testing/control_plane.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "common/base64.h"
#include "tests/testing/wait.h"

extern char** environ;

namespace meshload::testing {
namespace {

using Clock = std::chrono::steady_clock;

std::string Slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

bool Exists(const std::string& path) { return ::access(path.c_str(), F_OK) == 0; }

// Spawns argv with stdout and stderr to `log`; the child gets `pdeathsig`
// through setpriv, so it ends with this process.
Result<pid_t> Spawn(std::vector<std::string> argv, const std::string& log, const char* pdeathsig) {
  std::vector<std::string> args = {"setpriv", "--pdeathsig", pdeathsig};
  args.insert(args.end(), argv.begin(), argv.end());
  std::vector<char*> cargv;
  for (auto& a : args) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  pid_t pid = -1;
  const int rc = ::posix_spawnp(&pid, "setpriv", &fa, nullptr, cargv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) return Status(StatusCode::kInternal, "cannot start " + argv[0] + ": " + std::strerror(rc));
  return pid;
}

void StopProcess(pid_t pid, std::chrono::seconds grace) {
  if (pid <= 0) return;
  ::kill(pid, SIGTERM);
  if (WaitFor([&] { return ::waitpid(pid, nullptr, WNOHANG) == pid; }, grace, std::chrono::milliseconds(50))) return;
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
}

std::string Field(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

}  // namespace

ControlPlane& ControlPlane::Get() {
  static std::unique_ptr<ControlPlane> cp;
  static std::once_flag once;
  std::call_once(once, [] {
    // As meshload-controller does (controller/kube/client.h): a write to a
    // connection the server closed is an error, not the end of the program.
    ::signal(SIGPIPE, SIG_IGN);
    cp.reset(new ControlPlane());
    Status st = cp->Start();
    if (!st.ok()) {
      std::fprintf(stderr, "control plane: %s\n", st.ToString().c_str());
      std::fflush(stderr);
      cp->Stop();
      std::_Exit(1);  // nothing can run without it
    }
  });
  return *cp;
}

Status ControlPlane::Start() {
  char tmpl[] = "/tmp/meshload-cp-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) return Status(StatusCode::kInternal, "mkdtemp failed");
  dir_ = tmpl;
  const std::string root = MESHLOAD_SOURCE_DIR;
  const auto t0 = Clock::now();
  MESHLOAD_ASSIGN_OR_RETURN(supervisor_,
                            Spawn({root + "/scripts/control-plane", "run", dir_}, dir_ + "/supervisor.log", "TERM"));
  bool exited = false;  // (and reaped)
  (void)WaitFor(
      [&] {
        if (Exists(dir_ + "/ready") || Exists(dir_ + "/failed")) return true;
        exited = ::waitpid(supervisor_, nullptr, WNOHANG) == supervisor_;
        return exited;
      },
      std::chrono::seconds(90), std::chrono::milliseconds(100));
  if (exited) supervisor_ = -1;
  if (exited || !Exists(dir_ + "/ready")) {
    if (Exists(dir_ + "/failed")) return Status(StatusCode::kUnavailable, Slurp(dir_ + "/failed"));
    if (exited) {
      return Status(StatusCode::kUnavailable,
                    "scripts/control-plane exited before it was ready: " + Slurp(dir_ + "/supervisor.log"));
    }
    return Status(StatusCode::kDeadlineExceeded, "the control plane was not ready within 90 s (see " + dir_ + "/logs)");
  }
  std::istringstream ports(Slurp(dir_ + "/ports"));
  std::string name;
  int port = 0;
  while (ports >> name >> port) ports_[name] = port;
  server_ = "https://127.0.0.1:" + std::to_string(ports_["apiserver"]);
  ca_pem_ = Slurp(dir_ + "/pki/ca.crt");
  bin_dir_ = std::filesystem::read_symlink(dir_ + "/bin/kubectl").parent_path().string();
  std::fprintf(stderr, "[ control plane ] ready in %lld ms in %s (kube-apiserver %s)\n",
               static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count()),
               dir_.c_str(), server_.c_str());
  return Status::Ok();
}

void ControlPlane::Stop() {
  StopProcess(supervisor_, std::chrono::seconds(20));
  supervisor_ = -1;
  if (!dir_.empty() && std::getenv("MESHLOAD_KEEP_CONTROL_PLANE") == nullptr) {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
}

ControlPlane::~ControlPlane() { Stop(); }

int ControlPlane::port(const std::string& component) const {
  auto it = ports_.find(component);
  return it == ports_.end() ? 0 : it->second;
}

controller::kube::ClusterConfig ControlPlane::AdminConfig() const {
  controller::kube::ClusterConfig c;
  c.server = server_;
  c.ca_pem = ca_pem_;
  c.client_cert_pem = Slurp(dir_ + "/pki/admin.crt");
  c.client_key_pem = Slurp(dir_ + "/pki/admin.key");
  c.origin = "test control plane (admin)";
  return c;
}

controller::kube::ClusterConfig ControlPlane::UserConfig(const std::string& name,
                                                         const std::vector<std::string>& groups) const {
  std::lock_guard lock(mu_);
  auto it = certs_.find(name);
  if (it == certs_.end()) {
    static std::atomic<int> counter{0};
    const std::string base = dir_ + "/pki/user-" + std::to_string(counter++);
    std::string subject;
    for (const auto& g : groups) subject += "/O=" + g;
    subject += "/CN=" + name;
    std::ofstream(base + ".ext") << "extendedKeyUsage=clientAuth\nkeyUsage=critical,digitalSignature\n";
    const std::string cmd = "openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout '" + base +
                            ".key' -out '" + base + ".csr' -subj '" + subject +
                            "' 2>/dev/null && openssl x509 -req -in '" + base + ".csr' -CA '" + dir_ +
                            "/pki/ca.crt' -CAkey '" + dir_ + "/pki/ca.key' -CAcreateserial -out '" + base +
                            ".crt' -days 30 -extfile '" + base + ".ext' 2>/dev/null";
    if (std::system(cmd.c_str()) != 0) ADD_FAILURE() << "cannot make a client certificate for " << name;
    it = certs_.emplace(name, std::make_pair(Slurp(base + ".crt"), Slurp(base + ".key"))).first;
  }
  controller::kube::ClusterConfig c;
  c.server = server_;
  c.ca_pem = ca_pem_;
  c.client_cert_pem = it->second.first;
  c.client_key_pem = it->second.second;
  c.origin = "test control plane (" + name + ")";
  return c;
}

std::vector<AuditEvent> ControlPlane::Audit(const std::function<bool(const AuditEvent&)>& match) const {
  std::lock_guard lock(mu_);
  std::ifstream f(dir_ + "/logs/audit.log", std::ios::binary);
  f.seekg(static_cast<std::streamoff>(audit_offset_));
  std::string line;
  while (std::getline(f, line)) {
    if (f.eof()) break;  // a line still being written: read it next time
    audit_offset_ += line.size() + 1;
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) continue;
    const std::string stage = Field(j, "stage");
    if (stage != "ResponseComplete" && stage != "ResponseStarted" && stage != "Panic") continue;
    AuditEvent e;
    e.audit_id = Field(j, "auditID");
    e.verb = Field(j, "verb");
    e.user_agent = Field(j, "userAgent");
    if (j.contains("impersonatedUser") && j["impersonatedUser"].is_object()) {
      e.user = Field(j["impersonatedUser"], "username");
    } else if (j.contains("user")) {
      e.user = Field(j["user"], "username");
    }
    if (j.contains("objectRef") && j["objectRef"].is_object()) {
      const auto& o = j["objectRef"];
      e.resource = Field(o, "resource");
      e.api_group = Field(o, "apiGroup");
      e.subresource = Field(o, "subresource");
      e.namespace_ = Field(o, "namespace");
      e.name = Field(o, "name");
    }
    if (stage == "ResponseComplete" && j.contains("responseStatus") && j["responseStatus"].contains("code")) {
      e.code = j["responseStatus"]["code"].get<int>();
    }
    auto at = audit_index_.find(e.audit_id);
    if (at == audit_index_.end()) {
      audit_index_[e.audit_id] = audit_.size();
      audit_.push_back(std::move(e));
    } else if (e.code != 0) {
      audit_[at->second].code = e.code;  // a watch that ended
    }
  }
  std::vector<AuditEvent> out;
  for (const auto& e : audit_) {
    if (!match || match(e)) out.push_back(e);
  }
  return out;
}

Status ControlPlane::Compact() const {
  httplib::Client etcd("127.0.0.1", port("etcd"));
  etcd.set_read_timeout(10, 0);
  auto r = etcd.Post("/v3/kv/range", R"({"key":"AA==","limit":1})", "application/json");
  if (!r || r->status != 200) return Status(StatusCode::kUnavailable, "etcd range failed");
  auto body = nlohmann::json::parse(r->body, nullptr, false);
  if (body.is_discarded()) return Status(StatusCode::kInternal, "etcd range: not JSON");
  const std::string revision = body["header"]["revision"].get<std::string>();
  auto c = etcd.Post("/v3/kv/compaction", nlohmann::json{{"revision", revision}, {"physical", true}}.dump(),
                     "application/json");
  if (!c || c->status != 200) {
    return Status(StatusCode::kUnavailable, "etcd compaction failed: " + (c ? c->body : std::string("no answer")));
  }
  return Status::Ok();
}

nlohmann::json TrainerPod(const std::string& ns, const std::string& name, const std::string& app,
                          const std::map<std::string, std::string>& annotations) {
  nlohmann::json pod = {
      {"apiVersion", "v1"},
      {"kind", "Pod"},
      {"metadata", {{"name", name}, {"namespace", ns}, {"labels", {{"app", app}}}}},
      {"spec",
       {{"containers", nlohmann::json::array({{{"name", "trainer"}, {"image", "trainer:1"}},
                                              {{"name", "meshload-sidecar"}, {"image", "meshload/sidecar:0.1.0"}}})}}}};
  if (!annotations.empty()) pod["metadata"]["annotations"] = annotations;
  return pod;
}

nlohmann::json RunningPodStatus(const std::string& ip, bool sidecar_ready, int restarts) {
  auto container = [](const char* name, const char* image, bool ready, int restart_count) {
    return nlohmann::json{{"name", name},
                          {"image", image},
                          {"imageID", ""},
                          {"ready", ready},
                          {"restartCount", restart_count},
                          {"state", {{"running", nlohmann::json::object()}}}};
  };
  return {{"status",
           {{"phase", "Running"},
            {"podIP", ip},
            {"podIPs", nlohmann::json::array({{{"ip", ip}}})},
            {"containerStatuses", nlohmann::json::array({container("trainer", "trainer:1", true, 0),
                                                         container("meshload-sidecar", "meshload/sidecar:0.1.0",
                                                                   sidecar_ready, restarts)})}}}};
}

void WriteKubeconfig(const std::string& path, const controller::kube::ClusterConfig& config) {
  std::ofstream out(path);
  out << "apiVersion: v1\nkind: Config\ncurrent-context: test\n"
      << "clusters:\n- name: test\n  cluster:\n    server: " << config.server << "\n";
  if (!config.ca_pem.empty()) out << "    certificate-authority-data: " << Base64Encode(config.ca_pem) << "\n";
  out << "users:\n- name: tester\n  user:\n";
  if (!config.client_cert_pem.empty()) {
    out << "    client-certificate-data: " << Base64Encode(config.client_cert_pem) << "\n"
        << "    client-key-data: " << Base64Encode(config.client_key_pem) << "\n";
  } else {
    out << "    token: " << config.bearer_token << "\n";
  }
  out << "contexts:\n- name: test\n  context: {cluster: test, user: tester, namespace: " << config.namespace_ << "}\n";
}

FaultProxy::FaultProxy(ControlPlane& cp) {
  static std::atomic<int> counter{0};
  const std::string ready = cp.dir() + "/faultproxy-" + std::to_string(counter++) + ".ready";
  auto pid = Spawn(
      {cp.bin_dir() + "/faultproxy", "--upstream", cp.server(), "--pki", cp.dir() + "/pki", "--ready-file", ready},
      cp.dir() + "/logs/faultproxy.log", "KILL");
  if (!pid.ok()) {
    ADD_FAILURE() << pid.status().ToString();
    return;
  }
  pid_ = *pid;
  std::string proxy, admin;
  const bool started = WaitFor(
      [&] {
        std::istringstream addrs(Exists(ready) ? Slurp(ready) : "");
        return static_cast<bool>(addrs >> proxy >> admin);
      },
      std::chrono::seconds(20), std::chrono::milliseconds(20));
  if (!started) {
    ADD_FAILURE() << "faultproxy did not start (see " << cp.dir() << "/logs/faultproxy.log)";
    return;
  }
  url_ = "https://" + proxy;
  admin_host_ = admin.substr(0, admin.rfind(':'));
  admin_port_ = std::stoi(admin.substr(admin.rfind(':') + 1));
}

FaultProxy::~FaultProxy() { StopProcess(pid_, std::chrono::seconds(5)); }

controller::kube::ClusterConfig FaultProxy::Through(controller::kube::ClusterConfig base) const {
  base.server = url_;
  base.origin += " through the fault proxy";
  return base;
}

std::string FaultProxy::Admin(const std::string& method, const std::string& path) {
  httplib::Client c(admin_host_, admin_port_);
  auto r = method == "POST" ? c.Post(path) : c.Get(path);
  if (!r || r->status != 200) {
    ADD_FAILURE() << "faultproxy " << method << " " << path << ": " << (r ? r->body : std::string("no answer"));
    return "";
  }
  return r->body;
}

void FaultProxy::InjectErrors(const std::string& path_prefix, int status, int count, int retry_after_seconds) {
  Admin("POST", "/inject?prefix=" + httplib::detail::encode_query_param(path_prefix) +
                    "&status=" + std::to_string(status) + "&count=" + std::to_string(count) +
                    "&retryAfter=" + std::to_string(retry_after_seconds));
}
void FaultProxy::ClearInjectedErrors() { Admin("POST", "/clear"); }
int FaultProxy::InjectedErrorsPending() { return std::atoi(Admin("GET", "/pending").c_str()); }
void FaultProxy::SetLatency(std::chrono::milliseconds latency) {
  Admin("POST", "/latency?ms=" + std::to_string(latency.count()));
}
void FaultProxy::CloseAllWatches() { Admin("POST", "/cut-watches"); }
int64_t FaultProxy::WatchesBegun() { return std::atoll(Admin("GET", "/watches").c_str()); }

}  // namespace meshload::testing
