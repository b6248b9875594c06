#!/usr/bin/python3
"""Checks the DataLoadJob CRD (crds/dataloadjobs.meshload.io.yaml):

- structural: every schema node has a type; strings, lists and maps are
  bounded (what the API server needs to price CEL rules);
- its defaults are the planner's defaults (docs/crd-reference.md);
- every DataLoadJob in examples/ validates against the schema, and broken
  variants do not (Debian's python3-jsonschema; CEL rules are not evaluated
  here: tests/charts/helm_cluster_test.sh has the real API server evaluate
  every rule);
- its dtype enum is the planner's list, read from the real `meshload plan`.

usage: crd_check.py REPO_ROOT MESHLOAD_BINARY
"""
import copy
import glob
import os
import subprocess
import sys
import tempfile

import jsonschema
import yaml

ROOT, MESHLOAD = sys.argv[1], sys.argv[2]
results = {"passed": 0, "failed": 0}


def check(name, ok, detail=""):
    results["passed" if ok else "failed"] += 1
    print(("ok   " if ok else "FAIL ") + name + ("" if ok or not detail else "\n     " + str(detail)))


crd = yaml.safe_load(open(os.path.join(ROOT, "crds/dataloadjobs.meshload.io.yaml")))
version = crd["spec"]["versions"][0]
schema = version["schema"]["openAPIV3Schema"]

# --- structural and bounded -------------------------------------------------
problems = []


def walk(node, path):
    if path == "metadata":
        return
    if node.get("x-kubernetes-int-or-string"):
        if "maxLength" not in node:
            problems.append(path + ": unbounded int-or-string")
        return
    if "type" not in node:
        problems.append(path + ": no type")
        return
    t = node["type"]
    if t == "string" and not ("maxLength" in node or "enum" in node or node.get("format") == "date-time"):
        problems.append(path + ": unbounded string")
    if t == "array":
        if "maxItems" not in node:
            problems.append(path + ": unbounded list")
        walk(node.get("items", {}), path + "[]")
    if t == "object":
        if "additionalProperties" in node:
            if "maxProperties" not in node:
                problems.append(path + ": unbounded map")
            walk(node["additionalProperties"], path + "{}")
        for k, v in node.get("properties", {}).items():
            walk(v, (path + "." if path else "") + k)


for k, v in schema["properties"].items():
    if k not in ("apiVersion", "kind", "metadata"):
        walk(v, k)
check("the schema is structural and every string, list and map is bounded", not problems, problems)


def undescribed(node, path, out):
    """Properties without a description (kubectl explain shows nothing for them)."""
    for k, v in (node.get("properties") or {}).items():
        p = (path + "." if path else "") + k
        # metadata: the server refuses anything but a type there (ObjectMeta documents itself).
        if p != "metadata" and not (v.get("description") or "").strip():
            out.append(p)
        undescribed(v, p, out)
    if isinstance(node.get("items"), dict):
        undescribed(node["items"], path + "[]", out)
    return out


missing = undescribed(schema, "", [])
check("every property has a description (kubectl explain documents every field)",
      not missing and schema.get("description"), missing)
batch_axes = schema["properties"]["spec"]["properties"]["mesh"]["properties"]["batchAxes"]
check("batchAxes is an ordered list (atomic), not a set: its order decides the sharding",
      batch_axes.get("x-kubernetes-list-type") == "atomic", batch_axes.get("x-kubernetes-list-type"))
check("group, kind, short name, scope",
      crd["spec"]["group"] == "meshload.io" and crd["spec"]["names"]["kind"] == "DataLoadJob"
      and "dlj" in crd["spec"]["names"]["shortNames"] and crd["spec"]["scope"] == "Namespaced")
check("status subresource and printer columns",
      "status" in version["subresources"]
      and [c["name"] for c in version["additionalPrinterColumns"]] == ["Strategy", "Processes", "Ready", "Phase", "Step", "Age"])

