#!/usr/bin/python3
"""Checks the Helm chart charts/meshload with the real helm (built from the
pinned Go module by scripts/build-test-tools.sh), without a cluster
(tests/charts/helm_cluster_test.sh takes the chart to the real API server):

- `helm lint --strict` is clean, with the default values and with others;
- Chart.yaml has what Helm and the project need; every .Values path a
  template reads is in values.yaml, and every value is read; every include
  names a define of _helpers.tpl; the chart's CRD is the repository's
  crds/dataloadjobs.meshload.io.yaml, byte for byte;
- values.schema.json: a wrong type, an unknown key, an out-of-range or
  malformed value makes helm refuse the values with a message naming it;
- `helm template` renders with the default values and with others, and the
  objects are checked: the Deployment is hardened (non-root, read-only root
  filesystem, no capabilities, RuntimeDefault seccomp), passes the
  controller's flags from the values (flags the controller's --help lists),
  probes the metrics port; the RBAC grants exactly what the controller needs
  (no wildcards, no secrets read), the Lease only in the release's
  namespace, and nothing cluster-wide when watchNamespace is set; selectors,
  bindings and names agree;
- the checks themselves fail on broken objects (negative controls);
- examples/trainer-pod.yaml runs the sidecar as the chart's controller and
  examples/hybrid-fsdp.yaml expect.

usage: chart_check.py REPO_ROOT [--write-monitoring DIR]
helm: $MESHLOAD_HELM, else the one scripts/build-test-tools.sh built.

Longer than the ~700-line rule on purpose: each scenario (a set of values)
is rendered once and checked by the same problem finders (deployment, RBAC,
webhook, certificate, examples), which read best next to each other.
"""
import copy
import json
import os
import re
import subprocess
import sys
import tempfile

import yaml

ROOT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "../..")
CHART = os.path.join(ROOT, "charts/meshload")
TEMPLATES = os.path.join(CHART, "templates")
results = {"passed": 0, "failed": 0}


def check(name, ok, detail=""):
    """ok: a truth value, or a function that returns one, or a list of problems
    (ok when empty) when detail is None. An object too broken to look at
    (a missing field, a missing object) fails the check instead of the script."""
    if callable(ok):
        try:
            ok = ok()
        except (KeyError, IndexError, TypeError, AttributeError, AssertionError) as e:
            ok, detail = False, "could not check: %s: %s" % (type(e).__name__, e)
    if detail is None:
        ok, detail = not ok, ok
    results["passed" if ok else "failed"] += 1
    print(("ok   " if ok else "FAIL ") + name + ("" if ok or not detail else "\n     " + str(detail)))


def read(path):
    with open(path) as f:
        return f.read()


class StrictLoader(yaml.SafeLoader):
    """Like Helm's YAML parser, a key defined twice in one map is an error
    (PyYAML would keep the last silently)."""


def _unique_map(loader, node):
    loader.flatten_mapping(node)
    seen = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        if key in seen:
            raise yaml.constructor.ConstructorError(None, None, "key %r defined twice" % (key,), key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node)


StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique_map)


# ---- Chart.yaml, values.yaml, static references ------------------------------
chart = yaml.safe_load(read(os.path.join(CHART, "Chart.yaml")))
project_version = re.search(r"project\(meshload VERSION ([0-9.]+)", read(os.path.join(ROOT, "CMakeLists.txt"))).group(1)
want_chart = {"apiVersion": "v2", "name": "meshload", "type": "application", "version": "0.1.0",
              "appVersion": project_version, "kubeVersion": ">=1.28.0-0"}
wrong = {k: (chart.get(k), v) for k, v in want_chart.items() if chart.get(k) != v}
check("Chart.yaml: apiVersion v2, name, type, version, appVersion (the CMake project's), kubeVersion",
      not wrong and chart.get("description"), wrong)
check("Chart.yaml: the name is the chart's directory name", chart.get("name") == os.path.basename(CHART))

try:
    default_values = yaml.safe_load(read(os.path.join(CHART, "values.yaml")))
    check("values.yaml parses to a map", isinstance(default_values, dict))
except yaml.YAMLError as e:
    check("values.yaml parses to a map", False, e)
    default_values = {}

template_files = sorted(os.listdir(TEMPLATES))
sources = {name: read(os.path.join(TEMPLATES, name)) for name in template_files}
want_files = {"_helpers.tpl", "serviceaccount.yaml", "rbac.yaml", "lease.yaml", "webhook.yaml", "deployment.yaml", "service.yaml",
              "servicemonitor.yaml", "poddisruptionbudget.yaml", "NOTES.txt"}
check("templates/ has every template", want_files <= set(template_files), sorted(want_files - set(template_files)))


def has_path(tree, path):
    for part in path:
        if not isinstance(tree, dict) or part not in tree:
            return False
        tree = tree[part]
    return True


refs = set()
for name, src in sources.items():
    for m in re.finditer(r"\.Values((?:\.[A-Za-z_][A-Za-z0-9_]*)+)", src):
        refs.add(m.group(1)[1:])
def open_map_prefix(tree, path):
    """True when a prefix of path is an empty map in values.yaml: free-form
    (labels, issuerRef), whose keys a template may read without defaults."""
    for i in range(1, len(path)):
        node = tree
        for part in path[:i]:
            node = node.get(part) if isinstance(node, dict) else None
        if node == {}:
            return True
    return False


missing = sorted(r for r in refs if not has_path(default_values, r.split("."))
                 and not open_map_prefix(default_values, r.split(".")))
check("every .Values path a template reads is in values.yaml (%d paths)" % len(refs), refs and not missing, missing)


def value_paths(tree, prefix=""):
    for k, v in tree.items():
        path = prefix + k
        yield path
        if isinstance(v, dict) and v:
            yield from value_paths(v, path + ".")


unread = [p for p in value_paths(default_values)
          if not any(r == p or p.startswith(r + ".") or r.startswith(p + ".") for r in refs)]
check("every key of values.yaml is read by a template", not unread, unread)

defines = set(re.findall(r'define\s+"([^"]+)"', sources.get("_helpers.tpl", "")))
includes = {(name, m) for name, src in sources.items() for m in re.findall(r'include\s+"([^"]+)"', src)}
undefined = sorted("%s: %s" % x for x in includes if x[1] not in defines)
check("every include names a define of _helpers.tpl (%d includes)" % len(includes), includes and not undefined, undefined)
unused = sorted(d for d in defines if d not in {m for _, m in includes})
check("every define of _helpers.tpl is used", not unused, unused)
stray = sorted(n for n, src in sources.items() if n != "_helpers.tpl" and re.search(r"\bdefine\s", src))
check("defines live only in _helpers.tpl", not stray, stray)

crd_src = os.path.join(ROOT, "crds/dataloadjobs.meshload.io.yaml")
crd_chart = os.path.join(CHART, "crds/dataloadjobs.meshload.io.yaml")
same = os.path.exists(crd_chart) and open(crd_src, "rb").read() == open(crd_chart, "rb").read()
check("charts/meshload/crds/ holds crds/dataloadjobs.meshload.io.yaml byte for byte", same,
      "cp crds/dataloadjobs.meshload.io.yaml charts/meshload/crds/")
check("the chart has no other CRD", sorted(os.listdir(os.path.join(CHART, "crds"))) == ["dataloadjobs.meshload.io.yaml"])


