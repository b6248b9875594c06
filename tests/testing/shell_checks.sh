# The common part of the end-to-end shell tests; source it after `set -u`:
#   source "$(dirname "$0")/../testing/shell_checks.sh"
# It gives:
#   TMP            a scratch directory, removed at exit
#   PIDS           processes to kill at exit (PIDS+=($!))
#   check NAME RC  counts RC 0 as passed ("ok   NAME"), else failed ("FAIL NAME")
#   skipped NAME WHY
#                  counts a check that cannot run here ("SKIP NAME: WHY"), never as passed
#   wait_for FILE PATTERN [SECONDS]
#                  waits until FILE has a line matching PATTERN (grep -E), at
#                  most SECONDS (default 30); returns 1 if it never does. Use
#                  it instead of sleeping: a loaded machine (TSan, CI) can take
#                  seconds where an idle one takes milliseconds.
#   finish         prints "N passed, N failed[, N skipped]" and exits 1 if any failed
#   listen_port    a port to listen on: below the kernel's ephemeral range
#                  (32768 and up by default), so no outgoing connection of a
#                  test running beside this one holds it
#   start_prometheus CONFIG PORT
#                  runs prometheus with CONFIG on 127.0.0.1:PORT, its data in
#                  $TMP/tsdb and its log in $TMP/prom.log (killed at exit)
#   prometheus_until PORT QUERY PATTERN [SECONDS]
#                  polls that Prometheus' instant QUERY (URL-encoded) every
#                  0.5 s until its answer matches PATTERN (grep), at most
#                  SECONDS (default 30); returns 1 if it never does
TMP=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$TMP"
}
trap cleanup EXIT
pass=0 fail=0 skip=0
check() { if [ "$2" -eq 0 ]; then pass=$((pass + 1)); echo "ok   $1"; else fail=$((fail + 1)); echo "FAIL $1"; fi; }
skipped() { skip=$((skip + 1)); echo "SKIP $1: $2"; }
wait_for() {
  local deadline=$((SECONDS + ${3:-30}))
  until grep -qE -- "$2" "$1" 2>/dev/null; do
    [ $SECONDS -ge $deadline ] && return 1
    sleep 0.05
  done
}
finish() {
  if [ $skip -gt 0 ]; then echo "$pass passed, $fail failed, $skip skipped"; else echo "$pass passed, $fail failed"; fi
  [ $fail -eq 0 ]
  exit $?
}
listen_port() { echo $((20000 + RANDOM % 12000)); }
start_prometheus() {
  prometheus --config.file="$1" --storage.tsdb.path="$TMP/tsdb" \
    --web.listen-address="127.0.0.1:$2" --log.level=warn >"$TMP/prom.log" 2>&1 &
  PIDS+=($!)
}
prometheus_until() {
  local r
  for _ in $(seq $((${4:-30} * 2))); do
    sleep 0.5
    r=$(curl -sf "http://127.0.0.1:$1/api/v1/query?query=$2" 2>/dev/null)
    grep -q -- "$3" <<<"$r" && return 0
  done
  return 1
}

# two_process_job FILE NAME FIRST_AXIS SPEC: writes a DataLoadJob manifest
# of 2 processes x 2 devices to FILE, whose mesh axes are FIRST_AXIS (model
# or data) then the other, batched over `data`; SPEC is the rest of the
# spec, lines indented by two spaces.
two_process_job() {
  local second=data
  [ "$3" = data ] && second=model
  cat >"$1" <<YAML
apiVersion: meshload.io/v1alpha1
kind: DataLoadJob
metadata: {name: $2}
spec:
  mesh:
    processes: 2
    devicesPerProcess: 2
    axes: [{name: $3, size: 2}, {name: $second, size: 2}]
    batchAxes: [data]
$4
YAML
}
