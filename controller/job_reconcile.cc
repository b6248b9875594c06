#include "controller/job_reconcile.h"

#include <openssl/evp.h>
#include <sys/random.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "common/base64.h"
#include "common/diagnostics.h"
#include "common/logging.h"
#include "common/mutex.h"
#include "controller/kube/json_fields.h"
#include "controller/kube/label_selector.h"
#include "planner/job_files.h"

namespace meshload::controller {
namespace {

using nlohmann::json;

using kube::Field;
using kube::Str;

std::string Sha256Hex(const std::string& data, size_t hex_chars) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(data.data(), data.size(), md, &len, EVP_sha256(), nullptr);
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned i = 0; i < len && out.size() < hex_chars; ++i) {
    out += kHex[md[i] >> 4];
    out += kHex[md[i] & 15];
  }
  return out;
}

std::string ConfigMapName(const std::string& job) { return job + "-meshload"; }

// 32 bytes from the kernel's CSPRNG, as 64 hex digits (what
// `openssl rand -hex 32` gives; the sidecar takes the file's text as is).
Result<std::string> NewPeerSecret() {
  unsigned char bytes[32];
  size_t got = 0;
  while (got < sizeof bytes) {
    ssize_t n = ::getrandom(bytes + got, sizeof bytes - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return Status(StatusCode::kInternal, std::string("getrandom: ") + std::strerror(errno), "peer secret");
    got += static_cast<size_t>(n);
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned char b : bytes) {
    out += kHex[b >> 4];
    out += kHex[b & 15];
  }
  return out;
}

std::string JoinDiagnostics(const Diagnostics& d) {
  std::string s = d.ToString();
  while (!s.empty() && s.back() == '\n') s.pop_back();
  return s;
}

}  // namespace

JobReconcile::JobReconcile(ReconcileContext context, std::string key, std::string ns, std::string name, json job,
                           ReconcileResult& result)
    : ctx_(context),
      key_(std::move(key)),
      ns_(std::move(ns)),
      name_(std::move(name)),
      cm_name_(ConfigMapName(name_)),
      res_(result) {
  SetJob(std::move(job));
}

void JobReconcile::SetJob(json job) {
  job_ = std::move(job);
  meta_ = kube::MetadataOf(job_);
  status_ = JobStatus::FromJson(Field(job_, "status"));
}

json JobReconcile::JobWith(const kube::ObjectMeta& meta) const {
  json body = job_;
  body["metadata"] = meta.ToJson();
  body.erase("status");
  return body;
}

Status JobReconcile::Run() {
  if (meta_.being_deleted()) return Finalize();
  MESHLOAD_ASSIGN_OR_RETURN(const bool exists, EnsureFinalizer());
  if (!exists) return Status::Ok();
  generation_ = meta_.generation;
  RecordedPeerSecret();
  if (Validate()) {
    MESHLOAD_RETURN_IF_ERROR(ReadConfigMap());
    ReadTrainerJobs();
    AssignProcesses();
    CheckReadiness();
    if (suspended_jobs_.empty()) {
      ReadProgress();
    } else {
      desired_.progress = status_.progress;  // as the trainers left it: no pods to poll
    }
    MESHLOAD_RETURN_IF_ERROR(ApplyConfigMap(ConfigMapData()));
    MESHLOAD_RETURN_IF_ERROR(EnsurePeerSecret());
    SetConditions();
  }
  res_.phase = desired_.phase;
  return WriteStatus();
}

