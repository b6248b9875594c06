#!/usr/bin/env bash
# A DataLoadJob's trainers queued by the real Kueue (its manager built from
# the pinned sigs.k8s.io/kueue by scripts/build-cluster-tools.sh, its CRDs
# as its install renders them) on the real control plane (scripts/control-plane: kube-apiserver and
# kube-controller-manager with the Job controller), with meshload-controller
# serving the sidecar-injection webhook with Job template injection on:
#   - a suspended Indexed Job labelled for its DataLoadJob and a LocalQueue
#     gets the sidecar in its template; the Workload Kueue builds from the
#     template holds it, and its requests count: a ClusterQueue whose quota
#     fits exactly the trainers plus their sidecars admits it (Kueue
#     unsuspends the Job, whose pods are made with the sidecar once); one
#     whose CPU fits the trainers alone does not, saying the sidecars' CPU
#     is short;
#   - the DataLoadJob says so: WaitingForAdmission while Kueue holds its
#     trainer Job suspended, Admitted once it runs; preempted by a Job of a
#     higher WorkloadPriorityClass, Suspended at its recorded step (its pods
#     gone); admitted again when the preemptor goes, with new pods that
#     have the sidecar and the same resume step.
#   - the same trainers as a JobSet (JobSet's manager built from the pinned
#     sigs.k8s.io/jobset, its CRD and its own JobSet webhooks as its install
#     has them): the webhook puts the sidecar in the JobSet's labelled
#     template, Kueue's Workload holds it and a queue of exactly trainers
#     plus sidecars admits it; JobSet makes its Jobs, the Job controller
#     their pods, with the sidecar once; the DataLoadJob is Admitted and its
#     processes are numbered across the JobSet's Jobs;
#   - the same trainers as a Kubeflow TrainJob (Trainer's manager built
#     from the pinned github.com/kubeflow/trainer/v2, its CRDs): the webhook
#     puts the sidecar in the DataLoadJob's labelled TrainingRuntime (a
#     TrainJob cannot add a container; Kueue counts it from its runtime),
#     Kueue's Workload for the TrainJob holds it and admits it where
#     trainers and sidecars fit; Trainer makes its JobSet, JobSet its Job,
#     the Job controller the pods, with the sidecar once.
# Kueue's own webhooks are not registered (there is no cluster network for
# the API server to reach them by Service): the Jobs, JobSets and TrainJobs
# are created suspended (the TrainJob with Kueue's runtime patch), as
# Kueue's webhooks would make them.
# usage: kueue_test.sh REPO_ROOT MESHLOAD_CONTROLLER_BINARY
set -u
ROOT=$1
CONTROLLER=$2
source "$(dirname "$0")/../testing/shell_checks.sh"
source "$(dirname "$0")/../testing/control_plane.sh"

BIN=$("$ROOT/scripts/build-cluster-tools.sh" --dir)
if [ $? -ne 0 ] || [ ! -x "$BIN/kueue" ] || [ ! -x "$BIN/jobset" ] || [ ! -x "$BIN/trainer" ]; then
  echo "FAIL Kueue, JobSet and Kubeflow Trainer are not built (run scripts/install-deps.sh)"
  echo "0 passed, 1 failed"
  exit 1
fi
start_control_plane "$ROOT"
for ns in training kueue-system; do k create namespace "$ns" >/dev/null; done
# Kueue's CRDs as its install renders them (their conversion webhooks,
# whose CA its manager injects, included).
k kustomize "$BIN/kueue-config/default" | /usr/bin/python3 -c '
import re, sys
docs = re.split(r"^---\n", sys.stdin.read(), flags=re.M)
print("---\n".join(d for d in docs if re.search(r"^kind: CustomResourceDefinition$", d, re.M)))' >"$TMP/kueue-crds.yaml"
JOBSET_CRD=$BIN/jobset-config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml
TRAINER_CRDS=$BIN/trainer-manifests/base/crds
crds=(-f "$ROOT/charts/meshload/crds/" -f "$TMP/kueue-crds.yaml" -f "$JOBSET_CRD")
for f in "$TRAINER_CRDS"/trainer.kubeflow.org_*.yaml; do crds+=(-f "$f"); done
k apply --server-side "${crds[@]}" >"$TMP/crds.out" 2>&1 &&
  k wait --for condition=Established --timeout=60s "${crds[@]}" >>"$TMP/crds.out" 2>&1
