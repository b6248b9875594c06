#include "controller/webhook/admission.h"

#include <nlohmann/json.hpp>

#include "common/base64.h"

namespace meshload::controller::webhook {

using nlohmann::json;

namespace {

AdmissionAnswer BadRequest(const std::string& why) {
  return {400, json{{"error", "not a valid AdmissionReview v1: " + why}}.dump(), "bad_request"};
}

const json* Member(const json& j, const char* key, json::value_t type) {
  if (!j.is_object()) return nullptr;
  auto it = j.find(key);
  if (it == j.end() || it->type() != type) return nullptr;
  return &*it;
}

}  // namespace

AdmissionAnswer ReviewAdmission(std::string_view body, const JobLookup& jobs, const InjectorOptions& options) {
  if (body.size() > kMaxAdmissionReviewBytes) {
    return BadRequest("the body is " + std::to_string(body.size()) + " bytes, more than " +
                      std::to_string(kMaxAdmissionReviewBytes));
  }
  json review = json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (review.is_discarded()) return BadRequest("the body is not JSON");
  if (!review.is_object()) return BadRequest("the body is not a JSON object");
  const json* api_version = Member(review, "apiVersion", json::value_t::string);
  const json* kind = Member(review, "kind", json::value_t::string);
  if (!api_version || *api_version != "admission.k8s.io/v1" || !kind || *kind != "AdmissionReview") {
    return BadRequest("apiVersion and kind must be admission.k8s.io/v1 AdmissionReview");
  }
  const json* request = Member(review, "request", json::value_t::object);
  if (!request) return BadRequest("no request object");
  const json* uid = Member(*request, "uid", json::value_t::string);
  if (!uid || uid->get_ref<const std::string&>().empty()) return BadRequest("request.uid is missing");

  json response = {{"uid", *uid}, {"allowed", true}};
  std::string outcome = "unchanged";
  const json* req_kind = Member(*request, "kind", json::value_t::object);
  const json* operation = Member(*request, "operation", json::value_t::string);
  auto is = [&](const char* group, const char* kind) {
    return req_kind && Member(*req_kind, "kind", json::value_t::string) && (*req_kind)["kind"] == kind &&
           Member(*req_kind, "group", json::value_t::string) && (*req_kind)["group"] == group;
  };
  const bool pod = is("", "Pod");
  const bool job = is("batch", "Job");
  const bool jobset = is("jobset.x-k8s.io", "JobSet");
  const bool runtime = is("trainer.kubeflow.org", "TrainingRuntime");
  const json* sub = Member(*request, "subResource", json::value_t::string);
  if ((pod || job || jobset || runtime) && operation && *operation == "CREATE" &&
      (!sub || sub->get_ref<const std::string&>().empty())) {
    const json* object = Member(*request, "object", json::value_t::object);
    if (!object) return BadRequest("request.object is not an object");
    const json* ns = Member(*request, "namespace", json::value_t::string);
    std::string pod_ns = ns ? ns->get<std::string>() : std::string();
    if (pod_ns.empty()) {
      const json* md = Member(*object, "metadata", json::value_t::object);
      const json* mns = md ? Member(*md, "namespace", json::value_t::string) : nullptr;
      if (mns) pod_ns = mns->get<std::string>();
    }
    Decision d = pod      ? InjectSidecar(*object, pod_ns, jobs, options)
                 : job    ? InjectJobTemplate(*object, pod_ns, jobs, options)
                 : jobset ? InjectJobSetTemplates(*object, pod_ns, jobs, options)
                          : InjectTrainingRuntimeTemplates(*object, pod_ns, jobs, options);
    outcome = d.outcome;
    if (!d.allowed) {
      response["allowed"] = false;
      response["status"] = {{"code", 403}, {"reason", "Forbidden"}, {"message", "meshload: " + d.message}};
    } else if (!d.patch.empty()) {
      response["patchType"] = "JSONPatch";
      response["patch"] = Base64Encode(d.patch.dump());
    }
  }
  json out = {{"apiVersion", "admission.k8s.io/v1"}, {"kind", "AdmissionReview"}, {"response", response}};
  return {200, out.dump(), outcome};
}

}  // namespace meshload::controller::webhook