Status JobReconcile::Finalize() {
  if (!meta_.HasFinalizer(kFinalizer)) return Status::Ok();
  MESHLOAD_RETURN_IF_ERROR(ctx_.CheckMayWrite());
  if (ctx_.configmaps->Get(ns_, cm_name_)) {
    kube::ApiResponse del = ctx_.client->Delete(ConfigMapsResource().Object(ns_, cm_name_));
    if (!del.ok() && del.code != 404) return del.ToStatus("delete ConfigMap " + ns_ + "/" + cm_name_);
    ++res_.writes;
  }
  // The peer secret this controller made, by its uid (never one it found:
  // the user's own is left alone). Deleted before the job goes, so a job
  // re-created under the same name at once does not find it still there,
  // waiting for garbage collection, and take it for its own. By name with
  // a uid precondition, never by label (deletecollection answers with the
  // Secrets it deleted, data included: the controller reads no Secret).
  std::string secret_uid = status_.peer_secret_uid;
  if (secret_uid.empty()) secret_uid = ctx_.memory->MadeSecret(key_, meta_.uid).value_or("");
  if (!secret_uid.empty()) {
    const std::string secret_name = PeerSecretName(name_);
    kube::ApiResponse del =
        ctx_.client->Delete(SecretsResource().Object(ns_, secret_name), kube::DeleteOptions{secret_uid}.ToJson());
    // 404: gone already; 409: the uid differs, someone else's now.
    if (!del.ok() && del.code != 404 && del.code != 409) {
      return del.ToStatus("delete Secret " + ns_ + "/" + secret_name);
    }
    if (del.ok()) ++res_.writes;
  }
  kube::ObjectMeta meta = meta_;
  std::erase(meta.finalizers, std::string(kFinalizer));
  kube::ApiResponse put = ctx_.client->Put(JobsResource().Object(ns_, name_), JobWith(meta));
  if (put.code == 404) return Status::Ok();
  if (!put.ok()) return put.ToStatus("remove the finalizer of " + key_);
  ++res_.writes;
  ctx_.memory->ForgetSecret(key_);
  LogInfo("cleaned up a deleted DataLoadJob", {{"job", key_}});
  return Status::Ok();
}

Result<bool> JobReconcile::EnsureFinalizer() {
  if (meta_.HasFinalizer(kFinalizer)) return true;
  MESHLOAD_RETURN_IF_ERROR(ctx_.CheckMayWrite());
  kube::ObjectMeta meta = meta_;
  meta.finalizers.push_back(kFinalizer);
  kube::ApiResponse put = ctx_.client->Put(JobsResource().Object(ns_, name_), JobWith(meta));
  if (put.code == 404) return false;
  if (!put.ok()) return put.ToStatus("add the finalizer to " + key_);
  ++res_.writes;
  SetJob(std::move(put.body));
  return true;
}

void JobReconcile::RecordedPeerSecret() {
  // Once created, the peer secret stays in the status (an invalid edit
  // does not take it away).
  desired_.peer_secret = status_.peer_secret_name;
  desired_.peer_secret_uid = status_.peer_secret_uid;
  // Made, and its status write lost (a conflict, a lagging cache): the
  // status gets it now, whether or not this generation is valid.
  if (desired_.peer_secret != PeerSecretName(name_)) {
    if (std::optional<std::string> made = ctx_.memory->MadeSecret(key_, meta_.uid)) {
      desired_.peer_secret = PeerSecretName(name_);
      desired_.peer_secret_uid = *made;
    }
  }
}

