#include "controller/fakeapi/merge_patch.h"

namespace meshload::fakeapi {

nlohmann::json ApplyMergePatch(nlohmann::json target, const nlohmann::json& patch) {
  // nlohmann's merge_patch() implements RFC 7386 exactly; this wrapper keeps
  // the by-value contract that the store relies on (stored copy untouched).
  target.merge_patch(patch);
  return target;
}

}  // namespace meshload::fakeapi
