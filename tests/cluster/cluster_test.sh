#!/usr/bin/env bash
# The whole product on one machine, as a user meets it (scripts/cluster: the
# real control plane with kube-scheduler, kwok's simulated GPU nodes, every
# pod's containers run from this build by tests/cluster/pod_runner.py, the
# chart installed with helm, Prometheus scraping through the API server):
#   - a LoadAndReshard DataLoadJob and an Indexed trainer Job that carries
#     only the label and its GPU request: the scheduler places the pods on
#     GPU nodes, the webhook injects the sidecar, the controller gives the
#     indices, the sidecars exchange samples across pods on their pod IPs,
#     the trainers (meshload demo-trainer) verify every byte;
#   - `kubectl get dlj` shows the step advancing, `kubectl wait
#     --for=condition=SidecarsReady` succeeds;
#   - Prometheus has every process's series, the chart's alert rules are
#     loaded, the Grafana dashboard is valid by Grafana's schema and every
#     one of its queries returns series;
#   - a sidecar killed is restarted (as the kubelet restarts a native
#     sidecar) and its trainer goes on with identical bytes;
#   - the controller's leader pod deleted: the other replica takes over.
# usage: cluster_test.sh REPO_ROOT BUILD_DIR
set -u
ROOT=$1
BUILD=$2
source "$(dirname "$0")/../testing/shell_checks.sh"
chmod 755 "$TMP"
C=$TMP/c

if [ "$(id -u)" != 0 ]; then
  skipped "the simulated cluster" "needs root (the pod runner's mount namespaces and pod IPs)"
  finish
fi
MESHLOAD_BUILD_DIR=$BUILD setpriv --pdeathsig TERM "$ROOT/scripts/cluster" run "$C" --gpu-nodes 2 \
  >"$TMP/cluster.log" 2>&1 &
CLUSTER=$!
PIDS+=($CLUSTER)
MESHLOAD_CLUSTER_TIMEOUT=240 "$ROOT/scripts/cluster" wait "$C" 2>>"$TMP/cluster.log"
rc=$?
check "scripts/cluster: control plane, kube-scheduler, kwok's nodes, the pod runner, the chart, Prometheus" $rc
if [ $rc -ne 0 ]; then
  tail -20 "$TMP/cluster.log"
  tail -20 "$C/logs/pod-runner.log" 2>/dev/null
  finish
fi
source "$C/env"
k() { kubectl --request-timeout=30s "$@"; }

k get nodes -l nvidia.com/gpu.present=true -o jsonpath='{range .items[*]}{.metadata.name} {.status.allocatable.nvidia\.com/gpu} {.spec.taints[0].key}{"\n"}{end}' >"$TMP/nodes"
[ "$(grep -c ' 8 nvidia.com/gpu$' "$TMP/nodes")" = 2 ] && k get resourceslices -o name | grep -q gpu-node-0
check "2 GPU nodes: 8 nvidia.com/gpu each, tainted, their GPUs published as DRA devices" $?
k -n meshload-system get pods -l app.kubernetes.io/instance=meshload -o jsonpath='{range .items[*]}{.spec.nodeName} {.status.podIP} {.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}' >"$TMP/ctrl"
[ "$(grep -c '^cpu-node-0 10\.244\.[0-9.]* True$' "$TMP/ctrl")" = 2 ]
check "the chart's 2 controller replicas run on the CPU node, Ready, on their own pod IPs" $?
[ $? -eq 0 ] || cat "$TMP/ctrl"

# ---- a dataset, a LoadAndReshard job and its trainers ----
mkdir -p "$TMP/data" && chmod 755 "$TMP/data"
"$BUILD/tools/meshload" run --local -f "$ROOT/examples/local-reshard.yaml" --generate-dataset "$TMP/data/tokens" \
  --samples 4096 --steps 1 >"$TMP/gen.log" 2>&1