bool JobReconcile::Validate() {
  // The job, loaded from the informer's object and validated once; the
  // controller also needs a selector (it names the trainer pods) and plans
  // from spec.dataset.samples, reading no data.
  Diagnostics diags;
  auto job = planner::LoadJobObject(job_, diags);
  if (job.ok() && !job->spec().selector) {
    diags.Add(InvalidArgument("a selector is required: it names the trainer pods", "spec.selector"));
  }
  bool sized = job.ok() && job->spec().dataset.samples;
  if (job.ok() && job->spec().mixture) {
    sized = true;  // a mixture is sized by each of its datasets
    for (const planner::MixtureDataset& m : job->spec().mixture->datasets) sized = sized && m.samples;
  }
  if (job.ok() && diags.ok() && sized) {
    planner::ResolveOptions ro;
    if (!job->spec().mixture) ro.samples = job->spec().dataset.samples;
    auto r = planner::ResolveJob(*job, ro, diags);
    if (r.ok() && diags.ok()) resolved_ = std::move(*r);
  }
  if (!job.ok() || !diags.ok()) {
    std::string msg = diags.ok() ? job.status().ToString() : JoinDiagnostics(diags);
    if (msg.empty()) msg = "the spec is invalid";
    desired_.phase = "Failed";
    desired_.conditions = {{"Valid", "False", "InvalidSpec", msg},
                           {"Planned", "False", "InvalidSpec", "the spec must be valid first"},
                           {"SidecarsReady", "Unknown", "InvalidSpec", "the spec must be valid first"},
                           {"Degraded", "False", "InvalidSpec", ""}};
    return false;
  }
  spec_ = job->spec();
  processes_ = spec_->mesh.processes;
  return true;
}

Status JobReconcile::ReadConfigMap() {
  // The ConfigMap holds the assignment every later one must keep. The
  // cache holds only ConfigMaps labelled as ours and may lag behind our
  // own create (its watch event not here yet): when it has none, the
  // server is asked, so that a lagging cache never makes a fresh
  // assignment that renumbers running trainers. Somebody else's of that
  // name is left alone (ConfigMapConflict).
  if (kube::ObjectPtr cached = ctx_.configmaps->Get(ns_, cm_name_)) {
    cm_ = kube::ConfigMap::FromJson(*cached);
    return Status::Ok();
  }
  kube::ApiResponse got = ctx_.client->Get(ConfigMapsResource().Object(ns_, cm_name_));
  if (got.ok()) {
    kube::ConfigMap there = kube::ConfigMap::FromJson(got.body);
    if (there.metadata.ControllerUid() == meta_.uid) {
      cm_ = std::move(there);
    } else {
      foreign_ = true;
    }
  } else if (got.code != 404) {
    return got.ToStatus("read ConfigMap " + ns_ + "/" + cm_name_);
  }
  return Status::Ok();
}

void JobReconcile::AssignProcesses() {
  for (const auto& object : ctx_.pods->List(ns_)) {
    kube::Pod pod = kube::Pod::FromJson(*object);
    if (pod.finished() || pod.metadata.being_deleted()) continue;
    if (kube::SelectorMatches(*spec_->selector, pod.metadata.labels)) pods_.push_back(std::move(pod));
  }
  // Oldest first, then by name: a deterministic order for fresh assignments.
  std::sort(pods_.begin(), pods_.end(), [](const kube::Pod& a, const kube::Pod& b) {
    const auto& ta = a.metadata.creation_timestamp;
    const auto& tb = b.metadata.creation_timestamp;
    return ta != tb ? ta < tb : a.metadata.name < b.metadata.name;
  });
  // The assignment recorded before: every entry that can be read (none
  // without a ConfigMap).
  std::map<std::string, planner::PodAssignment> previous;
  if (cm_) previous = planner::Assignments::ReadLeniently(cm_->Data("assignments.json")).pods;
  by_index_.assign(static_cast<size_t>(processes_), nullptr);
  std::vector<const kube::Pod*> waiting;
  for (const auto& p : pods_) {
    // A JobSet's pod: its Job's place in the JobSet plus its completion
    // index; else the completion index of an Indexed Job's pod.
    std::string jobset_problem;
    std::optional<int64_t> ci = JobSetProcessIndex(p, trainer_jobs_, &jobset_problem);
    if (!jobset_problem.empty()) {
      problems_.push_back(jobset_problem);
      continue;
    }
    if (!ci) ci = p.CompletionIndex();
    if (!ci) {
      waiting.push_back(&p);
      continue;
    }
    if (*ci < 0 || *ci >= processes_) {
      problems_.push_back("CompletionIndexOutOfRange: pod " + p.metadata.name + " has completion index " +
                          (*ci < 0 ? std::string("that is not a number") : std::to_string(*ci)) + " but the job has " +
                          std::to_string(processes_) + " processes");
      continue;
    }
    if (by_index_[*ci] != nullptr) {
      problems_.push_back("DuplicateCompletionIndex: pods " + by_index_[*ci]->metadata.name + " and " +
                          p.metadata.name + " both have completion index " + std::to_string(*ci));
      continue;
    }
    by_index_[*ci] = &p;
  }
  std::vector<const kube::Pod*> fresh;
  for (const kube::Pod* p : waiting) {
    auto prev = previous.find(p->metadata.name);
    if (prev != previous.end() && prev->second.uid == p->metadata.uid) {
      const int64_t i = prev->second.index;  // recorded for the job's size then
      if (i < processes_ && by_index_[i] == nullptr) {
        by_index_[i] = p;
        continue;
      }
    }
    fresh.push_back(p);
  }
  std::vector<std::string> extra;
  size_t next_free = 0;
  for (const kube::Pod* p : fresh) {
    while (next_free < by_index_.size() && by_index_[next_free] != nullptr) ++next_free;
    if (next_free == by_index_.size()) {
      extra.push_back(p->metadata.name);
      continue;
    }
    by_index_[next_free] = p;
  }
  if (!extra.empty()) {
    std::string names;
    for (const auto& e : extra) names += (names.empty() ? "" : ", ") + e;
    problems_.push_back("TooManyPods: " + std::to_string(pods_.size()) + " pods match the selector but the job has " +
                        std::to_string(processes_) + " processes; not assigned: " + names);
  }
}