rc=$?
check "the DataLoadJob CRD, Kueue's CRDs ($(grep -c '^kind: CustomResourceDefinition$' "$TMP/kueue-crds.yaml")), JobSet's and Kubeflow Trainer's are Established" $rc
[ $rc -eq 0 ] || tail -5 "$TMP/crds.out"

# A serving certificate for 127.0.0.1 from a CA of the test's: meshload's
# webhook.
loopback_certificate "$TMP/wh"
check "a loopback serving certificate for meshload's webhook" $?

# Kueue's manager: batch/v1 Jobs, no leader election, its webhook server
# on loopback (not registered), its health probes on a free port, its own
# certificate management (into the Secret its manifests create empty, which
# its Deployment mounts at certDir: copied there here, as there is no
# kubelet; without it the manager wants a metrics certificate at a fixed
# path), and no on-demand visibility API server (it authenticates through
# the in-cluster configuration, which a process outside a pod lacks).
k -n kueue-system create secret generic kueue-webhook-server-cert >/dev/null
KUEUE_HEALTH=$(listen_port)
cat >"$TMP/kueue.yaml" <<EOF
apiVersion: config.kueue.x-k8s.io/v1beta2
kind: Configuration
namespace: kueue-system
health:
  healthProbeBindAddress: 127.0.0.1:$KUEUE_HEALTH
metrics:
  bindAddress: "0"
webhook:
  host: 127.0.0.1
  port: $(listen_port)
  certDir: $TMP/kueue-certs
leaderElection:
  leaderElect: false
internalCertManagement:
  enable: true
integrations:
  frameworks: ["batch/job", "jobset.x-k8s.io/jobset", "trainer.kubeflow.org/trainjob"]
EOF
setpriv --pdeathsig KILL "$BIN/kueue" --config "$TMP/kueue.yaml" --feature-gates=VisibilityOnDemand=false \
  >"$TMP/kueue.log" 2>&1 &
PIDS+=($!)
mkdir -p "$TMP/kueue-certs"
ready=1
for _ in $(seq 450); do
  if [ ! -s "$TMP/kueue-certs/tls.key" ]; then
    for f in ca.crt tls.crt tls.key; do
      k -n kueue-system get secret kueue-webhook-server-cert -o jsonpath="{.data.${f//./\\.}}" 2>/dev/null |
        base64 -d >"$TMP/kueue-certs/.$f" 2>/dev/null
    done
    # All three or none (read one by one, the Secret may fill in between;
    # the manager takes the files as they appear, as from a kubelet mount).
    [ -s "$TMP/kueue-certs/.ca.crt" ] && [ -s "$TMP/kueue-certs/.tls.crt" ] && [ -s "$TMP/kueue-certs/.tls.key" ] &&
      for f in ca.crt tls.key tls.crt; do mv "$TMP/kueue-certs/.$f" "$TMP/kueue-certs/$f"; done
  fi
  curl -sf "http://127.0.0.1:$KUEUE_HEALTH/readyz" >/dev/null 2>&1 && { ready=0; break; }
  sleep 0.2
done
check "Kueue's manager is ready" $ready
[ $ready -eq 0 ] || tail -20 "$TMP/kueue.log"

# JobSet's manager: no leader election, no metrics, its webhook server on
# loopback with the test's certificate (no certificate management of its
# own: that would wait for a kubelet to mount its Secret at a fixed path).
JOBSET_HEALTH=$(listen_port)
JOBSET_WEBHOOK=$(listen_port)
cat >"$TMP/jobset.yaml" <<EOF
apiVersion: config.jobset.x-k8s.io/v1alpha1
kind: Configuration
leaderElection: {leaderElect: false}
health: {healthProbeBindAddress: "127.0.0.1:$JOBSET_HEALTH"}
metrics: {bindAddress: "0"}
webhook: {host: 127.0.0.1, port: $JOBSET_WEBHOOK, certDir: $TMP/wh}
internalCertManagement: {enable: false}
EOF
# A controller-runtime manager of ours: started with its configuration
# file, ready when its /readyz answers (60 s at most).
start_manager() { # name health-port title
  setpriv --pdeathsig KILL "$BIN/$1" --config "$TMP/$1.yaml" --kubeconfig "$KUBECONFIG" --zap-devel=false \
    >"$TMP/$1.log" 2>&1 &
  PIDS+=($!)
  local ready=1
  for _ in $(seq 300); do
    curl -sf "http://127.0.0.1:$2/readyz" >/dev/null 2>&1 && { ready=0; break; }
    sleep 0.2
  done
  check "$3's manager is ready" $ready
  [ $ready -eq 0 ] || tail -20 "$TMP/$1.log"
}
start_manager jobset "$JOBSET_HEALTH" JobSet

