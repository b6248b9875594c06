#!/usr/bin/env bash
# scripts/control-plane against what it promises: the real etcd,
# kube-apiserver and kube-controller-manager up on loopback with RBAC, the
# audit log and the garbage collector; the product's CRD compiled by the real
# server (CEL rules, printer columns, pruning); kubectl and helm linked;
# clear errors naming the component and its log within 60 s; nothing left
# behind by a supervisor that is killed or whose parent dies.
# usage: control_plane_test.sh REPO_ROOT
set -u
ROOT=$1
CP=$ROOT/scripts/control-plane
source "$(dirname "$0")/../testing/shell_checks.sh"
# Control planes started detached (`start`) are stopped too.
trap 'for d in "$TMP"/*/; do [ -f "$d/supervisor.pid" ] && "$CP" stop "$d" >/dev/null 2>&1; done; cleanup' EXIT
# The processes of a control plane in DIR, found by their command line.
procs_of() { pgrep -f -- "$1" | grep -v "^$$\$" || true; }

if ! "$ROOT/scripts/build-test-tools.sh" --dir >/dev/null; then
  echo "FAIL the control-plane binaries are not built (scripts/install-deps.sh builds them)"
  echo "0 passed, 1 failed"
  exit 1
fi

# 1. Tied to this shell: run in the background with a parent-death signal, then wait.
D=$TMP/cp
t0=$(date +%s)
setpriv --pdeathsig TERM "$CP" run "$D" 2>"$TMP/run.err" &
PIDS+=($!)
"$CP" wait "$D"
rc=$?  # before the message's command substitutions overwrite $?
check "the control plane is ready ($(( $(date +%s) - t0 )) s)" $rc
[ $rc -eq 0 ] || finish  # nothing below can pass without it
export KUBECONFIG=$D/kubeconfig
K() { "$D/bin/kubectl" --request-timeout=20s "$@"; }
ver=$(K version -o json 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["serverVersion"]["gitVersion"])')
want=$(awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v/ {print $2}' "$ROOT/tests/tools/go.mod")
[ "$ver" = "$want" ]
check "kubectl reaches kube-apiserver $ver (go.mod pins $want)" $?
helm_version=$("$D/bin/helm" version --short 2>/dev/null)
grep -q '^v3\.' <<<"$helm_version"
check "helm is linked into DIR/bin ($helm_version)" $?
K get --raw /readyz >/dev/null 2>&1
check "/readyz answers with the admin kubeconfig" $?

# 2. RBAC is on: a service account with no role is refused.
K create namespace cp-test >/dev/null
K -n cp-test create serviceaccount nobody >/dev/null
out=$(K auth can-i list configmaps -n cp-test --as=system:serviceaccount:cp-test:nobody 2>&1)
[ "$out" = "no" ]
check "RBAC authorizes: an unbound service account may not list configmaps ($out)" $?

# 3. The CRD, compiled by the real server: structural schema, CEL, printer columns.
K apply -f "$ROOT/crds/dataloadjobs.meshload.io.yaml" >"$TMP/out" 2>&1
check "the CRD is accepted" $?
K wait --for condition=Established --timeout=30s crd/dataloadjobs.meshload.io >/dev/null 2>&1
check "the CRD is Established" $?
K -n cp-test apply -f "$ROOT/examples/local-fixedrecord.yaml" >"$TMP/out" 2>&1
check "the example DataLoadJob is accepted" $?
K -n cp-test get dlj local-fixedrecord >"$TMP/out" 2>&1
head -1 "$TMP/out" | grep -Eq '^NAME +STRATEGY +PROCESSES +READY +PHASE +STEP +AGE$' &&
  grep -Eq '^local-fixedrecord +PerProcess +2 ' "$TMP/out"
check "kubectl get dlj prints the printer columns" $?
long=$(printf 'a%.0s' $(seq 64))
sed "s/name: local-fixedrecord/name: $long/" "$ROOT/examples/local-fixedrecord.yaml" |
  K -n cp-test apply -f - >"$TMP/out" 2>&1
rc=$?
[ $rc -ne 0 ] && grep -q "the name is at most 63 characters" "$TMP/out"
check "the CRD's CEL rule refuses a 64-character name" $?
sed 's/  batch:/  batch:\n    unknownField: 1/' "$ROOT/examples/local-fixedrecord.yaml" |
  sed 's/name: local-fixedrecord/name: pruned/' | K -n cp-test apply -f - >/dev/null 2>&1
[ -z "$(K -n cp-test get dlj pruned -o jsonpath='{.spec.batch.unknownField}' 2>/dev/null)" ]
check "unknown fields are pruned" $?
grep -q '"verb":"create".*"resource":"dataloadjobs"' "$D/logs/audit.log"
check "the audit log records the writes" $?

# 4. The garbage collector: an object owned by a DataLoadJob goes with it.
uid=$(K -n cp-test get dlj local-fixedrecord -o jsonpath='{.metadata.uid}')
cat <<EOF | K -n cp-test apply -f - >/dev/null
apiVersion: v1
kind: ConfigMap
metadata:
  name: owned
  ownerReferences:
  - {apiVersion: meshload.io/v1alpha1, kind: DataLoadJob, name: local-fixedrecord, uid: $uid}
data: {a: b}
EOF
K -n cp-test delete dlj local-fixedrecord --wait=true >/dev/null
# kube-controller-manager's garbage collector finds a new resource (the
# CRD's) by rediscovering the API every 30 s: allow it three rounds.
gone=1
for _ in $(seq 450); do K -n cp-test get configmap owned >/dev/null 2>&1 || { gone=0; break; }; sleep 0.2; done
check "deleting the DataLoadJob removes the ConfigMap it owns (garbage collector)" $gone

# 5. The Job controller runs (a Job gets its pods; no kubelet runs them).
K -n cp-test create job j --image=busybox -- true >/dev/null
made=1
for _ in $(seq 150); do [ -n "$(K -n cp-test get pods -l job-name=j -o name 2>/dev/null)" ] && { made=0; break; }; sleep 0.2; done
check "the Job controller makes the Job's pod" $made

# 6. A supervisor whose parent dies takes every component with it.
before=$(procs_of "$D" | wc -l)
[ "$before" -ge 4 ]
check "etcd, kube-apiserver, kube-controller-manager and the supervisor run ($before processes)" $?
# A parent that starts the control plane, waits until it is ready and dies
# with SIGKILL (the outer bash reports the kill into /dev/null).
cat >"$TMP/parent.sh" <<EOF
setpriv --pdeathsig TERM '$CP' run '$TMP/orphan' 2>/dev/null &
'$CP' wait '$TMP/orphan' >/dev/null 2>&1
kill -9 \$\$
EOF
bash -c "bash '$TMP/parent.sh'; true" 2>/dev/null
left=1
for _ in $(seq 100); do [ "$(procs_of "$TMP/orphan" | wc -l)" -eq 0 ] && { left=0; break; }; sleep 0.2; done
check "nothing is left when the supervisor's parent is killed" $left
"$CP" start "$TMP/killed" >/dev/null 2>&1
kill -KILL "$(cat "$TMP/killed/supervisor.pid")"
left=1
for _ in $(seq 100); do [ "$(procs_of "$TMP/killed" | wc -l)" -eq 0 ] && { left=0; break; }; sleep 0.2; done
check "nothing is left when the supervisor is killed with SIGKILL" $left

# 7. Start and stop, as a developer uses them.
out=$("$CP" start "$TMP/dev" 2>&1)
echo "$out" | grep -q "export KUBECONFIG=$TMP/dev/kubeconfig"
check "start returns once ready and says how to use it" $?
"$TMP/dev/bin/kubectl" --kubeconfig "$TMP/dev/kubeconfig" get ns default >/dev/null 2>&1
check "the started control plane answers" $?
"$CP" start "$TMP/dev" >"$TMP/out" 2>&1
[ $? -ne 0 ] && grep -q "already running" "$TMP/out"
check "a second start in the same directory is refused" $?
"$CP" stop "$TMP/dev"
sleep 0.5  # real time: the stopped processes (etcd, apiserver) exit on their own
[ "$(procs_of "$TMP/dev" | wc -l)" -eq 0 ]
check "stop leaves no process" $?

# 8. Clear errors, within 60 s: a port taken, a binary missing, a directory not writable.
port=$(awk '$1 == "apiserver" {print $2}' "$D/ports")
t0=$(date +%s)
MESHLOAD_APISERVER_PORT=$port "$CP" start "$TMP/taken" >"$TMP/out" 2>&1
rc=$?
took=$(( $(date +%s) - t0 ))
[ $rc -ne 0 ] && [ $took -le 60 ] && grep -q "kube-apiserver: " "$TMP/out" &&
  grep -q "$TMP/taken/logs/kube-apiserver.log" "$TMP/out"
check "a port taken: an error naming kube-apiserver and its log, in ${took} s" $?
[ "$(procs_of "$TMP/taken" | wc -l)" -eq 0 ]
check "a failed start leaves no process" $?
MESHLOAD_TEST_TOOLS_CACHE=$TMP/empty-cache "$CP" start "$TMP/nobin" >"$TMP/out" 2>&1
[ $? -ne 0 ] && grep -q "not built" "$TMP/out"
check "binaries missing: an error saying to build them" $?
mkdir -p "$TMP/ro/etcd" && chmod 500 "$TMP/ro/etcd"
if [ "$(id -u)" -ne 0 ]; then
  "$CP" start "$TMP/ro" >"$TMP/out" 2>&1
  [ $? -ne 0 ] && grep -q "etcd: " "$TMP/out"
  check "a data directory that cannot be written: an error naming etcd" $?
else
  # root writes anywhere; a file where the data directory should be fails the same way.
  chmod 700 "$TMP/ro/etcd" && rm -rf "$TMP/ro/etcd" && echo x >"$TMP/ro/etcd"
  "$CP" start "$TMP/ro" >"$TMP/out" 2>&1
  [ $? -ne 0 ] && grep -q "etcd" "$TMP/out"
  check "a data directory that cannot be made: an error naming etcd" $?
fi

finish
