#include "controller/reconcile_context.h"

namespace meshload::controller {

kube::ResourcePath JobsResource() { return {"/apis/meshload.io/v1alpha1", "dataloadjobs"}; }
kube::ResourcePath PodsResource() { return {"/api/v1", "pods"}; }
kube::ResourcePath ConfigMapsResource() { return {"/api/v1", "configmaps"}; }
kube::ResourcePath SecretsResource() { return {"/api/v1", "secrets"}; }
std::string PeerSecretName(const std::string& job) { return job + "-meshload-peer"; }

std::optional<std::string> JobMemory::MadeSecret(const std::string& key, const std::string& job_uid) const {
  MutexLock lock(secrets_mu_);
  auto it = secrets_made_.find(key);
  if (it == secrets_made_.end() || it->second.job_uid != job_uid) return std::nullopt;
  return it->second.secret_uid;
}

void JobMemory::RememberSecret(const std::string& key, std::string job_uid, std::string secret_uid) {
  MutexLock lock(secrets_mu_);
  secrets_made_[key] = {std::move(job_uid), std::move(secret_uid)};
}

void JobMemory::ForgetSecret(const std::string& key) {
  MutexLock lock(secrets_mu_);
  secrets_made_.erase(key);
}

bool JobMemory::ProgressDue(const std::string& key, std::chrono::milliseconds min_interval) const {
  MutexLock lock(progress_mu_);
  auto it = progress_written_.find(key);
  return it == progress_written_.end() || std::chrono::steady_clock::now() - it->second >= min_interval;
}

void JobMemory::ProgressWritten(const std::string& key) {
  MutexLock lock(progress_mu_);
  progress_written_[key] = std::chrono::steady_clock::now();
}

void JobMemory::Forget(const std::string& key) {
  {
    MutexLock lock(progress_mu_);
    progress_written_.erase(key);
  }
  ForgetSecret(key);
}

Status ReconcileContext::CheckMayWrite() const {
  if (options->may_write && !options->may_write()) {
    return FailedPrecondition("not the leader: no writes");
  }
  return Status::Ok();
}

}  // namespace meshload::controller