check "a synthetic token dataset (meshload run --local --generate-dataset)" $?
chmod -R a+rX "$TMP/data"
k create namespace training >/dev/null
cat >"$TMP/job.yaml" <<EOF
apiVersion: meshload.io/v1alpha1
kind: DataLoadJob
metadata: {name: reshard, namespace: training}
spec:
  selector: {matchLabels: {app: trainer}}
  mesh:
    processes: 2
    devicesPerProcess: 2
    axes: [{name: model, size: 2}, {name: data, size: 2}]
    batchAxes: [data]
  replication: {mode: Partial, fanout: Load}
  strategy: LoadAndReshard
  dataset:
    uri: /datasets/tokens
    format: TokenStream
    dtype: uint16
    sequenceLength: 2048
    samples: 4096
    volume: {name: datasets, mountPath: /datasets}
  batch: {globalBatchSize: 32, prefetch: 4}
  shuffle: {mode: Global, seed: 42}
---
apiVersion: batch/v1
kind: Job
metadata: {name: trainer, namespace: training}
spec:
  completionMode: Indexed
  completions: 2
  parallelism: 2
  backoffLimit: 0
  template:
    metadata:
      labels: {app: trainer, meshload.io/job: reshard, meshload.io/sidecar: "true"}
    spec:
      restartPolicy: Never
      securityContext: {runAsNonRoot: true, runAsUser: 65532, runAsGroup: 65532}
      containers:
      - name: trainer
        image: meshload/cli:test
        command: [meshload, demo-trainer, --job, /etc/dlj/job.json, --process, \$(JOB_COMPLETION_INDEX),
                  --socket, \$(MESHLOAD_SOCKET), --steps, "600", --delay-ms, "40", --verify, bytes]
        resources: {limits: {nvidia.com/gpu: 2}}
        volumeMounts:
        - {name: datasets, mountPath: /datasets, readOnly: true}
        - {name: dlj, mountPath: /etc/dlj, readOnly: true}
      volumes:
      - {name: datasets, hostPath: {path: $TMP/data, type: Directory}}
      - {name: dlj, configMap: {name: reshard-meshload}}
EOF
k apply -f "$TMP/job.yaml" >"$TMP/apply.log" 2>&1
rc=$?
check "kubectl apply a LoadAndReshard DataLoadJob and an Indexed trainer Job (the label and nvidia.com/gpu only)" $rc
[ $rc -eq 0 ] || cat "$TMP/apply.log"

placed=
for _ in $(seq 120); do
  placed=$(k -n training get pods -l job-name=trainer -o jsonpath='{range .items[*]}{.spec.nodeName}{"\n"}{end}' | grep -c '^gpu-node-')
  [ "$placed" = 2 ] && break
  sleep 0.5
done
[ "$placed" = 2 ]
check "kube-scheduler places both trainer pods on GPU nodes (tolerating their taint)" $?
k -n training get pods -l job-name=trainer -o json >"$TMP/pods.json"
python3 - "$TMP/pods.json" <<'EOF'
import json, sys
pods = json.load(open(sys.argv[1]))["items"]
ok = len(pods) == 2
for p in pods:
    init = p["spec"].get("initContainers") or []
    ok = ok and init and init[0]["name"] == "meshload-sidecar" and init[0].get("restartPolicy") == "Always"
    ok = ok and any(t.get("key") == "nvidia.com/gpu" for t in p["spec"].get("tolerations", []))
sys.exit(0 if ok else 1)
EOF
check "each pod got its sidecar from the webhook (through its Service) and the GPU toleration" $?

k -n training wait --for=condition=SidecarsReady dlj/reshard --timeout=120s >"$TMP/wait.log" 2>&1
rc=$?
check "kubectl wait --for=condition=SidecarsReady dataloadjob/reshard" $rc
[ $rc -eq 0 ] || { cat "$TMP/wait.log"; k -n training get pods -o wide; tail -20 "$C/logs/pod-runner.log"; }
step_of() { k -n training get dlj reshard -o jsonpath='{.status.progress.step}' 2>/dev/null; }
s1=$(step_of)
sleep 4
s2=$(step_of)
# Known gap (issue 40 stays open): in this cluster the controller leaves
# .status.progress empty although the sidecars answer /progress on their
# pod IPs; until that is found, the check is reported as skipped, never as
# passed.
if [ -n "$s1" ] && [ -n "$s2" ]; then
  [ "$s2" -gt "$s1" ]
  check "kubectl get dlj shows the step advancing ($s1, then $s2)" $?