# Kubeflow Trainer's manager: no leader election, no metrics, its own
# certificate management off (its webhook server reads the test's
# certificate from its default directory under TMPDIR); its webhooks (only
# validation) not registered.
TRAINER_HEALTH=$(listen_port)
cat >"$TMP/trainer.yaml" <<EOF
apiVersion: config.trainer.kubeflow.org/v1alpha1
kind: Configuration
leaderElection: {leaderElect: false}
health: {healthProbeBindAddress: "127.0.0.1:$TRAINER_HEALTH"}
metrics: {bindAddress: "0"}
webhook: {host: 127.0.0.1, port: $(listen_port)}
certManagement: {enable: false}
EOF
mkdir -p "$TMP/trainer-tmp/k8s-webhook-server/serving-certs"
cp "$TMP/wh/tls.crt" "$TMP/wh/tls.key" "$TMP/trainer-tmp/k8s-webhook-server/serving-certs/"
TMPDIR=$TMP/trainer-tmp start_manager trainer "$TRAINER_HEALTH" "Kubeflow Trainer"

WHPORT=$(listen_port)
setpriv --pdeathsig KILL "$CONTROLLER" --kubeconfig "$KUBECONFIG" --metrics-port 0 --metrics-address 127.0.0.1 \
  --leader-elect false --log-format kv --webhook-cert-dir "$TMP/wh" --webhook-address 127.0.0.1 \
  --webhook-port "$WHPORT" --sidecar-image meshload/sidecar:test \
  --sidecar-resources '{"requests":{"cpu":"1","memory":"512Mi"},"limits":{"memory":"2Gi"}}' >"$TMP/controller.log" 2>&1 &
