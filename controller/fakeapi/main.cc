// fake-apiserver: the in-memory Kubernetes API server as a program, for
// running a controller binary, or kubectl (discovery and OpenAPI are served),
// against it.
//
//   fake-apiserver --port 0 --kubeconfig-out /tmp/kubeconfig
//
// prints the port on stdout, writes a kubeconfig pointing at the server and
// serves until SIGTERM or SIGINT.

#include <csignal>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "common/base64.h"
#include "common/flags.h"
#include "common/logging.h"
#include "controller/fakeapi/fake_apiserver.h"

namespace {

constexpr char kUsage[] =
    "usage: fake-apiserver [--port N] [--kubeconfig-out FILE] [--history-limit N] [--tls]\n"
    "                      [--token T]\n"
    "  --port N            port on 127.0.0.1 (0, the default: an ephemeral port)\n"
    "  --kubeconfig-out F  write a kubeconfig for the server to F\n"
    "  --history-limit N   watch/list events kept before 410 Gone (default 200)\n"
    "  --tls               serve HTTPS with a CA made at start-up; the kubeconfig\n"
    "                      carries the CA (certificate-authority-data)\n"
    "  --token T           require `Authorization: Bearer T` (401 otherwise); the\n"
    "                      kubeconfig carries it (default: no authentication)\n";

bool WriteKubeconfig(const std::string& path, const std::string& url, const std::string& ca_pem,
                     const std::string& token) {
  std::ofstream out(path);
  out << "apiVersion: v1\n"
         "kind: Config\n"
         "clusters:\n"
         "- name: fake\n"
         "  cluster:\n"
         "    server: "
      << url << "\n";
  if (!ca_pem.empty()) out << "    certificate-authority-data: " << meshload::Base64Encode(ca_pem) << "\n";
  out << "users:\n"
         "- name: fake\n"
         "  user:\n"
         "    token: "
      << (token.empty() ? "fake-token" : token)
      << "\n"
         "contexts:\n"
         "- name: fake\n"
         "  context:\n"
         "    cluster: fake\n"
         "    user: fake\n"
         "    namespace: default\n"
         "current-context: fake\n";
  out.close();
  return static_cast<bool>(out);
}

}  // namespace

int main(int argc, char** argv) {
  using meshload::cli::FlagParser;
  int64_t port = 0;
  int64_t history = 200;
  std::string kubeconfig, token;
  bool tls = false;
  FlagParser flags("", kUsage, "fake-apiserver");
  flags.Int({"--port"}, &port);
  flags.Int({"--history-limit"}, &history);
  flags.String({"--kubeconfig-out"}, &kubeconfig);
  flags.String({"--token"}, &token);
  flags.Bool({"--tls"}, &tls);
  int rc = flags.Parse(std::vector<std::string>(argv + 1, argv + argc));
  if (rc >= 0) return rc;
  if (port < 0 || port > 65535)
    return meshload::cli::UsageError("--port must be 0..65535", "fake-apiserver");
  if (history < 1)
    return meshload::cli::UsageError("--history-limit must be positive", "fake-apiserver");
  (void)meshload::ConfigureLoggingFromEnv();

  // Block the signals before any thread starts so that only sigwait sees them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  meshload::fakeapi::FakeApiServerOptions options;
  options.port = static_cast<int>(port);
  options.history_limit = static_cast<size_t>(history);
  options.tls = tls;
  if (!token.empty()) options.bearer_tokens.push_back(token);
  meshload::fakeapi::FakeApiServer server(options);
  meshload::Status st = server.Start();
  if (!st.ok()) {
    std::cerr << "fake-apiserver: " << st.ToString() << "\n";
    return 1;
  }
  if (!kubeconfig.empty() && !WriteKubeconfig(kubeconfig, server.url(), server.ca_pem(), token)) {
    std::cerr << "fake-apiserver: " << kubeconfig << ": cannot write the kubeconfig\n";
    return 1;
  }
  std::cout << server.port() << std::endl;
  int sig = 0;
  sigwait(&signals, &sig);
  server.Stop();
  return 0;
}
