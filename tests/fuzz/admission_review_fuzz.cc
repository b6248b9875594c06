/// \file
/// libFuzzer target for the sidecar-injection webhook's decoder: the API
/// server sends AdmissionReviews, but anything that reaches the port may
/// send anything. ReviewAdmission must never crash, and must answer
/// either 400 with an error or 200 with an AdmissionReview that carries the
/// request's uid (and a JSON Patch that decodes, when it has one).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

#include <nlohmann/json.hpp>

#include "common/base64.h"
#include "controller/webhook/admission.h"

namespace {

using nlohmann::json;

std::shared_ptr<const json> TheJob() {
  static const auto job = std::make_shared<const json>(json::parse(R"({
    "metadata": {"name": "llm", "namespace": "training"},
    "spec": {"mesh": {"processes": 2, "devicesPerProcess": 2, "axes": [{"name": "data", "size": 4}]},
             "strategy": "LoadAndReshard",
             "dataset": {"uri": "s3://b/t", "format": "TokenStream", "dtype": "uint16", "sequenceLength": 8,
                         "samples": 1000},
             "batch": {"globalBatchSize": 8}, "selector": {"matchLabels": {"app": "trainer"}}}})"));
  return job;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace meshload::controller::webhook;
  std::string_view body(reinterpret_cast<const char*>(data), size);
  JobLookup lookup = [](const std::string&, const std::string& name) -> std::shared_ptr<const json> {
    return name == "llm" ? TheJob() : nullptr;
  };
  InjectorOptions options;
  options.image = "meshload/sidecar:fuzz";
  AdmissionAnswer a = ReviewAdmission(body, lookup, options);
  json out = json::parse(a.body, nullptr, false);
  if (out.is_discarded()) __builtin_trap();
  if (a.http_status == 400) {
    if (!out.contains("error") || a.outcome != "bad_request") __builtin_trap();
    return 0;
  }
  if (a.http_status != 200 || !out["response"]["uid"].is_string()) __builtin_trap();
  if (out["response"].contains("patch")) {
    auto patch = meshload::Base64Decode(out["response"]["patch"].get<std::string>());
    if (!patch || json::parse(*patch, nullptr, false).is_discarded()) __builtin_trap();
  }
  return 0;
}