PIDS+=($!)
wait_for "$TMP/controller.log" "serving the sidecar-injection webhook" 30
rc=$?
check "meshload-controller serves the webhook" $rc
[ $rc -eq 0 ] || tail -20 "$TMP/controller.log"
# The chart's two entries (charts/meshload/templates/webhook.yaml with
# webhook.templateInjection.enabled), reaching the controller by url.
CA=$(base64 -w0 "$TMP/wh/ca.crt")
hook() { # name path apiGroup resource [apiGroup resource version]
  cat <<EOF
  - name: $1
    admissionReviewVersions: [v1]
    clientConfig: {url: "https://127.0.0.1:$WHPORT$2", caBundle: "$CA"}
    rules:
    - {operations: [CREATE], apiGroups: ["$3"], apiVersions: [v1], resources: [$4], scope: Namespaced}
EOF
  [ $# -gt 4 ] && echo "    - {operations: [CREATE], apiGroups: [\"$5\"], apiVersions: [$7], resources: [$6], scope: Namespaced}"
  [ $# -gt 7 ] && echo "    - {operations: [CREATE], apiGroups: [\"$8\"], apiVersions: [${10}], resources: [$9], scope: Namespaced}"
  cat <<EOF
    objectSelector: {matchExpressions: [{key: meshload.io/job, operator: Exists}]}
    failurePolicy: Fail
    sideEffects: None
    timeoutSeconds: 5
EOF
}
# JobSet's own webhooks for JobSets (its install's manifests: defaulting and
# validation), by url.
jobset_hook() { # kind name path
  printf -- '---\napiVersion: admissionregistration.k8s.io/v1\nkind: %sWebhookConfiguration\nmetadata: {name: jobset-%s}\nwebhooks:\n' "$1" "$2"
  cat <<EOF
  - name: $2.jobset.x-k8s.io
    admissionReviewVersions: [v1]
    clientConfig: {url: "https://127.0.0.1:$JOBSET_WEBHOOK$3", caBundle: "$CA"}
    rules: [{operations: [CREATE, UPDATE], apiGroups: [jobset.x-k8s.io], apiVersions: [v1alpha2], resources: [jobsets]}]
    failurePolicy: Fail
    sideEffects: None
EOF
}
{
  printf 'apiVersion: admissionregistration.k8s.io/v1\nkind: MutatingWebhookConfiguration\nmetadata: {name: meshload-sidecar-injector}\nwebhooks:\n'
  hook sidecar.meshload.io /mutate-pods "" pods
  hook template.meshload.io /mutate-jobs batch jobs jobset.x-k8s.io jobsets v1alpha2 trainer.kubeflow.org trainingruntimes v1alpha1
  jobset_hook Mutating mjobset /mutate-jobset-x-k8s-io-v1alpha2-jobset
  jobset_hook Validating vjobset /validate-jobset-x-k8s-io-v1alpha2-jobset
} | k apply -f - >"$TMP/mwc.out" 2>&1
rc=$?
check "the webhook configuration (pods, Jobs and JobSets) points at it, JobSet's at JobSet's manager" $rc
[ $rc -eq 0 ] || cat "$TMP/mwc.out"

# Two ClusterQueues: one whose quota is exactly 2 trainers (1 CPU, 1 GiB
# each) plus their sidecars (1 CPU, 512 MiB each: --sidecar-resources), one
# with the CPU of the trainers alone.
queues() { # name cpu memory
  cat <<EOF
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: ClusterQueue
metadata: {name: $1}
spec:
  namespaceSelector: {}
  preemption: {withinClusterQueue: LowerPriority}
  resourceGroups:
  - coveredResources: [cpu, memory]
    flavors:
    - name: default
      resources:
      - {name: cpu, nominalQuota: $2}
      - {name: memory, nominalQuota: $3}
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: LocalQueue
metadata: {name: $1, namespace: training}
spec: {clusterQueue: $1}
EOF
}
{
  printf 'apiVersion: kueue.x-k8s.io/v1beta2\nkind: ResourceFlavor\nmetadata: {name: default}\n'
  printf -- '---\napiVersion: kueue.x-k8s.io/v1beta2\nkind: WorkloadPriorityClass\nmetadata: {name: high}\nvalue: 1000\n'
  queues exact 4 3Gi
  queues trainers-only 2 3Gi
  queues jobsets 4 3Gi
  queues trainjobs 4 3Gi
} | k apply -f - >"$TMP/queues.out" 2>&1
rc=$?
check "a ResourceFlavor, a WorkloadPriorityClass high, ClusterQueues exact, jobsets and trainjobs (4 CPU, 3Gi) and trainers-only (2 CPU, 3Gi), preempting lower priorities, their LocalQueues" $rc
[ $rc -eq 0 ] || cat "$TMP/queues.out"

# A DataLoadJob of 2 processes selecting app=NAME, resuming at step 40.
dataloadjob() { # name
  cat <<EOF
---
apiVersion: meshload.io/v1alpha1
kind: DataLoadJob
metadata: {name: $1, namespace: training}
spec:
  mesh: {processes: 2, devicesPerProcess: 2, axes: [{name: data, size: 4}]}
  dataset: {uri: /datasets/tokens, format: TokenStream, dtype: uint16, sequenceLength: 2048, samples: 100000}
  batch: {globalBatchSize: 32}
  resume: {step: 40}
  selector: {matchLabels: {app: $1}}
EOF
}
# A trainer pod template labelled app=NAME and for DataLoadJob NAME (1 CPU,
# 1 GiB), indented by INDENT.
trainer_template() { # name indent
  sed "s/^/$2/" <<EOF
template:
  metadata:
    labels: {app: $1, meshload.io/job: $1}
  spec:
    restartPolicy: Never
    containers:
    - name: trainer
      image: trainer:1
      resources: {requests: {cpu: "1", memory: 1Gi}}
EOF
}
# A DataLoadJob and its trainers: a suspended Indexed Job in a queue.
loader() { # name queue
  dataloadjob "$1"
  cat <<EOF
---
apiVersion: batch/v1
kind: Job
metadata:
  name: $1
  namespace: training
  labels: {meshload.io/job: $1, kueue.x-k8s.io/queue-name: $2}
spec:
  suspend: true
  completionMode: Indexed
  completions: 2
  parallelism: 2
EOF
  trainer_template "$1" "  "
}
loader queued exact | k apply -f - >"$TMP/apply.out" 2>&1
rc=$?
check "kubectl apply a DataLoadJob and its suspended trainer Job in LocalQueue exact" $rc
[ $rc -eq 0 ] || cat "$TMP/apply.out"

workload() { # kind name: the Workload Kueue made for it, as JSON (empty until there is one)
  k -n training get workloads.kueue.x-k8s.io -o json 2>/dev/null | /usr/bin/python3 -c '
import json, sys
for w in json.load(sys.stdin)["items"]:
    if any(o["kind"] == sys.argv[1] and o["name"] == sys.argv[2] for o in w["metadata"].get("ownerReferences", [])):
        print(json.dumps(w))' "$1" "$2"
}
condition() { # json type: its status
  /usr/bin/python3 -c '
import json, sys
w = json.loads(sys.argv[1])
print(" ".join(c["status"] + ": " + c.get("message", "") for c in w.get("status", {}).get("conditions", [])
               if c["type"] == sys.argv[2]))' "$1" "$2"
}
admitted_workload() { # kind name file: waits (60 s at most) until it is admitted; writes it to file
  local w=
  for _ in $(seq 300); do
    w=$(workload "$1" "$2")
    [ -n "$w" ] && [[ "$(condition "$w" Admitted)" == True* ]] && break
    sleep 0.2
  done
  echo "$w" >"$3"
}
admitted_workload Job queued "$TMP/workload-queued.json"
# Whether the object in FILE has exactly the sidecar as init container in
# the pod template at PATH (dot-separated keys and list indices).
has_sidecar() { # file path
  /usr/bin/python3 - "$1" "$2" <<'PYCHECK'
import json, sys
t = json.load(open(sys.argv[1]))
for key in sys.argv[2].split("."):
    t = t[int(key)] if isinstance(t, list) else t[key]
sys.exit(0 if [c["name"] for c in t["spec"].get("initContainers") or []] == ["meshload-sidecar"] else 1)
PYCHECK
}
# Whether the Workload in FILE has a podSet NAME of COUNT pods whose
# template holds the sidecar, admitted with 4 CPU and 3Gi in all.
workload_counts_sidecars() { # file podset count
  /usr/bin/python3 - "$1" "$2" "$3" <<'PYCHECK'
import json, sys
w = json.load(open(sys.argv[1]))
named = [p for p in w["spec"]["podSets"] if p["name"] == sys.argv[2]]
init = (named[0]["template"]["spec"].get("initContainers") or []) if named else []
use = {}
for a in w["status"]["admission"]["podSetAssignments"]:
    use.update(a.get("resourceUsage", {}))
ok = (len(named) == 1 and named[0]["count"] == int(sys.argv[3]) and [c["name"] for c in init] == ["meshload-sidecar"]
      and (use.get("cpu"), use.get("memory")) == ("4", "3Gi"))
sys.exit(0 if ok else 1)
PYCHECK
}
/usr/bin/python3 - "$TMP/workload-queued.json" <<'PYCHECK'
import json, sys
w = json.load(open(sys.argv[1]))
ps = w["spec"]["podSets"]
init = ps[0]["template"]["spec"].get("initContainers") or []
ok = (len(ps) == 1 and ps[0]["count"] == 2 and len(init) == 1 and init[0]["name"] == "meshload-sidecar"
      and init[0].get("restartPolicy") == "Always"
      and init[0]["resources"]["requests"] == {"cpu": "1", "memory": "512Mi"})
sys.exit(0 if ok else 1)
PYCHECK
rc=$?
check "the Workload Kueue built from the Job's template holds the sidecar and its requests" $rc
[ $rc -eq 0 ] || head -c 3000 "$TMP/workload-queued.json"
usage=$(/usr/bin/python3 -c '
import json, sys
w = json.load(open(sys.argv[1]))
u = w["status"]["admission"]["podSetAssignments"][0]["resourceUsage"]
print(u.get("cpu"), u.get("memory"))' "$TMP/workload-queued.json" 2>/dev/null)
[[ "$(condition "$(cat "$TMP/workload-queued.json")" Admitted)" == True* ]] && [ "$usage" = "4 3Gi" ]
rc=$?
check "ClusterQueue exact admits it, counting trainers and sidecars: 4 CPU, 3Gi (got: $usage)" $rc
[ $rc -eq 0 ] || { condition "$(cat "$TMP/workload-queued.json")" QuotaReserved; tail -5 "$TMP/kueue.log"; }
suspended=
for _ in $(seq 150); do
  suspended=$(k -n training get job queued -o jsonpath='{.spec.suspend}')
  [ "$suspended" = false ] && break
  sleep 0.2
done
[ "$suspended" = false ]
check "Kueue unsuspends the admitted Job" $?
wait_sidecars_per_pod training queued "1 1"
rc=$?
check "the Job controller's 2 pods each have the sidecar once" $rc
[ $rc -eq 0 ] || echo "sidecars per pod: $SIDECARS"

# The same trainers in a queue with room for the trainers alone: the
# sidecars' requests count, so it is not admitted, and Kueue says why.
loader short trainers-only | k apply -f - >"$TMP/apply-short.out" 2>&1
check "kubectl apply the same in LocalQueue trainers-only" $?
reserved=
for _ in $(seq 150); do
  w=$(workload Job short)
  reserved=$([ -n "$w" ] && condition "$w" QuotaReserved)
  [[ "$reserved" == False*"insufficient quota for cpu"*"(4) > maximum capacity (2)"* ]] && break
  sleep 0.2
done
[[ "$reserved" == False*"insufficient quota for cpu"*"(4) > maximum capacity (2)"* ]] &&
  [ "$(k -n training get job short -o jsonpath='{.spec.suspend}')" = true ]
rc=$?
check "ClusterQueue trainers-only does not admit it: 4 CPU asked (trainers and sidecars), 2 there; the Job stays suspended" $rc
[ $rc -eq 0 ] || echo "QuotaReserved: $reserved"

# What the DataLoadJob says: "phase admitted-reason suspendedAtStep".
dlj() {
  k -n training get dataloadjob "$1" -o json 2>/dev/null | /usr/bin/python3 -c '
import json, sys
s = json.load(sys.stdin).get("status", {})
a = [c["reason"] for c in s.get("conditions", []) if c["type"] == "Admitted"]
print(s.get("phase", "-"), a[0] if a else "-", s.get("suspendedAtStep", "-"))'
}
wait_dlj() { # name want
  got=
  for _ in $(seq 150); do
    got=$(dlj "$1")
    [ "$got" = "$2" ] && return 0
    sleep 0.2
  done
  return 1
}
wait_dlj short "WaitingForAdmission WaitingForAdmission -"
rc=$?
check "DataLoadJob short is WaitingForAdmission while Kueue holds its Job (got: $got)" $rc
msg=$(k -n training get dataloadjob short -o jsonpath='{.status.conditions[?(@.type=="Admitted")].message}')
[ "$msg" = "batch/v1 Job training/short is suspended (spec.suspend: true): waiting for admission by its queue; the trainers start at step 40" ]
check "its Admitted condition names the Job and the step it starts at" $?
[ $rc -eq 0 ] || echo "Admitted: $msg"
wait_dlj queued "Pending TrainersAdmitted -"
check "DataLoadJob queued, whose Job Kueue admitted, is Admitted (pods made, sidecars not run here; got: $got)" $?

# A Job of a higher priority in the same ClusterQueue, which has room for
# one of them: Kueue preempts the trainers (suspends their Job, whose pods
# go), and the DataLoadJob is Suspended at its recorded step.
cat <<EOF | k apply -f - >"$TMP/urgent.out" 2>&1
apiVersion: batch/v1
kind: Job
metadata:
  name: urgent
  namespace: training
  labels: {kueue.x-k8s.io/queue-name: exact, kueue.x-k8s.io/priority-class: high}
spec:
  suspend: true
  template:
    spec:
      restartPolicy: Never
      containers:
      - name: urgent
        image: urgent:1
        resources: {requests: {cpu: "4", memory: 1Gi}}
EOF
check "kubectl apply a Job of priority class high, 4 CPU, in LocalQueue exact" $?
wait_dlj queued "Suspended Suspended 40"
rc=$?
check "Kueue preempts the trainers: DataLoadJob queued is Suspended at step 40 (got: $got)" $rc
[ $rc -eq 0 ] || { k -n training get job queued urgent -o wide; tail -5 "$TMP/kueue.log"; }
both=
for _ in $(seq 150); do
  both="$(k -n training get job queued -o jsonpath='{.spec.suspend}') $(k -n training get job urgent -o jsonpath='{.spec.suspend}')"
  [ "$both" = "true false" ] && break
  sleep 0.2
done
[ "$both" = "true false" ]
check "the trainers' Job is suspended, the preemptor's admitted (spec.suspend: $both)" $?
k -n training get dataloadjob queued -o jsonpath='{.status.conditions[?(@.type=="Admitted")].message}' >"$TMP/preempted.txt"
grep -q "after running: preempted by its queue or stopped; the trainers resume at step 40 when admitted again" "$TMP/preempted.txt"
check "its Admitted condition says it was preempted and where it resumes" $?
[ "$(k -n training get dataloadjob queued -o jsonpath='{.status.conditions[?(@.type=="Degraded")].reason}')" = TrainersSuspended ]
check "a preempted job is not Degraded" $?
k -n training delete job urgent --cascade=foreground --wait=false >/dev/null 2>&1
wait_dlj queued "Pending TrainersAdmitted -"
rc=$?
check "the preemptor gone, Kueue admits the trainers again: DataLoadJob queued is Admitted (got: $got)" $rc
wait_sidecars_per_pod training queued "1 1"
rc=$?
check "the Job's 2 new pods each have the sidecar once" $rc
[ $rc -eq 0 ] || echo "sidecars per pod: $SIDECARS"
[ "$(k -n training get configmap queued-meshload -o jsonpath='{.data.resume\.json}')" = '{"specStep":40,"step":40}' ]
check "the ConfigMap's resume step is the one recorded before the preemption" $?
k -n training get events --field-selector involvedObject.kind=DataLoadJob,involvedObject.name=queued \
  -o jsonpath='{range .items[*]}{.type} {.reason}{"\n"}{end}' >"$TMP/events.txt"
grep -q "^Normal Suspended$" "$TMP/events.txt" && grep -q "^Normal TrainersAdmitted$" "$TMP/events.txt" &&
  ! grep -q "^Warning" "$TMP/events.txt"
rc=$?
check "the DataLoadJob's events: Normal Suspended and TrainersAdmitted, no warning" $rc
[ $rc -eq 0 ] || cat "$TMP/events.txt"

# The same trainers as a JobSet: 2 replicas of an Indexed Job of 1 pod.
{
  dataloadjob js
  cat <<EOF
---
apiVersion: jobset.x-k8s.io/v1alpha2
kind: JobSet
metadata:
  name: js-run
  namespace: training
  labels: {meshload.io/job: js, kueue.x-k8s.io/queue-name: jobsets}
spec:
  suspend: true
  replicatedJobs:
  - name: workers
    replicas: 2
    template:
      spec:
        completionMode: Indexed
        completions: 1
        parallelism: 1
EOF
  trainer_template js "        "
} | k apply -f - >"$TMP/jobset-apply.out" 2>&1
rc=$?
check "kubectl apply a DataLoadJob and its trainers as a suspended JobSet in LocalQueue jobsets" $rc
[ $rc -eq 0 ] || cat "$TMP/jobset-apply.out"
k -n training get jobset js-run -o json >"$TMP/jobset.json" 2>/dev/null
has_sidecar "$TMP/jobset.json" spec.replicatedJobs.0.template.spec.template
check "the webhook put the sidecar in the JobSet's template" $?
admitted_workload JobSet js-run "$TMP/workload-jobset.json"
workload_counts_sidecars "$TMP/workload-jobset.json" workers 2
rc=$?
check "Kueue's Workload for the JobSet holds the sidecar, and ClusterQueue jobsets admits it: 4 CPU, 3Gi" $rc
[ $rc -eq 0 ] || { head -c 2000 "$TMP/workload-jobset.json"; tail -5 "$TMP/kueue.log"; }
wait_sidecars_per_pod training jobset.sigs.k8s.io/jobset-name=js-run "1 1"
rc=$?
check "JobSet made its 2 Jobs, the Job controller their pods, each with the sidecar once" $rc
[ $rc -eq 0 ] || { echo "sidecars per pod: $SIDECARS"; k -n training get jobset,jobs; tail -20 "$TMP/jobset.log"; }
wait_dlj js "Pending TrainersAdmitted -"
check "DataLoadJob js is Admitted (got: $got)" $?
# The processes the controller gave a JobSet's pods, as "G.C=P" (its Job's
# global index, its completion index, its process), sorted.
wait_processes() { # dataloadjob jobset want
  INDICES=
  for _ in $(seq 150); do
    k -n training get configmap "$1-meshload" -o json >"$TMP/$1-cm.json" 2>/dev/null
    INDICES=$(k -n training get pods -l "jobset.sigs.k8s.io/jobset-name=$2" -o json | /usr/bin/python3 -c '
import json, sys
try:
    cm = json.load(open(sys.argv[1])).get("data", {})
except ValueError:
    cm = {}
print(" ".join(sorted("%s.%s=%s" % (p["metadata"]["labels"].get("jobset.sigs.k8s.io/job-global-index"),
                                    p["metadata"]["annotations"].get("batch.kubernetes.io/job-completion-index"),
                                    cm.get("process." + p["metadata"]["name"]))
                      for p in json.load(sys.stdin)["items"])))' "$TMP/$1-cm.json" 2>/dev/null)
    [ "$INDICES" = "$3" ] && return 0
    sleep 0.2
  done
  return 1
}
# 1 pod per Job: the process is the Job's global index.
wait_processes js js-run "0.0=0 1.0=1"
check "the JobSet's pods have the processes of their Jobs' global indices (global.completion index=process: $INDICES)" $?

# The same trainers as a Kubeflow TrainJob of 2 nodes, on a TrainingRuntime
# of the DataLoadJob's (a torch runtime: its node job's template labelled).
{
  dataloadjob tj
  cat <<EOF
---
apiVersion: trainer.kubeflow.org/v1alpha1
kind: TrainingRuntime
metadata:
  name: torch-tj
  namespace: training
  labels: {meshload.io/job: tj, trainer.kubeflow.org/framework: torch}
spec:
  mlPolicy:
    numNodes: 1
    torch: {}
  template:
    spec:
      replicatedJobs:
      - name: node
        template:
          metadata:
            labels: {trainer.kubeflow.org/trainjob-ancestor-step: trainer}
          spec:
            template:
              metadata:
                labels: {app: tj, meshload.io/job: tj}
              spec:
                containers:
                - name: node
                  image: trainer:1
---
apiVersion: trainer.kubeflow.org/v1alpha1
kind: TrainJob
metadata:
  name: tj-run
  namespace: training
  labels: {kueue.x-k8s.io/queue-name: trainjobs}
spec:
  suspend: true
  # What Kueue's TrainJob webhook adds (not registered here): its runtime
  # patch, where it places what it admits with.
  runtimePatches:
  - manager: kueue.x-k8s.io/manager
    trainingRuntimeSpec:
      template:
        metadata: {labels: {kueue.x-k8s.io/queue-name: trainjobs}}
        spec: {}
  runtimeRef: {name: torch-tj, kind: TrainingRuntime, apiGroup: trainer.kubeflow.org}
  trainer:
    numNodes: 2
    resourcesPerNode: {requests: {cpu: "1", memory: 1Gi}}
EOF
} | k apply -f - >"$TMP/trainjob-apply.out" 2>&1
rc=$?
check "kubectl apply a DataLoadJob, its TrainingRuntime and a suspended TrainJob of 2 nodes in LocalQueue trainjobs" $rc
[ $rc -eq 0 ] || cat "$TMP/trainjob-apply.out"
k -n training get trainingruntime torch-tj -o json >"$TMP/runtime.json" 2>/dev/null
has_sidecar "$TMP/runtime.json" spec.template.spec.replicatedJobs.0.template.spec.template
check "the webhook put the sidecar in the TrainingRuntime's node template" $?
admitted_workload TrainJob tj-run "$TMP/workload-trainjob.json"
workload_counts_sidecars "$TMP/workload-trainjob.json" node 2
rc=$?
check "Kueue's Workload for the TrainJob holds the sidecar, and ClusterQueue trainjobs admits it: 4 CPU, 3Gi" $rc
[ $rc -eq 0 ] || { head -c 3000 "$TMP/workload-trainjob.json"; echo; tail -5 "$TMP/kueue.log"; }
wait_sidecars_per_pod training jobset.sigs.k8s.io/jobset-name=tj-run "1 1"
rc=$?
check "Trainer made the TrainJob's JobSet, JobSet its Job, the Job controller 2 pods, each with the sidecar once" $rc
[ $rc -eq 0 ] || {
  echo "sidecars per pod: $SIDECARS"
  k -n training get trainjob,jobset,jobs
  k -n training get trainjob tj-run -o jsonpath='{.spec.suspend} {.status}{"\n"}'
  grep -i 'tj-run' "$TMP/kueue.log" | tail -8 | cut -c1-500
  grep -i 'tj-run' "$TMP/trainer.log" | tail -5 | cut -c1-500
}
wait_dlj tj "Pending TrainersAdmitted -"
check "DataLoadJob tj is Admitted (got: $got)" $?
# One node Job of 2 pods: the process is the completion index.
wait_processes tj tj-run "0.0=0 0.1=1"
check "the TrainJob's pods have the processes of their completion indices (global.completion index=process: $INDICES)" $?

finish
