#!/usr/bin/env bash
# What a user does with kubectl, against the real control plane
# (scripts/control-plane) with meshload-controller running as the chart's
# ServiceAccount (its roles as `helm template` renders them): apply the CRD
# and a job, `kubectl get dlj` (printer columns), `kubectl wait
# --for=condition=Planned`, `kubectl describe` (the controller's Events),
# `kubectl get -o jsonpath`, and `kubectl delete` (the finalizer runs; the
# ConfigMap and the peer Secret go); and, with the controller stopped, the
# real garbage collector following the owner references.
# usage: kubectl_test.sh MESHLOAD_CONTROLLER_BINARY REPO_ROOT
set -u
CONTROLLER=$1
ROOT=$2
source "$(dirname "$0")/../testing/shell_checks.sh"
source "$(dirname "$0")/../testing/control_plane.sh"
CTRL=

start_control_plane "$ROOT"
NS=kubectl-test

k apply -f "$ROOT/crds/dataloadjobs.meshload.io.yaml" >/dev/null &&
  k wait --for condition=Established --timeout=30s crd/dataloadjobs.meshload.io >/dev/null
check "kubectl apply the CRD; it is Established" $?
k create namespace "$NS" >/dev/null
for _ in $(seq 100); do k -n "$NS" get serviceaccount default >/dev/null 2>&1 && break; sleep 0.2; done

# The controller as the chart's ServiceAccount, with the roles and Lease
# `helm template` renders for a release in $NS (a token from the TokenRequest API).
"$TMP/cp/bin/helm" template meshload "$ROOT/charts/meshload" -n "$NS" --show-only templates/serviceaccount.yaml \
  --show-only templates/rbac.yaml --show-only templates/lease.yaml | k apply -f - >"$TMP/rbac.out" 2>&1
rc=$?
check "the chart's ServiceAccount, roles and Lease are applied" $rc
[ $rc -eq 0 ] || cat "$TMP/rbac.out"
# The authoriser follows the roles by its own watch: wait until it allows them.
for _ in $(seq 100); do
  [ "$(k auth can-i watch dataloadjobs.meshload.io --all-namespaces --as "system:serviceaccount:$NS:meshload")" = yes ] &&
    [ "$(k -n "$NS" auth can-i update leases.coordination.k8s.io/meshload --as "system:serviceaccount:$NS:meshload")" = yes ] && break
  sleep 0.1
done
service_account_kubeconfig "$NS" meshload "$TMP/sa.kubeconfig"
setpriv --pdeathsig KILL "$CONTROLLER" --kubeconfig "$TMP/sa.kubeconfig" --metrics-port 0 --metrics-address 127.0.0.1 \
  --leader-election-namespace "$NS" --leader-election-id meshload --log-format kv >"$TMP/controller.log" 2>&1 &
CTRL=$!
PIDS+=($CTRL)

# A job selecting its trainer pods, and two pods the test plays the kubelet for.
sed 's/^spec:/spec:\n  selector: {matchLabels: {app: trainer}}/' "$ROOT/examples/local-fixedrecord.yaml" >"$TMP/job.yaml"
k -n "$NS" apply -f "$TMP/job.yaml" >"$TMP/out" 2>&1
check "kubectl apply the job" $?
k -n "$NS" apply -f "$TMP/job.yaml" 2>&1 | grep -q "unchanged"
check "applying it again changes nothing" $?
for i in 0 1; do
  cat <<EOF | k -n "$NS" apply -f - >/dev/null
apiVersion: v1
kind: Pod
metadata:
  name: trainer-$i
  labels: {app: trainer}
  annotations: {batch.kubernetes.io/job-completion-index: "$i"}
spec:
  containers:
  - {name: trainer, image: trainer:1}
  - {name: meshload-sidecar, image: meshload/sidecar:0.1.0}
EOF
done

k -n "$NS" wait --for=condition=Planned --timeout=30s dlj/local-fixedrecord >"$TMP/out" 2>&1
check "kubectl wait --for=condition=Planned dlj/local-fixedrecord" $?
k -n "$NS" get dlj local-fixedrecord >"$TMP/out" 2>&1
head -1 "$TMP/out" | grep -Eq '^NAME +STRATEGY +PROCESSES +READY +PHASE +STEP +AGE$' &&
  grep -Eq '^local-fixedrecord +PerProcess +2 +0 +Pending ' "$TMP/out"
check "kubectl get dlj: Pending, 0 ready, in the printer columns" $?