void JobReconcile::CheckReadiness() {
  for (int64_t i = 0; i < processes_; ++i) {
    const kube::Pod* p = by_index_[i];
    if (p == nullptr) {
      missing_.push_back(i);
      continue;
    }
    const kube::ContainerStatus* sc = p->StatusOf(ctx_.options->sidecar_container);
    if (sc != nullptr && sc->ready) {
      ++desired_.processes_ready;
    } else {
      not_ready_.push_back(i);
      if (sc != nullptr && sc->restart_count > 0) {
        problems_.push_back("SidecarRestarting: the sidecar of process " + std::to_string(i) + " (pod " +
                            p->metadata.name + ") restarted " + std::to_string(sc->restart_count) +
                            " times and is not ready");
      }
    }
  }
}

void JobReconcile::ReadTrainerJobs() {
  if (ctx_.trainer_jobs == nullptr) return;
  trainer_jobs_ = TrainerJobsOf(*ctx_.trainer_jobs, ns_, Field(Field(job_, "spec"), "selector"));
  for (auto& p : TrainerJobProblems(trainer_jobs_, processes_)) problems_.push_back(std::move(p));
  suspended_jobs_ = TrainerJobNames(true);
}

std::string JobReconcile::TrainerJobNames(bool suspended_only) const {
  std::string names;
  int n = 0;
  for (const auto& t : trainer_jobs_) {
    if (t.finished || (suspended_only && !t.suspended)) continue;
    names += (n++ == 0 ? "" : ", ") + ns_ + "/" + t.metadata.name;
  }
  return n == 0 ? "" : (n == 1 ? "batch/v1 Job " : "batch/v1 Jobs ") + names;
}

void JobReconcile::ReadProgress() {
  // Progress (the sidecars' /progress, polled by the ProgressPoller) and
  // the step a restarted or resized job resumes at: resume.json, which
  // the sidecars read at start next to job.json.
  if (!ctx_.options->progress) return;
  std::optional<JobProgress> poll = ctx_.options->progress(key_);
  if (!poll) return;
  const HealthThresholds thresholds{spec_->health.starved_wait_percent, spec_->health.straggler_steps,
                                    spec_->health.straggler_latency_factor};
  const json fresh = ProgressStatus(*poll, spec_->batch.global_batch_size, thresholds, status_.progress);
  const bool moves_due = ctx_.memory->ProgressDue(key_, ctx_.options->progress_min_write_interval);
  desired_.progress = ProgressToWrite(status_.progress, fresh, ctx_.options->progress_step_granularity, moves_due);
  progress_conditions_ = ProgressConditions(*poll, thresholds, status_.conditions);
}

