/// \file
/// Discovery and server-side printing for the fake API server, generated
/// from the resource registry on every request, so a CRD created at run time
/// is discoverable (and `kubectl get <shortName>` works) at once.
///
/// Served (see FakeApiServer): `/version`, `/api`, `/apis`, `/apis/{group}`,
/// `/api/v1` and `/apis/{group}/{version}` in the legacy (unaggregated)
/// format, and `meta.k8s.io/v1` Tables for `kubectl get`.
///
/// Thread safety: pure functions over a registry snapshot.
#pragma once

#include <ctime>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "controller/fakeapi/resources.h"

namespace meshload::fakeapi {

/// The registry snapshot discovery reads, by ResourceType::Key().
using ResourceTypes = std::map<std::string, ResourceType>;

/// The Kubernetes version the fake claims; kubectl warns on a skew of more
/// than one minor version, so keep it near the installed client's.
inline constexpr char kFakeMajor[] = "1";
inline constexpr char kFakeMinor[] = "29";
inline constexpr char kFakeGitVersion[] = "v1.29.0-meshload-fake";

/// `GET /version`: a VersionInfo.
nlohmann::json VersionInfo();
/// `GET /api`: APIVersions naming v1, reachable at `server_address`
/// ("127.0.0.1:PORT") from every client CIDR.
nlohmann::json CoreApiVersions(const std::string& server_address);
/// `GET /apis`: an APIGroupList with every non-core group, its served
/// versions and its preferred (first-declared) version.
nlohmann::json ApiGroupList(const ResourceTypes& types);
/// `GET /apis/{group}`: an APIGroup, or nullopt when no type is in `group`.
std::optional<nlohmann::json> ApiGroup(const ResourceTypes& types, const std::string& group);
/// `GET /api/v1` (group "") and `GET /apis/{group}/{version}`: an
/// APIResourceList with verbs, short names, categories and `/status`
/// entries; nullopt when nothing is served at group/version.
std::optional<nlohmann::json> ApiResourceList(const ResourceTypes& types, const std::string& group,
                                              const std::string& version);

/// OpenAPI, as far as kubectl uses it. `kubectl apply` and `create` validate
/// by default and download OpenAPI first (v3, then v2); without a document
/// they fail. The documents hold one PATCH operation per resource, tagged
/// with its group/version/kind and a `fieldValidation` query parameter:
/// kubectl then leaves validation to the server (sending
/// fieldValidation=Strict) instead of validating against client-side
/// schemas. The fake does not validate fields (see README), and there are no
/// schemas (`definitions`/`components` are empty), so nothing is checked on
/// either side; `--validate=false` is not needed. PATCH operations declare no
/// request body, so `kubectl apply` computes patches the way it does without
/// OpenAPI v3: strategic merge patch from its compiled-in types for
/// built-ins, JSON merge patch for custom resources.
///
/// `GET /openapi/v3`: the index of group-version documents, each URL carrying
/// a hash of the document so that clients caching by URL see CRD changes.
nlohmann::json OpenApiV3Index(const ResourceTypes& types);
/// `GET /openapi/v3/api/v1` (group "") or `/openapi/v3/apis/{group}/{version}`.
std::optional<nlohmann::json> OpenApiV3GroupVersion(const ResourceTypes& types,
                                                    const std::string& group,
                                                    const std::string& version);
/// `GET /openapi/v2`: one Swagger 2.0 document for every resource.
nlohmann::json OpenApiV2(const ResourceTypes& types);

/// What a Table row carries besides its cells (the `includeObject` parameter).
enum class IncludeObject { kNone, kMetadata, kObject };

/// Converts a GET answer (one object) or a list answer of `type` into a
/// `meta.k8s.io/v1` Table, as a real server does for `Accept:
/// application/json;as=Table;v=v1;g=meta.k8s.io`. Custom resources get Name
/// and their additionalPrinterColumns (Name and Age without any), whose
/// JSONPaths are evaluated as simple dotted paths; pods get kubectl's usual
/// Name/Ready/Status/Restarts/Age; other built-ins Name and Age. `now` dates
/// the Age cells.
nlohmann::json ToTable(const ResourceType& type, const nlohmann::json& object_or_list,
                       IncludeObject include, std::time_t now);

/// "5m3s", "2d4h", ...: the age format of kubectl and of date Table cells.
std::string HumanDuration(int64_t seconds);

}  // namespace meshload::fakeapi