# The kubelet's part: both sidecars running and ready.
for i in 0 1; do
  k -n "$NS" patch pod "trainer-$i" --subresource=status --type=merge -p "{\"status\": {\"phase\": \"Running\",
    \"podIP\": \"10.0.0.$((i + 10))\", \"podIPs\": [{\"ip\": \"10.0.0.$((i + 10))\"}],
    \"containerStatuses\": [
      {\"name\": \"trainer\", \"image\": \"trainer:1\", \"imageID\": \"\", \"ready\": true, \"restartCount\": 0, \"state\": {\"running\": {}}},
      {\"name\": \"meshload-sidecar\", \"image\": \"meshload/sidecar:0.1.0\", \"imageID\": \"\", \"ready\": true, \"restartCount\": 0, \"state\": {\"running\": {}}}]}}" >/dev/null
done
k -n "$NS" wait --for=condition=SidecarsReady --timeout=30s dlj/local-fixedrecord >/dev/null 2>&1
check "kubectl wait --for=condition=SidecarsReady once the pods are ready" $?
k -n "$NS" get dlj local-fixedrecord >"$TMP/out" 2>&1
grep -Eq '^local-fixedrecord +PerProcess +2 +2 +Running ' "$TMP/out"
check "kubectl get dlj: Running, 2 ready" $?
[ "$(k -n "$NS" get dlj local-fixedrecord -o jsonpath='{.status.peerSecretName}')" = "local-fixedrecord-meshload-peer" ]
check "kubectl get -o jsonpath reads the status" $?

k -n "$NS" describe dlj local-fixedrecord >"$TMP/describe" 2>&1
grep -q "^Events:" "$TMP/describe" && grep -Eq "Normal +Resolved +.*meshload-controller" "$TMP/describe" &&
  grep -Eq "Normal +AllSidecarsReady +.*2 of 2 sidecars ready" "$TMP/describe"
check "kubectl describe dlj shows the controller's Events" $?

k -n "$NS" get configmap local-fixedrecord-meshload >/dev/null 2>&1 &&
  k -n "$NS" get secret local-fixedrecord-meshload-peer >/dev/null 2>&1
check "the job's ConfigMap and peer Secret exist" $?
k -n "$NS" delete dlj local-fixedrecord --timeout=30s >/dev/null 2>&1
check "kubectl delete dlj returns once the finalizer has run" $?
gone=1
for _ in $(seq 100); do
  if ! k -n "$NS" get configmap local-fixedrecord-meshload >/dev/null 2>&1 &&
     ! k -n "$NS" get secret local-fixedrecord-meshload-peer >/dev/null 2>&1; then gone=0; break; fi
  sleep 0.2
done
check "the ConfigMap and the peer Secret are gone" $gone

# The owner references work without the controller: with it stopped and the
# finalizer taken off, the real garbage collector removes what the job owned.
sed 's/name: local-fixedrecord/name: orphaned/' "$TMP/job.yaml" | k -n "$NS" apply -f - >/dev/null
k -n "$NS" wait --for=condition=Planned --timeout=30s dlj/orphaned >/dev/null 2>&1
made=$?
for _ in $(seq 100); do k -n "$NS" get secret orphaned-meshload-peer >/dev/null 2>&1 && break; sleep 0.2; done
kill "$CTRL" && wait "$CTRL" 2>/dev/null
k -n "$NS" patch dlj orphaned --type=json -p '[{"op": "remove", "path": "/metadata/finalizers"}]' >/dev/null &&
  k -n "$NS" delete dlj orphaned --timeout=30s >/dev/null
# The garbage collector finds the CRD's resource by rediscovering the API
# every 30 s: allow it three rounds.
gone=1
for _ in $(seq 450); do
  if ! k -n "$NS" get configmap orphaned-meshload >/dev/null 2>&1 &&
     ! k -n "$NS" get secret orphaned-meshload-peer >/dev/null 2>&1; then gone=0; break; fi
  sleep 0.2
done
[ $made -eq 0 ] && [ $gone -eq 0 ]
check "with the controller stopped, the garbage collector removes the job's ConfigMap and Secret" $?

sa_requests=$(grep -c "\"username\":\"system:serviceaccount:$NS:meshload\"" "$TMP/cp/logs/audit.log")
refused=$(grep "\"username\":\"system:serviceaccount:$NS:meshload\"" "$TMP/cp/logs/audit.log" | grep -c '"code":403')
[ "$sa_requests" -gt 0 ] && [ "$refused" -eq 0 ]
check "the server refused the controller nothing with the chart's roles ($sa_requests requests in the audit log)" $?

if [ "$fail" -ne 0 ]; then
  echo "--- controller log (last 30 lines)"
  tail -30 "$TMP/controller.log"
fi
finish
