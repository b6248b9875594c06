# Sourced, not run: the cache of test-tool binaries built from a pinned Go
# module, shared by scripts/build-test-tools.sh (tests/tools: the control
# plane and faultproxy) and scripts/build-s3-test-tools.sh (tests/s3/tools:
# versitygw).
#
# A build lives in CACHE_DIR/KEY/bin, KEY the first 16 hex digits of the
# sha256 of everything the binaries are made of: the module's *.go, go.mod and
# go.sum, the calling script, this file, and the Go version. A build is made
# in a staging directory (CACHE_DIR/.build-XXXXXX, removed if the script
# fails) and moved into place whole, so a failed build leaves nothing in the
# cache; then the builds of other keys in CACHE_DIR are removed (only
# directories named like a key: another script's cache below CACHE_DIR, such
# as s3/ or crds-KEY/, is left alone).
#
# Use, in a script with `set -euo pipefail`:
#
#   source "$ROOT/scripts/lib/go-tool-cache.sh"
#   go_tool_cache_init NAME WHAT MODULE_DIR SCRIPT "$(go_tool_cache_root)"
#   go_tool_cache_answer "${1:-}" "NOT-BUILT MESSAGE" TOOL...   # exits when cached or --dir
#   go_tool_cache_stage                                          # GO_TOOL_CACHE_STAGE
#   ... go build -o "$GO_TOOL_CACHE_STAGE/TOOL" ...
#   go_tool_cache_commit                                         # prints the bin dir
#
# Messages go to stderr prefixed with NAME; the bin dir alone to stdout.
#
# Variables it sets: GO_TOOL_CACHE_NAME, GO_TOOL_CACHE_DIR, GO_TOOL_CACHE_KEY,
# GO_TOOL_CACHE_BIN (go_tool_cache_init); GO_TOOL_CACHE_STAGE,
# GO_TOOL_CACHE_START (go_tool_cache_stage). go_tool_cache_stage sets an
# EXIT trap (the script must not have one of its own).

GO_TOOL_CACHE_LIB=${BASH_SOURCE[0]}

# go_tool_cache_root: prints the root of the test tools' caches,
# ${MESHLOAD_TEST_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/meshload/test-tools}.
go_tool_cache_root() {
  echo "${MESHLOAD_TEST_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/meshload/test-tools}"
}

# go_tool_cache_require_go NAME WHAT MODULE_DIR: exits 1, saying so on
# stderr, when go is not installed ("NAME: go is not installed (WHAT need Go
# VERSION or newer)", VERSION from MODULE_DIR/go.mod).
go_tool_cache_require_go() {
  if ! command -v go >/dev/null 2>&1; then
    echo "$1: go is not installed ($2 need Go $(sed -n 's/^go //p' "$3/go.mod") or newer)" >&2
    exit 1
  fi
}

# go_tool_cache_key MODULE_DIR SCRIPT: prints the key of a build: the module's
# *.go, go.mod and go.sum (in name order), SCRIPT, this file and the Go
# version, hashed.
go_tool_cache_key() {
  local mod=$1 script=$2
  ( (cd "$mod" && find . -name '*.go' -o -name go.mod -o -name go.sum | LC_ALL=C sort | xargs cat)
    cat "$script" "$GO_TOOL_CACHE_LIB"
    go env GOVERSION ) | sha256sum | cut -c1-16
}

# go_tool_cache_init NAME WHAT MODULE_DIR SCRIPT CACHE_DIR: checks that go is
# installed (go_tool_cache_require_go) and sets GO_TOOL_CACHE_NAME (NAME, the
# messages' prefix), GO_TOOL_CACHE_DIR (CACHE_DIR), GO_TOOL_CACHE_KEY and
# GO_TOOL_CACHE_BIN (CACHE_DIR/KEY/bin).
go_tool_cache_init() {
  go_tool_cache_require_go "$1" "$2" "$3"
  GO_TOOL_CACHE_NAME=$1
  GO_TOOL_CACHE_DIR=$5
  GO_TOOL_CACHE_KEY=$(go_tool_cache_key "$3" "$4")
  GO_TOOL_CACHE_BIN=$GO_TOOL_CACHE_DIR/$GO_TOOL_CACHE_KEY/bin
}

# go_tool_cache_built TOOL...: whether every TOOL is in GO_TOOL_CACHE_BIN
# (executable).
go_tool_cache_built() {
  local t
  for t in "$@"; do [ -x "$GO_TOOL_CACHE_BIN/$t" ] || return 1; done
}

# go_tool_cache_answer MODE NOT_BUILT TOOL...: answers from the cache when it
# can, and then exits the script:
#   MODE --dir, built:      prints the bin dir; exit 0
#   MODE --dir, not built:  "NAME: NOT_BUILT" on stderr; exit 1
#   other MODE, built:      "NAME: cached in BIN" on stderr, the bin dir; exit 0
# Returns (0) when a build is needed: another MODE and not built.
go_tool_cache_answer() {
  local mode=$1 not_built=$2
  shift 2
  if [ "$mode" = "--dir" ]; then
    if go_tool_cache_built "$@"; then echo "$GO_TOOL_CACHE_BIN"; exit 0; fi
    echo "$GO_TOOL_CACHE_NAME: $not_built" >&2
    exit 1
  fi
  if go_tool_cache_built "$@"; then
    echo "$GO_TOOL_CACHE_NAME: cached in $GO_TOOL_CACHE_BIN" >&2
    echo "$GO_TOOL_CACHE_BIN"
    exit 0
  fi
}

# go_tool_cache_stage: makes the staging directory GO_TOOL_CACHE_STAGE in
# GO_TOOL_CACHE_DIR, removed when the script exits unless
# go_tool_cache_commit moved it into place, and starts the build's clock
# (GO_TOOL_CACHE_START).
go_tool_cache_stage() {
  mkdir -p "$GO_TOOL_CACHE_DIR"
  GO_TOOL_CACHE_STAGE=$(mktemp -d "$GO_TOOL_CACHE_DIR/.build-XXXXXX")
  trap 'rm -rf "$GO_TOOL_CACHE_STAGE"' EXIT
  GO_TOOL_CACHE_START=$(date +%s)
}

# go_tool_cache_commit: moves the staging directory into place as
# GO_TOOL_CACHE_BIN, removes the builds of other keys in GO_TOOL_CACHE_DIR
# (they are not used again), says "NAME: built in N s into BIN" on stderr and
# prints the bin dir.
go_tool_cache_commit() {
  mkdir -p "$GO_TOOL_CACHE_DIR/$GO_TOOL_CACHE_KEY"
  rm -rf "$GO_TOOL_CACHE_BIN"
  mv "$GO_TOOL_CACHE_STAGE" "$GO_TOOL_CACHE_BIN"
  trap - EXIT
  local old name
  for old in "$GO_TOOL_CACHE_DIR"/*/; do
    name=$(basename "$old")
    if [[ $name =~ ^[0-9a-f]{16}$ ]] && [ "$name" != "$GO_TOOL_CACHE_KEY" ]; then
      rm -rf "$old"
    fi
  done
  echo "$GO_TOOL_CACHE_NAME: built in $(( $(date +%s) - GO_TOOL_CACHE_START )) s into $GO_TOOL_CACHE_BIN" >&2
  echo "$GO_TOOL_CACHE_BIN"
}