int64_t JobReconcile::ResumeStep() const {
  const int64_t spec_resume = spec_->resume.step;
  if (desired_.progress.is_object() && Field(desired_.progress, "resumeStep").is_number_integer()) {
    return Field(desired_.progress, "resumeStep").get<int64_t>();
  }
  if (cm_) {
    // No fresh figure: keep the recorded one, unless spec.resume.step was
    // changed since it was recorded (then the spec says where to start).
    auto recorded = planner::ResumeRecord::Parse(cm_->Data("resume.json"), "resume.json");
    if (recorded.ok() && recorded->spec_step == spec_resume) return recorded->step;
  }
  return spec_resume;
}

kube::StringMap JobReconcile::ConfigMapData() {
  json manifest = {{"apiVersion", "meshload.io/v1alpha1"},
                   {"kind", "DataLoadJob"},
                   {"metadata", {{"name", name_}, {"namespace", ns_}}},
                   {"spec", Field(job_, "spec")}};
  const std::string job_text = manifest.dump(2) + "\n";
  desired_.plan_hash = Sha256Hex(job_text, 16);
  planner::Assignments assignments;
  assignments.processes = processes_;
  kube::StringMap data;
  std::string rendezvous;
  for (int64_t i = 0; i < processes_; ++i) {
    const kube::Pod* p = by_index_[i];
    if (p == nullptr) continue;
    assignments.pods[p->metadata.name] = {p->metadata.uid, i, p->pod_ip};
    data["process." + p->metadata.name] = std::to_string(i);
    if (i == 0) rendezvous = p->pod_ip;
  }
  if (resolved_) assignments.samples = resolved_->samples;
  data["job.json"] = job_text;
  data["assignments.json"] = assignments.ToJson().dump(2) + "\n";
  data["planHash"] = desired_.plan_hash;
  data["rendezvous"] = rendezvous;
  data["resume.json"] = planner::ResumeRecord{ResumeStep(), spec_->resume.step}.ToJson().dump() + "\n";
  return data;
}

void JobReconcile::ConfigMapConflict() {
  // Somebody else's: left alone. The job says so and is retried.
  problems_.push_back("ConfigMapConflict: ConfigMap " + ns_ + "/" + cm_name_ +
                      " exists and was not made for this job (no controller reference to it); the trainer "
                      "pods mount that name: rename or delete it");
  deferred_ =
      Status(StatusCode::kUnavailable, "ConfigMap " + ns_ + "/" + cm_name_ + " belongs to something else", key_);
}

void JobReconcile::ConfigMapFailed(const Status& error) {
  problems_.push_back("ConfigMapFailed: " + error.ToString());
  if (deferred_.ok()) deferred_ = error;
}

kube::ObjectMeta JobReconcile::ChildMeta(const std::string& child_name) const {
  kube::ObjectMeta md;
  md.name = child_name;
  md.namespace_ = ns_;
  md.labels = ChildLabels();
  md.owner_references = {ChildOwner()};
  return md;
}

kube::StringMap JobReconcile::ChildLabels() const { return {{kManagedByLabel, kManagedByValue}, {kJobLabel, name_}}; }

kube::OwnerReference JobReconcile::ChildOwner() const {
  return {"meshload.io/v1alpha1",       "DataLoadJob", name_, meta_.uid, /*controller=*/true,
          /*block_owner_deletion=*/true};
}