# ---- rendering the chart --------------------------------------------------------
def merge(base, over):
    out = copy.deepcopy(base)
    for k, v in over.items():
        if v is None:
            out.pop(k, None)
        elif isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def find_helm():
    if os.environ.get("MESHLOAD_HELM"):
        return os.environ["MESHLOAD_HELM"]
    out = subprocess.run([os.path.join(ROOT, "scripts/build-test-tools.sh"), "--dir"], capture_output=True, text=True)
    if out.returncode != 0:
        print("FAIL helm is not built: " + out.stderr.strip())
        print("0 passed, 1 failed")
        sys.exit(1)
    return os.path.join(out.stdout.strip(), "helm")


HELM = find_helm()
# `helm template` checks Chart.yaml's kubeVersion against this: the version
# of the Kubernetes the tests run (tests/tools/go.mod).
KUBE_VERSION = re.search(r"k8s.io/kubernetes (v[0-9.]+)", read(os.path.join(ROOT, "tests/tools/go.mod"))).group(1)


class HelmError(Exception):
    pass


def helm(*args, values=None):
    """Runs helm; raises HelmError with its message when it fails."""
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
        extra = []
        if values is not None:
            json.dump(values, f)
            f.flush()
            extra = ["-f", f.name]
        out = subprocess.run([HELM, *args, *extra], capture_output=True, text=True)
    if out.returncode != 0:
        raise HelmError(out.stderr.strip() or out.stdout.strip())
    return out.stdout


def render_chart(overrides=None, release="meshload", namespace="meshload-system"):
    """{template name: rendered text} and the parsed documents of the
    manifests, as `helm template` renders them (overrides merge into
    values.yaml as `helm -f` does; None removes a key). Raises HelmError
    where helm fails."""
    text = helm("template", release, CHART, "--namespace", namespace, "--kube-version", KUBE_VERSION,
                values=overrides or {})
    rendered, docs = {}, []
    for part in re.split(r"^---\n", text, flags=re.M):
        m = re.match(r"# Source: meshload/templates/(\S+)\n", part)
        if not m:
            if part.strip():
                raise HelmError("a rendered document without its Source line: %r" % part[:200])
            continue
        name = m.group(1)
        rendered[name] = rendered.get(name, "") + part
        for doc in yaml.load_all(part, Loader=StrictLoader):
            if doc is not None:
                doc["__file"] = name
                docs.append(doc)
    return rendered, docs


def objs(docs, kind):
    return [d for d in docs if d.get("kind") == kind]


def the(docs, kind):
    found = objs(docs, kind)
    if len(found) != 1:
        raise AssertionError("expected one %s, found %d" % (kind, len(found)))
    return found[0]


def parse_args(args):
    """{flag: value} from --flag=value and --flag value."""
    out, i = {}, 0
    while i < len(args):
        a = str(args[i])
        if a.startswith("--") and "=" in a:
            k, v = a[2:].split("=", 1)
        elif a.startswith("--") and i + 1 < len(args) and not str(args[i + 1]).startswith("--"):
            k, v = a[2:], str(args[i + 1])
            i += 1
        else:
            k, v = a.lstrip("-"), None
        out[k] = v
        i += 1
    return out


CONTROLLER_FLAGS = {"kubeconfig", "namespace", "workers", "qps", "burst", "event-qps", "metrics-port", "metrics-address",
                    "webhook-cert-dir", "webhook-port", "webhook-address", "sidecar-image", "sidecar-resources",
                    "sidecar-fs-group",
                    "leader-elect", "leader-election-namespace", "leader-election-id", "identity",
                    "sidecar-container", "log-level", "log-format"}
# The flags the controller binary parses: its --help, generated from the flags
# it registers (common/flags.h), when the build's binary is given
# (--controller PATH); None otherwise.
def controller_flags():
    if "--controller" not in sys.argv:
        return None
    binary = sys.argv[sys.argv.index("--controller") + 1]
    out = subprocess.run([binary, "--help"], capture_output=True, text=True)
    return set(re.findall(r"^\s+--([a-z0-9-]+)", out.stdout + out.stderr, re.M))


PARSED_FLAGS = controller_flags()


def security_problems(pod_spec, container):
    """What is missing from the hardening the chart and the example promise."""
    pod_sc = pod_spec.get("securityContext") or {}
    sc = container.get("securityContext") or {}
    eff = dict(pod_sc)
    eff.update({k: v for k, v in sc.items()})
    p = []
    if eff.get("runAsNonRoot") is not True:
        p.append("runAsNonRoot is not true")
    if eff.get("runAsUser") != 65532:
        p.append("runAsUser is %r, not 65532" % eff.get("runAsUser"))
    if sc.get("readOnlyRootFilesystem") is not True:
        p.append("readOnlyRootFilesystem is not true")
    if sc.get("allowPrivilegeEscalation") is not False:
        p.append("allowPrivilegeEscalation is not false")
    if sc.get("privileged"):
        p.append("privileged")
    caps = sc.get("capabilities") or {}
    if caps.get("drop") != ["ALL"] or caps.get("add"):
        p.append("capabilities are %r, not drop [ALL]" % caps)
    if (eff.get("seccompProfile") or {}).get("type") != "RuntimeDefault":
        p.append("seccompProfile is %r" % eff.get("seccompProfile"))
    return p


def the_release_name(docs):
    """The release's full name: the Deployment's."""
    return the(docs, "Deployment")["metadata"]["name"]


def metrics_service(docs):
    found = [d for d in objs(docs, "Service") if d["metadata"]["name"].endswith("-metrics")]
    if len(found) != 1:
        raise AssertionError("expected one metrics Service, found %d" % len(found))
    return found[0]


def controller_container(docs):
    dep = the(docs, "Deployment")
    containers = dep["spec"]["template"]["spec"]["containers"]
    return dep, [c for c in containers if c["name"] == "controller"][0]


