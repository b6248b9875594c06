#!/usr/bin/env bash
# Builds the simulated cluster's tools (scripts/cluster) from the pinned Go
# module in tests/cluster/tools (go.mod, go.sum) through the Go module proxy:
# kwok (sigs.k8s.io/kwok), which simulates nodes and pod lifecycles against
# the real API server; dashboardcheck, which checks the chart's Grafana
# dashboard with Grafana's own schema (grafana-foundation-sdk); and
# Prometheus with promtool (github.com/prometheus/prometheus, pinned in the
# nested module tests/cluster/tools/prometheus: Debian's Prometheus is built
# without Kubernetes service discovery); and Kueue's manager
# (sigs.k8s.io/kueue, pinned in the nested module tests/cluster/tools/kueue)
# with its install's kustomization (kueue-config/, from the same module); and
# JobSet's manager (sigs.k8s.io/jobset, pinned in tests/cluster/tools/jobset)
# with its install's manifests (jobset-config/: its CRD, its webhooks); and
# Kubeflow Trainer's manager (github.com/kubeflow/trainer/v2, pinned in
# tests/cluster/tools/trainer) with its manifests (trainer-manifests/). The control
# plane, kube-scheduler among it, comes from scripts/build-test-tools.sh.
#
#   scripts/build-cluster-tools.sh          build unless cached; prints the bin dir
#   scripts/build-cluster-tools.sh --dir    prints the bin dir if it is built (exit 1 if not)
#
# Cached like the control plane's tools (scripts/lib/go-tool-cache.sh), under
# their own key.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SELF=$ROOT/scripts/build-cluster-tools.sh
MOD=$ROOT/tests/cluster/tools
TOOLS=(kwok dashboardcheck prometheus promtool kueue jobset trainer)

source "$ROOT/scripts/lib/go-tool-cache.sh"
go_tool_cache_init build-cluster-tools "the simulated cluster" "$MOD" "$SELF" "$(go_tool_cache_root)/cluster"
go_tool_cache_answer "${1:-}" "kwok is not built for this go.sum (run scripts/install-deps.sh)" "${TOOLS[@]}"
KWOK=$(awk '$1 == "sigs.k8s.io/kwok" && $2 ~ /^v/ {print $2; exit}' "$MOD/go.mod")
go_tool_cache_stage
PROM=$(awk '$1 == "github.com/prometheus/prometheus" && $2 ~ /^v/ {print $2; exit}' "$MOD/prometheus/go.mod")
KUEUE=$(awk '$1 == "sigs.k8s.io/kueue" && $2 ~ /^v/ {print $2; exit}' "$MOD/kueue/go.mod")
JOBSET=$(awk '$1 == "sigs.k8s.io/jobset" && $2 ~ /^v/ {print $2; exit}' "$MOD/jobset/go.mod")
TRAINER=$(awk '$1 == "github.com/kubeflow/trainer/v2" && $2 ~ /^v/ {print $2; exit}' "$MOD/trainer/go.mod")
echo "build-cluster-tools: building kwok $KWOK, dashboardcheck, prometheus $PROM, kueue $KUEUE, jobset $JOBSET and kubeflow trainer $TRAINER from tests/cluster/tools (about fifteen minutes on 2 cores)" >&2
cd "$MOD"
export CGO_ENABLED=0 GOFLAGS=-mod=readonly
go build -trimpath -ldflags "-s -w" -o "$GO_TOOL_CACHE_STAGE/kwok" \
  sigs.k8s.io/kwok/cmd/kwok
go build -trimpath -ldflags "-s -w" -o "$GO_TOOL_CACHE_STAGE/dashboardcheck" ./dashboardcheck
cd prometheus
go build -trimpath -ldflags "-s -w" -o "$GO_TOOL_CACHE_STAGE/" \
  github.com/prometheus/prometheus/cmd/prometheus github.com/prometheus/prometheus/cmd/promtool
cd ../kueue
go build -trimpath -ldflags "-s -w" -o "$GO_TOOL_CACHE_STAGE/kueue" sigs.k8s.io/kueue/cmd/kueue
# Its install's kustomization (config/: `kubectl kustomize kueue-config/default`
# renders the CRDs as Kueue installs them, conversion webhooks included).
go mod download sigs.k8s.io/kueue
cp -r "$(go list -m -f '{{.Dir}}' sigs.k8s.io/kueue)/config" "$GO_TOOL_CACHE_STAGE/kueue-config"
chmod -R u+w "$GO_TOOL_CACHE_STAGE/kueue-config"
cd ../jobset
go build -trimpath -ldflags "-s -w" -o "$GO_TOOL_CACHE_STAGE/jobset" sigs.k8s.io/jobset
go mod download sigs.k8s.io/jobset
cp -r "$(go list -m -f '{{.Dir}}' sigs.k8s.io/jobset)/config" "$GO_TOOL_CACHE_STAGE/jobset-config"
chmod -R u+w "$GO_TOOL_CACHE_STAGE/jobset-config"
cd ../trainer
go build -trimpath -ldflags "-s -w" -o "$GO_TOOL_CACHE_STAGE/trainer" \
  github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager
go mod download github.com/kubeflow/trainer/v2
cp -r "$(go list -m -f '{{.Dir}}' github.com/kubeflow/trainer/v2)/manifests" "$GO_TOOL_CACHE_STAGE/trainer-manifests"
chmod -R u+w "$GO_TOOL_CACHE_STAGE/trainer-manifests"
go_tool_cache_commit
