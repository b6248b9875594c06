#!/usr/bin/env bash
# Builds the real S3 server the object-storage tests run against, versitygw
# (its POSIX backend serves a directory's subdirectories as buckets), and
# the tests' fault proxy in front of it, from the pinned Go module in
# tests/s3/tools (go.mod, go.sum) through the Go module proxy.
#
#   scripts/build-s3-test-tools.sh          build unless cached; prints the bin dir
#   scripts/build-s3-test-tools.sh --dir    prints the bin dir if it is built (exit 1 if not)
#
# Cached like the control plane's tools (scripts/build-test-tools.sh), under
# their own key (this module's files, this script, the Go version), so that
# neither rebuilds the other.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SELF=$ROOT/scripts/build-s3-test-tools.sh
MOD=$ROOT/tests/s3/tools
TOOLS=(versitygw s3faultproxy)

if ! command -v go >/dev/null 2>&1; then
  echo "build-s3-test-tools: go is not installed (the S3 tests need Go $(sed -n 's/^go //p' "$MOD/go.mod") or newer)" >&2
  exit 1
fi
KEY=$( (cd "$MOD" && find . -name '*.go' -o -name go.mod -o -name go.sum | LC_ALL=C sort | xargs cat
        cat "$SELF"; go env GOVERSION) | sha256sum | cut -c1-16)
CACHE=${MESHLOAD_TEST_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/meshload/test-tools}/s3
OUT=$CACHE/$KEY/bin

built() {
  for t in "${TOOLS[@]}"; do [ -x "$OUT/$t" ] || return 1; done
}
if [ "${1:-}" = "--dir" ]; then
  if built; then echo "$OUT"; exit 0; fi
  echo "build-s3-test-tools: versitygw is not built for this go.sum (run scripts/install-deps.sh)" >&2
  exit 1
fi
if built; then
  echo "build-s3-test-tools: cached in $OUT" >&2
  echo "$OUT"
  exit 0
fi
VGW=$(awk '$1 == "github.com/versity/versitygw" && $2 ~ /^v/ {print $2; exit}' "$MOD/go.mod")
mkdir -p "$CACHE"
STAGE=$(mktemp -d "$CACHE/.build-XXXXXX")
trap 'rm -rf "$STAGE"' EXIT
echo "build-s3-test-tools: building versitygw $VGW from tests/s3/tools (about two minutes on 2 cores)" >&2
start=$(date +%s)
cd "$MOD"
export CGO_ENABLED=0 GOFLAGS=-mod=readonly
go build -trimpath -ldflags "-s -w -X main.Version=$VGW" -o "$STAGE/versitygw" github.com/versity/versitygw/cmd/versitygw
go build -trimpath -ldflags "-s -w" -o "$STAGE/s3faultproxy" ./s3faultproxy
mkdir -p "$CACHE/$KEY"
rm -rf "$OUT"
mv "$STAGE" "$OUT"
trap - EXIT
for old in "$CACHE"/*/; do
  [ "$old" = "$CACHE/$KEY/" ] || rm -rf "$old"
done
echo "build-s3-test-tools: built in $(( $(date +%s) - start )) s into $OUT" >&2
echo "$OUT"