def deployment_problems(docs, values, namespace):
    """The Deployment against the values it was rendered from."""
    dep, c = controller_container(docs)
    pod = dep["spec"]["template"]["spec"]
    p = ["security: " + x for x in security_problems(pod, c)]
    args = parse_args(c.get("args", []))
    unknown = sorted(set(args) - CONTROLLER_FLAGS - {a.lstrip("-").split("=")[0] for a in values["extraArgs"]})
    if unknown:
        p.append("flags the controller does not have: %s" % unknown)
    le = values["leaderElection"]["enabled"]
    want = {"workers": str(values["workers"]), "qps": str(values["qps"]), "burst": str(values["burst"]),
            "event-qps": str(values["eventQps"]),
            "metrics-port": str(values["metrics"]["port"]), "leader-elect": "true" if le else "false",
            "sidecar-container": values["sidecarContainerName"], "log-level": values["logLevel"],
            "log-format": values["logFormat"]}
    if values["watchNamespace"]:
        want["namespace"] = values["watchNamespace"]
    if values["webhook"]["enabled"]:
        image = values["sidecar"]["image"]
        want.update({"webhook-cert-dir": "/etc/meshload/webhook", "webhook-port": str(values["webhook"]["port"]),
                     "sidecar-image": "%s:%s" % (image["repository"], image["tag"] or chart["appVersion"]),
                     "sidecar-fs-group": str(values["sidecar"]["fsGroup"])})
        try:
            if json.loads(args.get("sidecar-resources") or "null") != values["sidecar"]["resources"]:
                p.append("--sidecar-resources is %r, not the values' sidecar.resources" % args.get("sidecar-resources"))
        except ValueError:
            p.append("--sidecar-resources is not JSON: %r" % args.get("sidecar-resources"))
        mounts = {m["mountPath"]: m for m in c.get("volumeMounts", [])}
        m = mounts.get("/etc/meshload/webhook")
        vols = {v["name"]: v for v in pod.get("volumes", [])}
        if not m or not m.get("readOnly") or \
                vols.get(m["name"], {}).get("secret", {}).get("secretName") != the_release_name(docs) + "-webhook-tls":
            p.append("the webhook's certificate Secret is not mounted read-only at /etc/meshload/webhook")
        if not any(x.get("name") == "webhook" and x.get("containerPort") == values["webhook"]["port"]
                   for x in c.get("ports", [])):
            p.append("no containerPort named webhook")
    elif any(k.startswith("webhook") or k.startswith("sidecar-i") for k in args):
        p.append("webhook flags without the webhook")
    if le:
        want["leader-election-namespace"] = namespace
    for k, v in want.items():
        if args.get(k) != v:
            p.append("--%s is %r, want %r" % (k, args.get(k), v))
    if not values["watchNamespace"] and "namespace" in args:
        p.append("--namespace is set without watchNamespace")
    if not le and "leader-election-id" in args:
        p.append("--leader-election-id without leader election")
    env = {e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") for e in c.get("env", [])}
    if env.get("POD_NAME") != "metadata.name" or env.get("POD_NAMESPACE") != "metadata.namespace":
        p.append("env POD_NAME/POD_NAMESPACE do not come from the downward API: %r" % env)
    ports = {x.get("name"): x for x in c.get("ports", [])}
    port = values["metrics"]["port"]
    if ports.get("metrics", {}).get("containerPort") != port:
        p.append("no containerPort %d named metrics: %r" % (port, c.get("ports")))
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        get = (c.get(probe) or {}).get("httpGet") or {}
        target = get.get("port")
        if get.get("path") != path or not (target == "metrics" or target == port):
            p.append("%s is %r, want GET %s on the metrics port" % (probe, c.get(probe), path))
    if pod.get("automountServiceAccountToken") is not True:
        p.append("automountServiceAccountToken is not true")
    if c.get("image") != "%s:%s" % (values["image"]["repository"], values["image"]["tag"] or chart["appVersion"]):
        p.append("image is %r" % c.get("image"))
    if not (c.get("resources") or {}).get("requests"):
        p.append("no resource requests")
    if dep["spec"].get("replicas") != values["replicaCount"]:
        p.append("replicas is %r" % dep["spec"].get("replicas"))
    return p


# What the controller uses (tests/controller proves each against the real
# authoriser: nothing refused, nothing unused).
WORKLOAD_RULES = [("meshload.io", "dataloadjobs", ["get", "list", "watch", "update"]),
                  ("meshload.io", "dataloadjobs/status", ["update"]),
                  ("meshload.io", "dataloadjobs/finalizers", ["update"]),
                  ("", "pods", ["list", "watch"]),
                  ("batch", "jobs", ["list", "watch"]),
                  ("", "configmaps", ["get", "list", "watch", "create", "update", "delete"]),
                  ("", "secrets", ["create", "delete"]),
                  ("", "events", ["create", "patch"])]


def grants(docs):
    """Every (scope, apiGroup, resource, verb, resourceNames) the rendered
    roles grant, and what is wrong with them that a set cannot show."""
    out, p = set(), []
    for d in docs:
        if d["kind"] not in ("Role", "ClusterRole"):
            continue
        scope = "cluster" if d["kind"] == "ClusterRole" else "namespace " + str(d["metadata"].get("namespace"))
        if d.get("aggregationRule"):
            p.append("%s %s aggregates other roles" % (d["kind"], d["metadata"]["name"]))
        for rule in d.get("rules") or []:
            if rule.get("nonResourceURLs"):
                p.append("nonResourceURLs in %s" % d["metadata"]["name"])
            for field in ("apiGroups", "resources", "verbs", "resourceNames"):
                if "*" in (rule.get(field) or []):
                    p.append("a wildcard in %s of %s %s" % (field, d["kind"], d["metadata"]["name"]))
            # Secrets: create and delete (the peer secrets); reading any is
            # refused, and so is deletecollection, whose answer carries the data.
            if "secrets" in (rule.get("resources") or []) and set(rule.get("verbs") or []) - {"create", "delete"}:
                p.append("secrets %s in %s %s" % (sorted(set(rule.get("verbs") or []) - {"create", "delete"}),
                                                  d["kind"], d["metadata"]["name"]))
            names = tuple(sorted(rule.get("resourceNames") or []))
            for g in rule.get("apiGroups") or []:
                for r in rule.get("resources") or []:
                    for v in rule.get("verbs") or []:
                        out.add((scope, g, r, v, names))
    return out, p


def rbac_problems(docs, values, namespace):
    got, p = grants(docs)
    watch = values["watchNamespace"]
    scope = "namespace " + watch if watch else "cluster"
    want = {(scope, g, r, v, ()) for g, r, verbs in WORKLOAD_RULES for v in verbs}
    if values["leaderElection"]["enabled"]:
        _, c = controller_container(docs)
        lease = parse_args(c["args"]).get("leader-election-id")
        ns = "namespace " + namespace
        want |= {(ns, "coordination.k8s.io", "leases", "get", (lease,)),
                 (ns, "coordination.k8s.io", "leases", "update", (lease,))}
    if got != want:
        p.append("granted but not needed: %s; needed but not granted: %s" % (sorted(got - want), sorted(want - got)))
    # Every role is bound to the controller's service account, and every
    # binding to a role of this release.
    sa = the(docs, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"]
    roles = {(d["kind"], d["metadata"]["name"], d["metadata"].get("namespace")) for d in docs
             if d["kind"] in ("Role", "ClusterRole")}
    bound = set()
    for b in docs:
        if b["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        ref = b["roleRef"]
        key = (ref["kind"], ref["name"], b["metadata"].get("namespace") if ref["kind"] == "Role" else None)
        if key not in roles:
            p.append("%s %s refers to %s, which is not rendered" % (b["kind"], b["metadata"]["name"], key))
        bound.add(key)
        if b.get("subjects") != [{"kind": "ServiceAccount", "name": sa, "namespace": namespace}]:
            p.append("%s %s binds %r, not the controller's service account" % (b["kind"], b["metadata"]["name"],
                                                                             b.get("subjects")))
    if roles - bound:
        p.append("roles bound to nothing: %s" % sorted(roles - bound, key=str))
    return p


STANDARD_LABELS = ("app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/version",
                   "app.kubernetes.io/managed-by", "helm.sh/chart")


def common_problems(docs, values, namespace, release):
    p = []
    for d in docs:
        what = "%s %s (%s)" % (d.get("kind"), d.get("metadata", {}).get("name"), d["__file"])
        if not d.get("apiVersion") or not d.get("kind") or not d.get("metadata", {}).get("name"):
            p.append(what + ": no apiVersion, kind or name")
            continue
        labels = d["metadata"].get("labels") or {}
        want = {"app.kubernetes.io/name": "meshload", "app.kubernetes.io/instance": release,
                "app.kubernetes.io/version": chart["appVersion"], "app.kubernetes.io/managed-by": "Helm",
                "helm.sh/chart": "meshload-" + chart["version"]}
        bad = {k: labels.get(k) for k in STANDARD_LABELS if labels.get(k) != want[k]}
        if bad:
            p.append(what + ": labels %r" % bad)
        if len(d["metadata"]["name"]) > 63:
            p.append(what + ": name longer than 63")
        cluster_scoped = d["kind"] in ("ClusterRole", "ClusterRoleBinding", "MutatingWebhookConfiguration")
        ns = d["metadata"].get("namespace")
        if cluster_scoped and ns:
            p.append(what + ": a cluster-scoped object with a namespace")
        if not cluster_scoped:
            allowed = {namespace}
            if d["kind"] in ("Role", "RoleBinding") and values["watchNamespace"]:
                allowed.add(values["watchNamespace"])
            if d["__file"] == "grafana-dashboard.yaml" and values["grafanaDashboard"]["namespace"]:
                allowed = {values["grafanaDashboard"]["namespace"]}  # where Grafana's sidecar looks
            if ns not in allowed:
                p.append(what + ": namespace %r, want one of %s" % (ns, sorted(allowed)))
    dep = the(docs, "Deployment")
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]
    selector = dep["spec"]["selector"]["matchLabels"]
    if not selector or any(pod_labels.get(k) != v for k, v in selector.items()):
        p.append("the Deployment's selector %r does not select its pods %r" % (selector, pod_labels))
    if "app.kubernetes.io/version" in selector or "helm.sh/chart" in selector:
        p.append("the Deployment's selector changes with the version (selectors are immutable)")
    svc = metrics_service(docs)
    if svc["spec"]["selector"] != selector:
        p.append("the Service selects %r, not the controller's pods" % svc["spec"]["selector"])
    sport = svc["spec"]["ports"][0]
    if sport.get("name") != "metrics" or sport.get("targetPort") not in ("metrics", values["metrics"]["port"]):
        p.append("the Service's port is %r" % sport)
    sa_name = dep["spec"]["template"]["spec"]["serviceAccountName"]
    if values["serviceAccount"]["create"] and [s["metadata"]["name"] for s in objs(docs, "ServiceAccount")] != [sa_name]:
        p.append("the pods' service account %r is not the one rendered" % sa_name)
    return p


def webhook_problems(docs, namespace, fullname, ca_bundle=True):
    p = []
    mwc = the(docs, "MutatingWebhookConfiguration")
    if len(mwc["webhooks"]) != 1:
        return ["expected one webhook, found %d" % len(mwc["webhooks"])]
    w = mwc["webhooks"][0]
    want = {"admissionReviewVersions": ["v1"], "failurePolicy": "Fail", "sideEffects": "None",
            "reinvocationPolicy": "IfNeeded", "matchPolicy": "Equivalent",
            "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"],
                       "scope": "Namespaced"}],
            "objectSelector": {"matchExpressions": [{"key": "meshload.io/job", "operator": "Exists"}]}}
    for k, v in want.items():
        if w.get(k) != v:
            p.append("%s is %r, want %r" % (k, w.get(k), v))
    if not 1 <= w.get("timeoutSeconds", 10) <= 5:
        p.append("timeoutSeconds %r is not 1..5" % w.get("timeoutSeconds"))
    exprs = w.get("namespaceSelector", {}).get("matchExpressions", [])
    excluded = [set(e["values"]) for e in exprs if e["key"] == "kubernetes.io/metadata.name" and e["operator"] == "NotIn"]
    if not excluded or not {"kube-system", namespace} <= excluded[0]:
        p.append("the namespaceSelector does not exclude kube-system and %s: %r" % (namespace, exprs))
    svc = w["clientConfig"].get("service", {})
    if svc != {"name": fullname + "-webhook", "namespace": namespace, "path": "/mutate-pods", "port": 443}:
        p.append("clientConfig.service is %r" % svc)
    services = {d["metadata"]["name"]: d for d in objs(docs, "Service")}
    ws = services.get(fullname + "-webhook")
    if not ws or ws["spec"]["ports"] != [{"name": "webhook", "port": 443, "targetPort": "webhook", "protocol": "TCP"}] \
            or ws["spec"]["selector"] != the(docs, "Deployment")["spec"]["selector"]["matchLabels"]:
        p.append("the webhook Service does not send 443 to the controller pods' port named webhook: %r" % ws)
    if ca_bundle and not w["clientConfig"].get("caBundle"):
        p.append("no caBundle")
    return p


