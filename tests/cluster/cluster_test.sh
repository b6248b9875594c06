#!/usr/bin/env bash
# The whole product on one machine, as a user meets it (scripts/cluster: the
# real control plane with kube-scheduler, kwok's simulated GPU nodes, every
# pod's containers run from this build by tests/cluster/pod_runner.py, the
# chart installed with helm, Prometheus scraping through the API server):
#   - examples/cluster-reshard.yaml: a LoadAndReshard DataLoadJob and an
#     Indexed trainer Job that carries the label, its GPU request and a
#     preferred spread over nodes: the scheduler places the pods on
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
#   - the controller's leader pod deleted: the other replica takes over;
#   - the node under one of the job's two processes deleted: that pod goes
#     (pod GC), the Job replaces it, the scheduler puts it on another GPU
#     node, it resumes at the recorded step while the other trainer, never
#     stopped, waits for it and goes on (pod GC takes 40 to 90 s);
#   - the job resized: the Job suspended (the DataLoadJob Suspended at the
#     recorded step), the DataLoadJob's mesh and the Job's parallelism
#     edited (2 to 4 processes), resumed at the recorded step on the new
#     mesh, every byte verified, the Job complete.
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
MESHLOAD_BUILD_DIR=$BUILD setpriv --pdeathsig TERM "$ROOT/scripts/cluster" run "$C" --gpu-nodes 3 \
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
[ "$(grep -c ' 8 nvidia.com/gpu$' "$TMP/nodes")" = 3 ] && k get resourceslices -o name | grep -q gpu-node-0
check "3 GPU nodes: 8 nvidia.com/gpu each, tainted, their GPUs published as DRA devices" $?
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
# examples/cluster-reshard.yaml as a user applies it, with this test's dataset.
sed "s#path: /tmp/meshload-example,#path: $TMP/data,#" "$ROOT/examples/cluster-reshard.yaml" >"$TMP/job.yaml"
if grep -q "path: $TMP/data," "$TMP/job.yaml"; then
  k apply -f "$TMP/job.yaml" >"$TMP/apply.log" 2>&1
  rc=$?
else
  echo "examples/cluster-reshard.yaml: its datasets hostPath is not /tmp/meshload-example" >"$TMP/apply.log"
  rc=1
fi
check "kubectl apply -f examples/cluster-reshard.yaml: a LoadAndReshard DataLoadJob and an Indexed trainer Job (the label, nvidia.com/gpu and a spread over nodes; its steps from a ConfigMap)" $rc
[ $rc -eq 0 ] || cat "$TMP/apply.log"

placed=
for _ in $(seq 120); do
  placed=$(k -n training get pods -l job-name=trainer -o jsonpath='{range .items[*]}{.spec.nodeName}{"\n"}{end}' | grep -c '^gpu-node-')
  [ "$placed" = 2 ] && break
  sleep 0.5
