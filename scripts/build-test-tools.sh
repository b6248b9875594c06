#!/usr/bin/env bash
# Builds the real components the tests run against from the pinned Go module
# in tests/tools (go.mod, go.sum): etcd, kube-apiserver,
# kube-controller-manager, kubectl and helm; and the module's own test tool,
# faultproxy (tests/tools/faultproxy). Everything comes through the Go
# module proxy; no binary is downloaded from anywhere else.
#
#   scripts/build-test-tools.sh            build unless cached; prints the bin dir
#   scripts/build-test-tools.sh --dir      prints the bin dir if it is built (exit 1 if not)
#
# The binaries are cached outside the source and build trees, keyed by
# go.mod, go.sum, tests/tools' own sources, this script and the Go version, in
# ${MESHLOAD_TEST_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/meshload/test-tools}/KEY/bin,
# so a second run, and CI on the same machine, do not rebuild. A build that
# fails leaves nothing in the cache.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SELF=$ROOT/scripts/build-test-tools.sh
MOD=$ROOT/tests/tools
TOOLS=(etcd kube-apiserver kube-controller-manager kubectl helm faultproxy)

if ! command -v go >/dev/null 2>&1; then
  echo "build-test-tools: go is not installed (the control-plane tests need Go $(sed -n 's/^go //p' "$MOD/go.mod") or newer)" >&2
  exit 1
fi
GOVERSION=$(go env GOVERSION)
# Keyed by everything the binaries are made of: the module files, the test
# tools' own sources, this script and the Go version.
KEY=$( (cd "$MOD" && find . -name '*.go' -o -name go.mod -o -name go.sum | LC_ALL=C sort | xargs cat
        cat "$SELF"; echo "$GOVERSION") | sha256sum | cut -c1-16)
CACHE=${MESHLOAD_TEST_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/meshload/test-tools}
OUT=$CACHE/$KEY/bin

built() {
  for t in "${TOOLS[@]}"; do [ -x "$OUT/$t" ] || return 1; done
}

if [ "${1:-}" = "--dir" ]; then
  if built; then echo "$OUT"; exit 0; fi
  echo "build-test-tools: the control-plane binaries are not built for this go.sum (run scripts/install-deps.sh)" >&2
  exit 1
fi

if built; then
  echo "build-test-tools: cached in $OUT" >&2
  echo "$OUT"
  exit 0
fi

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

STAGE=$(mktemp -d "$CACHE/.build-XXXXXX" 2>/dev/null || { mkdir -p "$CACHE" && mktemp -d "$CACHE/.build-XXXXXX"; })
trap 'rm -rf "$STAGE"' EXIT
echo "build-test-tools: building kubernetes $K8S, etcd $ETCD and helm $HELM from tests/tools (a few minutes per binary on 2 cores)" >&2
start=$(date +%s)
cd "$MOD"
export CGO_ENABLED=0 GOFLAGS=-mod=readonly
go build -trimpath -ldflags "$K8S_LDFLAGS" -o "$STAGE/" \
  k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kubectl
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
mkdir -p "$CACHE/$KEY"
rm -rf "$OUT"
mv "$STAGE" "$OUT"
trap - EXIT
# Builds for other keys (an older go.sum) are not used again: about 400 MB each.
for old in "$CACHE"/*/; do
  [ "$old" = "$CACHE/$KEY/" ] || rm -rf "$old"
done
echo "build-test-tools: built in $(( $(date +%s) - start )) s into $OUT" >&2
echo "$OUT"