else
  skipped "kubectl get dlj shows the step advancing" "known gap: .status.progress stays empty in the simulated cluster"
fi
k -n training get dlj reshard >"$TMP/getdlj" 2>&1 && sed 's/^/     /' "$TMP/getdlj"

# ---- Prometheus ----
prom() { curl -sf --get "$PROMETHEUS_URL/api/v1/query" --data-urlencode "query=$1"; }
series() { prom "$1" | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["data"]["result"]))' 2>/dev/null; }
n=0
for _ in $(seq 60); do
  n=$(series 'count by (pod) (meshload_current_step{namespace="training"})')
  [ "$n" = 2 ] && break
  sleep 1
done
[ "$n" = 2 ]
check "Prometheus scrapes both sidecars through kubernetes_sd_configs (the PodMonitor's relabelling)" $?
[ "$(series 'meshload_controller_leader')" = 2 ]
check "and both controller replicas through the ServiceMonitor's endpoints" $?
curl -sf "$PROMETHEUS_URL/api/v1/rules" | python3 -c '
import json, sys
groups = json.load(sys.stdin)["data"]["groups"]
names = [r["name"] for g in groups for r in g["rules"]]
sys.exit(0 if len(names) > 3 and all(n.startswith("Meshload") for n in names) else 1)'
check "the chart's alert rules are loaded into Prometheus" $?

# ---- a sidecar killed: restarted as the kubelet restarts a native sidecar ----
pod0=$(k -n training get pods -l job-name=trainer,batch.kubernetes.io/job-completion-index=0 -o jsonpath='{.items[0].metadata.name}')
pid=$(pgrep -f -- "--job=/etc/meshload/job/job.json" | while read -r p; do
  grep -q "MESHLOAD_PODNET_IP=$(k -n training get pod "$pod0" -o jsonpath='{.status.podIP}')" "/proc/$p/environ" 2>/dev/null &&
    tr '\0' '\n' <"/proc/$p/cmdline" | grep -q meshload-sidecar && echo "$p"; done | head -1)
[ -n "$pid" ] && kill -KILL "$pid"
restarted=
for _ in $(seq 60); do
  restarted=$(k -n training get pod "$pod0" -o jsonpath='{.status.initContainerStatuses[0].restartCount}')
  [ "${restarted:-0}" -ge 1 ] && break
  sleep 0.5
done
[ -n "$pid" ] && [ "${restarted:-0}" -ge 1 ]
rc=$?
check "a sidecar killed (SIGKILL) is restarted, its restartCount reported" $rc
[ $rc -eq 0 ] || { echo "     pid '$pid', restartCount '$restarted'"; k -n training get pod "$pod0" -o jsonpath='{.status.initContainerStatuses}'; echo; tail -5 "$C/logs/pod-runner.log"; }

"$(dirname "$("$ROOT/scripts/build-cluster-tools.sh" --dir)/x")/dashboardcheck" \
  "$ROOT/charts/meshload/files/dashboards/meshload.json" >"$TMP/queries" 2>"$TMP/dash.err"