done
[ "$placed" = 2 ] && [ "$(k -n training get pods -l job-name=trainer -o jsonpath='{range .items[*]}{.spec.nodeName}{"\n"}{end}' | sort -u | wc -l)" = 2 ]
check "kube-scheduler places the two trainer pods on two GPU nodes (tolerating their taint)" $?
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
if [ $rc -ne 0 ]; then
  cat "$TMP/wait.log"
  k -n training get pods -o wide
  k -n training get pods -o jsonpath='{range .items[*]}{.metadata.name}: {.status.message} {.status.initContainerStatuses}{"\n"}{end}' | cut -c1-600
  tail -20 "$C/logs/pod-runner.log"
  for f in "$C"/pods/training_*/*.log; do echo "== $f"; tail -5 "$f" | cut -c1-400; done
  echo "the remaining checks need a running job: not run"
  finish
fi
step_of() { k -n training get dlj reshard -o jsonpath='{.status.progress.step}' 2>/dev/null; }
resume_of() {
  k -n training get configmap reshard-meshload -o jsonpath='{.data.resume\.json}' 2>/dev/null |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["step"])' 2>/dev/null
}
# The cluster's controller polls the sidecars and writes the step every 2 s
# (scripts/cluster's extraArgs): a step_after waits up to 45 s.
step_after() {  # STEP: waits until status.progress.step is above STEP; prints it
  local s
  for _ in $(seq 90); do
    s=$(step_of)
    [ -n "$s" ] && [ "$s" -gt "$1" ] && { echo "$s"; return 0; }
    sleep 0.5
  done
  echo "${s:-none}"
  return 1
}
s1=$(step_after -1)
s2=$(step_after "$s1")
rc=$?
check "kubectl get dlj shows the step advancing ($s1, then $s2)" $rc
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
for q in missing:
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
s4=$(step_after "${s3:--1}")
rc=$?
check "and the job's status goes on ($s3, then $s4)" $rc

uids() { k -n training get pods -l job-name=trainer -o jsonpath='{range .items[*]}{.metadata.uid}{"\n"}{end}' | sort; }
pod_on() {  # pod_on INDEX: "UID NODE" of the trainer pod of that completion index
  k -n training get pods -l job-name=trainer -o jsonpath='{range .items[*]}{.metadata.annotations.batch\.kubernetes\.io/job-completion-index} {.metadata.uid} {.spec.nodeName}{"\n"}{end}' |
    awk -v i="$1" '$1 == i {print $2, $3}'
}

# ---- the node under one process deleted ----
# Process 0's node goes; process 1's pod, on another node, keeps running:
# its sidecar waits for the lost peer, the replacement resumes at the
# recorded step and the two go on together.
gen0=$(uids)
read -r lost_uid lost_node < <(pod_on 0)
read -r kept_uid kept_node < <(pod_on 1)
steps_done() {  # steps_done UID: the steps the trainer of that pod reported last
  grep -h '"progress"' "$C"/pods/training_trainer-*_"${1:0:8}"/trainer.log 2>/dev/null | tail -1 |
    python3 -c 'import json, sys; t = sys.stdin.read(); print(json.loads(t)["steps"] if t else 0)'
}
kept_at_loss=$(steps_done "$kept_uid")
k delete node "$lost_node" --wait=false >/dev/null
R1=
for _ in $(seq 240); do
  ! uids | grep -qxF "$lost_uid" && { R1=$(resume_of); break; }
  sleep 0.5
done
[ -n "$lost_uid" ] && [ "$lost_node" != "$kept_node" ] && [ -n "$R1" ]
check "the node under process 0 deleted ($lost_node; process 1 on $kept_node): its pod is gone; the recorded resume step is $R1" $?
new0=
for _ in $(seq 240); do
  read -r new0 new0_node < <(pod_on 0)
  [ -n "$new0" ] && [ "$new0" != "$lost_uid" ] &&
    [ "$(k -n training get pod -l job-name=trainer,batch.kubernetes.io/job-completion-index=0 -o jsonpath='{.items[0].status.phase}')" = Running ] && break
  new0=
  sleep 0.5
done
read -r kept_now _ < <(pod_on 1)
restarts=$(k -n training get pods -l job-name=trainer,batch.kubernetes.io/job-completion-index=1 \
  -o jsonpath='{.items[0].status.containerStatuses[?(@.name=="trainer")].restartCount}')
[ -n "$new0" ] && [ "$new0_node" != "$lost_node" ] && [ "$kept_now" = "$kept_uid" ] && [ "$restarts" = 0 ]
check "the Job replaced it on ${new0_node:-no node}; process 1's pod ran on untouched (restarts ${restarts:-?})" $?
s6=$(step_after "$R1")
check "the job goes on past the recorded step ($R1, then $s6)" $?

gen1=$(uids)

# ---- the job resized: 2 to 4 processes ----
k -n training patch job trainer --type=merge -p '{"spec":{"suspend":true}}' >/dev/null
for _ in $(seq 120); do
  [ -z "$(k -n training get pods -l job-name=trainer -o name)" ] && break
  sleep 0.5
done
R2=$(resume_of)
[ -z "$(k -n training get pods -l job-name=trainer -o name)" ] && [ -n "$R2" ]
check "the Job suspended: its pods stopped; the recorded resume step is $R2" $?
susp=
for _ in $(seq 60); do
  susp=$(k -n training get dlj reshard -o jsonpath='{.status.phase} {.status.suspendedAtStep} {.status.conditions[?(@.type=="Admitted")].reason} {.status.conditions[?(@.type=="Degraded")].status}')
  [ "$susp" = "Suspended $R2 Suspended False" ] && break
  sleep 0.5
done
[ "$susp" = "Suspended $R2 Suspended False" ]
check "the DataLoadJob says so: Suspended at step $R2, not Degraded (phase, suspendedAtStep, Admitted, Degraded: $susp)" $?
k -n training patch dlj reshard --type=merge -p \
  '{"spec":{"mesh":{"processes":4,"axes":[{"name":"model","size":2},{"name":"data","size":4}]}}}' >"$TMP/resize.log" 2>&1 &&
  # The resized trainers run 400 steps and finish, so that the Job completes.
  k -n training patch configmap trainer-settings --type=merge -p '{"data":{"steps":"400"}}' >>"$TMP/resize.log" 2>&1 &&
  k -n training patch job trainer --type=json -p '[
    {"op":"replace","path":"/spec/parallelism","value":4},
    {"op":"replace","path":"/spec/completions","value":4},
    {"op":"replace","path":"/spec/suspend","value":false}]' >>"$TMP/resize.log" 2>&1
rc=$?
check "the DataLoadJob's mesh (4 processes, data 4) and the Job's parallelism and completions (4) edited" $rc
[ $rc -eq 0 ] || cat "$TMP/resize.log"

# ---- the Job completes: the trainers verified every byte ----
k -n training wait --for=condition=Complete job/trainer --timeout=240s >"$TMP/done.log" 2>&1
rc=$?
check "the resized trainer Job completes (4 trainers, exit 0)" $rc
if [ $rc -ne 0 ]; then
  k -n training get pods -o wide
  for f in "$C"/pods/training_trainer-*/trainer.log; do echo "== $f"; tail -3 "$f" | cut -c1-300; done