Status JobReconcile::ApplyConfigMap(const kube::StringMap& data) {
  const kube::ResourcePath cms = ConfigMapsResource();
  // The ConfigMap there is: ours from the cache or the server (ours with
  // its labels taken off included), somebody else's, or none.
  if (foreign_) {
    ConfigMapConflict();
    return Status::Ok();
  }
  if (!cm_) {
    MESHLOAD_RETURN_IF_ERROR(ctx_.CheckMayWrite());
    const kube::ConfigMap made{ChildMeta(cm_name_), data};
    kube::ApiResponse r = ctx_.client->Post(cms.Collection(ns_), made.ToJson());
    if (r.code == 409 && Str(r.body, "reason") == "AlreadyExists") {
      // Made since it was read (a retried POST that had landed): this
      // reconcile's assignment did not start from it, so nothing is
      // written; the next one reads it.
      kube::ApiResponse got = ctx_.client->Get(cms.Object(ns_, cm_name_));
      if (!got.ok()) return got.ToStatus("read ConfigMap " + ns_ + "/" + cm_name_);
      if (kube::MetadataOf(got.body).ControllerUid() != meta_.uid) {
        ConfigMapConflict();
      } else {
        deferred_ = Status(StatusCode::kUnavailable,
                           "ConfigMap " + ns_ + "/" + cm_name_ + " appeared while reconciling: reconciled again", key_);
      }
    } else if (!r.ok()) {
      // Refused (a role without the finalizers grant, a quota, a webhook):
      // the status says why, and the job is retried.
      ConfigMapFailed(r.ToStatus("create ConfigMap " + ns_ + "/" + cm_name_));
    } else {
      ++res_.writes;
    }
    return Status::Ok();
  }
  const kube::OwnerReference owner = ChildOwner();
  const kube::StringMap labels = ChildLabels();
  bool same = cm_->data == data && cm_->metadata.owner_references == std::vector<kube::OwnerReference>{owner};
  for (const auto& [k, v] : labels) same = same && cm_->metadata.Label(k) == v;
  if (same) return Status::Ok();
  MESHLOAD_RETURN_IF_ERROR(ctx_.CheckMayWrite());
  kube::ConfigMap updated = *cm_;
  updated.data = data;
  updated.metadata.owner_references = {owner};
  for (const auto& [k, v] : labels) updated.metadata.labels[k] = v;
  kube::ApiResponse r = ctx_.client->Put(cms.Object(ns_, cm_name_), updated.ToJson());
  if (r.ok()) {
    ++res_.writes;
  } else if (r.code == 409) {
    // Written since the cache's copy (this controller's own last update,
    // whose watch event is not here yet): this reconcile's assignment did
    // not start from it, so nothing is written; the next one, on the
    // caught-up cache, does. Not a problem: no Degraded, no warning.
    deferred_ =
        Status(StatusCode::kUnavailable,
               "ConfigMap " + ns_ + "/" + cm_name_ + " changed since the cache read it: reconciled again", key_);
  } else {
    ConfigMapFailed(r.ToStatus("update ConfigMap " + ns_ + "/" + cm_name_));
  }
  return Status::Ok();
}