# --- defaults are the planner's ---------------------------------------------
spec = schema["properties"]["spec"]["properties"]
defaults = {
    "mesh.devicesPerProcess": (spec["mesh"]["properties"]["devicesPerProcess"].get("default"), 1),
    "replication.fanout": (spec["replication"]["properties"]["fanout"].get("default"), "Load"),
    "strategy": (spec["strategy"].get("default"), "PerProcess"),
    "batch.prefetch": (spec["batch"]["properties"]["prefetch"].get("default"), 2),
    "shuffle.mode": (spec["shuffle"]["properties"]["mode"].get("default"), "Global"),
    "shuffle.seed": (spec["shuffle"]["properties"]["seed"].get("default"), 0),
    "resume.step": (spec["resume"]["properties"]["step"].get("default"), 0),
    "health.starvedWaitPercent": (spec["health"]["properties"]["starvedWaitPercent"].get("default"), 25),
    "health.stragglerSteps": (spec["health"]["properties"]["stragglerSteps"].get("default"), 100),
    "health.stragglerLatencyFactor": (spec["health"]["properties"]["stragglerLatencyFactor"].get("default"), 4),
}
wrong = {k: v for k, v in defaults.items() if v[0] != v[1]}
check("defaults match the planner's", not wrong, wrong)
check("blockSize and replication.mode have no default (the planner derives them)",
      "default" not in spec["shuffle"]["properties"]["blockSize"] and "default" not in spec["replication"]["properties"]["mode"])

# --- examples validate, broken variants do not ------------------------------
validator = jsonschema.Draft7Validator(schema)
jobs = []
for path in sorted(glob.glob(os.path.join(ROOT, "examples/*.yaml"))):
    for doc in yaml.safe_load_all(open(path)):
        if isinstance(doc, dict) and doc.get("kind") == "DataLoadJob":
            jobs.append((os.path.basename(path), doc))
check("examples/ has DataLoadJobs", len(jobs) >= 2, [p for p, _ in jobs])
for name, doc in jobs:
    errors = [e.message for e in validator.iter_errors(doc)]
    check("%s validates against the CRD schema" % name, not errors, errors)

base = jobs[0][1]
broken = {
    "no spec.mesh": lambda d: d["spec"].pop("mesh"),
    "an axis of size 0": lambda d: d["spec"]["mesh"]["axes"][0].__setitem__("size", 0),
    "an unknown strategy": lambda d: d["spec"].__setitem__("strategy", "PerProces"),
    "a string batch size": lambda d: d["spec"]["batch"].__setitem__("globalBatchSize", "8"),
    "an unknown dtype": lambda d: d["spec"]["dataset"].__setitem__("dtype", "uint128"),
    "prefetch above 1024": lambda d: d["spec"]["batch"].__setitem__("prefetch", 4096),
    "nine axes": lambda d: d["spec"]["mesh"].__setitem__("axes", [{"name": "a%d" % i, "size": 1} for i in range(9)]),
}
for what, mutate in broken.items():
    doc = copy.deepcopy(base)
    mutate(doc)
    check("the schema rejects " + what, bool(list(validator.iter_errors(doc))))

# --- the dtype enum is the planner's ----------------------------------------
with tempfile.TemporaryDirectory() as tmp:
    job = copy.deepcopy(base)
    job["spec"]["dataset"]["dtype"] = "nope"
    path = os.path.join(tmp, "job.yaml")
    yaml.safe_dump(job, open(path, "w"))
    err = subprocess.run([MESHLOAD, "plan", "-f", path, "--samples", "100000"], capture_output=True, text=True).stderr
    listed = err.split("expected one of ")[1].split(" (line")[0].split("\n")[0] if "expected one of " in err else ""
    planner = [s.strip() for s in listed.split(",") if s.strip()]
    check("the dtype enum is the planner's dtypes",
          planner == spec["dataset"]["properties"]["dtype"]["enum"], (planner, err[:200]))

print("%d passed, %d failed" % (results["passed"], results["failed"]))
sys.exit(1 if results["failed"] else 0)