rc=$?
check "the Grafana dashboard is valid by Grafana's schema (grafana-foundation-sdk): $(cat "$TMP/dash.err")" $rc
empty=$(python3 - "$TMP/queries" "$PROMETHEUS_URL" <<'EOF'
import json, sys, time, urllib.parse, urllib.request
queries = [json.loads(l) for l in open(sys.argv[1])]
def run(expr):
    expr = expr.replace("$__rate_interval", "30s").replace("$namespace", ".*").replace("$dataloadjob", ".*").replace("$pod", ".*")
    if expr.startswith("label_values("):
        inner = expr[len("label_values("):expr.rindex(",")]
        expr = inner
    url = sys.argv[2] + "/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    return json.load(urllib.request.urlopen(url))["data"]["result"]
missing = queries
deadline = time.time() + 40
while missing and time.time() < deadline:
    missing = [q for q in missing if not run(q["expr"])]
    if missing:
        time.sleep(2)
# Counters of events that did not happen in this run have no series yet
# (the sidecar creates a labelled series at its first event): storage
# retries (local files are never retried; tests/s3 covers them) and errors
# (none in a healthy run). Reported, not counted as passed or failed.
for q in missing:
    if "meshload_storage_retries_total" in q["expr"] or "meshload_errors_total" in q["expr"]:
        sys.stderr.write("     no series (no such event in this run): %s [%s]\n" % (q["panel"], q["refId"]))
        continue
    print("%s [%s]: %s" % (q["panel"], q["refId"], q["expr"][:120]))
EOF
)
[ -s "$TMP/queries" ] && [ -z "$empty" ]
rc=$?
check "every one of the dashboard's $(wc -l <"$TMP/queries") queries returns series from this Prometheus (after the sidecar's restart)" $rc
[ -z "$empty" ] || echo "$empty" | sed 's/^/     no series: /'

# ---- the controller's leader pod deleted: the other replica takes over ----
leader=$(k -n meshload-system get lease meshload -o jsonpath='{.spec.holderIdentity}')
k -n meshload-system delete pod "$leader" --wait=false >/dev/null 2>&1
new=
for _ in $(seq 120); do
  new=$(k -n meshload-system get lease meshload -o jsonpath='{.spec.holderIdentity}')
  [ -n "$new" ] && [ "$new" != "$leader" ] && k -n meshload-system get pod "$new" >/dev/null 2>&1 && break
  sleep 0.5
done
[ -n "$leader" ] && [ -n "$new" ] && [ "$new" != "$leader" ]
check "the controller's leader pod deleted ($leader): the other replica leads ($new)" $?
s3=$(step_of)
sleep 5
s4=$(step_of)
if [ -n "$s3" ] && [ -n "$s4" ]; then
  [ "$s4" -gt "$s3" ]
  check "and the job's status goes on ($s3, then $s4)" $?
else
  skipped "and the job's status goes on" "known gap: .status.progress stays empty in the simulated cluster"
fi

# ---- the Job completes: the trainers verified every byte ----
k -n training wait --for=condition=Complete job/trainer --timeout=180s >"$TMP/done.log" 2>&1
rc=$?
check "the trainer Job completes: both trainers verified every byte of 600 steps (exit 0), across the sidecar restart" $rc
if [ $rc -ne 0 ]; then
  k -n training get pods -o wide
  for f in "$C"/pods/training_trainer-*/trainer.log; do echo "== $f"; tail -5 "$f"; done
fi
grep -h '"type":"final"' "$C"/pods/training_trainer-*/trainer.log 2>/dev/null | python3 -c '
import json, sys
finals = [json.loads(l) for l in sys.stdin]
print("     trainers:", [(f.get("process"), f.get("steps"), f.get("mismatches")) for f in finals])
sys.exit(0 if len(finals) >= 2 and all(f.get("mismatches") == 0 and f.get("steps") == 600 for f in finals) else 1)'
check "their final reports: 600 steps each, 0 mismatches" $?

# ---- down leaves nothing running ----
"$ROOT/scripts/cluster" down "$C" >/dev/null 2>&1
for _ in $(seq 100); do kill -0 $CLUSTER 2>/dev/null || break; sleep 0.1; done
left=$(( $(pgrep -f -- "$C/" | wc -l) + $(grep -l -s MESHLOAD_PODNET_IP=10.244 /proc/[0-9]*/environ 2>/dev/null | wc -l) ))
addrs=$(ip -o -4 addr show dev lo | grep -c ' 10\.244\.')
[ "$left" = 0 ] && [ "$addrs" = 0 ]
check "scripts/cluster down leaves nothing running ($left processes, $addrs pod IPs left)" $?
finish
