#!/usr/bin/python3
"""Checks pods as the API server stored them after the sidecar-injection
webhook (tests/charts/helm_cluster_test.sh): the pods of
examples/trainer-job.yaml for examples/hybrid-fsdp.yaml, injected by a
meshload-controller started with --sidecar-image meshload/sidecar:test.

usage: injected_pods_check.py PODS_JSON   (kubectl get pods -o json)
"""
import json
import sys

pods = json.load(open(sys.argv[1]))["items"]
problems = [] if len(pods) == 4 else ["expected 4 pods, found %d" % len(pods)]
for pod in pods:
    name, spec = pod["metadata"]["name"], pod["spec"]
    init = spec.get("initContainers") or []
    sc = init[0] if init else {}
    env = {e["name"]: e for e in sc.get("env", [])}
    mounts = {m["name"]: m for m in sc.get("volumeMounts", [])}
    vols = {v["name"]: v for v in spec.get("volumes", [])}
    trainer = spec["containers"][0]
    ssc = sc.get("securityContext", {})
    want = [
        (sc.get("name") == "meshload-sidecar" and sc.get("restartPolicy") == "Always", "a native sidecar first"),
        (sc.get("image") == "meshload/sidecar:test", "the image from --sidecar-image"),
        ("--job=/etc/meshload/job/job.json" in sc.get("args", []), "--job"),
        ("--socket=/run/meshload/sidecar.sock" in sc.get("args", []), "--socket"),
        (env.get("MESHLOAD_PROCESS", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
         == "metadata.annotations['batch.kubernetes.io/job-completion-index']", "the completion index"),
        (all(k in env for k in ("POD_NAME", "POD_NAMESPACE", "POD_IP")), "the downward API"),
        (vols.get("meshload-job", {}).get("configMap", {}).get("name") == "hybrid-fsdp-meshload", "the job's ConfigMap"),
        ("emptyDir" in vols.get("meshload-run", {}), "the socket emptyDir"),
        ("meshload-peer" not in vols, "no peer secret (PerProcess, Load)"),
        (mounts.get("datasets") == {"name": "datasets", "mountPath": "/datasets", "readOnly": True},
         "the dataset's volume, read-only at spec.dataset.volume.mountPath"),
        (sc.get("resources", {}).get("claims") == [{"name": "gpus"}], "the trainer's GPU claim"),
        (sc.get("resources", {}).get("requests", {}).get("cpu") == "1", "the default resources"),
        (ssc.get("runAsNonRoot") is True and ssc.get("allowPrivilegeEscalation") is False
         and ssc.get("capabilities") == {"drop": ["ALL"]} and ssc.get("readOnlyRootFilesystem") is True
         and ssc.get("seccompProfile") == {"type": "RuntimeDefault"}, "a restricted security context"),
        (sc.get("readinessProbe", {}).get("httpGet", {}).get("path") == "/readyz", "the readiness probe"),
        ({"name": "MESHLOAD_SOCKET", "value": "/run/meshload/sidecar.sock"} in trainer.get("env", []), "MESHLOAD_SOCKET"),
        (any(m["mountPath"] == "/run/meshload" for m in trainer.get("volumeMounts", [])), "the socket in the trainer"),
        (pod["metadata"].get("annotations", {}).get("meshload.io/sidecar-injected") == "hybrid-fsdp",
         "the injected annotation"),
    ]
    problems += ["%s: not %s" % (name, what) for ok, what in want if not ok]
print("\n".join(problems) if problems else "ok")
sys.exit(1 if problems else 0)
