/// \file
/// Kubernetes label selectors: whether an object's labels match one. The
/// selector is the DataLoadJob's (planner::LabelSelector, as declared in
/// planner/api/dataloadjob.yaml), or the same in JSON from an object the API
/// server gave.
///
/// Thread safety: pure functions.
#pragma once

#include <nlohmann/json.hpp>

#include "controller/kube/objects.h"
#include "planner/spec.h"

namespace meshload::controller::kube {

/// Whether `labels` (an object's metadata.labels) match `selector`: every matchLabels entry, and every
/// matchExpressions requirement (In, NotIn, Exists, DoesNotExist; any other
/// operator matches nothing). An empty selector matches everything, as in
/// Kubernetes.
bool SelectorMatches(const planner::LabelSelector& selector, const StringMap& labels);
/// The same for a selector in JSON (a value of the wrong type matches nothing).
bool SelectorMatches(const nlohmann::json& selector, const StringMap& labels);

}  // namespace meshload::controller::kube
