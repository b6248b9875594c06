#!/usr/bin/env bash
# Builds the real S3 server the object-storage tests run against, versitygw
# (its POSIX backend serves a directory's subdirectories as buckets), from
# the pinned Go module in tests/s3/tools (go.mod, go.sum) through the Go
# module proxy. The fault proxy the S3 tests put in front of it is
# faultproxy, built with the control plane's tools
# (scripts/build-test-tools.sh).
#
#   scripts/build-s3-test-tools.sh          build unless cached; prints the bin dir
#   scripts/build-s3-test-tools.sh --dir    prints the bin dir if it is built (exit 1 if not)
#
# Cached like the control plane's tools (scripts/build-test-tools.sh, both
# through scripts/lib/go-tool-cache.sh), under their own key (this module's
# files, this script, the shared cache code, the Go version), so that
# neither rebuilds the other.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SELF=$ROOT/scripts/build-s3-test-tools.sh
MOD=$ROOT/tests/s3/tools
TOOLS=(versitygw)

source "$ROOT/scripts/lib/go-tool-cache.sh"
go_tool_cache_init build-s3-test-tools "the S3 tests" "$MOD" "$SELF" "$(go_tool_cache_root)/s3"
go_tool_cache_answer "${1:-}" "versitygw is not built for this go.sum (run scripts/install-deps.sh)" "${TOOLS[@]}"
VGW=$(awk '$1 == "github.com/versity/versitygw" && $2 ~ /^v/ {print $2; exit}' "$MOD/go.mod")
go_tool_cache_stage
echo "build-s3-test-tools: building versitygw $VGW from tests/s3/tools (about two minutes on 2 cores)" >&2
cd "$MOD"
export CGO_ENABLED=0 GOFLAGS=-mod=readonly
go build -trimpath -ldflags "-s -w -X main.Version=$VGW" -o "$GO_TOOL_CACHE_STAGE/versitygw" \
  github.com/versity/versitygw/cmd/versitygw
go_tool_cache_commit
