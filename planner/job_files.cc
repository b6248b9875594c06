#include "planner/job_files.h"

namespace meshload::planner {

using nlohmann::json;

json Assignments::ToJson() const {
  json by_name = json::object();
  for (const auto& [name, p] : pods) by_name[name] = {{"uid", p.uid}, {"index", p.index}, {"ip", p.ip}};
  json out = {{"processes", processes}, {"pods", std::move(by_name)}};
  if (samples) out["samples"] = *samples;
  return out;
}

Result<Assignments> Assignments::Parse(const std::string& text, const std::string& file) {
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("processes") || !j["processes"].is_number_integer() ||
      !j.contains("pods") || !j["pods"].is_object()) {
    return InvalidArgument("expected the controller's assignments (processes, pods)", file);
  }
  Assignments a;
  a.processes = j["processes"].get<int64_t>();
  if (a.processes < 1 || a.processes > (1 << 22)) return InvalidArgument("processes: out of range", file);
  for (const auto& [name, pod] : j["pods"].items()) {
    if (!pod.is_object() || !pod.contains("index") || !pod["index"].is_number_integer()) {
      return InvalidArgument("pods." + name + ".index: expected an integer", file);
    }
    PodAssignment p;
    p.index = pod["index"].get<int64_t>();
    if (p.index < 0 || p.index >= a.processes) return InvalidArgument("pods." + name + ".index: out of range", file);
    if (pod.contains("uid") && pod["uid"].is_string()) p.uid = pod["uid"].get<std::string>();
    if (pod.contains("ip") && pod["ip"].is_string()) p.ip = pod["ip"].get<std::string>();
    a.pods[name] = std::move(p);
  }
  if (j.contains("samples")) {
    if (!j["samples"].is_number_integer() || j["samples"].get<int64_t>() < 1) {
      return InvalidArgument("samples: expected a positive integer", file);
    }
    a.samples = j["samples"].get<int64_t>();
  }
  return a;
}

Assignments Assignments::ReadLeniently(const std::string& text) {
  Assignments a;
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return a;
  if (j.contains("processes") && j["processes"].is_number_integer()) a.processes = j["processes"].get<int64_t>();
  if (j.contains("samples") && j["samples"].is_number_integer()) a.samples = j["samples"].get<int64_t>();
  if (!j.contains("pods") || !j["pods"].is_object()) return a;
  for (const auto& [name, pod] : j["pods"].items()) {
    if (!pod.is_object() || !pod.contains("index") || !pod["index"].is_number_integer()) continue;
    PodAssignment p;
    p.index = pod["index"].get<int64_t>();
    if (p.index < 0) continue;
    if (pod.contains("uid") && pod["uid"].is_string()) p.uid = pod["uid"].get<std::string>();
    if (pod.contains("ip") && pod["ip"].is_string()) p.ip = pod["ip"].get<std::string>();
    a.pods[name] = std::move(p);
  }
  return a;
}

json ResumeRecord::ToJson() const { return {{"step", step}, {"specStep", spec_step}}; }

Result<ResumeRecord> ResumeRecord::Parse(const std::string& text, const std::string& file) {
  const json doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
  auto bad = [&](const std::string& what) {
    return Status(StatusCode::kInvalidArgument, "resume file: " + what + ", expected {\"step\": N, \"specStep\": S}",
                  file);
  };
  if (!doc.is_object()) return bad("not a JSON object");
  const auto step = doc.find("step");
  const auto spec = doc.find("specStep");
  if (step == doc.end() || !step->is_number_integer() || step->get<int64_t>() < 0) {
    return bad("\"step\" is not a non-negative integer");
  }
  if (spec == doc.end() || !spec->is_number_integer()) return bad("\"specStep\" is not an integer");
  return ResumeRecord{step->get<int64_t>(), spec->get<int64_t>()};
}

}  // namespace meshload::planner