fi
gen2=$(uids)
# Every trainer's last report (final, or progress for one that went with
# its node), by generation: the first Job run's pods (gen0), the pods after
# process 0's node went (gen1), the resized ones (gen2).
python3 - "$C/pods" "${R1:--1}" "${R2:--1}" "$gen0" "$gen1" "$gen2" "${kept_uid:-none}" "${kept_at_loss:-0}" <<'PY'
import glob, json, sys
pods, R1, R2 = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
gen0, gen1, gen2 = [set(u[:8] for u in g.split()) for g in sys.argv[4:7]]
kept_uid8, kept_at_loss = sys.argv[7][:8], int(sys.argv[8])
last, starts = {}, {}
for d in glob.glob(pods + "/training_trainer-*"):
    uid8 = d.rsplit("_", 1)[1]
    text = open(d + "/trainer.log").read().splitlines()
    lines = [json.loads(l) for l in text if l.startswith("{")]
    fin = [l for l in lines if l.get("type") == "final"]
    progress = [l for l in lines if l.get("type") == "progress"]
    last[uid8] = fin[-1] if fin else progress[-1] if progress else {}
    starts[uid8] = sum(1 for l in text if l.startswith("---- "))
def show(ls, *keys):
    return [tuple(l.get(k) for k in keys) for l in ls]
problems = []
mismatches = sum(l.get("mismatches", 0) for l in last.values())
if mismatches:
    problems.append("%d mismatches" % mismatches)
problems += ["a trainer failed: " + l["error"] for l in last.values() if l.get("error")]
# Process 0's replacement: the one pod of gen1 not in gen0, from the
# recorded step.
replaced = [last[u] for u in last if u in gen1 and u not in gen0]
if show(replaced, "process", "first_step") != [(0, R1)]:
    problems.append("process 0's replacement did not start at the recorded step %d: %s" %
                    (R1, show(replaced, "process", "first_step")))
# Process 1's pod ran through the loss: one start, from step 0, on past
# where it was when process 0 went.
kept = [last[u] for u in last if u == kept_uid8]
if show(kept, "process", "first_step") != [(1, 0)] or kept[0].get("steps", 0) <= kept_at_loss or \
        starts.get(kept_uid8) != 1:
    problems.append("process 1's pod did not run on through the loss of process 0: %s, %s starts, %d steps before" %
                    (show(kept, "process", "first_step", "steps"), starts.get(kept_uid8), kept_at_loss))
resized = [last[u] for u in last if u in gen2]
if sorted(l.get("process", -1) for l in resized) != [0, 1, 2, 3] or \
        any(l.get("first_step") != R2 or l.get("steps") != 400 for l in resized):
    problems.append("the resized trainers: %s (want processes 0..3, first step %d, 400 steps)" %
                    (show(resized, "process", "first_step", "steps"), R2))
print("     %d trainers in all; process 0's replacement %s, process 1 %s; resized %s; 0 mismatches" % (
    len(last), show(replaced, "process", "first_step", "steps"), show(kept, "process", "first_step", "steps"),
    show(resized, "process", "first_step", "steps")) if not problems else "     " + "\n     ".join(problems))
sys.exit(1 if problems else 0)
PY
check "every trainer verified every byte: process 0's replacement started at step $R1, process 1 ran on from step 0, the 4 resized ones started at $R2, no mismatch" $?

# ---- down leaves nothing running ----
"$ROOT/scripts/cluster" down "$C" >/dev/null 2>&1
for _ in $(seq 100); do kill -0 $CLUSTER 2>/dev/null || break; sleep 0.1; done
left=$(( $(pgrep -f -- "$C/" | wc -l) + $(grep -l -s MESHLOAD_PODNET_IP=10.244 /proc/[0-9]*/environ 2>/dev/null | wc -l) ))
addrs=$(ip -o -4 addr show dev lo | grep -c ' 10\.244\.')
routes=$(ip route show | grep -c '10\.244\.')
[ "$left" = 0 ] && [ "$addrs" = 0 ] && [ "$routes" = 0 ]
check "scripts/cluster down leaves nothing running ($left processes, $addrs pod IPs, $routes pod routes left)" $?
finish