def certificate_problems(docs, namespace, fullname):
    import base64
    secret = [d for d in objs(docs, "Secret") if d["metadata"]["name"] == fullname + "-webhook-tls"]
    if len(secret) != 1 or secret[0].get("type") != "kubernetes.io/tls":
        return ["no kubernetes.io/tls Secret %s-webhook-tls" % fullname]
    data = secret[0]["data"]
    w = the(docs, "MutatingWebhookConfiguration")["webhooks"][0]
    p = []
    if w["clientConfig"]["caBundle"] != data["ca.crt"]:
        p.append("caBundle is not the Secret's ca.crt")
    with tempfile.TemporaryDirectory() as tmp:
        for k in ("ca.crt", "tls.crt", "tls.key"):
            with open(os.path.join(tmp, k), "wb") as f:
                f.write(base64.b64decode(data[k]))
        dns = "%s-webhook.%s.svc" % (fullname, namespace)
        out = subprocess.run(["openssl", "verify", "-CAfile", os.path.join(tmp, "ca.crt"), "-verify_hostname", dns,
                              "-purpose", "sslserver", os.path.join(tmp, "tls.crt")], capture_output=True, text=True)
        if out.returncode != 0:
            p.append("openssl verify for %s: %s" % (dns, (out.stdout + out.stderr).strip()))
        pub = [subprocess.run(["openssl", kind, "-pubout", "-in", os.path.join(tmp, f)] + extra, capture_output=True,
                              text=True).stdout for kind, f, extra in (("x509", "tls.crt", ["-noout", "-pubkey"]),
                                                                       ("pkey", "tls.key", []))]
        if not pub[0] or pub[0].replace("-----BEGIN PUBLIC KEY-----", "") != pub[1].replace("-----BEGIN PUBLIC KEY-----", ""):
            p.append("tls.key is not tls.crt's key")
    return p


results_by_scenario = {}


def scenario(title, overrides, namespace="meshload-system", release="meshload"):
    values = merge(default_values, overrides)
    try:
        rendered, docs = render_chart(overrides, release, namespace)
    except (HelmError, yaml.YAMLError, AssertionError) as e:
        check("%s: renders and every document parses" % title, False, e)
        return None
    check("%s: renders and every document parses (%d objects)" % (title, len(docs)), True)
    ctx = (values, namespace, release)
    results_by_scenario[title] = (rendered, docs, ctx)
    check("%s: labels, namespaces, selectors and names agree" % title,
          lambda: common_problems(docs, values, namespace, release), None)
    check("%s: the Deployment is hardened, passes the flags, probes the metrics port" % title,
          lambda: deployment_problems(docs, values, namespace), None)
    check("%s: RBAC grants exactly what the controller needs, to its service account" % title,
          lambda: rbac_problems(docs, values, namespace), None)
    if PARSED_FLAGS is not None:
        check("%s: every flag passed is one the controller parses (its --help)" % title,
              lambda: sorted(set(parse_args(controller_container(docs)[1]["args"])) - PARSED_FLAGS)
              or ([] if PARSED_FLAGS else ["no flags in the controller's --help"]), None)
    return rendered, docs


