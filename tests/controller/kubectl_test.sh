#!/usr/bin/env bash
# The real kubectl against the fake API server: discovery, OpenAPI, apply
# (create, then merge patch for a custom resource and strategic merge patch
# for a pod), server-side Tables with the CRD's printer columns, get -o json,
# and delete (DeleteOptions body, then the wait for the object to go).
# No --validate=false anywhere: the fake serves the OpenAPI kubectl needs.
# usage: kubectl_test.sh FAKE_APISERVER_BINARY REPO_ROOT
#
# kubectl is required: a machine without it FAILS, except where it cannot be
# had from the distribution (it is not a Debian bookworm package), where the
# test prints SKIP and exits 0, counting nothing as passed (ctest reports it
# as skipped); MESHLOAD_REQUIRE_KUBECTL=1 turns that case into a failure.
set -u
BIN=$1
ROOT=$2
KUBECTL=${KUBECTL:-kubectl}
if ! command -v "$KUBECTL" >/dev/null 2>&1; then
  if [ "${MESHLOAD_REQUIRE_KUBECTL:-0}" = 1 ]; then
    echo "FAIL kubectl is not installed and MESHLOAD_REQUIRE_KUBECTL=1"
    echo "0 passed, 1 failed"
    exit 1
  fi
  echo "SKIP kubectl is not installed (not a Debian package); nothing was tested"
  echo "0 passed, 0 failed, 1 skipped"
  exit 0
fi
TMP=$(mktemp -d)
SERVER_PID=
cleanup() {
  if [ -n "$SERVER_PID" ]; then kill "$SERVER_PID" 2>/dev/null; wait "$SERVER_PID" 2>/dev/null; fi
  rm -rf "$TMP"
}
trap cleanup EXIT
pass=0
fail=0
check() {  # check NAME CONDITION-EXIT-CODE
  if [ "$2" -eq 0 ]; then pass=$((pass + 1)); echo "ok   $1"; else fail=$((fail + 1)); echo "FAIL $1"; fi
}
# A private discovery cache: a stale one from an earlier run on the same
# port would hide discovery bugs.
k() { "$KUBECTL" --cache-dir "$TMP/cache" --request-timeout=20s "$@"; }
# jsonpath of an object, or the empty string.
field() { k get "$@" 2>/dev/null; }

"$BIN" --port 0 --kubeconfig-out "$TMP/kubeconfig" >"$TMP/port" 2>"$TMP/server.err" &
SERVER_PID=$!
for _ in $(seq 600); do [ -s "$TMP/kubeconfig" ] && [ -s "$TMP/port" ] && break; sleep 0.05; done
export KUBECONFIG=$TMP/kubeconfig
echo "kubectl: $("$KUBECTL" version --client 2>&1 | head -1); server port $(cat "$TMP/port")"

# 1. Discovery: kubectl negotiates the legacy format and reads the version.
out=$(k version 2>&1)
grep -q "Server Version: v1.29.0-meshload-fake" <<<"$out"
check "kubectl version reads /version" $?
out=$(k api-resources 2>&1)
grep -Eq "^pods +po +v1 +true +Pod" <<<"$out" && grep -q "customresourcedefinitions" <<<"$out"
check "kubectl api-resources lists the built-ins" $?

# 2. The CRD, applied with client-side validation on (the default).
k apply -f "$ROOT/crds/dataloadjobs.meshload.io.yaml" >"$TMP/out" 2>&1
check "apply the CRD" $?
ok=1
for _ in $(seq 50); do
  if k get crd dataloadjobs.meshload.io >/dev/null 2>&1; then ok=0; break; fi
  sleep 0.1
done
check "get crd dataloadjobs.meshload.io" $ok
out=$(k api-resources --api-group=meshload.io 2>&1)
grep -Eq "^dataloadjobs +dlj +meshload.io/v1alpha1 +true +DataLoadJob" <<<"$out"
check "the CRD's resource and short name are discoverable" $?

# 3. A namespace, then the example job in it.
k create namespace training >"$TMP/out" 2>&1 && grep -q "namespace/training created" "$TMP/out"
check "create namespace training" $?
k apply -f "$ROOT/examples/hybrid-fsdp.yaml" >"$TMP/out" 2>&1 &&
  grep -q "dataloadjob.meshload.io/hybrid-fsdp created" "$TMP/out"
check "apply examples/hybrid-fsdp.yaml creates it" $?

# 4. kubectl get by short name prints the CRD's printer columns (a Table).
out=$(k get dlj -n training 2>&1)
echo "$out" | sed 's/^/     | /'
grep -Eq "^NAME +STRATEGY +PROCESSES +READY +PHASE +AGE" <<<"$out" &&
  grep -Eq "^hybrid-fsdp +PerProcess +4 " <<<"$out"
check "get dlj shows the printer columns" $?
out=$(k get meshload -n training 2>&1)
grep -q "hybrid-fsdp" <<<"$out"
check "get by category (meshload)" $?

