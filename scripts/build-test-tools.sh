#!/usr/bin/env bash
# Builds the real components the tests run against from the pinned Go module
# in tests/tools (go.mod, go.sum): etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler, kubectl and helm; and the module's own test tool,
# faultproxy (tests/tools/faultproxy: the fault-injecting proxy the
# Kubernetes tests put in front of kube-apiserver and the S3 tests in front
# of versitygw). Everything comes through the Go module proxy; no binary is
# downloaded from anywhere else.
#
#   scripts/build-test-tools.sh            build unless cached; prints the bin dir
#   scripts/build-test-tools.sh --dir      prints the bin dir if it is built (exit 1 if not)
#
# The binaries are cached outside the source and build trees, keyed by
# go.mod, go.sum, tests/tools' own sources, this script, the cache's shared
# code (scripts/lib/go-tool-cache.sh) and the Go version, in
# ${MESHLOAD_TEST_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/meshload/test-tools}/KEY/bin,
# so a second run, and CI on the same machine, do not rebuild. A build that
# fails leaves nothing in the cache.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SELF=$ROOT/scripts/build-test-tools.sh
MOD=$ROOT/tests/tools
TOOLS=(etcd kube-apiserver kube-controller-manager kube-scheduler kubectl helm faultproxy)

source "$ROOT/scripts/lib/go-tool-cache.sh"
go_tool_cache_init build-test-tools "the control-plane tests" "$MOD" "$SELF" "$(go_tool_cache_root)"
go_tool_cache_answer "${1:-}" \
  "the control-plane binaries are not built for this go.sum (run scripts/install-deps.sh)" "${TOOLS[@]}"

# The versions the binaries report (kubectl warns about version skew, helm
# prints its own), read from go.mod.
ver() { awk -v m="$1" '$1 == m && $2 ~ /^v/ {print $2; exit}' "$MOD/go.mod"; }
K8S=$(ver k8s.io/kubernetes)
HELM=$(ver helm.sh/helm/v3)
ETCD=$(ver go.etcd.io/etcd/server/v3)
K8S_MINOR=$(echo "$K8S" | cut -d. -f2)
KV=k8s.io/component-base/version
K8S_LDFLAGS="-s -w -X $KV.gitVersion=$K8S -X $KV.gitMajor=1 -X $KV.gitMinor=$K8S_MINOR -X $KV.gitTreeState=clean"
K8S_LDFLAGS="$K8S_LDFLAGS -X k8s.io/client-go/pkg/version.gitVersion=$K8S"

go_tool_cache_stage
STAGE=$GO_TOOL_CACHE_STAGE
echo "build-test-tools: building kubernetes $K8S, etcd $ETCD and helm $HELM from tests/tools (a few minutes per binary on 2 cores)" >&2
cd "$MOD"
export CGO_ENABLED=0 GOFLAGS=-mod=readonly
go build -trimpath -ldflags "$K8S_LDFLAGS" -o "$STAGE/" \
  k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
  k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl
go build -trimpath -ldflags "-s -w" -o "$STAGE/etcd" go.etcd.io/etcd/server/v3
# The Kubernetes version helm assumes without a cluster (`helm template`,
# `helm lint`: Chart.yaml's kubeVersion, deprecated APIs), as helm's own
# Makefile sets it; unset, it would be 1.20.
HV=helm.sh/helm/v3/pkg
HELM_LDFLAGS="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM"
HELM_LDFLAGS="$HELM_LDFLAGS -X $HV/chartutil.k8sVersionMajor=1 -X $HV/chartutil.k8sVersionMinor=$K8S_MINOR"
HELM_LDFLAGS="$HELM_LDFLAGS -X $HV/lint/rules.k8sVersionMajor=1 -X $HV/lint/rules.k8sVersionMinor=$K8S_MINOR"
go build -trimpath -ldflags "$HELM_LDFLAGS" -o "$STAGE/helm" helm.sh/helm/v3/cmd/helm
go build -trimpath -ldflags "-s -w" -o "$STAGE/faultproxy" ./faultproxy
# Builds for other keys (an older go.sum) are not used again: about 400 MB each.
go_tool_cache_commit
