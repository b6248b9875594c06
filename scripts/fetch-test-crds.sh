#!/usr/bin/env bash
# Fetches the third-party CustomResourceDefinitions the chart's objects need
# on the test control plane, from the projects' own source through the Go
# module proxy, pinned by version and by the module's checksum (the go.sum
# hash, also checked against the Go checksum database by `go mod download`):
#
#   Prometheus Operator   ServiceMonitor, PodMonitor, PrometheusRule
#                         (example/prometheus-operator-crd-full)
#   cert-manager          Certificate, Issuer (deploy/crds)
#
#   scripts/fetch-test-crds.sh          fetch unless cached; prints the directory
#   scripts/fetch-test-crds.sh --dir    prints the directory if fetched (exit 1 if not)
#
# Cached in ${MESHLOAD_TEST_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/meshload/test-tools}/crds-KEY,
# KEY from this script, so a second run does nothing.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SELF=$ROOT/scripts/fetch-test-crds.sh

# module version go.sum-hash directory files...
MODULES=(
  "github.com/prometheus-operator/prometheus-operator v0.85.0 h1:M5xLCLEoaW2IJfnuCwFzzpL+jSVQu3KGT84Pye+fW8s=
   example/prometheus-operator-crd-full
   monitoring.coreos.com_servicemonitors.yaml monitoring.coreos.com_podmonitors.yaml monitoring.coreos.com_prometheusrules.yaml"
  "github.com/cert-manager/cert-manager v1.21.2 h1:UWgoYM+KLNtRlqmoWOKjKBOBUPVHeepQ6/ac3ERJW68=
   deploy/crds
   cert-manager.io_certificates.yaml cert-manager.io_issuers.yaml"
)

KEY=$(sha256sum "$SELF" | cut -c1-16)
CACHE=${MESHLOAD_TEST_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/meshload/test-tools}
OUT=$CACHE/crds-$KEY

fetched() {
  local m
  for m in "${MODULES[@]}"; do
    read -r -a f <<<"$(echo $m)"
    local i
    for ((i = 4; i < ${#f[@]}; i++)); do [ -s "$OUT/${f[$i]}" ] || return 1; done
  done
}

if [ "${1:-}" = "--dir" ]; then
  if fetched; then echo "$OUT"; exit 0; fi
  echo "fetch-test-crds: the third-party CRDs are not fetched (run scripts/install-deps.sh)" >&2
  exit 1
fi
if fetched; then
  echo "$OUT"
  exit 0
fi
if ! command -v go >/dev/null 2>&1; then
  echo "fetch-test-crds: go is not installed (it fetches through the Go module proxy)" >&2
  exit 1
fi

mkdir -p "$CACHE"
STAGE=$(mktemp -d "$CACHE/.crds-XXXXXX")
trap 'rm -rf "$STAGE"' EXIT
for m in "${MODULES[@]}"; do
  read -r -a f <<<"$(echo $m)"
  mod=${f[0]} ver=${f[1]} sum=${f[2]} dir=${f[3]}
  # Outside any module, so nothing is added to tests/tools' go.sum.
  info=$(cd "$STAGE" && GOFLAGS= go mod download -json "$mod@$ver") || {
    echo "fetch-test-crds: cannot download $mod@$ver: $info" >&2
    exit 1
  }
  got=$(printf '%s' "$info" | python3 -c 'import json,sys; print(json.load(sys.stdin).get("Sum",""))')
  if [ "$got" != "$sum" ]; then
    echo "fetch-test-crds: $mod@$ver has checksum $got, pinned $sum" >&2
    exit 1
  fi
  src=$(printf '%s' "$info" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
  for ((i = 4; i < ${#f[@]}; i++)); do
    cp "$src/$dir/${f[$i]}" "$STAGE/${f[$i]}"
    chmod 644 "$STAGE/${f[$i]}"
  done
done
for old in "$CACHE"/crds-*/; do
  [ -d "$old" ] && [ "$old" != "$OUT/" ] && rm -rf "$old"
done
rm -rf "$OUT"
mv "$STAGE" "$OUT"
trap - EXIT
echo "$OUT"