# 5. -o json round-trips the spec.
k get dataloadjob hybrid-fsdp -n training -o json >"$TMP/job.json" 2>&1
python3 - "$TMP/job.json" <<'PYEOF'
import json, sys
j = json.load(open(sys.argv[1]))
s = j["spec"]
assert j["kind"] == "DataLoadJob" and j["apiVersion"] == "meshload.io/v1alpha1", j
assert j["metadata"]["namespace"] == "training" and j["metadata"]["generation"] == 1
assert s["mesh"]["processes"] == 4 and s["mesh"]["devicesPerProcess"] == 2
assert [a["name"] for a in s["mesh"]["axes"]] == ["data", "fsdp", "model"]
assert s["mesh"]["batchAxes"] == ["data", "fsdp"]
assert s["batch"] == {"globalBatchSize": 32, "prefetch": 4}
assert s["dataset"]["uri"] == "/datasets/tokens/*.bin" and s["dataset"]["samples"] == 1000000
assert s["shuffle"] == {"mode": "Global", "seed": 1234}
PYEOF
check "get -o json round-trips the spec" $?

# 6. Apply again after a change: a merge patch that bumps the generation.
sed 's/prefetch: 4/prefetch: 8/' "$ROOT/examples/hybrid-fsdp.yaml" >"$TMP/job2.yaml"
k apply -f "$TMP/job2.yaml" >"$TMP/out" 2>&1 && grep -q "hybrid-fsdp configured" "$TMP/out"
check "apply a changed job configures it" $?
out=$(field dataloadjob hybrid-fsdp -n training -o 'jsonpath={.metadata.generation} {.spec.batch.prefetch}')
[ "$out" = "2 8" ]
check "the change bumped metadata.generation to 2 (got '$out')" $?
k apply -f "$TMP/job2.yaml" >"$TMP/out" 2>&1 && grep -q "hybrid-fsdp unchanged" "$TMP/out"
check "applying the same manifest again changes nothing" $?

# 6b. The CRD's schema is enforced server-side: an invalid job is a 422 (kubectl
# reprints the Status message as "The DataLoadJob \"broken\" is invalid: ...").
sed -e 's/name: hybrid-fsdp/name: broken/' -e 's/strategy: PerProcess/strategy: PerProces/' \
  "$ROOT/examples/hybrid-fsdp.yaml" >"$TMP/bad.yaml"
k apply -f "$TMP/bad.yaml" >"$TMP/out" 2>&1
rc=$?
[ $rc -ne 0 ] && grep -q 'DataLoadJob[.a-z]* "broken" is invalid: spec.strategy: Unsupported value: "PerProces"' "$TMP/out"
check "apply of an invalid job prints the server's 422 (rc $rc: $(head -c 300 "$TMP/out"))" $?
out=$(k get dataloadjob broken -n training 2>&1)
grep -q 'NotFound' <<<"$out"
check "the invalid job was not stored" $?

# 7. A pod: create, then a strategic merge patch on re-apply.
cat >"$TMP/pod.yaml" <<'YAML'
apiVersion: v1
kind: Pod
metadata:
  name: trainer-0
  namespace: training
  labels: {app: llama-trainer}
spec:
  containers:
  - name: trainer
    image: busybox
    command: [sleep, "3600"]
YAML
k apply -f "$TMP/pod.yaml" >"$TMP/out" 2>&1 && grep -q "pod/trainer-0 created" "$TMP/out"
check "apply a pod" $?
out=$(k get pods -n training 2>&1)
echo "$out" | sed 's/^/     | /'
grep -Eq "^NAME +READY +STATUS +RESTARTS +AGE" <<<"$out" && grep -Eq "^trainer-0 +0/1 +Pending" <<<"$out"
check "get pods -n training" $?
sed -i 's/labels: {app: llama-trainer}/labels: {app: llama-trainer, rank: "0"}/' "$TMP/pod.yaml"
k apply -f "$TMP/pod.yaml" >"$TMP/out" 2>&1 && grep -q "pod/trainer-0 configured" "$TMP/out"
check "re-apply the pod (strategic merge patch)" $?
out=$(field pod trainer-0 -n training -o 'jsonpath={.metadata.labels.rank} {.spec.containers[0].image}')
[ "$out" = "0 busybox" ]
check "the pod patch added the label and kept the spec (got '$out')" $?
out=$(k get pods -n training -l rank=0 -o name 2>&1)
[ "$out" = "pod/trainer-0" ]
check "get pods with a label selector" $?

# 8. Deletes: DeleteOptions bodies, then kubectl waits for the object to go.
k delete -f "$ROOT/examples/hybrid-fsdp.yaml" >"$TMP/out" 2>&1 &&
  grep -q 'dataloadjob.meshload.io "hybrid-fsdp" deleted' "$TMP/out"
check "delete -f examples/hybrid-fsdp.yaml" $?
out=$(k get dataloadjob hybrid-fsdp -n training 2>&1)
rc=$?
[ $rc -ne 0 ] && grep -q 'NotFound' <<<"$out"
check "the job is gone (NotFound)" $?
k delete pod trainer-0 -n training >"$TMP/out" 2>&1 && grep -q 'pod "trainer-0" deleted' "$TMP/out"
check "delete pod trainer-0" $?
out=$(k get pods -n training 2>&1)
grep -q "No resources found in training namespace" <<<"$out"
check "no pods left" $?

if [ $fail -ne 0 ]; then
  echo "--- fake-apiserver stderr"
  cat "$TMP/server.err"
fi
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