Status JobReconcile::EnsurePeerSecret() {
  // Created once: status.peerSecretName records it (and peerSecretUID, when
  // this controller made it), so neither an idle reconcile nor a restarted
  // controller asks again. The controller may create and delete Secrets but
  // never read them: one that exists already (the user's own, or a lost
  // status write) is kept. A job whose status write has not reached the
  // informer yet is in secrets_made_, so a lagging cache does not ask again
  // either. A failure does not hold up the status: the job is Degraded
  // (PeerSecretFailed) and retried.
  const std::string secret_name = PeerSecretName(name_);
  if (desired_.peer_secret == secret_name) return Status::Ok();
  const std::string uid = meta_.uid;
  MESHLOAD_RETURN_IF_ERROR(ctx_.CheckMayWrite());
  MESHLOAD_ASSIGN_OR_RETURN(std::string secret, NewPeerSecret());
  kube::Secret made;
  made.metadata = ChildMeta(secret_name);
  made.metadata.labels[kJobUidLabel] = uid;  // which job instance it was made for (kubectl -l)
  made.immutable = true;
  made.data = {{"secret", Base64Encode(secret)}};
  kube::ApiResponse r = ctx_.client->Post(SecretsResource().Collection(ns_), made.ToJson());
  if (r.ok() || (r.code == 409 && Str(r.body, "reason") == "AlreadyExists")) {
    desired_.peer_secret = secret_name;
    desired_.peer_secret_uid = r.ok() ? kube::MetadataOf(r.body).uid : "";
    if (r.ok()) {
      ++res_.writes;
      LogInfo("created the peer secret", {{"job", key_}, {"secret", ns_ + "/" + secret_name}});
    } else {
      LogInfo("kept the peer secret that exists", {{"job", key_}, {"secret", ns_ + "/" + secret_name}});
    }
    ctx_.memory->RememberSecret(key_, uid, desired_.peer_secret_uid);
  } else {
    const Status secret_error = r.ToStatus("create Secret " + ns_ + "/" + secret_name);
    problems_.push_back("PeerSecretFailed: " + secret_error.ToString());
    if (deferred_.ok()) deferred_ = secret_error;
  }
  return Status::Ok();
}

void JobReconcile::SetConditions() {
  std::string planned_msg = "the sidecars read the dataset size from the files";
  if (resolved_ && resolved_->spec.mixture) {
    planned_msg = std::to_string(resolved_->samples) + " samples in " +
                  std::to_string(resolved_->spec.mixture->datasets.size()) + " datasets mixed by weight";
  } else if (resolved_) {
    planned_msg = std::to_string(resolved_->samples) + " samples, " + std::to_string(resolved_->steps_per_epoch) +
                  " steps per epoch";
  }
  desired_.conditions.push_back({"Valid", "True", "Valid", ""});
  desired_.conditions.push_back({"Planned", "True", resolved_ ? "Resolved" : "DatasetSizeFromSidecars", planned_msg});
  auto list = [](const std::vector<int64_t>& v) {
    std::string s;
    for (size_t i = 0; i < v.size() && i < 32; ++i) s += (s.empty() ? "" : ", ") + std::to_string(v[i]);
    if (v.size() > 32) s += ", ...";
    return s;
  };
  const bool all_ready = desired_.processes_ready == processes_;
  std::string ready_msg =
      std::to_string(desired_.processes_ready) + " of " + std::to_string(processes_) + " sidecars ready";
  if (!missing_.empty()) ready_msg += "; processes without a pod: " + list(missing_);
  if (!not_ready_.empty()) ready_msg += "; sidecars not ready: " + list(not_ready_);
  desired_.conditions.push_back(
      {"SidecarsReady", all_ready ? "True" : "False",
       all_ready ? "AllSidecarsReady" : (missing_.empty() ? "SidecarsNotReady" : "WaitingForPods"), ready_msg});
  if (!problems_.empty() || (desired_.processes_ready > 0 && !all_ready)) {
    std::string reason = problems_.empty() ? "NotAllSidecarsReady" : problems_[0].substr(0, problems_[0].find(':'));
    std::string msg;
    for (const auto& p : problems_) msg += (msg.empty() ? "" : "; ") + p;
    if (problems_.empty()) msg = ready_msg;
    desired_.conditions.push_back({"Degraded", "True", reason, msg});
    desired_.phase = "Degraded";
  } else {
    desired_.conditions.push_back({"Degraded", "False", "AsExpected", ""});
    desired_.phase = all_ready ? "Running" : "Pending";
  }
  for (const auto& c : progress_conditions_) desired_.conditions.push_back({c.type, c.status, c.reason, c.message});
  if (!suspended_jobs_.empty()) {
    SetSuspendedConditions();
  } else if (const std::string running = TrainerJobNames(false); !running.empty()) {
    desired_.conditions.push_back(
        {"Admitted", "True", "TrainersAdmitted", running + " not suspended: their pods may run"});
  }
}

