/// \file
/// AdmissionReview v1 for the sidecar injector: decodes the API server's
/// request, asks InjectSidecar (a Pod), InjectJobTemplate (a batch/v1 Job),
/// InjectJobSetTemplates (a jobset.x-k8s.io JobSet) or
/// InjectTrainingRuntimeTemplates (a trainer.kubeflow.org TrainingRuntime),
/// and encodes the response.
///
///   AdmissionAnswer a = ReviewAdmission(body, lookup, options);
///   // HTTP a.http_status with a.body (application/json); a.outcome for metrics
///
/// Bad input never crashes and never admits by accident: a body that is not
/// JSON, not an AdmissionReview v1, larger than kMaxAdmissionReviewBytes or
/// without request.uid is answered HTTP 400 with a message naming what is
/// wrong (the API server then applies the webhook's failurePolicy). A request
/// for anything but a Pod, Job, JobSet or TrainingRuntime CREATE is allowed
/// unchanged.
///
/// Thread safety: pure function (the lookup must be thread-safe).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "controller/webhook/injector.h"

namespace meshload::controller::webhook {

/// The largest request body read (a pod is at most ~1.5 MiB in etcd; the
/// review wraps it once, or twice with oldObject).
inline constexpr size_t kMaxAdmissionReviewBytes = 4 * 1024 * 1024;

struct AdmissionAnswer {
  int http_status = 200;
  std::string body;     // JSON: an AdmissionReview, or {"error": ...} with 400
  std::string outcome;  // injected, unchanged, refused, bad_request
};

AdmissionAnswer ReviewAdmission(std::string_view body, const JobLookup& jobs, const InjectorOptions& options);

}  // namespace meshload::controller::webhook