if PARSED_FLAGS is None:
    print("note no --controller binary given: the flags are checked against the documented list only")

# Defaults.
out = scenario("defaults", {})
if out:
    rendered, docs = out
    kinds = sorted(d["kind"] for d in docs)
    check("defaults: ServiceAccount, ClusterRole(+Binding), leader-election Role(+Binding), Deployment, "
          "metrics Service, PodDisruptionBudget, and the webhook's Secret, Service and configuration; nothing else",
          kinds == sorted(["ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
                           "Deployment", "Service", "PodDisruptionBudget", "Secret", "Service",
                           "MutatingWebhookConfiguration", "Lease"]), kinds)
    check("defaults: the chart makes the controller's Lease, in the release's namespace",
          lambda: [(l["metadata"]["name"], l["metadata"]["namespace"]) for l in objs(docs, "Lease")]
          == [("meshload", "meshload-system")])
    check("defaults: the Lease is granted only in the release's namespace, limited to the controller's Lease "
          "for get and update",
          lambda: the(docs, "Role")["metadata"]["namespace"] == "meshload-system"
          and all(r["resources"] == ["leases"] for r in the(docs, "Role")["rules"])
          and not any("leases" in r.get("resources", []) for d in objs(docs, "ClusterRole") for r in d["rules"])
          and [r.get("resourceNames") for r in the(docs, "Role")["rules"] if "get" in r["verbs"]] == [["meshload"]])
    check("defaults: 2 replicas with a PodDisruptionBudget of minAvailable 1 over the controller's pods",
          lambda: the(docs, "Deployment")["spec"]["replicas"] == 2
          and the(docs, "PodDisruptionBudget")["spec"].get("minAvailable") == 1
          and the(docs, "PodDisruptionBudget")["spec"]["selector"] == the(docs, "Deployment")["spec"]["selector"])
    check("defaults: replicas are spread over nodes",
          lambda: [(s["topologyKey"], s["labelSelector"]["matchLabels"]) for s in
                   the(docs, "Deployment")["spec"]["template"]["spec"].get("topologySpreadConstraints") or []]
          == [("kubernetes.io/hostname", the(docs, "Deployment")["spec"]["selector"]["matchLabels"])])
    check("defaults: the controller is started with its flags",
          lambda: controller_container(docs)[1]["args"] == [
              "--workers=4", "--qps=20", "--burst=30", "--event-qps=5", "--metrics-port=8080", "--leader-elect=true",
              "--leader-election-namespace=meshload-system", "--leader-election-id=meshload",
              "--sidecar-container=meshload-sidecar", "--webhook-cert-dir=/etc/meshload/webhook",
              "--webhook-port=9443", "--sidecar-image=meshload/sidecar:" + chart["appVersion"],
              "--sidecar-resources=" + json.dumps(default_values["sidecar"]["resources"], separators=(",", ":"), sort_keys=True),
              "--sidecar-fs-group=65532", "--log-level=info", "--log-format=json"],
          controller_container(docs)[1]["args"])
    check("defaults: the webhook is on, opt-in by the label, never kube-system or the release's namespace, "
          "refusing opted-in pods when it is down, at most 5 s, no side effects, reinvoked if needed",
          lambda: webhook_problems(docs, "meshload-system", "meshload"), None)
    check("defaults: the webhook's serving certificate is signed by the caBundle's CA for the Service's DNS name",
          lambda: certificate_problems(docs, "meshload-system", "meshload"), None)