void JobReconcile::SetSuspendedConditions() {
  // Admitted before (the condition was True, or the job was Suspended
  // already): a preemption, or somebody suspended it. Else it waits for
  // its first admission.
  const JobCondition* was = status_.Find("Admitted");
  const bool ran = was != nullptr && (was->status == "True" || was->reason == "Suspended");
  const int64_t step = ResumeStep();
  const std::string at = std::to_string(step);
  const bool one = suspended_jobs_.rfind("batch/v1 Job ", 0) == 0;
  const std::string is = suspended_jobs_ + (one ? " is" : " are") + " suspended (spec.suspend: true)";
  const std::string message =
      ran ? is + " after running: preempted by its queue or stopped; the trainers resume at step " + at +
                " when admitted again"
          : is + ": waiting for admission by its queue; the trainers start at step " + at;
  const std::string reason = ran ? "Suspended" : "WaitingForAdmission";
  desired_.phase = reason;
  if (ran) desired_.suspended_at_step = step;
  // No pods while suspended is no problem: not SidecarsReady, Degraded,
  // Starved or Straggling (a real problem, such as a parallelism the mesh
  // cannot take, stays Degraded).
  const std::string why = "no trainer pods while " + is;
  for (auto& c : desired_.conditions) {
    if (c.type == "SidecarsReady" && c.status != "True") {
      c = {c.type, "False", "TrainersSuspended", why};
    } else if (c.type == "Degraded" && (problems_.empty() || c.reason == "NotAllSidecarsReady")) {
      c = {c.type, "False", "TrainersSuspended", ""};
    }
  }
  std::erase_if(desired_.conditions, [](const Condition& c) { return c.type == "Starved" || c.type == "Straggling"; });
  if (ctx_.options->progress) {
    desired_.conditions.push_back({"Starved", "False", "TrainersSuspended", why});
    desired_.conditions.push_back({"Straggling", "False", "TrainersSuspended", why});
  }
  desired_.conditions.push_back({"Admitted", "False", reason, message});
}

Status JobReconcile::WriteStatus() {
  const kube::ResourcePath jobs = JobsResource();
  for (int attempt = 0; attempt < 5; ++attempt) {
    const JobStatus want = StatusToWrite(desired_, generation_, status_);
    const json want_json = want.ToJson();
    if (Field(job_, "status") == want_json) return deferred_;
    MESHLOAD_RETURN_IF_ERROR(ctx_.CheckMayWrite());
    json body = job_;
    body["status"] = want_json;
    kube::ApiResponse r = ctx_.client->Put(jobs.Object(ns_, name_) + "/status", body);
    if (r.ok()) {
      ++res_.writes;
      if (want.progress != status_.progress) ctx_.memory->ProgressWritten(key_);
      if (ctx_.options->record_event) {
        for (const auto& e : ConditionEvents(status_, want))
          ctx_.options->record_event(job_, e.type, e.reason, e.message);
      }
      return deferred_;
    }
    if (r.code == 404) return Status::Ok();
    if (r.code != 409) return r.ToStatus("update the status of " + key_);
    kube::ApiResponse fresh = ctx_.client->Get(jobs.Object(ns_, name_));
    if (fresh.code == 404) return Status::Ok();
    if (!fresh.ok()) return fresh.ToStatus("re-read " + key_);
    // The spec moved on: this status describes an older generation; the
    // informer will bring the new one.
    if (kube::MetadataOf(fresh.body).generation != generation_) {
      return Status(StatusCode::kUnavailable, "the job changed during the reconcile", key_);
    }
    SetJob(std::move(fresh.body));
  }
  return Status(StatusCode::kUnavailable, "the status kept conflicting", key_);
}

}  // namespace meshload::controller