# The webhook: cert-manager instead of the chart's certificate, and off.
out = scenario("webhook with cert-manager", {"webhook": {"certManager": {"enabled": True}}})
if out:
    rendered, docs = out
    check("cert-manager: a self-signed CA chain and the serving Certificate into the Secret the controller mounts; "
          "caBundle from cert-manager's CA injector, no Secret from the chart",
          lambda: sorted(d["kind"] for d in docs if d["__file"] == "webhook.yaml")
          == ["Certificate", "Certificate", "Issuer", "Issuer", "MutatingWebhookConfiguration", "Service"]
          and [c["spec"]["secretName"] for c in objs(docs, "Certificate") if not c["spec"].get("isCA")]
          == ["meshload-webhook-tls"]
          and "meshload-system.svc" in " ".join(objs(docs, "Certificate")[-1]["spec"]["dnsNames"])
          and the(docs, "MutatingWebhookConfiguration")["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
          == "meshload-system/meshload-webhook"
          and "caBundle" not in the(docs, "MutatingWebhookConfiguration")["webhooks"][0]["clientConfig"]
          and not objs(docs, "Secret"))
    check("cert-manager: the webhook configuration is otherwise the same",
          lambda: webhook_problems(docs, "meshload-system", "meshload", ca_bundle=False), None)
out = scenario("webhook with cert-manager and the user's ClusterIssuer",
               {"webhook": {"certManager": {"enabled": True, "issuerRef": {"name": "corp-ca", "kind": "ClusterIssuer"}}}})
if out:
    rendered, docs = out
    check("cert-manager with an issuerRef: only the serving Certificate, issued by it",
          lambda: [c["spec"]["issuerRef"] for c in objs(docs, "Certificate")] == [{"name": "corp-ca", "kind": "ClusterIssuer"}]
          and not objs(docs, "Issuer"))
out = scenario("Job template injection", {"webhook": {"templateInjection": {"enabled": True}}})
if out:
    rendered, docs = out
    hooks = the(docs, "MutatingWebhookConfiguration")["webhooks"]

    def template_hook_problems():
        if [h["name"] for h in hooks] != ["sidecar.meshload.io", "template.meshload.io"]:
            return ["webhooks %r" % [h["name"] for h in hooks]]
        pods, jobs = hooks
        p = []
        if jobs["rules"] != [{"operations": ["CREATE"], "apiGroups": ["batch"], "apiVersions": ["v1"],
                              "resources": ["jobs"], "scope": "Namespaced"},
                             {"operations": ["CREATE"], "apiGroups": ["jobset.x-k8s.io"], "apiVersions": ["v1alpha2"],
                              "resources": ["jobsets"], "scope": "Namespaced"},
                             {"operations": ["CREATE"], "apiGroups": ["trainer.kubeflow.org"],
                              "apiVersions": ["v1alpha1"], "resources": ["trainingruntimes"], "scope": "Namespaced"}]:
            p.append("rules %r" % jobs["rules"])
        if jobs["clientConfig"]["service"]["path"] != "/mutate-jobs":
            p.append("path %r" % jobs["clientConfig"]["service"]["path"])
        if jobs.get("reinvocationPolicy") != "Never":
            p.append("reinvocationPolicy %r" % jobs.get("reinvocationPolicy"))
        # The rest as the pods' entry: opt-in by the label, the same
        # namespaces, failurePolicy Fail, the same Service and CA.
        for k in ("objectSelector", "namespaceSelector", "failurePolicy", "sideEffects", "matchPolicy",
                  "timeoutSeconds", "admissionReviewVersions"):
            if jobs.get(k) != pods.get(k):
                p.append("%s %r differs from the pods' %r" % (k, jobs.get(k), pods.get(k)))
        for k in ("caBundle",):
            if jobs["clientConfig"].get(k) != pods["clientConfig"].get(k):
                p.append("clientConfig.%s differs from the pods'" % k)
        if {k: v for k, v in jobs["clientConfig"]["service"].items() if k != "path"} != \
                {k: v for k, v in pods["clientConfig"]["service"].items() if k != "path"}:
            p.append("clientConfig.service %r" % jobs["clientConfig"]["service"])
        return p

    check("templateInjection: a second webhook for batch/v1 Jobs, JobSets and TrainingRuntimes (path /mutate-jobs, "
          "reinvocation Never), "
          "otherwise as the pods' one", template_hook_problems, None)
out = scenario("webhook off", {"webhook": {"enabled": False}})
if out:
    rendered, docs = out
    check("webhook off: no webhook configuration, Secret or Service, no webhook flags or port",
          lambda: not objs(docs, "MutatingWebhookConfiguration") and not objs(docs, "Secret")
          and [d["metadata"]["name"] for d in objs(docs, "Service")] == ["meshload-metrics"]
          and not any(a.startswith("--webhook") or a.startswith("--sidecar-image")
                      for a in controller_container(docs)[1]["args"]))

# One namespace, with a ServiceMonitor.
out = scenario("watchNamespace=training, serviceMonitor on",
               {"watchNamespace": "training", "serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}})
if out:
    rendered, docs = out
    check("watchNamespace: the webhook is sent pods of that namespace only",
          lambda: {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["training"]}
          in the(docs, "MutatingWebhookConfiguration")["webhooks"][0]["namespaceSelector"]["matchExpressions"])
    check("watchNamespace: no ClusterRole or ClusterRoleBinding (nothing cluster-wide, pods included)",
          not objs(docs, "ClusterRole") and not objs(docs, "ClusterRoleBinding"))
    watched = [r for r in objs(docs, "Role") if r["metadata"].get("namespace") == "training"]
    check("watchNamespace: pods, jobs, configmaps, secrets, events and dataloadjobs are a Role in that namespace",
          lambda: len(watched) == 1 and {res for r in watched[0]["rules"] for res in r["resources"]}
          == {"pods", "jobs", "configmaps", "secrets", "events", "dataloadjobs", "dataloadjobs/status",
              "dataloadjobs/finalizers"})
    sm = objs(docs, "ServiceMonitor")
    check("serviceMonitor: a monitoring.coreos.com/v1 ServiceMonitor scrapes the metrics port of the Service",
          lambda: len(sm) == 1 and sm[0]["apiVersion"] == "monitoring.coreos.com/v1"
          and [e.get("port") for e in sm[0]["spec"]["endpoints"]] == ["metrics"]
          and all(metrics_service(docs)["metadata"]["labels"].get(k) == v
                  for k, v in sm[0]["spec"]["selector"]["matchLabels"].items())
          and sm[0]["spec"]["namespaceSelector"] == {"matchNames": ["meshload-system"]}
          and sm[0]["metadata"]["labels"].get("release") == "prom", sm)

# One replica without leader election; another release name and namespace.
out = scenario("1 replica, no leader election, release ml in ns ops",
               {"replicaCount": 1, "leaderElection": {"enabled": False}, "extraArgs": ["--metrics-address=::"],
                "podAnnotations": {"a": "b"}}, namespace="ops", release="ml")
if out:
    rendered, docs = out
    dep = objs(docs, "Deployment")[0] if objs(docs, "Deployment") else {}
    check("1 replica: no PodDisruptionBudget, no Lease or its Role, no spread constraint; names are ml-meshload",
          lambda: not objs(docs, "PodDisruptionBudget") and not objs(docs, "Role") and not objs(docs, "Lease")
          and "topologySpreadConstraints" not in dep["spec"]["template"]["spec"]
          and dep["metadata"]["name"] == "ml-meshload"
          and dep["spec"]["template"]["metadata"].get("annotations") == {"a": "b"}
          and dep["spec"]["template"]["spec"]["containers"][0]["args"][-1] == "--metrics-address=::")

# Monitoring: the sidecars' PodMonitor, the alerting rules and the dashboard.
MONITORING = {"sidecarMonitor": {"enabled": True, "labels": {"release": "prom"}},
              "prometheusRule": {"enabled": True, "labels": {"release": "prom"}},
              "grafanaDashboard": {"enabled": True, "namespace": "grafana", "annotations": {"grafana_folder": "ml"}}}
out = scenario("sidecarMonitor, prometheusRule and grafanaDashboard on", MONITORING)
monitoring_docs = out[1] if out else []
if out:
    rendered, docs = out
    pm = objs(docs, "PodMonitor")
    example_pod = [d for d in yaml.safe_load_all(read(os.path.join(ROOT, "examples/trainer-pod.yaml")))
                   if d and d.get("kind") == "Job"][0]["spec"]["template"]
    sidecar = [c for c in example_pod["spec"]["initContainers"] if c["name"] == default_values["sidecarContainerName"]][0]

    def podmonitor_problems(docs):
        pm = objs(docs, "PodMonitor")
        if len(pm) != 1 or pm[0]["apiVersion"] != "monitoring.coreos.com/v1":
            return ["expected one monitoring.coreos.com/v1 PodMonitor, found %d" % len(pm)]
        spec, p = pm[0]["spec"], []
        if spec["namespaceSelector"] != {"any": True}:
            p.append("namespaceSelector %r" % spec["namespaceSelector"])
        if any(example_pod["metadata"]["labels"].get(k) != v for k, v in spec["selector"]["matchLabels"].items()):
            p.append("selector %r does not select the example trainer pods" % spec["selector"])
        ports = [e["port"] for e in spec["podMetricsEndpoints"]]
        if ports != ["metrics"] or not any(x.get("name") == "metrics" for x in sidecar.get("ports", [])):
            p.append("endpoints %r: not the sidecar's port named metrics" % ports)
        if pm[0]["metadata"]["labels"].get("release") != "prom":
            p.append("labels %r" % pm[0]["metadata"]["labels"])
        return p
    check("sidecarMonitor: a PodMonitor in every namespace selects the example trainer pods and scrapes the "
          "sidecar's port named metrics", lambda: podmonitor_problems(docs), None)
    other = copy.deepcopy(docs)
    objs(other, "PodMonitor")[0]["spec"]["selector"]["matchLabels"] = {"app": "someone-else"}
    check("the checks catch a PodMonitor that does not select the trainer pods",
          lambda: bool(podmonitor_problems(other)))
    rules = objs(docs, "PrometheusRule")
    flat = [r for g in (rules[0]["spec"]["groups"] if rules else []) for r in g["rules"]]

    def rule_problems():
        p = [] if len(rules) == 1 and rules[0]["metadata"]["labels"].get("release") == "prom" else ["no PrometheusRule"]
        for r in flat:
            if not r.get("alert") or not r.get("expr"):
                p.append("a rule without alert or expr: %r" % r)
            if (r.get("labels") or {}).get("severity") not in ("warning", "critical"):
                p.append("%s: severity %r" % (r.get("alert"), (r.get("labels") or {}).get("severity")))
            ann = r.get("annotations") or {}
            if not ann.get("summary") or not ann.get("description"):
                p.append("%s: no summary or description" % r.get("alert"))
        names = [r.get("alert") for r in flat]
        if len(set(names)) != len(names):
            p.append("alert names repeat: %r" % names)
        text = rendered["prometheusrule.yaml"]
        if "{{ $labels.pod }}" not in text or "{{`" in text:
            p.append("the alerts' own templates ({{ $labels.pod }}) did not survive Helm's templating")
        return p
    check("prometheusRule: every alert has an expression, a severity, a summary and a description; "
          "$labels templates reach Prometheus", rule_problems, None)
    starved = [r["expr"] for r in flat if r.get("alert") == "MeshloadTrainerStarved"]
    check("prometheusRule: thresholds come from values (trainerWaitP99Seconds 0.05)",
          lambda: len(starved) == 1 and "> 0.05" in starved[0], starved)
    dash = objs(docs, "ConfigMap")
    shipped = json.loads(read(os.path.join(CHART, "files/dashboards/meshload.json")))

    def dashboard_problems():
        if len(dash) != 1:
            return ["expected one dashboard ConfigMap, found %d" % len(dash)]
        d = dash[0]
        p = []
        if d["metadata"].get("namespace") != "grafana":
            p.append("namespace %r" % d["metadata"].get("namespace"))
        if d["metadata"]["labels"].get("grafana_dashboard") != "1":
            p.append("no grafana_dashboard label")
        if (d["metadata"].get("annotations") or {}).get("grafana_folder") != "ml":
            p.append("annotations %r" % d["metadata"].get("annotations"))
        if json.loads(d["data"]["meshload.json"]) != shipped:
            p.append("the ConfigMap's meshload.json is not files/dashboards/meshload.json")
        return p
    check("grafanaDashboard: a ConfigMap carries files/dashboards/meshload.json unchanged, with Grafana's label",
          dashboard_problems, None)
    if "--write-monitoring" in sys.argv:
        # For tests/observability: the rendered rules as a Prometheus rules file.
        out_dir = sys.argv[sys.argv.index("--write-monitoring") + 1]
        with open(os.path.join(out_dir, "rules.yaml"), "w") as f:
            yaml.safe_dump({"groups": rules[0]["spec"]["groups"]}, f, sort_keys=False)


# What must not render.
try:
    render_chart({"replicaCount": 3, "leaderElection": {"enabled": False}})
    check("replicaCount 3 without leader election does not render", False, "it rendered")
except HelmError as e:
    check("replicaCount 3 without leader election does not render (the chart's own message)",
          "needs leaderElection.enabled" in str(e), e)

# values.schema.json: helm refuses values that do not fit, naming them.
for what, over, says in [
        ("a wrong type", {"workers": "four"}, ["/workers", "want integer"]),
        ("an unknown key", {"wokers": 4}, ["'wokers' not allowed"]),
        ("an unknown nested key", {"metrics": {"prot": 9090}}, ["/metrics", "'prot' not allowed"]),
        ("an out-of-range port", {"metrics": {"port": 70000}}, ["/metrics/port", "maximum"]),
        ("no replicas", {"replicaCount": 0}, ["/replicaCount", "minimum"]),
        ("an unknown log level", {"logLevel": "loud"}, ["/logLevel", "debug", "error"]),
        ("a malformed scrape interval", {"serviceMonitor": {"interval": "5 minutes"}},
         ["/serviceMonitor/interval", "5 minutes"]),
        ("a namespace that is not a DNS label", {"watchNamespace": "Training_Jobs"}, ["/watchNamespace"]),
        ("a label value that is not a string", {"podLabels": {"team": 7}}, ["/podLabels/team", "want string"]),
        ("an extra argument that is not a flag", {"extraArgs": ["debug"]}, ["/extraArgs/0"])]:
    try:
        render_chart(over)
        check("values.schema.json refuses %s, naming it" % what, False, "it rendered")
    except HelmError as e:
        check("values.schema.json refuses %s, naming it" % what,
              "values don't meet the specifications of the schema" in str(e) and all(x in str(e) for x in says), e)


def lint(values):
    try:
        out = helm("lint", "--strict", CHART, "--kube-version", KUBE_VERSION, values=values)
        return [] if "0 chart(s) failed" in out and "[WARNING]" not in out and "[ERROR]" not in out else [out]
    except HelmError as e:
        return [str(e)]


check("helm lint --strict is clean with the default values", lambda: lint({}), None)
check("helm lint --strict is clean with monitoring on, one namespace and one replica",
      lambda: lint({"serviceMonitor": {"enabled": True}, "sidecarMonitor": {"enabled": True},
                    "prometheusRule": {"enabled": True}, "grafanaDashboard": {"enabled": True},
                    "watchNamespace": "training", "replicaCount": 1}), None)
check("helm lint --strict fails values the schema refuses (the lint check can fail)",
      lambda: bool(lint({"workers": "four"})))

# ---- negative controls: the checks above catch broken objects -----------------------
if "defaults" in results_by_scenario:
    _, docs0, (values0, ns0, release0) = results_by_scenario["defaults"]

    def mutated(f):
        docs = copy.deepcopy(docs0)
        f(docs)
        return docs

    def cluster_rule(docs):
        return the(docs, "ClusterRole")["rules"]

    def container(docs):
        return the(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]

    controls = [
        ("a wildcard verb", rbac_problems,
         lambda d: cluster_rule(d)[3]["verbs"].append("*")),
        ("read access to secrets", rbac_problems,
         lambda d: cluster_rule(d).append({"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]})),
        ("list and watch added to the secrets rule", rbac_problems,
         lambda d: [r for r in cluster_rule(d) if r["resources"] == ["secrets"]][0]["verbs"].extend(["list", "watch"])),
        ("a missing verb (dataloadjobs/finalizers update)", rbac_problems,
         lambda d: cluster_rule(d).pop(2)),
        ("leases granted cluster-wide", rbac_problems,
         lambda d: cluster_rule(d).append({"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                                           "verbs": ["get"]})),
        ("a binding to another service account", rbac_problems,
         lambda d: the(d, "ClusterRoleBinding")["subjects"][0].__setitem__("name", "default")),
        ("a writable root filesystem", deployment_problems,
         lambda d: container(d)["securityContext"].__setitem__("readOnlyRootFilesystem", False)),
        ("running as root", deployment_problems,
         lambda d: (container(d)["securityContext"].__setitem__("runAsUser", 0),
                    container(d)["securityContext"].__setitem__("runAsNonRoot", False))),
        ("an added capability", deployment_problems,
         lambda d: container(d)["securityContext"]["capabilities"].__setitem__("add", ["NET_ADMIN"])),
        ("a probe on another port", deployment_problems,
         lambda d: container(d)["readinessProbe"]["httpGet"].__setitem__("port", 9090)),
        ("a missing --workers", deployment_problems,
         lambda d: container(d)["args"].pop(0)),
        ("a misspelt flag", deployment_problems,
         lambda d: container(d)["args"].append("--leader-elect-id=x")),
        ("a Service that selects nothing", lambda docs, v, ns: common_problems(docs, v, ns, release0),
         lambda d: metrics_service(d)["spec"]["selector"].__setitem__("app.kubernetes.io/name", "other")),
    ]
    for what, problems, mutate in controls:
        try:
            broken_docs = mutated(mutate)
        except (KeyError, IndexError, TypeError, AttributeError, AssertionError) as e:
            check("the checks catch " + what, False, "the defaults are not as expected: %s: %s" % (type(e).__name__, e))
            continue
        check("the checks catch " + what, lambda: bool(problems(broken_docs, values0, ns0)))


# ---- examples/trainer-pod.yaml ------------------------------------------------------
def example_problems(pod_job, dlj, sidecar_name, claim_templates):
    p = []
    spec = pod_job["spec"]
    processes = dlj["spec"]["mesh"]["processes"]
    if pod_job.get("apiVersion") != "batch/v1" or spec.get("completionMode") != "Indexed":
        p.append("not an Indexed batch/v1 Job")
    if spec.get("completions") != processes or spec.get("parallelism") != processes:
        p.append("completions/parallelism are not mesh.processes (%d)" % processes)
    if pod_job["metadata"].get("namespace") != dlj["metadata"].get("namespace"):
        p.append("not in the DataLoadJob's namespace")
    labels = spec["template"]["metadata"].get("labels") or {}
    if any(labels.get(k) != v for k, v in dlj["spec"]["selector"]["matchLabels"].items()):
        p.append("pods %r are not selected by %r" % (labels, dlj["spec"]["selector"]))
    pod = spec["template"]["spec"]
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    sidecars = [c for c in pod.get("initContainers", []) if c["name"] == sidecar_name]
    trainers = pod.get("containers", [])
    if len(sidecars) != 1 or sidecars[0].get("restartPolicy") != "Always":
        p.append("no native sidecar named %s (an init container with restartPolicy Always)" % sidecar_name)
        return p
    sc = sidecars[0]
    args = parse_args(sc.get("args", []))
    job_dir = "/etc/meshload/job"
    want = {"job": job_dir + "/job.json",
            "socket": "/run/meshload/sidecar.sock", "metrics-port": "9464"}
    bad = {k: args.get(k) for k, v in want.items() if args.get(k) != v}
    if bad:
        p.append("sidecar args %r" % bad)
    env = {e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") for e in sc.get("env", [])}
    if env.get("POD_NAME") != "metadata.name":
        p.append("the sidecar's POD_NAME is not metadata.name")
    if env.get("MESHLOAD_PROCESS") != "metadata.annotations['batch.kubernetes.io/job-completion-index']":
        p.append("the sidecar's MESHLOAD_PROCESS is not the Indexed Job's completion index")
    probe = (sc.get("readinessProbe") or {}).get("httpGet") or {}
    if probe.get("path") != "/readyz" or probe.get("port") not in (9464, "metrics"):
        p.append("the sidecar's readinessProbe is %r" % sc.get("readinessProbe"))

    def mounts(c):
        return {m["mountPath"]: m for m in c.get("volumeMounts", [])}
    job_mount = mounts(sc).get(job_dir)
    cm = volumes.get(job_mount["name"], {}).get("configMap", {}) if job_mount else {}
    if not job_mount or not job_mount.get("readOnly") or cm.get("name") != dlj["metadata"]["name"] + "-meshload":
        p.append("the ConfigMap %s-meshload is not mounted read-only at %s" % (dlj["metadata"]["name"], job_dir))
    # Peers authenticate with the job's secret, mounted from a Secret that
    # only root and the pod's fsGroup can read.
    if "assignments" in args or "peers" in args:
        sec = args.get("peer-secret-file") or ""
        mount = next((m for path, m in mounts(sc).items() if sec.startswith(path.rstrip("/") + "/")), None)
        secret = volumes.get(mount["name"], {}).get("secret") if mount else None
        if not sec or not mount or not mount.get("readOnly") or not secret:
            p.append("the sidecar's peer connections are not authenticated: no --peer-secret-file in a read-only "
                     "Secret volume")
        else:
            mode = secret.get("defaultMode", 0o644)
            if mode & 0o007:
                p.append("the peer secret is readable by others (defaultMode %o)" % mode)
            if not (mode & 0o040) or (pod.get("securityContext") or {}).get("fsGroup") is None:
                p.append("the sidecar (a non-root uid) cannot read the peer secret: it needs the pod's fsGroup "
                         "and a group-readable defaultMode")
    for c in [sc] + trainers:
        m = mounts(c).get("/run/meshload")
        if not m or "emptyDir" not in volumes.get(m["name"], {}):
            p.append("%s does not mount the shared emptyDir at /run/meshload" % c["name"])
        p += ["%s: %s" % (c["name"], x) for x in security_problems(pod, c)]
    # The GPUs: one DRA claim of mesh.devicesPerProcess GPUs, listed by the
    # sidecar and the trainer (device-plugin GPUs would reach one container only).
    claims = {c["name"]: c for c in pod.get("resourceClaims", [])}
    for c in [sc] + trainers:
        if "nvidia.com/gpu" in ((c.get("resources") or {}).get("limits") or {}):
            p.append("%s takes device-plugin GPUs, which the other container cannot see" % c["name"])
    listed = [{x["name"] for x in (c.get("resources") or {}).get("claims", [])} for c in [sc] + trainers]
    shared = set.intersection(*listed) & set(claims) if listed else set()
    if len(shared) != 1:
        p.append("the sidecar and the trainer do not share one GPU claim (claims %r)" % listed)
    else:
        tmpl = claim_templates.get(claims[shared.pop()].get("resourceClaimTemplateName"))
        reqs = (tmpl or {}).get("spec", {}).get("spec", {}).get("devices", {}).get("requests", [])
        counts = [r.get("exactly", {}).get("count") for r in reqs]
        if counts != [dlj["spec"]["mesh"].get("devicesPerProcess", 1)]:
            p.append("the GPU claim asks for %r GPUs, not mesh.devicesPerProcess" % counts)
    return p


example = os.path.join(ROOT, "examples/trainer-pod.yaml")
example_docs = [d for d in yaml.safe_load_all(read(example)) if d]
job_docs = [d for d in example_docs if d.get("kind") == "Job"]
claim_templates = {d["metadata"]["name"]: d for d in example_docs if d.get("kind") == "ResourceClaimTemplate"}
dlj = [d for d in yaml.safe_load_all(read(os.path.join(ROOT, "examples/hybrid-fsdp.yaml"))) if d
       and d.get("kind") == "DataLoadJob"][0]
check("examples/trainer-pod.yaml: an Indexed Job whose pods hybrid-fsdp selects, with the native sidecar, "
      "its ConfigMap, socket volume and hardening",
      lambda: example_problems(job_docs[0], dlj, default_values["sidecarContainerName"], claim_templates)
      if len(job_docs) == 1 else ["expected one Job, found %d" % len(job_docs)], None)


def unauthenticated_peers():
    broken = copy.deepcopy(job_docs[0])
    sc = broken["spec"]["template"]["spec"]["initContainers"][0]
    sc["args"] = [a for a in sc["args"] if not a.startswith("--peer-secret-file")]
    return bool(example_problems(broken, dlj, default_values["sidecarContainerName"], claim_templates))


check("the trainer-pod check catches sidecars whose peers do not authenticate",
      lambda: [] if unauthenticated_peers() else ["not caught"], None)


def plain_init_container():
    broken = copy.deepcopy(job_docs[0])
    broken["spec"]["template"]["spec"]["initContainers"][0].pop("restartPolicy", None)
    return bool(example_problems(broken, dlj, default_values["sidecarContainerName"], claim_templates))


check("the checks catch a sidecar that is a plain init container", plain_init_container)


def trainer_only_gpus():
    broken = copy.deepcopy(job_docs[0])
    broken["spec"]["template"]["spec"]["initContainers"][0]["resources"].pop("claims", None)
    return any("do not share one GPU claim" in x
               for x in example_problems(broken, dlj, default_values["sidecarContainerName"], claim_templates))


check("the checks catch a sidecar that does not see the trainer's GPUs", trainer_only_gpus)

print("%d passed, %d failed" % (results["passed"], results["failed"]))
sys.exit(1 if results["failed"] else 0)
